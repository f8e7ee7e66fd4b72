// dp-launch compare (cli/compare_command.h, Note [compare]): PSNR and SSIM as scikit-image computes
// them (scripts/golden/golden_compare.py), pairs by prompt index, the CI budget's exit codes, the
// page of pairs, and what is refused.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <png.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command_line.h"
#include "cli/compare_command.h"
#include "launcher/errors.h"
#include "launcher/manifest.h"
#include "protocol/call_arguments.h"
#include "support/test_paths.h"
#include "unit/fifo_unblocker.h"

using namespace dp::cli;
using dp::test::FifoUnblocker;

namespace {

std::string golden(const std::string& name) { return std::string(DP_GOLDEN_DIR) + "/compare/" + name; }

const char* no_env(const char*) { return nullptr; }

std::string scratch() {
    const std::string dir = "/tmp/dp_compare_" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    return dir;
}

}  // namespace

namespace {

// A copy of golden run `name` ("run_a") in `dir`, as `as` (default: the same name); its path.
std::string copy_run(const std::string& name, const std::string& dir, const std::string& as = "") {
    const std::string to = dir + "/" + (as.empty() ? name : as);
    std::filesystem::remove_all(to);
    std::filesystem::copy(golden(name), to, std::filesystem::copy_options::recursive);
    return to;
}

// A gray 8-bit PNG that declares `width` x `height` pixels and holds its first `rows` rows of noise:
// the rest is cut off after the IDAT chunks libpng has written by then, which come every 8 KiB of
// compressed rows (a bomb's few kilobytes declare gigabytes).
void write_png(const std::string& path, uint32_t width, uint32_t height, uint32_t rows) {
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) FAIL("libpng could not write " << path);
    png_init_io(png, f);
    png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    std::vector<png_byte> row(width);
    uint32_t noise = 12345;
    for (uint32_t y = 0; y < rows; ++y) {
        for (png_byte& b : row) b = static_cast<png_byte>((noise = noise * 1103515245u + 12345u) >> 24);
        png_write_row(png, row.data());
    }
    if (rows == height) png_write_end(png, nullptr);
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
}

// Fresh copies of golden run `name` as DIR/a and DIR/b, and the options that compare them (the page
// in DIR).
CompareOptions two_copies(const std::string& name, const std::string& dir) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    CompareOptions o;
    o.a = copy_run(name, dir, "a");
    o.b = copy_run(name, dir, "b");
    o.gallery = dir + "/pairs.html";
    return o;
}

// Rewrites run `run`'s manifest with its records as `edit` leaves them, in index order.
void edit_manifest(const std::string& run,
                   const std::function<void(std::map<int64_t, nlohmann::json>&)>& edit) {
    auto records = dp::launcher::read_manifest(run + "/manifest.jsonl");
    edit(records);
    std::ofstream manifest(run + "/manifest.jsonl");
    for (const auto& [index, record] : records) manifest << record.dump() << "\n";
}

// run_compare(o) with --json: CHECKs its exit code, and returns the summary (the last object).
nlohmann::json json_summary(CompareOptions o, int exit_code) {
    o.json = true;
    std::ostringstream out;
    CHECK(run_compare(o, out) == exit_code);
    std::istringstream lines(out.str());
    nlohmann::json last;
    for (std::string line; std::getline(lines, line);) last = nlohmann::json::parse(line);
    return last;
}

std::string file_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("compare's PSNR and SSIM are scikit-image's") {
    std::ifstream in(golden("expected.json"));
    const nlohmann::json expected = nlohmann::json::parse(in);
    int checked = 0;
    for (const auto& [index, e] : expected.items()) {
        CAPTURE(index);
        const std::string name = std::string(5 - index.size(), '0') + index + ".png";
        const RgbImage a = read_rgb_image(golden("run_a/" + name)),
                       b = read_rgb_image(golden("run_b/" + name));
        if (e.at("psnr").is_string()) {
            CHECK(std::isinf(psnr(a, b)));
        } else {
            CHECK(psnr(a, b) == doctest::Approx(e.at("psnr").get<double>()).epsilon(1e-9));
        }
        CHECK(ssim(a, b) == doctest::Approx(e.at("ssim").get<double>()).epsilon(1e-9));
        ++checked;
    }
    CHECK(checked == 3);
}

