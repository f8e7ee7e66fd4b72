// LoRA adapters through real dp-launch and dp-worker processes, on the tiny FLUX.1-dev folder and the
// adapters peft made and diffusers saved (scripts/golden/golden_lora.py): per prompt in one job and
// for the whole job by --lora, with two data-parallel ranks, the images are diffusers'; the manifest
// names each image's adapters with path, sha256 and scale; and a missing, truncated or foreign
// adapter is refused before anything starts, naming the file; an adapter overwritten while the job
// runs is never recorded with the SHA-256 of other bytes than those its images were made from.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "strategies/sha256.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

using namespace dp::test;

namespace {

std::string tiny_flux() { return std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev"; }
std::string golden_file() { return std::string(DP_GOLDEN_DIR) + "/lora_pipeline.safetensors"; }
std::string adapter(const std::string& name) { return std::string(DP_GOLDEN_DIR) + "/lora/" + name; }
nlohmann::json golden_cases() {
    return nlohmann::json::parse(read_safetensors_metadata(golden_file(), "cases"));
}

// A JSONL line for golden case `name`, its adapters under "lora".
nlohmann::json line_of(const std::string& name, bool with_lora = true) {
    const nlohmann::json c = golden_cases().at(name);
    nlohmann::json line = golden_line(c);
    line["name"] = name;
    if (with_lora) {
        line["lora"] = nlohmann::json::array();
        for (const auto& a : c.at("adapters"))
            line["lora"].push_back({{"path", adapter(a.at("file"))}, {"scale", a.at("scale")}});
    }
    return line;
}

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

void check_image(const std::string& out, const nlohmann::json& record, const std::string& golden_name) {
    const std::string file = out + "/" + record.at("file").get<std::string>();
    const PixelDifference d = png_against_golden(file, golden_file(), golden_name + ".image");
    MESSAGE(golden_name << " through dp-launch: max |uint8 diff| " << d.max);
    CHECK(d.within_one >= 0.999);
    CHECK(max_difference(read_latents(file + ".latents.safetensors"),
                         golden_f32(golden_file(), golden_name + ".latents")) <= 1e-4f);
}

}  // namespace

TEST_CASE("lora: adapters per prompt in one job give diffusers' images, and the manifest names them") {
    const std::string dir = make_temp_dir();
    // Alternating sets, and a line without any: the queue groups them, the images stay each prompt's.
    const std::vector<nlohmann::json> lines = {line_of("flux_peft"), line_of("flux_kohya"),
                                               line_of("flux_peft"), [] {
                                                   nlohmann::json l = line_of("flux_peft", false);
                                                   l["name"] = "base";
                                                   return l;
                                               }()};
    LaunchResult r = run_launch(
        {"--model", tiny_flux(), "-n", "1", "-o", dir + "/out", "-q", write_lines(dir + "/p.jsonl", lines)},
        {{"DP_SAVE_LATENTS", "1"}}, 240);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == lines.size());
    for (const auto& record : records) {
        const std::string name = lines.at(record.at("index").get<std::size_t>()).at("name");
        CAPTURE(name);
        REQUIRE(record.at("status") == "ok");
        if (name == "base") {
            CHECK_FALSE(record.contains("lora"));
            CHECK(max_difference(read_latents(dir + "/out/" + record.at("file").get<std::string>() +
                                              ".latents.safetensors"),
                                 golden_f32(golden_file(), "flux_peft.base_latents")) <= 1e-4f);
            continue;
        }
        REQUIRE(record.contains("lora"));
        const nlohmann::json& recorded = record.at("lora");
        REQUIRE(recorded.size() == 1);
        CHECK(recorded[0].at("path").get<std::string>().find(name + ".safetensors") != std::string::npos);
        CHECK(recorded[0].at("sha256").get<std::string>().size() == 64);
        CHECK(recorded[0].at("scale") == golden_cases().at(name).at("adapters")[0].at("scale"));
        check_image(dir + "/out", record, name);
    }
    remove_dir(dir);
}

TEST_CASE("lora: --lora PATH:SCALE for the whole job over two data-parallel ranks gives diffusers' image") {
    const std::string dir = make_temp_dir();
    nlohmann::json a = line_of("flux_peft", false), b = a;
    b["name"] = "second";
    LaunchResult r =
        run_launch({"--model", tiny_flux(), "-n", "2", "--lora", adapter("flux_peft.safetensors") + ":0.8",
                    "-o", dir + "/out", "-q", write_lines(dir + "/p.jsonl", {a, b})},
                   {{"DP_SAVE_LATENTS", "1"}}, 240);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 2);
    for (const auto& record : records) {
        REQUIRE(record.at("status") == "ok");
        CHECK(record.at("lora")[0].at("scale") == 0.8);
        check_image(dir + "/out", record, "flux_peft");
    }
    remove_dir(dir);
}

