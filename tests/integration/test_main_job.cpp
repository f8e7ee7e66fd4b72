// The main job with real processes: dp-launch -> dp-worker ranks joined through c10d (Gloo, CPU),
// on the tiny SD3 model of tests/data/golden.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

using namespace dp::test;

namespace {

std::vector<std::string> job_args(const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model",  DP_TINY_MODEL, "--steps", "2", "--width", "16",
                                     "--height", "16",          "-o",      out, "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

std::string write_prompts(const std::string& dir, const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

// 10 x 9 pixels is 90 image tokens: not a multiple of 4, so a 4-way token split pads and masks.
std::vector<std::string> odd_size_args(const std::string& out, const std::vector<std::string>& extra,
                                       const std::string& prompts) {
    std::vector<std::string> a = {
        "--model", "tiny-random-sd3", "--steps", "3", "--width", "10", "--height", "9", "-o", out, "-q"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(prompts);
    return a;
}

const char* kFivePrompts =
    "a red circle on a blue background\n\na green square\nA YELLOW TRIANGLE!\nsmall red circle\nlast one\n";

}  // namespace

namespace {

// Runs each configuration on the three odd-size prompts and checks every image against one
// process: final latents within 1e-4 and PNGs within `tolerance` per channel (0: the same
// bytes). Reports how many were identical.
void expect_single_process_images(const std::vector<std::vector<std::string>>& configurations,
                                  int tolerance) {
    const std::string dir = make_temp_dir();
    const std::string prompts =
        write_prompts(dir, "p.txt", "a red circle\nA blue square!\na green triangle\n");
    const std::map<std::string, std::string> env = {{"DP_SAVE_LATENTS", "1"}};
    REQUIRE(run_launch(odd_size_args(dir + "/single", {"-n", "1"}, prompts), env, 120).exit_code == 0);
    const auto single = read_manifest(dir + "/single");
    for (const auto& extra : configurations) {
        CAPTURE(extra);
        LaunchResult r = run_launch(odd_size_args(dir + "/run", extra, prompts), env, 120);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto got = read_manifest(dir + "/run");
        REQUIRE(got.size() == 3);
        int identical = 0;
        for (std::size_t i = 0; i < 3; ++i) {
            const std::string file = single[i]["file"].get<std::string>();
            CHECK(max_pixel_difference(dir + "/single/" + file, dir + "/run/" + file) <= tolerance);
            CHECK(max_latent_difference(dir + "/single/" + file + ".latents.safetensors",
                                        dir + "/run/" + file + ".latents.safetensors") <= 1e-4f);
            identical += got[i]["sha256"] == single[i]["sha256"];
        }
        MESSAGE(identical << " of 3 images byte-identical");
        REQUIRE(std::system(("rm -rf '" + dir + "/run'").c_str()) == 0);
    }
}
}  // namespace

TEST_CASE("1, 2, 3 and 4 processes give byte-identical images and the same manifest") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", kFivePrompts);
    std::map<int, std::vector<nlohmann::json>> by_world;
    for (int n : {1, 2, 3, 4}) {
        const std::string out = dir + "/out" + std::to_string(n);
        Launch launch(job_args(out, {"-n", std::to_string(n), prompts}));
        LaunchResult r = launch.wait(120);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        CHECK(r.out.find("dp-launch: 5 images, 0 failed, 0 invalid, 0 not run") == 0);
        by_world[n] = read_manifest(out);
        REQUIRE(by_world[n].size() == 5);
        CHECK(processes_with_marker(launch.marker()).empty());
    }
    for (int n : {2, 3, 4}) {
        for (std::size_t i = 0; i < 5; ++i) {
            CAPTURE(n);
            CAPTURE(i);
            const auto& a = by_world[1][i];
            const auto& b = by_world[n][i];
            CHECK(a["file"] == b["file"]);
            CHECK(a["sha256"] == b["sha256"]);
            CHECK(a["seed"] == b["seed"]);
            CHECK(read_file(dir + "/out1/" + a["file"].get<std::string>()) ==
                  read_file(dir + "/out" + std::to_string(n) + "/" + b["file"].get<std::string>()));
        }
    }
    // The split: with 5 prompts on 4 ranks, rank 0 makes two and the others one each (accelerate's rule).
    std::map<int, int> per_rank;
    for (const auto& r : by_world[4]) per_rank[r["rank"].get<int>()]++;
    CHECK(per_rank == std::map<int, int>{{0, 2}, {1, 1}, {2, 1}, {3, 1}});
}

TEST_CASE("the manifest, field by field") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt",
                                              "\xEF\xBB\xBF"
                                              "first prompt\r\n\r\nsecond one\r\n");
    const std::string out = dir + "/out";
    LaunchResult r = run_launch(
        job_args(out, {"-n", "2", "--seed", "100", "--negative-prompt", "ugly", prompts}), {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(out);
    REQUIRE(records.size() == 2);
    const auto& m = records[1];
    CHECK(m["index"] == 1);
    CHECK(m["line"] == 3);
    CHECK(m["prompt"] == "second one");
    CHECK(m["negative_prompt"] == "ugly");
    CHECK(m["seed"] == 101);  // --seed + index
    CHECK(m["steps"] == 2);
    CHECK(m["guidance_scale"] == 7.0);
    CHECK(m["width"] == 16);
    CHECK(m["height"] == 16);
    CHECK(m["model"] == DP_TINY_MODEL);
    CHECK(m["file"] == "00001-second-one.png");
    CHECK(m["rank"] == 1);
    CHECK(m["status"] == "ok");
    CHECK(m["ms"].get<int64_t>() >= 0);
    CHECK(m["sha256"].get<std::string>().size() == 64);
    CHECK(file_exists(out + "/00001-second-one.png"));
    CHECK(read_file(out + "/00001-second-one.png").substr(1, 3) == "PNG");
    // Nothing but the images and the manifest is left in the folder.
    std::string listing;
    for (const char* f : {"00000-first-prompt.png", "00001-second-one.png", "manifest.jsonl"})
        listing += file_exists(out + "/" + f) ? "" : f;
    CHECK(listing.empty());
}

TEST_CASE(
    "JPEG, WebP and PNG with images per prompt: the same files at 1 and 3 processes, and each says how it "
    "was made") {
    const std::string dir = make_temp_dir();
    // A line's own num_images_per_prompt and seed over the job's; the other line takes
    // --num-images-per-prompt.
    const std::string prompts =
        write_lines(dir + "/p.json",  // JSON Lines whatever the name
                    {{{"prompt", "a red circle"}, {"seed", 40}, {"num_images_per_prompt", 3}},
                     {{"prompt", "a blue square"}}});
    struct Case {
        const char* format;
        const char* extension;
        const char* magic;
    };
    for (const Case& c : {Case{"jpeg", ".jpg", "\xFF\xD8\xFF"}, Case{"webp", ".webp", "RIFF"},
                          Case{"png", ".png", "\x89PNG"}}) {
        CAPTURE(c.format);
        // PNG's bytes at any rank count are the first test's; here its text chunks.
        const std::vector<int> worlds =
            std::string(c.format) == "png" ? std::vector<int>{1} : std::vector<int>{1, 3};
        std::map<int, std::vector<nlohmann::json>> by_world;
        for (int n : worlds) {
            const std::string out = dir + "/" + c.format + std::to_string(n);
            LaunchResult r =
                run_launch(job_args(out, {"-n", std::to_string(n), "--format", c.format, "--seed", "7",
                                          "--num-images-per-prompt", "2", prompts}),
                           {}, 120);
            REQUIRE_MESSAGE(r.exit_code == 0, r.err);
            by_world[n] = read_manifest(out);
            REQUIRE(by_world[n].size() == 5);
        }
        const std::vector<nlohmann::json>& m = by_world[1];
        // Images 0..2 of line 1 (seeds 40, 41, 42), then 3..4 of line 2 (the job's seed + index).
        const std::vector<uint64_t> seeds = {40, 41, 42, 10, 11};
        const std::vector<int> image = {0, 1, 2, 0, 1};
        for (std::size_t i = 0; i < 5; ++i) {
            CAPTURE(i);
            CHECK(m[i]["index"] == i);
            CHECK(m[i]["seed"] == seeds[i]);
            CHECK(m[i]["image_index"] == image[i]);
            CHECK(m[i]["num_images_per_prompt"] == (i < 3 ? 3 : 2));
            CHECK(m[i]["line"] == (i < 3 ? 1 : 2));
            const std::string file = m[i]["file"].get<std::string>();
            CHECK(file.size() > std::strlen(c.extension));
            CHECK(file.substr(file.size() - std::strlen(c.extension)) == c.extension);
            const std::string bytes = read_file(dir + "/" + c.format + "1/" + file);
            CHECK(bytes.rfind(c.magic, 0) == 0);
            if (worlds.size() > 1) {
                CHECK(bytes == read_file(dir + "/" + c.format + "3/" + file));
                CHECK(by_world[3][i]["sha256"] == m[i]["sha256"]);
            }
            const std::string prompt = m[i]["prompt"].get<std::string>();
            const std::string settings = "Seed: " + std::to_string(seeds[i]) + ", Size: 16x16";
            if (std::string(c.format) == "png") {
                const auto texts = read_png_texts(dir + "/png1/" + file);
                REQUIRE(texts.count("parameters") == 1);
                CHECK(texts.at("parameters")
                          .rfind(prompt + "\nSteps: 2, Sampler: Euler, CFG scale: 7, " + settings, 0) == 0);
                REQUIRE(texts.count("dp-launch") == 1);
                const nlohmann::json record = nlohmann::json::parse(texts.at("dp-launch"));
                CHECK(record["prompt"] == prompt);
                CHECK(record["seed"] == seeds[i]);
            } else {
                // EXIF: the parameters as UserComment in UTF-16BE (AUTOMATIC1111's way), the record as
                // ImageDescription.
                CHECK(bytes.find("UNICODE" + std::string(1, '\0') + utf16be(prompt + "\nSteps: 2")) !=
                      std::string::npos);
                CHECK(bytes.find(utf16be(settings)) != std::string::npos);
                CHECK(bytes.find("\"seed\":" + std::to_string(seeds[i])) != std::string::npos);
            }
        }
        // Different seeds make different images.
        CHECK(m[0]["sha256"] != m[1]["sha256"]);
    }
}

TEST_CASE(
    "--progress json: one JSON object a line on stdout, a step event for every step, then the summary") {
    const std::string dir = make_temp_dir();
    const std::string out = dir + "/out";
    // Three images over two ranks, 2 steps each; the launcher's own lines also in --log-dir.
    LaunchResult r = run_launch(job_args(out, {"-n", "2", "--progress", "json", "--log-dir", dir + "/logs",
                                               "--prompt", "one", "--prompt", "two", "--prompt", "three"}),
                                {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    std::vector<nlohmann::json> events;
    for (const std::string& line : lines_of(r.out)) {
        CAPTURE(line);
        REQUIRE(nlohmann::json::accept(line));  // nothing but events on stdout
        events.push_back(nlohmann::json::parse(line));
    }
    REQUIRE(events.size() >= 2);
    CHECK(events.front()["event"] == "job_start");
    CHECK(events.front()["images"] == 3);
    CHECK(events.back()["event"] == "summary");
    CHECK(events.back()["images"] == 3);
    CHECK(events.back()["exit_code"] == 0);
    CHECK(events.back()["line"].get<std::string>().rfind("dp-launch: 3 images, 0 failed", 0) == 0);
    std::map<std::string, int> count;
    std::map<int64_t, std::vector<int>> steps;  // image -> its step events, in order
    std::set<int> ready;
    double last_t = 0;
    for (const nlohmann::json& e : events) {
        const std::string name = e["event"].get<std::string>();
        ++count[name];
        CHECK(e["t"].get<double>() >= last_t);  // in time order
        last_t = e["t"].get<double>();
        if (name == "step") {
            CHECK(e["steps"] == 2);
            steps[e["index"].get<int64_t>()].push_back(e["step"].get<int>());
        }
        if (name == "rank_ready") ready.insert(e["rank"].get<int>());
        if (name == "image") CHECK(steps[e["index"].get<int64_t>()] == std::vector<int>{1, 2});
    }
    CHECK(count["image"] == 3);
    CHECK(count["step"] == 6);
    CHECK(count["progress"] == 3);
    CHECK(ready == std::set<int>{0, 1});
    const std::string log = read_file(dir + "/logs/launcher.log");
    CHECK(log.find("\"event\":\"summary\"") != std::string::npos);
}

TEST_CASE("2 prompts on 4 ranks: the ranks without prompts join, wait and exit 0") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "one\ntwo\n");
    LaunchResult r = run_launch(job_args(dir + "/out", {"-n", "4", prompts}), {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(read_manifest(dir + "/out").size() == 2);
}

TEST_CASE("an empty prompt file, or only blank lines: nothing to do, exit 0") {
    const std::string dir = make_temp_dir();
    for (const char* text : {"", "\n  \n\t\r\n"}) {
        const std::string prompts = write_prompts(dir, "p.txt", text);
        LaunchResult r = run_launch(job_args(dir + "/out", {"-n", "2", prompts}));
        CHECK(r.exit_code == 0);
        CHECK(r.out.find("nothing to do: " + prompts + " has no prompts") != std::string::npos);
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
    }
    LaunchResult missing = run_launch(job_args(dir + "/out", {dir + "/no-such-file.txt"}));
    CHECK(missing.exit_code == 66);
    CHECK(missing.err.find("no-such-file.txt: cannot read") != std::string::npos);
}

TEST_CASE("prompts from stdin, read once by the launcher") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "from stdin one\nfrom stdin two\n");
    std::vector<std::string> args = job_args(dir + "/out", {"-n", "2", "-"});
    std::string command = std::string(launcher_bin());
    for (const auto& a : args) command += " '" + a + "'";
    const int rc = std::system((command + " < " + prompts + " > /dev/null 2>&1").c_str());
    CHECK(rc == 0);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 2);
    CHECK(records[1]["prompt"] == "from stdin two");
}

TEST_CASE("JSONL overrides per prompt, and hostile names stay inside the output folder") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(
        dir, "p.jsonl",
        R"({"prompt": "custom", "seed": 7, "steps": 1, "guidance_scale": 1.0, "width": 24, "height": 8, "name": "../../escape"})"
        "\n"
        R"({"prompt": "second", "negative_prompt": "n", "name": "/etc/passwd"})"
        "\n"
        R"({"prompt": "third", "name": "..\u0007\u001b[31m"})"
        "\n");
    const std::string out = dir + "/out";
    LaunchResult r = run_launch(job_args(out, {"-n", "2", prompts}), {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(out);
    REQUIRE(records.size() == 3);
    CHECK(records[0]["seed"] == 7);
    CHECK(records[0]["steps"] == 1);
    CHECK(records[0]["guidance_scale"] == 1.0);
    CHECK(records[0]["width"] == 24);
    CHECK(records[0]["height"] == 8);
    CHECK(records[0]["file"] == "00000-escape.png");
    CHECK(records[1]["file"] == "00001-etc-passwd.png");
    CHECK(records[1]["negative_prompt"] == "n");
    CHECK(records[2]["file"] == "00002-31m.png");  // control characters and dots dropped
    for (const auto& rec : records) CHECK(file_exists(out + "/" + rec["file"].get<std::string>()));
    CHECK_FALSE(file_exists(dir + "/escape.png"));
}

TEST_CASE("invalid lines: refused and all listed by default, skipped and recorded with --skip-invalid") {
    const std::string dir = make_temp_dir();
    std::string text = "good\n";
    text += std::string("nul\0byte\n", 9);
    text += "bad \xFF utf8\n";
    text += "also good\n";
    const std::string prompts = write_prompts(dir, "p.txt", text);
    LaunchResult refused = run_launch(job_args(dir + "/out", {"-n", "2", prompts}));
    CHECK(refused.exit_code == 65);
    CHECK(refused.err.find("has 2 invalid line(s); nothing was started") != std::string::npos);
    CHECK(refused.err.find(prompts + ":2: contains a NUL byte") != std::string::npos);
    CHECK(refused.err.find(prompts + ":3: not valid UTF-8") != std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));

    LaunchResult skipped =
        run_launch(job_args(dir + "/out", {"-n", "2", "--skip-invalid", prompts}), {}, 120);
    REQUIRE_MESSAGE(skipped.exit_code == 0, skipped.err);
    CHECK(skipped.out.find("2 images, 0 failed, 2 invalid") != std::string::npos);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 4);
    CHECK(records[1]["status"] == "invalid");
    CHECK(records[1]["line"] == 2);
    CHECK(records[2]["status"] == "invalid");
    CHECK(records[3]["status"] == "ok");
    CHECK(records[3]["file"] == "00003-also-good.png");  // indices never shift
}

TEST_CASE("earlier outputs are never overwritten without --overwrite") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "only one\n");
    REQUIRE(run_launch(job_args(dir + "/out", {prompts}), {}, 120).exit_code == 0);
    const std::string before = read_file(dir + "/out/manifest.jsonl");
    LaunchResult again = run_launch(job_args(dir + "/out", {prompts}));
    CHECK(again.exit_code == 2);
    CHECK(again.err.find("already exist; pass --overwrite") != std::string::npos);
    CHECK(read_file(dir + "/out/manifest.jsonl") == before);
    CHECK(run_launch(job_args(dir + "/out", {"--overwrite", prompts}), {}, 120).exit_code == 0);
}