TEST_CASE("compare pairs by prompt index, and fails a budget a pair falls below") {
    const std::string dir = scratch() + "/pairs";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    CompareOptions o;
    o.a = golden("run_a");
    o.b = golden("run_b");
    o.gallery = dir + "/pairs.html";
    std::ostringstream out;
    CHECK(run_compare(o, out) == 1);  // run_b has no image of prompt 3
    CHECK(out.str().find("#0  PSNR 26.69 dB  SSIM 0.8154") != std::string::npos);
    CHECK(out.str().find("#2  PSNR inf dB  SSIM 1.0000") != std::string::npos);
    CHECK(out.str().find("#3  no image in " + o.b + " (no record)\n") != std::string::npos);
    CHECK(out.str().find("3 pairs, 1 prompt without an image in both (#3):") != std::string::npos);
    CHECK(out.str().find("; 0 below the budget; 0 of another prompt or seed; 1 failing;") !=
          std::string::npos);
    const std::string html = file_text(o.gallery);
    CHECK(html.find("run_a/00001.png") != std::string::npos);
    CHECK(html.find("run_b/00001.png") != std::string::npos);
    CHECK(html.find("run_a/00003.png") != std::string::npos);
    // The budgets, on run_a without prompt 3: pair 1 has 24.23 dB, pair 0 an SSIM of 0.815.
    o.a = copy_run("run_a", dir);
    std::ofstream(o.a + "/manifest.jsonl") << file_text(golden("run_b/manifest.jsonl"));
    std::ostringstream none;
    CHECK(run_compare(o, none) == 0);  // no budget
    CHECK(none.str().find("3 pairs, 0 prompts without an image in both: ") != std::string::npos);
    o.min_psnr = 25;
    std::ostringstream low;
    CHECK(run_compare(o, low) == 1);
    CHECK(low.str().find("#1  PSNR 24.23 dB  SSIM 0.9169  below the budget") != std::string::npos);
    o.min_psnr = 24;
    std::ostringstream fine;
    CHECK(run_compare(o, fine) == 0);
    o.min_ssim = 0.9;
    std::ostringstream structural;
    CHECK(run_compare(o, structural) == 1);
    o.json = true;
    std::ostringstream json;
    CHECK(run_compare(o, json) == 1);
    std::istringstream lines(json.str());
    std::string line;
    int objects = 0;
    while (std::getline(lines, line)) {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (j.contains("pairs")) CHECK(j.at("below") == 1);
        ++objects;
    }
    CHECK(objects == 4);
    std::filesystem::remove_all(dir);
}

TEST_CASE("compare refuses what it cannot compare, saying why") {
    const std::string dir = scratch();
    CompareOptions o;
    o.a = dir;  // no manifest
    o.b = golden("run_b");
    o.gallery = dir + "/pairs.html";
    std::ostringstream out;
    CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains("no manifest.jsonl"),
                         dp::launcher::UsageError);
    // A manifest that names a damaged PNG.
    std::filesystem::create_directories(dir + "/bad");
    std::ofstream(dir + "/bad/manifest.jsonl") << R"({"index": 0, "status": "ok", "file": "00000.png"})"
                                               << "\n";
    std::ofstream(dir + "/bad/00000.png") << "not a png";
    o.a = dir + "/bad";
    CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains("00000.png"), dp::launcher::InputDataError);
    // No index in both.
    std::ofstream(dir + "/bad/manifest.jsonl") << R"({"index": 9, "status": "ok", "file": "00000.png"})"
                                               << "\n";
    CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains("no prompt index has an image in both"),
                         dp::launcher::UsageError);
    // The command line: two folders, the budgets' ranges.
    const CommandLine ok =
        parse_command_line({"compare", "a", "b", "--min-psnr", "30", "--min-ssim", "0.95"}, no_env);
    CHECK(ok.action == CommandLine::Action::kCompare);
    CHECK(ok.compare.min_psnr == 30.0);
    CHECK(ok.compare.min_ssim == 0.95);
    CHECK(parse_command_line({"compare", "a"}, no_env).action == CommandLine::Action::kFail);
    CHECK(parse_command_line({"compare", "a", "b", "--min-ssim", "2"}, no_env).action ==
          CommandLine::Action::kFail);
    std::filesystem::remove_all(dir);
}

