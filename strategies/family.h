#pragma once
// Note [a family in one place]: everything the launcher side knows of one model family is one
// value of FamilyFacts, written in the family's own file under strategies/families/ (pure facts,
// no LibTorch) and listed once in strategies/families/registry.cpp: its parallel spec (how it
// splits, its pipeline class), the call arguments it takes and their defaults, the components its
// pipeline loads, the config checks across them, its single-file and LoRA key layouts, and what
// `plan` needs to count its text. Code that serves every family (model_config, single_file, lora,
// the call-argument table, plan) reads these facts and names no family; the worker's side of a
// family is its folder under runtime/models/ and one line of runtime/pipeline_registry.cpp.
// docs/models.md ("Adding a family") lists what a new family touches; tests/check_families.sh
// counts it.

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/call_arguments.h"
#include "protocol/presets.h"
#include "strategies/model_config.h"
#include "strategies/parallel_spec.h"
#include "strategies/pass_flops.h"
#include "strategies/single_file.h"

namespace dp::strategies {

// What a component of model_index.json must be, for a family's pipeline.
struct ComponentRule {
    const char* key;
    std::vector<std::string> classes;  // accepted class names, the first the one to name
    bool required;                     // false: [null, null] or absent is fine
    // kProcessor: a transformers processor's folder (its preprocessor_config.json).
    enum Files { kModel, kScheduler, kBpeTokenizer, kT5Tokenizer, kProcessor } files;
    bool t5;  // part of the T5 text encoder: nothing is needed of it with no_t5
};

// A text encoder whose width must be the transformer's: `key` of its config (or of the config's
// `nested` object, when it has one) against the transformer config's `joint_key`.
struct WidthRule {
    const char* component;
    const char* key;
    int64_t fallback;  // the encoder class's default
    const char* joint_key;
    int64_t joint_fallback;  // the transformer class's default
    const char* why;         // what joins them, for the message; nullptr: nothing said
    const char* advice;      // what to do: "use the text encoder made for this model"
    bool t5 = false;         // checked only when the T5 encoder is loaded
    const char* nested = nullptr;
    int64_t times = 1;  // how many of its outputs side by side make the transformer's width (FLUX.2: 3)
};

// A base weight an adapter's module changes, and the rows of its `up` the change takes.
struct LoraPart {
    std::string module;                             // diffusers' module name, without ".weight"
    std::vector<std::pair<int64_t, int64_t>> rows;  // (first, count) ranges in order; empty: all
};

struct FamilyFacts {
    ParallelSpec spec;
    // The call arguments its pipeline takes and its defaults (Note [one call-argument table]); its
    // variant's (spec.variant_family), when it has one.
    std::vector<protocol::ArgumentUse> arguments, variant_arguments;
    // model_index.json's components as its pipeline loads them, in the order problems are named.
    std::vector<ComponentRule> components;
    std::vector<WidthRule> widths;

    // --- Single files (single_file.h) ---
    // A bundle's name for each text encoder component (Note [bundled files]): "clip_l", "t5xxl".
    std::map<std::string, std::string> bundled_encoders;
    // The CLIP-L component whose projection a bundle leaves out (SD3 takes its pooled output
    // unprojected): the identity stands for it. Empty: none.
    std::string identity_projection;
    // The transformer's original layout (its authors' names): whether a file's tensors, under its
    // prefix, are in it, and how they map to diffusers' names. nullptr: none.
    bool (*is_original_transformer)(const CheckpointTensors& file, const std::string& prefix) = nullptr;
    void (*map_original_transformer)(const CheckpointTensors& file, SingleFileLayout& out) = nullptr;
    // Names in tensor names that say a file is made for the family (adapter_family_guess); the
    // families are asked in ascending guess_order, so one whose markers others share goes later.
    std::vector<const char*> name_markers;
    int guess_order = 0;
    // The family whose tensor names its checkpoints and adapters share, by display name, where
    // it is another's (FLUX.1-Fill's are FLUX.1's, Qwen-Image-Edit's Qwen-Image's): a file the
    // markers say is made for that family is made for this one too. Empty: its own.
    std::string names_as;
    // The shipped config-only folder (models/) a checkpoint of the family's is, from its tensor
    // names; empty when they do not say. nullptr: the family ships none.
    std::string (*shipped_config)(const std::vector<std::string>& names) = nullptr;

    // --- LoRA (lora.h) ---
    // The weights a module of the original layout (a `diffusion_model.` file, dotted) changes;
    // empty when it is no module of it. nullptr: none.
    std::vector<LoraPart> (*lora_original_parts)(
        const std::string& module, const std::map<std::string, std::vector<int64_t>>& weights) = nullptr;
    // kohya's underscored name of an original-layout module, dotted again; empty when it is none.
    std::string (*lora_kohya_original)(const std::string& underscored) = nullptr;
    const char* kohya_format = "kohya";  // how the layout of a kohya file is named

