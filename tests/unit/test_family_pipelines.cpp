// Every family's whole pipeline against diffusers' (scripts/golden/), one row of rows() per model
// folder: FLUX.1-dev and FLUX.1-schnell (models/tiny-random-flux-*: dev at guidance 1, 3.5 and 7 at
// non-square sizes, a batch of two prompts, a prompt cut by max_sequence_length 16, true CFG with a
// negative prompt; schnell at 4 steps), Qwen-Image (models/tiny-random-qwen-image: with and
// without true CFG, prompts of different lengths, one cut by max_sequence_length), SD3 (two CLIP
// encoders, no T5), SD3 with its T5 encoder, SD3.5-medium's shape (dual attention, qk-norm) with and
// without skip-layer guidance and SD3.5-large's (an odd head count), tiny random folders saved by
// diffusers. The uint8 images may differ by at most 1 per channel (per pixel for SD3) on at least
// 99.9% of them, the final latents by at most 1e-4, and bf16 by the tolerance measured for the row;
// each row's warnings, the requests it refuses, a batch equal to each prompt alone, the negative
// branch only with a negative prompt, --offload, one step and the registry's pick. What one family
// alone has closes the file. A new family adds its rows.
#include "unit/doctest_torch.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/mistral_tokenizer.h"
#include "runtime/models/common/qwen2_tokenizer.h"
#include "runtime/models/flux/flux_pipeline.h"
#include "runtime/models/flux2/flux2_pipeline.h"
#include "runtime/models/qwen_image/qwen_image_pipeline.h"
#include "runtime/models/sd3/sd3_pipeline.h"
#include "runtime/models/z_image/z_image_pipeline.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/pipeline_common.h"
#include "strategies/family.h"
#include "support/for_rows.h"
#include "support/test_paths.h"
#include "unit/golden_request.h"

using namespace dp::runtime;
using dp::test::every;
using dp::test::for_rows;
using dp::test::golden_request;

namespace {

std::string tiny(const std::string& name) { return std::string(DP_MODELS_DIR) + "/tiny-random-" + name; }

// A request refused with a ModelError saying `says`: alone, or in a batch with `other` (not null).
struct Refused {
    nlohmann::json request, other;
    std::string says;
};

// The bounds of bf16 against diffusers' bf16.
struct Bf16Bounds {
    double mean = 0;  // mean |uint8 diff|
    int max = 0;      // max |uint8 diff|
    double latents = 0;
};

struct PipelineRow {
    PipelineRow(std::string name_, std::string model_, std::string golden_, std::string variant_ = "")
        : name(std::move(name_)),
          model(std::move(model_)),
          golden(std::move(golden_)),
          variant(std::move(variant_)) {}

    std::string name;
    std::string model;    // the folder
    std::string golden;   // its golden file, under tests/data/golden
    std::string variant;  // the file's cases of this variant, where they name one
    // What the registry loads for the folder: the family's class (and its variant's facts).
    bool (*picked)(const DiffusionPipeline&) = nullptr;
    // Whether the components are kept on their devices (false with --offload).
    bool (*kept)(const DiffusionPipeline&) = nullptr;
    int size_multiple = 0, default_width = 0;  // 0: not checked
    std::size_t images = 0;                    // the golden images of the row
    bool whole_pixels = false;                 // within 1 on every channel of a pixel, not per channel
    // The golden latents are tokens [h w, C] of ours [1, C, h, w] (FLUX.2's, patchified).
    bool token_latents = false;
    // The warnings of a case's images, as regular expressions; a case not named warns nothing.
    std::map<std::string, std::vector<std::string>> warnings;
    std::optional<Bf16Bounds> bf16;  // none: no bf16 case
    std::vector<Refused> refused;
    // Requests batched against each alone: latents within 1e-4, images within 1.
    std::vector<nlohmann::json> batch;
    // A request with a negative prompt and its guidance scale `scale` above 1: without the negative
    // prompt, or at scale 1, no negative branch runs (at scale 1 with a warning).
    nlohmann::json guided;
    std::string scale;
    nlohmann::json offload;  // a request run with and without --offload (null: none)
    std::string no_t5_says;  // --no-t5 refused, saying this ("": not refused here)
    // Packed latents: [B, C, H, W] of `seed` packs to `packed`; patch `patch` of batch `b` holds
    // channel 0's 2 x 2 pixels at (`row`, `col`) first (diffusers' order).
    std::vector<int64_t> pack_shape, packed;
    uint64_t pack_seed = 0;
    int64_t b = 0, patch = 0, row = 0, col = 0;

