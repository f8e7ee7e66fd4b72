#pragma once
// A golden case's call (scripts/golden/*.py write them in their files' metadata) as a request:
// prompt, negative_prompt (when given and not null), seed, steps, width, height, and the call
// arguments the case sets (guidance_scale, true_cfg_scale, max_sequence_length); and the repository
// path of a case's "folder" or "file".

#include <nlohmann/json.hpp>
#include <string>

#include "runtime/pipeline/pipeline.h"

namespace dp::test {

inline runtime::GenerateRequest golden_request(const nlohmann::json& c) {
    runtime::GenerateRequest r;
    r.prompt = c.at("prompt").get<std::string>();
    if (c.contains("negative_prompt") && !c.at("negative_prompt").is_null())
        r.negative_prompt = c.at("negative_prompt").get<std::string>();
    r.seed = c.at("seed").get<uint64_t>();
    r.steps = c.at("steps").get<int>();
    r.width = c.at("width").get<int>();
    r.height = c.at("height").get<int>();
    for (const char* key : {"guidance_scale", "true_cfg_scale"})
        if (c.contains(key)) r.arguments.set(key, c.at(key).get<double>());
    if (c.contains("max_sequence_length"))
        r.arguments.set("max_sequence_length", int64_t{c.at("max_sequence_length").get<int>()});
    return r;
}

// `relative` (to the repository's root) as a path.
inline std::string repository_path(const std::string& relative) {
    return std::string(DP_GOLDEN_DIR) + "/../../../" + relative;
}

}  // namespace dp::test