    // --- edits ---
    // Note [output size]: the size a line makes is decided here, before any rank starts, as its
    // pipeline decides it, so that the records, the cost model, the size checks and --resume all
    // see the size the image will have; the worker makes the size its request carries.
    // Whether an edit's default size is its input's, rounded down to the size multiple (the
    // *Img2ImgPipeline classes), or the model's default as for text to image (FluxKontextPipeline).
    bool size_from_input = true;
    // Which picture of a list sizes it: the last (QwenImageEditPlusPipeline) or the first
    // (Flux2KleinPipeline).
    bool size_from_first_picture = false;
    // Where it is: the size the pipeline makes of an edit's image of `width` x `height` (its last
    // picture's) when none is asked, each side taken on its own (QwenImageEditPipeline's
    // calculate_dimensions: 1024 x 1024 pixels' area at the image's ratio). nullptr: the image's
    // sides rounded down to `multiple`.
    std::pair<int64_t, int64_t> (*input_size)(int64_t width, int64_t height, int64_t multiple) = nullptr;
    // The width and height the pipeline makes of those asked (the line's, else the job's, else the
    // default above), each a multiple of `multiple`, under the line's `arguments` (FluxKontextPipeline:
    // scaled to max_area pixels at their ratio). nullptr: those asked.
    std::pair<int64_t, int64_t> (*output_size)(int64_t width, int64_t height,
                                               const protocol::CallValues& arguments,
                                               int64_t multiple) = nullptr;
    // The size an edit's image is resized to from its decoded `width` x `height`, where the
    // transformer takes it beside the latents as a reference of its own size (FluxKontextPipeline's
    // preferred resolution nearest its ratio). nullptr: the image is the start, at the output size.
    std::pair<int64_t, int64_t> (*reference_size)(int64_t width, int64_t height, int64_t multiple) = nullptr;

    // --- memory ---
    // The transformer's parameters from its config.json alone, by diffusers' layer list (Note
    // [sizes from configs], config_sizes.h): what random weights build. Throws
    // std::invalid_argument (config_number) for a key that is not a size. nullptr: not known.
    double (*transformer_parameters)(const nlohmann::json& config) = nullptr;
    // --- FLOPs ---
    // Note [FLOPs of a pass] (pass_flops.h): one transformer pass's products and attention from
    // its config.json, by diffusers' forward, for `tokens`. nullptr: not known.
    PassFlopsCount pass_flops = nullptr;
    // --- presets ---
    // Note [presets] (protocol/presets.h): the few-step recipes published for the family's
    // distilled adapters, each a JSON text in the preset file format.
    std::vector<const char*> presets;
    // --- plan ---
    // The text tokens a prompt gives the transformer, for `plan`'s figures, when it is not
    // max_sequence_length (SD3: CLIP's, then T5's or one standing for its zeros; `left_out`: the
    // components the job does not load). nullptr: that.
    int64_t (*plan_text_tokens)(const ModelInfo& model, int64_t max_sequence,
                                const std::vector<std::string>& left_out) = nullptr;
};

// diffusers' calculate_dimensions (the Qwen-Image edit pipelines', families/qwen_image.cpp): the
// sides at width:height's ratio holding `area` pixels, each rounded (Python's round, half to even)
// to a multiple of `step`. {width, height}.
std::pair<int64_t, int64_t> area_dimensions(double area, int64_t width, int64_t height, int64_t step);

// Whether a file whose names adapter_family_guess says are made for `guess` (a display name) is
// made for `facts`' family: its own name, or the family whose names it shares.
bool names_fit(const FamilyFacts& facts, const std::string& guess);

// Every family, in the registry's order (strategies/families/registry.cpp).
const std::vector<const FamilyFacts*>& families();
// Every family's presets (FamilyFacts::presets), in the families' order, each name once.
const std::vector<protocol::Preset>& shipped_presets();
// The facts of `spec`'s family (by spec.family). Throws protocol::InternalError for a spec of no
// registered family.
const FamilyFacts& facts_of(const ParallelSpec& spec);
// The spec of the family or variant named `family` ("sd3", "flux-schnell"). Throws
// protocol::InternalError for none.
const ParallelSpec& family_spec(std::string_view family);
// The call arguments of the family or variant named `family`, at its defaults. Throws
// protocol::InternalError for none.
protocol::FamilyArguments family_arguments(std::string_view family);

}  // namespace dp::strategies
