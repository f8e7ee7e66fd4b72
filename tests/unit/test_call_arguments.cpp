// Each family's call arguments (Note [call arguments], launcher/job_settings.h): diffusers' names
// and defaults for its pipeline, another family's key or flag refused naming the family, and the
// manifest recording only what the family takes. Against the shipped folders: the tiny SD3 model
// and the config-only Qwen-Image one.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cli/arguments_command.h"
#include "launcher/job.h"
#include "launcher/job_settings.h"
#include "launcher/prompt_file.h"
#include "launcher/schedule_settings.h"
#include "protocol/errors.h"
#include "protocol/job_file.h"
#include "protocol/presets.h"
#include "strategies/model_config.h"
#include "unit/test_support.h"

using namespace dp::launcher;
using dp::strategies::ModelInfo;
using dp::strategies::read_model_info;

namespace {

JobOptions job_on(const std::string& model) {
    JobOptions job;
    job.model = resolve_model(model, "--model");
    return job;
}

using dp::test::has;

// A copy of a shipped model folder, with `defaults` as its generation_defaults.json (none when
// empty).
std::string model_with_defaults(const std::string& model, const std::string& name,
                                const std::string& defaults) {
    namespace fs = std::filesystem;
    const std::string dir = "/tmp/dp_call_arguments_" + std::to_string(getpid()) + "_" + name;
    fs::remove_all(dir);
    fs::copy(resolve_model(model, "--model"), dir, fs::copy_options::recursive);
    if (!defaults.empty()) std::ofstream(dir + "/generation_defaults.json") << defaults;
    return dir;
}

// What reading the folder's rules throws, or "".
std::string rules_error(const std::string& dir) {
    JobOptions job;
    job.model = dir;
    try {
        read_model_info(job.model);
    } catch (const dp::protocol::ModelError& e) {
        return e.what();
    }
    return "";
}

// The "cache" row's value from `j` (the flag's text or a JSONL value) into `out`: an error, or "".
std::string read_step_cache(const nlohmann::json& j, dp::protocol::StepCache& out) {
    dp::protocol::CallValue v;
    const std::string why = dp::protocol::read_call_value(*dp::protocol::find_call_argument("cache"), j, v);
    if (why.empty()) out = std::get<dp::protocol::StepCache>(v);
    return why;
}

// A prompt line of `text` alone.
PromptRecord prompt_line(const std::string& text) {
    PromptRecord p;
    p.prompt = text;
    return p;
}

// What a prompt line that sets `key` to `value` is refused with under `job`, or "".
std::string prompt_key_problem(const std::string& key, double value, const JobOptions& job,
                               const ModelInfo& rules) {
    PromptRecord p = prompt_line("x");
    p.arguments.set(key, value);
    return prompt_setting_problem(p, job, rules);
}

}  // namespace

TEST_CASE(
    "Qwen-Image's defaults are QwenImagePipeline's: 50 steps, true_cfg_scale 4, 512 tokens, 1024 px, no "
    "negative") {
    const JobOptions job = job_on("qwen-image");
    const ModelInfo rules = read_model_info(job.model);
    CHECK(rules.spec->family == "qwen-image");
    CHECK(rules.sizes.multiple() == 16);  // 8 pixels a latent, 2x2 patches
    CHECK(rules.sizes.default_side == 1024);
    CHECK(rules.sizes.check(1000) ==
          "this model makes sizes that are multiples of 16 from 16 to 98304 pixels "
          "(nearest: 992 or 1008)");
    PromptRecord p = prompt_line("a cat");
    const dp::protocol::JobRequest q = job_request(p, job, rules);
    CHECK(q.steps == 50);
    CHECK(q.arguments.number("true_cfg_scale") == 4.0);
    CHECK(q.arguments.whole("max_sequence_length") == 512);
    CHECK(q.width == 1024);
    CHECK(q.height == 1024);
    CHECK_FALSE(q.negative_prompt.has_value());  // diffusers' None: no negative branch
    const nlohmann::json record = pending_record(q, 1, job, "bf16");
    CHECK(record["true_cfg_scale"] == 4.0);
    CHECK(record["negative_prompt"].is_null());
    for (const char* key : {"guidance_scale", "skip_guidance_layers", "skip_layer_guidance_scale"})
        CHECK_MESSAGE(!record.contains(key), key);

    // Its own settings, then the job's, then the family's.
    JobOptions set = job;
    set.steps = 8;
    set.arguments.set("true_cfg_scale", 2.5);
    set.negative_prompt = "";
    p.arguments.set("max_sequence_length", int64_t{1024});  // Qwen-Image takes up to 1024
    CHECK(prompt_setting_problem(p, set, rules).empty());
    const dp::protocol::JobRequest r = job_request(p, set, rules);
    CHECK(r.steps == 8);
    CHECK(r.arguments.number("true_cfg_scale") == 2.5);
    CHECK(r.negative_prompt == std::optional<std::string>(""));
    CHECK(r.arguments.whole("max_sequence_length") == 1024);
    p.no_negative_prompt = true;  // "negative_prompt": null: none, over the job's --negative-prompt
    CHECK_FALSE(job_request(p, set, rules).negative_prompt.has_value());
}