TEST_CASE("a size the model cannot make is an invalid line, found before any rank starts") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.jsonl",
                                              R"({"prompt": "too wide", "width": 512})"
                                              "\n"
                                              R"({"prompt": "fine"})"
                                              "\n");
    LaunchResult r = run_launch(job_args(dir + "/out", {"-n", "2", prompts}), {}, 120);
    CHECK(r.exit_code == 65);
    CHECK(r.err.find(prompts + ":1: key 'width': 512: this model makes sizes") != std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
}

TEST_CASE("without --model the shipped default is found next to dp-launch, wherever the job runs") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "default model\n");
    Launch launch({"-n", "2", "--steps", "1", "-o", dir + "/out", "-q", prompts});
    LaunchResult r = launch.wait(120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 1);
    const std::string model = records[0]["model"].get<std::string>();
    CHECK(model.substr(model.size() - 18) == "/models/shapes-sd3");
    CHECK(records[0]["width"] == 32);  // the model's default size
}

TEST_CASE("--batch-size 3 runs every prompt once, with the same seeds and files as batch 1") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", kFivePrompts);
    REQUIRE(run_launch(job_args(dir + "/one", {"-n", "2", prompts}), {}, 120).exit_code == 0);
    LaunchResult r = run_launch(job_args(dir + "/three", {"-n", "2", "--batch-size", "3", prompts}), {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto a = read_manifest(dir + "/one"), b = read_manifest(dir + "/three");
    REQUIRE(b.size() == 5);
    int same = 0;
    for (std::size_t i = 0; i < 5; ++i) {
        CHECK(a[i]["file"] == b[i]["file"]);
        CHECK(a[i]["seed"] == b[i]["seed"]);
        CHECK(b[i]["status"] == "ok");
        same += a[i]["sha256"] == b[i]["sha256"];
    }
    MESSAGE(same << " of 5 images byte-identical to batch 1 (the rest differ by at most 1 per channel: see "
                    "the unit test)");
}

TEST_CASE("CFG parallel (cfg2, and dp2 x cfg2) gives the single-process images, byte for byte") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", kFivePrompts);
    REQUIRE(run_launch(job_args(dir + "/single", {"-n", "1", prompts}), {}, 120).exit_code == 0);
    for (int n : {2, 4}) {
        CAPTURE(n);
        const std::string out = dir + "/cfg" + std::to_string(n);
        LaunchResult r =
            run_launch(job_args(out, {"-n", std::to_string(n), "--cfg-parallel", prompts}), {}, 120);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto a = read_manifest(dir + "/single"), b = read_manifest(out);
        REQUIRE(b.size() == 5);
        std::set<int> writers;
        for (std::size_t i = 0; i < 5; ++i) {
            CHECK(a[i]["sha256"] == b[i]["sha256"]);
            writers.insert(b[i]["rank"].get<int>());
        }
        // Only the first rank of each pair writes: ranks 0 (and 2 with dp2 x cfg2).
        CHECK(writers == (n == 2 ? std::set<int>{0} : std::set<int>{0, 2}));
    }
}

