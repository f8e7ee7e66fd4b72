// The main job's new per-prompt settings (max_sequence_length, skip-layer guidance) and model
// options (--variant, --no-t5, --dtype auto), from flag and JSONL key to the request, the manifest
// record and --resume; and the model folder checks made before any rank starts, each naming the
// file or key and what would work.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/component_files.h"
#include "launcher/job.h"
#include "launcher/job_settings.h"
#include "launcher/manifest.h"
#include "launcher/prompt_file.h"
#include "protocol/errors.h"
#include "protocol/job_file.h"
#include "strategies/cpu_dtype.h"
#include "strategies/family.h"
#include "strategies/model_config.h"
#include "unit/st_writer.h"
#include "unit/test_support.h"

namespace fs = std::filesystem;
using namespace dp::launcher;

namespace {

using dp::test::has;

// A two-step request for prompt "a" at `family`'s defaults.
dp::protocol::JobRequest two_step_request(const dp::protocol::FamilyArguments& family) {
    dp::protocol::JobRequest q;
    q.prompt = "a";
    q.steps = 2;
    q.arguments = family.defaults();
    return q;
}

std::string scratch(const std::string& name) {
    const std::string dir = "/tmp/dp_job_settings_" + std::to_string(getpid()) + "_" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

// A copy of the shipped tiny model, with T5 added: text_encoder_3 (a config whose d_model is the
// transformer's joint_attention_dim, and a weights file) and tokenizer_3 (spiece.model).
std::string tiny_with_t5(const std::string& name) {
    const std::string dir = scratch(name) + "/model";
    fs::copy(resolve_model("tiny-random-sd3", "--model"), dir, fs::copy_options::recursive);
    nlohmann::json index = nlohmann::json::parse(std::ifstream(dir + "/model_index.json"));
    index["text_encoder_3"] = {"transformers", "T5EncoderModel"};
    index["tokenizer_3"] = {"transformers", "T5TokenizerFast"};
    std::ofstream(dir + "/model_index.json") << index.dump(2);
    fs::create_directories(dir + "/text_encoder_3");
    fs::create_directories(dir + "/tokenizer_3");
    std::ofstream(dir + "/text_encoder_3/config.json")
        << R"({"architectures": ["T5EncoderModel"], "d_model": 32})";
    fs::copy_file(dir + "/text_encoder/model.safetensors", dir + "/text_encoder_3/model.safetensors");
    std::ofstream(dir + "/tokenizer_3/spiece.model") << "sentencepiece";
    return dir;
}

std::vector<std::string> problems(const std::string& model, dp::strategies::ModelNeeds needs = {}) {
    return dp::strategies::model_folder_problems(model, dp::strategies::parallel_spec_for_model(model),
                                                 needs);
}

std::string joined(const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& s : items) out += s + "\n";
    return out;
}

void edit_json(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    edit(j);
    std::ofstream(path) << j.dump(2);
}

}  // namespace

TEST_CASE(
    "JSONL keys for the new settings: accepted in range, each bad value an invalid line naming its key") {
    const PromptFile f = parse_prompt_file(
        R"({"prompt": "a", "max_sequence_length": 77, "skip_guidance_layers": [7, 8, 9], "skip_layer_guidance_scale": 3.5, "skip_layer_guidance_start": 0.1, "skip_layer_guidance_stop": 0.5}
{"prompt": "b", "skip_guidance_layers": []}
{"prompt": "c", "max_sequence_length": 1025}
{"prompt": "d", "max_sequence_length": 0}
{"prompt": "e", "skip_guidance_layers": 7}
{"prompt": "f", "skip_guidance_layers": [1, 1]}
{"prompt": "g", "skip_guidance_layers": [-1]}
{"prompt": "h", "skip_layer_guidance_start": 1.5}
{"prompt": "i", "skip_layer_guidance_scale": 101}
{"prompt": "j", "skip_layer_guidance_stop": "0.2"}
)",
        "p.jsonl", true);
    REQUIRE(f.prompts.size() == 2);
    const dp::protocol::CallValues& a = f.prompts[0].arguments;
    CHECK(a.whole("max_sequence_length") == 77);
    CHECK(a.blocks("skip_guidance_layers") == std::vector<int>{7, 8, 9});
    CHECK(a.number("skip_layer_guidance_scale") == 3.5);
    CHECK(a.number("skip_layer_guidance_start") == 0.1);
    CHECK(a.number("skip_layer_guidance_stop") == 0.5);
    CHECK(f.prompts[1].arguments.blocks("skip_guidance_layers").empty());
    dp::test::check_reasons(
        f.invalid,
        {"p.jsonl:3: key 'max_sequence_length': expected a whole number from 1 to 1024",
         "p.jsonl:4: key 'max_sequence_length': expected a whole number from 1 to 1024",
         "p.jsonl:5: key 'skip_guidance_layers': expected a list of distinct transformer block indices",
         "p.jsonl:6: key 'skip_guidance_layers': block 1 is listed twice",
         "p.jsonl:7: key 'skip_guidance_layers': expected a list",
         "p.jsonl:8: key 'skip_layer_guidance_start': expected a number from 0 to 1",
         "p.jsonl:9: key 'skip_layer_guidance_scale': expected a number from 0 to 100",
         "p.jsonl:10: key 'skip_layer_guidance_stop': expected a number from 0 to 1"});
}