TEST_CASE(
    "SD3's defaults stay StableDiffusion3Pipeline's, and its negative prompt is \"\" when none is given") {
    const JobOptions job = job_on("tiny-random-sd3");
    const ModelInfo rules = read_model_info(job.model);
    PromptRecord p = prompt_line("a cat");
    const dp::protocol::JobRequest q = job_request(p, job, rules);
    CHECK(q.steps == 28);
    CHECK(q.arguments.number("guidance_scale") == 7.0);
    CHECK(q.arguments.whole("max_sequence_length") == 256);
    CHECK(q.negative_prompt == std::optional<std::string>(""));
    const nlohmann::json record = pending_record(q, 1, job, "fp32");
    CHECK(record["guidance_scale"] == 7.0);
    CHECK_FALSE(record.contains("true_cfg_scale"));
}

TEST_CASE("a flag or key of another family is refused, naming the family and what it takes") {
    JobOptions qwen = job_on("qwen-image");
    const ModelInfo qwen_rules = read_model_info(qwen.model);
    qwen.arguments.set("guidance_scale", 5.0);
    qwen.arguments.set("skip_guidance_layers", std::vector<int>{1});
    qwen.no_t5 = true;
    qwen.arguments.set("max_sequence_length", int64_t{1024});
    const std::vector<std::string> bad = job_setting_problems(qwen, qwen_rules);
    REQUIRE(bad.size() == 3);
    CHECK(bad[0] ==
          "--guidance-scale: Qwen-Image does not take guidance_scale (its pipeline takes true_cfg_scale, "
          "max_sequence_length, lora, cache, image, mask_image, strength, padding_mask_crop, scheduler, "
          "scheduler_config, sigmas, timesteps; its guidance scale is true_cfg_scale)");
    CHECK(has(bad[1], "--skip-guidance-layers: Qwen-Image does not take skip_guidance_layers"));
    CHECK(bad[2] == "--no-t5: Qwen-Image has no T5 text encoder to leave out");

    CHECK(has(prompt_key_problem("guidance_scale", 3.0, job_on("qwen-image"), qwen_rules),
              "key 'guidance_scale': Qwen-Image does not take guidance_scale"));
    CHECK(has(prompt_key_problem("skip_layer_guidance_start", 0.1, job_on("qwen-image"), qwen_rules),
              "key 'skip_layer_guidance_start': Qwen-Image does not take"));

    JobOptions sd3 = job_on("tiny-random-sd3");
    const ModelInfo sd3_rules = read_model_info(sd3.model);
    sd3.arguments.set("true_cfg_scale", 4.0);
    sd3.arguments.set("max_sequence_length", int64_t{600});
    sd3.offload = true;  // both families offload
    const std::vector<std::string> sd3_bad = job_setting_problems(sd3, sd3_rules);
    REQUIRE(sd3_bad.size() == 2);
    CHECK(has(sd3_bad[0], "--true-cfg-scale: SD3 does not take true_cfg_scale"));
    CHECK(has(sd3_bad[0], "its guidance scale is guidance_scale"));
    CHECK(sd3_bad[1] == "--max-sequence-length 600 is more than SD3's pipeline accepts (1 to 512)");
    CHECK(has(prompt_key_problem("true_cfg_scale", 4.0, job_on("tiny-random-sd3"), sd3_rules),
              "key 'true_cfg_scale': SD3 does not"));

    JobOptions both = job_on("qwen-image");
    both.offload = true;
    both.device_map = "auto";
    REQUIRE(job_setting_problems(both, qwen_rules).size() == 1);
    CHECK(has(job_setting_problems(both, qwen_rules)[0], "--offload and --device-map auto: choose one"));
}

TEST_CASE(
    "JSONL takes diffusers' names: num_inference_steps for steps, true_cfg_scale, a null negative prompt") {
    const PromptFile f = parse_prompt_file(
        R"({"prompt": "a", "num_inference_steps": 12, "true_cfg_scale": 2.5, "negative_prompt": null}
{"prompt": "b", "steps": 3, "num_inference_steps": 4}
{"prompt": "c", "true_cfg_scale": 101}
{"prompt": "d", "negative_prompt": ""}
)",
        "p.jsonl", true);
    REQUIRE(f.prompts.size() == 2);
    CHECK(f.prompts[0].steps == 12);
    CHECK(f.prompts[0].arguments.number("true_cfg_scale") == 2.5);
    CHECK_FALSE(f.prompts[0].negative_prompt.has_value());
    CHECK(f.prompts[0].no_negative_prompt);
    CHECK_FALSE(f.prompts[1].no_negative_prompt);
    CHECK(f.prompts[1].negative_prompt == std::optional<std::string>(""));
    REQUIRE(f.invalid.size() == 2);
    CHECK(has(f.invalid[0].reason, "p.jsonl:2: keys 'steps' and 'num_inference_steps' are the same setting"));
    CHECK(has(f.invalid[1].reason, "p.jsonl:3: key 'true_cfg_scale': expected a number from 0 to 100"));
}