TEST_CASE("compare --json names folders that are not UTF-8 as a_hex, b_hex and gallery_hex") {
    const std::string dir = scratch() + "/runs\xff";
    std::filesystem::create_directories(dir);
    CompareOptions o;
    o.a = dir + "/a\xfe";
    o.b = dir + "/b";
    std::filesystem::copy(golden("run_a"), o.a);
    std::filesystem::copy(golden("run_b"), o.b);
    o.json = true;
    std::ostringstream out;
    REQUIRE(run_compare(o, out) == 1);  // never an exception: JSON holds UTF-8 text only; run_b lacks #3
    std::istringstream lines(out.str());
    std::string line, path;
    int pairs = 0;
    while (std::getline(lines, line)) {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (j.contains("pairs")) {
            REQUIRE(dp::protocol::path_from_hex(j.at("gallery_hex").get<std::string>(), path));
            CHECK(path == o.b + "/compare.html");
            continue;
        }
        if (j.at("index") == 3) {  // run_b has no image of it
            CHECK(j.at("b").is_null());
            continue;
        }
        REQUIRE(dp::protocol::path_from_hex(j.at("a_hex").get<std::string>(), path));
        CHECK(path.rfind(o.a + "/", 0) == 0);
        REQUIRE(dp::protocol::path_from_hex(j.at("b_hex").get<std::string>(), path));
        CHECK(path.rfind(o.b + "/", 0) == 0);
        ++pairs;
    }
    CHECK(pairs == 3);
    std::filesystem::remove_all(scratch());
}

TEST_CASE("compare refuses a budget that is not a finite number in its range, NaN included") {
    struct Row {
        const char* option;
        const char* value;
    };
    const Row rows[] = {{"--min-psnr", "nan"},  {"--min-psnr", "NaN"}, {"--min-psnr", "-nan"},
                        {"--min-psnr", "inf"},  {"--min-psnr", "-1"},  {"--min-psnr", "1001"},
                        {"--min-psnr", "30dB"}, {"--min-ssim", "nan"}, {"--min-ssim", "-inf"},
                        {"--min-ssim", "2"},    {"--min-ssim", ""}};
    for (const Row& r : rows) {
        const std::string option = r.option, value = r.value;
        CAPTURE(option);
        CAPTURE(value);
        const CommandLine c = parse_command_line({"compare", "a", "b", r.option, r.value}, no_env);
        CHECK(c.action == CommandLine::Action::kFail);
        CHECK(c.exit_code == 2);
        CHECK(c.message.find(r.option) != std::string::npos);
        CHECK(c.message.find("expected a number") != std::string::npos);
    }
    const CommandLine ok = parse_command_line({"compare", "a", "b", "--min-ssim", "-0.5"}, no_env);
    CHECK(ok.compare.min_ssim == -0.5);
}