TEST_CASE("a request takes the prompt's own settings, else the job's, checked against the model's blocks") {
    JobOptions job;
    job.model = resolve_model("tiny-random-sd3", "--model");  // 2 transformer blocks
    job.arguments.set("max_sequence_length", int64_t{100});
    job.arguments.set("skip_guidance_layers", std::vector<int>{1});
    job.arguments.set("skip_layer_guidance_scale", 3.0);
    const dp::strategies::ModelInfo rules = dp::strategies::read_model_info(job.model);
    CHECK(rules.shape.layers == 2);
    PromptRecord p;
    p.prompt = "x";
    p.arguments.set("skip_layer_guidance_stop", 0.7);
    const dp::protocol::JobRequest q = job_request(p, job, rules);
    CHECK(q.arguments.whole("max_sequence_length") == 100);
    CHECK(q.arguments.blocks("skip_guidance_layers") == std::vector<int>{1});
    CHECK(q.arguments.number("skip_layer_guidance_scale") == 3);
    CHECK(q.arguments.number("skip_layer_guidance_start") == 0.01);
    CHECK(q.arguments.number("skip_layer_guidance_stop") == 0.7);
    CHECK(q.width == 32);  // the model's default size
    p.arguments.set("max_sequence_length", int64_t{7});
    p.arguments.set("skip_guidance_layers", std::vector<int>{});
    CHECK(job_request(p, job, rules).arguments.whole("max_sequence_length") == 7);
    CHECK(job_request(p, job, rules).arguments.blocks("skip_guidance_layers").empty());
    p.arguments.set("max_sequence_length",
                    int64_t{513});  // the parser takes up to 1024 (Qwen-Image's); SD3's T5 takes 512
    CHECK(prompt_setting_problem(p, job, rules) ==
          "key 'max_sequence_length': 513 is more than SD3's pipeline accepts (1 to 512)");
    p.arguments.set("max_sequence_length", int64_t{7});

    CHECK(job_setting_problems(job, rules).empty());
    CHECK(prompt_setting_problem(p, job, rules).empty());
    job.arguments.set("skip_guidance_layers", std::vector<int>{0, 2});
    job.arguments.set("skip_layer_guidance_start", 0.5);
    job.arguments.set("skip_layer_guidance_stop", 0.5);
    const std::vector<std::string> bad = job_setting_problems(job, rules);
    REQUIRE(bad.size() == 2);
    CHECK(bad[0] == "--skip-guidance-layers 0,2: block 2 is not one of the transformer's 2 blocks (0 to 1)");
    CHECK(has(bad[1],
              "--skip-layer-guidance-start 0.5 and --skip-layer-guidance-stop 0.5: the start must be below"));
    CHECK_THROWS_WITH_AS(check_job(ResolvedJob{job, rules, {}, "fp32", {}}),
                         doctest::Contains("block 2 is not one of"), dp::protocol::UsageError);
    p.arguments.set("skip_guidance_layers", std::vector<int>{5});
    CHECK(prompt_setting_problem(p, job, rules) ==
          "key 'skip_guidance_layers': block 5 is not one of the transformer's 2 blocks (0 to 1)");
    p.arguments.erase("skip_guidance_layers");
    p.arguments.erase("skip_layer_guidance_stop");
    p.arguments.set("skip_layer_guidance_start", 0.9);  // over the job's stop of 0.5
    CHECK(prompt_setting_problem(p, job, rules) ==
          "skip_layer_guidance_start 0.9 and skip_layer_guidance_stop 0.5 (the job's): the start must be "
          "below the stop");
}

