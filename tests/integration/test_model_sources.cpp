// Where the main job's model comes from and how it is stored, end to end with real ranks: a
// snapshot of a Hugging Face cache (symlinks into blobs/, refs/main and a second revision), an fp16
// weight variant run in fp32, --dtype auto on the CPU, and the new per-prompt settings reaching
// the ranks without being batched across. Each check compares PNG bytes with a run whose result
// is known independently: the plain folder, or fp32 weights rounded through fp16.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

namespace fs = std::filesystem;
using namespace dp::test;

namespace {

std::vector<std::string> job_args(const std::string& model, const std::string& out,
                                  std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model", model,      "--steps", "2",  "--width", "16", "--height",
                                     "16",      "--device", "cpu",     "-o", out,       "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

// An image's pixels: two files of the same pixels differ in the record each carries (its index,
// its model's folder name; Note [image metadata]).
std::vector<uint8_t> png(const std::string& out, const nlohmann::json& record) {
    return read_png_rgb(out + "/" + record.at("file").get<std::string>());
}

// IEEE binary16 from binary32, rounding to nearest even (finite values of a model's weights).
uint16_t to_half(float f) {
    uint32_t x = 0;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffff;
    if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return static_cast<uint16_t>(sign);
        mant |= 0x800000;
        const int shift = 14 - exp;
        uint32_t half = mant >> shift;
        const uint32_t rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1))) ++half;
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // a carry moves into the exponent
    return static_cast<uint16_t>(half);
}

float from_half(uint16_t h) {
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x = 0;
    if (exp == 0 && mant == 0) {
        x = sign;
    } else if (exp == 0) {
        int e = 1;
        while (!(mant & 0x400)) {
            mant <<= 1;
            --e;
        }
        x = sign | (static_cast<uint32_t>(e + 127 - 15) << 23) | ((mant & 0x3ff) << 13);
    } else {
        x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f = 0;
    std::memcpy(&f, &x, 4);
    return f;
}

// Rewrites the F32 safetensors file `from` as `to`: each value rounded through fp16, stored as F16
// (`as_half`) or as the F32 of that half.
void round_through_half(const std::string& from, const std::string& to, bool as_half) {
    const std::string bytes = read_file(from);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    const char* data = bytes.data() + 8 + n;
    nlohmann::json out_header = nlohmann::json::object();
    std::string out_data;
    for (const auto& [name, info] : header.items()) {
        if (name == "__metadata__") {
            out_header[name] = info;
            continue;
        }
        REQUIRE(info.at("dtype") == "F32");
        const uint64_t begin = info.at("data_offsets")[0], end = info.at("data_offsets")[1];
        const uint64_t at = out_data.size();
        for (uint64_t i = begin; i < end; i += 4) {
            float f = 0;
            std::memcpy(&f, data + i, 4);
            const uint16_t h = to_half(f);
            if (as_half) {
                out_data.append(reinterpret_cast<const char*>(&h), 2);
            } else {
                const float back = from_half(h);
                out_data.append(reinterpret_cast<const char*>(&back), 4);
            }
        }
        out_header[name] = {{"dtype", as_half ? "F16" : "F32"},
                            {"shape", info.at("shape")},
                            {"data_offsets", {at, out_data.size()}}};
    }
    std::string text = out_header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t len = text.size();
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << text << out_data;
}

// The weight files of the tiny model, by component.
const std::vector<std::pair<std::string, std::string>> kWeights = {{"text_encoder", "model"},
                                                                   {"text_encoder_2", "model"},
                                                                   {"transformer", "diffusion_pytorch_model"},
                                                                   {"vae", "diffusion_pytorch_model"}};

// A snapshot of `model` at `commit` in the cache repo `repo`: blobs, and relative symlinks to them.
void add_snapshot(const std::string& repo, const std::string& commit, const std::string& model) {
    fs::create_directories(repo + "/blobs");
    for (const auto& entry : fs::recursive_directory_iterator(model)) {
        if (!entry.is_regular_file()) continue;
        const std::string rel = fs::relative(entry.path(), model).string();
        std::string blob = commit.substr(0, 8) + "_" + rel;
        std::replace(blob.begin(), blob.end(), '/', '_');
        fs::copy_file(entry.path(), repo + "/blobs/" + blob);
        const fs::path link = fs::path(repo) / "snapshots" / commit / rel;
        fs::create_directories(link.parent_path());
        std::string up;
        for (auto depth = std::count(rel.begin(), rel.end(), '/') + 2; depth > 0; --depth) up += "../";
        fs::create_symlink(up + "blobs/" + blob, link);
    }
}

}  // namespace