TEST_CASE("compare --gallery writes a new file or its own earlier page, and replaces nothing else") {
    namespace fs = std::filesystem;
    const std::string dir = scratch() + "/gallery";
    fs::remove_all(dir);
    fs::create_directories(dir);
    CompareOptions o;
    o.a = copy_run("run_b", dir, "same");  // every prompt paired
    o.b = copy_run("run_b", dir);
    std::ofstream(dir + "/precious") << "precious";
    const std::string manifest = file_text(o.b + "/manifest.jsonl"), image = file_text(o.b + "/00000.png");
    struct Row {
        const char* what;
        std::function<void(const std::string& path)> make;  // what is at the path before
        const char* refusal;                                // empty: the page is written
    };
    const Row rows[] = {
        {"nothing", [](const std::string&) {}, ""},
        {"a symbolic link to a file", [&](const std::string& p) { fs::create_symlink(dir + "/precious", p); },
         "is a symbolic link"},
        {"a dangling symbolic link", [&](const std::string& p) { fs::create_symlink(dir + "/none", p); },
         "is a symbolic link"},
        {"a FIFO", [](const std::string& p) { REQUIRE(mkfifo(p.c_str(), 0600) == 0); },
         "is not a regular file"},
        {"a folder", [](const std::string& p) { fs::create_directory(p); }, "is not a regular file"},
        {"a hard link to an image",
         [&](const std::string& p) { fs::create_hard_link(o.b + "/00000.png", p); },
         "a file of the runs compared"},
        {"another file", [](const std::string& p) { std::ofstream(p) << "<!doctype html>notes"; },
         "is not a page dp-launch compare wrote"},
        {"a symbolic link where the page's temporary file goes",
         [&](const std::string& p) {
             fs::create_symlink(dir + "/precious", p + ".tmp." + std::to_string(getpid()));
         },
         ""},
    };
    int i = 0;
    for (const Row& r : rows) {
        const std::string what = r.what;
        CAPTURE(what);
        o.gallery = dir + "/page" + std::to_string(i++) + ".html";
        r.make(o.gallery);
        fs::file_status before = fs::symlink_status(o.gallery);
        std::ostringstream out;
        if (*r.refusal) {
            CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains(r.refusal), dp::launcher::UsageError);
            CHECK(fs::symlink_status(o.gallery).type() == before.type());
        } else {
            CHECK(run_compare(o, out) == 0);
            CHECK(fs::is_regular_file(fs::symlink_status(o.gallery)));
            CHECK(run_compare(o, out) == 0);  // its own page, replaced
        }
        CHECK(file_text(dir + "/precious") == "precious");
    }
    // The runs' own files, by their names.
    for (const std::string& own : {o.b + "/manifest.jsonl", o.b + "/00000.png", o.a + "/00002.png"}) {
        CAPTURE(own);
        o.gallery = own;
        std::ostringstream out;
        CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains("a file of the runs compared"),
                             dp::launcher::UsageError);
    }
    CHECK(file_text(o.b + "/manifest.jsonl") == manifest);
    CHECK(file_text(o.b + "/00000.png") == image);
    fs::remove_all(dir);
}

TEST_CASE("compare reads JPEG and WebP runs as it reads PNG ones") {
    namespace fs = std::filesystem;
    const std::string dir = scratch() + "/formats";
    fs::remove_all(dir);
    const auto input = [](const std::string& name) { return std::string(DP_GOLDEN_DIR) + "/images/" + name; };
    // Run folders whose prompt i's image is `files[i]` (golden input images, 37x23).
    const auto run = [&](const std::string& name, const std::vector<std::string>& files) {
        const std::string folder = dir + "/" + name;
        fs::create_directories(folder);
        std::ofstream manifest(folder + "/manifest.jsonl");
        for (std::size_t i = 0; i < files.size(); ++i) {
            const std::string file = "0000" + std::to_string(i) + fs::path(files[i]).extension().string();
            fs::copy_file(input(files[i]), folder + "/" + file);
            manifest << nlohmann::json{{"index", i}, {"status", "ok"}, {"file", file}, {"prompt", "p"}}.dump()
                     << "\n";
        }
        return folder;
    };
    CompareOptions o;
    o.json = true;
    o.gallery = dir + "/pairs.html";
    // A JPEG run, a WebP one and a PNG one, each compared with a copy of itself: identical pixels.
    o.a = run("a", {"jpeg_420.jpg", "webp_lossy.webp", "png_rgb8.png", "jpeg_exif_orientation6.jpg"});
    o.b = run("b", {"jpeg_420.jpg", "webp_lossy.webp", "png_rgb8.png", "jpeg_exif_orientation6.jpg"});
    std::ostringstream same;
    CHECK(run_compare(o, same) == 0);
    std::istringstream lines(same.str());
    int pairs = 0;
    for (std::string line; std::getline(lines, line);) {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (!j.contains("index")) continue;
        CAPTURE(line);
        CHECK(j.at("psnr") == "inf");
        if (j.at("index") == 3)
            CHECK(j.at("ssim").is_null());  // 9x5: smaller than SSIM's window
        else
            CHECK(j.at("ssim").get<double>() == doctest::Approx(1.0));
        ++pairs;
    }
    CHECK(pairs == 4);
    // Other files: JPEG 4:2:0 against 4:4:4 of the same picture measures their difference; another
    // picture; a lossless WebP of the PNG's pixels; the same pixels under other EXIF orientations
    // (6 and 8), compared as stored.
    o.b = run("c", {"jpeg_444.jpg", "png_rgb8.png", "webp_lossless.webp", "jpeg_exif_orientation8.jpg"});
    o.min_psnr = 30;
    std::ostringstream other;
    CHECK(run_compare(o, other) == 1);  // the other picture falls below
    std::vector<nlohmann::json> entries;
    std::istringstream other_lines(other.str());
    for (std::string line; std::getline(other_lines, line);) entries.push_back(nlohmann::json::parse(line));
    REQUIRE(entries.size() == 5);
    CHECK(entries[0].at("psnr").get<double>() > 30);
    CHECK(entries[1].at("psnr").get<double>() < 15);
    CHECK(entries[1].at("below") == true);
    CHECK(entries[2].at("psnr") == "inf");
    CHECK(entries[3].at("psnr") == "inf");
    fs::remove_all(dir);
}