    PipelineOptions options() const {
        PipelineOptions o;
        o.model_dir = model;
        return o;
    }
    std::shared_ptr<SafetensorsFile> file() const { return SafetensorsFile::open(golden_path(golden)); }
};

// One image of a golden case: its request, and the tensors of diffusers' image and final latents.
struct GoldenImage {
    GenerateRequest request;
    std::string image, latents;
};
struct GoldenCase {
    std::string name;
    nlohmann::json call;
    std::vector<GoldenImage> images;
};

// The cases of a golden file's metadata: a list under "cases" (SD3's files: image.I, latents.I;
// bf16 the first case's image_bf16.0, latents_bf16.0), each an object or [prompt, negative_prompt,
// seed, steps, guidance_scale, width, height]; or named cases (NAME.image and NAME.latents, or
// NAME.K.* for each prompt of "prompts"), bf16 the one named "bf16".
std::vector<GoldenCase> golden_cases(const PipelineRow& row, bool bf16) {
    const nlohmann::json all = nlohmann::json::parse(row.file()->metadata().at("cases"));
    std::vector<GoldenCase> out;
    if (all.contains("cases") && all.at("cases").is_array()) {
        const nlohmann::json& list = all.at("cases");
        for (std::size_t i = 0; i < (bf16 ? 1 : list.size()); ++i) {
            nlohmann::json c = list[i];
            if (c.is_array())
                c = {{"prompt", c[0]},         {"negative_prompt", c[1]}, {"seed", c[2]},  {"steps", c[3]},
                     {"guidance_scale", c[4]}, {"width", c[5]},           {"height", c[6]}};
            const std::string n = std::to_string(i);
            out.push_back({n,
                           c,
                           {{golden_request(c), bf16 ? "image_bf16.0" : "image." + n,
                             bf16 ? "latents_bf16.0" : "latents." + n}}});
        }
        return out;
    }
    for (const auto& [name, c] : all.items()) {
        if ((name == "bf16") != bf16 || (c.contains("variant") && c.at("variant") != row.variant)) continue;
        if (c.contains("lora") || c.contains("adapters")) continue;  // an adapter's case: test_lora.cpp
        if (c.contains("folder") &&
            !std::filesystem::equivalent(dp::test::repository_path(c.at("folder").get<std::string>()),
                                         row.model))
            continue;  // a case of another folder (FLUX.2 klein's distilled and -base)
        GoldenCase g{name, c, {}};
        const std::vector<GenerateRequest> requests = dp::test::golden_requests(c);
        for (std::size_t k = 0; k < requests.size(); ++k) {
            const std::string key = c.contains("prompts") ? name + "." + std::to_string(k) : name;
            g.images.push_back({requests[k], key + ".image", key + ".latents"});
        }
        out.push_back(g);
    }
    return out;
}

// A request as JSON: a golden case's call ("case": its name; its first prompt) or the defaults
// below, with the other keys of `j` over it.
GenerateRequest request_of(const PipelineRow& row, const nlohmann::json& j) {
    nlohmann::json call = {{"prompt", "x"}, {"seed", 0}, {"steps", 1}, {"width", 32}, {"height", 32}};
    if (j.contains("case"))
        for (const GoldenCase& c : golden_cases(row, false))
            if (c.name == j.at("case")) call = c.call;
    if (call.contains("prompts")) {  // its first prompt
        call["prompt"] = call.at("prompts")[0];
        call["seed"] = call.at("seeds")[0];
    }
    for (const auto& [key, value] : j.items())
        if (key != "case") call[key] = value;
    return golden_request(call);
}

struct Difference {
    double within_one = 0;  // the share of channels (or pixels) within 1 of the reference
    double mean = 0;        // mean |uint8 difference|
    int max = 0;
    double latents = 0;  // max |final latent difference|
};

Difference against(const PipelineRow& row, const GenerateResult& out, const GoldenImage& g) {
    const auto file = row.file();
    const at::Tensor ref_image = load_tensor(file, g.image, at::kByte);
    // No latents (empty name): diffusers gives none with padding_mask_crop.
    const at::Tensor ref_latents = g.latents.empty() ? out.latents : load_tensor(file, g.latents, at::kFloat);
    REQUIRE(out.image.sizes() == ref_image.sizes());
    const at::Tensor diff = (out.image.to(at::kInt) - ref_image.to(at::kInt)).abs();
    Difference d;
    const at::Tensor within = row.whole_pixels ? diff.le(1).all(-1) : diff.le(1);
    d.within_one = within.to(at::kDouble).mean().item<double>();
    d.mean = diff.to(at::kDouble).mean().item<double>();
    d.max = diff.max().item<int>();
    const at::Tensor ours = row.token_latents ? out.latents.flatten(2).transpose(1, 2) : out.latents;
    d.latents = (ours.reshape(ref_latents.sizes()) - ref_latents).abs().max().item<double>();
    MESSAGE(row.name << " " << g.image << " (" << g.request.width << "x" << g.request.height << ", "
                     << g.request.steps << " steps): " << d.within_one * 100
                     << "% within 1, mean |uint8 diff| " << d.mean << ", max " << d.max
                     << ", max |latent diff| " << d.latents << " (latents up to "
                     << ref_latents.abs().max().item<double>() << ")");
    return d;
}

std::unique_ptr<DiffusionPipeline> load(const PipelineOptions& options) {
    return load_pipeline(options, ParallelContext::single());
}

template <class P>
bool components_kept(const DiffusionPipeline& p) {
    return dynamic_cast<const P&>(p).components_kept();
}
bool sd3_kept(const DiffusionPipeline& p) {
    try {
        (void)dynamic_cast<const Sd3Pipeline&>(p).transformer();  // InternalError when nothing is kept
        return true;
    } catch (const InternalError&) {
        return false;
    }
}
bool is_sd3(const DiffusionPipeline& p) { return dynamic_cast<const Sd3Pipeline*>(&p) != nullptr; }

std::vector<PipelineRow> rows() {
    std::vector<PipelineRow> rows;

    PipelineRow dev{"FLUX.1-dev", tiny("flux-dev"), "flux_pipeline.safetensors", "dev"};
    dev.picked = [](const DiffusionPipeline& p) {
        const auto* flux = dynamic_cast<const FluxPipeline*>(&p);
        return flux && flux->guidance_embeds();
    };
    dev.kept = &components_kept<FluxPipeline>;
    dev.size_multiple = 16;  // a VAE of scale 8, 2x2 patches
    dev.default_width = 1024;
    dev.images = 7;  // g1, g35, g7, batch (2), cut, true_cfg
    dev.warnings = {{"cut", {"`max_sequence_length` is set to 16 tokens"}}};
    // case g35, 48x80, 3 steps. diffusers' own bf16 image differs from its fp32 one by a mean
    // |uint8 diff| of 1.50, max 14, latents 0.52 (of values up to ~10); ours differs from
    // diffusers' bf16 by a mean of 0.30, max 5, latents 0.031 (98.6% of channels within 1), as
    // measured here. The bounds are two to three times that: the operations' order differs, and
    // bf16 keeps 8 bits.
    dev.bf16 = {1.0, 12, 0.1};
    dev.refused = {{{{"width", 40}}, nullptr, "multiples of 16"},
                   {{{"max_sequence_length", 0}}, nullptr, "max_sequence_length 0: must be 1 to 512"},
                   {{{"max_sequence_length", 513}}, nullptr, "max_sequence_length 513: must be 1 to 512"},
                   {{{"max_sequence_length", 8}},
                    {{"max_sequence_length", 8}, {"guidance_scale", 2.0}},
                    "must share steps, guidance_scale"}};
    dev.guided = {{"max_sequence_length", 8}, {"negative_prompt", "blurry"}, {"true_cfg_scale", 2.5}};
    dev.scale = "true_cfg_scale";
    dev.offload = {{"case", "true_cfg"}, {"steps", 2}};
    dev.no_t5_says = "--no-t5";
    dev.pack_shape = {2, 16, 6, 10}, dev.pack_seed = 5, dev.packed = {2, 15, 64};
    dev.b = 1, dev.patch = 1, dev.row = 0, dev.col = 2;  // the patch at row 0, column 1
    rows.push_back(dev);

    PipelineRow schnell{"FLUX.1-schnell", tiny("flux-schnell"), "flux_pipeline.safetensors", "schnell"};
    schnell.picked = [](const DiffusionPipeline& p) {
        const auto* flux = dynamic_cast<const FluxPipeline*>(&p);
        return flux && !flux->guidance_embeds();
    };
    schnell.kept = &components_kept<FluxPipeline>;
    schnell.size_multiple = 16, schnell.default_width = 1024;
    schnell.images = 1;  // at 4 steps
    rows.push_back(schnell);

    PipelineRow qwen{"Qwen-Image", tiny("qwen-image"), "qwen_image_pipeline.safetensors"};
    qwen.picked = [](const DiffusionPipeline& p) {
        return dynamic_cast<const QwenImagePipeline*>(&p) != nullptr;
    };
    qwen.kept = &components_kept<QwenImagePipeline>;
    qwen.size_multiple = 4;  // a VAE of one downsampling (2), 2x2 patches
    qwen.default_width = 256;
    qwen.images = 4;
    qwen.warnings = {
        {"cut", {"max_sequence_length 6", "^negative prompt: "}}};  // the prompt's and the negative's
    // This tiny model amplifies rounding (noise predictions scaled up so that its images are not
    // flat): diffusers' own bf16 image differs from its fp32 one by a mean |uint8 diff| of 1.54,
    // max 18, latents 0.88 (of values up to 40); ours differs from diffusers' bf16 by 2.03, max 20,
    // latents 1.56, as measured here. The bounds are twice diffusers' own fp32-to-bf16 gap: the
    // operations' order differs, and bf16 keeps 8 bits.
    qwen.bf16 = {3.1, 36, 1.8};
    qwen.refused = {{{{"width", 34}}, nullptr, "multiples of 4"},
                    {{{"max_sequence_length", 1025}}, nullptr, "must be 1 to 1024"},
                    {{{"max_sequence_length", 512}},
                     {{"max_sequence_length", 512}, {"negative_prompt", ""}},
                     "whether a negative prompt"}};
    // Prompts of different lengths, the second's negative prompt longer than its prompt.
    qwen.batch = {
        {{"case", "cfg"}, {"steps", 2}},
        {{"case", "cfg"},
         {"steps", 2},
         {"prompt", "a dog"},
         {"negative_prompt", "a long negative prompt that is longer than the positive one by many tokens"},
         {"seed", 9}}};
    qwen.guided = {{"case", "cfg"}, {"steps", 2}};
    qwen.scale = "true_cfg_scale";
    qwen.offload = {{"case", "cfg"}, {"steps", 2}};
    qwen.pack_shape = {2, 16, 6, 4}, qwen.pack_seed = 3, qwen.packed = {2, 6, 64};
    qwen.b = 0, qwen.patch = 2, qwen.row = 2, qwen.col = 0;  // the patch at row 1, column 0
    rows.push_back(qwen);

    // Z-Image: 30 heads, captions and images padded to 32 tokens with learnt pads, guidance_scale
    // above 0 with cfg_normalization and cfg_truncation, Turbo's unguided steps.
    PipelineRow z{"Z-Image", tiny("z-image"), "z_image_pipeline.safetensors"};
    z.picked = [](const DiffusionPipeline& p) { return dynamic_cast<const ZImagePipeline*>(&p) != nullptr; };
    z.kept = &components_kept<ZImagePipeline>;
    z.size_multiple = 16, z.default_width = 1024;
    z.images = 12;
    z.warnings = {{"cut", {"max_sequence_length 20"}}};
    z.refused = {{{{"width", 40}}, nullptr, "multiples of 16"},
                 {{{"max_sequence_length", 513}}, nullptr, "must be 1 to 512"}};
    // Captions of other padded lengths (7 and 40 tokens: 32 and 64 with their pads) in one batch.
    z.batch = {
        {{"case", "cfg"}, {"steps", 2}},
        {{"case", "cfg"},
         {"steps", 2},
         {"prompt", "an old lighthouse on a rocky coast at dusk, waves and gulls, warm light in the windows"},
         {"seed", 9}}};
    z.offload = {{"case", "cfg"}, {"steps", 2}};
    // case cfg, 48x32, 3 steps: diffusers' own bf16 image differs from its fp32 one by a mean
    // |uint8 diff| of 1.21, max 8, latents 0.084 (of values up to 4.2); ours from diffusers' bf16 by
    // 1.37, max 10, latents 0.099, as measured here. The bounds are twice diffusers' own gap.
    z.bf16 = {2.5, 16, 0.17};
    rows.push_back(z);

    // FLUX.2 klein, step-distilled (no guidance whatever the scale) and -base (CFG at 3 and 4, the
    // negative "" or a given negative prompt): text to image at square and non-square sizes, a
    // prompt cut at 40 tokens, a batch of two, one and two reference pictures (PNG and JPEG, their
    // centres cut, the output sized by the first).
    PipelineRow klein{"FLUX.2-klein", tiny("flux2-klein"), "flux2_klein_pipeline.safetensors"};
    klein.picked = [](const DiffusionPipeline& p) {
        return dynamic_cast<const Flux2Pipeline*>(&p) != nullptr;
    };
    klein.kept = &components_kept<Flux2Pipeline>;
    klein.size_multiple = 8;  // a VAE of scale 4, 2x2 patches
    klein.default_width = 512;
    klein.token_latents = true;
    // t2i in bf16 (32x32, 4 steps): diffusers' own bf16 image differs from its fp32 one by a mean
    // |uint8 diff| of 1.35, max 18, latents 0.081 (of values up to 9.1); ours differs from diffusers'
    // bf16 by a mean of 1.20, max 18, latents 0.063, as measured here. The bounds are twice
    // diffusers' own gap: the operations' order differs, and bf16 keeps 8 bits.
    klein.bf16 = {2.7, 36, 0.16};
    klein.images = 6;  // t2i, nonsquare, batch (2), ref1, ref2
    klein.warnings = {{"nonsquare", {"cut to max_sequence_length 40 tokens"}}};
    klein.refused = {
        {{{"width", 36}}, nullptr, "multiples of 8"},
        {{{"max_sequence_length", 513}}, nullptr, "max_sequence_length 513: must be 1 to 512"},
        {{{"case", "ref1"}, {"images", {"tests/data/golden/images/png_rgba8.png"}}},
         nullptr,
         "png_rgba8.png: 37 x 23 pixels; FLUX.2's reference pictures must be at least 64 pixels a side"}};
    klein.batch = {{{"case", "t2i"}, {"steps", 2}},
                   {{"case", "t2i"}, {"steps", 2}, {"prompt", "a dog"}, {"seed", 9}}};
    klein.offload = {{"case", "ref1"}, {"steps", 2}};
    rows.push_back(klein);
    PipelineRow klein_base{"FLUX.2-klein-base", tiny("flux2-klein-base"), "flux2_klein_pipeline.safetensors"};
    klein_base.picked = klein.picked;
    klein_base.kept = &components_kept<Flux2Pipeline>;
    klein_base.images = 3;  // cfg, cfg_negative, cfg_ref
    klein_base.token_latents = true;
    rows.push_back(klein_base);

    // FLUX.2 dev: Mistral 3's hidden states 10, 20, 30 of each prompt in its system template,
    // left-padded (the folder's padding_side), the guidance scale embedded at 4, 2.5 and 3; a
    // non-square size with the prompt cut at 48 tokens, a batch of two, a reference picture.
    PipelineRow dev2{"FLUX.2-dev", tiny("flux2-dev"), "flux2_dev_pipeline.safetensors"};
    dev2.picked = [](const DiffusionPipeline& p) {
        const auto* flux2 = dynamic_cast<const Flux2Pipeline*>(&p);
        return flux2 && flux2->model().spec->display_name == "FLUX.2-dev";
    };
    dev2.kept = &components_kept<Flux2Pipeline>;
    dev2.size_multiple = 8, dev2.default_width = 512;
    dev2.token_latents = true;
    dev2.images = 6;  // t2i, t2i_g25, nonsquare, ref1, batch (2)
    dev2.warnings = {{"nonsquare", {"cut to max_sequence_length 48 tokens"}}};
    // t2i in bf16 (32x32, 4 steps): diffusers' own bf16 image differs from its fp32 one by a mean
    // |uint8 diff| of 1.34, max 18, latents 0.11 (of values up to 7.1); ours from diffusers' bf16 by
    // a mean of 1.32, max 27, latents 0.063, as measured here. The bounds are twice diffusers' own gap.
    dev2.bf16 = {2.7, 36, 0.22};
    dev2.refused = {
        {{{"width", 36}}, nullptr, "multiples of 8"},
        {{{"max_sequence_length", 513}}, nullptr, "max_sequence_length 513: must be 1 to 512"},
        {{{"steps", 2}}, {{"steps", 2}, {"guidance_scale", 2.0}}, "must share"},
        {{{"case", "ref1"}, {"images", {"tests/data/golden/images/png_rgba8.png"}}},
         nullptr,
         "png_rgba8.png: 37 x 23 pixels; FLUX.2's reference pictures must be at least 64 pixels a side"}};
    dev2.batch = {{{"case", "t2i"}, {"steps", 2}},
                  {{"case", "t2i"}, {"steps", 2}, {"prompt", "a bowl of ramen with an egg"}, {"seed", 9}}};
    dev2.offload = {{"case", "ref1"}, {"steps", 2}};
    rows.push_back(dev2);

    // SD3 without T5: within 1 on every channel of 99.9% of the pixels.
    PipelineRow sd3{"SD3", golden_path("sd3_tiny"), "sd3_pipeline.safetensors"};
    sd3.picked = &is_sd3, sd3.kept = &sd3_kept;
    sd3.images = 3, sd3.whole_pixels = true;
    sd3.warnings = {{"1", {""}}};  // the long prompt, cut
    sd3.refused = {{{{"width", -32}}, nullptr, "positive multiples of 1"},
                   {{{"width", 48}}, nullptr, "position table"},  // 48 patches: more than the 40 x 40 table
                   {{{"steps", 3}}, {{"steps", 2}}, "must share"}};
    for (int k = 0; k < 4; ++k)
        sd3.batch.push_back({{"prompt", "prompt number " + std::to_string(k)},
                             {"negative_prompt", k % 2 ? "blurry" : ""},
                             {"seed", 100 + k},
                             {"steps", 3},
                             {"guidance_scale", 4.0},
                             {"width", 24},
                             {"height", 16}});
    rows.push_back(sd3);

    // The rest of the SD3 family: bf16 within twice the margin of what was measured on the three
    // folders (mean |uint8 diff| 0.33 to 0.50, max 2 to 4, final latents within 0.0625 of values up
    // to 4.4, two bf16 steps there): the operations' order differs, and bf16 keeps 8 bits.
    const Bf16Bounds sd3_bf16{1.0, 8, 0.125};
    PipelineRow t5{"SD3 with T5", golden_path("sd3_t5_tiny"), "sd3_t5_tiny.safetensors"};
    t5.picked = &is_sd3, t5.kept = &sd3_kept;
    t5.images = 3;
    t5.warnings = {{"1", {"`max_sequence_length` is set to 16 tokens"}}};  // an over-long prompt, truncated
    t5.bf16 = sd3_bf16;
    t5.refused = {{{{"max_sequence_length", 513}}, nullptr, "must be 1 to 512"}};
    // With T5 and skip-layer guidance, so that every component and the transformer's second use run.
    t5.offload = {{"case", "0"}, {"skip_guidance_layers", {1}}, {"skip_layer_guidance_stop", 0.9}};
    rows.push_back(t5);
    PipelineRow medium{"SD3.5-medium", golden_path("sd35_medium_tiny"), "sd35_medium_tiny.safetensors"};
    medium.picked = &is_sd3, medium.kept = &sd3_kept;
    medium.images = 2;  // with and without skip-layer guidance
    medium.bf16 = sd3_bf16;
    rows.push_back(medium);
    PipelineRow large{"SD3.5-large", golden_path("sd35_large_tiny"), "sd35_large_tiny.safetensors"};
    large.picked = &is_sd3, large.kept = &sd3_kept;
    large.images = 2;
    large.bf16 = sd3_bf16;
    rows.push_back(large);
    return rows;
}

}  // namespace