TEST_CASE("CFG parallel is refused before anything starts when it cannot apply") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "x\n");
    LaunchResult odd = run_launch(job_args(dir + "/out", {"-n", "3", "--cfg-parallel", prompts}));
    CHECK(odd.exit_code == 2);
    CHECK(odd.err.find("--cfg-parallel: the world has 3 ranks") != std::string::npos);
    LaunchResult unguided =
        run_launch(job_args(dir + "/out", {"-n", "2", "--cfg-parallel", "--guidance-scale", "1", prompts}));
    CHECK(unguided.exit_code == 2);
    CHECK(unguided.err.find("no guidance to split") != std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
}

TEST_CASE(
    "Ulysses context parallelism (2, 4 over an odd token count, 3 over 4 heads, and with cfg2) gives the "
    "single-process images") {
    expect_single_process_images({{"-n", "2", "--ulysses", "2"},
                                  {"-n", "4", "--ulysses", "4"},
                                  {"-n", "3", "--ulysses", "3"},  // 4 heads as 2, 1, 1
                                  {"-n", "4", "--ulysses", "2", "--cfg-parallel"}},
                                 0);
}

TEST_CASE("Ulysses degrees that cannot work are refused before any model is loaded") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "x\n");
    LaunchResult heads = run_launch(job_args(dir + "/out", {"-n", "5", "--ulysses", "5", prompts}));
    CHECK(heads.exit_code == 2);
    CHECK_MESSAGE(
        heads.err.find("--tp 1 x --ulysses 5: the model has 4 attention heads, fewer than the 5 ranks") !=
            std::string::npos,
        heads.err);
    CHECK(heads.err.find("tp x ulysses may be at most 4 (1, 2, 4 split them evenly") != std::string::npos);
    LaunchResult world = run_launch(job_args(dir + "/out", {"-n", "2", "--ulysses", "4", prompts}));
    CHECK(world.exit_code == 2);
    CHECK(world.err.find("does not divide by 4") != std::string::npos);
}

