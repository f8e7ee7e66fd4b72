// The input images (images/input_image.h, Note [input images]): every kind of file decoded to the
// pixels PIL gives diffusers, Pillow's resizes and convert("L") byte for byte
// (scripts/golden/golden_images.py), and the files refused, each with its name in the message.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "images/input_image.h"
#include "images/vae_image_processor.h"
#include "protocol/errors.h"
#include "strategies/safetensors.h"
#include "support/test_paths.h"
#include "unit/fifo_unblocker.h"
#include "unit/temp_dir.h"
#include "unit/test_support.h"

using namespace dp::images;
using dp::test::has;

namespace {

std::string input(const std::string& name) { return std::string(DP_GOLDEN_DIR) + "/images/" + name; }

// The golden file and its cases (the "cases" metadata).
struct Golden {
    std::shared_ptr<dp::strategies::SafetensorsFile> file =
        dp::strategies::SafetensorsFile::read(std::string(DP_GOLDEN_DIR) + "/images.safetensors");
    nlohmann::json cases = nlohmann::json::parse(file->metadata().at("cases"));

    // Tensor `name` (U8 [height, width, channels]) as width, height and bytes.
    std::vector<uint8_t> bytes(const std::string& name, int& width, int& height) const {
        const auto& info = file->info(name);
        REQUIRE(info.dtype == dp::strategies::StDType::kU8);
        REQUIRE(info.shape.size() >= 2);
        height = static_cast<int>(info.shape[0]);
        width = static_cast<int>(info.shape[1]);
        const auto* data = reinterpret_cast<const uint8_t*>(file->data(name));
        return std::vector<uint8_t>(data, data + info.nbytes);
    }
    RgbImage rgb(const std::string& name) const {
        RgbImage image;
        image.rgb = bytes(name, image.width, image.height);
        return image;
    }
};

// golden_images.pattern(width, height), computed alike.
RgbImage pattern(int width, int height) {
    RgbImage image{width, height, std::vector<uint8_t>(static_cast<std::size_t>(width) * height * 3)};
    for (int y = 0; y < height; ++y) {
        for (int x = 0; x < width; ++x) {
            uint8_t* p = &image.rgb[(static_cast<std::size_t>(y) * width + x) * 3];
            p[0] = static_cast<uint8_t>((3 * x + 7 * y + ((x * y) >> 2)) % 256);
            p[1] = static_cast<uint8_t>((5 * x + 2 * y * y) % 256);
            p[2] =
                static_cast<uint8_t>((x / 4 + y / 3) % 2 == 0 ? 230 - (x * 255) / std::max(width - 1, 1) / 2
                                                              : 20 + (y * 255) / std::max(height - 1, 1) / 2);
        }
    }
    return image;
}

// An input file's pixels, or a pattern ("pattern:400x300").
RgbImage source(const std::string& spec) {
    if (spec.rfind("pattern:", 0) != 0) return decode_image(input(spec));
    const auto x = spec.find('x');
    return pattern(std::stoi(spec.substr(8, x - 8)), std::stoi(spec.substr(x + 1)));
}

// The count of bytes that differ, and the first one's place, for a failure message.
std::string difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
    if (got.size() != want.size())
        return std::to_string(got.size()) + " bytes where Pillow has " + std::to_string(want.size());
    std::size_t n = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i] && n++ == 0) first = i;
    if (n == 0) return "equal";
    return std::to_string(n) + " bytes differ, the first at " + std::to_string(first) + " (" +
           std::to_string(got[first]) + " where Pillow has " + std::to_string(want[first]) + ")";
}

// `jpeg` with an APP1 segment of `payload` after its SOI.
std::string jpeg_with_app1(const std::string& jpeg, const std::string& payload) {
    const auto length = static_cast<uint16_t>(payload.size() + 2);
    return jpeg.substr(0, 2) + "\xff\xe1" + std::string(1, static_cast<char>(length >> 8)) +
           std::string(1, static_cast<char>(length & 0xff)) + payload + jpeg.substr(2);
}

// A PNG chunk: its length, type, data and CRC.
std::string png_chunk(const std::string& type, const std::string& data) {
    const auto be32 = [](uint32_t v) {
        return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                           static_cast<char>(v)};
    };
    const std::string body = type + data;
    const auto crc =
        static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size()));
    return be32(static_cast<uint32_t>(data.size())) + body + be32(crc);
}

std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

// The message decode_image (and, with `header_only`, read_image_info) throws for `path`.
std::string refusal(const std::string& path, bool header_only = false) {
    try {
        if (header_only)
            read_image_info(path);
        else
            decode_image(path);
    } catch (const dp::protocol::InputDataError& e) {
        return e.what();
    }
    return "(accepted)";
}

}  // namespace

