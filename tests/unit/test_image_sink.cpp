// PNG output through libpng (read back with libpng), atomic placement, SHA-256, and the split rule.
#include "unit/doctest_torch.h"

#include <png.h>
#include <unistd.h>

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
    const WrittenImage a = write_png_atomically(dir + "/a.png", rgb.data(), 5, 3);
    const WrittenImage b = write_png_atomically(dir + "/b.png", rgb.data(), 5, 3);
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
    CHECK_THROWS_AS(write_png_atomically("/nonexistent/dir/x.png", rgb.data(), 5, 3), Error);
    std::system(("rm -rf " + dir).c_str());
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