TEST_CASE(
    "FLUX.1-dev's defaults are FluxPipeline's: 28 steps, guidance 3.5 embedded, no true CFG, 512 tokens") {
    const JobOptions job = job_on("flux.1-dev");
    const ModelInfo rules = read_model_info(job.model);
    CHECK(rules.spec->family == "flux");
    CHECK(rules.family_name == "FLUX.1");
    CHECK(rules.sizes.multiple() == 16);  // 8 pixels a latent, packed 2x2 before a transformer of patch 1
    CHECK(rules.sizes.default_side == 1024);
    CHECK(rules.shape.layers == 19 + 38);  // double- then single-stream blocks
    PromptRecord p = prompt_line("a cat");
    const dp::protocol::JobRequest q = job_request(p, job, rules);
    CHECK(q.steps == 28);
    CHECK(q.arguments.number("guidance_scale") == 3.5);
    CHECK(q.arguments.number("true_cfg_scale") == 1.0);
    CHECK(q.arguments.whole("max_sequence_length") == 512);
    CHECK_FALSE(q.negative_prompt.has_value());
    const nlohmann::json record = pending_record(q, 1, job, "bf16");
    CHECK(record["guidance_scale"] == 3.5);
    CHECK(record["true_cfg_scale"] == 1.0);
    CHECK(record["max_sequence_length"] == 512);
    CHECK_FALSE(record.contains("skip_guidance_layers"));

    JobOptions set = job;
    set.arguments.set("guidance_scale", 5.0);
    set.arguments.set("true_cfg_scale", 3.0);
    set.negative_prompt = "blurry";
    CHECK(job_setting_problems(set, rules).empty());
    const dp::protocol::JobRequest r = job_request(p, set, rules);
    CHECK(r.arguments.number("guidance_scale") == 5);
    CHECK(r.arguments.number("true_cfg_scale") == 3);
    CHECK(r.negative_prompt == std::optional<std::string>("blurry"));

    JobOptions bad = job;
    bad.arguments.set("max_sequence_length", int64_t{513});
    bad.arguments.set("skip_guidance_layers", std::vector<int>{1});
    bad.no_t5 = true;
    const std::vector<std::string> problems = job_setting_problems(bad, rules);
    REQUIRE(problems.size() == 3);
    CHECK(has(problems[0],
              "--skip-guidance-layers: FLUX.1 does not take skip_guidance_layers (its pipeline takes "
              "guidance_scale, true_cfg_scale, max_sequence_length"));
    CHECK(problems[1] ==
          "--no-t5: FLUX.1's transformer takes T5's embeddings as its whole text; it cannot run "
          "without them");
    CHECK(problems[2] == "--max-sequence-length 513 is more than FLUX.1's pipeline accepts (1 to 512)");
}

TEST_CASE(
    "FLUX.1-schnell: 4 steps and 256 tokens by default, guidance_scale accepted and ignored as diffusers "
    "does") {
    const JobOptions job = job_on("flux.1-schnell");
    const ModelInfo rules = read_model_info(job.model);
    CHECK(rules.family_name == "FLUX.1-schnell");
    PromptRecord p = prompt_line("a cat");
    const dp::protocol::JobRequest q = job_request(p, job, rules);
    CHECK(q.steps == 4);
    CHECK(q.arguments.whole("max_sequence_length") == 256);
    // The model card's guidance_scale=0.0 is accepted, as FluxPipeline accepts it, and changes nothing,
    // so the manifest does not record it.
    JobOptions set = job;
    set.arguments.set("guidance_scale", 0.0);
    CHECK(job_setting_problems(set, rules).empty());
    p.arguments.set("guidance_scale", 0.0);
    CHECK(prompt_setting_problem(p, set, rules).empty());
    const nlohmann::json record = pending_record(job_request(p, set, rules), 1, set, "bf16");
    CHECK_FALSE(record.contains("guidance_scale"));
    CHECK(record["max_sequence_length"] == 256);
    CHECK(record["steps"] == 4);
    p.arguments.set("max_sequence_length", int64_t{512});  // diffusers takes up to 512 for schnell too
    CHECK(prompt_setting_problem(p, set, rules).empty());
    p.arguments.set("max_sequence_length", int64_t{600});
    CHECK(prompt_setting_problem(p, set, rules) ==
          "key 'max_sequence_length': 600 is more than FLUX.1-schnell's pipeline accepts (1 to 512)");
    CHECK(has(prompt_key_problem("skip_layer_guidance_scale", 2.0, set, rules),
              "key 'skip_layer_guidance_scale': FLUX.1-schnell does not take skip_layer_guidance_scale"));
}

TEST_CASE(
    "a model folder's generation_defaults.json replaces its family's defaults, and a flag or a prompt's key "
    "still wins") {
    JobOptions job;
    job.model = model_with_defaults("tiny-random-sd3", "sd3",
                                    R"({"_comment": "chosen on a validation set", "guidance_scale": 2.5,
                                        "num_inference_steps": 12, "max_sequence_length": 77})");
    const ModelInfo rules = read_model_info(job.model);
    PromptRecord p = prompt_line("a cat");
    dp::protocol::JobRequest q = job_request(p, job, rules);
    CHECK(q.arguments.number("guidance_scale") == 2.5);
    CHECK(q.steps == 12);
    CHECK(q.arguments.whole("max_sequence_length") == 77);
    CHECK(pending_record(q, 1, job, "fp32")["guidance_scale"] == 2.5);  // the manifest says what ran
    JobOptions flags = job;
    flags.arguments.set("guidance_scale", 7.0);
    flags.steps = 28;
    q = job_request(p, flags, rules);
    CHECK(q.arguments.number("guidance_scale") == 7.0);
    CHECK(q.steps == 28);
    CHECK(q.arguments.whole("max_sequence_length") == 77);
    p.arguments.set("guidance_scale", 4.0);
    CHECK(job_request(p, flags, rules).arguments.number("guidance_scale") == 4.0);

    // Qwen-Image's guidance key is true_cfg_scale.
    JobOptions qwen;
    qwen.model =
        model_with_defaults("qwen-image", "qwen", R"({"true_cfg_scale": 1.5, "num_inference_steps": 30})");
    const dp::protocol::JobRequest w = job_request(prompt_line("a cat"), qwen, read_model_info(qwen.model));
    CHECK(w.arguments.number("true_cfg_scale") == 1.5);
    CHECK(w.steps == 30);

    // Without the file, the family's.
    JobOptions plain;
    plain.model = model_with_defaults("tiny-random-sd3", "plain", "");
    p.arguments.erase("guidance_scale");
    CHECK(job_request(p, plain, read_model_info(plain.model)).arguments.number("guidance_scale") == 7.0);
}