TEST_CASE("compare reads each image's header first: sizes differ without decoding, a bomb is never decoded") {
    const std::string dir = scratch() + "/bomb";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string bomb = dir + "/bomb.png", cut = dir + "/cut.png";
    write_png(bomb, 30000, 30000, 2);  // 2.7 GB of RGB declared
    write_png(cut, 2000, 2000, 10);    // within the limit, cut short
    CHECK(std::filesystem::file_size(bomb) < 100000);
    CHECK_THROWS_WITH_AS(
        read_rgb_image(bomb),
        doctest::Contains(
            "30000x30000 pixels: compare decodes images of at most 16777216 pixels (4096x4096)"),
        dp::launcher::InputDataError);
    CHECK_THROWS_WITH_AS(read_rgb_image(cut), doctest::Contains("a damaged or truncated PNG file"),
                         dp::launcher::InputDataError);
    // A run whose image is of another size: its header says so, and nothing is decoded. Two of
    // the same size over the limit are refused.
    struct Row {
        const char* image;
        bool both;      // run a has it too (else golden run_a's 32 x 32 image)
        int exit_code;  // -1: refused with InputDataError
        const char* says;
    };
    const Row rows[] = {
        {"cut.png", false, 1, "#0  different sizes: 32x32 and 2000x2000"},
        {"bomb.png", false, 1, "#0  different sizes: 32x32 and 30000x30000"},
        {"bomb.png", true, -1, "30000x30000 pixels: compare decodes images of at most 16777216 pixels"},
    };
    for (const Row& r : rows) {
        const std::string image = r.image;
        CAPTURE(image);
        CAPTURE(r.both);
        CompareOptions o;
        o.a = golden("run_a");
        o.b = dir + "/run";
        if (r.both) {
            o.a = dir + "/run_a";
            std::filesystem::create_directories(o.a);
            std::filesystem::copy_file(dir + "/" + image, o.a + "/" + image,
                                       std::filesystem::copy_options::overwrite_existing);
            std::ofstream(o.a + "/manifest.jsonl")
                << R"({"index": 0, "status": "ok", "file": ")" << image << "\"}\n";
        }
        o.gallery = dir + "/pairs.html";
        std::filesystem::create_directories(o.b);
        std::ofstream(o.b + "/manifest.jsonl")
            << R"({"index": 0, "status": "ok", "file": ")" << image << "\"}\n";
        std::filesystem::copy_file(dir + "/" + image, o.b + "/" + image,
                                   std::filesystem::copy_options::overwrite_existing);
        std::ostringstream out;
        if (r.exit_code < 0) {
            CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains(r.says),
                                 dp::launcher::InputDataError);
        } else {
            CHECK(run_compare(o, out) == r.exit_code);
            CHECK_MESSAGE(out.str().find(r.says) != std::string::npos, out.str());
        }
    }
    // The bomb's 2.7 GB were never allocated (decoding it took them, and its peak stays).
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    CHECK(usage.ru_maxrss < 1024 * 1024);  // KiB
    std::filesystem::remove_all(dir);
}