TEST_CASE(
    "tensor parallelism (tp2, tp4, tp3 over 4 heads, tp2 x ulysses2, tp2 x cfg2) gives the single-process "
    "images "
    "within 1 per channel") {
    expect_single_process_images({{"-n", "2", "--tp", "2"},
                                  {"-n", "4", "--tp", "4"},
                                  {"-n", "3", "--tp", "3"},  // 4 heads as 2, 1, 1; MLP features 43, 43, 42
                                  {"-n", "4", "--tp", "2", "--ulysses", "2"},
                                  {"-n", "4", "--tp", "2", "--cfg-parallel"}},
                                 1);
    const std::string dir = make_temp_dir();
    LaunchResult heads =
        run_launch(odd_size_args(dir + "/bad", {"-n", "5", "--tp", "5"}, write_prompts(dir, "p.txt", "x\n")));
    CHECK(heads.exit_code == 2);
    CHECK(heads.err.find("so a rank would hold none; tp x ulysses may be at most 4") != std::string::npos);
}

TEST_CASE(
    "Ring attention (2, 3, 4 over 90 tokens, with tp2, with cfg2) and USP (ring2 x ulysses2, also with tp2) "
    "give the "
    "single-process images within 1 per channel") {
    expect_single_process_images({{"-n", "2", "--ring", "2"},
                                  {"-n", "3", "--ring", "3"},
                                  {"-n", "4", "--ring", "4"},
                                  {"-n", "4", "--ring", "2", "--tp", "2"},
                                  {"-n", "4", "--ring", "2", "--cfg-parallel"},
                                  {"-n", "4", "--ring", "2", "--ulysses", "2"},
                                  {"-n", "8", "--ring", "2", "--ulysses", "2", "--tp", "2"}},
                                 1);
}