TEST_CASE("a bad generation_defaults.json is refused naming the file, the key and what is accepted") {
    const std::string sd3 = model_with_defaults("tiny-random-sd3", "bad", "");
    const std::string file = sd3 + "/generation_defaults.json";
    auto with = [&](const std::string& text) {
        std::ofstream(file, std::ios::trunc) << text;
        return rules_error(sd3);
    };
    CHECK(with(R"({"guidance_scale": 2.5})").empty());
    CHECK(with(R"({"true_cfg_scale": 2.5})") == file +
                                                    ": \"true_cfg_scale\" is not a default this model's "
                                                    "pipeline takes (it takes num_inference_steps, "
                                                    "guidance_scale, max_sequence_length)");
    CHECK(with(R"({"guidance_scale": 101})") ==
          file + ": \"guidance_scale\" is 101; expected a number from 0 to 100");
    CHECK(with(R"({"guidance_scale": "2.5"})") ==
          file + ": \"guidance_scale\" is \"2.5\"; expected a number from 0 to 100");
    CHECK(with(R"({"guidance_scale": true})") ==
          file + ": \"guidance_scale\" is true; expected a number from 0 to 100");
    CHECK(with(R"({"num_inference_steps": 2.5})") ==
          file + ": \"num_inference_steps\" is 2.5; expected a whole number from 1 to 1000");
    CHECK(with(R"({"num_inference_steps": 0})") ==
          file + ": \"num_inference_steps\" is 0; expected a whole number from 1 to 1000");
    CHECK(with(R"({"max_sequence_length": 513})") ==
          file + ": \"max_sequence_length\" is 513; expected a whole number from 1 to 512");
    CHECK(has(with("[1, 2]"), file + ": expected a JSON object"));
    CHECK(has(with("{\"guidance_scale\": "), file + ": not valid JSON"));
    CHECK(has(with(R"({"steps": 20})"), "\"steps\" is not a default"));
}

namespace {

// `dp-launch arguments --model MODEL --json` as the CLI prints it.
nlohmann::json listed_arguments(const std::string& model) {
    JobOptions job = job_on(model);
    return nlohmann::json::parse(dp::cli::describe_arguments(job, /*json=*/true));
}

// The request of a one-line JSONL file, or the reason the line is refused.
std::string request_of(const nlohmann::json& line, const JobOptions& job, const ModelInfo& model,
                       dp::protocol::JobRequest& out) {
    const PromptFile f = parse_prompt_file(line.dump() + "\n", "p.jsonl", true, [&](const PromptRecord& p) {
        return prompt_setting_problem(p, job, model);
    });
    if (!f.invalid.empty()) return f.invalid[0].reason;
    out = job_request(f.prompts.at(0), job, model);
    return "";
}

}  // namespace

TEST_CASE(
    "dp-launch arguments: a line with every listed key at its listed default is the line that leaves them "
    "out") {
    for (const char* model :
         {"tiny-random-sd3", "tiny-random-flux-dev", "tiny-random-flux-schnell", "tiny-random-flux-fill",
          "tiny-random-flux-kontext", "tiny-random-qwen-image", "tiny-random-flux2-klein",
          "tiny-random-flux2-klein-base", "shapes-sd3", "qwen-image", "flux.1-dev"}) {
        CAPTURE(model);
        const JobOptions job = job_on(model);
        const ModelInfo info = read_model_info(job.model);
        const nlohmann::json listed = listed_arguments(model);
        REQUIRE(listed.is_array());
        nlohmann::json full = {{"prompt", "a red circle"}};
        std::set<std::string> names;
        for (const nlohmann::json& a : listed) {
            for (const char* field : {"name", "type", "default", "min", "max", "flag"})
                REQUIRE(a.contains(field));
            CHECK(names.insert(a.at("name").get<std::string>()).second);
            full[a.at("name").get<std::string>()] = a.at("default");
        }
        // The family's own arguments are listed, and no other family's.
        for (const dp::protocol::CallArgument& row : dp::protocol::call_arguments())
            CHECK_MESSAGE(names.count(row.name) == (info.arguments.find(row.name) ? 1u : 0u), row.name);
        dp::protocol::JobRequest with_all, with_none;
        REQUIRE(request_of(full, job, info, with_all).empty());
        REQUIRE(request_of({{"prompt", "a red circle"}}, job, info, with_none).empty());
        CHECK(nlohmann::json(with_all) == nlohmann::json(with_none));
        // Any key not listed is refused: another family's, or no one's.
        for (const dp::protocol::CallArgument& row : dp::protocol::call_arguments()) {
            if (names.count(row.name)) continue;
            nlohmann::json line = {
                {"prompt", "x"},
                {row.name, row.type == dp::protocol::CallType::kBlocks ? nlohmann::json::array()
                                                                       : nlohmann::json(row.min)}};
            CHECK_MESSAGE(!request_of(line, job, info, with_all).empty(), row.name);
        }
        CHECK(has(request_of({{"prompt", "x"}, {"not_a_key", 1}}, job, info, with_all),
                  "unknown key 'not_a_key'"));
        // Past a listed maximum is refused too.
        for (const nlohmann::json& a : listed) {
            if (a.at("max").is_null() || a.at("name") == "seed") continue;
            const nlohmann::json past = a.at("type") == "list of integers"
                                            ? nlohmann::json::array({a.at("max").get<int64_t>() + 1})
                                            : nlohmann::json(a.at("max").get<double>() * 2 + 1);
            nlohmann::json line = {{"prompt", "x"}, {a.at("name").get<std::string>(), past}};
            if (a.at("type") == "integer")
                line[a.at("name").get<std::string>()] = a.at("max").get<int64_t>() * 2 + 1;
            CHECK_MESSAGE(!request_of(line, job, info, with_all).empty(), a.at("name"));
        }
    }
}

