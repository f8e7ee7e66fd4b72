// PNG output through libpng (read back with libpng), atomic placement, SHA-256, and the split rule.
#include "unit/doctest_torch.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE first
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <unistd.h>
#include <webp/decode.h>

#include <cstdio>

#include "runtime/image_sink.h"
#include "runtime/io/errors.h"
#include "strategies/work_split.h"

using namespace dp::runtime;
using dp::strategies::Range;
using dp::strategies::split_between_processes;

namespace {
std::vector<uint8_t> read_png_rgb(const std::string& path, int& w, int& h) {
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    REQUIRE(png_image_begin_read_from_file(&image, path.c_str()) != 0);
    image.format = PNG_FORMAT_RGB;
    std::vector<uint8_t> pixels(PNG_IMAGE_SIZE(image));
    REQUIRE(png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr) != 0);
    w = static_cast<int>(image.width);
    h = static_cast<int>(image.height);
    return pixels;
}
}  // namespace

TEST_CASE("a PNG written here reads back with the same pixels, deterministically, with no temporary left") {
    const std::string dir = "/tmp/dp_png_" + std::to_string(getpid());
    REQUIRE(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) == 0);
    std::vector<uint8_t> rgb(5 * 3 * 3);
    for (std::size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 17);
    const WrittenImage a = write_image_atomically(dir + "/a.png", rgb.data(), 5, 3);
    const WrittenImage b = write_image_atomically(dir + "/b.png", rgb.data(), 5, 3);
    int w = 0, h = 0;
    CHECK(read_png_rgb(a.path, w, h) == rgb);
    CHECK(w == 5);
    CHECK(h == 3);
    CHECK(a.sha256 == b.sha256);  // same pixels, same bytes
    CHECK(a.sha256.size() == 64);
    CHECK(read_text_file(a.path).size() == a.bytes);
    CHECK(sha256_hex(read_text_file(a.path).data(), a.bytes) == a.sha256);
    CHECK(std::system(("test -z \"$(ls -A " + dir + " | grep tmp)\"").c_str()) == 0);
    CHECK(sha256_hex("abc", 3) ==
          "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");  // FIPS 180-2 vector
    CHECK_THROWS_AS(write_image_atomically("/nonexistent/dir/x.png", rgb.data(), 5, 3), Error);
    std::system(("rm -rf " + dir).c_str());
}

namespace {
// The RGB pixels of a JPEG file through libjpeg, and whether its first segment after SOI is EXIF.
std::vector<uint8_t> read_jpeg_rgb(const std::string& bytes, int& w, int& h) {
    jpeg_decompress_struct cinfo{};
    jpeg_error_mgr err{};
    cinfo.err = jpeg_std_error(&err);
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
    REQUIRE(jpeg_read_header(&cinfo, TRUE) == JPEG_HEADER_OK);
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    w = static_cast<int>(cinfo.output_width);
    h = static_cast<int>(cinfo.output_height);
    std::vector<uint8_t> rgb(static_cast<std::size_t>(w) * h * 3);
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = rgb.data() + static_cast<std::size_t>(cinfo.output_scanline) * w * 3;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return rgb;
}
}  // namespace