TEST_CASE(
    "every family's pipeline gives diffusers' images and latents: FLUX.1-dev (guidance, batch, cut text, "
    "true CFG) and -schnell, Qwen-Image (with and without true CFG), SD3, SD3 + T5, SD3.5-medium and "
    "-large") {
    for_rows(rows(), every<PipelineRow>, [](const PipelineRow& row) {
        const auto pipeline = load(row.options());
        CHECK(row.picked(*pipeline));
        if (row.size_multiple) CHECK(pipeline->size_multiple() == row.size_multiple);
        if (row.default_width) CHECK(pipeline->default_width() == row.default_width);
        std::size_t checked = 0;
        for (const GoldenCase& c : golden_cases(row, false)) {
            CAPTURE(c.name);
            std::vector<GenerateRequest> requests;
            for (const GoldenImage& g : c.images) requests.push_back(g.request);
            const std::vector<GenerateResult> out = pipeline->generate_batch(requests);
            REQUIRE(out.size() == c.images.size());
            const auto said = row.warnings.find(c.name);
            const std::vector<std::string> warnings =
                said == row.warnings.end() ? std::vector<std::string>{} : said->second;
            for (std::size_t k = 0; k < out.size(); ++k) {
                CHECK_MESSAGE(out[k].error.empty(), out[k].error);
                const Difference d = against(row, out[k], c.images[k]);
                CHECK(d.within_one >= 0.999);
                CHECK(d.latents <= 1e-4);
                REQUIRE(out[k].warnings.size() == warnings.size());
                for (std::size_t w = 0; w < warnings.size(); ++w)
                    CHECK_MESSAGE(std::regex_search(out[k].warnings[w], std::regex(warnings[w])),
                                  out[k].warnings[w]);
                ++checked;
            }
        }
        CHECK(checked == row.images);
    });
}