TEST_CASE("dp-launch arguments shows the job's own settings as the defaults a line gets") {
    JobOptions job = job_on("tiny-random-sd3");
    job.steps = 9;
    job.arguments.set("guidance_scale", 3.0);
    const nlohmann::json listed = nlohmann::json::parse(dp::cli::describe_arguments(job, true));
    for (const nlohmann::json& a : listed) {
        if (a.at("name") == "num_inference_steps") CHECK(a.at("default") == 9);
        if (a.at("name") == "guidance_scale") CHECK(a.at("default") == 3.0);
        if (a.at("name") == "max_sequence_length") CHECK(a.at("default") == 256);
    }
    const std::string text = dp::cli::describe_arguments(job_on("tiny-random-flux-schnell"), false);
    CHECK(has(text, "FLUX.1-schnell"));
    CHECK(has(text, "accepted and ignored by FLUX.1-schnell"));  // guidance_scale, as diffusers does
    CHECK(has(text, "num_inference_steps (or steps)"));
    // FLUX.2 klein: the distilled folder ignores guidance_scale (model_index.json's is_distilled),
    // the -base one guides with it; an edit's size is the first picture's.
    const std::string klein = dp::cli::describe_arguments(job_on("tiny-random-flux2-klein"), false);
    CHECK(has(klein, "accepted and ignored by FLUX.2-klein"));
    CHECK(has(klein, "its first picture's, as the pipeline sizes it"));
    const std::string base = dp::cli::describe_arguments(job_on("tiny-random-flux2-klein-base"), false);
    CHECK(has(base, "FLUX.2-klein-base"));
    CHECK_FALSE(has(base, "accepted and ignored"));
}

TEST_CASE("dp-launch arguments refuses what the job refuses, with the job's exit code and message") {
    namespace fs = std::filesystem;
    // A position table of 4 patches: the model's own default size (32 pixels) is past it.
    const std::string small = model_with_defaults("tiny-random-sd3", "small_table", "");
    nlohmann::json config = nlohmann::json::parse(std::ifstream(small + "/transformer/config.json"));
    config["pos_embed_max_size"] = 4;
    std::ofstream(small + "/transformer/config.json") << config.dump();
    const std::string unweighted = model_with_defaults("tiny-random-sd3", "unweighted", "");
    fs::remove(unweighted + "/transformer/diffusion_pytorch_model.safetensors");
    struct Row {
        std::string name, model;
        std::function<void(JobOptions&)> set;
        int code;  // 0: listed
        std::string says;
    };
    const auto none = [](JobOptions&) {};
    const std::vector<Row> rows = {
        {"default size past the table", small, none, 65, "its default image size 32x32"},
        {"sizes given that fit", small,
         [](JobOptions& j) {
             j.width = 4;
             j.height = 4;
         },
         0, ""},
        {"weights missing", unweighted, none, 65, unweighted + "/transformer"},
        {"a block past the model's", resolve_model("tiny-random-sd3", "--model"),
         [](JobOptions& j) { j.arguments.set("skip_guidance_layers", std::vector<int>{9}); }, 2,
         "--skip-guidance-layers 9: block 9 is not one"},
        {"the shipped model", resolve_model("tiny-random-sd3", "--model"), none, 0, ""},
    };
    for (const Row& row : rows) {
        CAPTURE(row.name);
        JobOptions job;
        job.model = row.model;
        row.set(job);
        const auto refusal = [&](const std::function<void()>& run) -> std::pair<int, std::string> {
            try {
                run();
            } catch (const dp::protocol::Error& e) {
                return {e.exit_code(), e.what()};
            }
            return {0, ""};
        };
        const auto [code, message] = refusal([&] { dp::cli::describe_arguments(job, false); });
        CHECK_MESSAGE(code == row.code, message);
        if (row.code == 0) continue;
        CHECK_MESSAGE(has(message, row.says), message);
        // The job itself: the same code and message, before its output folder is made.
        job.prompts = "/dev/null";
        job.output_dir = "/tmp/dp_call_arguments_" + std::to_string(getpid()) + "_out";
        const auto [job_code, job_message] = refusal([&] { run_job(dp::launcher::LaunchSpec{}, job); });
        CHECK(job_code == row.code);
        CHECK(job_message == message);
        CHECK_FALSE(fs::exists(job.output_dir));
    }
}