TEST_CASE("requests batch together only when every setting that shapes the batch agrees") {
    dp::protocol::JobRequest a;
    a.prompt = "a";
    a.seed = 1;
    a.arguments = dp::strategies::family_arguments("sd3").defaults();
    dp::protocol::JobRequest b = a;
    b.prompt = "b";  // prompt, seed and file are each request's own
    b.seed = 2;
    CHECK(dp::protocol::same_batch_settings(a, b));
    for (int field = 0; field < 9; ++field) {
        CAPTURE(field);
        dp::protocol::JobRequest c = a;
        switch (field) {
            case 0:
                c.steps = 3;
                break;
            case 1:
                c.arguments.set("guidance_scale", 2.0);
                break;
            case 2:
                c.width = 16;
                break;
            case 3:
                c.height = 16;
                break;
            case 4:
                c.arguments.set("max_sequence_length", int64_t{77});
                break;
            case 5:
                c.arguments.set("skip_guidance_layers", std::vector<int>{7});
                break;
            case 6:
                c.arguments.set("skip_layer_guidance_scale", 3.0);
                break;
            case 7:
                c.arguments.set("skip_layer_guidance_start", 0.05);
                break;
            case 8:
                c.arguments.set("skip_layer_guidance_stop", 0.3);
                break;
        }
        CHECK_FALSE(dp::protocol::same_batch_settings(a, c));
    }
}

TEST_CASE("the manifest records the new settings, and --resume treats a change as a change of settings") {
    JobOptions job;
    job.model = "m";
    const dp::protocol::FamilyArguments sd3 = dp::strategies::family_arguments("sd3");
    const dp::protocol::JobRequest q = two_step_request(sd3);
    nlohmann::json had = pending_record(q, 1, job, "fp32");
    CHECK(had["max_sequence_length"] == 256);
    CHECK_FALSE(had.contains("skip_guidance_layers"));  // none skipped: the skip settings change nothing
    CHECK_FALSE(had.contains("variant"));
    CHECK_FALSE(had.contains("no_t5"));
    CHECK(had["dtype"] == "fp32");

    // An older record (none of the new keys) equals a new one at the defaults.
    nlohmann::json older = had;
    older.erase("max_sequence_length");
    CHECK(pixel_setting_differences(older, had, &sd3).empty());

    dp::protocol::JobRequest r = q;
    r.arguments.set("max_sequence_length", int64_t{77});
    CHECK(pixel_setting_differences(had, pending_record(r, 1, job, "fp32"), &sd3) ==
          std::vector<std::string>{"max_sequence_length 256 (now 77)"});
    r = q;
    r.arguments.set("skip_layer_guidance_scale", 4.0);  // without skipped blocks: nothing changes
    CHECK(pixel_setting_differences(had, pending_record(r, 1, job, "fp32"), &sd3).empty());
    r.arguments.set("skip_guidance_layers", std::vector<int>{7, 8});
    CHECK(pixel_setting_differences(had, pending_record(r, 1, job, "fp32"), &sd3) ==
          std::vector<std::string>{"skip_guidance_layers [] (now [7,8])",
                                   "skip_layer_guidance_scale 2.8 (now 4.0)"});
    JobOptions other = job;
    other.variant = "fp16";
    other.no_t5 = true;
    CHECK(pixel_setting_differences(had, pending_record(q, 1, other, "bf16"), &sd3) ==
          std::vector<std::string>{"variant '' (now 'fp16')", "dtype 'fp32' (now 'bf16')",
                                   "no_t5 false (now true)"});
}

