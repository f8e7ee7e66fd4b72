#pragma once
// Reading back what a main job wrote, for the integration tests: the manifest, PNG pixels
// (libpng), the final latents of DP_SAVE_LATENTS=1, and the largest differences between two runs'
// outputs.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dp::test {

// The largest difference of any channel between two PNG files of the same size.
int max_pixel_difference(const std::string& a, const std::string& b);
// The fp32 values of the one tensor of a NAME.latents.safetensors file.
std::vector<float> read_latents(const std::string& path);
float max_latent_difference(const std::string& a, const std::string& b);
// The records of OUT/manifest.jsonl, in order.
std::vector<nlohmann::json> read_manifest(const std::string& out);

}  // namespace dp::test
