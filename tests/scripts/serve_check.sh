#!/usr/bin/env bash
# dp-launch serve with real processes and a real HTTP client (curl), one part of docs/serve.md per
# run:
#   serve_check.sh DP_LAUNCH bytes     POST /v1/jobs and /v1/images/generations give the bytes of
#                                      dp-launch -n 2 on the same JSONL
#   serve_check.sh DP_LAUNCH restart   a server killed with SIGKILL mid-job, started again on its
#                                      root, stopped with SIGTERM, started again, finishes the
#                                      job with every image exactly once
#   serve_check.sh DP_LAUNCH security  a non-loopback bind without a key is refused at start; with
#                                      one, a request without it is answered 401
#   serve_check.sh DP_LAUNCH limits    malformed JSON, unknown keys, server files, oversize bodies,
#                                      a full queue, path traversal: 4xx, and nothing written
#   serve_check.sh DP_LAUNCH cancel    DELETE stops a running job at a step boundary, keeping its
#                                      images, and a queued one at once
#   serve_check.sh DP_LAUNCH ranks     a warm rank killed mid-job: the job runs again, every image
#                                      once; ranks that die in every job: unhealthy
#   serve_check.sh DP_LAUNCH page      the live page in headless Chromium shows the queue and loads
#                                      the latest images (77: no Chromium here)
#   serve_check.sh DP_LAUNCH edits     POST /v1/images/edits (multipart image, mask) gives the bytes
#                                      of dp-launch on the line with the uploaded files; refusals
#                                      keep nothing
#   serve_check.sh DP_LAUNCH batch     jobs queued together run as one batch job, and each job's
#                                      folder is its own run's: records, names and bytes; a job
#                                      cancelled in a batch keeps its images, the others finish
# Prints PASS, or FAIL with why (exit 1).
set -euo pipefail
dp_launch=$1
part=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
# Every process this script starts carries the marker, so that none can be left behind unseen.
export DP_SERVE_CHECK_MARKER="serve-check-$$-$RANDOM"
servers=()
cleanup() {
    for pid in "${servers[@]}"; do { kill -KILL "$pid" && wait "$pid"; } 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Processes still carrying the marker (the servers, their jobs' dp-launch and ranks).
marked() {
    local n=0 pid
    for e in /proc/[0-9]*/environ; do
        pid=${e#/proc/}; pid=${pid%/environ}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        if { tr '\0' '\n' <"$e"; } 2>/dev/null | grep -qx "DP_SERVE_CHECK_MARKER=$DP_SERVE_CHECK_MARKER"; then
            [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] || n=$((n + 1))
        fi
    done
    echo "$n"
}

# start ROOT ARGS...: a server on ROOT, any free port; sets pid and url.
start() {
    local root=$1
    shift
    local log="$work/server-$RANDOM.log"
    "$dp_launch" serve --port 0 -o "$root" "$@" 2>"$log" &
    pid=$!
    servers+=("$pid")
    for _ in $(seq 100); do
        url=$(grep -o 'listening on http://[^/ ]*/' "$log" | head -1 | sed 's/listening on //;s#/$##') || true
        [[ -n $url ]] && break
        kill -0 "$pid" 2>/dev/null || fail "the server exited: $(cat "$log")"
        sleep 0.1
    done
    [[ -n $url ]] || fail "the server said no address: $(cat "$log")"
    url=${url/0.0.0.0/127.0.0.1}
}

# The state of job ID on the server at url.
state_of() { curl -s "$url/v1/jobs/$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }

# wait_for ID STATE SECONDS
wait_for() {
    for _ in $(seq $(($3 * 5))); do
        [[ $(state_of "$1") == "$2" ]] && return 0
        sleep 0.2
    done
    fail "$1 is $(state_of "$1"), not $2, after $3 s"
}

# same_images DIR_A DIR_B: every image of A's manifest is in B, byte for byte, and B has no other.
same_images() {
    python3 - "$1" "$2" <<'PY'
import json, sys, filecmp, os
a, b = sys.argv[1], sys.argv[2]
def records(d):
    return {r["index"] if "image_index" not in r else (r["index"], r["image_index"]): r
            for r in map(json.loads, open(os.path.join(d, "manifest.jsonl")))}
ra, rb = records(a), records(b)
if ra.keys() != rb.keys():
    sys.exit(f"FAIL: {a} and {b} record other prompts: {sorted(ra)} and {sorted(rb)}")
for k, r in ra.items():
    if r["status"] != "ok" or rb[k]["status"] != "ok":
        sys.exit(f"FAIL: prompt {k}: {r['status']} and {rb[k]['status']}")
    if not filecmp.cmp(os.path.join(a, r["file"]), os.path.join(b, rb[k]["file"]), shallow=False):
        sys.exit(f"FAIL: prompt {k}: {r['file']} differs")
print(f"{len(ra)} images byte-identical")
PY
}

# same_run OWN JOB: JOB's folder is what dp-launch wrote in OWN: the same records but for each
# image's time and rank, the same files (but OWN's lock), the same bytes.
same_run() {
    same_images "$1" "$2" >/dev/null || return 1
    python3 - "$1" "$2" <<'PY'
import json, os, sys
def records(d):
    out = {}
    for r in map(json.loads, open(os.path.join(d, "manifest.jsonl"))):
        r.pop("ms", None), r.pop("rank", None)
        out[(r["index"], r.get("image_index", 0))] = r
    return out
a, b = sys.argv[1], sys.argv[2]
if records(a) != records(b):
    sys.exit(f"FAIL: {b}'s records are not {a}'s: {records(b)} against {records(a)}")
files = lambda d: sorted(f for f in os.listdir(d) if f != ".dp-lock")
if files(a) != files(b):
    sys.exit(f"FAIL: {b} holds {files(b)}, its own run {files(a)}")
PY
}

# each_once_as_batch ID N: job ID's manifest records prompts 0 to N-1 once each, and its images
# are the batch job's on $work/job.jsonl, byte for byte.
each_once_as_batch() {
    python3 - "$work/root/$1/manifest.jsonl" "$2" <<'PY' || exit 1
import json, sys
indices = [r["index"] for r in map(json.loads, open(sys.argv[1]))]
if sorted(indices) != list(range(int(sys.argv[2]))):
    sys.exit(f"FAIL: the manifest records {len(indices)} images, indices {sorted(indices)}")
print(f"{len(indices)} images, each recorded once")
PY
    "$dp_launch" "${flags[@]}" -q -o "$work/batch" "$work/job.jsonl" >/dev/null
    same_images "$work/batch" "$work/root/$1" || exit 1
}

# same_as_answer ANSWER_JSON FOLDER N: the answer's N b64_json images are FOLDER's, in index order.
same_as_answer() {
    python3 - "$1" "$2" "$3" <<'PY'
import base64, json, os, sys
answer, folder, n = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
files = [r["file"] for r in sorted(map(json.loads, open(os.path.join(folder, "manifest.jsonl"))),
                                   key=lambda r: (r["index"], r.get("image_index", 0)))]
data = answer.get("data")
if not data or len(data) != n:
    sys.exit(f"FAIL: the answer is {str(answer)[:300]}")
for d, f in zip(data, files):
    if base64.b64decode(d["b64_json"]) != open(os.path.join(folder, f), "rb").read():
        sys.exit(f"FAIL: a b64_json image is not the batch job's {f}")
print(f"{n} answered images byte-identical")
PY
}

# submit FILE: POST /v1/jobs with FILE's lines; prints the job's id.
submit() {
    curl -s -X POST --data-binary @"$1" "$url/v1/jobs" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'
}

# wait_made ID N: until job ID's manifest records N images (within 30 s); sets made.
wait_made() {
    for _ in $(seq 600); do
        made=$(grep -c '"status":"ok"' "$work/root/$1/manifest.jsonl" 2>/dev/null || true)
        [[ ${made:-0} -ge $2 ]] && return 0
        sleep 0.05
    done
}

prompts() {  # N: N JSONL lines of the built-in model's grammar
    python3 -c '
import json, sys
colours, shapes = ["red", "green", "blue", "yellow"], ["circle", "square", "triangle", "star", "ring"]
for i in range(int(sys.argv[1])):
    print(json.dumps({"prompt": f"a {colours[i % 4]} {shapes[i % 5]} on a plain background"}))' "$1"
}

flags=(-n 2 --steps 4)
case $part in
bytes)
    start "$work/root" "${flags[@]}"
    { prompts 3; echo '{"prompt": "a small blue star", "seed": 11, "num_images_per_prompt": 2}'; } >"$work/job.jsonl"
    id=$(submit "$work/job.jsonl")
    wait_for "$id" done 120
    "$dp_launch" "${flags[@]}" -q -o "$work/batch" "$work/job.jsonl" >/dev/null
    same_images "$work/batch" "$work/root/$id" || exit 1
    curl -s "$url/v1/jobs/$id/manifest" | cmp -s - "$work/root/$id/manifest.jsonl" || fail "GET manifest is not the run's"
    # generations: one line of n images, the same as that line through the batch job.
    curl -s -X POST -d '{"model": "any", "prompt": "a green ring", "n": 2, "size": "32x32", "seed": 5}' \
        "$url/v1/images/generations" >"$work/gen.json"
    echo '{"prompt": "a green ring", "seed": 5, "width": 32, "height": 32, "num_images_per_prompt": 2}' >"$work/gen.jsonl"
    "$dp_launch" "${flags[@]}" -q -o "$work/gen" "$work/gen.jsonl" >/dev/null
    same_as_answer "$work/gen.json" "$work/gen" 2 || exit 1
    first=$(curl -s -X POST -d '{"prompt": "a green ring", "size": "32x32", "seed": 5, "response_format": "url"}' \
        "$url/v1/images/generations" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["url"])')
    [[ $first == "$url/"* ]] || fail "the url answer $first is not an absolute URL of this server"
    curl -s "$first" | cmp -s - "$work/gen/$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["file"])' "$work/gen/manifest.jsonl")" ||
        fail "the url answer's image is not the batch job's"
    ;;
restart)
    start "$work/root" "${flags[@]}"
    prompts 40 >"$work/job.jsonl"
    id=$(submit "$work/job.jsonl")
    wait_made "$id" 3
    [[ ${made:-0} -ge 3 && $made -lt 40 ]] || fail "$made images made before the kill (3 to 39 wanted)"
    { kill -KILL "$pid" && wait "$pid"; } 2>/dev/null || true
    for _ in $(seq 100); do [[ $(marked) == 0 ]] && break; sleep 0.1; done
    [[ $(marked) == 0 ]] || fail "$(marked) process(es) of the killed server's job are left"
    echo "killed the server with $made of 40 images made"
    # Started again, then stopped with SIGTERM: the running job records what it made and goes
    # back to the queue; the server exits 0.
    start "$work/root" "${flags[@]}"
    wait_for "$id" running 60
    for _ in $(seq 600); do
        again=$(grep -c '"status":"ok"' "$work/root/$id/manifest.jsonl" 2>/dev/null || true)
        [[ ${again:-0} -gt $made ]] && break
        sleep 0.05
    done
    kill -TERM "$pid"
    rc=0
    wait "$pid" || rc=$?
    [[ $rc == 0 ]] || fail "the server stopped by SIGTERM exited $rc, not 0"
    for _ in $(seq 100); do [[ $(marked) == 0 ]] && break; sleep 0.1; done
    [[ $(marked) == 0 ]] || fail "$(marked) process(es) left after SIGTERM"
    echo "stopped the server with SIGTERM with $(grep -c '"status":"ok"' "$work/root/$id/manifest.jsonl") of 40 images made"
    start "$work/root" "${flags[@]}"
    wait_for "$id" done 180
    each_once_as_batch "$id" 40
    [[ $(ls "$work/root/$id"/*.png | wc -l) == 40 ]] || fail "the run folder holds $(ls "$work/root/$id"/*.png | wc -l) images"
    ;;
security)
    rc=0
    "$dp_launch" serve --port 0 --host 0.0.0.0 -o "$work/open" 2>"$work/err" || rc=$?
    [[ $rc == 2 ]] || fail "a non-loopback bind without a key exited $rc, not 2"
    grep -q -- '--api-key' "$work/err" || fail "the refusal does not name --api-key: $(cat "$work/err")"
    [[ ! -e $work/open ]] || fail "the refused server made its root"
    DP_API_KEY=k3y-for-the-test start "$work/root" --host 0.0.0.0
    for path in /health /metrics /v1/jobs / /v1/jobs/job-000001; do
        code=$(curl -s -o /dev/null -w '%{http_code}' "$url$path")
        [[ $code == 401 ]] || fail "GET $path without the key: $code, not 401"
        code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' "$url$path")
        [[ $code == 401 ]] || fail "GET $path with a wrong key: $code, not 401"
    done
    code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d '{"prompt": "a red circle"}' "$url/v1/images/generations")
    [[ $code == 401 ]] || fail "POST without the key: $code"
    [[ -z $(ls "$work/root" | grep '^job-') ]] || fail "a request without the key made a job"
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer k3y-for-the-test' "$url/health")
    [[ $code == 200 ]] || fail "GET /health with the key: $code"
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-API-Key: k3y-for-the-test' "$url/v1/jobs")
    [[ $code == 200 ]] || fail "GET /v1/jobs with X-API-Key: $code"
    ;;
limits)
    start "$work/root" "${flags[@]}" --max-queue 2 --max-prompts 3 --max-request-bytes 4096 --max-image-side 64
    expect() {  # CODE WHAT CURL_ARGS...: the answer's code, and an error message in JSON
        local want=$1 what=$2
        shift 2
        local code
        code=$(curl -s -o "$work/answer" -w '%{http_code}' "$@")
        [[ $code == "$want" ]] || fail "$what: $code, not $want: $(head -c 300 "$work/answer")"
        python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["message"]' "$work/answer" ||
            fail "$what: no error message: $(head -c 300 "$work/answer")"
        echo "$what: $code $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"][:100])' "$work/answer")"
    }
    expect 400 "malformed JSON" -X POST -d '{"prompt": ' "$url/v1/images/generations"
    expect 400 "not an object" -X POST -d '["a cat"]' "$url/v1/images/generations"
    expect 400 "unknown key" -X POST -d '{"prompt": "a cat", "colour": "red"}' "$url/v1/images/generations"
    expect 400 "bad size" -X POST -d '{"prompt": "a cat", "size": "big"}' "$url/v1/images/generations"
    expect 400 "bad n" -X POST -d '{"prompt": "a cat", "n": 0}' "$url/v1/images/generations"
    expect 413 "n past --max-images" -X POST -d '{"prompt": "a cat", "n": 17}' "$url/v1/images/generations"
    expect 413 "a side past --max-image-side" -X POST -d '{"prompt": "a cat", "size": "128x32"}' "$url/v1/images/generations"
    expect 400 "a server file as image" -X POST --data-binary $'{"prompt": "a cat", "image": "/etc/hostname"}\n' "$url/v1/jobs"
    expect 400 "a server file as adapter" -X POST --data-binary $'{"prompt": "a cat", "lora": "/etc/hostname"}\n' "$url/v1/jobs"
    expect 400 "a server file as scheduler" -X POST --data-binary $'{"prompt": "a cat", "scheduler": "/etc/x.json"}\n' "$url/v1/jobs"
    expect 400 "a text body" -X POST --data-binary $'a cat\n' "$url/v1/jobs"
    expect 400 "an empty body" -X POST --data-binary '' "$url/v1/jobs"
    expect 413 "prompts past --max-prompts" -X POST --data-binary "$(prompts 4)" "$url/v1/jobs"
    head -c 5000 /dev/zero | tr '\0' 'x' >"$work/big"
    expect 413 "a body past --max-request-bytes" -X POST --data-binary @"$work/big" "$url/v1/jobs"
    expect 404 "no such job" "$url/v1/jobs/job-999999"
    expect 404 "a job id with a path" "$url/v1/jobs/..%2F..%2Fetc"
    [[ -z $(ls "$work/root" | grep '^job-') && -z $(ls "$work/root/.requests") ]] || fail "a refused request left files"
    [[ $(curl -s "$url/v1/jobs" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]))') == 0 ]] ||
        fail "a refused request made a job"
    # Two jobs fill the queue (--max-queue 2): the third is answered 429 with Retry-After.
    prompts 3 >"$work/three.jsonl"
    id=$(submit "$work/three.jsonl")
    curl -s -X POST --data-binary @"$work/three.jsonl" "$url/v1/jobs" >/dev/null
    code=$(curl -s -D "$work/headers" -o "$work/answer" -w '%{http_code}' -X POST --data-binary @"$work/three.jsonl" "$url/v1/jobs")
    [[ $code == 429 ]] || fail "a third job past --max-queue 2: $code, not 429"
    grep -qi '^Retry-After: [0-9]' "$work/headers" || fail "the 429 has no Retry-After"
    wait_for "$id" done 120
    expect 404 "path traversal in an image name" "$url/v1/jobs/$id/images/..%2F..%2Fjobs.sqlite3"
    expect 404 "a file of the run that is no image" "$url/v1/jobs/$id/images/manifest.jsonl"
    expect 404 "a hidden name" "$url/v1/jobs/$id/images/.serve.lock"
    ;;
cancel)
    start "$work/root" "${flags[@]}" --batch-images 1  # the queued job stays queued (batch: below)
    prompts 40 >"$work/job.jsonl"
    id=$(submit "$work/job.jsonl")
    queued=$(submit "$work/job.jsonl")
    wait_made "$id" 2
    code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$url/v1/jobs/$queued")
    [[ $code == 200 && $(state_of "$queued") == cancelled ]] || fail "DELETE of a queued job: $code, $(state_of "$queued")"
    code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$url/v1/jobs/$id")
    [[ $code == 202 ]] || fail "DELETE of a running job: $code, not 202"
    wait_for "$id" cancelled 60
    made=$(grep -c '"status":"ok"' "$work/root/$id/manifest.jsonl")
    [[ $made -ge 2 && $made -lt 40 ]] || fail "$made images kept of the cancelled job"
    [[ $(ls "$work/root/$id"/*.png | wc -l) == "$made" ]] || fail "the kept images are not the recorded ones"
    [[ ! -e $work/root/$queued ]] || fail "the job cancelled in the queue has a run folder"
    code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$url/v1/jobs/$id")
    [[ $code == 409 ]] || fail "DELETE of a cancelled job: $code, not 409"
    echo "cancelled with $made of 40 images kept"
    ;;
ranks)
    # A warm rank killed mid-job: the job runs again on warm ranks started again, resumed, every
    # image once, and the job queued behind it runs too.
    start "$work/root" "${flags[@]}"
    prompts 40 >"$work/job.jsonl"
    prompts 3 >"$work/three.jsonl"
    id=$(submit "$work/job.jsonl")
    behind=$(submit "$work/three.jsonl")
    wait_made "$id" 3
    warm=$(cat "$work/root/.warm-ranks/rank-1/pid")
    kill -KILL "$warm"
    echo "killed warm rank 1 (pid $warm) with $made of 40 images made"
    wait_for "$id" done 180
    wait_for "$behind" done 60
    attempts=$(curl -s "$url/v1/jobs/$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["attempts"])')
    [[ $attempts == 2 ]] || fail "the job ran $attempts time(s), not 2"
    [[ $(cat "$work/root/.warm-ranks/rank-1/pid") != "$warm" ]] || fail "the warm ranks were not started again"
    each_once_as_batch "$id" 40
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$url/health") == 200 ]] || fail "unhealthy after one crash"
    # Warm ranks that die in every job (the worker's test-only DP_TEST_KILL_AT_STEP, which they
    # inherit): the job fails after its 3 attempts and the server says it is unhealthy.
    DP_TEST_KILL_AT_STEP=0:1 start "$work/dying" "${flags[@]}"
    id=$(submit "$work/three.jsonl")
    wait_for "$id" failed 120
    attempts=$(curl -s "$url/v1/jobs/$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["attempts"])')
    [[ $attempts == 3 ]] || fail "the failed job ran $attempts time(s), not 3"
    code=$(curl -s -o "$work/health" -w '%{http_code}' "$url/health")
    [[ $code == 503 ]] || fail "/health is $code after a job failed 3 times on dying ranks: $(cat "$work/health")"
    echo "unhealthy: $(head -c 200 "$work/health")"
    ;;
edits)
    golden=$here/../data/golden/img2img
    start "$work/root" "${flags[@]}"
    curl -s -F image=@"$golden/in_32x32.png" -F prompt="a red circle" -F seed=5 -F strength=0.6 -F n=2 \
        "$url/v1/images/edits" >"$work/edit.json"
    upload=$(ls -d "$work/root/.uploads"/*/ | head -1)
    upload=${upload%/}
    cmp -s "$upload/image" "$golden/in_32x32.png" || fail "the upload is not kept as sent"
    printf '{"prompt": "a red circle", "seed": 5, "strength": 0.6, "num_images_per_prompt": 2, "image": "%s/image"}\n' \
        "$upload" >"$work/edit.jsonl"
    "$dp_launch" "${flags[@]}" -q -o "$work/edit" "$work/edit.jsonl" >/dev/null
    same_as_answer "$work/edit.json" "$work/edit" 2 || exit 1
    # Refused requests keep nothing.
    refused() {  # WHAT CURL_ARGS...: answered 400 with a message
        local what=$1
        shift
        local code
        code=$(curl -s -o "$work/answer" -w '%{http_code}' "$@" "$url/v1/images/edits")
        [[ $code == 400 ]] || fail "$what: $code, not 400: $(head -c 300 "$work/answer")"
        ! grep -q "$work/root" "$work/answer" || fail "$what: the answer shows where the server keeps uploads"
        echo "$what: $code $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"][:100])' "$work/answer")"
    }
    refused "no image" -F prompt="a cat"
    refused "not multipart" -d '{"prompt": "a cat"}'
    refused "no prompt" -F image=@"$golden/in_32x32.png"
    refused "a file that is no image" -F image=@"$here/serve_check.sh" -F prompt="a cat"
    refused "the mask as mask_image" -F image=@"$golden/in_32x32.png" -F mask_image=@"$golden/mask_32x32.png" -F prompt="a cat"
    refused "an unknown key" -F image=@"$golden/in_32x32.png" -F prompt="a cat" -F colour=red
    [[ $(ls "$work/root/.uploads" | wc -l) == 1 ]] || fail "a refused edit left its upload"
    # OpenAI's mask, transparent where the image is edited, on a model that inpaints.
    python3 - "$work/mask.png" <<'PY'
import struct, sys, zlib
w = h = 32
rows = b"".join(b"\0" + b"".join(bytes([0, 0, 0, 0 if x < 16 else 255]) for x in range(w)) for _ in range(h))
chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)) +
                               chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