TEST_CASE("every kind of input image decodes to the pixels PIL gives diffusers' load_image") {
    const Golden golden;
    const auto& inputs = golden.cases.at("inputs");
    REQUIRE(inputs.size() >= 30);
    for (const auto& [name, tensor] : inputs.items()) {
        CAPTURE(name);
        const RgbImage want = golden.rgb(tensor.get<std::string>());
        const RgbImage got = decode_image(input(name));
        CHECK(got.width == want.width);
        CHECK(got.height == want.height);
        CHECK_MESSAGE(got.rgb == want.rgb, difference(got.rgb, want.rgb));
        // The header: the format by its contents, the size as stored (EXIF orientations 5 to 8
        // swap it in the pixels).
        const ImageInfo info = read_image_info(input(name));
        CHECK(name.rfind(info.format == "jpeg" ? "jpeg_" : info.format + "_", 0) == 0);
        const bool swapped = info.width != got.width;
        CHECK((swapped ? info.height : info.width) == got.width);
        CHECK((swapped ? info.width : info.height) == got.height);
    }
}

TEST_CASE("resizes equal Pillow's Image.resize byte for byte, for each filter") {
    const Golden golden;
    const std::map<std::string, Resample> filters = {{"lanczos", Resample::kLanczos},
                                                     {"bicubic", Resample::kBicubic},
                                                     {"bilinear", Resample::kBilinear},
                                                     {"nearest", Resample::kNearest}};
    for (const auto& c : golden.cases.at("resizes")) {
        const std::string spec = c.at("source"), filter = c.at("filter");
        CAPTURE(spec);
        CAPTURE(filter);
        const int width = c.at("width"), height = c.at("height");
        CAPTURE(width);
        CAPTURE(height);
        const RgbImage want = golden.rgb(c.at("tensor").get<std::string>());
        const RgbImage got = resize(source(spec), width, height, filters.at(filter));
        CHECK(got.width == width);
        CHECK(got.height == height);
        CHECK_MESSAGE(got.rgb == want.rgb, difference(got.rgb, want.rgb));
    }
    // diffusers' names for them (VaeImageProcessor's `resample`)
    for (const auto& [name, mode] : filters) CHECK(resample_by_name(name) == mode);
    CHECK(resample_by_name("linear") == Resample::kBilinear);
    CHECK_FALSE(resample_by_name("Lanczos").has_value());
    CHECK_FALSE(resample_by_name("box").has_value());
}

TEST_CASE("a same-size resize is a copy, and a resize to nothing is refused") {
    const RgbImage image = pattern(37, 23);
    for (Resample mode : {Resample::kLanczos, Resample::kBicubic, Resample::kBilinear, Resample::kNearest})
        CHECK(resize(image, 37, 23, mode).rgb == image.rgb);
    CHECK_THROWS_AS(resize(image, 0, 23), std::invalid_argument);
    CHECK_THROWS_AS(resize(image, 37, -1), std::invalid_argument);
    CHECK_THROWS_AS(resize(RgbImage{}, 8, 8), std::invalid_argument);
}

