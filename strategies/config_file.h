#pragma once
// The one reader of a model folder's JSON config files (model_index.json, config.json,
// tokenizer_config.json, ...) for the launcher, `plan` and the worker: through read_model_file, so
// that a FIFO or device in the folder is refused rather than read forever. No LibTorch.

#include <nlohmann/json.hpp>
#include <string>

namespace dp::strategies {

// `text`, the config at `path`, parsed. Throws protocol::ModelError "PATH: not valid JSON (...)".
nlohmann::json parse_config_json(const std::string& text, const std::string& path);

// The JSON at `path`. Throws protocol::ModelError "PATH: cannot read" when it is missing or cannot
// be read, "PATH: not valid JSON (...)" when it does not parse.
nlohmann::json read_config_json(const std::string& path);

// An optional config: an empty object when the file is absent (a model without a VAE or a
// tokenizer folder) or holds something other than an object; else read_config_json's.
nlohmann::json read_config_object_if_present(const std::string& path);

}  // namespace dp::strategies
