// Every family through real dp-launch and dp-worker processes over Gloo, one row of rows() per model
// folder saved by diffusers: FLUX.1-dev and -schnell (models/tiny-random-flux-*), Qwen-Image
// (models/tiny-random-qwen-image), SD3 with its T5 encoder, SD3.5-medium's shape (dual attention,
// qk-norm, skip-layer guidance as a JSONL key) and SD3.5-large's (3 heads, so TP and Ulysses split
// the heads unevenly) from tests/data/golden. The golden cases given as JSONL lines give diffusers'
// PNGs (and final latents) and are recorded as given; bf16 is within the unit test's tolerance; every
// strategy gives the single-process images; the bytes each strategy sends are the closed-form ones;
// what a family does not take is refused before anything starts; and the family's defaults and flag
// names are recorded; and every sampler chosen per line gives diffusers' images at 1 and 3 ranks. A new
// family adds its rows.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "support/for_rows.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

using namespace dp::test;

namespace {

// A flag refused with exit code 2 before anything starts, its message saying `says`.
struct RefusedFlags {
    std::vector<std::string> flags;
    std::string says;
};
// A JSONL key refused as an invalid line (exit code 65): "p.jsonl:2: key 'KEY': " + `says`.
struct RefusedKey {
    std::string key;
    nlohmann::json value;
    std::string says;
};
// What a single-process run must have recorded for prompt `index`.
struct Recorded {
    std::size_t index;
    std::string key;
    nlohmann::json value;
};
// Rank 0's bytes per collective kind (DP_COMM_REPORT=1) under `flags`; and what `plan` prints with
// `plan` (when not empty).
struct CommCase {
    std::vector<std::string> flags;
    std::map<std::string, long long> bytes;
    std::vector<std::string> plan, plan_says;
};
// A prompt file's name and text.
struct PromptFile {
    std::string name, text;
};
// What `plan` says of device_map auto at `budgets` ("": not checked).
struct DeviceMapPlan {
    std::string budgets;
    std::vector<std::string> says;
};
// The job's flags by diffusers' names under each line's own keys: the records, key by key.
struct FlagsOverLines {
    std::vector<std::string> flags;
    std::string lines;
    std::vector<nlohmann::json> records;
};

// An input image of the golden edits (scripts/golden/golden_img2img.py), as an absolute path.
std::string edit_input(const std::string& name) { return std::string(DP_GOLDEN_DIR) + "/img2img/" + name; }

struct FamilyRow {
    FamilyRow(std::string name_, std::string model_, std::string golden_, std::string variant_,
              std::vector<std::vector<std::string>> golden_runs_, std::size_t images_, bool golden_latents_)
        : name(std::move(name_)),
          model(std::move(model_)),
          golden(std::move(golden_)),
          variant(std::move(variant_)),
          golden_runs(std::move(golden_runs_)),
          images(images_),
          golden_latents(golden_latents_) {}

