// The pipeline's options (with PROMPTS): one row per option of launcher::JobOptions.
#include "cli/launch_options.h"
#include "cli/option_rows.h"
#include "launcher/prompt_file.h"
#include "protocol/job_file.h"

namespace dp::cli {

using namespace rows;
using launcher::JobOptions;
using launcher::UsageError;

const std::vector<JobOptionRow>& job_option_table() {
    using J = JobOptions;
    static const std::vector<JobOptionRow> table = finish<J>(
        {
            // Found once the whole table is read, with --revision (resolve_job_options).
            applied(text<J>("--model", "DIR|NAME|ORG/NAME", &J::model,
                            "Diffusers model folder (model_index.json, transformer/, ...), the name of a model "
                            "shipped with dp-launch, or a Hugging Face repo id found in the local cache "
                            "($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub; no network)",
                            "a model folder, a shipped model's name or ORG/NAME"),
                    launcher::kDefaultModel),
            described(read_by(text<J>("--revision", "REV", &J::revision,
                                      "Branch, tag or commit hash (7 or more hex digits) of --model ORG/NAME in "
                                      "the Hugging Face cache"),
                              [](J& j, const std::string& t, const std::string& src) {
                                  if (t.empty() || t.find('\0') != std::string::npos || !launcher::is_valid_utf8(t))
                                      throw UsageError(src + ": expected a branch, a tag or a commit hash");
                                  j.revision = t;
                              }),
                      "main"),
            read_by(text<J>("--variant", "NAME", &J::variant,
                            "Weight files of this variant in every component folder (diffusers' variant: fp16 "
                            "reads NAME.fp16.safetensors or NAME.safetensors.index.fp16.json)"),
                    [](J& j, const std::string& t, const std::string& src) {
                        if (t.empty() || !protocol::is_variant_name(t))
                            throw UsageError(src + " '" + launcher::utf8_for_display(t.substr(0, 80)) +
                                             "': expected a variant name of letters, digits, '_' and '-', such "
                                             "as fp16 or bf16");
                        j.variant = t;
                    }),
            on_off<J>("--offload", &J::offload,
                      "Keep each component on the GPU only while it runs, as diffusers' enable_model_cpu_offload: "
                      "for a machine where even --device-map does not fit (slower: each use reads its weights "
                      "again)"),
            on_off<J>("--no-t5,--no_t5", &J::no_t5,
                      "Run without the T5 text encoder even when the model has one (its embeddings are then "
                      "zeros, as diffusers' text_encoder_3=None)"),
            u64<J>("--random-weights,--random_weights", "SEED", &J::random_weights,
                   "Use --model's configs with seeded random weights instead of its weights (tests, "
                   "benchmarks)"),
            read_by(text<J>("-o,--output-dir,--output_dir", "DIR", &J::output_dir,
                            "Where images and manifest.jsonl go"),
                    [](J& j, const std::string& t, const std::string& src) {
                        if (t.empty()) throw UsageError(src + ": expected a folder path");
                        j.output_dir = t;
                        while (j.output_dir.size() > 1 && j.output_dir.back() == '/') j.output_dir.pop_back();
                    }),
            described(whole<J>("--steps,--num-inference-steps,--num_inference_steps", "N", &J::steps, 1, 1000,
                               "Denoising steps"),
                      "the model folder's generation_defaults.json, else its family's: SD3 28, Qwen-Image 50, FLUX.1-dev 28, "
                      "FLUX.1-schnell 4"),
            described(number<J>("--guidance-scale,--guidance_scale", "X", &J::guidance_scale, 0, 100, "",
                                "SD3's classifier-free guidance scale (1 or less: no guidance); FLUX.1-dev's "
                                "embedded guidance"),
                      "the model folder's generation_defaults.json, else SD3 7.0, FLUX.1-dev 3.5"),
            described(number<J>("--true-cfg-scale,--true_cfg_scale", "X", &J::true_cfg_scale, 0, 100, "",
                                "Qwen-Image's and FLUX.1's classifier-free guidance scale: it runs above 1 for "
                                "prompts with a negative prompt"),
                      "the model folder's generation_defaults.json, else Qwen-Image 4.0, FLUX.1 1.0"),
            u64<J>("--seed", "N", &J::seed, "Base seed: a prompt without its own seed gets seed + its index"),
            described(whole<J>("--width", "PX", &J::width, 8, 8192, "Image width"), "the model's"),
            described(whole<J>("--height", "PX", &J::height, 8, 8192, "Image height"), "the model's"),
            described(whole<J>("--max-sequence-length,--max_sequence_length", "N", &J::max_sequence_length, 1, 1024,
                               "The text encoder's tokens per prompt (diffusers' max_sequence_length); SD3's and "
                               "FLUX's T5 take at most 512 (SD3 without T5: as many zero positions)"),
                      "the model folder's generation_defaults.json, else SD3 256, Qwen-Image 512, FLUX.1-dev 512, "
                      "FLUX.1-schnell 256"),
            described(row<J>(
                          "--skip-guidance-layers,--skip_guidance_layers", "BLOCKS", OptionKind::kText,
                          "Skip-layer guidance: transformer blocks a third branch skips, a comma list such as "
                          "7,8,9 (SD3.5 medium's); empty: none",
                          [](J& j, const std::string& t, const std::string& src) {
                              j.skip_guidance_layers = launcher::parse_block_list(t, src);
                          },
                          [](const J& j) { return launcher::block_list_text(j.skip_guidance_layers); }),
                      "off"),
            described(number<J>("--skip-layer-guidance-scale,--skip_layer_guidance_scale", "X",
                                &J::skip_layer_guidance_scale, 0, 100, "",
                                "How far skip-layer guidance moves the noise away from the skipping branch"),
                      "2.8"),
            described(number<J>("--skip-layer-guidance-start,--skip_layer_guidance_start", "F",
                                &J::skip_layer_guidance_start, 0, 1, "",
                                "Fraction of the steps after which skip-layer guidance runs (below the stop)"),
                      "0.01"),
            described(number<J>("--skip-layer-guidance-stop,--skip_layer_guidance_stop", "F",
                                &J::skip_layer_guidance_stop, 0, 1, "",
                                "Fraction of the steps after which skip-layer guidance stops"),
                      "0.2"),
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
            whole<J>(
                "--ulysses", "N", &J::ulysses, 1, 64,
                "Ulysses context parallelism: N ranks split each image's tokens and the heads (unevenly where N does "
                "not divide them; tp x ulysses at most the heads)"),
            whole<J>("--ring", "N", &J::ring, 1, 64,
                     "Ring context parallelism: N ranks split each image's tokens and pass keys and values "
                     "round a ring"),
            whole<J>("--tp", "N", &J::tp, 1, 64,
                     "Tensor parallelism: N ranks split the transformer's and T5's attention and MLP weights (by whole "
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
            choice<J>("--schedule", &J::schedule, {"auto", "static", "dynamic"},
                      "How the model replicas share the prompts: static gives each a contiguous share "
                      "(accelerate's split), dynamic lets each take the next prompt, costliest first, when it "
                      "is free; auto is dynamic when the prompts' estimated costs (steps x image tokens x "
                      "guidance branches) differ"),
            number<J>("--collective-timeout,--collective_timeout", "SECONDS", &J::collective_timeout_s, 1,
                      7 * 24 * 3600, "seconds",
                      "How long a rank waits in one collective (another rank died or hangs) before it stops "
                      "with exit code 75"),
            choice<J>("--dtype", &J::dtype, {"auto", "fp32", "bf16", "fp16"},
                      "Precision the model runs in; auto is bf16 on a GPU and fp32 on the CPU, decided by each "
                      "rank for its device"),
            choice<J>("--device", &J::device, {"auto", "cpu", "cuda"},
                      "auto: cuda:LOCAL_RANK when CUDA is available, else cpu"),
            bound(choice<J>("--mixed-precision,--mixed_precision", &J::dtype, {"no", "fp16", "bf16"},
                            "accelerate's spelling of --dtype: no is fp32"),
                  [](J& j, const std::string& t, const std::string& src) {
                      const std::string v = launcher::parse_choice(t, {"no", "fp16", "bf16"}, src);
                      j.dtype = v == "no" ? "fp32" : v;
                  },
                  [](const J& j) -> std::string {
                      if (j.dtype == "fp32") return "no";
                      return j.dtype == "fp16" || j.dtype == "bf16" ? j.dtype : "";
                  }),
            bound(on_off<J>("--cpu", &J::offload, "accelerate's spelling of --device cpu"),
                  [](J& j, const std::string& t, const std::string& src) {
                      if (launcher::parse_bool(t, src)) j.device = "cpu";
                  },
                  [](const J& j) -> std::string { return j.device == "cpu" ? "on" : "off"; }),
            described(read_by(row<J>(
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
            described(text<J>("--worker", "PATH", &J::worker, "The dp-worker executable"),
                      "the one next to dp-launch"),
        },
        "Pipeline options (with PROMPTS)");
    return table;
}

}  // namespace dp::cli