TEST_CASE("a model from a Hugging Face cache snapshot makes the same images as its folder") {
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.txt";
    std::ofstream(prompts) << "a red circle\na blue square\n";
    const std::string cache = dir + "/hub", repo = cache + "/models--org--tiny";
    const std::string main_commit(40, 'a'), v2_commit(40, 'b');
    add_snapshot(repo, main_commit, DP_TINY_MODEL);
    add_snapshot(repo, v2_commit, DP_TINY_MODEL);
    fs::create_directories(repo + "/refs");
    std::ofstream(repo + "/refs/main") << main_commit;
    std::ofstream(repo + "/refs/v2") << v2_commit;

    REQUIRE(run_launch(job_args(DP_TINY_MODEL, dir + "/plain", {"-n", "2", prompts}), {}, 120).exit_code ==
            0);
    const LaunchResult r = run_launch(job_args("org/tiny", dir + "/hub_out", {"-n", "2", prompts}),
                                      {{"HF_HUB_CACHE", cache}}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto plain = read_manifest(dir + "/plain"), hub = read_manifest(dir + "/hub_out");
    REQUIRE(hub.size() == 2);
    for (std::size_t i = 0; i < hub.size(); ++i) {
        CHECK(hub[i].at("status") == "ok");
        CHECK(png(dir + "/hub_out", hub[i]) == png(dir + "/plain", plain[i]));
        // The ranks were given the snapshot's real folder, which names the commit.
        CHECK(hub[i].at("model") == fs::canonical(repo + "/snapshots/" + main_commit).string());
    }
    // Another revision is another model for --resume; its own run makes the same images.
    const LaunchResult other =
        run_launch(job_args("org/tiny", dir + "/hub_out", {"--revision", "v2", "--resume", prompts}),
                   {{"HF_HUB_CACHE", cache}}, 120);
    CHECK(other.exit_code == 2);
    CHECK_MESSAGE(
        other.err.find("model '" + fs::canonical(repo + "/snapshots/" + main_commit).string() + "' (now '" +
                       fs::canonical(repo + "/snapshots/" + v2_commit).string() + "')") != std::string::npos,
        other.err);
    // Not in the cache: 66 before anything starts, naming where it looked and how to fetch it.
    const LaunchResult missing =
        run_launch(job_args("org/absent", dir + "/none", {prompts}), {{"HF_HUB_CACHE", cache}}, 60);
    CHECK(missing.exit_code == 66);
    CHECK(missing.err.find("no models--org--absent in the Hugging Face cache " + cache) != std::string::npos);
    CHECK(missing.err.find("huggingface-cli download org/absent") != std::string::npos);
    CHECK_FALSE(file_exists(dir + "/none"));
}

TEST_CASE(
    "an fp16 weight variant in an fp32 run: converted on load, the images of fp16-rounded fp32 weights") {
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.txt";
    std::ofstream(prompts) << "a red circle\na green triangle\n";
    // rounded/: plain F32 files holding fp16-rounded values; both/: the original F32 files beside an
    // fp16 variant of the same rounded values, stored as F16.
    const std::string rounded = dir + "/rounded", both = dir + "/both";
    fs::copy(DP_TINY_MODEL, rounded, fs::copy_options::recursive);
    fs::copy(DP_TINY_MODEL, both, fs::copy_options::recursive);
    for (const auto& [component, name] : kWeights) {
        const std::string file = std::string(DP_TINY_MODEL) + "/" + component + "/" + name + ".safetensors";
        round_through_half(file, rounded + "/" + component + "/" + name + ".safetensors", false);
        round_through_half(file, both + "/" + component + "/" + name + ".fp16.safetensors", true);
    }
    const std::map<std::string, std::string> latents = {{"DP_SAVE_LATENTS", "1"}};
    REQUIRE(run_launch(job_args(rounded, dir + "/a", {"--dtype", "fp32", prompts}), latents, 120).exit_code ==
            0);
    const LaunchResult v = run_launch(
        job_args(both, dir + "/b", {"--dtype", "fp32", "--variant", "fp16", prompts}), latents, 120);
    REQUIRE_MESSAGE(v.exit_code == 0, v.err);
    REQUIRE(run_launch(job_args(both, dir + "/c", {"--dtype", "fp32", prompts}), latents, 120).exit_code ==
            0);
    const auto a = read_manifest(dir + "/a"), b = read_manifest(dir + "/b"), c = read_manifest(dir + "/c");
    REQUIRE(b.size() == 2);
    const auto latents_of = [](const std::string& out, const nlohmann::json& r) {
        return read_file(out + "/" + r.at("file").get<std::string>() + ".latents.safetensors");
    };
    for (std::size_t i = 0; i < b.size(); ++i) {
        CHECK(b[i].at("variant") == "fp16");
        CHECK(png(dir + "/b", b[i]) == png(dir + "/a", a[i]));
        CHECK(latents_of(dir + "/b", b[i]) == latents_of(dir + "/a", a[i]));  // bit for bit
        // Without --variant the plain files are read: the original weights, other latents.
        CHECK_FALSE(c[i].contains("variant"));
        CHECK(latents_of(dir + "/c", c[i]) != latents_of(dir + "/a", a[i]));
    }

    // Only the variant's files: refused before any rank starts, naming the variant and the flag.
    for (const auto& [component, name] : kWeights)
        fs::remove(both + "/" + component + "/" + name + ".safetensors");
    const LaunchResult refused = run_launch(job_args(both, dir + "/d", {prompts}), {}, 60);
    CHECK(refused.exit_code == 65);
    CHECK_MESSAGE(
        refused.err.find("only variant weights (fp16, e.g. NAME.fp16.safetensors), no plain ones; pass "
                         "--variant fp16") != std::string::npos,
        refused.err);
    CHECK_FALSE(file_exists(dir + "/d"));
}

TEST_CASE(
    "--dtype auto on the CPU is fp32 for a narrow model: the manifest says so and the images are fp32's") {
    // Note [bf16 on a CPU that has it]: the tiny model is 32 wide, under the 512 where bf16 starts.
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.txt";
    std::ofstream(prompts) << "a red circle\n";
    const std::vector<std::string> auto_args = {"--model", DP_TINY_MODEL, "--steps",  "2",
                                                "--width", "16",          "--height", "16",
                                                "-o",      dir + "/auto", "-q",       prompts};
    REQUIRE(run_launch(auto_args, {{"CUDA_VISIBLE_DEVICES", ""}}, 120).exit_code == 0);
    REQUIRE(
        run_launch(job_args(DP_TINY_MODEL, dir + "/fp32", {"--dtype", "fp32", prompts}), {}, 120).exit_code ==
        0);
    const auto a = read_manifest(dir + "/auto"), f = read_manifest(dir + "/fp32");
    REQUIRE(a.size() == 1);
    CHECK(a[0].at("dtype") == "fp32");
    CHECK(png(dir + "/auto", a[0]) == png(dir + "/fp32", f[0]));
}

TEST_CASE("the new per-prompt settings reach the ranks, and prompts that differ in them are never batched") {
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.jsonl";
    // The same prompt and seed four times: only the new settings differ. With 2 steps, skip-layer
    // guidance runs at step 1 between start 0 and stop 1 (diffusers: i > start * n and i < stop * n).
    std::ofstream(prompts) << R"({"prompt": "a red circle", "seed": 3}
{"prompt": "a red circle", "seed": 3, "max_sequence_length": 77}
{"prompt": "a red circle", "seed": 3, "skip_guidance_layers": [0], "skip_layer_guidance_start": 0, "skip_layer_guidance_stop": 1}
{"prompt": "a red circle", "seed": 3}
)";
    const LaunchResult batched =
        run_launch(job_args(DP_TINY_MODEL, dir + "/batched", {"--batch-size", "4", prompts}), {}, 180);
    REQUIRE_MESSAGE(batched.exit_code == 0, batched.err);
    const LaunchResult single = run_launch(job_args(DP_TINY_MODEL, dir + "/single", {prompts}), {}, 180);
    REQUIRE_MESSAGE(single.exit_code == 0, single.err);
    const auto b = read_manifest(dir + "/batched"), s = read_manifest(dir + "/single");
    REQUIRE(b.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
        CAPTURE(i);
        CHECK(b[i].at("status") == "ok");
        CHECK(png(dir + "/batched", b[i]) == png(dir + "/single", s[i]));
    }
    CHECK(b[1].at("max_sequence_length") == 77);
    CHECK(b[2].at("skip_guidance_layers") == nlohmann::json::array({0}));
    // Each setting changes the pixels; the first and last prompts are the same.
    CHECK(png(dir + "/single", s[0]) != png(dir + "/single", s[1]));
    CHECK(png(dir + "/single", s[0]) != png(dir + "/single", s[2]));
    CHECK(png(dir + "/single", s[0]) == png(dir + "/single", s[3]));
}

TEST_SUITE_END();