TEST_CASE("a step cache is read as diffusers' configs name it, from the flag's text or a JSONL object") {
    const auto read = read_step_cache;
    dp::protocol::StepCache c;
    CHECK(read("first_block_cache:threshold=0.08", c).empty());
    CHECK(c.type == "first_block_cache");
    CHECK(c.threshold == 0.08);
    CHECK(c.text() == "first_block_cache:threshold=0.08");
    CHECK(dp::protocol::call_value_json(dp::protocol::CallValue(c)) == "first_block_cache:threshold=0.08");
    CHECK(read(nlohmann::json{{"type", "first_block_cache"}, {"threshold", 0.2}}, c).empty());
    CHECK(c.threshold == 0.2);
    CHECK(read("first_block_cache", c).empty());
    CHECK(c.threshold == 0.05);  // FirstBlockCacheConfig's default
    CHECK(read("none", c).empty());
    CHECK_FALSE(c.enabled());
    CHECK(c.text() == "none");
    CHECK(read(nullptr, c).empty());
    CHECK_FALSE(c.enabled());
    // What is wrong is said, with what is accepted.
    CHECK(read("faster_cache", c).find("not built yet") != std::string::npos);
    CHECK(read("teacache", c).find("unknown step cache 'teacache'") != std::string::npos);
    CHECK(read("first_block_cache:threshold=-1", c).find("not a number from 0 to 10") != std::string::npos);
    CHECK(read("first_block_cache:threshold=nan", c).find("not a number") != std::string::npos);
    CHECK(read("first_block_cache:threshold=", c).find("not a number") != std::string::npos);
    CHECK(read("first_block_cache:interval=3", c).find("takes threshold=T") != std::string::npos);
    CHECK(read(nlohmann::json{{"type", "first_block_cache"}, {"speed", 2}}, c).find("speed=2") !=
          std::string::npos);
    // TaylorSeer: diffusers' defaults, its keys, and the passes its schedule computes.
    CHECK(read("taylorseer_cache", c).empty());
    CHECK(c.text() ==
          "taylorseer_cache:cache_interval=5,disable_cache_before_step=3,max_order=1,"
          "taylor_factors_dtype=bfloat16");
    std::vector<bool> passes;
    for (int s = 0; s < 10; ++s) passes.push_back(c.computes(s));
    // Warm-up 0-2; (s - 4) % 5 == 0 after it: 4 and 9 (3 is extrapolated, as Python's -1 % 5 is 4).
    CHECK(passes == std::vector<bool>{true, true, true, false, true, false, false, false, false, true});
    CHECK(read(nlohmann::json{{"type", "taylorseer_cache"},
                              {"cache_interval", 2},
                              {"disable_cache_after_step", 6},
                              {"max_order", 2},
                              {"taylor_factors_dtype", "float32"}},
               c)
              .empty());
    CHECK(c.cache_interval == 2);
    CHECK(c.max_order == 2);
    CHECK(c.float32_factors);
    CHECK(c.computes(6));  // the cool-down
    CHECK(c.text() ==
          "taylorseer_cache:cache_interval=2,disable_cache_before_step=3,disable_cache_after_step=6,"
          "max_order=2,taylor_factors_dtype=float32");
    CHECK(read("taylorseer_cache:cache_interval=0", c).find("cache_interval '0'") != std::string::npos);
    CHECK(read("taylorseer_cache:threshold=0.1", c).find("taylorseer_cache takes cache_interval") !=
          std::string::npos);
    CHECK(read("taylorseer_cache:taylor_factors_dtype=float16", c).find("takes") != std::string::npos);
    CHECK(read(3, c).find("expected first_block_cache") != std::string::npos);
}