namespace {
// "kind=bytes" pairs from a rank's DP_COMM_REPORT line on stderr.
std::map<std::string, long long> reported_bytes(const std::string& err, int rank) {
    std::map<std::string, long long> out;
    const std::string marker = "dp-worker: rank " + std::to_string(rank) + " communication bytes:";
    const std::size_t at = err.find(marker);
    REQUIRE_MESSAGE(at != std::string::npos, err);
    std::istringstream in(err.substr(at + marker.size(), err.find('\n', at) - at - marker.size()));
    for (std::string item; in >> item;)
        out[item.substr(0, item.find('='))] = std::stoll(item.substr(item.find('=') + 1));
    return out;
}
}  // namespace

TEST_CASE("measured communication bytes per strategy equal the README's per-step formulas") {
    // The tiny model: width D = 32, H = 4 heads of d = 8, L = 2 blocks (the last context-pre-only),
    // patch 1 and C = 4 latent channels; 10 x 9 pixels give N = 90 image tokens; the text is
    // T = 77 CLIP tokens + the one that stands for T5's 256 zeros. With guidance the transformer
    // runs a batch of B = 2.
    const long long D = 32, H = 4, d = 8, L = 2, C = 4, N = 90, T = 77 + 1, B = 2, S = 3,
                    f = 4;  // f: bytes per fp32
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "one prompt\n");
    auto run = [&](std::vector<std::string> extra) {
        LaunchResult r =
            run_launch(odd_size_args(dir + "/out", extra, prompts), {{"DP_COMM_REPORT", "1"}}, 120);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        REQUIRE(std::system(("rm -rf '" + dir + "/out'").c_str()) == 0);
        return reported_bytes(r.err, 0);
    };
    // CFG: one all_gather of this rank's noise prediction (1 x C x h x w) per step.
    CHECK(run({"-n", "2", "--cfg-parallel"}) ==
          std::map<std::string, long long>{{"all_gather", S * C * N * f}});
    // Ulysses U = 2: per block 4 all-to-alls of B x H x (N/U) x d, an all_gather of the text
    // output over heads (B x H/U x T x d) in every block with a text output, and one all_gather of
    // the final tokens (B x N/U x C).
    const long long U = 2, local = N / U;
    CHECK(run({"-n", "2", "--ulysses", "2"}) ==
          std::map<std::string, long long>{
              {"all_to_all", S * 4 * L * B * H * local * d * f},
              {"all_gather", S * ((L - 1) * B * (H / U) * T * d + B * local * C) * f}});
    // TP: per block an all_reduce after attention-out and MLP-out of each stream that has them,
    // and an all_gather of this rank's half of AdaLN's modulations (B x 6D/2 per stream, the last
    // block's text B x 2D/2).
    const long long P = 2;
    CHECK(run({"-n", "2", "--tp", "2"}) ==
          std::map<std::string, long long>{
              {"all_reduce", S * B * D * (2 * N * L + 2 * T * (L - 1)) * f},
              {"all_gather", S * B * (6 * D * L + 6 * D * (L - 1) + 2 * D) / P * f}});
    // Ring R = 2: per block R - 1 sends of this rank's keys and values (B x H x N/R x d each), and
    // one all_gather of the final tokens.
    const long long R = 2;
    CHECK(run({"-n", "2", "--ring", "2"}) ==
          std::map<std::string, long long>{{"send", S * L * 2 * (R - 1) * B * H * (N / R) * d * f},
                                           {"all_gather", S * B * (N / R) * C * f}});
}

