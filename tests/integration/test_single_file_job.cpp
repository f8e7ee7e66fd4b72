// Single component files through real dp-launch and dp-worker processes: --transformer FILE with a
// FLUX.1 transformer in Black Forest Labs' layout (scripts/golden/golden_single_file.py) and the rest
// from the tiny FLUX.1-dev folder gives diffusers' from_single_file image, over two data-parallel
// ranks and under --ulysses 2; the manifest names the file with its SHA-256 and format, and --resume
// sees another file as other pixels; a missing, truncated or incomplete file, or one of another
// family, is refused before anything starts, naming the file.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

using namespace dp::test;

namespace {

std::string tiny_flux() { return std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev"; }
std::string golden_file() { return std::string(DP_GOLDEN_DIR) + "/single_file_pipeline.safetensors"; }
std::string checkpoint(const std::string& name) {
    return std::string(DP_GOLDEN_DIR) + "/single_file/" + name;
}
nlohmann::json golden_cases() {
    return nlohmann::json::parse(read_safetensors_metadata(golden_file(), "cases"));
}

// `copies` JSONL lines of a golden case's call (its negative prompt too, when it has one).
std::string prompt_file(const std::string& path, int copies,
                        const nlohmann::json& c = golden_cases().at("bfl_bf16")) {
    return write_lines(path, std::vector<nlohmann::json>(static_cast<std::size_t>(copies), golden_line(c)));
}

// dp-launch with `args`, then -o `out` -q `prompts`, saving latents: it exits 0, and its manifest's
// two records, both ok.
std::vector<nlohmann::json> two_ok_records(std::vector<std::string> args, const std::string& out,
                                           const std::string& prompts) {
    args.insert(args.end(), {"-o", out, "-q", prompts});
    LaunchResult r = run_launch(args, {{"DP_SAVE_LATENTS", "1"}}, 240);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::vector<nlohmann::json> records = read_manifest(out);
    REQUIRE(records.size() == 2);
    for (const nlohmann::json& record : records) REQUIRE(record.at("status") == "ok");
    return records;
}

}  // namespace

TEST_CASE(
    "single file: --transformer FILE gives diffusers' from_single_file image, recorded with its SHA-256") {
    const std::string dir = make_temp_dir();
    const std::string prompts = prompt_file(dir + "/p.jsonl", 2);
    for (const std::vector<std::string>& strategy :
         {std::vector<std::string>{"-n", "2"}, std::vector<std::string>{"-n", "2", "--ulysses", "2"}}) {
        for (const char* name : {"bfl_bf16", "bfl_fp8"}) {
            CAPTURE(name);
            CAPTURE(strategy.size());
            const std::string out = dir + "/out_" + name + std::to_string(strategy.size());
            std::vector<std::string> args = strategy;
            args.insert(args.end(), {"--model", tiny_flux(), "--transformer",
                                     checkpoint(std::string("flux_") + name + ".safetensors")});
            for (const auto& record : two_ok_records(args, out, prompts)) {
                const nlohmann::json& t = record.at("components").at("transformer");
                CHECK(t.at("path").get<std::string>().find(std::string("flux_") + name) != std::string::npos);
                CHECK(t.at("sha256").get<std::string>().size() == 64);
                CHECK(t.at("format") == (std::string(name) == "bfl_bf16" ? "bf16" : "fp8 (e4m3)"));
                const std::string file = out + "/" + record.at("file").get<std::string>();
                CHECK(png_against_golden(file, golden_file(), std::string(name) + ".image").within_one >=
                      0.999);
                CHECK(max_difference(read_latents(file + ".latents.safetensors"),
                                     golden_f32(golden_file(), std::string(name) + ".latents")) <= 1e-4f);
            }
        }
    }
    // --resume with another file: other pixels, refused with what differs.
    LaunchResult again = run_launch(
        {"--model", tiny_flux(), "-n", "1", "--transformer", checkpoint("flux_bfl_fp8.safetensors"), "-o",
         dir + "/out_bfl_bf162", "--resume", "-q", prompts},
        {}, 120);
    CHECK(again.exit_code == 2);
    CHECK_MESSAGE(again.err.find("components") != std::string::npos, again.err);
    remove_dir(dir);
}

TEST_CASE("single file: a missing, truncated, incomplete or foreign file is refused before anything starts") {
    const std::string dir = make_temp_dir();
    const std::string prompts = prompt_file(dir + "/p.jsonl", 1);
    const auto refused = [&](const std::vector<std::string>& flags, int code, const std::string& says) {
        std::vector<std::string> args = {"--model", tiny_flux(),  "-n", "1",
                                         "-o",      dir + "/out", "-q", prompts};
        args.insert(args.begin(), flags.begin(), flags.end());
        LaunchResult r = run_launch(args, {}, 60);
        CHECK_MESSAGE(r.exit_code == code, r.err);
        CHECK_MESSAGE(r.err.find(says) != std::string::npos, r.err);
        CHECK_FALSE(file_exists(dir + "/out"));  // nothing half-made
    };
    refused({"--transformer", dir + "/nowhere.safetensors"}, 66, "nowhere.safetensors");
    const std::string bytes = read_file(checkpoint("flux_bfl_bf16.safetensors"));
    std::ofstream(dir + "/cut.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    refused({"--transformer", dir + "/cut.safetensors"}, 65, "cut.safetensors");
    // The file without its last single block: named in the file's own names.
    {
        const uint64_t n = [&] {
            uint64_t v = 0;
            for (int i = 7; i >= 0; --i)
                v = (v << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
            return v;
        }();
        nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
        std::string last;
        for (auto it = header.begin(); it != header.end(); ++it)
            if (it.key().rfind("single_blocks.", 0) == 0)
                last = it.key().substr(0, it.key().find('.', 14) + 1);
        REQUIRE_FALSE(last.empty());
        for (auto it = header.begin(); it != header.end();)
            it = it.key().rfind(last, 0) == 0 ? header.erase(it) : std::next(it);
        const std::string h = header.dump();
        std::string out(8, '\0');
        for (int i = 0; i < 8; ++i)
            out[static_cast<std::size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
        std::ofstream(dir + "/missing_block.safetensors", std::ios::binary)
            << out << h << bytes.substr(8 + n);
        refused({"--transformer", dir + "/missing_block.safetensors"}, 65, last.substr(0, last.size() - 1));
    }
    refused({"--transformer", std::string(DP_GOLDEN_DIR) + "/lora/sd3_attention.safetensors"}, 65,
            "sd3_attention.safetensors");
    refused({"--text-encoder-3", checkpoint("flux_bfl_bf16.safetensors")}, 2, "no text_encoder_3");
    refused({"--transformer", checkpoint("flux_bfl_bf16.safetensors"), "--random-weights", "1"}, 2,
            "--random-weights");
    remove_dir(dir);
}

TEST_CASE(
    "single file: GGUF and --model FILE --config FOLDER give the images, Q4_K under --tp 2 the "
    "single-process one") {
    const std::string dir = make_temp_dir();
    const std::string prompts = prompt_file(dir + "/p.jsonl", 2);
    const std::string gguf_golden = std::string(DP_GOLDEN_DIR) + "/gguf_pipeline.safetensors";
    const std::string gguf = std::string(DP_GOLDEN_DIR) + "/gguf/flux_q4_k.gguf";
    struct Case {
        std::vector<std::string> args;
        std::string golden, name, format;
    };
    const std::vector<Case> cases = {
        {{"--model", tiny_flux(), "--transformer", gguf, "-n", "2", "--tp", "2"},
         gguf_golden,
         "q4_k_exact",
         "GGUF Q4_K"},
        {{"--model", gguf, "--config", tiny_flux(), "-n", "1"}, gguf_golden, "q4_k_exact", "GGUF Q4_K"},
        {{"--model", checkpoint("flux_bfl_bf16.safetensors"), "--config", tiny_flux(), "-n", "2"},
         golden_file(),
         "bfl_bf16",
         "bf16"},
    };
    int k = 0;
    for (const Case& c : cases) {
        CAPTURE(c.name);
        CAPTURE(c.args[0] + " " + c.args[1]);
        const std::string out = dir + "/out" + std::to_string(k++);
        for (const auto& record : two_ok_records(c.args, out, prompts)) {
            CHECK(record.at("components")
                      .at("transformer")
                      .at("format")
                      .get<std::string>()
                      .rfind(c.format, 0) == 0);
            const std::string file = out + "/" + record.at("file").get<std::string>();
            CHECK(max_difference(read_latents(file + ".latents.safetensors"),
                                 golden_f32(c.golden, c.name + ".latents")) <= 1e-4f);
        }
    }
    // A folder whose transformer has its config alone: the file gives every weight.
    {
        const std::string folder = dir + "/configs";
        ::mkdir(folder.c_str(), 0755);
        for (const char* e : {"model_index.json", "scheduler", "text_encoder", "text_encoder_2", "tokenizer",
                              "tokenizer_2", "vae"})
            CHECK(::symlink((tiny_flux() + "/" + e).c_str(), (folder + "/" + e).c_str()) == 0);
        ::mkdir((folder + "/transformer").c_str(), 0755);
        CHECK(::symlink((tiny_flux() + "/transformer/config.json").c_str(),
                        (folder + "/transformer/config.json").c_str()) == 0);
        LaunchResult r =
            run_launch({"--model", folder, "--transformer", checkpoint("flux_bfl_bf16.safetensors"), "-o",
                        dir + "/out_configs", "-q", prompts},
                       {{"DP_SAVE_LATENTS", "1"}}, 240);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        for (const auto& record : read_manifest(dir + "/out_configs"))
            CHECK(max_difference(read_latents(dir + "/out_configs/" + record.at("file").get<std::string>() +
                                              ".latents.safetensors"),
                                 golden_f32(golden_file(), "bfl_bf16.latents")) <= 1e-4f);
    }
    // A truncated GGUF file: refused before anything starts, naming it.
    const std::string bytes = read_file(gguf);
    std::ofstream(dir + "/cut.gguf", std::ios::binary) << bytes.substr(0, bytes.size() - 1000);
    LaunchResult cut = run_launch(
        {"--model", tiny_flux(), "--transformer", dir + "/cut.gguf", "-o", dir + "/none", "-q", prompts}, {},
        60);
    CHECK(cut.exit_code == 65);
    CHECK_MESSAGE(cut.err.find("cut.gguf") != std::string::npos, cut.err);
    CHECK_MESSAGE(cut.err.find("truncated") != std::string::npos, cut.err);
    CHECK_FALSE(file_exists(dir + "/none"));
    // --model FILE alone takes the shipped config-only folder of its model, whose other components
    // have no weights: refused, naming them.
    LaunchResult alone = run_launch(
        {"--model", checkpoint("flux_bfl_bf16.safetensors"), "-o", dir + "/none", "-q", prompts}, {}, 60);
    CHECK(alone.exit_code == 2);
    CHECK_MESSAGE(alone.err.find("configs only") != std::string::npos, alone.err);
    CHECK_MESSAGE(alone.err.find("text_encoder") != std::string::npos, alone.err);
    CHECK_FALSE(file_exists(dir + "/none"));
    remove_dir(dir);
}

TEST_CASE(
    "single file: a whole SD3.5 pipeline in Stability AI's file gives diffusers' image, GGUF kept quantized "
    "the same pixels") {
    const std::string dir = make_temp_dir();
    const std::string golden = std::string(DP_GOLDEN_DIR) + "/sd3_single_file_pipeline.safetensors";
    const nlohmann::json c =
        nlohmann::json::parse(read_safetensors_metadata(golden, "cases")).at("stability_all");
    const std::string prompts = prompt_file(dir + "/p.jsonl", 1, c);
    const std::string file = std::string(DP_GOLDEN_DIR) + "/../../../" + c.at("file").get<std::string>();
    const std::string folder = std::string(DP_GOLDEN_DIR) + "/sd35_medium_tiny";
    LaunchResult r = run_launch({"--model", file, "--config", folder, "-o", dir + "/out", "-q", prompts},
                                {{"DP_SAVE_LATENTS", "1"}}, 240);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 1);
    const nlohmann::json& components = records[0].at("components");
    for (const char* component : {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"}) {
        CAPTURE(component);
        REQUIRE(components.contains(component));
        CHECK(components.at(component).at("sha256") == components.at("transformer").at("sha256"));
    }
    const std::string png = dir + "/out/" + records[0].at("file").get<std::string>();
    CHECK(max_difference(read_latents(png + ".latents.safetensors"),
                         golden_f32(golden, "stability_all.latents")) <= 1e-4f);
    // The transformer alone, with the shipped SD3.5-medium configs its names point to: the tiny
    // file's shapes are refused, named as --model's.
    LaunchResult shipped = run_launch(
        {"plan", "--model", std::string(DP_GOLDEN_DIR) + "/sd3_single_file/sd35m_stability.safetensors"}, {},
        60);
    CHECK(shipped.exit_code == 65);
    CHECK_MESSAGE(shipped.err.find("--model ") != std::string::npos, shipped.err);
    CHECK_MESSAGE(shipped.err.find("context_embedder") != std::string::npos, shipped.err);
    // --keep-quantized: a GGUF file's blocks dequantized per use, the same pixels; plan says so.
    const std::string gguf = std::string(DP_GOLDEN_DIR) + "/gguf/flux_q4_k.gguf";
    const std::string flux_prompts = prompt_file(dir + "/f.jsonl", 2);
    LaunchResult kept = run_launch({"--model", tiny_flux(), "--transformer", gguf, "--keep-quantized", "-n",
                                    "2", "--tp", "2", "-o", dir + "/kept", "-q", flux_prompts},
                                   {{"DP_SAVE_LATENTS", "1"}}, 240);
    REQUIRE_MESSAGE(kept.exit_code == 0, kept.err);
    const std::string gguf_golden = std::string(DP_GOLDEN_DIR) + "/gguf_pipeline.safetensors";
    for (const auto& record : read_manifest(dir + "/kept"))
        CHECK(max_difference(read_latents(dir + "/kept/" + record.at("file").get<std::string>() +
                                          ".latents.safetensors"),
                             golden_f32(gguf_golden, "q4_k_exact.latents")) <= 1e-4f);
    LaunchResult plan =
        run_launch({"plan", "--model", tiny_flux(), "--transformer", gguf, "--keep-quantized"}, {}, 60);
    CHECK_MESSAGE(plan.exit_code == 0, plan.err);
    CHECK_MESSAGE(plan.out.find("GGUF weights kept quantized") != std::string::npos, plan.out);
    LaunchResult dense = run_launch({"plan", "--model", tiny_flux(), "--transformer", gguf}, {}, 60);
    CHECK_MESSAGE(dense.out.find("dequantized to fp32 at load") != std::string::npos, dense.out);
    // Without a GGUF file the flag means nothing: a usage error, nothing made.
    LaunchResult none = run_launch(
        {"--model", tiny_flux(), "--keep-quantized", "-o", dir + "/none", "-q", flux_prompts}, {}, 60);
    CHECK(none.exit_code == 2);
    CHECK_MESSAGE(none.err.find("--keep-quantized") != std::string::npos, none.err);
    CHECK_FALSE(file_exists(dir + "/none"));
    remove_dir(dir);
}

TEST_SUITE_END();