TEST_CASE(
    "lora: a missing, truncated or foreign adapter is refused before anything starts, naming the file") {
    const std::string dir = make_temp_dir();
    const std::string prompts = write_lines(dir + "/p.jsonl", {line_of("flux_peft", false)});
    const auto refused = [&](const std::string& file, int code, const std::string& says) {
        CAPTURE(file);
        LaunchResult r = run_launch(
            {"--model", tiny_flux(), "-n", "1", "--lora", file, "-o", dir + "/out", "-q", prompts}, {}, 60);
        CHECK(r.exit_code == code);
        CHECK_MESSAGE(r.err.find(file.substr(file.rfind('/') + 1)) != std::string::npos, r.err);
        CHECK_MESSAGE(r.err.find(says) != std::string::npos, r.err);
        CHECK_FALSE(exists(dir + "/out"));  // nothing half-made
    };
    refused(dir + "/nowhere.safetensors", 66, "no such adapter file");
    {
        std::ifstream in(adapter("flux_peft.safetensors"), std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        bytes.resize(bytes.size() / 2);
        std::ofstream(dir + "/cut.safetensors", std::ios::binary) << bytes;
    }
    refused(dir + "/cut.safetensors", 65, "cut.safetensors");
    refused(adapter("qwen_peft.safetensors"), 65, "Qwen-Image");
    refused(adapter("sd3_attention.safetensors"), 65, "sd3_attention.safetensors");
    // A line's own bad adapter makes that line invalid (65), naming the key and the file.
    nlohmann::json bad = line_of("flux_peft", false);
    bad["lora"] = dir + "/nowhere.safetensors";
    LaunchResult r = run_launch(
        {"--model", tiny_flux(), "-n", "1", "-o", dir + "/out", "-q", write_lines(dir + "/bad.jsonl", {bad})},
        {}, 60);
    CHECK(r.exit_code == 65);
    CHECK_MESSAGE(r.err.find("key 'lora'") != std::string::npos, r.err);
    CHECK(r.err.find("nowhere.safetensors") != std::string::npos);
    CHECK_FALSE(exists(dir + "/out"));
    remove_dir(dir);
}

TEST_SUITE_END();

// It stops and continues a rank: not beside other tests (tests/CMakeLists.txt).
TEST_CASE("lora: an adapter overwritten under a running job is never recorded with another file's SHA-256") {
    // As the ranks name it (dp-launch resolves links).
    const std::string dir = std::filesystem::canonical(make_temp_dir()).string();
    const std::string file = dir + "/style.safetensors";
    { std::ofstream(file, std::ios::binary) << read_file(adapter("flux_peft.safetensors")); }
    nlohmann::json base = line_of("flux_peft", false), styled = base;
    styled["lora"] = file;
    // Sets run in the order of their first line, the base one first: the rank stops itself after
    // its first step, before it reads the adapter, which is overwritten in place (as cp does) with
    // another adapter of the same model after dp-launch hashed it.
    Launch launch({"--model", tiny_flux(), "-n", "1", "-o", dir + "/out", "-q",
                   write_lines(dir + "/p.jsonl", {base, styled})},
                  {{"DP_TEST_KILL_AT_STEP", "0:1:" + std::to_string(SIGSTOP)}});
    const pid_t rank = stopped_process(launch.marker(), 120);
    REQUIRE(rank > 0);
    {
        std::ofstream(file, std::ios::binary | std::ios::trunc)
            << read_file(adapter("flux_kohya.safetensors"));
    }
    kill(rank, SIGCONT);
    const LaunchResult r = launch.wait(240);
    INFO(r.err);
    // An image recorded with the adapter was made from the bytes its SHA-256 names; here there is
    // none: the rank stops, naming the file.
    const std::string now = dp::strategies::file_sha256(file);
    for (const auto& record : read_manifest(dir + "/out"))
        if (record.at("status") == "ok" && record.contains("lora"))
            CHECK(record.at("lora")[0].at("sha256") == now);
    CHECK(r.exit_code == 74);
    CHECK(r.err.find(file + " changed while the job ran: its SHA-256 is now " + now) != std::string::npos);
    CHECK(r.err.find("may succeed") == std::string::npos);
    remove_dir(dir);
}
