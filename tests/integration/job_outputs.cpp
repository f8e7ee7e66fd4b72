// Reading back what a main job wrote (job_outputs.h).
#include "integration/job_outputs.h"

#include <doctest/doctest.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "integration/launch_harness.h"

namespace dp::test {

std::vector<uint8_t> read_png_rgb(const std::string& path, int* width, int* height) {
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    REQUIRE_MESSAGE(png_image_begin_read_from_file(&image, path.c_str()) != 0, path);
    image.format = PNG_FORMAT_RGB;
    std::vector<uint8_t> pixels(PNG_IMAGE_SIZE(image));
    REQUIRE(png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr) != 0);
    if (width) *width = static_cast<int>(image.width);
    if (height) *height = static_cast<int>(image.height);
    return pixels;
}

namespace {
// A safetensors file's bytes and its parsed header; the data start right after it.
struct Safetensors {
    std::string bytes;
    nlohmann::json header;
    std::size_t data = 0;
};
Safetensors open_safetensors(const std::string& path) {
    Safetensors f;
    f.bytes = read_file(path);
    REQUIRE_MESSAGE(f.bytes.size() >= 8, path);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i)
        len = (len << 8) | static_cast<unsigned char>(f.bytes[static_cast<std::size_t>(i)]);
    REQUIRE(8 + len <= f.bytes.size());
    f.header = nlohmann::json::parse(f.bytes.substr(8, len));
    f.data = 8 + len;
    return f;
}
}  // namespace

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

std::map<std::string, std::string> read_png_texts(const std::string& path) {
    std::map<std::string, std::string> out;
    FILE* f = std::fopen(path.c_str(), "rb");
    REQUIRE(f != nullptr);
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, nullptr);
        std::fclose(f);
        FAIL("libpng could not read " << path);
    }
    png_init_io(png, f);
    png_read_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
    png_textp texts = nullptr;
    const int n = png_get_text(png, info, &texts, nullptr);
    for (int i = 0; i < n; ++i)
        out[texts[i].key] =
            std::string(texts[i].text, texts[i].itxt_length ? texts[i].itxt_length : texts[i].text_length);
    png_destroy_read_struct(&png, &info, nullptr);
    std::fclose(f);
    return out;
}

std::string utf16be(const std::string& ascii) {
    std::string out;
    for (char c : ascii) out += std::string(1, '\0') + c;
    return out;
}

std::vector<uint8_t> read_safetensors_tensor(const std::string& path, const std::string& name,
                                             std::string* dtype, std::vector<int64_t>* shape) {
    const Safetensors f = open_safetensors(path);
    REQUIRE_MESSAGE(f.header.contains(name), path << " has no tensor " << name);
    const auto& info = f.header.at(name);
    if (dtype) *dtype = info.at("dtype").get<std::string>();
    if (shape) *shape = info.at("shape").get<std::vector<int64_t>>();
    const std::size_t begin = info.at("data_offsets")[0], end = info.at("data_offsets")[1];
    REQUIRE(begin <= end);
    REQUIRE(f.data + end <= f.bytes.size());
    return std::vector<uint8_t>(f.bytes.begin() + static_cast<std::ptrdiff_t>(f.data + begin),
                                f.bytes.begin() + static_cast<std::ptrdiff_t>(f.data + end));
}

std::string read_safetensors_metadata(const std::string& path, const std::string& key) {
    const Safetensors f = open_safetensors(path);
    const bool has = f.header.contains("__metadata__") && f.header["__metadata__"].contains(key);
    REQUIRE_MESSAGE(has, path << " has no metadata " << key);
    return f.header["__metadata__"][key].get<std::string>();
}

// The largest difference of any channel between two PNG files of the same size.
int max_pixel_difference(const std::string& a, const std::string& b) {
    const std::vector<uint8_t> x = read_png_rgb(a), y = read_png_rgb(b);
    REQUIRE(x.size() == y.size());
    int worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
    return worst;
}

// The fp32 values of the one tensor of a NAME.latents.safetensors file (DP_SAVE_LATENTS=1).
std::vector<float> read_latents(const std::string& path) { return golden_f32(path, "latents"); }

float max_latent_difference(const std::string& a, const std::string& b) {
    return max_difference(read_latents(a), read_latents(b));
}

PixelDifference png_against_golden(const std::string& png, const std::string& golden_file,
                                   const std::string& tensor) {
    int width = 0, height = 0;
    const std::vector<uint8_t> ours = read_png_rgb(png, &width, &height);
    std::vector<int64_t> shape;
    const std::vector<uint8_t> theirs = read_safetensors_tensor(golden_file, tensor, nullptr, &shape);
    REQUIRE(shape == std::vector<int64_t>{height, width, 3});
    REQUIRE(ours.size() == theirs.size());
    PixelDifference d;
    double total = 0;
    std::size_t within = 0;
    for (std::size_t i = 0; i < ours.size(); ++i) {
        const int diff = std::abs(ours[i] - theirs[i]);
        within += diff <= 1;
        total += diff;
        d.max = std::max(d.max, diff);
    }
    d.within_one = static_cast<double>(within) / static_cast<double>(ours.size());
    d.mean = total / static_cast<double>(ours.size());
    return d;
}

std::vector<float> golden_f32(const std::string& golden_file, const std::string& tensor) {
    std::string dtype;
    const std::vector<uint8_t> raw = read_safetensors_tensor(golden_file, tensor, &dtype);
    REQUIRE(dtype == "F32");
    std::vector<float> out(raw.size() / sizeof(float));
    std::memcpy(out.data(), raw.data(), out.size() * sizeof(float));
    return out;
}

float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    float worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    return worst;
}

void remove_dir(const std::string& dir) { REQUIRE(std::system(("rm -rf '" + dir + "'").c_str()) == 0); }

std::string write_lines(const std::string& path, const std::vector<nlohmann::json>& lines) {
    std::ofstream out(path, std::ios::binary);
    for (const nlohmann::json& line : lines) out << line.dump() << "\n";
    return path;
}

nlohmann::json golden_line(const nlohmann::json& c) {
    nlohmann::json line = {{"prompt", c.at("prompt")},
                           {"seed", c.at("seed")},
                           {"guidance_scale", c.at("guidance_scale")},
                           {"width", c.at("width")},
                           {"height", c.at("height")},
                           {"num_inference_steps", c.at("steps")},
                           {"max_sequence_length", c.at("max_sequence_length")}};
    if (c.contains("negative_prompt")) line["negative_prompt"] = c.at("negative_prompt");
    return line;
}

std::vector<nlohmann::json> read_manifest(const std::string& out) {
    std::vector<nlohmann::json> records;
    std::istringstream in(read_file(out + "/manifest.jsonl"));
    for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    return records;
}

}  // namespace dp::test