TEST_CASE(
    "--resume sees another adapter file, scale or set as other pixels, and no adapters are not recorded") {
    JobOptions job;
    job.model = "m";
    const dp::protocol::FamilyArguments flux = dp::strategies::family_arguments("flux");
    const dp::protocol::JobRequest q = two_step_request(flux);
    const nlohmann::json none = pending_record(q, 1, job, "fp32");
    CHECK_FALSE(none.contains("lora"));
    const std::string hash_a(64, 'a'), hash_b(64, 'b');
    dp::protocol::JobRequest r = q;
    r.arguments.set("lora", dp::protocol::Adapters{{"/m/style.safetensors", 0.8, hash_a}});
    const nlohmann::json with = pending_record(r, 1, job, "fp32");
    REQUIRE(with.contains("lora"));
    CHECK(with["lora"][0]["sha256"] == hash_a);
    CHECK(pixel_setting_differences(with, with, &flux).empty());
    CHECK(pixel_setting_differences(none, with, &flux).size() == 1);
    for (const dp::protocol::Adapters& other :
         {dp::protocol::Adapters{{"/m/style.safetensors", 0.8, hash_b}},  // the file changed
          dp::protocol::Adapters{{"/m/style.safetensors", 0.5, hash_a}},  // its scale
          dp::protocol::Adapters{{"/m/style.safetensors", 0.8, hash_a}, {"/m/b.safetensors", 1.0, hash_b}}}) {
        dp::protocol::JobRequest changed = q;
        changed.arguments.set("lora", other);
        const std::vector<std::string> d =
            pixel_setting_differences(with, pending_record(changed, 1, job, "fp32"), &flux);
        REQUIRE(d.size() == 1);
        CHECK(d[0].rfind("lora ", 0) == 0);
    }
}

TEST_CASE(
    "--dtype auto: bf16 on a GPU and on a CPU with bf16 instructions for a wide model, else fp32, as the "
    "devices the ranks get say") {
    JobOptions job;
    dp::strategies::ResolvedStrategy strategy;  // the job's device map and its plan, as resolved
    CHECK(job.dtype == "auto");
    job.device = "cpu";
    const int64_t narrow = 64, wide = 3072;  // a tiny test model's width; FLUX.1's
    CHECK(expected_dtype(job, strategy, narrow) == "fp32");
    const std::string rule =
        "auto: bf16 on a GPU, and on a CPU with bf16 instructions for a model 512 or more wide; else fp32; ";
    // Note [bf16 on a CPU that has it]: a wide model in bf16 where this CPU has the instructions.
    const std::string& bf16 = dp::strategies::cpu_bf16_instructions();
    CAPTURE(bf16);
    if (bf16.empty()) {
        CHECK(describe_dtype(job, strategy, narrow) ==
              rule + "fp32 here (--device cpu; the CPU has no bf16 instructions)");
        CHECK(expected_dtype(job, strategy, wide) == "fp32");
    } else {
        CHECK(describe_dtype(job, strategy, narrow) ==
              rule + "fp32 here (--device cpu; the model is 64 wide, under 512)");
        CHECK(expected_dtype(job, strategy, wide) == "bf16");
        CHECK(describe_dtype(job, strategy, wide) ==
              rule + "bf16 here (--device cpu; the CPU has " + bf16 + ", the model is 3072 wide)");
    }
    job.device = "cuda";
    CHECK(expected_dtype(job, strategy, narrow) == "bf16");
    strategy.device_map = "balanced";
    CHECK(expected_dtype(job, strategy, narrow) == "bf16");  // the visible GPUs' budgets
    dp::strategies::DeviceMapPlan plan;
    plan.devices = {"cpu:0", "cpu:1"};
    strategy.device_map_plan = plan;
    CHECK(expected_dtype(job, strategy, narrow) == "fp32");
    CHECK(expected_dtype(job, strategy, wide) == (bf16.empty() ? "fp32" : "bf16"));
    strategy.device_map_plan->devices = {"cuda:0", "cuda:1"};
    CHECK(expected_dtype(job, strategy, narrow) == "bf16");
    job.dtype = "fp16";
    CHECK(expected_dtype(job, strategy, wide) == "fp16");
    CHECK(describe_dtype(job, strategy, wide) == "fp16");
}