TEST_CASE(
    "MagCache is read with its ratios from flux, a file, a list or the recorded numbers, and calibration") {
    const auto read = read_step_cache;
    dp::protocol::StepCache c;
    // FLUX.1's published ratios, MagCacheConfig's defaults.
    REQUIRE(read("mag_cache:mag_ratios=flux", c).empty());
    CHECK(c.mag());
    CHECK(c.threshold == 0.06);
    CHECK(c.max_skip_steps == 3);
    CHECK(c.retention_ratio == 0.2);
    REQUIRE(c.mag_ratios.size() == 28);
    CHECK(c.mag_ratios[1] == 1.21094f);
    // The recorded text gives the same setting back (what a --resume compares).
    dp::protocol::StepCache again;
    REQUIRE(read(c.text(), again).empty());
    CHECK(again.mag_ratios == c.mag_ratios);
    CHECK(again == c);
    // diffusers' nearest_interp: 28 ratios to 8 steps take indices 0, 4, 8, 12, 15, 19, 23, 27
    // (round(i * 27 / 7), half to even), and to one step the last.
    const std::vector<float> eight = c.mag_ratios_for(8);
    REQUIRE(eight.size() == 8);
    for (const auto& [i, from] : std::vector<std::pair<int, int>>{
             {0, 0}, {1, 4}, {2, 8}, {3, 12}, {4, 15}, {5, 19}, {6, 23}, {7, 27}})
        CHECK(eight[static_cast<std::size_t>(i)] == c.mag_ratios[static_cast<std::size_t>(from)]);
    CHECK(c.mag_ratios_for(1) == std::vector<float>{c.mag_ratios.back()});
    CHECK(c.mag_ratios_for(28) == c.mag_ratios);
    // A JSONL object with a list; every key.
    REQUIRE(read(nlohmann::json{{"type", "mag_cache"},
                                {"mag_ratios", {1.0, 1.1, 0.9}},
                                {"threshold", 0.1},
                                {"max_skip_steps", 2},
                                {"retention_ratio", 0.5}},
                 c)
                .empty());
    CHECK(c.mag_ratios == std::vector<float>{1.0f, 1.1f, 0.9f});
    CHECK(c.threshold == 0.1);
    CHECK(c.max_skip_steps == 2);
    CHECK(c.retention_ratio == 0.5);
    // A calibration file, as the job writes it, or a plain list.
    namespace fs = std::filesystem;
    const std::string dir = "/tmp/dp_call_arguments_" + std::to_string(getpid()) + "_mag_ratios";
    fs::remove_all(dir);
    fs::create_directories(dir);
    struct Cleanup {
        std::string dir;
        ~Cleanup() { std::filesystem::remove_all(dir); }
    } cleanup{dir};
    const auto write = [&](const std::string& name, const std::string& body) {
        std::ofstream(dir + "/" + name) << body;
        return dir + "/" + name;
    };
    REQUIRE(read("mag_cache:mag_ratios=" +
                     write("calibrated.json", R"({"mag_ratios": [1, 1.25, 0.75], "steps": 3})"),
                 c)
                .empty());
    CHECK(c.mag_ratios == std::vector<float>{1.0f, 1.25f, 0.75f});
    REQUIRE(read("mag_cache:mag_ratios=" + write("list.json", "[1, 2]"), c).empty());
    CHECK(c.mag_ratios == std::vector<float>{1.0f, 2.0f});
    // Calibration: nothing skipped, no ratios needed.
    REQUIRE(read("mag_cache:calibrate=true", c).empty());
    CHECK(c.calibrate);
    CHECK(c.text() == "mag_cache:calibrate=true");
    REQUIRE(read(nlohmann::json{{"type", "mag_cache"}, {"calibrate", true}}, c).empty());
    CHECK(c.calibrate);
    // What is wrong is said, with what to do.
    CHECK(read("mag_cache", c).find("calibrate=true") != std::string::npos);
    CHECK(read("mag_cache:threshold=0.1", c).find("needs the model's magnitude ratios") != std::string::npos);
    CHECK(read("mag_cache:mag_ratios=" + dir + "/missing.json", c).find("does not exist") !=
          std::string::npos);
    CHECK(read("mag_cache:mag_ratios=" + write("bad.json", R"({"ratios": 3})"), c)
              .find("JSON list of numbers") != std::string::npos);
    CHECK(read("mag_cache:mag_ratios=" + write("text.json", "[1, \"x\"]"), c).find("JSON list") !=
          std::string::npos);
    CHECK(read("mag_cache:mag_ratios=" + write("negative.json", "[1, -2]"), c).find("mag_ratios[1]") !=
          std::string::npos);
    CHECK(read("mag_cache:mag_ratios=" + write("empty.json", "[]"), c).find("empty") != std::string::npos);
    CHECK(read("mag_cache:mag_ratios=" + dir, c).find("not a regular file") != std::string::npos);
    CHECK(read("mag_cache:mag_ratios=1 nan", c).find("not a positive number") != std::string::npos);
    CHECK(read("mag_cache:mag_ratios=flux,num_inference_steps=28", c).find("each prompt's own steps") !=
          std::string::npos);
    CHECK(read("mag_cache:mag_ratios=flux,retention_ratio=2", c).find("retention_ratio '2'") !=
          std::string::npos);
    CHECK(read("mag_cache:mag_ratios=flux,cache_interval=2", c).find("mag_cache takes threshold") !=
          std::string::npos);
    CHECK(read(nlohmann::json{{"type", "mag_cache"}, {"mag_ratios", {1, "x"}}}, c).find("list of numbers") !=
          std::string::npos);
}

TEST_CASE("an adapter path that is not UTF-8 goes through JSON as path_hex and comes back byte for byte") {
    using namespace dp::protocol;
    const CallArgument& row = *find_call_argument("lora");
    for (const std::string& path :
         {std::string("/tmp/a\xff/b\xfe.safetensors"), std::string("/tmp/caf\xc3\xa9")}) {
        CAPTURE(utf8_for_display(path));
        const Adapters adapters{{path, 0.5, std::string(64, 'a')}};
        const nlohmann::json j = call_value_json(adapters);
        const std::string text = j.dump();  // never throws: JSON holds UTF-8 text only
        const bool utf8 = utf8_for_display(path) == path;
        CHECK(j[0].contains("path") == utf8);
        CHECK(j[0].contains("path_hex") == !utf8);
        CallValue back;
        REQUIRE(read_call_value(row, nlohmann::json::parse(text), back).empty());
        CHECK(std::get<Adapters>(back) == adapters);
    }
    CallValue v;
    CHECK(read_call_value(row, nlohmann::json::parse(R"({"path_hex": "6a"})"), v).empty());
    CHECK(std::get<Adapters>(v) == Adapters{{"j", 1.0, ""}});
    for (const char* bad : {R"({"path_hex": "6"})", R"({"path_hex": "6A"})", R"({"path_hex": "zz"})",
                            R"({"path_hex": ""})", R"({"path": "a", "path_hex": "61"})"})
        CHECK_MESSAGE(!read_call_value(row, nlohmann::json::parse(bad), v).empty(), bad);
}