TEST_CASE(
    "an inpainting's padding_mask_crop as diffusers' VaeImageProcessor makes it, byte for byte: resizes of a "
    "box, the fill and crop modes, the crop region of a mask, the overlay through the mask") {
    const Golden golden;
    const std::map<std::string, Resample> filters = {
        {"lanczos", Resample::kLanczos}, {"bicubic", Resample::kBicubic}, {"bilinear", Resample::kBilinear}};
    const auto grey = [&](const std::string& name) {
        GreyImage g;
        g.grey = golden.bytes(golden.cases.at("masks").at(name).get<std::string>(), g.width, g.height);
        return g;
    };
    for (const auto& c : golden.cases.at("box_resizes")) {
        CAPTURE(c.dump());
        const std::vector<float> b = c.at("box");
        const RgbImage got = resize(source(c.at("source")), c.at("width"), c.at("height"),
                                    filters.at(c.at("filter")), {b[0], b[1], b[2], b[3]});
        const RgbImage want = golden.rgb(c.at("tensor").get<std::string>());
        CHECK(got.width == want.width);
        CHECK_MESSAGE(got.rgb == want.rgb, difference(got.rgb, want.rgb));
    }
    REQUIRE(golden.cases.at("modes").size() == 9);
    for (const auto& c : golden.cases.at("modes")) {
        CAPTURE(c.dump());
        const RgbImage in = source(c.at("source"));
        const RgbImage got = c.at("mode") == "fill" ? resize_fill(in, c.at("width"), c.at("height"))
                                                    : resize_crop(in, c.at("width"), c.at("height"));
        const RgbImage want = golden.rgb(c.at("tensor").get<std::string>());
        CHECK(got.height == want.height);
        CHECK_MESSAGE(got.rgb == want.rgb, difference(got.rgb, want.rgb));
    }
    for (const auto& c : golden.cases.at("crop_regions")) {
        CAPTURE(c.dump());
        const std::vector<int> b = c.at("box");
        CHECK(crop_region(grey(c.at("mask")), c.at("width"), c.at("height"), c.at("pad")) ==
              Box{b[0], b[1], b[2], b[3]});
    }
    REQUIRE(golden.cases.at("overlays").size() == 4);
    for (const auto& c : golden.cases.at("overlays")) {
        CAPTURE(c.dump());
        const std::vector<int> b = c.at("box");
        const RgbImage got =
            apply_overlay(grey(c.at("mask")), source(c.at("source")),
                          golden.rgb(c.at("generated").get<std::string>()), {b[0], b[1], b[2], b[3]});
        const RgbImage want = golden.rgb(c.at("tensor").get<std::string>());
        CHECK(got.width == want.width);
        CHECK_MESSAGE(got.rgb == want.rgb, difference(got.rgb, want.rgb));
    }
    // What diffusers fails on, refused: a mask with nothing to crop around, a mask of another size.
    CHECK_THROWS_AS(crop_region(GreyImage{4, 4, std::vector<uint8_t>(16, 0)}, 8, 8, 2),
                    std::invalid_argument);
    CHECK_THROWS_AS(apply_overlay(grey("b"), pattern(64, 48), pattern(8, 8), {0, 0, 8, 8}),
                    std::invalid_argument);
    CHECK_THROWS_AS(crop(pattern(8, 8), {4, 4, 9, 6}), std::invalid_argument);
}

TEST_CASE("convert L equals Pillow's fixed-point luma") {
    const Golden golden;
    for (const auto& c : golden.cases.at("greys")) {
        const std::string spec = c.at("source");
        CAPTURE(spec);
        int width = 0, height = 0;
        const std::vector<uint8_t> want = golden.bytes(c.at("tensor").get<std::string>(), width, height);
        const GreyImage got = to_grey(source(spec));
        CHECK(got.width == width);
        CHECK(got.height == height);
        CHECK_MESSAGE(got.grey == want, difference(got.grey, want));
    }
}

