#pragma once
// A golden case's call (scripts/golden/*.py write them in their files' metadata) as a request:
// prompt, negative_prompt (when given and not null), seed, steps, width, height, and the call
// arguments the case sets (guidance_scale, true_cfg_scale, max_sequence_length, skip-layer
// guidance); a case of several prompts as its requests; the cases a golden file holds; and the
// repository path of a case's "folder" or "file".

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "images/input_image.h"
#include "runtime/pipeline/pipeline.h"
#include "support/test_paths.h"

namespace dp::test {

// `relative` (to the repository's root) as a path.
inline std::string repository_path(const std::string& relative) {
    return std::string(DP_GOLDEN_DIR) + "/../../../" + relative;
}

inline runtime::GenerateRequest golden_request(const nlohmann::json& c) {
    runtime::GenerateRequest r;
    r.prompt = c.at("prompt").get<std::string>();
    if (c.contains("negative_prompt") && !c.at("negative_prompt").is_null())
        r.negative_prompt = c.at("negative_prompt").get<std::string>();
    r.seed = c.at("seed").get<uint64_t>();
    r.steps = c.at("steps").get<int>();
    // No size asked (null): the size the launcher makes of the input (Note [output size]), which
    // the case records as out_width and out_height.
    const bool asked = !c.at("width").is_null();
    r.width = c.at(asked ? "width" : "out_width").get<int>();
    r.height = c.at(asked ? "height" : "out_height").get<int>();
    for (const char* key : {"guidance_scale", "true_cfg_scale", "skip_layer_guidance_scale",
                            "skip_layer_guidance_start", "skip_layer_guidance_stop", "cfg_truncation"})
        if (c.contains(key)) r.arguments.set(key, c.at(key).get<double>());
    if (c.contains("cfg_normalization"))  // diffusers takes a bool (true: 1) or a number
        r.arguments.set("cfg_normalization", c.at("cfg_normalization").is_boolean()
                                                 ? double(c.at("cfg_normalization").get<bool>())
                                                 : c.at("cfg_normalization").get<double>());
    if (c.contains("max_sequence_length"))
        r.arguments.set("max_sequence_length", int64_t{c.at("max_sequence_length").get<int>()});
    if (c.contains("skip_guidance_layers"))
        r.arguments.set("skip_guidance_layers", c.at("skip_guidance_layers").get<std::vector<int>>());
    // An edit: its input and mask, repository-relative, with their decoded sizes, as the launcher
    // resolves them; "images": a list of pictures (Qwen-Image-Edit-Plus), or one.
    const auto resolved = [](const std::string& path) {
        protocol::InputImage image{repository_path(path)};
        const images::RgbImage pixels = images::decode_image(image.path);
        image.width = pixels.width, image.height = pixels.height;
        return image;
    };
    for (const char* key : {"image", "mask_image"})
        if (c.contains(key)) r.arguments.set(key, resolved(c.at(key).get<std::string>()));
    if (c.contains("images") && !c.at("images").empty()) {
        std::vector<protocol::InputImage> pictures;
        for (const nlohmann::json& path : c.at("images"))
            pictures.push_back(resolved(path.get<std::string>()));
        r.arguments.set("image", protocol::InputImage::of(pictures));
    }
    if (c.contains("positions"))  // Note [Qwen2.5-VL positions with images]
        r.arguments.set("sequential_positions", int64_t{c.at("positions") == "sequential"});
    if (c.contains("strength")) r.arguments.set("strength", c.at("strength").get<double>());
    for (const char* key : {"max_area", "padding_mask_crop"})
        if (c.contains(key)) r.arguments.set(key, c.at(key).get<int64_t>());
    // The sampler (Note [one scheduler table]), as a prompt line gives it.
    for (const char* key : {"scheduler", "scheduler_config", "sigmas", "timesteps"})
        if (c.contains(key)) {
            protocol::CallValue v;
            if (protocol::read_call_value(*protocol::find_call_argument(key), c.at(key), v).empty())
                r.arguments.set(key, std::move(v));
        }
    return r;
}

// A case of several prompts ("prompts", each with its seed in "seeds") as one request each; a case
// of one "prompt" as its request.
inline std::vector<runtime::GenerateRequest> golden_requests(const nlohmann::json& c) {
    if (!c.contains("prompts")) return {golden_request(c)};
    std::vector<runtime::GenerateRequest> out;
    for (std::size_t k = 0; k < c.at("prompts").size(); ++k) {
        nlohmann::json one = c;
        one["prompt"] = c.at("prompts")[k];
        one["seed"] = c.at("seeds")[k];
        out.push_back(golden_request(one));
    }
    return out;
}

// The cases (calls and their settings) in a golden file's metadata.
template <class File>
nlohmann::json golden_cases(const File& file) {
    return nlohmann::json::parse(file->metadata().at("cases"));
}

}  // namespace dp::test