TEST_CASE("JPEG and WebP read back at their size and close to their pixels, deterministically, with EXIF") {
    const std::string dir = "/tmp/dp_img_" + std::to_string(getpid());
    REQUIRE(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()) == 0);
    // A smooth gradient, 40 x 24, that lossy coding keeps close.
    const int w = 40, h = 24;
    std::vector<uint8_t> rgb(static_cast<std::size_t>(w) * h * 3);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int c = 0; c < 3; ++c)
                rgb[(static_cast<std::size_t>(y) * w + x) * 3 + c] =
                    static_cast<uint8_t>(x * 3 + y * 2 + c * 20);
    ImageEncoding e;
    e.parameters = "a cat\nSteps: 4, Seed: 1";
    e.record = R"({"prompt":"a cat"})";
    const auto max_diff = [&](const std::vector<uint8_t>& got) {
        REQUIRE(got.size() == rgb.size());
        int m = 0;
        for (std::size_t i = 0; i < got.size(); ++i) m = std::max(m, std::abs(int(got[i]) - int(rgb[i])));
        return m;
    };
    for (const ImageFormat format : {ImageFormat::kJpeg, ImageFormat::kWebp}) {
        e.format = format;
        CAPTURE(static_cast<int>(format));
        for (const int quality : {95, 100}) {
            e.quality = quality;
            const WrittenImage a = write_image_atomically(dir + "/a", rgb.data(), w, h, e);
            const WrittenImage b = write_image_atomically(dir + "/b", rgb.data(), w, h, e);
            CHECK(a.sha256 == b.sha256);
            const std::string bytes = read_text_file(a.path);
            CHECK(bytes.size() == a.bytes);
            // The EXIF block as written, whole, in the file.
            CHECK(bytes.find(exif_block(e.record, e.parameters, 1 << 20)) != std::string::npos);
            int gw = 0, gh = 0;
            std::vector<uint8_t> got;
            if (format == ImageFormat::kJpeg) {
                CHECK(bytes.substr(0, 4) == "\xFF\xD8\xFF\xE1");  // SOI, then APP1 (EXIF) first
                got = read_jpeg_rgb(bytes, gw, gh);
            } else {
                CHECK(bytes.substr(0, 4) == "RIFF");
                CHECK(bytes.find("EXIF") != std::string::npos);
                uint8_t* px =
                    WebPDecodeRGB(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &gw, &gh);
                REQUIRE(px != nullptr);
                got.assign(px, px + static_cast<std::size_t>(gw) * gh * 3);
                WebPFree(px);
            }
            CHECK(gw == w);
            CHECK(gh == h);
            // WebP at 100 is lossless; the lossy ones stay close on a gradient.
            CHECK(max_diff(got) <= (format == ImageFormat::kWebp && quality == 100 ? 0 : 24));
        }
    }
    CHECK_THROWS_AS(image_format_named("gif"), Error);
    std::system(("rm -rf " + dir).c_str());
}

TEST_CASE(
    "EXIF holds the record and the parameters in UTF-16, and stays within its limit by dropping the record, "
    "then cutting") {
    const std::string unicode = std::string("UNICODE") + '\0';
    const std::string full = exif_block("{\"a\":1}", "über", 1 << 20);
    CHECK(full.substr(0, 4) == std::string("MM\0*", 4));
    CHECK(full.find("{\"a\":1}") != std::string::npos);
    CHECK(full.find(unicode + std::string("\0\xFC\0b\0e\0r", 8)) != std::string::npos);
    // Too small for both: the record goes first, and the comment is kept whole.
    const std::size_t without_record = exif_block("", "über", 1 << 20).size();
    const std::string fits = exif_block(std::string(200, 'x'), "über", without_record);
    CHECK(fits.size() <= without_record);
    CHECK(fits.find("xxxx") == std::string::npos);
    CHECK(fits.find(unicode + std::string("\0\xFC\0b\0e\0r", 8)) != std::string::npos);
    // Smaller still: the comment is cut at a character, never half a surrogate pair.
    const std::string emoji = "\xF0\x9F\x98\x80\xF0\x9F\x98\x80";  // two characters, four UTF-16 units
    const std::size_t whole = exif_block("", emoji, 1 << 20).size();
    for (std::size_t limit = whole - 5; limit < whole; ++limit) {
        const std::string cut = exif_block("", emoji, limit);
        CHECK(cut.size() <= limit);
        CHECK((cut.size() - (whole - 8)) % 4 == 0);  // 0 or 1 whole pair of units
    }
}

TEST_CASE("split_between_processes: accelerate's rule, every item exactly once") {
    CHECK(split_between_processes(5, 4, 0).begin == 0);
    CHECK(split_between_processes(5, 4, 0).size() == 2);
    CHECK(split_between_processes(5, 4, 1).begin == 2);
    CHECK(split_between_processes(5, 4, 3).begin == 4);
    CHECK(split_between_processes(2, 4, 3).size() == 0);
    for (int64_t n = 0; n <= 13; ++n) {
        for (int64_t world = 1; world <= 6; ++world) {
            int64_t next = 0;
            for (int64_t rank = 0; rank < world; ++rank) {
                const Range r = split_between_processes(n, world, rank);
                CHECK(r.begin == next);  // contiguous, in rank order
                CHECK(r.size() == n / world + (rank < n % world ? 1 : 0));
                next = r.end;
            }
            CHECK(next == n);
        }
    }
    const std::vector<std::string> items = {"a", "b", "c", "d", "e"};
    CHECK(split_between_processes(items, 2, 1) == std::vector<std::string>{"d", "e"});
    CHECK_THROWS_AS(split_between_processes(3, 0, 0), std::invalid_argument);
    CHECK_THROWS_AS(split_between_processes(3, 2, 2), std::invalid_argument);
}
