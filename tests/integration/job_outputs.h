#pragma once
// Reading back what a main job wrote, for the integration tests: the manifest, PNG pixels
// (libpng), the final latents of DP_SAVE_LATENTS=1, and the largest differences between two runs'
// outputs.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dp::test {

// The RGB bytes of a PNG file, row by row (libpng's reader); width and height through the pointers.
std::vector<uint8_t> read_png_rgb(const std::string& path, int* width = nullptr, int* height = nullptr);
// The text chunks of a PNG file (tEXt, zTXt and iTXt) by key, through libpng.
std::map<std::string, std::string> read_png_texts(const std::string& path);
// `text` in UTF-16BE, as EXIF's UserComment holds it after "UNICODE\0".
std::string utf16be(const std::string& ascii);
// The bytes of tensor `name` in a safetensors file, with its dtype ("U8", "F32", ...) and shape.
std::vector<uint8_t> read_safetensors_tensor(const std::string& path, const std::string& name,
                                             std::string* dtype = nullptr,
                                             std::vector<int64_t>* shape = nullptr);
// The string under `key` in a safetensors file's __metadata__.
std::string read_safetensors_metadata(const std::string& path, const std::string& key);
// The largest difference of any channel between two PNG files of the same size.
int max_pixel_difference(const std::string& a, const std::string& b);
// The fp32 values of the one tensor of a NAME.latents.safetensors file.
std::vector<float> read_latents(const std::string& path);
float max_latent_difference(const std::string& a, const std::string& b);
// A PNG against a reference image (a golden file's uint8 [height, width, 3] tensor).
struct PixelDifference {
    double within_one = 0;  // the share of channels within 1
    double mean = 0;
    int max = 0;
};
PixelDifference png_against_golden(const std::string& png, const std::string& golden_file,
                                   const std::string& tensor);
// A golden file's fp32 tensor, flat.
std::vector<float> golden_f32(const std::string& golden_file, const std::string& tensor);
// The largest difference between two equally long lists of values.
float max_difference(const std::vector<float>& a, const std::vector<float>& b);
// rm -rf, checked.
void remove_dir(const std::string& dir);
// A prompt file of `lines`, one JSON object a line; returns `path`.
std::string write_lines(const std::string& path, const std::vector<nlohmann::json>& lines);
// A golden case's call as a JSONL line by diffusers' names: prompt, seed, guidance_scale, width,
// height, num_inference_steps (its steps), max_sequence_length, and its negative prompt when it
// has one.
nlohmann::json golden_line(const nlohmann::json& c);

// The lines of `text`, without their newlines.
std::vector<std::string> lines_of(const std::string& text);

// The records of OUT/manifest.jsonl, in order.
std::vector<nlohmann::json> read_manifest(const std::string& out);

}  // namespace dp::test
