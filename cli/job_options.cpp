// The pipeline's options (with PROMPTS): one row per option of launcher::JobOptions. The call
// arguments' rows come from the call-argument table (protocol/call_arguments.h).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli/launch_options.h"
#include "cli/option_rows.h"
#include "launcher/prompt_file.h"
#include "protocol/call_arguments.h"
#include "protocol/job_file.h"
#include "strategies/family.h"

namespace dp::cli {

using namespace rows;
using launcher::JobOptions;
using launcher::UsageError;

namespace {

// --dtype's value: ours (auto, fp32, bf16, fp16), or torch's name for one of them, as a script
// passes torch_dtype ("bfloat16", "torch.float16"). Throws UsageError naming `source` otherwise.
std::string dtype_value(const std::string& text, const std::string& source) {
    constexpr std::pair<const char*, const char*> kTorchNames[] = {
        {"float32", "fp32"}, {"float", "fp32"}, {"bfloat16", "bf16"}, {"float16", "fp16"}, {"half", "fp16"}};
    const std::string name = text.rfind("torch.", 0) == 0 ? text.substr(6) : text;
    for (const auto& [torch_name, ours] : kTorchNames)
        if (name == torch_name) return ours;
    return launcher::parse_choice(text, {"auto", "fp32", "bf16", "fp16"}, source);
}

// A component's weights from one file (Note [component files], launcher/component_files.h).
template <class J>
OptionRow<J> component_file(const char* flags, const char* component, const char* help) {
    const std::string name = component;
    return row<J>(
        flags, "FILE", OptionKind::kText, help,
        [name](J& j, const std::string& text, const std::string& source) {
            if (text.empty() || text.find('\0') != std::string::npos)
                throw UsageError(source + ": expected the path of a .safetensors file");
            j.component_files[name] = text;
        },
        [name](const J& j) {
            const auto it = j.component_files.find(name);
            return it == j.component_files.end() ? std::string() : it->second;
        });
}

using protocol::CallArgument;
using protocol::CallType;

// A default as --help shows it: numbers with a decimal point (7.0), whole numbers as they are.
std::string default_text(const CallArgument& a, double value) {
    char buf[32];
    if (a.type == CallType::kWhole || value != static_cast<double>(static_cast<long long>(value)))
        std::snprintf(buf, sizeof(buf), "%g", value);
    else
        std::snprintf(buf, sizeof(buf), "%.1f", value);
    return buf;
}

// What an unset call argument means, from its row: each family's default ("SD3 28, Qwen-Image 50,
// FLUX.1-dev 28, FLUX.1-schnell 4"; a family and its variant at the same value under the family's
// name), after the model folder's generation_defaults.json where it may set it.
std::string described_default(const CallArgument& a) {
    if (a.type == CallType::kBlocks || a.type == CallType::kAdapters || a.type == CallType::kCache ||
        a.type == CallType::kImage || a.type == CallType::kSchedulerOverrides || a.type == CallType::kNumbers)
        return "none";
    if (a.type == CallType::kScheduler) return "the model's (its scheduler/scheduler_config.json)";
    std::string out;
    for (const strategies::FamilyFacts* family : strategies::families()) {
        const strategies::ParallelSpec* spec = &family->spec;
        // The family's (and its variant's) use of the row, unless it ignores it.
        const auto use_in =
            [&](const std::vector<protocol::ArgumentUse>& uses) -> const protocol::ArgumentUse* {
            for (const protocol::ArgumentUse& use : uses)
                if (use.name == std::string_view(a.name) && !use.ignored) return &use;
            return nullptr;
        };
        const protocol::ArgumentUse* base = use_in(family->arguments);
        const protocol::ArgumentUse* variant =
            spec->variant_family.empty() ? nullptr : use_in(family->variant_arguments);
        const auto add = [&](const std::string& name, double value) {
            out += (out.empty() ? "" : ", ") + name + " " + default_text(a, value);
        };
        if (base && variant && base->value == variant->value) {
            add(spec->display_name, base->value);
            continue;
        }
        if (base)
            add(variant || !spec->variant_family.empty() ? spec->display_name + "-dev" : spec->display_name,
                base->value);
        if (variant) add(spec->variant_name, variant->value);
    }
    return a.model_default ? "the model folder's generation_defaults.json, else " + out : out;
}

// The row of a family call argument: it sets JobOptions::arguments.
JobOptionRow call_argument_row(const CallArgument& a) {
    using J = JobOptions;
    const OptionKind kind = a.type == CallType::kNumber  ? OptionKind::kNumber
                            : a.type == CallType::kWhole ? OptionKind::kInt
                                                         : OptionKind::kText;
    JobOptionRow r = row<J>(
        a.flags, a.value_name, kind, a.help,
        [&a](J& j, const std::string& text, const std::string& source) {
            switch (a.type) {
                case CallType::kNumber:
                    j.arguments.set(a, launcher::parse_number(text, a.min, a.max, source, "", a.above_min));
                    break;
                case CallType::kImage: {
                    // Given again, a list of pictures (Note [several input images]): joined with '\n'.
                    std::vector<protocol::InputImage> pictures;
                    std::istringstream lines(text);
                    for (std::string line; std::getline(lines, line);) {
                        if (line.empty() || line.find('\0') != std::string::npos)
                            throw UsageError(source + ": expected an image file's path (PNG, JPEG or WebP)");
                        pictures.push_back(protocol::InputImage{line});
                    }
                    if (pictures.empty())
                        throw UsageError(source + ": expected an image file's path (PNG, JPEG or WebP)");
                    if (pictures.size() > static_cast<std::size_t>(std::max(1.0, a.max)))
                        throw UsageError(source + ": given " + std::to_string(pictures.size()) +
                                         " times; a pipeline takes at most " +
                                         std::to_string(protocol::kMaxInputPictures) + " pictures");
                    j.arguments.set(a, protocol::InputImage::of(pictures));
                    break;
                }
                case CallType::kWhole:
                    j.arguments.set(a, int64_t{launcher::parse_int(text, static_cast<int>(a.min),
                                                                   static_cast<int>(a.max), source)});
                    break;
                case CallType::kBlocks:
                    j.arguments.set(a, launcher::parse_block_list(text, source));
                    break;
                case CallType::kAdapters: {
                    protocol::Adapters adapters;
                    std::istringstream lines(text);
                    for (std::string line; std::getline(lines, line);) {
                        if (line.empty()) continue;
                        protocol::Adapter adapter;
                        std::string why = protocol::parse_adapter_text(line, adapter);
                        if (why.empty() && (adapter.scale < a.min || adapter.scale > a.max))
                            why = "the scale must be from " + launcher::number_text(a.min) + " to " +
                                  launcher::number_text(a.max);
                        if (!why.empty())
                            throw UsageError(source + " '" + launcher::utf8_for_display(line.substr(0, 200)) +
                                             "': " + why +
                                             " (expected PATH or PATH:SCALE, e.g. "
                                             "style.safetensors:0.8)");
                        adapters.push_back(std::move(adapter));
                    }
                    j.arguments.set(a, std::move(adapters));
                    break;
                }
                case CallType::kScheduler:
                case CallType::kSchedulerOverrides:
                case CallType::kNumbers: {
                    protocol::CallValue v;
                    if (const std::string why = protocol::read_call_value(a, nlohmann::json(text), v);
                        !why.empty())
                        throw UsageError(source + " '" + launcher::utf8_for_display(text.substr(0, 200)) +
                                         "': " + why);
                    j.arguments.set(a, std::move(v));
                    break;
                }
                case CallType::kCache: {
                    protocol::StepCache cache;
                    const std::string why = protocol::parse_step_cache(text, cache, a.max);
                    if (!why.empty())
                        throw UsageError(source + " '" + launcher::utf8_for_display(text.substr(0, 200)) +
                                         "': " + why);
                    j.arguments.set(a, cache);
                    break;
                }
            }
        },
        [&a](const J& j) -> std::string {
            const protocol::CallValue* v = j.arguments.find(a.name);
            if (!v) return "";
            if (const auto* blocks = std::get_if<std::vector<int>>(v))
                return launcher::block_list_text(*blocks);
            if (!std::holds_alternative<double>(*v) && !std::holds_alternative<int64_t>(*v))
                return protocol::call_value_text(*v);
            if (const auto* d = std::get_if<double>(v)) return launcher::number_text(*d);
            return std::to_string(std::get<int64_t>(*v));
        });
    if (kind != OptionKind::kText) {
        r.lo = a.min;
        r.hi = a.max;
        r.lo_excluded = a.above_min;
    }
    r.repeatable = a.type == CallType::kAdapters || (a.type == CallType::kImage && a.max > 1);
    return described(r, described_default(a).c_str());
}

const CallArgument& universal(const char* name) { return *protocol::find_call_argument(name); }

// `rows` with a row for each family call argument of the table after --seed, in the table's order.
std::vector<JobOptionRow> with_call_arguments(std::vector<JobOptionRow> rows) {
    auto at =
        std::find_if(rows.begin(), rows.end(), [](const JobOptionRow& r) { return r.long_flag == "--seed"; });
    if (at != rows.end()) ++at;
    std::vector<JobOptionRow> generated;
    for (const CallArgument& a : protocol::call_arguments())
        if (!a.universal) generated.push_back(call_argument_row(a));
    rows.insert(at, generated.begin(), generated.end());
    return rows;
}

}  // namespace

const std::vector<JobOptionRow>& job_option_table() {
    using J = JobOptions;
    static const std::vector<JobOptionRow> table = finish<J>(
        with_call_arguments({
            // Found once the whole table is read, with --revision (resolve_job_options).
            applied(
                text<J>("--model", "DIR|NAME|ORG/NAME", &J::model,
                        "Diffusers model folder (model_index.json, transformer/, ...), the name of a model "
                        "shipped with dp-launch, or a Hugging Face repo id found in the local cache "
                        "($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub; no network)",
                        "a model folder, a shipped model's name or ORG/NAME"),
                launcher::kDefaultModel),
            described(
                read_by(text<J>("--revision", "REV", &J::revision,
                                "Branch, tag or commit hash (7 or more hex digits) of --model ORG/NAME in "
                                "the Hugging Face cache"),
                        [](J& j, const std::string& t, const std::string& src) {
                            if (t.empty() || t.find('\0') != std::string::npos || !launcher::is_valid_utf8(t))
                                throw UsageError(src + ": expected a branch, a tag or a commit hash");
                            j.revision = t;
                        }),
                "main"),
            read_by(
                text<J>("--variant", "NAME", &J::variant,
                        "Weight files of this variant in every component folder (diffusers' variant: fp16 "
                        "reads NAME.fp16.safetensors or NAME.safetensors.index.fp16.json)"),
                [](J& j, const std::string& t, const std::string& src) {
                    if (t.empty() || !protocol::is_variant_name(t))
                        throw UsageError(src + " '" + launcher::utf8_for_display(t.substr(0, 80)) +
                                         "': expected a variant name of letters, digits, '_' and '-', such "
                                         "as fp16 or bf16");
                    j.variant = t;
                }),
            component_file<J>(
                "--transformer", "transformer",
                "The transformer's weights from one file (a diffusers file, FLUX.1's original "
                "layout as Black Forest Labs publish it, or SD3's as Stability AI do; bf16, fp16, "
                "fp32, fp8, ComfyUI's scaled fp8 or GGUF); the rest of the pipeline from --model's "
                "folder"),
            component_file<J>(
                "--text-encoder,--text_encoder", "text_encoder",
                "The first text encoder's weights from one file in transformers' names; the rest from "
                "--model's folder"),
            component_file<J>("--text-encoder-2,--text_encoder_2", "text_encoder_2",
                              "The second text encoder's weights from one file in transformers' names"),
            component_file<J>(
                "--text-encoder-3,--text_encoder_3", "text_encoder_3",
                "The third text encoder's (SD3's T5) weights from one file in transformers' names"),
            component_file<J>("--vae", "vae",
                              "The VAE's weights from one file in diffusers' names or the original "
                              "latent-diffusion layout"),
            on_off<J>(
                "--keep-quantized,--keep_quantized", &J::keep_quantized,
                "Keep a GGUF file's quantized weights in their blocks and dequantize each layer as it runs, "
                "as diffusers does: the memory of the file, for a dequantization per use (off: "
                "dequantized once at load, the fastest)"),
            read_by(
                choice<J>("--quantize", &J::quantize, {"none", "int8"},
                          "Run the transformer's attention and MLP projections as int8 products (per-token "
                          "activations, per-channel weights; the layers its family allows), faster than the "
                          "run's dtype where the CPU or GPU has int8 instructions, at a cost in pixels "
                          "`dp-launch compare` measures (docs/benchmarks.md); none: every product in "
                          "--dtype"),
                [](J& j, const std::string& t, const std::string& src) {
                    const std::string v = launcher::parse_choice(t, {"none", "int8"}, src);
                    j.quantize = v == "none" ? "" : v;
                }),
            on_off<J>(
                "--offload", &J::offload,
                "Keep each component on the GPU only while it runs, as diffusers' enable_model_cpu_offload: "
                "for a machine where even --device-map does not fit (slower: each use reads its weights "
                "again)"),
            on_off<J>("--no-t5,--no_t5", &J::no_t5,
                      "Run without the T5 text encoder even when the model has one (its embeddings are then "
                      "zeros, as diffusers' text_encoder_3=None)"),
            u64<J>("--random-weights,--random_weights", "SEED", &J::random_weights,
                   "Use --model's configs with seeded random weights instead of its weights (tests, "
                   "benchmarks)"),
            read_by(
                choice<J>("--format", &J::image_format, {"png", "jpeg", "webp"},
                          "Image files: PNG (lossless), JPEG or WebP at --quality; each carries its prompt "
                          "and settings (docs/launcher.md, \"Output\")"),
                [](J& j, const std::string& t, const std::string& src) {
                    j.image_format =
                        t == "jpg" ? "jpeg" : launcher::parse_choice(t, {"png", "jpeg", "webp"}, src);
                }),
            whole<J>("--quality", "N", &J::quality, 1, 100,
                     "JPEG and WebP quality (100: lossless WebP); PNG is always lossless"),
            read_by(text<J>("-o,--output-dir,--output_dir", "DIR", &J::output_dir,
                            "Where images and manifest.jsonl go"),
                    [](J& j, const std::string& t, const std::string& src) {
                        if (t.empty()) throw UsageError(src + ": expected a folder path");
                        j.output_dir = t;
                        while (j.output_dir.size() > 1 && j.output_dir.back() == '/') j.output_dir.pop_back();
                    }),
            described(
                whole<J>(universal("num_inference_steps").flags, universal("num_inference_steps").value_name,
                         &J::steps, static_cast<int>(universal("num_inference_steps").min),
                         static_cast<int>(universal("num_inference_steps").max),
                         universal("num_inference_steps").help),
                described_default(universal("num_inference_steps")).c_str()),
            described(row<J>(
                          "--preset", "NAME|FILE.json", OptionKind::kText,
                          "The settings a few-step adapter was made for, fixed (docs/schedulers.md, "
                          "\"Presets\"): a shipped name or a preset file",
                          [](J& j, const std::string& t, const std::string& src) {
                              protocol::Preset preset;
                              if (const std::string why =
                                      protocol::find_preset(t, strategies::shipped_presets(), preset);
                                  !why.empty())
                                  throw UsageError(src + ": " + launcher::utf8_for_display(why));
                              j.preset = std::move(preset);
                          },
                          [](const J& j) { return j.preset ? j.preset->name : std::string(); }),
                      "none"),
            read_by(u64<J>("--seed", "N|random", &J::seed,
                           "Base seed: a prompt without its own seed gets seed + its index; random draws one "
                           "(0 to 4294967295) that the job prints and every record keeps"),
                    [](J& j, const std::string& t, const std::string& src) {
                        j.seed_drawn = t == "random";
                        j.seed = j.seed_drawn ? std::random_device()() : launcher::parse_u64(t, src);
                    }),
            whole<J>("--num-images-per-prompt,--num_images_per_prompt", "N", &J::images_per_prompt, 1,
                     launcher::kMaxImagesPerPrompt,
                     "Images of each prompt, with seeds seed, seed + 1, ... (a JSONL line's "
                     "num_images_per_prompt over this), whatever the number of ranks"),
            described(whole<J>(universal("width").flags, universal("width").value_name, &J::width,
                               static_cast<int>(universal("width").min),
                               static_cast<int>(universal("width").max), universal("width").help),
                      "the model's"),
            described(whole<J>(universal("height").flags, universal("height").value_name, &J::height,
                               static_cast<int>(universal("height").min),
                               static_cast<int>(universal("height").max), universal("height").help),
                      "the model's"),
            choice<J>(
                "--strategy", &J::strategy, {"data", "context", "tensor", "device-map"},
                "Fill the degrees from the world: context means Ulysses where the head count allows it, "
                "else Ring; tensor means --tp over all ranks; device-map means --device-map auto in one "
                "process",
                /*as_empty=*/"data"),
            described(whole<J>("--dp", "N", &J::dp, 1, launcher::kMaxNodes * launcher::kMaxLocalProcesses,
                               "Data-parallel degree; must equal world / (cfg x ring x ulysses x tp)"),
                      "what the other degrees leave of the world"),
            on_off<J>("--cfg-parallel,--cfg_parallel", &J::cfg_parallel,
                      "CFG parallelism: pairs of ranks run the negative and positive branches and exchange "
                      "noise predictions"),
            whole<J>("--ulysses", "N", &J::ulysses, 1, 64,
                     "Ulysses context parallelism: N ranks split each image's tokens and the heads (unevenly "
                     "where N does "
                     "not divide them; tp x ulysses at most the heads)"),
            whole<J>("--ring", "N", &J::ring, 1, 64,
                     "Ring context parallelism: N ranks split each image's tokens and pass keys and values "
                     "round a ring"),
            whole<J>("--tp", "N", &J::tp, 1, 64,
                     "Tensor parallelism: N ranks split the transformer's and T5's attention and MLP weights "
                     "(by whole "
                     "heads, unevenly where N does not divide them; tp x ulysses at most the heads)"),
            text<J>("--device-map,--device_map", "balanced|auto|FILE.json", &J::device_map,
                    "One process over several devices: balanced places whole components, auto also splits "
                    "the transformer's blocks, FILE.json places them by hand ({\"transformer\": \"cuda:1\", "
                    "...})",
                    "balanced, auto or a FILE.json"),
            described(text<J>("--max-memory,--max_memory", "DEV=SIZE,...", &J::max_memory,
                              "device_map's devices and budgets, e.g. cuda:0=20GiB,cuda:1=20GiB; "
                              "cpu:0=1GB,cpu:1=1GB tries device_map on the CPU"),
                      "every visible GPU's free memory"),
            whole<J>("--batch-size,--batch_size", "N", &J::batch_size, 1, 64,
                     "Prompts with the same settings that go through the model together on a rank"),
            choice<J>(
                "--schedule", &J::schedule, {"auto", "static", "dynamic"},
                "How the model replicas share the prompts: static gives each a contiguous share "
                "(accelerate's split), dynamic lets each take the next prompt, costliest first, when it "
                "is free; auto is dynamic when the prompts' estimated costs (steps x image tokens x "
                "guidance branches) differ"),
            number<J>("--collective-timeout,--collective_timeout", "SECONDS", &J::collective_timeout_s, 1,
                      7 * 24 * 3600, "seconds",
                      "How long a rank waits in one collective (another rank died or hangs) before it stops "
                      "with exit code 75"),
            read_by(
                choice<J>("--dtype", &J::dtype, {"auto", "fp32", "bf16", "fp16"},
                          "Precision the model runs in; auto is bf16 on a GPU, and on a CPU with bf16 "
                          "instructions (AVX512-BF16, AMX) for a model 512 or more wide; else fp32, decided "
                          "by each rank for its device. torch's names are taken too: float32, bfloat16, "
                          "float16 (with or without torch.), float and half"),
                [](J& j, const std::string& t, const std::string& src) { j.dtype = dtype_value(t, src); }),
            choice<J>("--device", &J::device, {"auto", "cpu", "cuda"},
                      "auto: cuda:LOCAL_RANK when CUDA is available, else cpu"),
            described(
                read_by(
                    row<J>(
                        "--negative-prompt,--negative_prompt", "TEXT", OptionKind::kText,
                        "Negative prompt for prompts without their own (Qwen-Image and FLUX.1 run true CFG "
                        "only with one, even \"\")",
                        [](J&, const std::string&, const std::string&) {},
                        [](const J& j) { return j.negative_prompt.value_or(""); }),
                    [](J& j, const std::string& t, const std::string& src) {
                        if (!launcher::is_valid_utf8(t) || t.find('\0') != std::string::npos)
                            throw UsageError(src +
                                             ": expected UTF-8 text without NUL bytes (the prompt is "
                                             "text, not bytes)");
                        j.negative_prompt = t;
                    }),
                "none (SD3: \"\")"),
            on_off<J>("--overwrite", &J::overwrite,
                      "Replace images and manifest.jsonl already in the output folder"),
            on_off<J>("--resume", &J::resume,
                      "Keep the images an earlier run of this job made (status ok, SHA-256 unchanged) and "
                      "make only the missing ones"),
            on_off<J>(
                "--skip-invalid,--skip_invalid", &J::skip_invalid,
                "Run the valid prompts and record invalid lines in the manifest, instead of refusing to "
                "start"),
            on_off<J>("--force", &J::force,
                      "Start the ranks even when their expected memory (weights per rank and LibTorch's own) "
                      "exceeds what this machine has available"),
            described(text<J>("--worker", "PATH", &J::worker, "The dp-worker executable"),
                      "the one next to dp-launch"),
        }),
        "Pipeline options (with PROMPTS)");
    return table;
}

}  // namespace dp::cli