// Note [img2img in the one loop]: each golden edit (scripts/golden/golden_img2img.py) names its
// folder, its input and its call; one request at a time, as diffusers ran them.
TEST_CASE(
    "edits give diffusers' images: img2img and inpainting (and on the mask's region, padding_mask_crop) on "
    "SD3, FLUX.1-dev and Qwen-Image, FLUX.1-Fill, Qwen-Image-Edit and Edit-Plus (two pictures of other "
    "sizes and ratios, true CFG, 2511's zero_cond_t, both kinds of text positions), "
    "FLUX.1-Kontext (and its text to image, its size scaled to max_area), PNG and JPEG inputs at the "
    "output size and resized, masks resized and binarized, strength 0.5 to 1") {
    std::map<std::string, std::unique_ptr<DiffusionPipeline>> loaded;
    std::set<std::string> folders;
    int checked = 0;
    // Qwen-Image-Edit's and Edit-Plus's cases (golden_qwen_edit.py) name their pictures in "images".
    for (const char* golden : {"img2img_pipeline.safetensors", "qwen_edit.safetensors"}) {
        const auto file = SafetensorsFile::open(golden_path(golden));
        const nlohmann::json cases = dp::test::golden_cases(file);
        for (const auto& [name, c] : cases.items()) {
            CAPTURE(name);
            // The processor's, the tower's and the text encoder's cases; an adapter's through dp-launch
            // (test_family_strategies).
            if (!c.contains("seed") || c.contains("lora")) continue;
            const std::string folder = dp::test::repository_path(c.at("folder").get<std::string>());
            if (!loaded.count(folder)) {
                PipelineOptions options;
                options.model_dir = folder;
                loaded[folder] = load(options);
            }
            const GenerateRequest request = golden_request(c);
            if (c.contains("asked_width")) {  // Note [output size]: the size made of the size asked
                const dp::strategies::ModelInfo model = dp::strategies::read_model_info(folder);
                const dp::strategies::FamilyFacts& facts = dp::strategies::facts_of(*model.spec);
                const auto asked = std::pair<int64_t, int64_t>{c.at("asked_width"), c.at("asked_height")};
                const auto made = facts.output_size
                                      ? facts.output_size(asked.first, asked.second,
                                                          model.arguments.completed(request.arguments),
                                                          model.sizes.multiple())
                                      : asked;
                CHECK(made == std::pair<int64_t, int64_t>{request.width, request.height});
            }
            const GenerateResult out = loaded[folder]->generate(request);
            CHECK_MESSAGE(out.error.empty(), out.error);
            PipelineRow row{name, folder, golden};
            const bool latents = !c.contains("padding_mask_crop");  // diffusers makes none then
            const Difference d =
                against(row, out, {request, name + ".image", latents ? name + ".latents" : ""});
            CHECK(d.within_one >= 0.999);
            CHECK(d.latents <= 1e-4);
            folders.insert(folder);
            ++checked;
        }
    }
    CHECK(checked == 21 + 7);
    CHECK(folders.size() == 6 + 3);
}