TEST_CASE("input images that cannot be read are refused with the file named and what is accepted") {
    namespace fs = std::filesystem;
    const dp::test::TempDir dir("images");
    const std::string png = file_bytes(input("png_rgb8.png")), jpeg = file_bytes(input("jpeg_420.jpg"));
    const std::string webp = file_bytes(input("webp_lossy.webp"));
    const auto put = [](const std::string& path, const std::string& bytes) {
        std::ofstream(path, std::ios::binary) << bytes;
    };
    // The JPEG with an APP1 segment of `payload` after its SOI, and its JFIF density unit set.
    const auto with_app1 = [&](const std::string& payload, char unit) {
        std::string out = jpeg_with_app1(jpeg, payload);
        REQUIRE(out.compare(2 + 4 + payload.size(), 6, std::string("\xff\xe0\x00\x10JF", 6)) == 0);
        out[2 + 4 + payload.size() + 11] = unit;
        return out;
    };
    // The PNG with an eXIf chunk of `payload` before its IEND.
    const auto png_with_exif = [&](const std::string& payload) {
        return png.substr(0, png.size() - 12) + png_chunk("eXIf", payload) + png.substr(png.size() - 12);
    };
    struct Case {
        const char* what;
        std::function<void(const std::string&)> make;  // writes the file at the path given
        const char* message;                           // part of the refusal
        bool header = true;                            // read_image_info refuses it too
    };
    const Case cases[] = {
        {"a truncated PNG", [&](const std::string& p) { put(p, png.substr(0, png.size() * 2 / 3)); },
         "a damaged or truncated PNG file", false},
        {"a truncated JPEG", [&](const std::string& p) { put(p, jpeg.substr(0, jpeg.size() * 2 / 3)); },
         "a damaged or truncated JPEG file (Premature end of JPEG file)", false},
        {"a JPEG without its end marker",
         [&](const std::string& p) { put(p, jpeg.substr(0, jpeg.size() - 2)); },
         "a damaged or truncated JPEG file", false},
        {"a truncated WebP", [&](const std::string& p) { put(p, webp.substr(0, webp.size() - 40)); },
         "a truncated WebP file", false},
        {"a JPEG whose EXIF is no TIFF structure, its resolution in its JFIF segment",
         [&](const std::string& p) { put(p, with_app1(std::string("Exif\0\0garbage!", 14), 1)); },
         "its EXIF data is no TIFF structure", false},
        {"a PNG whose EXIF is no TIFF structure",
         [&](const std::string& p) { put(p, png_with_exif("IIgarbage")); },
         "its EXIF data is no TIFF structure", false},
        {"a progressive JPEG of over 1000 scans (its first scan, with its tables, 1000 times more: PIL "
         "decodes it)",
         [&](const std::string& p) {
             const std::string progressive = file_bytes(input("jpeg_progressive.jpg"));
             const std::size_t tables = progressive.find("\xff\xc4"), scan = progressive.find("\xff\xda");
             const std::string first =
                 progressive.substr(tables, progressive.find("\xff\xc4", scan) - tables);
             std::string scans;
             for (int i = 0; i < 1000; ++i) scans += first;
             put(p, progressive.substr(0, progressive.size() - 2) + scans + "\xff\xd9");
         },
         "a damaged or truncated JPEG file (more than 1000 progressive scans)", false},
        {"a text file named .png", [&](const std::string& p) { put(p, "just some text\n"); },
         "not a PNG, JPEG or WebP image"},
        {"an empty file", [&](const std::string& p) { put(p, ""); }, "an empty file"},
        {"a PNG header alone", [&](const std::string& p) { put(p, png.substr(0, 20)); },
         "not a PNG file libpng reads"},
        {"a FIFO", [](const std::string& p) { REQUIRE(mkfifo(p.c_str(), 0600) == 0); }, "not a regular file"},
        {"a folder", [](const std::string& p) { fs::create_directory(p); }, "not a regular file"},
        {"a missing file", [](const std::string&) {}, "cannot open (No such file or directory)"},
        {"a PNG declaring 100000x100000",
         [&](const std::string& p) { fs::copy_file(input("bomb_png.png"), p); },
         "a 100000x100000 PNG image (10000000000 pixels): input images may have at most 67108864 pixels"},
        {"a JPEG declaring 60000x60000",
         [&](const std::string& p) { fs::copy_file(input("bomb_jpeg.jpg"), p); }, "a 60000x60000 JPEG image"},
        {"a WebP declaring 16384x16384",
         [&](const std::string& p) { fs::copy_file(input("bomb_webp.webp"), p); },
         "a 16384x16384 WebP image"},
        {"an animated WebP", [&](const std::string& p) { fs::copy_file(input("webp_animated.webp"), p); },
         "an animated WebP; an input image must be a still image"},
    };
    int i = 0;
    for (const Case& c : cases) {
        INFO(c.what);
        const std::string path = dir.path + "/input" + std::to_string(i++) + ".png";
        c.make(path);
        std::optional<dp::test::FifoUnblocker> unblock;  // a FIFO waited on fails the test, not hangs it
        if (fs::is_fifo(path)) unblock.emplace(path, 2);
        const std::string message = refusal(path);
        CHECK_MESSAGE(has(message, path + ": "), message);
        CHECK_MESSAGE(has(message, c.message), message);
        if (c.header)
            CHECK(refusal(path, true) == message);
        else
            CHECK_NOTHROW(read_image_info(path));
    }
    // The golden refusals are all among those above.
    const Golden golden;
    for (const auto& [name, why] : golden.cases.at("refused").items())
        CHECK(has(refusal(input(name), true), input(name) + ": a"));
}

TEST_CASE("damaged copies of every input image decode or are refused, never anything else") {
    // Seeded byte changes and cuts: each copy decodes (libjpeg's corrupt-data warnings aside, a
    // change in the pixel data can leave a valid file) or throws InputDataError naming it. Under
    // the sanitizers (scripts/sanitize.sh) this is also a check that no decoder reads out of bounds.
    const dp::test::TempDir dir("images");
    const std::string path = dir.path + "/damaged";
    uint32_t seed = 1;
    const auto next = [&seed](uint32_t below) {
        return (seed = seed * 1103515245u + 12345u) / 65536u % below;
    };
    int refused = 0, decoded = 0;
    const Golden golden;
    for (const auto& [name, tensor] : golden.cases.at("inputs").items()) {
        const std::string bytes = file_bytes(input(name));
        for (int i = 0; i < 24; ++i) {
            std::string damaged = bytes;
            const auto size = static_cast<uint32_t>(damaged.size());
            if (i % 4 == 3)
                damaged.resize(next(size));
            else
                for (uint32_t n = next(4) + 1; n > 0; --n) damaged[next(size)] = static_cast<char>(next(256));
            dir.write("damaged", damaged);
            INFO(name, " copy ", i);
            try {
                const RgbImage image = decode_image(path);
                CHECK(image.rgb.size() == static_cast<std::size_t>(image.width) * image.height * 3);
                ++decoded;
            } catch (const dp::protocol::InputDataError& e) {
                CHECK_MESSAGE(has(e.what(), path + ": "), e.what());
                ++refused;
            }
        }
    }
    MESSAGE(decoded, " decoded, ", refused, " refused");
    CHECK(refused > 100);
    CHECK(decoded > 100);
}