TEST_CASE("the bf16 instructions are read from cpuinfo's flags as whole words, AMX before AVX-512") {
    using dp::strategies::bf16_instructions;
    CHECK(bf16_instructions("").empty());
    CHECK(bf16_instructions("processor\t: 0\nflags\t\t: fpu avx2 fma\n").empty());
    CHECK(bf16_instructions("flags\t\t: fpu avx512f avx512_bf16 avx512_vnni\n") == "avx512_bf16");
    CHECK(bf16_instructions("flags\t: avx512_bf16 amx_bf16 amx_tile\nflags\t: avx512_bf16\n") == "amx_bf16");
    CHECK(bf16_instructions("flags\t: avx512_bf16x avx512_bf1\n").empty());  // whole words only
    CHECK(
        bf16_instructions("model name\t: avx512_bf16 in a name\nflags : sse\n").empty());  // flags lines only
    CHECK(bf16_instructions("flags avx512_bf16").empty());  // no colon: no flags
    CHECK(dp::strategies::auto_bf16_on_cpu("avx512_bf16", 512));
    CHECK_FALSE(dp::strategies::auto_bf16_on_cpu("avx512_bf16", 511));
    CHECK_FALSE(dp::strategies::auto_bf16_on_cpu("", 3072));
    // This machine's answer is what its /proc/cpuinfo says.
    std::ifstream in("/proc/cpuinfo");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const bool listed =
        text.find(" avx512_bf16") != std::string::npos || text.find(" amx_bf16") != std::string::npos;
    CHECK(dp::strategies::cpu_bf16_instructions().empty() == !listed);
}

TEST_CASE(
    "the model folder's components are checked before anything starts, T5 and dual attention included") {
    const std::string tiny = resolve_model("tiny-random-sd3", "--model");
    CHECK(problems(tiny).empty());
    const std::string model = tiny_with_t5("t5");
    CHECK_MESSAGE(problems(model).empty(), joined(problems(model)));
    // The shipped config-only folders of real models (T5, SD3.5's dual attention) pass as configs.
    for (const char* real : {"sd3-medium", "sd3.5-medium", "sd3.5-large"}) {
        CAPTURE(real);
        CHECK_MESSAGE(problems(resolve_model(real, "--model"), {"", false, true, {}}).empty(),
                      joined(problems(resolve_model(real, "--model"), {"", false, true, {}})));
    }

    fs::remove(model + "/tokenizer_3/spiece.model");
    CHECK(has(joined(problems(model)), model + "/tokenizer_3/spiece.model: cannot open"));
    CHECK(problems(model, {"", true, false, {}}).empty());         // --no-t5: T5 needs nothing
    std::ofstream(model + "/tokenizer_3/tokenizer.json") << "{}";  // as transformers 5 saves it: enough
    CHECK_MESSAGE(problems(model).empty(), joined(problems(model)));
    fs::remove(model + "/tokenizer_3/tokenizer.json");
    edit_json(model + "/model_index.json", [](auto& j) {
        j["tokenizer_3"] = {"transformers", "T5Whatever"};
    });
    CHECK(has(joined(problems(model)),
              "\"tokenizer_3\" is a T5Whatever; supported: T5TokenizerFast or T5Tokenizer "
              "(or run with --no-t5)"));
    edit_json(model + "/model_index.json", [](auto& j) { j["tokenizer_3"] = {nullptr, nullptr}; });
    CHECK(has(joined(problems(model)), "\"tokenizer_3\" is missing, but text_encoder_3 names a T5 encoder"));
    edit_json(model + "/model_index.json", [](auto& j) {
        j["tokenizer_3"] = {"transformers", "T5Tokenizer"};
    });
    std::ofstream(model + "/tokenizer_3/spiece.model") << "x";
    CHECK(problems(model).empty());
    edit_json(model + "/text_encoder_3/config.json", [](auto& j) { j["d_model"] = 4096; });
    CHECK(has(joined(problems(model)),
              "text_encoder_3/config.json: \"d_model\" is 4096 but the transformer's "
              "joint_attention_dim is 32"));
    CHECK(problems(model, {"", true, false, {}}).empty());

    edit_json(model + "/transformer/config.json", [](auto& j) { j["dual_attention_layers"] = {0, 1}; });
    CHECK(problems(model, {"", true, false, {}}).empty());  // supported now
    edit_json(model + "/transformer/config.json", [](auto& j) { j["dual_attention_layers"] = {0, 2}; });
    CHECK(has(joined(problems(model, {"", true, false, {}})),
              "\"dual_attention_layers\" is [0,2]; expected a list of distinct block indices from 0 to 1"));
    edit_json(model + "/transformer/config.json",
              [](auto& j) { j["dual_attention_layers"] = nlohmann::json::array(); });

    edit_json(model + "/model_index.json", [](auto& j) { j["vae"] = {"diffusers", "AutoencoderTiny"}; });
    CHECK(has(joined(problems(model, {"", true, false, {}})),
              "\"vae\" is a AutoencoderTiny; supported: AutoencoderKL"));
    edit_json(model + "/model_index.json", [](auto& j) { j["vae"] = {"diffusers", "AutoencoderKL"}; });
    fs::remove_all(model + "/vae");
    CHECK(has(joined(problems(model, {"", true, false, {}})),
              model + "/vae: missing (model_index.json names a AutoencoderKL there)"));
    edit_json(model + "/model_index.json", [](auto& j) {
        j.erase("text_encoder_2");
        j["vae"] = {nullptr, nullptr};
    });
    CHECK(joined(problems(model, {"", true, false, {}})) ==
          model +
              "/model_index.json: \"text_encoder_2\" is missing: StableDiffusion3Pipeline needs a "
              "CLIPTextModelWithProjection\n");
}