PY
    start "$work/inpaint" --model "$here/../../models/tiny-random-sd3-16ch" -n 2 --steps 2
    curl -s -F image=@"$golden/in_32x32.png" -F mask=@"$work/mask.png" -F prompt="a red circle" -F seed=3 \
        "$url/v1/images/edits" >"$work/inpaint.json"
    upload=$(ls -d "$work/inpaint/.uploads"/*/ | head -1)
    upload=${upload%/}
    printf '{"prompt": "a red circle", "seed": 3, "image": "%s/image", "mask_image": "%s/mask"}\n' "$upload" "$upload" \
        >"$work/inpaint.jsonl"
    "$dp_launch" --model "$here/../../models/tiny-random-sd3-16ch" -n 2 --steps 2 -q -o "$work/inpainted" \
        "$work/inpaint.jsonl" >/dev/null
    same_as_answer "$work/inpaint.json" "$work/inpainted" 1 || exit 1
    ;;
batch)
    # A job of 6 prompts keeps the runner busy while 10 jobs of every kind of line queue behind it.
    start "$work/root" "${flags[@]}"
    prompts 6 >"$work/first.jsonl"
    python3 - "$work" <<'PY'
import json, sys
colours, shapes = ["red", "green", "blue", "yellow"], ["circle", "square", "triangle", "star", "ring"]
for j in range(10):
    lines = [{"prompt": f"a {colours[j % 4]} {shapes[(j + k) % 5]} on a plain background"} for k in range(1 + j % 3)]
    if j == 3: lines.append({"prompt": "a small blue star", "seed": 11, "num_images_per_prompt": 2})
    if j == 5: lines.append({"prompt": "a red ring", "name": "my ring", "seed": None})
    if j == 7: lines.insert(0, {"prompt": "a green square", "guidance_scale": 3.5})
    open(f"{sys.argv[1]}/b{j}.jsonl", "w").write("".join(json.dumps(l) + "\n" for l in lines) + ("\n" if j == 8 else ""))
PY
    first=$(submit "$work/first.jsonl")
    ids=()
    for j in $(seq 0 9); do ids+=("$(submit "$work/b$j.jsonl")"); done
    wait_for "$first" done 120
    for id in "${ids[@]}"; do wait_for "$id" done 120; done
    ls "$work/root/.requests"/batch-*.jsonl >/dev/null 2>&1 || fail "no batch ran: the queued jobs each ran alone"
    [[ -z $(ls -d "$work/root/.requests"/batch-*/ 2>/dev/null) ]] || fail "a batch's run folder is left"
    # Each job's folder against dp-launch -n 2 on that job's own JSONL: the same records (but each
    # image's time and rank), the same files, the same bytes.
    for j in $(seq 0 9); do
        "$dp_launch" "${flags[@]}" -q -o "$work/own$j" "$work/b$j.jsonl" >/dev/null
        same_run "$work/own$j" "$work/root/${ids[$j]}" || exit 1
    done
    echo "10 jobs run in a batch: each folder is its own run's"
    # A job cancelled while its batch runs keeps the images it has; the others finish, each its own
    # run's.
    prompts 8 >"$work/eight.jsonl"
    long=$(submit "$work/first.jsonl")
    ids=()
    for j in $(seq 0 4); do ids+=("$(submit "$work/eight.jsonl")"); done
    prompts 40 >"$work/forty.jsonl"
    ids+=("$(submit "$work/forty.jsonl")")
    wait_for "${ids[5]}" running 60
    code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$url/v1/jobs/${ids[5]}")
    [[ $code == 202 ]] || fail "DELETE of the last job of a running batch: $code, not 202"
    wait_for "${ids[5]}" cancelled 60
    "$dp_launch" "${flags[@]}" -q -o "$work/own-eight" "$work/eight.jsonl" >/dev/null
    for j in 0 1 2 3 4; do
        wait_for "${ids[$j]}" done 120
        same_run "$work/own-eight" "$work/root/${ids[$j]}" || exit 1
    done
    "$dp_launch" "${flags[@]}" -q -o "$work/own-forty" "$work/forty.jsonl" >/dev/null
    python3 - "$work/own-forty" "$work/root/${ids[5]}" <<'PY' || exit 1