TEST_CASE("--strategy fills the degrees from the world: context is Ulysses where heads allow, else Ring") {
    expect_single_process_images({{"-n", "2", "--strategy", "context"},
                                  {"-n", "3", "--strategy", "context"},
                                  {"-n", "2", "--strategy", "tensor"}},
                                 1);
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "x\n");
    auto mesh_line = [&](std::vector<std::string> args) {
        args.insert(args.end(), {"--model", "tiny-random-sd3", "--steps", "1", "--width", "10", "--height",
                                 "9", "--overwrite", "-o", dir + "/out", prompts});
        LaunchResult r = run_launch(args, {}, 120);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const std::size_t at = r.err.find("dp-launch: mesh ");
        return at == std::string::npos ? std::string() : r.err.substr(at, r.err.find('\n', at) - at);
    };
    CHECK(mesh_line({"-n", "2", "--strategy", "context"}) ==
          "dp-launch: mesh dp=1 cfg=1 ring=1 ulysses=2 tp=1");
    CHECK(mesh_line({"-n", "3", "--strategy", "context"}) ==
          "dp-launch: mesh dp=1 cfg=1 ring=3 ulysses=1 tp=1");  // 4 heads: no 3-way Ulysses
    CHECK(mesh_line({"-n", "4", "--strategy", "tensor", "--cfg-parallel"}) ==
          "dp-launch: mesh dp=1 cfg=2 ring=1 ulysses=1 tp=2");
    for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"-n", "2", "--strategy", "device-map"}, "--device-map runs one process over several devices"},
             {{"-n", "2", "--strategy", "context", "--tp", "2"},
              "give either --strategy or --ulysses/--ring/--tp"},
             {{"-n", "4", "--ulysses", "2", "--dp", "3"},
              "--dp 3: dp x cfg x ring x ulysses x tp = 6 but the world has 4 ranks (--dp 2 would fit)"},
             {{"-n", "2", "--strategy", "sideways"},
              "--strategy 'sideways': expected one of data, context, tensor, device-map"}}) {
        CAPTURE(message);
        std::vector<std::string> full = args;
        full.push_back(prompts);
        LaunchResult r = run_launch(full);
        CHECK(r.exit_code == 2);
        CHECK(r.err.find(message) != std::string::npos);
    }
}