    std::string name;
    std::string model;
    // diffusers' images: the golden file's cases of `variant` (where they name one) as JSONL lines,
    // under each of `golden_runs`; `images` of them; the final latents too when `golden_latents`.
    std::string golden, variant;
    std::vector<std::vector<std::string>> golden_runs;
    std::size_t images = 0;
    bool golden_latents = false;
    // The golden latents are tokens [N, C] of ours [C, h, w] (FLUX.2's, C channels); 0: as ours.
    std::size_t token_channels = 0;
    std::vector<std::string> stderr_says;  // what the golden job says (a cut prompt)
    // Keys no record of the family holds (other families'), and keys a line may give that the
    // family ignores and does not record.
    std::vector<std::string> absent, unrecorded;
    // bf16 within these bounds of diffusers' bf16 image (0: not checked).
    double bf16_mean = 0;
    int bf16_max = 0;
    // Every run of `runs` gives the single-process images of `prompts` (written to its file), with
    // `base` flags; the single-process records hold `single`. device_map auto at `budgets` splits
    // the blocks as `plan` says.
    std::vector<std::string> base;
    PromptFile prompts;
    std::vector<Recorded> single;
    std::vector<std::vector<std::string>> runs;
    // How far a run's final latents may be from the single process's (and its pixels at most 1).
    float latent_bound = 1e-4f;
    DeviceMapPlan device_map;
    std::vector<CommCase> (*bytes)(const std::string& model) = nullptr;
    std::vector<RefusedFlags> refused_flags;
    std::vector<RefusedKey> refused_keys;
    nlohmann::json defaults;  // a 16 x 16 image's record at the family's defaults (null: not run)
    FlagsOverLines flags_over_lines;
};

// The JSONL line of each image of the golden cases, with the tensor of diffusers' image and
// latents: a list under "cases" (image.I, latents.I), or named cases (NAME.image, or NAME.K.image
// for each prompt of "prompts"), bf16 the named case "bf16" or the list's first (image_bf16.0).
// Every second line gives the steps by diffusers' name, num_inference_steps.
struct GoldenLine {
    nlohmann::json line;
    std::string image, latents;
};
std::vector<GoldenLine> golden_lines(const FamilyRow& row, bool bf16) {
    const std::string file = std::string(DP_GOLDEN_DIR) + "/" + row.golden;
    const nlohmann::json all = nlohmann::json::parse(read_safetensors_metadata(file, "cases"));
    std::vector<GoldenLine> out;
    const auto absolute = [](const nlohmann::json& relative) {
        return std::string(DP_GOLDEN_DIR) + "/../../../" + relative.get<std::string>();
    };
    auto add = [&](nlohmann::json line, const std::string& key, const std::string& image,
                   const std::string& latents) {
        for (const char* meta : {"prompts", "seeds", "variant", "folder", "preset_expands_to"})
            line.erase(meta);
        if (!key.empty()) line["name"] = key;
        // An edit's inputs (repository-relative in the golden file), absolute; the size asked, of
        // which the pipeline makes the golden one (Note [output size]).
        for (const char* input : {"image", "mask_image"})
            if (line.contains(input)) line[input] = absolute(line.at(input));
        if (line.contains("adapters")) {  // golden_lora.py's form: the files under tests/data/golden/lora
            line["lora"] = nlohmann::json::array();
            for (const nlohmann::json& a : line.at("adapters"))
                line["lora"].push_back({{"path", "tests/data/golden/lora/" + a.at("file").get<std::string>()},
                                        {"scale", a.at("scale")}});
            line.erase("adapters");
        }
        line.erase("family");
        if (line.contains("lora"))  // its adapters' files, repository-relative
            for (nlohmann::json& adapter : line["lora"]) adapter["path"] = absolute(adapter.at("path"));
        if (line.contains("images")) {  // Qwen-Image-Edit-Plus's pictures (golden_qwen_edit.py)
            line["image"] = nlohmann::json::array();
            for (const nlohmann::json& picture : line.at("images"))
                line["image"].push_back(absolute(picture));
            if (line.value("positions", "") == "sequential") line["sequential_positions"] = 1;
            if (line.at("image").empty()) line.erase("image");  // FLUX.2's text to image
            for (const char* meta :
                 {"images",       "positions", "pipeline",     "default_width",    "default_height",
                  "do_true_cfg",  "grid_thw",  "noise_tokens", "reference_tokens", "tokens",
                  "text_lengths", "vae_sizes", "vl_sizes",     "out_width",        "out_height",
                  "image_tokens", "mu",        "is_distilled", "do_cfg",           "text_encoder_out_layers",
                  "chat_text",    "same_as",   "dtype"})
                line.erase(meta);
        }
        if (line.contains("width") && line.at("width").is_null()) {  // FLUX.2's: the first picture's size
            line.erase("width");
            line.erase("height");
        }
        for (const char* side : {"width", "height"})
            if (line.contains(std::string("asked_") + side)) {
                line[side] = line.at(std::string("asked_") + side);
                line.erase(std::string("asked_") + side);
            }
        if (out.size() % 2 == 1) {
            line["num_inference_steps"] = line.at("steps");
            line.erase("steps");
        }
        out.push_back({line, image, latents});
    };
    if (all.contains("cases") && all.at("cases").is_array()) {
        const nlohmann::json& list = all.at("cases");
        for (std::size_t i = 0; i < (bf16 ? 1 : list.size()); ++i)
            add(list[i], "", bf16 ? "image_bf16.0" : "image." + std::to_string(i),
                bf16 ? "latents_bf16.0" : "latents." + std::to_string(i));
        return out;
    }
    for (const auto& [name, c] : all.items()) {
        if ((name == "bf16") != bf16 ||
            (c.contains("variant") ? c.at("variant") != row.variant : !row.variant.empty()))
            continue;
        // A file of several folders' cases: the row's folder's pipeline cases only.
        if (!(c.contains("seed") || c.contains("seeds")) ||
            (c.contains("folder") && std::filesystem::path(c.at("folder").get<std::string>()).filename() !=
                                         std::filesystem::path(row.model).filename()))
            continue;
        // Several prompts: "prompts" and "seeds", or lists under "prompt" and "seed".
        const bool listed = c.contains("prompts") || c.at("prompt").is_array();
        if (!listed) {
            add(c, name, name + ".image", name + ".latents");
            continue;
        }
        const nlohmann::json& prompts = c.contains("prompts") ? c.at("prompts") : c.at("prompt");
        const nlohmann::json& seeds = c.contains("seeds") ? c.at("seeds") : c.at("seed");
        for (std::size_t k = 0; k < prompts.size(); ++k) {
            nlohmann::json line = c;
            line["prompt"] = prompts[k];
            line["seed"] = seeds[k];
            const std::string key = name + "." + std::to_string(k);
            add(line, key, key + ".image", key + ".latents");
        }
    }
    return out;
}

// A record against the line it came from: every call key as given (the steps under either name),
// what the family ignores left out, and no other family's keys.
void check_record(const FamilyRow& row, const nlohmann::json& record, const nlohmann::json& line) {
    CHECK(record.at("status") == "ok");
    for (const auto& [key, value] : line.items()) {
        if (key == "prompt" || key == "seed" || key == "name" || key == "width" || key == "height") continue;
        CAPTURE(key);
        if (key == "lora") {  // each adapter recorded by its file's real path, with its scale
            REQUIRE(record.at(key).size() == value.size());
            for (std::size_t k = 0; k < value.size(); ++k) {
                CHECK(record.at(key)[k].at("path") ==
                      std::filesystem::canonical(value[k].at("path").get<std::string>()).string());
                CHECK(record.at(key)[k].at("scale") == value[k].at("scale"));
            }
            continue;
        }
        if (key == "image" || key == "mask_image") {  // recorded with its SHA-256 and size, each picture
            const nlohmann::json pictures = value.is_array() ? value : nlohmann::json::array({value});
            const nlohmann::json held =
                record.at(key).is_array() ? record.at(key) : nlohmann::json::array({record.at(key)});
            REQUIRE(held.size() == pictures.size());
            for (std::size_t k = 0; k < pictures.size(); ++k)
                CHECK(held[k].at("path") ==
                      std::filesystem::canonical(pictures[k].get<std::string>()).string());
            continue;
        }
        if (std::find(row.unrecorded.begin(), row.unrecorded.end(), key) != row.unrecorded.end())
            CHECK_FALSE(record.contains(key));
        else if (key == "negative_prompt" && value.is_null() && row.defaults.contains("negative_prompt") &&
                 row.defaults.at("negative_prompt") == "")
            CHECK(record.at(key) == "");  // a guidance that needs no negative prompt takes "" for none
        else                              // a bool as the number it stands for
            CHECK(record.at(key == "num_inference_steps" ? "steps" : key) ==
                  (value.is_boolean() ? nlohmann::json(value.get<bool>() ? 1.0 : 0.0) : value));
    }
    for (const std::string& other : row.absent) CHECK_FALSE_MESSAGE(record.contains(other), other);
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

// Tokens [N, `channels`] as channels [`channels`, N] (FLUX.2's golden latents as ours); as they are
// with no channels.
std::vector<float> channels_first(const std::vector<float>& tokens, std::size_t channels) {
    if (channels == 0) return tokens;
    const std::size_t n = tokens.size() / channels;
    std::vector<float> out(tokens.size());
    for (std::size_t t = 0; t < n; ++t)
        for (std::size_t c = 0; c < channels; ++c) out[c * n + t] = tokens[t * channels + c];
    return out;
}

// The lists one after the other.
std::vector<std::string> joined(const std::vector<std::vector<std::string>>& lists) {
    std::vector<std::string> out;
    for (const std::vector<std::string>& list : lists) out.insert(out.end(), list.begin(), list.end());
    return out;
}

// The row's job with its `base` flags and `extra`, writing to `out`.
std::vector<std::string> args_for(const FamilyRow& row, const std::string& out,
                                  const std::vector<std::string>& extra, const std::string& prompts) {
    return joined({{"--model", row.model}, row.base, {"-o", out, "-q"}, extra, {prompts}});
}

// `path`, holding `text`.
std::string text_file(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

// `dp-launch plan --model MODEL FLAGS...` succeeds and prints each of `says`.
void check_plan(const FamilyRow& row, const std::vector<std::string>& flags,
                const std::vector<std::string>& says) {
    LaunchResult plan = run_launch(joined({{"plan", "--model", row.model}, flags}), {}, 30);
    REQUIRE_MESSAGE(plan.exit_code == 0, plan.err);
    for (const std::string& said : says) CHECK_MESSAGE(plan.out.find(said) != std::string::npos, plan.out);
}

std::string tiny(const std::string& name) { return std::string(DP_MODELS_DIR) + "/tiny-random-" + name; }
std::string golden_folder(const std::string& name) { return std::string(DP_GOLDEN_DIR) + "/" + name; }

// FLUX.1-dev's bytes (the tiny dev folder): H heads of d, width D = H d, L2 double and L1 single
// blocks, C = 64 features per packed token; 80 x 48 pixels give N = 15 image tokens; T5 pads the
// text to T = 13 tokens (FLUX has no text mask); one prompt, no true CFG, so a batch of B = 1, S steps.
std::vector<CommCase> flux_bytes(const std::string& model) {
    const nlohmann::json tc = nlohmann::json::parse(read_file(model + "/transformer/config.json"));
    const nlohmann::json t5 = nlohmann::json::parse(read_file(model + "/text_encoder_2/config.json"));
    const long long H = tc["num_attention_heads"], d = tc["attention_head_dim"], D = H * d;
    const long long L2 = tc["num_layers"], L1 = tc["num_single_layers"], L = L2 + L1, C = tc["in_channels"];
    const long long N = 15, T = 13, B = 1, S = 2, f = 4;
    // Ulysses U: both streams split and padded to U (N' = 16, T' = 14 for U = 2); per block q, k,
    // v out and the output back, 4 all-to-alls of B x H x (N' + T') / U x d, less the last block's
    // text output, which nothing needs (B x H x T' / U x d); at the end the image's tokens gathered
    // (B x N' / U x C). Nothing of the text is gathered: it is split throughout.
    const long long U = 2, Np = 16, Tp = 14;
    // Ring R: per block R - 1 sends of this rank's keys and values over the joint sequence.
    const long long R = 2;
    // TP P: a double block all-reduces after each stream's attention and MLP outputs, a single
    // block once after its one output projection, over text and image (the last one over the image
    // alone: its text feeds nothing); every modulation is gathered (B x 6D / P per double-block
    // stream, B x 3D / P per single block). T5 runs split too: per layer an all-reduce after
    // attention and after the feed-forward (T x d_model), once per prompt. plan says the same, for
    // the same job.
    const long long P = 2, dm = t5["d_model"], t5_layers = t5["num_layers"];
    const long long transformer_reduce = B * D * ((N + T) * (2 * L2 + L1) - T);
    return {{{"-n", "2", "--ulysses", "2"},
             {{"all_to_all", S * B * H * d * (4 * L * (Np + Tp) - Tp) / U * f},
              {"all_gather", S * B * (Np / U) * C * f}},
             {},
             {}},
            {{"-n", "2", "--ring", "2"},
             {{"send", S * L * 2 * (R - 1) * B * H * ((Np + Tp) / R) * d * f},
              {"all_gather", S * B * (Np / R) * C * f}},
             {},
             {}},
            {{"-n", "2", "--tp", "2"},
             {{"all_reduce", (S * transformer_reduce + 2 * t5_layers * T * dm) * f},
              {"all_gather", S * B * (2 * 6 * D * L2 + 3 * D * L1) / P * f}},
             {"-n", "2", "--tp", "2", "--dtype", "fp32", "--width", "80", "--height", "48",
              "--max-sequence-length", "13"},
             {"all_reduce: ", "(" + std::to_string(transformer_reduce * f) + ")"}}};
}

using Runs = std::vector<std::vector<std::string>>;
// Ulysses 2, Ring 3, USP (Ring 2 x Ulysses 2) and tp 2: every family's runs (the degrees divide
// no token count). Ring at degree 2 alone runs in the Ring tests (test_main_job.cpp) and in the
// tp 2 x Ring 2 and USP rows.
const Runs kContextAndTp = {{"-n", "2", "--ulysses", "2"},
                            {"-n", "3", "--ring", "3"},
                            {"-n", "4", "--ulysses", "2", "--ring", "2"},
                            {"-n", "2", "--tp", "2"}};
const std::vector<std::string> kTp2Ulysses2 = {"-n", "4", "--tp", "2", "--ulysses", "2"};
const std::vector<std::string> kTp2Ring2 = {"-n", "4", "--tp", "2", "--ring", "2"};
Runs with_runs(Runs runs, const Runs& more) {
    runs.insert(runs.end(), more.begin(), more.end());
    return runs;
}

const std::vector<std::string> kNotSd3 = {"skip_guidance_layers", "skip_layer_guidance_scale",
                                          "skip_layer_guidance_start", "skip_layer_guidance_stop", "no_t5"};

FamilyRow fill_row() {
    // FLUX.1-Fill (FluxFillPipeline): every line an image and its mask, the masked image's latents
    // and the mask beside the latents; no negative branch. 48 x 32 pixels: 6 tokens.
    FamilyRow fill{"FLUX.1-Fill", tiny("flux-fill"), "img2img_pipeline.safetensors", "fill", {{"-n", "1"}}, 2,
                   true};
    fill.absent = kNotSd3;
    fill.absent.push_back("true_cfg_scale");
    fill.base = {"--steps", "2", "--width", "48", "--height", "32", "--max-sequence-length", "13"};
    fill.prompts = {"p.jsonl", "{\"prompt\": \"an owl\", \"seed\": 1, \"image\": \"" +
                                   edit_input("in_48x32.png") + "\", \"mask_image\": \"" +
                                   edit_input("mask_24x16.png") +
                                   "\"}\n{\"prompt\": \"a door\", \"seed\": 2, \"strength\": 0.7, "
                                   "\"guidance_scale\": 10, \"image\": \"" +
                                   edit_input("in_37x23.jpg") + "\", \"mask_image\": \"" +
                                   edit_input("mask_24x16.png") + "\"}\n"};
    fill.runs = {
        {"-n", "2", "--ulysses", "2"}, {"-n", "2", "--ring", "2"}, {"-n", "2", "--tp", "2"}, {"-n", "3"}};
    fill.single = {{1, "strength", 0.7}, {0, "strength", 1.0}};  // FluxFillPipeline's default: 1
    fill.refused_flags = {{{"-n", "2", "--cfg-parallel"}, "has no negative guidance branch to split"},
                          {{"--true-cfg-scale", "2"}, "FLUX.1-Fill does not take true_cfg_scale"},
                          {{"--negative-prompt", "blurry"},
                           "FLUX.1-Fill's pipeline (FluxFillPipeline) takes no negative prompt"}};
    fill.refused_keys = {
        {"true_cfg_scale", 2.0, "FLUX.1-Fill does not take true_cfg_scale"},
        {"negative_prompt", "blurry", "FLUX.1-Fill's pipeline (FluxFillPipeline) takes no negative prompt"}};
    return fill;
}

FamilyRow kontext_row() {
    // FLUX.1-Kontext (FluxKontextPipeline): one file of text to image, an edit whose reference
    // (resized to 1248 x 832, 4056 tokens) follows the 6 latents' tokens, and an edit with true CFG;
    // the asked 48 x 32 at max_area 1536 is 48 x 32.
    FamilyRow kontext{"FLUX.1-Kontext",
                      tiny("flux-kontext"),
                      "img2img_pipeline.safetensors",
                      "kontext",
                      {{"-n", "1"}},
                      3,
                      true};
    kontext.absent = kNotSd3;
    kontext.absent.push_back("strength");
    kontext.base = {
        "--steps", "2", "--width", "48", "--height", "32", "--max-area", "1536", "--max-sequence-length",
        "13"};
    kontext.prompts = {"p.jsonl",
                       "{\"prompt\": \"a red fox\", \"seed\": 1}\n"
                       "{\"prompt\": \"make it winter\", \"seed\": 2, \"image\": \"" +
                           edit_input("in_48x32.png") +
                           "\"}\n{\"prompt\": \"add a hat\", \"negative_prompt\": \"blurry\", "
                           "\"true_cfg_scale\": 2.5, \"seed\": 3, \"image\": \"" +
                           edit_input("in_37x23.jpg") + "\"}\n"};
    kontext.runs = {{"-n", "2", "--ulysses", "2"},
                    {"-n", "2", "--ring", "2"},
                    {"-n", "2", "--tp", "2"},
                    {"-n", "2", "--cfg-parallel", "--true-cfg-scale", "2.5"},
                    {"-n", "3"}};
    kontext.single = {{0, "max_area", 1536}, {0, "width", 48}, {2, "true_cfg_scale", 2.5}};
    kontext.refused_flags = {{{"--strength", "0.5"}, "FLUX.1-Kontext does not take strength"}};
    kontext.refused_keys = {
        {"mask_image", edit_input("mask_24x16.png"), "FLUX.1-Kontext does not take mask_image"}};
    return kontext;
}

FamilyRow qwen_edit_row() {
    // Qwen-Image-Edit-Plus (QwenImageEditPlusPipeline): diffusers' images (a line with a
    // Qwen-Image adapter among them); two pictures of other sizes and ratios (1024 x 1024 and
    // 1312 x 800 for the VAE: 4096 + 4100 reference tokens after the 6 latents'), true CFG with
    // the negative prompt's own vision tokens, diffusers' sequential text positions on one line.
    // The first line's text (431 tokens after the template's 64) splits unevenly over 2 and 3.
    FamilyRow plus{"Qwen-Image-Edit-Plus",
                   tiny("qwen-image-edit-plus"),
                   "qwen_edit.safetensors",
                   "",
                   {{"-n", "1"}},
                   4,
                   true};
    plus.absent = kNotSd3;
    plus.absent.push_back("strength");
    plus.base = {"--steps", "2", "--width", "32", "--height", "48"};
    const std::string two =
        "[\"" + edit_input("in_32x32.png") + "\", \"" + edit_input("in_37x23.jpg") + "\"]";
    plus.prompts = {"p.jsonl",
                    "{\"prompt\": \"put the square into picture 2\", \"negative_prompt\": \"blurry\", "
                    "\"true_cfg_scale\": 3, \"seed\": 1, \"image\": " +
                        two +
                        "}\n{\"prompt\": \"make it night\", \"seed\": 2, "
                        "\"sequential_positions\": 1, \"image\": \"" +
                        edit_input("in_50x41.png") + "\"}\n"};
    plus.runs = {{"-n", "2", "--cfg-parallel"},
                 {"-n", "2", "--ulysses", "2"},
                 {"-n", "2", "--ring", "2"},
                 {"-n", "2", "--tp", "2"},
                 {"-n", "3"}};
    plus.single = {{0, "true_cfg_scale", 3.0}, {1, "sequential_positions", 1}, {1, "steps", 2}};
    plus.refused_flags = {{{"--strength", "0.5"}, "Qwen-Image-Edit-Plus does not take strength"}};
    plus.refused_keys = {
        {"mask_image", edit_input("mask_24x16.png"), "Qwen-Image-Edit-Plus does not take mask_image"}};
    return plus;
}

FamilyRow z_image_row() {
    // Z-Image (30 heads): diffusers' images (its peft adapter's line among them, and
    // cfg_normalization given as true, as diffusers takes it); Turbo's unguided lines beside guided
    // ones with cfg_normalization and cfg_truncation. Captions of 16 to 40 template tokens (32 or 64
    // with their pads) and 6 image tokens (32 with theirs): no stream divides 3, and 30 heads split
    // 8, 8, 7, 7 over Ulysses 4.
    FamilyRow z{"Z-Image", tiny("z-image"), "z_image_pipeline.safetensors", "", {{"-n", "1"}}, 13, true};
    z.absent = kNotSd3;
    z.absent.push_back("true_cfg_scale");
    z.stderr_says = {"max_sequence_length 20"};  // "cut" says what was dropped
    z.bf16_mean = 2.5, z.bf16_max = 16;          // the bounds of tests/unit/test_family_pipelines.cpp
    z.base = {"--steps", "2", "--width", "48", "--height", "32"};
    z.prompts = {
        "p.jsonl",
        "{\"prompt\": \"a red fox in the snow\", \"guidance_scale\": 0, \"seed\": 1}\n"
        "{\"prompt\": \"an old lighthouse on a rocky coast at dusk, waves and gulls, warm light in the "
        "windows\", \"negative_prompt\": \"blurry\", \"guidance_scale\": 4, \"cfg_normalization\": 1.2, "
        "\"seed\": 2}\n"
        "{\"prompt\": \"a bowl of ramen\", \"guidance_scale\": 3, \"cfg_truncation\": 0.2, "
        "\"num_inference_steps\": 4, \"seed\": 3}\n"};
    z.runs = {{"-n", "2", "--ulysses", "2"}, {"-n", "3", "--ring", "3"},    {"-n", "2", "--tp", "2"},
              {"-n", "2", "--cfg-parallel"}, {"-n", "4", "--ulysses", "4"}, {"-n", "3"}};
    z.single = {{0, "guidance_scale", 0.0},
                {1, "cfg_normalization", 1.2},
                {2, "cfg_truncation", 0.2},
                {2, "negative_prompt", ""}};
    z.refused_flags = {
        {{"--true-cfg-scale", "2"}, "Z-Image does not take true_cfg_scale"},
        {{"-n", "2", "--cfg-parallel", "--guidance-scale", "0"},
         "there is no guidance to split at a scale of 0 or less"},
        {{"--max-sequence-length", "513"}, "513 is more than Z-Image's pipeline accepts (1 to 512)"},
        {{"--width", "40"}, "multiples of 16"}};
    z.refused_keys = {{"cfg_truncation", 1.5, "expected a number from 0 to 1"},
                      {"cfg_normalization", "yes", "expected a number from 0 to 100, true (1) or false (0)"}};
    // ZImagePipeline's defaults: 50 steps, guidance 5 (a negative branch of ""), 512 tokens.
    z.defaults = {{"steps", 50},           {"guidance_scale", 5.0},      {"cfg_normalization", 0.0},
                  {"cfg_truncation", 1.0}, {"max_sequence_length", 512}, {"negative_prompt", ""}};
    return z;
}

// FLUX.2's reference pictures (scripts/golden/golden_flux2.py), as an absolute path.
std::string flux2_picture(const std::string& name) { return std::string(DP_GOLDEN_DIR) + "/flux2/" + name; }

// FLUX.2 klein (distilled, and -base with CFG) and dev (its guidance embedded): diffusers' images
// (text to image, a cut prompt, a batch, one and two reference pictures); a text line and a line of
// two reference pictures (70 x 66 and 84 x 100: 64 + 72 reference tokens after the 12 noise tokens)
// with the text cut to 70 tokens, so that no stream divides 2 or 3.
FamilyRow flux2_row(const std::string& name, const std::string& folder, const std::string& golden,
                    std::size_t images) {
    FamilyRow f{name, tiny(folder), golden, "", {{"-n", "1"}}, images, true};
    f.token_channels = 32;  // the tiny transformers' in_channels
    f.absent = kNotSd3;
    f.absent.insert(f.absent.end(), {"true_cfg_scale", "strength"});
    f.base = {"--steps", "2", "--width", "32", "--height", "24", "--max-sequence-length", "70"};
    const std::string two =
        "[\"" + flux2_picture("ref_70x66.png") + "\", \"" + flux2_picture("ref_84x100.jpg") + "\"]";
    f.prompts = {"p.jsonl",
                 "{\"prompt\": \"a red fox in the snow\", \"seed\": 1, \"guidance_scale\": 2.5}\n"
                 "{\"prompt\": \"put the square from the first picture into the second\", \"seed\": 2, "
                 "\"image\": " +
                     two + "}\n"};
    f.runs = {
        {"-n", "2", "--ulysses", "2"}, {"-n", "3", "--ring", "3"}, {"-n", "2", "--tp", "2"}, {"-n", "3"}};
    f.refused_flags = {
        {{"--true-cfg-scale", "2"}, name + " does not take true_cfg_scale"},
        {{"--max-sequence-length", "513"}, "513 is more than " + name + "'s pipeline accepts (1 to 512)"},
        {{"--width", "36"}, "multiples of 8"}};
    f.refused_keys = {{"mask_image", flux2_picture("ref_96x72.png"), name + " does not take mask_image"},
                      {"strength", 0.5, name + " does not take strength"}};
    return f;
}

std::vector<FamilyRow> flux2_rows() {
    // klein, distilled: guidance_scale ignored (not recorded), no negative branch to split.
    FamilyRow klein = flux2_row("FLUX.2-klein", "flux2-klein", "flux2_klein_pipeline.safetensors", 6);
    klein.unrecorded = {"guidance_scale"};
    klein.stderr_says = {"cut to max_sequence_length 40 tokens"};
    klein.bf16_mean = 2.7, klein.bf16_max = 36;  // the bounds of tests/unit/test_family_pipelines.cpp
    klein.refused_flags.push_back(
        {{"-n", "2", "--cfg-parallel"},
         "FLUX.2-klein runs no negative guidance branch (guidance_scale is ignored)"});
    klein.defaults = {{"steps", 50}, {"max_sequence_length", 512}};
    // Its peft adapter (scripts/golden/golden_lora.py) on a line of its own.
    klein.prompts.text += "{\"prompt\": \"a red fox in the snow\", \"seed\": 4, \"lora\": [{\"path\": \"" +
                          std::string(DP_GOLDEN_DIR) +
                          "/lora/flux2_klein_peft.safetensors\", \"scale\": 0.9}]}\n";
    klein.single = {{2, "seed", 4}};
    // klein -base: CFG above 1 with the negative prompt "" unless given; the guidance branches split.
    FamilyRow base =
        flux2_row("FLUX.2-klein-base", "flux2-klein-base", "flux2_klein_pipeline.safetensors", 3);
    base.runs.push_back({"-n", "2", "--cfg-parallel"});
    base.refused_flags.push_back({{"-n", "2", "--cfg-parallel", "--guidance-scale", "1"},
                                  "there is no guidance to split at a scale of 1 or less"});
    base.prompts.text +=
        "{\"prompt\": \"an old lighthouse\", \"negative_prompt\": \"blurry\", \"seed\": 3}\n";
    base.single = {{0, "guidance_scale", 2.5}, {1, "guidance_scale", 4.0}, {1, "negative_prompt", ""}};
    base.defaults = {
        {"steps", 50}, {"guidance_scale", 4.0}, {"max_sequence_length", 512}, {"negative_prompt", ""}};
    // dev: the guidance scale embedded, one branch.
    FamilyRow dev = flux2_row("FLUX.2-dev", "flux2-dev", "flux2_dev_pipeline.safetensors", 6);
    dev.stderr_says = {"cut to max_sequence_length 48 tokens"};
    dev.bf16_mean = 2.7, dev.bf16_max = 36;  // the bounds of tests/unit/test_family_pipelines.cpp
    dev.single = {{0, "guidance_scale", 2.5}, {1, "guidance_scale", 4.0}};
    dev.refused_flags.push_back({{"-n", "2", "--cfg-parallel"}, "has no negative guidance branch to split"});
    dev.refused_flags.push_back(
        {{"--negative-prompt", "blurry"}, "FLUX.2-dev's pipeline (Flux2Pipeline) takes no negative prompt"});
    dev.defaults = {{"steps", 50}, {"guidance_scale", 4.0}, {"max_sequence_length", 512}};
    return {klein, base, dev};
}

// Every sampler (Note [one scheduler table]) chosen per line in one job, against diffusers' images
// (scripts/golden/golden_scheduler_pipelines.py).
std::vector<FamilyRow> sampler_rows() {
    std::vector<FamilyRow> rows;
    // euler plain, Karras, stochastic and with the line's sigmas, heun, lcm, dpm++-2m, dpm++-2m-sde
    // and unipc on each folder; Qwen-Image's Heun with true CFG and its Lightning presets with their
    // adapter; FLUX.1's stochastic batch. SD3's at 3 ranks too (the others' strategies: the Heun and
    // DPM-Solver++ lines of their rows in rows()).
    for (const auto& [name, folder, images, ranks] :
         {std::tuple<const char*, const char*, std::size_t, const char*>{"SD3 samplers", "sd3", 9, "3"},
          {"FLUX.1-dev samplers", "flux-dev", 11, "1"},
          {"Qwen-Image samplers", "qwen-image", 12, "1"}}) {
        std::vector<std::vector<std::string>> runs = {{"-n", "1"}};
        if (std::string(ranks) != "1") runs.push_back({"-n", ranks});
        rows.push_back(
            FamilyRow{name, tiny(folder), "scheduler_pipelines.safetensors", "", runs, images, false});
    }
    return rows;
}

// Note [int8 compute]: --quantize int8 on FLUX.1-dev's lines (uneven streams, true CFG, an edit and
// an inpainting) gives one process's images under Ulysses and tp: a token's scale is its own,
// a row-parallel slice's scales are reduced over the group. The float work around the int8 products
// still differs in its last bits with the ranks' threads and sums, as in fp32, and int8's rounding
// can turn such a difference into one level of a token's value (1/127 of its largest): the latents
// move by up to 1e-2 where fp32's move by 1e-6, the pixels stay within 1.
std::vector<FamilyRow> int8_rows(const std::vector<FamilyRow>& rows) {
    std::vector<FamilyRow> out;
    for (const FamilyRow& row : rows) {
        if (row.name != "FLUX.1-dev") continue;
        FamilyRow q{row.name + " int8", row.model, "", "", {}, 0, false};
        q.base = row.base;
        q.base.insert(q.base.end(), {"--quantize", "int8"});
        q.prompts = row.prompts;
        q.single = {{0, "quantize", "int8"}};
        q.runs = {{"-n", "2", "--ulysses", "2"}, {"-n", "2", "--tp", "2"}};
        q.latent_bound = 2e-2f;
        out.push_back(q);
    }
    return out;
}

std::vector<FamilyRow> rows() {
    std::vector<FamilyRow> rows;

    FamilyRow dev{"FLUX.1-dev", tiny("flux-dev"), "flux_pipeline.safetensors", "dev", {{"-n", "1"}}, 7, true};
    dev.absent = kNotSd3;
    // The bounds of tests/unit/test_family_pipelines.cpp.
    dev.bf16_mean = 1.0, dev.bf16_max = 12;
    // Two prompts at 80 x 48 pixels (5 x 3 = 15 image tokens) with T5 cut to 13 tokens: neither
    // stream divides 2, 3 or 4. The second runs true CFG (a negative prompt, true_cfg_scale above
    // 1); the first has none, under --cfg-parallel too.
    dev.base = {"--steps", "2", "--width", "80", "--height", "48", "--max-sequence-length", "13"};
    dev.prompts = {
        "p.jsonl",
        "{\"prompt\": \"an owl on a branch\", \"seed\": 1, \"guidance_scale\": 4.0}\n"
        "{\"prompt\": \"a wooden door\", \"negative_prompt\": \"low quality\", \"true_cfg_scale\": 2.5, "
        "\"seed\": 2}\n"
        // An edit (Note [img2img in the one loop]): a 48 x 32 PNG resized to 80 x 48, strength 0.7,
        // then the same inpainted under a 24 x 16 mask.
        "{\"prompt\": \"an owl, in winter\", \"seed\": 3, \"strength\": 0.7, \"image\": \"" +
            edit_input("in_48x32.png") +
            "\"}\n"
            "{\"prompt\": \"an owl, at night\", \"seed\": 4, \"image\": \"" +
            edit_input("in_48x32.png") + "\", \"mask_image\": \"" + edit_input("mask_24x16.png") +
            "\"}\n"
            // ... and on the mask's region only (Note [padding_mask_crop]): made at 80 x 48, pasted
            // back into the 48 x 32 input.
            "{\"prompt\": \"an owl, a hat\", \"seed\": 5, \"padding_mask_crop\": 4, \"image\": \"" +
            edit_input("in_48x32.png") + "\", \"mask_image\": \"" + edit_input("mask_48x32.png") + "\"}\n"};
    // device_map auto at these budgets puts the embeddings and the two double blocks on cpu:0 and
    // the two single blocks on cpu:1.
    dev.device_map = {"cpu:0=1500KiB,cpu:1=2MiB",
                      {"transformer blocks 0-1 (with its embeddings and output head): cpu:0",
                       "transformer blocks 2-3: cpu:1"}};
    dev.runs =
        with_runs(kContextAndTp, {kTp2Ulysses2,
                                  kTp2Ring2,
                                  {"-n", "2", "--cfg-parallel", "--true-cfg-scale", "2.5"},
                                  {"-n", "1", "--device-map", "auto", "--max-memory", dev.device_map.budgets},
                                  {"-n", "1", "--offload"},
                                  {"-n", "3", "--strategy", "context"}});  // 4 heads: Ring over 3
    dev.single = {{0, "negative_prompt", nullptr}, {1, "true_cfg_scale", 2.5}};
    dev.bytes = &flux_bytes;
    dev.refused_flags = {
        {{"-n", "2", "--cfg-parallel"}, "FLUX.1's negative branch runs only with --true-cfg-scale above 1"},
        {{"--skip-guidance-layers", "1"}, "FLUX.1 does not take skip_guidance_layers"},
        {{"--no-t5"}, "--no-t5: FLUX.1's transformer takes T5's embeddings"},
        {{"--max-sequence-length", "513"}, "513 is more than FLUX.1's pipeline accepts (1 to 512)"},
        {{"--width", "40"}, "multiples of 16"}};
    dev.refused_keys = {{"skip_guidance_layers", {1}, "FLUX.1 does not take skip_guidance_layers"}};
    // FluxPipeline's defaults: 28 steps, guidance 3.5, 512 tokens.
    dev.defaults = {{"steps", 28},
                    {"max_sequence_length", 512},
                    {"true_cfg_scale", 1.0},
                    {"negative_prompt", nullptr},
                    {"guidance_scale", 3.5}};
    rows.push_back(dev);

    rows.push_back(fill_row());
    rows.push_back(kontext_row());
    rows.push_back(qwen_edit_row());
    rows.push_back(z_image_row());
    for (const FamilyRow& row : flux2_rows()) rows.push_back(row);

    // schnell has no guidance embedding: its guidance_scale changes nothing and is not recorded.
    FamilyRow schnell{"FLUX.1-schnell",
                      tiny("flux-schnell"),
                      "flux_pipeline.safetensors",
                      "schnell",
                      {{"-n", "1"}},
                      1,
                      true};
    schnell.absent = kNotSd3, schnell.unrecorded = {"guidance_scale"};
    schnell.base = {"--width", "80", "--height", "48"};
    schnell.prompts = {"p.txt", "a red fox in the snow\nthree green dots\n"};
    schnell.single = {{0, "steps", 4}};  // schnell's default
    schnell.runs = {{"-n", "2", "--ulysses", "2"},
                    kTp2Ring2,
                    {"-n", "1", "--device-map", "auto", "--max-memory", "cpu:0=1500KiB,cpu:1=2MiB"}};
    schnell.refused_flags = {
        {{"--skip-layer-guidance-scale", "2"}, "FLUX.1-schnell does not take skip_layer_guidance_scale"}};
    schnell.defaults = {
        {"steps", 4}, {"max_sequence_length", 256}, {"true_cfg_scale", 1.0}, {"negative_prompt", nullptr}};
    rows.push_back(schnell);

    FamilyRow qwen{"Qwen-Image", tiny("qwen-image"), "qwen_image_pipeline.safetensors", "", {{"-n", "1"}}, 4,
                   true};
    qwen.absent = kNotSd3;
    qwen.absent.push_back("guidance_scale");
    qwen.stderr_says = {"max_sequence_length 6"};  // "cut" says what was dropped
    // The bounds of tests/unit/test_family_pipelines.cpp (twice diffusers' own fp32-to-bf16 gap).
    qwen.bf16_mean = 3.1, qwen.bf16_max = 36;
    // Text lengths after the template (the prompt's own tokens plus the template's 16-token
    // suffix, by transformers' tokenizer of the tiny folder): "owl" 19, "a wooden door" 25 and its
    // "low quality" 23, "three cats asleep on a warm sofa" 37 cut to 29 and its "dull" 19, "a snowy
    // hill" 25 cut to 23 and its "" 16. At 44x28 the image is 11x7 = 77 tokens. Neither stream
    // divides 2, 3 or 4, so every split is uneven; the first prompt has no negative prompt, hence
    // no CFG, under cfg-parallel too.
    qwen.base = {"--steps", "2", "--width", "44", "--height", "28"};
    qwen.prompts = {
        "p.jsonl",
        "{\"prompt\": \"owl\", \"seed\": 1}\n"
        "{\"prompt\": \"a wooden door\", \"negative_prompt\": \"low quality\", \"seed\": 2}\n"
        "{\"prompt\": \"three cats asleep on a warm sofa\", \"negative_prompt\": \"dull\", \"seed\": 3, "
        "\"true_cfg_scale\": 2.5, \"max_sequence_length\": 29, \"num_inference_steps\": 3}\n"
        "{\"prompt\": \"a snowy hill\", \"negative_prompt\": \"\", \"seed\": 4, \"max_sequence_length\": "
        "23}\n"
        // An edit with true CFG: a 37 x 23 JPEG resized to 44 x 28.
        "{\"prompt\": \"a snowy hill, at night\", \"negative_prompt\": \"dull\", \"seed\": 5, \"image\": \"" +
            edit_input("in_37x23.jpg") +
            "\"}\n"
            // Samplers per line (Note [one scheduler table]): Heun's two passes a step with true CFG,
            // DPM-Solver++'s SDE drawing from each prompt's seed.
            "{\"prompt\": \"a red barn\", \"negative_prompt\": \"dull\", \"seed\": 6, \"scheduler\": "
            "\"heun\"}\n"
            "{\"prompt\": \"a blue lake\", \"seed\": 7, \"scheduler\": \"dpm++-2m-sde\", "
            "\"num_inference_steps\": "
            "3}\n"};
    // The transformer's embeddings and block 0 (0.21 MiB) on cpu:0 and block 1 on cpu:1.
    qwen.device_map = {
        "cpu:0=300KiB,cpu:1=1MiB",
        {"transformer block 0 (with its embeddings and output head): cpu:0", "transformer block 1: cpu:1"}};
    qwen.runs = with_runs(kContextAndTp,
                          {kTp2Ring2,
                           {"-n", "2", "--cfg-parallel"},
                           {"-n", "1", "--device-map", "auto", "--max-memory", qwen.device_map.budgets},
                           {"-n", "3", "--strategy", "context"}});
    qwen.single = {{0, "negative_prompt", nullptr},
                   {2, "steps", 3},
                   {5, "scheduler", "heun"},
                   {6, "scheduler", "dpm++-2m-sde"}};
    qwen.refused_flags = {{{"--guidance-scale", "5"}, "Qwen-Image does not take guidance_scale"},
                          {{"--skip-guidance-layers", "1"}, "Qwen-Image does not take skip_guidance_layers"},
                          {{"--no-t5"}, "--no-t5: Qwen-Image has no T5 text encoder"},
                          {{"--max-sequence-length", "1025"},
                           "--max-sequence-length '1025': expected a whole number from 1 to 1024"}};
    qwen.refused_keys = {{"guidance_scale", 5, "Qwen-Image does not take guidance_scale"},
                         {"scheduler", "eulr", "unknown scheduler 'eulr' (known: euler, heun, lcm"},
                         {"skip_guidance_layers", {1}, "Qwen-Image does not take skip_guidance_layers"}};
    // diffusers' defaults: 50 steps, true_cfg_scale 4.0, 512 tokens, no negative prompt.
    qwen.defaults = {
        {"steps", 50}, {"true_cfg_scale", 4.0}, {"max_sequence_length", 512}, {"negative_prompt", nullptr}};
    qwen.flags_over_lines = {
        {"--true-cfg-scale", "1.5", "--negative-prompt", "dull", "--num-inference-steps", "2",
         "--max-sequence-length", "64"},
        "{\"prompt\": \"a fox\"}\n"
        "{\"prompt\": \"a cat\", \"negative_prompt\": \"ugly\", \"num_inference_steps\": 3, "
        "\"true_cfg_scale\": 2}\n",
        {{{"steps", 2}, {"true_cfg_scale", 1.5}, {"negative_prompt", "dull"}, {"max_sequence_length", 64}},
         {{"steps", 3}, {"true_cfg_scale", 2.0}, {"negative_prompt", "ugly"}}}};
    rows.push_back(qwen);

    // The SD3 family: three prompts, plain, with a negative prompt, and with skip-layer guidance on
    // two of its steps; diffusers' images at dp 2 and at tp 2 x ulysses 2 (SD3.5-large's 3 heads
    // take tp 2 (2, 1) but not tp 2 x ulysses 2, where a rank would hold none: tp 2 x ring 2).
    const std::vector<std::string> sd3_base = {
        "--steps", "3", "--width", "12", "--height", "10", "--max-sequence-length", "24"};
    const std::string sd3_prompts =
        "{\"prompt\": \"a red circle on a blue background\"}\n"
        "{\"prompt\": \"a green square\", \"negative_prompt\": \"blurry\", \"seed\": 5}\n"
        "{\"prompt\": \"a yellow star\", \"skip_guidance_layers\": [1], \"skip_layer_guidance_stop\": 0.9}\n"
        "{\"prompt\": \"a green square, in winter\", \"seed\": 6, \"image\": \"" +
        edit_input("in_37x23.jpg") +
        "\"}\n"
        "{\"prompt\": \"a blue triangle\", \"negative_prompt\": \"blurry\", \"seed\": 7, \"scheduler\": "
        "\"heun\"}\n"
        "{\"prompt\": \"an orange moon\", \"seed\": 8, \"scheduler\": \"dpm++-2m\", \"scheduler_config\": "
        "{\"solver_order\": 3}}\n";
    const Runs every_strategy = with_runs(
        kContextAndTp, {kTp2Ulysses2,
                        {"-n", "2", "--cfg-parallel"},
                        {"-n", "1", "--device-map", "balanced", "--max-memory", "cpu:0=1GB,cpu:1=1GB"}});
    for (const char* folder : {"sd3_t5_tiny", "sd35_medium_tiny", "sd35_large_tiny"}) {
        const bool large = std::string(folder) == "sd35_large_tiny";
        FamilyRow sd3{folder,
                      golden_folder(folder),
                      std::string(folder) + ".safetensors",
                      "",
                      {{"-n", "2"}, {"-n", "4", "--tp", "2", large ? "--ring" : "--ulysses", "2"}},
                      std::string(folder) == "sd3_t5_tiny" ? 3u : 2u,
                      false};
        sd3.absent = {"true_cfg_scale"};
        sd3.base = sd3_base, sd3.prompts = {"p.jsonl", sd3_prompts};
        sd3.runs = every_strategy;
        // SD3.5-medium's own paths are in its blocks (dual attention, qk-norm): the sequence and
        // head splits and the guidance split; the rest is SD3's, run above.
        if (std::string(folder) == "sd35_medium_tiny")
            sd3.runs = {{"-n", "2", "--ulysses", "2"},
                        {"-n", "3", "--ring", "3"},
                        kTp2Ulysses2,
                        {"-n", "2", "--cfg-parallel"}};
        // SD3.5-large's odd head count: uneven TP and Ulysses head shards.
        if (large)
            sd3.runs = {{"-n", "2", "--tp", "2"},
                        {"-n", "2", "--ulysses", "2"},
                        {"-n", "4", "--ulysses", "2", "--ring", "2"},
                        {"-n", "2", "--strategy", "context"},
                        {"-n", "4", "--strategy", "context"},
                        {"-n", "4", "--tp", "2", "--cfg-parallel"}};
        rows.push_back(sd3);
    }
    const std::vector<FamilyRow> samplers = sampler_rows();
    rows.insert(rows.end(), samplers.begin(), samplers.end());
    const std::vector<FamilyRow> int8 = int8_rows(rows);
    rows.insert(rows.end(), int8.begin(), int8.end());
    return rows;
}

}  // namespace

TEST_CASE(
    "dp-launch on every family's folders saved by diffusers gives diffusers' images and records each line "
    "as given: FLUX.1-dev and -schnell, FLUX.1-Fill, FLUX.1-Kontext (text and edit lines in one file), "
    "Qwen-Image, SD3 + T5, SD3.5-medium and -large") {
    const auto golden = [](const FamilyRow& row) { return !row.golden.empty(); };  // not the int8 rows
    for_rows(rows(), golden, [](const FamilyRow& row) {
        const std::vector<GoldenLine> lines = golden_lines(row, false);
        REQUIRE(lines.size() == row.images);
        std::vector<nlohmann::json> jsonl;
        for (const GoldenLine& g : lines) jsonl.push_back(g.line);
        const std::string golden = std::string(DP_GOLDEN_DIR) + "/" + row.golden;
        for (const std::vector<std::string>& flags : row.golden_runs) {
            CAPTURE(flags);
            const std::string dir = make_temp_dir();
            const std::string prompts = write_lines(dir + "/p.jsonl", jsonl);
            LaunchResult r =
                run_launch(joined({{"--model", row.model, "-o", dir + "/out", "-q"}, flags, {prompts}}),
                           {{"DP_SAVE_LATENTS", "1"}}, 180);
            REQUIRE_MESSAGE(r.exit_code == 0, r.err);
            const auto records = read_manifest(dir + "/out");
            REQUIRE(records.size() == lines.size());
            for (const auto& record : records) {
                const GoldenLine& g = lines.at(record.at("index").get<std::size_t>());
                CAPTURE(g.image);
                check_record(row, record, g.line);
                const std::string file = dir + "/out/" + record.at("file").get<std::string>();
                const PixelDifference d = png_against_golden(file, golden, g.image);
                MESSAGE(row.name << " " << g.image << " through dp-launch: max |uint8 diff| " << d.max);
                CHECK(d.within_one >= 0.999);
                if (row.golden_latents)
                    CHECK(max_difference(read_latents(file + ".latents.safetensors"),
                                         channels_first(golden_f32(golden, g.latents), row.token_channels)) <=
                          1e-4f);
            }
            for (const std::string& says : row.stderr_says)
                CHECK_MESSAGE(r.err.find(says) != std::string::npos, says);
            remove_dir(dir);
        }
    });
}

TEST_CASE(
    "--dtype bf16 through dp-launch is within the unit test's tolerance of diffusers' bf16: FLUX.1, "
    "Qwen-Image") {
    for_rows(rows(), &FamilyRow::bf16_max, [](const FamilyRow& row) {
        const std::vector<GoldenLine> lines = golden_lines(row, true);
        REQUIRE(lines.size() == 1);
        const std::string dir = make_temp_dir();
        LaunchResult r = run_launch({"--model", row.model, "-n", "1", "--dtype", "bf16", "-o", dir + "/out",
                                     "-q", write_lines(dir + "/p.jsonl", {lines[0].line})},
                                    {}, 120);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto records = read_manifest(dir + "/out");
        REQUIRE(records.size() == 1);
        CHECK(records[0].at("dtype") == "bf16");
        const PixelDifference d =
            png_against_golden(dir + "/out/" + records[0].at("file").get<std::string>(),
                               std::string(DP_GOLDEN_DIR) + "/" + row.golden, lines[0].image);
        MESSAGE(row.name << " bf16 through dp-launch: mean |uint8 diff| " << d.mean << ", max " << d.max);
        CHECK(d.mean <= row.bf16_mean);
        CHECK(d.max <= row.bf16_max);
        remove_dir(dir);
    });
}

TEST_CASE(
    "every strategy gives the single-process images in every family: ulysses, ring, usp, tp, tp x "
    "sequence, cfg2, device_map, offload and context, on token counts the degrees do not divide") {
    // Every row with prompts of its own (the samplers' rows have only diffusers' golden lines).
    const auto has_prompts = [](const FamilyRow& row) { return !row.prompts.text.empty(); };
    for_rows(rows(), has_prompts, [](const FamilyRow& row) {
        if (!row.device_map.budgets.empty())
            check_plan(row, {"-n", "1", "--device-map", "auto", "--max-memory", row.device_map.budgets},
                       row.device_map.says);
        const std::string dir = make_temp_dir();
        const std::string prompts = text_file(dir + "/" + row.prompts.name, row.prompts.text);
        const std::map<std::string, std::string> env = {{"DP_SAVE_LATENTS", "1"}};
        LaunchResult one = run_launch(args_for(row, dir + "/single", {"-n", "1"}, prompts), env, 180);
        REQUIRE_MESSAGE(one.exit_code == 0, one.err);
        const auto single = read_manifest(dir + "/single");
        REQUIRE(single.size() ==
                static_cast<std::size_t>(std::count(row.prompts.text.begin(), row.prompts.text.end(), '\n')));
        for (const Recorded& s : row.single) CHECK(single.at(s.index).at(s.key) == s.value);
        for (const auto& extra : row.runs) {
            CAPTURE(extra);
            LaunchResult r = run_leaving_nothing(args_for(row, dir + "/run", extra, prompts), env, 180);
            REQUIRE_MESSAGE(r.exit_code == 0, r.err);
            const auto records = read_manifest(dir + "/run");
            REQUIRE(records.size() == single.size());
            for (std::size_t i = 0; i < single.size(); ++i) {
                const std::string file = single[i].at("file").get<std::string>();
                CAPTURE(file);
                CHECK(records[i].at("status") == "ok");
                CHECK(records[i].at("sha256").is_string());
                CHECK(max_pixel_difference(dir + "/single/" + file, dir + "/run/" + file) <= 1);
                CHECK(max_latent_difference(dir + "/single/" + file + ".latents.safetensors",
                                            dir + "/run/" + file + ".latents.safetensors") <=
                      row.latent_bound);
            }
            remove_dir(dir + "/run");
        }
        remove_dir(dir);
    });
}

TEST_CASE(
    "measured communication bytes per strategy equal the closed-form ones, and plan says the same: "
    "FLUX.1-dev") {
    for_rows(rows(), &FamilyRow::bytes, [](const FamilyRow& row) {
        const std::string dir = make_temp_dir();
        const std::string prompts = text_file(dir + "/p.txt", "one prompt\n");
        for (const CommCase& c : row.bytes(row.model)) {
            CAPTURE(c.flags);
            LaunchResult r =
                run_launch(args_for(row, dir + "/out", c.flags, prompts), {{"DP_COMM_REPORT", "1"}}, 120);
            REQUIRE_MESSAGE(r.exit_code == 0, r.err);
            remove_dir(dir + "/out");
            CHECK(reported_bytes(r.err, 0) == c.bytes);
            if (!c.plan.empty()) check_plan(row, c.plan, c.plan_says);
        }
        remove_dir(dir);
    });
}

TEST_CASE(
    "what a family does not take is refused before anything starts, naming the family and why: flags, "
    "and JSONL keys as invalid lines") {
    for_rows(rows(), every<FamilyRow>, [](const FamilyRow& row) {
        const std::string dir = make_temp_dir();
        const std::string text = text_file(dir + "/p.txt", "a red fox\n");
        for (const RefusedFlags& bad : row.refused_flags) {
            CAPTURE(bad.flags);
            LaunchResult r = run_launch(
                joined({{"--model", row.model, "-o", dir + "/out", "-q"}, bad.flags, {text}}), {}, 30);
            CHECK(r.exit_code == 2);
            CHECK_MESSAGE(r.err.find(bad.says) != std::string::npos, r.err);
            CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
        }
        // A JSONL key of another family is an invalid line (65 without --skip-invalid), naming the key.
        for (const RefusedKey& bad : row.refused_keys) {
            CAPTURE(bad.key);
            const nlohmann::json second = {{"prompt", "a cat"}, {bad.key, bad.value}};
            const std::string jsonl = write_lines(dir + "/p.jsonl", {{{"prompt", "a fox"}}, second});
            LaunchResult r = run_launch({"--model", row.model, "-o", dir + "/out", "-q", jsonl}, {}, 30);
            CHECK(r.exit_code == 65);
            CHECK_MESSAGE(r.err.find("p.jsonl:2: key '" + bad.key + "': " + bad.says) != std::string::npos,
                          r.err);
            CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
        }
        remove_dir(dir);
    });
}

TEST_CASE(
    "each family's defaults are diffusers' pipeline's, and the job's flags by diffusers' names give way "
    "to each line's keys: FLUX.1-dev (28 steps, guidance 3.5, 512 tokens), -schnell (4 steps, 256), "
    "Qwen-Image (50 steps, true_cfg_scale 4.0, 512 tokens)") {
    for_rows(rows(), &FamilyRow::defaults, [](const FamilyRow& row) {
        const std::string dir = make_temp_dir();
        const std::vector<std::string> small = {"--model", row.model, "--width", "16", "--height", "16"};
        LaunchResult r = run_launch(
            joined({small, {"-o", dir + "/defaults", "-q", text_file(dir + "/p.txt", "a red fox\n")}}), {},
            180);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto records = read_manifest(dir + "/defaults");
        REQUIRE(records.size() == 1);
        CHECK(records[0].at("status") == "ok");
        for (const auto& [key, value] : row.defaults.items()) CHECK_MESSAGE(records[0].at(key) == value, key);
        for (const auto& keys : {row.absent, row.unrecorded})
            for (const std::string& key : keys) CHECK_FALSE_MESSAGE(records[0].contains(key), key);

        const FlagsOverLines& f = row.flags_over_lines;
        if (!f.flags.empty()) {
            const std::string jsonl = text_file(dir + "/p.jsonl", f.lines);
            r = run_launch(joined({small, f.flags, {"-o", dir + "/flags", "-q", jsonl}}), {}, 120);
            REQUIRE_MESSAGE(r.exit_code == 0, r.err);
            const auto flagged = read_manifest(dir + "/flags");
            REQUIRE(flagged.size() == f.records.size());
            for (std::size_t i = 0; i < flagged.size(); ++i)
                for (const auto& [key, value] : f.records[i].items())
                    CHECK_MESSAGE(flagged[i].at(key) == value, key);
        }
        remove_dir(dir);
    });
}

TEST_SUITE_END();