TEST_CASE(
    "every family's pipeline in bf16 gives diffusers' bf16 image within the tolerance measured for it") {
    for_rows(rows(), &PipelineRow::bf16, [](const PipelineRow& row) {
        PipelineOptions options = row.options();
        options.dtype = at::kBFloat16;
        const std::vector<GoldenCase> cases = golden_cases(row, true);
        REQUIRE(cases.size() == 1);
        const GoldenImage& g = cases[0].images.at(0);
        const Difference d = against(row, load(options)->generate(g.request), g);
        CHECK(d.mean <= row.bf16->mean);
        CHECK(d.max <= row.bf16->max);
        CHECK(d.latents <= row.bf16->latents);
    });
}

TEST_CASE("requests a family's pipeline cannot take are refused by name, alone or in a batch") {
    for_rows(rows(), &PipelineRow::refused, [](const PipelineRow& row) {
        const auto pipeline = load(row.options());
        for (const Refused& bad : row.refused) {
            CAPTURE(bad.says);
            std::vector<GenerateRequest> batch = {request_of(row, bad.request)};
            if (!bad.other.is_null()) batch.push_back(request_of(row, bad.other));
            CHECK_THROWS_WITH_AS(pipeline->generate_batch(batch), doctest::Contains(bad.says.c_str()),
                                 ModelError);
        }
    });
}

TEST_CASE(
    "a batch gives each prompt its own image, as one at a time: Qwen-Image's texts of different "
    "lengths, SD3") {
    for_rows(rows(), &PipelineRow::batch, [](const PipelineRow& row) {
        const auto pipeline = load(row.options());
        std::vector<GenerateRequest> batch;
        for (const nlohmann::json& r : row.batch) batch.push_back(request_of(row, r));
        const std::vector<GenerateResult> together = pipeline->generate_batch(batch);
        REQUIRE(together.size() == batch.size());
        int identical = 0, worst = 0;
        for (std::size_t k = 0; k < batch.size(); ++k) {
            CAPTURE(k);
            const GenerateResult alone = pipeline->generate(batch[k]);
            const int diff =
                (alone.image.to(at::kInt) - together[k].image.to(at::kInt)).abs().max().item<int>();
            worst = std::max(worst, diff);
            identical += diff == 0;
            CHECK(diff <= 1);
            CHECK(max_diff(together[k].latents, alone.latents) <= 1e-4);
        }
        MESSAGE(row.name << ": batch of " << batch.size() << " vs one at a time: " << identical
                         << " images identical, max |uint8 diff| " << worst);
    });
}

TEST_CASE(
    "the negative branch runs only with a negative prompt and the guidance scale above 1: FLUX.1, "
    "Qwen-Image") {
    for_rows(rows(), &PipelineRow::guided, [](const PipelineRow& row) {
        const auto pipeline = load(row.options());
        const GenerateRequest guided = request_of(row, row.guided);
        REQUIRE(guided.negative_prompt);
        REQUIRE(guided.arguments.number(row.scale) > 1);
        // No negative prompt: one forward per step whatever the scale; a scale of 1 or less: none
        // either, with a warning that the negative prompt does nothing.
        GenerateRequest plain = guided, unguided = guided;
        plain.negative_prompt.reset();
        unguided.arguments.set(row.scale, 1.0);
        const GenerateResult g = pipeline->generate(guided), p = pipeline->generate(plain),
                             u = pipeline->generate(unguided);
        CHECK(at::equal(p.latents, u.latents));
        CHECK(max_diff(p.latents, g.latents) > 1e-2);
        CHECK(p.warnings.empty());
        REQUIRE(u.warnings.size() == 1);
        CHECK(u.warnings[0].find("classifier-free guidance runs only above 1") != std::string::npos);
    });
}

TEST_CASE(
    "--offload: each component built when it runs and freed after, the same images, and not with "
    "training") {
    for_rows(rows(), &PipelineRow::offload, [](const PipelineRow& row) {
        PipelineOptions options = row.options();
        const auto kept = load(options);
        options.offload = true;
        const auto offloaded = load(options);
        CHECK(row.kept(*kept));
        CHECK_FALSE(row.kept(*offloaded));
        const GenerateRequest r = request_of(row, row.offload);
        const GenerateResult a = kept->generate(r), b = offloaded->generate(r);
        CHECK(at::equal(a.latents, b.latents));
        CHECK(at::equal(a.image, b.image));
        options.trainable = true;
        CHECK_THROWS_WITH_AS(load(options), doctest::Contains("not with training"), ModelError);
    });
}