TEST_CASE(
    "weight variants in every component: only-variant folders name --variant, a missing variant names what "
    "is there") {
    const std::string base = scratch("variants");
    const std::string model = base + "/model";
    fs::copy(resolve_model("tiny-random-sd3", "--model"), model, fs::copy_options::recursive);
    for (const char* c : {"text_encoder", "text_encoder_2"})
        fs::rename(model + "/" + c + "/model.safetensors", model + "/" + c + "/model.fp16.safetensors");
    for (const char* c : {"transformer", "vae"})
        fs::rename(model + "/" + c + "/diffusion_pytorch_model.safetensors",
                   model + "/" + c + "/diffusion_pytorch_model.fp16.safetensors");
    const std::vector<std::string> plain = problems(model);
    REQUIRE(plain.size() == 4);
    CHECK(plain[0] ==
          model +
              "/text_encoder: only variant weights (fp16, e.g. NAME.fp16.safetensors), no plain ones; "
              "pass --variant fp16 to use them");
    CHECK(problems(model, {"fp16", false, false, {}}).empty());
    CHECK(problems(model, {"", false, true, {}}).empty());  // random weights read no weight files
    const std::vector<std::string> bf16 = problems(model, {"bf16", false, false, {}});
    REQUIRE(bf16.size() == 4);
    CHECK(has(bf16[0], "--variant bf16: " + model + "/text_encoder has no bf16 weights"));
    CHECK(has(bf16[0], "it has the variant(s) fp16"));

    // The job refuses before anything starts: no output folder is made.
    JobOptions job;
    job.model = model;
    job.prompts = "/dev/null";
    job.output_dir = base + "/out";
    dp::launcher::LaunchSpec launch;
    try {
        run_job(launch, job);
        FAIL("expected a refusal");
    } catch (const dp::protocol::ModelError& e) {
        CHECK(has(e.what(), "4 problems, found before anything started"));
        CHECK(has(e.what(), "pass --variant fp16"));
    }
    CHECK_FALSE(fs::exists(job.output_dir));
    job.arguments.set("skip_guidance_layers", std::vector<int>{9});
    job.variant = "fp16";
    CHECK_THROWS_WITH_AS(run_job(launch, job),
                         doctest::Contains("--skip-guidance-layers 9: block 9 is not one"),
                         dp::protocol::UsageError);
    CHECK_FALSE(fs::exists(job.output_dir));
}