TEST_CASE("compare opens only regular files inside each run's folder, never waiting on a FIFO") {
    namespace fs = std::filesystem;
    const std::string dir = scratch() + "/confined";
    fs::remove_all(dir);
    fs::create_directories(dir);
    CompareOptions o;
    o.a = copy_run("run_b", dir, "a");
    std::ofstream(o.a + "/manifest.jsonl") << R"({"index": 0, "status": "ok", "file": "00000.png"})"
                                           << "\n";
    o.b = dir + "/b";
    o.gallery = dir + "/pairs.html";
    fs::copy_file(o.a + "/00000.png", dir + "/outside.png");
    struct Row {
        const char* what;
        std::string file;            // run b's prompt 0's, in its manifest
        std::function<void()> make;  // what is there
        const char* refusal;         // empty: compared
    };
    const Row rows[] = {
        {"a parent's file", "../outside.png", [] {}, "is not a name inside"},
        {"a climb from a sub-folder", "sub/../../outside.png", [&] { fs::create_directories(o.b + "/sub"); },
         "is not a name inside"},
        {"an absolute path", dir + "/outside.png", [] {}, "is not a name inside"},
        {"a file of /proc", "/proc/self/status", [] {}, "is not a name inside"},
        {"a symbolic link leading out", "link.png",
         [&] { fs::create_symlink("../outside.png", o.b + "/link.png"); }, "leads outside"},
        {"a FIFO", "fifo.png", [&] { REQUIRE(mkfifo((o.b + "/fifo.png").c_str(), 0600) == 0); },
         "is not a regular file"},
        {"a folder", "folder.png", [&] { fs::create_directories(o.b + "/folder.png"); },
         "is not a regular file"},
        {"a symbolic link to an image beside it", "same.png",
         [&] {
             fs::copy_file(o.a + "/00000.png", o.b + "/00000.png");
             fs::create_symlink("00000.png", o.b + "/same.png");
         },
         ""},
    };
    for (const Row& r : rows) {
        const std::string what = r.what;
        CAPTURE(what);
        fs::remove_all(o.b);
        fs::create_directories(o.b);
        r.make();
        std::ofstream(o.b + "/manifest.jsonl")
            << nlohmann::json{{"index", 0}, {"status", "ok"}, {"file", r.file}}.dump() << "\n";
        std::ostringstream out;
        FifoUnblocker unblock(o.b + "/fifo.png", 2);
        if (*r.refusal) {
            CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains(r.refusal),
                                 dp::launcher::InputDataError);
            CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains(r.file.c_str()),
                                 dp::launcher::InputDataError);
        } else {
            CHECK(run_compare(o, out) == 0);
            CHECK_MESSAGE(out.str().find("#0  PSNR inf dB") != std::string::npos, out.str());
        }
    }
    fs::remove_all(dir);
}