import filecmp, json, os, sys
own, cut = sys.argv[1], sys.argv[2]
if not os.path.exists(os.path.join(cut, "manifest.jsonl")):
    sys.exit(0) if not os.path.exists(cut) or not os.listdir(cut) else sys.exit(f"FAIL: {cut} has files but no manifest")
kept = [r for r in map(json.loads, open(os.path.join(cut, "manifest.jsonl"))) if r["status"] == "ok"]
for r in kept:
    if not filecmp.cmp(os.path.join(own, r["file"]), os.path.join(cut, r["file"]), shallow=False):
        sys.exit(f"FAIL: the cancelled job's kept {r['file']} is not its own run's")
print(f"the cancelled job kept {len(kept)} image(s), each its own run's")
PY
    ;;
page)
    browser=""
    for b in chromium chromium-browser google-chrome; do
        if command -v "$b" >/dev/null; then browser=$b; break; fi
    done
    [[ -n $browser ]] || { echo "SKIP: no Chromium here (apt-get install chromium)"; exit 77; }
    DP_API_KEY=page-key start "$work/root" "${flags[@]}"
    prompts 3 >"$work/job.jsonl"
    id=$(curl -s -H 'Authorization: Bearer page-key' -X POST --data-binary @"$work/job.jsonl" "$url/v1/jobs" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    for _ in $(seq 600); do
        [[ $(curl -s -H 'Authorization: Bearer page-key' "$url/v1/jobs/$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])') == done ]] && break
        sleep 0.2
    done
    dom=$(timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
        --virtual-time-budget=10000 --dump-dom "$url/?key=page-key" 2>/dev/null || true)
    attr() { grep -o "data-$1=\"[0-9]*\"" <<<"$dom" | head -1 | grep -o '[0-9]*' || echo -; }
    echo "page: $(attr jobs) job(s), $(attr items) cards, $(attr images) images, $(attr images-loaded) loaded"
    [[ $(attr jobs) == 1 ]] || fail "the page lists $(attr jobs) jobs, not 1"
    [[ $(attr items) == 3 && $(attr images) == 3 ]] || fail "the page shows $(attr items) cards and $(attr images) images, not 3"
    [[ $(attr images-loaded) == 3 ]] || fail "$(attr images-loaded) of 3 images loaded"
    grep -q "$id" <<<"$dom" || fail "the page does not name $id"
    ;;
*)
    echo "usage: serve_check.sh DP_LAUNCH bytes|restart|security|limits|cancel|ranks|page" >&2
    exit 2
    ;;
esac
echo "PASS"