TEST_CASE(
    "dp-launch plan shows ranks, sub-groups, parameter bytes and the bytes a run really sends, in well under "
    "a second") {
    LaunchResult plan = run_launch({"plan", "--model", "tiny-random-sd3", "-n", "4", "--ulysses", "2", "--tp",
                                    "2", "--width", "10", "--height", "9"});
    REQUIRE_MESSAGE(plan.exit_code == 0, plan.err);
    CHECK(plan.cpu_seconds < 1.0);  // its work, whatever the machine's load
    CHECK(plan.out.find("mesh dp=1 cfg=1 ring=1 ulysses=2 tp=2") != std::string::npos);
    CHECK(plan.out.find("rank 0: dp 0, cfg 0, ring 0, ulysses 0, tp 0 -- all prompts, writes the images") !=
          std::string::npos);
    CHECK(plan.out.find("ulysses: [0,2] [1,3]") != std::string::npos);
    CHECK(plan.out.find("tp: [0,1] [2,3]") != std::string::npos);
    CHECK(plan.out.find("(392720) = ") != std::string::npos);  // the per-rank bytes the tp unit test checks
    // The text tokens: CLIP's length from the tokenizer plus the one for T5's zeros; 77 when a
    // folder has no tokenizer config.
    CHECK(plan.out.find(", 78 text tokens") != std::string::npos);
    CHECK(run_launch({"plan", "--model", "shapes-sd3"}).out.find(", 33 text tokens") != std::string::npos);
    const std::string bare = make_temp_dir() + "/no-tokenizer";
    REQUIRE(std::system(("cp -r '" + std::string(DP_TINY_MODEL) + "' '" + bare + "' && rm -rf '" + bare +
                         "/tokenizer'")
                            .c_str()) == 0);
    const LaunchResult no_tok = run_launch({"plan", "--model", bare});
    CHECK_MESSAGE(no_tok.exit_code == 0, no_tok.err);
    CHECK(no_tok.out.find(", 78 text tokens") != std::string::npos);
    // The plan's per-step estimate, times the steps, is what a run of one prompt reports.
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "one prompt\n");
    for (const auto& [degree, kind] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"--tp", "2"}, "all_reduce"}, {{"--ring", "2"}, "send"}}) {
        CAPTURE(kind);
        std::vector<std::string> plan_args = {"plan",    "--model", "tiny-random-sd3", "-n", "2",
                                              "--width", "10",      "--height",        "9"};
        plan_args.insert(plan_args.end(), degree.begin(), degree.end());
        const std::string text = run_launch(plan_args).out;
        const std::size_t at = text.find("  " + kind + ": ");
        REQUIRE(at != std::string::npos);
        const long long per_step = std::stoll(text.substr(text.find('(', at) + 1));
        // plan --json: the same figure, for a script.
        plan_args.push_back("--json");
        const LaunchResult json = run_launch(plan_args);
        REQUIRE_MESSAGE(json.exit_code == 0, json.err);
        CHECK(json.err.empty());
        CHECK(nlohmann::json::parse(json.out)["step_traffic"]["bytes_per_rank_per_step"][kind] == per_step);
        std::vector<std::string> run_args = {"-n", "2"};
        run_args.insert(run_args.end(), degree.begin(), degree.end());
        LaunchResult r =
            run_launch(odd_size_args(dir + "/out", run_args, prompts), {{"DP_COMM_REPORT", "1"}}, 120);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        REQUIRE(std::system(("rm -rf '" + dir + "/out'").c_str()) == 0);
        CHECK(reported_bytes(r.err, 0)[kind] == 3 * per_step);
    }
}

TEST_CASE(
    "device_map auto over two explicit CPU devices gives the single-process images, moving exactly "
    "the activations its plan implies") {
    // 450 KB on cpu:0 holds transformer block 0 with the embeddings and head; block 1, both text
    // encoders and the VAE go to cpu:1.
    const std::vector<std::string> device_map = {
        "-n", "1", "--device-map", "auto", "--max-memory", "cpu:0=450KB,cpu:1=2MB"};
    expect_single_process_images({device_map}, 0);

    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "one\ntwo\n");
    LaunchResult r =
        run_launch(odd_size_args(dir + "/out", device_map, prompts), {{"DP_COMM_REPORT", "1"}}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("transformer block 0 (with its embeddings and output head): cpu:0") !=
          std::string::npos);
    CHECK(r.err.find("transformer block 1: cpu:1") != std::string::npos);
    CHECK(r.err.find("text_encoder: cpu:1") != std::string::npos);
    // Width D = 32, B = 2 with guidance, N = 90 image and T = 78 text tokens, C = 4, S = 3 steps.
    // Each branch encoded: both encoders' hidden states (77 x 32) and pooled outputs (32) to cpu:0;
    // three in all, the negative prompt "" once for both prompts (Note [prompts encoded once]).
    // Per prompt, each step, for each branch's call (on the CPU the branches run one call each: Note
    // [CFG branches on the CPU]), the image, text and conditioning to cpu:1 at block 1 and the image
    // and conditioning back for the head; the final latents to the VAE on cpu:1.
    const long long D = 32, B = 2, N = 90, T = 78, C = 4, S = 3, f = 4, prompts_n = 2, encoded = 3;
    const long long moves = encoded * 2 * 2 + prompts_n * (S * 5 * B + 1);
    const long long bytes = encoded * 2 * (77 * D + D) * f +
                            prompts_n * (S * (B * (N * D + T * D + D) + B * (N * D + D)) * f + C * N * f);
    CHECK(r.err.find("device_map moved " + std::to_string(bytes) + " bytes in " + std::to_string(moves) +
                     " moves") != std::string::npos);
}