TEST_CASE("EXIF that is cut short or points outside itself leaves the image as stored") {
    const dp::test::TempDir dir("images");
    const std::string jpeg = file_bytes(input("jpeg_420.jpg"));
    const RgbImage stored = decode_image(input("jpeg_420.jpg"));
    const auto le = [](uint32_t v, int n) {
        std::string out;
        for (int i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
        return out;
    };
    const std::string prefix("Exif\0\0II*\0", 10);
    const std::string orientation6 = le(274, 2) + le(3, 2) + le(1, 4) + le(6, 4);
    // What PIL also leaves as stored (it warns, at most), checked with Pillow 13.
    const std::pair<const char*, std::string> exifs[] = {
        {"an IFD beyond the data", prefix + le(4000, 4)},
        {"entries cut short", prefix + le(8, 4) + le(40, 2) + orientation6.substr(0, 7)},
        {"an orientation of 9", prefix + le(8, 4) + le(1, 2) + le(274, 2) + le(3, 2) + le(1, 4) + le(9, 4)},
        {"an orientation as BYTE (PIL reads bytes, which match no orientation)",
         prefix + le(8, 4) + le(1, 2) + le(274, 2) + le(1, 2) + le(1, 4) + le(6, 4)},
        {"an orientation whose data lies outside",
         prefix + le(8, 4) + le(1, 2) + le(274, 2) + le(3, 2) + le(4, 4) + le(5000, 4)},
        {"no TIFF structure, no resolution in the JFIF segment (PIL swallows the error)",
         std::string("Exif\0\0garbage!", 14)},
        {"the TIFF header alone, no resolution in the JFIF segment", std::string("Exif\0\0MM\0*", 10)},
    };
    for (const auto& [what, exif] : exifs) {
        INFO(what);
        dir.write("e.jpg", jpeg_with_app1(jpeg, exif));
        const RgbImage got = decode_image(dir.path + "/e.jpg");
        CHECK(got.width == stored.width);
        CHECK(got.rgb == stored.rgb);
    }
}

TEST_CASE("ImageFile reads the header first, decodes once, and takes its caller's rules") {
    const dp::test::TempDir dir("images");
    ImageFile file(input("jpeg_exif_orientation6.jpg"));
    CHECK(file.info().format == "jpeg");
    CHECK(file.info().width == 9);
    CHECK(file.info().height == 5);
    const RgbImage image = file.decode();
    CHECK(image.width == 5);
    CHECK(image.height == 9);
    CHECK_THROWS_AS(file.decode(), std::logic_error);
    // A caller that measures files: any size from the header, the pixels as stored.
    OpenRules measure;
    measure.max_pixels = UINT64_MAX;
    measure.exif_transpose = false;
    const ImageFile bomb(input("bomb_png.png"), measure);
    CHECK(bomb.info().width == 100000);
    CHECK(bomb.info().height == 100000);
    const RgbImage stored = ImageFile(input("jpeg_exif_orientation6.jpg"), measure).decode();
    CHECK(stored.width == 9);
    CHECK(stored.rgb == ImageFile(input("jpeg_exif_orientation1.jpg")).decode().rgb);

    REQUIRE(symlink(input("png_rgb8.png").c_str(), (dir.path + "/link.png").c_str()) == 0);
    CHECK(ImageFile(dir.path + "/link.png").info().width == 37);
    OpenRules rules;
    rules.follow_links = false;
    rules.shown = "the link";
    try {
        ImageFile refused(dir.path + "/link.png", rules);
        FAIL("a symbolic link was opened");
    } catch (const dp::protocol::InputDataError& e) {
        CHECK(std::string(e.what()) ==
              "the link: a symbolic link; an input image must be a PNG, JPEG or WebP file");
    }
}