TEST_CASE("packed latents round-trip in diffusers' patch order: FLUX.1's and Qwen-Image's shapes") {
    for_rows(rows(), &PipelineRow::pack_shape, [](const PipelineRow& row) {
        const at::Tensor x = seeded(row.pack_shape, row.pack_seed);
        const at::Tensor packed = pack_latents(x);
        CHECK(packed.sizes() == at::IntArrayRef(row.packed));
        CHECK(at::equal(unpack_latents(packed, row.pack_shape[2], row.pack_shape[3]), x));
        // The patch holds channel 0's 2x2 pixels first.
        CHECK(at::equal(packed[row.b][row.patch].narrow(0, 0, 4),
                        x[row.b][0].narrow(0, row.row, 2).narrow(1, row.col, 2).reshape({4})));
    });
}

TEST_CASE(
    "one step makes an image in every family (diffusers' terminal stretch gives NaN there for Qwen-Image)") {
    for_rows(rows(), every<PipelineRow>, [](const PipelineRow& row) {
        const GenerateResult out = load(row.options())->generate(request_of(row, {{"prompt", "a cat"}}));
        CHECK_MESSAGE(out.error.empty(), out.error);
        CHECK(at::isfinite(out.latents).all().item<bool>());
    });
}

TEST_CASE("--no-t5 is refused by a family whose transformer takes T5's embeddings: FLUX.1") {
    for_rows(rows(), &PipelineRow::no_t5_says, [](const PipelineRow& row) {
        PipelineOptions options = row.options();
        options.no_t5 = true;
        CHECK_THROWS_WITH_AS(load(options), doctest::Contains(row.no_t5_says.c_str()), ModelError);
    });
}

// What one family alone has.

TEST_CASE("FLUX.1: the prompt embeddings are CLIP's pooled output and T5's padded sequence") {
    PipelineOptions options;
    options.model_dir = tiny("flux-schnell");
    const auto pipeline = FluxPipeline::load(options);
    const FluxPromptEmbeddings e = pipeline->encode_prompts({"a cat", "a dog on a sofa"}, 24);
    CHECK(e.sequence.sizes() == at::IntArrayRef({2, 24, 32}));
    CHECK(e.pooled.sizes() == at::IntArrayRef({2, 32}));
    // Each prompt's embeddings are its own, whatever else is in the batch.
    const FluxPromptEmbeddings alone = pipeline->encode_prompts({"a dog on a sofa"}, 24);
    CHECK(max_diff(e.sequence[1], alone.sequence[0]) <= 1e-5);
    CHECK(max_diff(e.pooled[1], alone.pooled[0]) <= 1e-5);
}

TEST_CASE(
    "FLUX.2-klein: each prompt in Qwen3's template without thinking, padded to max_sequence_length, hidden "
    "states 9, 18 and 27 of every token side by side, as diffusers encodes it") {
    PipelineOptions options;
    options.model_dir = tiny("flux2-klein");
    const auto pipeline = Flux2Pipeline::load(options);
    const auto file = SafetensorsFile::open(golden_path("flux2_klein_pipeline.safetensors"));
    const nlohmann::json cases = dp::test::golden_cases(file);
    // The case cut at 40 tokens (template tail included): its embeddings, every one of the 40.
    const std::string prompt = cases.at("nonsquare").at("prompts")[0];
    const Conditioning cut = pipeline->encode_prompts({prompt}, 40);
    const at::Tensor expected = load_tensor(file, "nonsquare.prompt_embeds", at::kFloat);
    REQUIRE(cut.text.sizes() == at::IntArrayRef({1, 40, expected.size(1)}));
    CHECK_FALSE(cut.mask.defined());
    const double diff = max_diff(cut.text[0], expected);
    MESSAGE("nonsquare prompt embeddings: max |diff| " << diff);
    CHECK(diff <= 1e-4);
    REQUIRE(cut.warnings.size() == 1);
    CHECK(cut.warnings[0].find("cut to max_sequence_length 40") != std::string::npos);
    // A short prompt padded to 512: its tokens, then pads, as the tokenizer makes them.
    const Qwen2Tokenizer tokenizer = Qwen2Tokenizer::from_folder(tiny("flux2-klein") + "/tokenizer");
    const std::vector<int64_t> ids = tokenizer.tokenize(cases.at("t2i").at("chat_text").get<std::string>());
    const at::Tensor golden_ids = load_tensor(file, "t2i.input_ids", at::kLong);
    const int64_t real = load_tensor(file, "t2i.attention_mask", at::kLong).sum().item<int64_t>();
    REQUIRE(static_cast<int64_t>(ids.size()) == real);
    CHECK(at::equal(golden_ids.narrow(0, 0, real), at::tensor(ids, at::kLong)));
    CHECK((golden_ids.narrow(0, real, 512 - real) == tokenizer.pad_id()).all().item<bool>());
    // Each prompt's embeddings are its own, whatever else is in the batch.
    const Conditioning two = pipeline->encode_prompts({"a cat", prompt}, 40),
                       alone = pipeline->encode_prompts({prompt}, 40);
    CHECK(max_diff(two.text[1], alone.text[0]) <= 1e-5);
}

