// Reading back what a main job wrote (job_outputs.h).
#include "integration/job_outputs.h"

#include <doctest/doctest.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "integration/launch_harness.h"

namespace dp::test {

// The largest difference of any channel between two PNG files of the same size (libpng's reader).
int max_pixel_difference(const std::string& a, const std::string& b) {
    std::vector<std::vector<uint8_t>> pixels;
    for (const std::string& path : {a, b}) {
        png_image image{};
        image.version = PNG_IMAGE_VERSION;
        REQUIRE(png_image_begin_read_from_file(&image, path.c_str()) != 0);
        image.format = PNG_FORMAT_RGB;
        pixels.emplace_back(PNG_IMAGE_SIZE(image));
        REQUIRE(png_image_finish_read(&image, nullptr, pixels.back().data(), 0, nullptr) != 0);
    }
    REQUIRE(pixels[0].size() == pixels[1].size());
    int worst = 0;
    for (std::size_t i = 0; i < pixels[0].size(); ++i)
        worst = std::max(worst, std::abs(pixels[0][i] - pixels[1][i]));
    return worst;
}
// The fp32 values of the one tensor of a NAME.latents.safetensors file (DP_SAVE_LATENTS=1).
std::vector<float> read_latents(const std::string& path) {
    const std::string bytes = read_file(path);
    REQUIRE(bytes.size() >= 8);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i)
        len = (len << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
    REQUIRE(8 + len <= bytes.size());
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len));
    const auto& info = header.at("latents");
    REQUIRE(info.at("dtype") == "F32");
    const std::size_t begin = info.at("data_offsets")[0], end = info.at("data_offsets")[1];
    REQUIRE(8 + len + end <= bytes.size());
    std::vector<float> values((end - begin) / 4);
    std::memcpy(values.data(), bytes.data() + 8 + len + begin, values.size() * 4);
    return values;
}

float max_latent_difference(const std::string& a, const std::string& b) {
    const std::vector<float> x = read_latents(a), y = read_latents(b);
    REQUIRE(x.size() == y.size());
    float worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    return worst;
}

std::vector<nlohmann::json> read_manifest(const std::string& out) {
    std::vector<nlohmann::json> records;
    std::istringstream in(read_file(out + "/manifest.jsonl"));
    for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    return records;
}

}  // namespace dp::test
