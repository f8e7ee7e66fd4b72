#pragma once
// `dp-launch arguments --model M [--json]`: the call arguments a model's pipeline takes, from the
// call-argument table (protocol/call_arguments.h) and the model's folder: each one's name (the
// JSONL key), type, range, default, flag and what it does. Exactly these keys (and "prompt") are
// accepted in a prompt file for that model, and a line that leaves one out gets the listed default:
// the job's flag where one is given with the command, else the model's (its folder's
// generation_defaults.json, else its family's). No LibTorch, no model loading.

#include <string>

#include "launcher/job_options.h"

namespace dp::cli {

// The table as text, or with `json` an array of objects with "name", "type", "default", "min",
// "max", "flag" (null: none), "env", "jsonl_key", "aliases", "ignored", "shapes_pixels" and
// "help". Throws ModelError when the model folder cannot be read, and what the job refuses of the
// model and the settings (launcher::check_model_and_settings: ModelError 65, UsageError 2).
std::string describe_arguments(const launcher::JobOptions& job, bool json);

}  // namespace dp::cli