TEST_CASE(
    "FLUX.2-dev: each prompt in Mistral's system template without [IMG], left-padded to max_sequence_length, "
    "hidden states 10, 20 and 30 of every token side by side, as diffusers encodes it") {
    PipelineOptions options;
    options.model_dir = tiny("flux2-dev");
    const auto pipeline = Flux2Pipeline::load(options);
    const auto file = SafetensorsFile::open(golden_path("flux2_dev_pipeline.safetensors"));
    const nlohmann::json cases = dp::test::golden_cases(file);
    // The case cut at 48 tokens inside the prompt: its embeddings, every one of the 48.
    const std::string prompt = cases.at("nonsquare").at("prompts")[0];
    const Conditioning cut = pipeline->encode_prompts({prompt}, 48);
    const at::Tensor expected = load_tensor(file, "nonsquare.prompt_embeds", at::kFloat);
    REQUIRE(cut.text.sizes() == at::IntArrayRef({1, 48, expected.size(1)}));
    const double diff = max_diff(cut.text[0], expected);
    MESSAGE("nonsquare prompt embeddings: max |diff| " << diff);
    CHECK(diff <= 1e-4);
    REQUIRE(cut.warnings.size() == 1);
    CHECK(cut.warnings[0].find("cut to max_sequence_length 48") != std::string::npos);
    // A short prompt padded to 512 on the left: pads, then its tokens, as the processor makes them;
    // an [IMG] in the prompt is removed before tokenizing.
    const MistralTokenizer tokenizer = MistralTokenizer::from_folder(tiny("flux2-dev") + "/tokenizer");
    const std::vector<int64_t> ids = tokenizer.tokenize(cases.at("t2i").at("chat_text").get<std::string>());
    const at::Tensor golden_ids = load_tensor(file, "t2i.input_ids", at::kLong);
    const int64_t real = load_tensor(file, "t2i.attention_mask", at::kLong).sum().item<int64_t>();
    REQUIRE(static_cast<int64_t>(ids.size()) == real);
    CHECK(at::equal(golden_ids.narrow(0, 512 - real, real), at::tensor(ids, at::kLong)));
    CHECK((golden_ids.narrow(0, 0, 512 - real) == tokenizer.pad_id()).all().item<bool>());
    const std::string t2i = cases.at("t2i").at("prompts")[0];
    const Conditioning plain = pipeline->encode_prompts({t2i}, 64),
                       marked = pipeline->encode_prompts({"[IMG]" + t2i + "[IMG]"}, 64);
    CHECK(max_diff(plain.text, marked.text) == 0);
    // Each prompt's embeddings are its own, whatever else is in the batch.
    const Conditioning two = pipeline->encode_prompts({"a cat", prompt}, 48),
                       alone = pipeline->encode_prompts({prompt}, 48);
    CHECK(max_diff(two.text[1], alone.text[0]) <= 1e-5);
}

TEST_CASE(
    "FLUX.2-klein: an edit's size is its first picture's, at 1024 x 1024 pixels' area when larger, cut to "
    "the multiple") {
    const dp::strategies::ModelInfo model = dp::strategies::read_model_info(tiny("flux2-klein"));
    const dp::strategies::FamilyFacts& facts = dp::strategies::facts_of(*model.spec);
    REQUIRE(static_cast<bool>(facts.input_size));
    CHECK(facts.size_from_first_picture);
    // The two-picture case made no size of its own: the first picture's 70 x 66, cut to 64 x 64.
    const nlohmann::json ref2 =
        dp::test::golden_cases(SafetensorsFile::open(golden_path("flux2_klein_pipeline.safetensors")))
            .at("ref2");
    CHECK(ref2.at("width").is_null());
    const dp::images::RgbImage first =
        dp::images::decode_image(dp::test::repository_path(ref2.at("images")[0].get<std::string>()));
    CHECK(facts.input_size(first.width, first.height, model.sizes.multiple()) ==
          std::pair<int64_t, int64_t>{ref2.at("out_width"), ref2.at("out_height")});
    // Larger than 1024^2: int(side x sqrt(1024^2 / area)) as Python computes it, then the multiple.
    CHECK(facts.input_size(2000, 1500, 16) == std::pair<int64_t, int64_t>{1168, 880});  // 1182 x 886
    CHECK(facts.input_size(2000, 1500, 1) == std::pair<int64_t, int64_t>{1182, 886});
    CHECK(facts.input_size(1024, 1024, 16) == std::pair<int64_t, int64_t>{1024, 1024});
}

namespace {
// A copy of the golden tiny SD3 model that a test may break.
std::string copy_model(const std::string& name) {
    const std::string dir = "/tmp/dp_model_" + std::to_string(getpid()) + "_" + name;
    const std::string cmd = "rm -rf '" + dir + "' && cp -r '" + golden_path("sd3_tiny") + "' '" + dir + "'";
    REQUIRE(std::system(cmd.c_str()) == 0);
    return dir;
}

std::string load_error(const std::string& dir) {
    PipelineOptions options;
    options.model_dir = dir;
    try {
        Sd3Pipeline::load(options);
    } catch (const ModelError& e) {
        return e.what();
    }
    return "loaded";
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}
}  // namespace

TEST_CASE("SD3: broken model folders, each error naming the file and what is wrong") {
    PipelineOptions options;
    options.model_dir = golden_path("clip_l");
    CHECK_THROWS_WITH_AS(Sd3Pipeline::load(options), doctest::Contains("model_index.json"), ModelError);

    std::string dir = copy_model("missing");
    std::remove((dir + "/transformer/diffusion_pytorch_model.safetensors").c_str());
    CHECK_MESSAGE(load_error(dir).find(dir + "/transformer: no *.safetensors weights") != std::string::npos,
                  load_error(dir));

    dir = copy_model("truncated");
    const std::string weights = dir + "/vae/diffusion_pytorch_model.safetensors";
    REQUIRE(truncate(weights.c_str(), 4000) == 0);
    CHECK_MESSAGE(load_error(dir).find(weights) != std::string::npos, load_error(dir));

    dir = copy_model("t5");
    std::string index = read_text_file(dir + "/model_index.json");
    const std::string null_t5 = "\"text_encoder_3\": [\n    null,\n    null\n  ]";
    REQUIRE(index.find(null_t5) != std::string::npos);
    index.replace(index.find(null_t5), null_t5.size(),
                  "\"text_encoder_3\": [\"transformers\", \"T5EncoderModel\"]");
    write_file(dir + "/model_index.json", index);
    // Every problem at once: the encoder's folder, and the tokenizer it needs.
    CHECK_MESSAGE(load_error(dir).find(
                      dir + "/text_encoder_3: missing (model_index.json names a T5EncoderModel there)") !=
                      std::string::npos,
                  load_error(dir));
    CHECK_MESSAGE(load_error(dir).find(
                      "\"tokenizer_3\" is missing, but text_encoder_3 names a T5 encoder, which "
                      "needs a T5TokenizerFast or T5Tokenizer (or run with --no-t5)") != std::string::npos,
                  load_error(dir));

    dir = copy_model("shape");
    std::string config = read_text_file(dir + "/transformer/config.json");
    config.replace(config.find("\"num_attention_heads\": 4"), 24, "\"num_attention_heads\": 2");
    config.replace(config.find("\"caption_projection_dim\": 32"), 28, "\"caption_projection_dim\": 16");
    write_file(dir + "/transformer/config.json", config);
    CHECK_MESSAGE(load_error(dir).find("has shape") != std::string::npos, load_error(dir));

    dir = copy_model("class");
    write_file(dir + "/scheduler/scheduler_config.json", R"({"_class_name": "EulerDiscreteScheduler"})");
    CHECK_MESSAGE(load_error(dir).find("'EulerDiscreteScheduler' is not supported") != std::string::npos,
                  load_error(dir));

    dir = copy_model("json");
    write_file(dir + "/vae/config.json", "{\"block_out_channels\": [4,");
    CHECK_MESSAGE(load_error(dir).find(dir + "/vae/config.json: not valid JSON") != std::string::npos,
                  load_error(dir));
    std::system(("rm -rf /tmp/dp_model_" + std::to_string(getpid()) + "_*").c_str());
}

