#pragma once
// Every prompt's settings for the main job, resolved and checked before anything starts: a prompt
// file's record over the job's flags, against what the model can make (its sizes, its transformer
// blocks) and what it needs (strategies::model_folder_problems); and the manifest record each
// prompt starts with. No LibTorch.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "launcher/job_options.h"
#include "launcher/prompt_file.h"
#include "launcher/resolved_job.h"
#include "protocol/job_file.h"
#include "strategies/device_map.h"
#include "strategies/model_config.h"

namespace dp::launcher {

// Note [call arguments]: each family's pipeline takes its own call arguments, by diffusers' names,
// listed with diffusers' defaults in the one call-argument table (protocol/call_arguments.h). A
// flag or JSONL key that the model's family does not take is refused, naming the family and what
// it takes, rather than ignored: a Qwen-Image job given guidance_scale would otherwise run at
// its true CFG scale's default without a word. A setting left unset takes the model's default (its
// family's, or its folder's generation_defaults.json) when the request is made.

// The job's own setting of the family's CFG scale (--guidance-scale or --true-cfg-scale), if any.
std::optional<double> cfg_scale_setting(const JobOptions& job, const protocol::FamilyArguments& arguments);

// Each of the job's own settings (flags, DP_* variables, config) the model or the others refuse, as
// "--width 33: ..." naming the flag and what is accepted. Empty: none. With the device map as
// given (--device-map); the resolved job's own (--strategy device-map gives one) in the second form.
std::vector<std::string> job_setting_problems(const JobOptions& job, const strategies::ModelInfo& model);
std::vector<std::string> job_setting_problems(const ResolvedJob& job);

// Why `model` takes no negative prompt (a pipeline without classifier-free guidance: FLUX.1-Fill).
std::string no_negative_prompt(const strategies::ModelInfo& model);

// A valid prompt record's settings, its own over the job's, against the model: an error text naming
// the key (the record becomes an invalid line), or empty.
std::string prompt_setting_problem(const PromptRecord& p, const JobOptions& job,
                                   const strategies::ModelInfo& model);

// The model folder's problems for this job, with the flags that would help (--variant, --no-t5),
// and the model's own defaults this job would take that the model refuses (its default size, a
// default past its range or its blocks).
std::vector<std::string> model_problems(const JobOptions& job, const strategies::ModelInfo& model);

// Throws ModelError (model_problems) or UsageError (job_setting_problems with `device_map`) listing
// every problem: what the job refuses of its model and its settings, before its strategy (what
// `dp-launch arguments` refuses as the job would).
void check_model_and_settings(const JobOptions& job, const strategies::ModelInfo& model,
                              const std::string& device_map);
// check_model_and_settings for the resolved job, with its own device map.
void check_job(const ResolvedJob& job);

// Where the job's prompts come from: --prompt's texts, else the PROMPTS file, each line with
// --num-images-per-prompt images unless it says its own.
PromptSource prompt_source(const JobOptions& job);

// Note [batch edits]: with --prompt, an --image that is a glob ('photos/*.jpg') or a folder is
// the images to edit, one line per prompt and image: the glob's matches or the folder's PNG, JPEG
// and WebP files, sorted by name. Empty for any other job. Throws Error 66 when nothing matches,
// UsageError for a glob or folder without --prompt (a prompt file's lines name their own).
std::vector<std::string> batch_edit_images(const JobOptions& job);
// Whether --image is a glob or a folder (batch_edit_images' list), not one image.
bool image_is_a_batch(const JobOptions& job);

// The request for prompt `p`: its own settings, else the job's, else the model's defaults.
protocol::JobRequest job_request(const PromptRecord& p, const JobOptions& job,
                                 const strategies::ModelInfo& model);

// The precision the ranks will run in: `job.dtype`, or what auto gives on the device they get
// (bf16 on a GPU; on the CPU bf16 where it has bf16 instructions and the transformer is `width`
// features wide or more, else fp32: Note [bf16 on a CPU that has it], strategies/cpu_dtype.h):
// --device, or `strategy`'s device map (the devices of its plan, when the launcher made one; else
// the visible GPUs), or for --device auto whether this node shows a GPU. The ranks say what they
// resolved (protocol::StartEvent::dtype), which the manifest then records.
std::string expected_dtype(const JobOptions& job, const strategies::ResolvedStrategy& strategy,
                           int64_t width);

// What expected_dtype means for auto, in words, for `plan` ("auto: bf16 on a GPU, and on a CPU
// with bf16 instructions ...; fp32 here (no GPU is visible; the CPU has no bf16 instructions)").
std::string describe_dtype(const JobOptions& job, const strategies::ResolvedStrategy& strategy,
                           int64_t width);

// A prompt's manifest record before any rank reports it (status "pending"): its request and every
// setting that changes its pixels (manifest.h: pixel_setting_differences). `dtype` is
// expected_dtype's. The request holds only the call arguments the family takes; one that has no
// effect (a skip-layer setting without skipped blocks: CallArgument::active_with) is left out.
// `components`: the component files' records (component -> path, sha256, format), or null.
nlohmann::json pending_record(const protocol::JobRequest& q, int64_t line, const JobOptions& job,
                              const std::string& dtype, const nlohmann::json& components = nullptr);

}  // namespace dp::launcher