TEST_CASE("compare fails on a prompt without an image in either run, naming it") {
    namespace fs = std::filesystem;
    const std::string dir = scratch() + "/missing";
    const std::string failed = R"({"status": "failed", "error": "CUDA out of memory\nTraceback"})";
    struct Row {
        const char* what;
        std::map<int, std::string> a, b;  // records replaced in the runs (all 4 ok): "" removes one
        std::vector<std::string> lines;   // what compare prints, with A and B for the runs' folders
        int missing;
    };
    const Row rows[] = {
        {"no change", {}, {}, {}, 0},
        {"a prompt without a record in b", {}, {{3, ""}}, {"#3  no image in B (no record)"}, 1},
        {"3 of 4 failed in b",
         {},
         {{1, failed}, {2, failed}, {3, failed}},
         {"#1  no image in B (failed: CUDA out of memory)", "#2  no image in B (failed: CUDA out of memory)",
          "#3  no image in B (failed: CUDA out of memory)"},
         3},
        {"not run in b", {}, {{2, R"({"status": "not_run"})"}}, {"#2  no image in B (not_run)"}, 1},
        {"invalid in a",
         {{1, R"({"status": "invalid", "error": "bad line"})"}},
         {},
         {"#1  no image in A (invalid: bad line)"},
         1},
        {"failed in both",
         {{2, failed}},
         {{2, R"({"status": "failed"})"}},
         {"#2  no image in A (failed: CUDA out of memory), no image in B (failed)"},
         1},
        {"a record without its file",
         {},
         {{0, R"({"status": "ok"})"}},
         {"#0  no image in B (a record without its file)"},
         1},
        {"a record whose file is gone",
         {},
         {{1, R"({"status": "ok", "file": "gone.png"})"}},
         {"#1  no image in B (gone.png is missing)"},
         1},
        {"a prompt only a has",
         {},
         {{9, R"({"status": "ok", "file": "00000.png"})"}},
         {"#9  no image in A (no record)"},
         1},
    };
    for (const Row& r : rows) {
        const std::string what = r.what;
        CAPTURE(what);
        CompareOptions o = two_copies("run_a", dir);
        o.min_psnr = 20;
        for (const auto& [run, changes] : {std::pair{o.a, r.a}, std::pair{o.b, r.b}})
            edit_manifest(run, [&changes = changes](std::map<int64_t, nlohmann::json>& records) {
                for (const auto& [index, record] : changes) {
                    if (record.empty()) {
                        records.erase(index);
                    } else {
                        records[index] = nlohmann::json::parse(record);
                        records[index]["index"] = index;
                    }
                }
            });
        std::ostringstream out;
        CHECK(run_compare(o, out) == (r.missing ? 1 : 0));
        const std::string text = out.str();
        for (std::string line : r.lines) {
            for (const auto& [name, run] : {std::pair{"in A (", o.a}, std::pair{"in B (", o.b}})
                if (const auto at = line.find(name); at != std::string::npos)
                    line.replace(at, 5, "in " + run + " ");
            CHECK_MESSAGE(text.find(line + "\n") != std::string::npos, line << "\n" << text);
        }
        const std::string summary_text = std::to_string(r.missing) +
                                         (r.missing == 1 ? " prompt" : " prompts") +
                                         " without an image in both";
        CHECK_MESSAGE(text.find(summary_text) != std::string::npos, text);
        const nlohmann::json summary = json_summary(o, r.missing ? 1 : 0);
        CHECK(summary.at("missing") == r.missing);
        CHECK(summary.at("fails") == r.missing);
    }
    fs::remove_all(dir);
}

TEST_CASE("compare with nothing to compare exits 2, and a summary over no measured pair says none") {
    namespace fs = std::filesystem;
    const std::string dir = scratch() + "/nothing";
    fs::remove_all(dir);
    fs::create_directories(dir);
    // One folder twice, by its name or through a link: every pair would be identical.
    const std::string run = copy_run("run_b", dir);
    fs::create_directory_symlink(run, dir + "/link");
    for (const std::string& other : {run, dir + "/link", dir + "/./run_b/"}) {
        CAPTURE(other);
        CompareOptions o;
        o.a = run;
        o.b = other;
        o.gallery = dir + "/pairs.html";
        std::ostringstream out;
        CHECK_THROWS_WITH_AS(run_compare(o, out), doctest::Contains("the same folder: nothing to compare"),
                             dp::launcher::UsageError);
    }
    // No prompt with an image in both: every image of one run failed.
    fs::create_directories(dir + "/failed");
    std::ofstream(dir + "/failed/manifest.jsonl") << R"({"index": 0, "status": "failed", "error": "oom"})"
                                                  << "\n"
                                                  << R"({"index": 1, "status": "failed", "error": "oom"})"
                                                  << "\n";
    CompareOptions o;
    o.a = run;
    o.b = dir + "/failed";
    o.gallery = dir + "/pairs.html";
    std::ostringstream out;
    CHECK_THROWS_WITH_AS(run_compare(o, out),
                         doctest::Contains("nothing to compare: no prompt index has an image in both"),
                         dp::launcher::UsageError);
    // Pairs of other sizes, or too small for SSIM (under 11 pixels a side): nothing measured is no
    // PSNR inf or SSIM 1.
    struct Row {
        const char* what;
        uint32_t side_b;  // run a's image is 8 x 8
        int exit_code;
        const char* summary;
        nlohmann::json psnr_min, ssim_min;
    };
    const Row rows[] = {
        {"sizes differ", 16, 1, "PSNR worst none, mean of the finite none; SSIM worst none, mean none",
         nullptr, nullptr},
        {"too small for SSIM", 8, 0, "PSNR worst inf dB, mean of the finite none; SSIM worst none, mean none",
         "inf", nullptr},
    };
    for (const Row& r : rows) {
        const std::string what = r.what;
        CAPTURE(what);
        for (const auto& [name, side] : {std::pair{"a", 8u}, std::pair{"b", r.side_b}}) {
            fs::create_directories(dir + "/" + name);
            write_png(dir + "/" + name + "/00000.png", side, side, side);
            std::ofstream(dir + "/" + name + "/manifest.jsonl")
                << R"({"index": 0, "status": "ok", "file": "00000.png"})"
                << "\n";
        }
        o.a = dir + "/a";
        o.b = dir + "/b";
        o.json = false;
        std::ostringstream text;
        CHECK(run_compare(o, text) == r.exit_code);
        CHECK_MESSAGE(text.str().find(r.summary) != std::string::npos, text.str());
        const nlohmann::json summary = json_summary(o, r.exit_code);
        CHECK(summary.at("psnr_min") == r.psnr_min);
        CHECK(summary.at("ssim_min") == r.ssim_min);
    }
    fs::remove_all(dir);
}