TEST_CASE(
    "a component file for a component the model lacks is refused, naming it and the model's components") {
    const std::string dir = scratch("lacking");
    const std::string file = dp::test::write_st_file(dir + "/c.safetensors", {{"x.weight", {2, 2}}});
    struct Row {
        const char* model;
        const char* component;
        const char* flag;
        std::string says;
    };
    const std::vector<Row> rows = {
        {"shapes-sd3", "vae", "--vae",
         "(SD3) has no vae (its model_index.json names none); its components: text_encoder, text_encoder_2, "
         "transformer"},
        {"tiny-random-sd3", "text_encoder_3", "--text-encoder-3",
         "(SD3) has no text_encoder_3 (its model_index.json names none); its components: text_encoder, "
         "text_encoder_2, transformer, vae"},
        {"tiny-random-flux-dev", "text_encoder_3", "--text-encoder-3",
         "FLUX.1 has no text_encoder_3; its components: text_encoder, text_encoder_2, transformer, vae"},
    };
    for (const Row& row : rows) {
        CAPTURE(row.model);
        JobOptions job;
        job.model = resolve_model(row.model, "--model");
        job.component_files[row.component] = file;
        const dp::strategies::ModelInfo model = dp::strategies::read_model_info(job.model);
        CHECK_THROWS_WITH_AS(check_component_files(job.component_files, model, ""),
                             doctest::Contains((std::string(row.flag) + " " + file + ": ").c_str()),
                             dp::protocol::UsageError);
        CHECK_THROWS_WITH_AS(check_component_files(job.component_files, model, "", false),
                             doctest::Contains(row.says.c_str()), dp::protocol::UsageError);
        // The job refuses it before anything starts, as `plan` does (the same check).
        job.prompts = "/dev/null";
        job.output_dir = dir + "/out";
        CHECK_THROWS_WITH_AS(run_job(dp::launcher::LaunchSpec{}, job), doctest::Contains(row.says.c_str()),
                             dp::protocol::UsageError);
        CHECK_FALSE(fs::exists(job.output_dir));
    }
}

TEST_CASE("--no-t5 with T5's own file is refused: the file would be recorded and never read") {
    JobOptions job;
    job.model = tiny_with_t5("no_t5_file");
    const dp::strategies::ModelInfo model = dp::strategies::read_model_info(job.model);
    job.no_t5 = true;
    CHECK(job_setting_problems(job, model).empty());
    job.component_files["text_encoder_3"] = job.model + "/text_encoder_3/model.safetensors";
    const std::vector<std::string> bad = job_setting_problems(job, model);
    REQUIRE(bad.size() == 1);
    CHECK(has(bad[0], "--no-t5 and --text-encoder-3 " + job.model + "/text_encoder_3/model.safetensors: "));
    // A whole-pipeline file (--model FILE) that holds T5 is not a T5 file of the user's.
    job.model_file = job.component_files["text_encoder_3"];
    CHECK(job_setting_problems(job, model).empty());
}

TEST_CASE(
    "FLUX.2: three of the text encoder's hidden states must be the transformer's text width, klein's Qwen3 "
    "and dev's Mistral 3 (its text_config), and dev's tokenizer a PixtralProcessor") {
    for (const char* name : {"tiny-random-flux2-klein", "tiny-random-flux2-dev"}) {
        CAPTURE(name);
        const std::string model = scratch(name);
        fs::copy(resolve_model(name, "--model"), model, fs::copy_options::recursive);
        CHECK_MESSAGE(problems(model).empty(), joined(problems(model)));
        const bool dev = std::string(name).find("dev") != std::string::npos;
        edit_json(model + "/text_encoder/config.json",
                  [dev](auto& j) { (dev ? j["text_config"] : j)["hidden_size"] = 64; });
        CHECK(has(joined(problems(model)),
                  "text_encoder/config.json: \"hidden_size\" is 64 (x 3) but the transformer's "
                  "joint_attention_dim is 96 (three of its hidden states side by side are the transformer's "
                  "text)"));
    }
    const std::string model = scratch("pixtral");
    fs::copy(resolve_model("tiny-random-flux2-dev", "--model"), model, fs::copy_options::recursive);
    edit_json(model + "/model_index.json", [](auto& j) {
        j["tokenizer"] = {"transformers", "Qwen2Tokenizer"};
    });
    CHECK(has(joined(problems(model)), "\"tokenizer\" is a Qwen2Tokenizer; supported: PixtralProcessor"));
}