TEST_CASE("a step cache setting that contradicts itself is refused, naming both of its parts") {
    struct Row {
        nlohmann::json setting;
        std::vector<std::string> says;  // empty: read
    };
    const std::vector<Row> rows = {
        {"first_block_cache:threshold=0.1,threshold=0.2",
         {"threshold is given twice ('threshold=0.1' and 'threshold=0.2')"}},
        {"first_block_cache:threshold=0.1,threshold=0.1", {"threshold is given twice"}},
        {"taylorseer_cache:max_order=1,cache_interval=2,max_order=2",
         {"max_order is given twice ('max_order=1' and 'max_order=2')"}},
        {"mag_cache:mag_ratios=flux,mag_ratios=1 1", {"mag_ratios is given twice"}},
        {"mag_cache:calibrate=true,mag_ratios=flux",
         {"calibrate=true", "'mag_ratios=flux' would not be used"}},
        {"mag_cache:mag_ratios=flux,calibrate=true", {"'mag_ratios=flux' would not be used"}},
        {"mag_cache:calibrate=true,threshold=0.1", {"'threshold=0.1' would not be used"}},
        {nlohmann::json{{"type", "mag_cache"}, {"calibrate", true}, {"max_skip_steps", 2}},
         {"'max_skip_steps=2' would not be used"}},
        {"mag_cache:calibrate=false,mag_ratios=flux", {}},
        {"mag_cache:calibrate=true", {}},
    };
    for (const Row& row : rows) {
        CAPTURE(row.setting.dump());
        dp::protocol::StepCache c;
        const std::string why = read_step_cache(row.setting, c);
        if (row.says.empty()) {
            CHECK_MESSAGE(why.empty(), why);
            continue;
        }
        for (const std::string& s : row.says) CHECK_MESSAGE(has(why, s), why);
    }
}

TEST_CASE("the shipped presets fix their steps and settings, and a preset file is read in the same format") {
    using dp::protocol::Preset;
    REQUIRE(dp::strategies::shipped_presets().size() == 5);
    Preset lightning;
    REQUIRE(
        dp::protocol::find_preset("qwen-image-lightning-4step", dp::strategies::shipped_presets(), lightning)
            .empty());
    CHECK(lightning.family == "qwen-image");
    CHECK(lightning.steps == 4);
    CHECK(lightning.arguments.number("true_cfg_scale") == 1.0);
    CHECK(lightning.arguments.scheduler("scheduler").name == "euler");
    CHECK(has(lightning.adapter, "lightx2v/Qwen-Image-Lightning"));

    // On the config-only Qwen-Image folder: a line with the preset runs its values, resolved over the
    // model's scheduler config with the preset's keys.
    const JobOptions job = job_on("qwen-image");
    const ModelInfo model = read_model_info(job.model);
    PromptRecord p;
    p.prompt = "a";
    p.preset = lightning;
    CHECK(prompt_setting_problem(p, job, model).empty());
    const dp::protocol::JobRequest q = job_request(p, job, model);
    CHECK(q.steps == 4);
    CHECK(q.arguments.number("true_cfg_scale") == 1.0);
    nlohmann::json record = nlohmann::json::object();
    add_schedule_record(record, q, &lightning, model);
    CHECK(record["preset"] == "qwen-image-lightning-4step");
    CHECK(record["scheduler_resolved"]["config"]["max_shift"] == 1.0986122886681098);
    CHECK(record["scheduler_resolved"]["config"]["use_dynamic_shifting"] == true);
    p.arguments.set("true_cfg_scale", 4.0);
    CHECK(prompt_setting_problem(p, job, model) ==
          "true_cfg_scale 4, but preset qwen-image-lightning-4step fixes it at 1");

    struct Row {
        const char* text;
        const char* why;
    };
    const Row rows[] = {
        {R"({"name": "x", "family": "sd3", "num_inference_steps": 4})", ""},
        {R"({"family": "sd3", "num_inference_steps": 4})", "missing key 'name'"},
        {R"({"name": "x", "num_inference_steps": 4})", "missing key 'family'"},
        {R"({"name": "x", "family": "sd3", "num_inference_steps": 0})",
         "key 'num_inference_steps': expected a whole number from 1 to 1000"},
        {R"({"name": "x", "family": "sd3", "width": 512})", "unknown key 'width' (accepted: name, family"},
        {R"({"name": "x", "family": "sd3", "scheduler": "eulr"})",
         "key 'scheduler': unknown scheduler 'eulr'"},
        {R"({"name": "x", "family": "sd3"})", "this one sets nothing"},
        {R"([1])", "expected a JSON object"},
    };
    const std::string file = "/tmp/dp_preset_" + std::to_string(getpid()) + ".json";
    for (const Row& row : rows) {
        CAPTURE(std::string(row.text));
        std::ofstream(file, std::ios::trunc) << row.text;
        Preset read;
        const std::string why = dp::protocol::find_preset(file, dp::strategies::shipped_presets(), read);
        if (*row.why == '\0')
            CHECK(why.empty());
        else
            CHECK_MESSAGE(has(why, row.why), why.c_str());
    }
    std::filesystem::remove(file);
    Preset none;
    CHECK(has(dp::protocol::find_preset("lightning", dp::strategies::shipped_presets(), none),
              "unknown preset 'lightning' (known: "));
}