// Note [prompts encoded once]: SD3 guides with the negative prompt "" on every line.
TEST_CASE(
    "a job encodes each distinct text once: the negative prompt and a repeated prompt are reused, "
    "with the same image") {
    PipelineOptions options;
    options.model_dir = golden_path("sd3_tiny");
    const auto pipeline = load(options);
    const auto request = [](const char* prompt, uint64_t seed) {
        GenerateRequest r;
        r.prompt = prompt;
        r.seed = seed;
        r.steps = 2;
        r.width = r.height = 16;
        return r;
    };
    const GenerateResult first = pipeline->generate(request("a red circle", 1));
    CHECK(first.phases.encodings == 2);  // the prompt and ""
    CHECK(first.phases.reused_encodings == 0);
    const GenerateResult other = pipeline->generate(request("a blue square", 2));
    CHECK(other.phases.encodings == 1);
    CHECK(other.phases.reused_encodings == 1);
    const GenerateResult again = pipeline->generate(request("a red circle", 1));
    CHECK(again.phases.encodings == 0);
    CHECK(again.phases.reused_encodings == 2);
    CHECK(at::equal(again.image, first.image));
    CHECK(at::equal(again.latents, first.latents));
    // Another setting that reaches the encoders is another text.
    GenerateRequest shorter = request("a red circle", 1);
    shorter.arguments.set("max_sequence_length", int64_t{8});
    CHECK(pipeline->generate(shorter).phases.encodings == 2);
    // A fresh pipeline, which encodes everything, makes the same image as the reused encodings.
    CHECK(at::equal(load(options)->generate(request("a red circle", 1)).image, first.image));
    // The phases of the batch are counted: its passes (2 steps x 2 branches) and their FLOPs.
    CHECK(first.phases.passes == 4);
    CHECK(first.phases.flops > first.phases.gemm_flops);
    CHECK(first.phases.gemm_flops > 0);
    CHECK(first.phases.steps_ms > 0);
    // Note [kernel time in the steps]: on the CPU the steps' products and attention are timed, and
    // they are part of the steps.
    CHECK(first.phases.gemm_ms > 0);
    CHECK(first.phases.attention_ms > 0);
    CHECK(first.phases.gemm_ms + first.phases.attention_ms <= first.phases.steps_ms);
}

// Note [int8 compute]: the allowed layers as int8 products change the image a little, and only them.
TEST_CASE(
    "--quantize int8 runs the transformer's allowed layers as int8 products: close to fp32, not equal") {
    PipelineOptions options;
    options.model_dir = golden_path("sd3_tiny");
    GenerateRequest r;
    r.prompt = "a red circle";
    r.steps = 2;
    r.width = r.height = 16;
    const GenerateResult fp32 = load(options)->generate(r);
    options.quantize = "int8";
    const GenerateResult int8 = load(options)->generate(r);
    const double latents = (int8.latents - fp32.latents).abs().max().item<double>();
    const double mean = (int8.image.to(at::kFloat) - fp32.image.to(at::kFloat)).abs().mean().item<double>();
    MESSAGE("int8 vs fp32: max |latent diff| " << latents << ", mean |uint8 diff| " << mean);
    CHECK(latents > 1e-6);
    CHECK(latents < 0.1 * fp32.latents.abs().max().item<double>());
    CHECK(mean < 8.0);
}

TEST_CASE("SD3: random weights from the folder's configs are seeded, and bf16 runs and stays close to fp32") {
    PipelineOptions options;
    options.model_dir = golden_path("sd3_tiny");
    options.random_weights = 1;
    GenerateRequest r;
    r.prompt = "a red circle";
    r.steps = 2;
    r.width = r.height = 16;
    const at::Tensor a = Sd3Pipeline::load(options)->generate(r).image;
    const at::Tensor b = Sd3Pipeline::load(options)->generate(r).image;
    CHECK(at::equal(a, b));
    options.random_weights = 2;
    CHECK_FALSE(at::equal(a, Sd3Pipeline::load(options)->generate(r).image));

    options.random_weights.reset();
    const at::Tensor fp32 = Sd3Pipeline::load(options)->generate(r).image.to(at::kFloat);
    options.dtype = at::kBFloat16;
    const at::Tensor bf16 = Sd3Pipeline::load(options)->generate(r).image.to(at::kFloat);
    const double mean_diff = (fp32 - bf16).abs().mean().item<double>();
    MESSAGE("bf16 vs fp32: mean |uint8 diff| " << mean_diff);
    CHECK(mean_diff < 8.0);
}

TEST_CASE(
    "SD3.5: skip-layer guidance refuses blocks that do not exist, and changes the image only inside its "
    "window") {
    PipelineOptions options;
    options.model_dir = golden_path("sd35_medium_tiny");
    const auto pipeline = Sd3Pipeline::load(options);
    GenerateRequest r;
    r.prompt = "a star";
    r.steps = 3;
    r.arguments.set("guidance_scale", 4.0);
    r.width = r.height = 16;
    const at::Tensor plain = pipeline->generate(r).latents;
    r.arguments.set("skip_guidance_layers", std::vector<int>{3});
    CHECK_THROWS_WITH_AS(pipeline->generate(r),
                         doctest::Contains("block 3 does not exist (the model has 3 blocks"), ModelError);
    r.arguments.set("skip_guidance_layers", std::vector<int>{1});
    r.arguments.set("skip_layer_guidance_start", 0.5);  // no step strictly inside (1.5, 1.8)
    r.arguments.set("skip_layer_guidance_stop", 0.6);
    CHECK(at::equal(pipeline->generate(r).latents, plain));
    r.arguments.set("skip_layer_guidance_start", 0.01);
    r.arguments.set("skip_layer_guidance_stop", 0.9);
    CHECK_FALSE(at::allclose(pipeline->generate(r).latents, plain));
}

TEST_CASE(
    "SD3: --no-t5 runs a T5 folder without its encoder: zeros in T5's place, as diffusers' "
    "text_encoder_3=None") {
    PipelineOptions options;
    options.model_dir = golden_path("sd3_t5_tiny");
    GenerateRequest r;
    r.prompt = "a red circle";
    r.steps = 2;
    r.width = r.height = 16;
    const at::Tensor with_t5 = Sd3Pipeline::load(options)->generate(r).latents;
    options.no_t5 = true;
    const auto without = Sd3Pipeline::load(options);
    const PromptEmbeddings e = without->encode_prompts({"a red circle"}, 100);
    CHECK(e.tail_repeats == 100);
    CHECK(e.sequence.size(1) == 77 + 1);
    CHECK(at::equal(e.sequence.narrow(1, 77, 1), at::zeros_like(e.sequence.narrow(1, 77, 1))));
    CHECK_FALSE(at::allclose(without->generate(r).latents, with_t5));
}