TEST_CASE("compare reports pairs of another prompt or seed, and --strict fails them") {
    namespace fs = std::filesystem;
    const std::string dir = scratch() + "/differ";
    struct Row {
        const char* what;
        int index;          // of run b's record patched
        const char* patch;  // a JSON merge patch
        const char* says;   // in its line; empty: no difference
    };
    const Row rows[] = {
        {"the same prompt and seed", 0, "{}", ""},
        {"another prompt", 1, R"({"prompt": "a \u001b[2J dog"})",
         R"(prompt differs: "prompt 1" and "a \u001b[2J dog")"},
        {"another seed", 2, R"({"seed": 7})", "seed differs: 2 and 7"},
        {"a seed left out", 0, R"({"seed": null})", "seed differs: 0 and none"},
        {"both", 1, R"({"prompt": "x", "seed": 8})",
         R"(prompt differs: "prompt 1" and "x"  seed differs: 1 and 8)"},
    };
    for (const Row& r : rows) {
        const std::string what = r.what;
        CAPTURE(what);
        CompareOptions o = two_copies("run_b", dir);
        for (const std::string& run : {o.a, o.b})
            edit_manifest(run, [&](std::map<int64_t, nlohmann::json>& records) {
                for (auto& [index, record] : records) {
                    record["seed"] = index;
                    if (run == o.b && index == r.index) record.merge_patch(nlohmann::json::parse(r.patch));
                }
            });
        const bool differ = *r.says != '\0';
        for (const bool strict : {false, true}) {
            CAPTURE(strict);
            o.strict = strict;
            o.json = false;
            std::ostringstream out;
            CHECK(run_compare(o, out) == (strict && differ ? 1 : 0));
            const std::string line = "#" + std::to_string(r.index) + "  PSNR inf dB  SSIM 1.0000" +
                                     (differ ? "  " + std::string(r.says) : "") + "\n";
            CHECK_MESSAGE(out.str().find(line) != std::string::npos, line << out.str());
            CHECK_MESSAGE(out.str().find(std::string("; ") + (differ ? "1" : "0") +
                                         " of another prompt or seed;") != std::string::npos,
                          out.str());
            o.json = true;
            std::ostringstream json;
            CHECK(run_compare(o, json) == (strict && differ ? 1 : 0));
            std::istringstream lines(json.str());
            for (std::string l; std::getline(lines, l);) {
                const nlohmann::json j = nlohmann::json::parse(l);
                if (j.contains("pairs")) CHECK(j.at("differ") == (differ ? 1 : 0));
                if (j.contains("index") && j.at("index") == r.index) CHECK(j.contains("differs") == differ);
            }
        }
    }
    const CommandLine strict = parse_command_line({"compare", "a", "b", "--strict"}, no_env);
    CHECK(strict.action == CommandLine::Action::kCompare);
    CHECK(strict.compare.strict);
    fs::remove_all(dir);
}
