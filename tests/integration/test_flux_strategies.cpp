// FLUX.1 through real dp-launch and dp-worker processes over Gloo, on the tiny folders saved by
// diffusers (models/tiny-random-flux-dev, models/tiny-random-flux-schnell): the PNGs and final
// latents equal FluxPipeline's for the golden cases given as JSONL lines, every strategy gives the
// single-process images, the bytes each strategy sends are the closed-form ones, and what FLUX does
// not take is refused before anything starts.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"

using namespace dp::test;

namespace {

std::string tiny(const std::string& variant) {
    return std::string(DP_MODELS_DIR) + "/tiny-random-flux-" + variant;
}
std::string golden_file() { return std::string(DP_GOLDEN_DIR) + "/flux_pipeline.safetensors"; }

nlohmann::json golden_cases() {
    return nlohmann::json::parse(read_safetensors_metadata(golden_file(), "cases"));
}

// One JSONL line per prompt of golden case `c`, by diffusers' argument names.
std::vector<nlohmann::json> lines_of(const nlohmann::json& c) {
    std::vector<nlohmann::json> out;
    for (std::size_t k = 0; k < c.at("prompts").size(); ++k) {
        nlohmann::json line = {{"prompt", c.at("prompts")[k]},
                               {"seed", c.at("seeds")[k]},
                               {"guidance_scale", c.at("guidance_scale")},
                               {"true_cfg_scale", c.at("true_cfg_scale")},
                               {"width", c.at("width")},
                               {"height", c.at("height")},
                               {"num_inference_steps", c.at("steps")},
                               {"max_sequence_length", c.at("max_sequence_length")},
                               {"name", c.at("name").get<std::string>() + "." + std::to_string(k)}};
        if (!c.at("negative_prompt").is_null()) line["negative_prompt"] = c.at("negative_prompt");
        out.push_back(line);
    }
    return out;
}

std::string write_lines(const std::string& path, const std::vector<nlohmann::json>& lines) {
    std::ofstream out(path, std::ios::binary);
    for (const nlohmann::json& line : lines) out << line.dump() << "\n";
    return path;
}

// The bytes per collective kind rank `rank` reported (DP_COMM_REPORT=1).
std::map<std::string, long long> reported_bytes(const std::string& err, int rank) {
    const std::string marker = "dp-worker: rank " + std::to_string(rank) + " communication bytes:";
    std::map<std::string, long long> out;
    const std::size_t at = err.find(marker);
    if (at == std::string::npos) return out;
    std::istringstream in(err.substr(at + marker.size(), err.find('\n', at) - at - marker.size()));
    for (std::string item; in >> item;)
        out[item.substr(0, item.find('='))] = std::stoll(item.substr(item.find('=') + 1));
    return out;
}

// Two prompts at 80 x 48 pixels (5 x 3 = 15 image tokens) with T5 cut to 13 tokens: neither stream
// divides 2, 3 or 4. The second runs true CFG (a negative prompt, true_cfg_scale above 1); the
// first has none, under --cfg-parallel too.
const char* kPrompts =
    "{\"prompt\": \"an owl on a branch\", \"seed\": 1, \"guidance_scale\": 4.0}\n"
    "{\"prompt\": \"a wooden door\", \"negative_prompt\": \"low quality\", \"true_cfg_scale\": 2.5, "
    "\"seed\": 2}\n";

std::vector<std::string> args_for(const std::string& out, const std::vector<std::string>& extra,
                                  const std::string& prompts) {
    std::vector<std::string> a = {
        "--model", tiny("dev"), "--steps", "2", "--width", "80", "--height", "48", "--max-sequence-length",
        "13",      "-o",        out,       "-q"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(prompts);
    return a;
}

}  // namespace

TEST_CASE(
    "flux: dp-launch -n 1 on the folders saved by diffusers gives FluxPipeline's images, dev and schnell") {
    const nlohmann::json cases = golden_cases();
    for (const char* variant : {"dev", "schnell"}) {
        CAPTURE(variant);
        std::vector<nlohmann::json> lines;
        for (const auto& [name, c] : cases.items())
            if (name != "bf16" && c.at("variant") == variant)
                for (const nlohmann::json& line : lines_of(c)) lines.push_back(line);
        REQUIRE(!lines.empty());
        const std::string dir = make_temp_dir();
        LaunchResult r = run_launch({"--model", tiny(variant), "-n", "1", "-o", dir + "/out", "-q",
                                     write_lines(dir + "/p.jsonl", lines)},
                                    {{"DP_SAVE_LATENTS", "1"}}, 180);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto records = read_manifest(dir + "/out");
        REQUIRE(records.size() == lines.size());
        for (const auto& record : records) {
            const nlohmann::json& line = lines.at(record.at("index").get<std::size_t>());
            const std::string name = line.at("name");
            CAPTURE(name);
            CHECK(record.at("status") == "ok");
            CHECK(record.at("steps") == line.at("num_inference_steps"));
            CHECK(record.at("max_sequence_length") == line.at("max_sequence_length"));
            CHECK(record.at("true_cfg_scale").get<double>() == line.at("true_cfg_scale").get<double>());
            // schnell has no guidance embedding: its guidance_scale changes nothing and is not recorded.
            CHECK(record.contains("guidance_scale") == (std::string(variant) == "dev"));
            for (const char* other : {"skip_guidance_layers", "no_t5"}) CHECK_FALSE(record.contains(other));
            const std::string file = dir + "/out/" + record.at("file").get<std::string>();
            const PixelDifference d = png_against_golden(file, golden_file(), name + ".image");
            MESSAGE("FLUX " << variant << " case " << name << " through dp-launch: max |uint8 diff| "
                            << d.max);
            CHECK(d.within_one >= 0.999);
            CHECK(max_difference(read_latents(file + ".latents.safetensors"),
                                 golden_f32(golden_file(), name + ".latents")) <= 1e-4f);
        }
        remove_dir(dir);
    }
}

TEST_CASE("flux: --dtype bf16 through dp-launch is within the unit test's tolerance of diffusers' bf16") {
    // The bounds of tests/unit/test_flux_pipeline.cpp.
    constexpr double kBf16MeanUint8 = 1.0;
    constexpr int kBf16MaxUint8 = 12;
    const nlohmann::json c = golden_cases().at("bf16");
    const std::string dir = make_temp_dir();
    LaunchResult r = run_launch({"--model", tiny("dev"), "-n", "1", "--dtype", "bf16", "-o", dir + "/out",
                                 "-q", write_lines(dir + "/p.jsonl", lines_of(c))},
                                {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 1);
    CHECK(records[0].at("dtype") == "bf16");
    const PixelDifference d = png_against_golden(dir + "/out/" + records[0].at("file").get<std::string>(),
                                                 golden_file(), "bf16.0.image");
    MESSAGE("FLUX.1-dev bf16 through dp-launch: mean |uint8 diff| " << d.mean << ", max " << d.max);
    CHECK(d.mean <= kBf16MeanUint8);
    CHECK(d.max <= kBf16MaxUint8);
    remove_dir(dir);
}

TEST_CASE(
    "flux: ulysses2, ring2, ring3, usp, tp2, tp2 x ulysses2, tp2 x ring2, cfg2, device_map, offload and "
    "context "
    "give the single-process images") {
    // device_map auto at these budgets puts the embeddings and the two double blocks on cpu:0 and
    // the two single blocks on cpu:1.
    const std::string budgets = "cpu:0=1500KiB,cpu:1=2MiB";
    LaunchResult plan = run_launch(
        {"plan", "--model", tiny("dev"), "-n", "1", "--device-map", "auto", "--max-memory", budgets}, {}, 30);
    REQUIRE_MESSAGE(plan.exit_code == 0, plan.err);
    CHECK(plan.out.find("transformer blocks 0-1 (with its embeddings and output head): cpu:0") !=
          std::string::npos);
    CHECK(plan.out.find("transformer blocks 2-3: cpu:1") != std::string::npos);

    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.jsonl";
    std::ofstream(prompts, std::ios::binary) << kPrompts;
    const std::map<std::string, std::string> env = {{"DP_SAVE_LATENTS", "1"}};
    LaunchResult one = run_launch(args_for(dir + "/single", {"-n", "1"}, prompts), env, 120);
    REQUIRE_MESSAGE(one.exit_code == 0, one.err);
    const auto single = read_manifest(dir + "/single");
    REQUIRE(single.size() == 2);
    CHECK(single[0].at("negative_prompt").is_null());
    CHECK(single[1].at("true_cfg_scale").get<double>() == 2.5);
    const std::vector<std::vector<std::string>> runs = {
        {"-n", "2", "--ulysses", "2"},
        {"-n", "2", "--ring", "2"},
        {"-n", "3", "--ring", "3"},
        {"-n", "4", "--ulysses", "2", "--ring", "2"},
        {"-n", "2", "--tp", "2"},
        {"-n", "4", "--tp", "2", "--ulysses", "2"},
        {"-n", "4", "--tp", "2", "--ring", "2"},
        {"-n", "2", "--cfg-parallel", "--true-cfg-scale", "2.5"},
        {"-n", "1", "--device-map", "auto", "--max-memory", budgets},
        {"-n", "1", "--offload"},
        {"-n", "3", "--strategy", "context"},  // 4 heads: Ring over 3
    };
    for (const auto& extra : runs) {
        CAPTURE(extra);
        LaunchResult r = run_leaving_nothing(args_for(dir + "/run", extra, prompts), env);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto records = read_manifest(dir + "/run");
        REQUIRE(records.size() == single.size());
        for (std::size_t i = 0; i < single.size(); ++i) {
            const std::string file = single[i].at("file").get<std::string>();
            CAPTURE(file);
            CHECK(records[i].at("status") == "ok");
            CHECK(max_pixel_difference(dir + "/single/" + file, dir + "/run/" + file) <= 1);
            CHECK(max_latent_difference(dir + "/single/" + file + ".latents.safetensors",
                                        dir + "/run/" + file + ".latents.safetensors") <= 1e-4f);
        }
        remove_dir(dir + "/run");
    }
    remove_dir(dir);
}

TEST_CASE("flux: measured communication bytes per strategy equal the closed-form ones") {
    // The tiny dev folder: H heads of d, width D = H d, L2 double and L1 single blocks, C = 64
    // features per packed token; 80 x 48 pixels give N = 15 image tokens; T5 pads the text to
    // T = 13 tokens (FLUX has no text mask); one prompt, no true CFG, so a batch of B = 1, S steps.
    const nlohmann::json tc = nlohmann::json::parse(read_file(tiny("dev") + "/transformer/config.json"));
    const nlohmann::json t5 = nlohmann::json::parse(read_file(tiny("dev") + "/text_encoder_2/config.json"));
    const long long H = tc["num_attention_heads"], d = tc["attention_head_dim"], D = H * d;
    const long long L2 = tc["num_layers"], L1 = tc["num_single_layers"], L = L2 + L1, C = tc["in_channels"];
    const long long N = 15, T = 13, B = 1, S = 2, f = 4;
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.txt";
    std::ofstream(prompts, std::ios::binary) << "one prompt\n";
    auto run = [&](const std::vector<std::string>& extra) {
        LaunchResult r = run_launch(args_for(dir + "/out", extra, prompts), {{"DP_COMM_REPORT", "1"}}, 120);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        remove_dir(dir + "/out");
        return reported_bytes(r.err, 0);
    };
    // Ulysses U: both streams split and padded to U (N' = 16, T' = 14 for U = 2); per block q, k,
    // v out and the output back, 4 all-to-alls of B x H x (N' + T') / U x d, less the last block's
    // text output, which nothing needs (B x H x T' / U x d); at the end the image's tokens gathered
    // (B x N' / U x C). Nothing of the text is gathered: it is split throughout.
    const long long U = 2, Np = 16, Tp = 14;
    CHECK(run({"-n", "2", "--ulysses", "2"}) ==
          std::map<std::string, long long>{{"all_to_all", S * B * H * d * (4 * L * (Np + Tp) - Tp) / U * f},
                                           {"all_gather", S * B * (Np / U) * C * f}});
    // Ring R: per block R - 1 sends of this rank's keys and values over the joint sequence.
    const long long R = 2;
    CHECK(run({"-n", "2", "--ring", "2"}) ==
          std::map<std::string, long long>{{"send", S * L * 2 * (R - 1) * B * H * ((Np + Tp) / R) * d * f},
                                           {"all_gather", S * B * (Np / R) * C * f}});
    // TP P: a double block all-reduces after each stream's attention and MLP outputs, a single
    // block once after its one output projection, over text and image (the last one over the image
    // alone: its text feeds nothing); every modulation is gathered (B x 6D / P per double-block
    // stream, B x 3D / P per single block). T5 runs split too: per layer an all-reduce after
    // attention and after the feed-forward (T x d_model), once per prompt.
    const long long P = 2, dm = t5["d_model"], t5_layers = t5["num_layers"];
    const long long transformer_reduce = B * D * ((N + T) * (2 * L2 + L1) - T);
    CHECK(run({"-n", "2", "--tp", "2"}) ==
          std::map<std::string, long long>{
              {"all_reduce", (S * transformer_reduce + 2 * t5_layers * T * dm) * f},
              {"all_gather", S * B * (2 * 6 * D * L2 + 3 * D * L1) / P * f}});
    // plan says the same, for the same job.
    LaunchResult p = run_launch({"plan", "--model", tiny("dev"), "-n", "2", "--tp", "2", "--dtype", "fp32",
                                 "--width", "80", "--height", "48", "--max-sequence-length", "13"},
                                {}, 30);
    REQUIRE_MESSAGE(p.exit_code == 0, p.err);
    CHECK(p.out.find("all_reduce: ") != std::string::npos);
    CHECK(p.out.find("(" + std::to_string(transformer_reduce * f) + ")") != std::string::npos);
    remove_dir(dir);
}

TEST_CASE("flux: what FLUX does not take is refused before anything starts, naming FLUX.1 and why") {
    const std::string dir = make_temp_dir();
    const std::string text = dir + "/p.txt";
    std::ofstream(text, std::ios::binary) << "a red fox\n";
    struct Refused {
        std::string variant;
        std::vector<std::string> flags;
        std::string says;
    };
    for (const Refused& bad : std::vector<Refused>{
             {"dev",
              {"-n", "2", "--cfg-parallel"},
              "FLUX.1's negative branch runs only with --true-cfg-scale above 1"},
             {"dev", {"--skip-guidance-layers", "1"}, "FLUX.1 does not take skip_guidance_layers"},
             {"dev", {"--no-t5"}, "--no-t5: FLUX.1's transformer takes T5's embeddings"},
             {"dev",
              {"--max-sequence-length", "513"},
              "513 is more than FLUX.1's pipeline accepts (1 to 512)"},
             {"schnell",
              {"--skip-layer-guidance-scale", "2"},
              "FLUX.1-schnell does not take skip_layer_guidance_scale"},
             {"dev", {"--width", "40"}, "multiples of 16"},
         }) {
        CAPTURE(bad.flags);
        std::vector<std::string> args = {"--model", tiny(bad.variant), "-o", dir + "/out", "-q"};
        args.insert(args.end(), bad.flags.begin(), bad.flags.end());
        args.push_back(text);
        LaunchResult r = run_launch(args, {}, 30);
        CHECK(r.exit_code == 2);
        CHECK_MESSAGE(r.err.find(bad.says) != std::string::npos, r.err);
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
    }
    const std::string jsonl = dir + "/p.jsonl";
    std::ofstream(jsonl, std::ios::binary)
        << "{\"prompt\": \"a fox\"}\n{\"prompt\": \"a cat\", \"skip_guidance_layers\": [1]}\n";
    LaunchResult r = run_launch({"--model", tiny("dev"), "-o", dir + "/out", "-q", jsonl}, {}, 30);
    CHECK(r.exit_code == 65);
    CHECK_MESSAGE(
        r.err.find("p.jsonl:2: key 'skip_guidance_layers': FLUX.1 does not take skip_guidance_layers") !=
            std::string::npos,
        r.err);
    remove_dir(dir);
}

TEST_CASE(
    "flux: FluxPipeline's defaults, dev's (28 steps, guidance 3.5, 512 tokens) and schnell's (4 steps, "
    "256)") {
    const std::string dir = make_temp_dir();
    const std::string text = dir + "/p.txt";
    std::ofstream(text, std::ios::binary) << "a red fox\n";
    for (const char* variant : {"dev", "schnell"}) {
        CAPTURE(variant);
        const bool dev = std::string(variant) == "dev";
        LaunchResult r = run_launch({"--model", tiny(variant), "--width", "16", "--height", "16", "-o",
                                     dir + "/" + variant, "-q", text},
                                    {}, 180);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto records = read_manifest(dir + "/" + variant);
        REQUIRE(records.size() == 1);
        CHECK(records[0].at("status") == "ok");
        CHECK(records[0].at("steps") == (dev ? 28 : 4));
        CHECK(records[0].at("max_sequence_length") == (dev ? 512 : 256));
        CHECK(records[0].at("true_cfg_scale").get<double>() == 1.0);
        CHECK(records[0].at("negative_prompt").is_null());
        CHECK(records[0].contains("guidance_scale") == dev);
        if (dev) CHECK(records[0].at("guidance_scale").get<double>() == 3.5);
    }
    remove_dir(dir);
}

TEST_CASE("flux: schnell under ulysses2, tp2 x ring2 and device_map gives the single-process images") {
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.txt";
    std::ofstream(prompts, std::ios::binary) << "a red fox in the snow\nthree green dots\n";
    auto args = [&](const std::string& out, const std::vector<std::string>& extra) {
        std::vector<std::string> a = {
            "--model", tiny("schnell"), "--width", "80", "--height", "48", "-o", out, "-q"};
        a.insert(a.end(), extra.begin(), extra.end());
        a.push_back(prompts);
        return a;
    };
    const std::map<std::string, std::string> env = {{"DP_SAVE_LATENTS", "1"}};
    LaunchResult one = run_launch(args(dir + "/single", {"-n", "1"}), env, 120);
    REQUIRE_MESSAGE(one.exit_code == 0, one.err);
    const auto single = read_manifest(dir + "/single");
    REQUIRE(single.size() == 2);
    CHECK(single[0].at("steps") == 4);  // schnell's default
    for (const auto& extra : std::vector<std::vector<std::string>>{
             {"-n", "2", "--ulysses", "2"},
             {"-n", "4", "--tp", "2", "--ring", "2"},
             {"-n", "1", "--device-map", "auto", "--max-memory", "cpu:0=1500KiB,cpu:1=2MiB"}}) {
        CAPTURE(extra);
        LaunchResult r = run_leaving_nothing(args(dir + "/run", extra), env);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto records = read_manifest(dir + "/run");
        REQUIRE(records.size() == single.size());
        for (std::size_t i = 0; i < single.size(); ++i) {
            const std::string file = single[i].at("file").get<std::string>();
            CHECK(max_pixel_difference(dir + "/single/" + file, dir + "/run/" + file) <= 1);
            CHECK(max_latent_difference(dir + "/single/" + file + ".latents.safetensors",
                                        dir + "/run/" + file + ".latents.safetensors") <= 1e-4f);
        }
        remove_dir(dir + "/run");
    }
    remove_dir(dir);
}