TEST_CASE("device_map is refused before anything starts when it cannot work") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_prompts(dir, "p.txt", "x\n");
    const std::string one_device = write_prompts(
        dir, "one.json", R"({"text_encoder": 0, "text_encoder_2": 0, "transformer": "cuda:0", "vae": 0})");
    const std::string unknown = write_prompts(
        dir, "unknown.json",
        R"({"text_encoder": 0, "text_encoder_2": 0, "transformer": [0, 1], "vae": 1, "unet": 0})");
    const std::string blocks =
        write_prompts(dir, "blocks.json",
                      R"({"text_encoder": 0, "text_encoder_2": 0, "transformer": [0, 1, 1], "vae": 1})");
    for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"-n", "2", "--device-map", "auto"}, "--device-map runs one process over several devices"},
             {{"--device-map", "auto", "--max-memory", "cpu:0=1GB"}, "needs at least two devices"},
             {{"--device-map", "auto", "--max-memory", "cpu:0=1GB,cpu:0=2GB"}, "names cpu:0 twice"},
             {{"--device-map", "auto", "--max-memory", "cpu:0=12parsecs,cpu:1=1GB"},
              "is not a positive size"},
             {{"--device-map", "auto", "--max-memory", "gpu0=1GB"}, "expected cuda:N, cpu:N"},
             {{"--device-map", "balanced", "--max-memory", "cpu:0=300KB,cpu:1=300KB"},
              "transformer (516368 bytes) fits on no device"},
             {{"--device-map", "auto", "--tp", "2"}, "does not combine with"},
             {{"--max-memory", "cpu:0=1GB,cpu:1=1GB"}, "add --device-map balanced or auto"},
             {{"--device-map", one_device}, "puts everything on cuda:0"},
             {{"--device-map", unknown}, "'unet' is not a component of this model"},
             {{"--device-map", blocks}, "lists 3 devices but the model has 2 blocks"},
             {{"--device-map", dir + "/missing.json"}, "cannot read it"}}) {
        CAPTURE(message);
        std::vector<std::string> full = {"--model", "tiny-random-sd3", "-o", dir + "/out"};
        full.insert(full.end(), args.begin(), args.end());
        full.push_back(prompts);
        LaunchResult r = run_launch(full);
        CHECK(r.exit_code == 2);
        CHECK(r.err.find(message) != std::string::npos);
        CHECK_FALSE(file_exists(dir + "/out"));
    }
}

TEST_CASE("dp-launch plan shows a device map, or says its budgets are measured when the job starts") {
    LaunchResult plan = run_launch({"plan", "--model", "tiny-random-sd3", "--device-map", "auto",
                                    "--max-memory", "cpu:0=450KB,cpu:1=2MB"});
    REQUIRE_MESSAGE(plan.exit_code == 0, plan.err);
    CHECK(plan.cpu_seconds < 1.0);  // its work, whatever the machine's load
    CHECK(plan.out.find("transformer block 1: cpu:1") != std::string::npos);
    CHECK(plan.out.find("cpu:0 holds 0.40 MiB") != std::string::npos);
    plan = run_launch({"plan", "--model", "tiny-random-sd3", "--device-map", "auto", "--max-memory",
                       "cpu:0=450KB,cpu:1=2MB", "--json"});
    REQUIRE_MESSAGE(plan.exit_code == 0, plan.err);
    const nlohmann::json placed = nlohmann::json::parse(plan.out)["device_map"];
    CHECK(placed["mode"] == "auto");
    CHECK(
        std::count_if(placed["placements"].begin(), placed["placements"].end(), [](const nlohmann::json& p) {
            return p["component"] == "transformer" && p["block"] == 1 && p["device"] == "cpu:1";
        }) == 1);
    LaunchResult gpus = run_launch({"plan", "--strategy", "device-map"});
    REQUIRE_MESSAGE(gpus.exit_code == 0, gpus.err);
    CHECK(gpus.out.find("device_map auto: one process; budgets are") != std::string::npos);
}

TEST_CASE(
    "dp-launch arguments --json lists a model's keys: all of them at their defaults is a valid line, any "
    "other key exits 65") {
    const std::string dir = make_temp_dir();
    for (const char* model : {"tiny-random-sd3", "tiny-random-qwen-image", "tiny-random-flux-schnell"}) {
        CAPTURE(model);
        const LaunchResult listed = run_launch({"arguments", "--model", model, "--json"});
        REQUIRE_MESSAGE(listed.exit_code == 0, listed.err);
        CHECK(listed.cpu_seconds < 1.0);  // configs only, no LibTorch
        const nlohmann::json keys = nlohmann::json::parse(listed.out);
        nlohmann::json line = {{"prompt", "a red circle"}};
        for (const nlohmann::json& k : keys) line[k.at("name").get<std::string>()] = k.at("default");
        const std::string good = write_prompts(dir, std::string(model) + ".jsonl", line.dump() + "\n");
        const LaunchResult ok = run_launch({"--model", model, "--dry-run", "-o", dir + "/out", good});
        CHECK_MESSAGE(ok.exit_code == 0, ok.err);
        line["not_a_key"] = 1;
        const std::string bad = write_prompts(dir, std::string(model) + "-bad.jsonl", line.dump() + "\n");
        const LaunchResult refused = run_launch({"--model", model, "--dry-run", "-o", dir + "/out", bad});
        CHECK(refused.exit_code == 65);
        CHECK(refused.err.find("unknown key 'not_a_key'") != std::string::npos);
    }
    const LaunchResult text = run_launch({"arguments", "--model", "tiny-random-sd3"});
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.find("skip_guidance_layers") != std::string::npos);
    CHECK(run_launch({"arguments", "--model", dir + "/no-such-model"}).exit_code == 66);  // missing input
}

TEST_SUITE_END();
