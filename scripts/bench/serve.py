"""dp-launch serve against batch jobs, side by side in one run (docs/serve.md, "What a request costs"):

1. one batch job of the N prompts (`dp-launch FLAGS prompts.jsonl`): its wall, and its wall less
   the ranks' load phase (the job summary's `phases`);
2. N batch jobs of one prompt each, one after another;
3. `dp-launch serve FLAGS`, then N single-prompt POST /v1/images/generations requests sent at once:
   the time from the first request to the last answer, and each request's latency (p50, p95).

Each of ROUNDS rounds runs the three in turn; medians are printed with the server's ratio to each
batch figure, and the images are checked to be the batch job's, byte for byte.

    serve.py DP_LAUNCH [--prompts N] [--rounds R] [--ranks N] [--steps N] [--model M] [--flags "..."]
"""
import base64
import concurrent.futures
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_summary import summary_of  # noqa: E402

COLOURS = ["red", "green", "blue", "yellow", "orange", "purple"]
SHAPES = ["circle", "square", "triangle", "star", "ring"]


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def lines(count):
    return [{"prompt": f"a {COLOURS[i % 6]} {SHAPES[i % 5]} on a plain background", "seed": i} for i in range(count)]


def batch(dp_launch, flags, jsonl, out):
    start = time.perf_counter()
    proc = subprocess.run([dp_launch, *flags, "-q", "--progress", "json", "-o", out, jsonl], capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"dp-launch exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    phases = summary_of(proc).get("phases") or [{}]
    load_s = max(p.get("load_ms", 0) for p in phases) / 1000
    return wall, load_s


def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as answer:
        data = json.load(answer)
    return time.perf_counter() - start, data


def serve_round(dp_launch, flags, prompts, root):
    log = open(os.path.join(root + ".log"), "w")
    server = subprocess.Popen([dp_launch, "serve", "--port", "0", "--max-queue", str(len(prompts) + 1),
                               "--request-timeout", "3600", *flags, "-o", root], stderr=subprocess.PIPE, text=True)
    url = None
    for line in server.stderr:
        log.write(line)
        m = re.search(r"listening on (http://[^/ ]+)/", line)
        if m:
            url = m.group(1)
            break
    if not url:
        sys.exit("the server did not start: " + open(root + ".log").read())
    try:
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(lambda p: post(url + "/v1/images/generations", p), prompts))
        total = time.perf_counter() - start
    finally:
        server.terminate()
        server.wait()
    return total, [a[0] for a in answers], [a[1] for a in answers]


def main():
    dp_launch = sys.argv[1]
    count, rounds = int(arg("--prompts", "64")), int(arg("--rounds", "3"))
    flags = ["-n", arg("--ranks", "2"), "--steps", arg("--steps", "8")]
    flags += ["--model", arg("--model", "")] if "--model" in sys.argv else []
    flags += arg("--flags", "").split()
    tmp = tempfile.mkdtemp(prefix="dp-bench-serve-")
    prompts = lines(count)
    print(f"machine: {os.cpu_count()} CPUs; {count} prompts; dp-launch {' '.join(flags)}; {rounds} round(s)",
          flush=True)
    figures = {"batch": [], "batch_after_load": [], "separate": [], "serve": [], "p50": [], "p95": []}
    try:
        jsonl = os.path.join(tmp, "all.jsonl")
        with open(jsonl, "w") as f:
            f.writelines(json.dumps(p) + "\n" for p in prompts)
        for r in range(rounds):
            out = os.path.join(tmp, f"batch{r}")
            wall, load_s = batch(dp_launch, flags, jsonl, out)
            figures["batch"].append(wall)
            figures["batch_after_load"].append(wall - load_s)
            start = time.perf_counter()
            for i, p in enumerate(prompts):
                one = os.path.join(tmp, f"one{r}-{i}.jsonl")
                with open(one, "w") as f:
                    f.write(json.dumps(p) + "\n")
                batch(dp_launch, flags, one, os.path.join(tmp, f"one{r}-{i}"))
            figures["separate"].append(time.perf_counter() - start)
            total, latencies, answers = serve_round(dp_launch, flags, prompts, os.path.join(tmp, f"serve{r}"))
            figures["serve"].append(total)
            figures["p50"].append(statistics.median(latencies))
            figures["p95"].append(sorted(latencies)[int(0.95 * (len(latencies) - 1))])
            # The server's images are the one-prompt batch jobs' (the same line, index 0).
            for i, answer in enumerate(answers):
                folder = os.path.join(tmp, f"one{r}-{i}")
                record = json.loads(open(os.path.join(folder, "manifest.jsonl")).readline())
                if base64.b64decode(answer["data"][0]["b64_json"]) != open(os.path.join(folder, record["file"]),
                                                                           "rb").read():
                    sys.exit(f"request {i}: the image is not the batch job's")
            print(f"round {r + 1}: batch {wall:.2f} s (after load {wall - load_s:.2f} s), {count} separate "
                  f"{figures['separate'][-1]:.2f} s, serve {total:.2f} s", flush=True)
        med = {k: statistics.median(v) for k, v in figures.items()}
        print(f"\n{'':<34}{'median':>10}")
        print(f"{'one batch job of all prompts':<34}{med['batch']:>8.2f} s")
        print(f"{'  the same, after load':<34}{med['batch_after_load']:>8.2f} s")
        print(f"{'one batch job per prompt':<34}{med['separate']:>8.2f} s")
        print(f"{'serve, all requests at once':<34}{med['serve']:>8.2f} s   "
              f"(p50 {med['p50']:.2f} s, p95 {med['p95']:.2f} s a request)")
        print(f"serve / batch after load: {med['serve'] / med['batch_after_load']:.2f}x (goal <= 1.05x); "
              f"serve / batch: {med['serve'] / med['batch']:.2f}x; "
              f"serve / separate batch jobs: {med['serve'] / med['separate']:.2f}x; images: the batch jobs' bytes")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
