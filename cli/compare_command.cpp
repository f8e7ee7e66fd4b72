#include "cli/compare_command.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "cli/compare_images.h"
#include "launcher/errors.h"
#include "launcher/gallery.h"
#include "launcher/manifest.h"
#include "launcher/prompt_file.h"
#include "protocol/atomic_file.h"
#include "protocol/call_arguments.h"

namespace dp::cli {
namespace {

using launcher::InputDataError;
using launcher::UsageError;

// scipy.ndimage's Gaussian of sigma 1.5 truncated at 3.5 sigma: radius 5, 11 taps summing to 1.
constexpr int kRadius = 5;
std::vector<double> gaussian_taps() {
    std::vector<double> w(2 * kRadius + 1);
    double sum = 0;
    for (int i = -kRadius; i <= kRadius; ++i)
        sum += w[static_cast<std::size_t>(i + kRadius)] = std::exp(-0.5 * i * i / 2.25);
    for (double& v : w) v /= sum;
    return w;
}

// Mirrored about the edge pixel's outer side, as scipy's mode "reflect" (d c b a | a b c d).
int mirrored(int i, int n) {
    while (i < 0 || i >= n) i = i < 0 ? -i - 1 : 2 * n - i - 1;
    return i;
}

// `x` (height x width) filtered by the Gaussian along both axes.
std::vector<double> blurred(const std::vector<double>& x, int width, int height) {
    static const std::vector<double> w = gaussian_taps();
    std::vector<double> rows(x.size()), out(x.size());
    for (int y = 0; y < height; ++y)
        for (int c = 0; c < width; ++c) {
            double s = 0;
            for (int k = -kRadius; k <= kRadius; ++k)
                s += w[static_cast<std::size_t>(k + kRadius)] *
                     x[static_cast<std::size_t>(y * width + mirrored(c + k, width))];
            rows[static_cast<std::size_t>(y * width + c)] = s;
        }
    for (int y = 0; y < height; ++y)
        for (int c = 0; c < width; ++c) {
            double s = 0;
            for (int k = -kRadius; k <= kRadius; ++k)
                s += w[static_cast<std::size_t>(k + kRadius)] *
                     rows[static_cast<std::size_t>(mirrored(y + k, height) * width + c)];
            out[static_cast<std::size_t>(y * width + c)] = s;
        }
    return out;
}

void check_same_size(const RgbImage& a, const RgbImage& b) {
    if (a.width != b.width || a.height != b.height || a.rgb.size() != b.rgb.size())
        throw std::invalid_argument("images of different sizes");
}

// What one run has for a prompt index: its image, or why it has none.
struct Side {
    std::string path, real;  // RUN/FILE, and where it is (image_in_run); empty: no image
    std::string missing;    // why there is none: "no record", "failed: out of memory", "00003.png is missing"
    nlohmann::json record;  // its manifest record; null: none
};

// What a pair's two records should agree on: images of other prompts or seeds are no measure of a
// setting. A key a record leaves out counts as null.
constexpr const char* kSameKeys[] = {"prompt", "seed"};

// One prompt index that either run has a record of: a pair of images, or an image missing.
struct Prompt {
    int64_t index = 0;
    Side a, b;
    std::string size_a, size_b;  // from the images' headers
    double psnr = 0, ssim = 0;
    std::vector<const char*> differs;  // the keys of kSameKeys on which the two records differ
    bool below = false;                // below a budget
    bool fails = false;                // counts against the runs: exit 1

    bool paired() const { return !a.real.empty() && !b.real.empty(); }
    bool measured() const { return paired() && size_a == size_b; }
};

std::string number(double v, int digits) {
    if (std::isinf(v)) return "inf";
    std::ostringstream s;
    s << std::fixed << std::setprecision(digits) << v;
    return s.str();
}

// `record[key]` when it is a string, else "".
std::string string_field(const nlohmann::json& record, const char* key) {
    const auto it = record.find(key);
    return it != record.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Every record of RUN's manifest, by index.
std::map<int64_t, nlohmann::json> records_of(const std::string& run) {
    const std::string manifest = run + "/manifest.jsonl";
    if (!std::filesystem::is_regular_file(manifest))
        throw UsageError(launcher::utf8_for_display(run) +
                         ": no manifest.jsonl (an output folder of dp-launch?)");
    return launcher::read_manifest(manifest);
}

// Why a record of status other than "ok" has no image: its status and the first line of its error.
std::string why_no_image(const nlohmann::json& record) {
    const std::string status = string_field(record, "status");
    std::string error = string_field(record, "error");
    error = error.substr(0, std::min(error.find('\n'), std::size_t{200}));
    return (status.empty() ? std::string("no status") : status) + (error.empty() ? "" : ": " + error);
}

// What run `run` (canonical path `real_run`) has for prompt `index`, from its `record` (nullptr: none).
Side side_of(const std::string& run, const std::filesystem::path& real_run, int64_t index,
             const nlohmann::json* record) {
    Side s;
    if (record == nullptr) {
        s.missing = "no record";
        return s;
    }
    s.record = *record;
    const std::string file = string_field(*record, "file");
    if (string_field(*record, "status") != "ok") {
        s.missing = why_no_image(*record);
    } else if (file.empty()) {
        s.missing = "a record without its file";
    } else {
        s.path = run + "/" + file;
        s.real = image_in_run(run, real_run, index, file);
        if (s.real.empty()) s.missing = file + " is missing";
    }
    return s;
}

// Each prompt index either run has a record of, in order, with what each run has for it. Throws
// UsageError when there is nothing to compare: one folder twice, or no index with an image in both.
std::vector<Prompt> entries_of(const CompareOptions& o) {
    const std::map<int64_t, nlohmann::json> a = records_of(o.a), b = records_of(o.b);
    const std::filesystem::path real_a = std::filesystem::canonical(o.a),
                                real_b = std::filesystem::canonical(o.b);
    if (real_a == real_b)
        throw UsageError(launcher::utf8_for_display(o.a) + " and " + launcher::utf8_for_display(o.b) +
                         " are the same folder: nothing to compare (every pair would be identical)");
    std::map<int64_t, Prompt> entries;
    const auto record = [](const std::map<int64_t, nlohmann::json>& records, int64_t index) {
        const auto it = records.find(index);
        return it == records.end() ? nullptr : &it->second;
    };
    for (const auto* run : {&a, &b})
        for (const auto& [index, unused] : *run) {
            if (entries.count(index)) continue;
            Prompt& e = entries[index];
            e.index = index;
            e.a = side_of(o.a, real_a, index, record(a, index));
            e.b = side_of(o.b, real_b, index, record(b, index));
        }
    std::vector<Prompt> out;
    for (auto& [index, e] : entries) out.push_back(std::move(e));
    if (std::none_of(out.begin(), out.end(), [](const Prompt& e) { return e.paired(); }))
        throw UsageError(launcher::utf8_for_display(o.a) + " and " + launcher::utf8_for_display(o.b) +
                         ": nothing to compare: no prompt index has an image in both (" +
                         std::to_string(a.size()) + " and " + std::to_string(b.size()) + " records)");
    return out;
}

// Sets `e`'s sizes from its images' headers and, when they are the same, its PSNR and SSIM.
void measure(Prompt& e) {
    RunImage a(e.a.real, e.a.path), b(e.b.real, e.b.path);
    e.size_a = a.size();
    e.size_b = b.size();
    if (!e.measured()) return;
    const RgbImage ia = a.decode(), ib = b.decode();
    e.psnr = psnr(ia, ib);
    e.ssim = ssim(ia, ib);
}

// Sets whether `e` is below a budget of `o`'s and whether it fails: a pair below a budget or of
// different sizes, or a prompt without an image in either run.
void judge(Prompt& e, const CompareOptions& o) {
    e.below = e.measured() && ((o.min_psnr && e.psnr < *o.min_psnr) ||
                               (o.min_ssim && (std::isnan(e.ssim) || e.ssim < *o.min_ssim)));
    if (e.paired())
        for (const char* key : kSameKeys)
            if (e.a.record.value(key, nlohmann::json()) != e.b.record.value(key, nlohmann::json()))
                e.differs.push_back(key);
    e.fails = !e.paired() || !e.measured() || e.below || (o.strict && !e.differs.empty());
}

// `value` as the report shows it: JSON, at most 80 bytes of it; "none" for null.
std::string shown_value(const nlohmann::json& value) {
    if (value.is_null()) return "none";
    const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// What `e`'s records differ on, for its line: "  prompt differs: "a" and "b"".
std::string differences(const Prompt& e) {
    std::string out;
    for (const char* key : e.differs)
        out += std::string("  ") + key + " differs: " + shown_value(e.a.record.value(key, nlohmann::json())) +
               " and " + shown_value(e.b.record.value(key, nlohmann::json()));
    return out;
}

// What `e` says of the side of run `run` that has no image: "no image in RUN (failed: ...)".
std::string no_image(const std::string& run, const Side& s) {
    return "no image in " + launcher::utf8_for_display(run) + " (" + s.missing + ")";
}

// `e` as a line of the report (terminal-safe).
std::string entry_line(const Prompt& e, const CompareOptions& o) {
    std::string line = "#" + std::to_string(e.index) + "  ";
    if (!e.paired()) {
        line += e.a.missing.empty()
                    ? no_image(o.b, e.b)
                    : no_image(o.a, e.a) + (e.b.missing.empty() ? "" : ", " + no_image(o.b, e.b));
    } else if (!e.measured()) {
        line += "different sizes: " + e.size_a + " and " + e.size_b;
    } else {
        line += "PSNR " + number(e.psnr, 2) + " dB  SSIM " + number(e.ssim, 4) +
                (e.below ? "  below the budget" : "");
    }
    return launcher::terminal_safe(line + differences(e));
}

// `e` as a JSON object.
nlohmann::json entry_json(const Prompt& e) {
    // "a_hex" for a path that is not UTF-8 (Note [paths in the job file]): never a throw on dump.
    nlohmann::json j = {{"index", e.index}};
    for (const auto& [key, side] : {std::pair{"a", &e.a}, std::pair{"b", &e.b}}) {
        if (side->real.empty())
            j[key] = nullptr;
        else
            protocol::put_path(j, key, side->path);
    }
    j["below"] = e.below;
    j["fails"] = e.fails;
    if (!e.paired()) {
        j["missing"] = nlohmann::json::object();
        if (!e.a.missing.empty()) j["missing"]["a"] = e.a.missing;
        if (!e.b.missing.empty()) j["missing"]["b"] = e.b.missing;
    } else if (!e.measured()) {
        j["sizes"] = {e.size_a, e.size_b};
    } else {
        j["psnr"] = std::isinf(e.psnr) ? nlohmann::json("inf") : nlohmann::json(e.psnr);
        j["ssim"] = std::isnan(e.ssim) ? nlohmann::json(nullptr) : nlohmann::json(e.ssim);
    }
    for (const char* key : e.differs)
        j["differs"][key] = {e.a.record.value(key, nlohmann::json()),
                             e.b.record.value(key, nlohmann::json())};
    return j;
}

// The summary's figures over the entries. The worst and the means are over the pairs measured
// (of the same size): with none, there are none (not PSNR inf and SSIM 1, which would read as a pass).
struct Summary {
    int64_t pairs = 0, missing = 0, below = 0, differ = 0, fails = 0, measured = 0, finite = 0, with_ssim = 0;
    double psnr_sum = 0, ssim_sum = 0, psnr_min = std::numeric_limits<double>::infinity(),
           ssim_min = std::numeric_limits<double>::infinity();
    std::vector<int64_t> without;  // the first indices without an image in both

    void add(const Prompt& e) {
        pairs += e.paired();
        missing += !e.paired();
        if (!e.paired() && without.size() < 10) without.push_back(e.index);
        below += e.below;
        differ += !e.differs.empty();
        fails += e.fails;
        if (!e.measured()) return;
        ++measured;
        psnr_min = std::min(psnr_min, e.psnr);
        if (!std::isinf(e.psnr)) psnr_sum += e.psnr, ++finite;
        if (!std::isnan(e.ssim)) ssim_sum += e.ssim, ssim_min = std::min(ssim_min, e.ssim), ++with_ssim;
    }
};

nlohmann::json summary_json(const Summary& s, const std::string& gallery) {
    const auto mean = [](double sum, int64_t n) {
        return n ? nlohmann::json(sum / static_cast<double>(n)) : nlohmann::json(nullptr);
    };
    nlohmann::json j = {{"pairs", s.pairs},
                        {"missing", s.missing},
                        {"psnr_mean_finite", mean(s.psnr_sum, s.finite)},
                        {"psnr_min", !s.measured              ? nlohmann::json(nullptr)
                                     : std::isinf(s.psnr_min) ? nlohmann::json("inf")
                                                              : nlohmann::json(s.psnr_min)},
                        {"ssim_mean", mean(s.ssim_sum, s.with_ssim)},
                        {"ssim_min", s.with_ssim ? nlohmann::json(s.ssim_min) : nlohmann::json(nullptr)},
                        {"below", s.below},
                        {"differ", s.differ},
                        {"fails", s.fails}};
    protocol::put_path(j, "gallery", gallery);
    return j;
}

// "1 prompt", "2 prompts".
std::string count(int64_t n, const std::string& what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

std::string summary_line(const Summary& s, const std::string& gallery) {
    std::string without;
    for (int64_t index : s.without) without += (without.empty() ? " (#" : ", #") + std::to_string(index);
    if (!without.empty()) without += s.missing > static_cast<int64_t>(s.without.size()) ? ", ...)" : ")";
    // `v` with `digits` decimals and `unit`, or "none" when `n` values gave it.
    const auto figure = [](double v, int64_t n, int digits, const char* unit) {
        return n ? number(v, digits) + unit : std::string("none");
    };
    const auto mean = [](double sum, int64_t n) { return n ? sum / static_cast<double>(n) : 0.0; };
    return launcher::terminal_safe(
        count(s.pairs, "pair") + ", " + count(s.missing, "prompt") + " without an image in both" + without +
        ": PSNR worst " + figure(s.psnr_min, s.measured, 2, " dB") + ", mean of the finite " +
        figure(mean(s.psnr_sum, s.finite), s.finite, 2, " dB") + "; SSIM worst " +
        figure(s.ssim_min, s.with_ssim, 4, "") + ", mean " +
        figure(mean(s.ssim_sum, s.with_ssim), s.with_ssim, 4, "") + "; " + std::to_string(s.below) +
        " below the budget; " + std::to_string(s.differ) + " of another prompt or seed; " +
        std::to_string(s.fails) + " failing; pairs side by side in " + gallery);
}

std::string page_path(const std::string& page, const std::string& image) {
    std::error_code ec;
    const std::filesystem::path from = std::filesystem::absolute(page, ec).parent_path();
    const std::filesystem::path rel =
        std::filesystem::relative(std::filesystem::absolute(image, ec), from, ec);
    return ec || rel.empty() ? image : rel.string();
}

// How every page compare writes begins: an existing file that does not is no page of its own.
constexpr std::string_view kPageStart =
    "<!doctype html><html><head><meta charset=\"utf-8\"><title>dp-launch compare</title>";

// Whether the regular file at `path` begins as compare's pages do.
bool is_compare_page(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string start(kPageStart.size(), '\0');
    in.read(start.data(), static_cast<std::streamsize>(start.size()));
    return in && start == kPageStart;
}

// What --gallery PATH is, when it is something compare must not replace: a symbolic link (whose
// target is no business of the page), a FIFO, device or folder, one of `run_files` (the runs'
// manifests and images, by inode, hard links included), or a file that is no earlier page of
// compare's. Empty when PATH does not exist or is such a page.
std::string gallery_problem(const std::string& path, const std::vector<std::string>& run_files) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return {};  // nothing there (or unreachable: writing says why)
    if (S_ISLNK(st.st_mode)) return "is a symbolic link";
    if (!S_ISREG(st.st_mode)) return "is not a regular file (a folder, FIFO, socket or device)";
    for (const std::string& f : run_files) {
        struct stat other {};
        if (::stat(f.c_str(), &other) == 0 && other.st_dev == st.st_dev && other.st_ino == st.st_ino)
            return "is " + launcher::utf8_for_display(f) + ", a file of the runs compared";
    }
    if (!is_compare_page(path)) return "exists and is not a page dp-launch compare wrote";
    return {};
}

// Refuses (UsageError) a --gallery PATH that gallery_problem finds.
void check_gallery(const std::string& path, const std::vector<std::string>& run_files) {
    const std::string problem = gallery_problem(path, run_files);
    if (!problem.empty())
        throw UsageError("--gallery " + launcher::utf8_for_display(path) + " " + problem +
                         ": the page goes to a new file, or replaces one compare wrote earlier");
}

// The manifests of runs `o.a` and `o.b` and the images of `entries`.
std::vector<std::string> run_files(const CompareOptions& o, const std::vector<Prompt>& entries) {
    std::vector<std::string> files = {o.a + "/manifest.jsonl", o.b + "/manifest.jsonl"};
    for (const Prompt& e : entries)
        for (const Side* s : {&e.a, &e.b})
            if (!s->real.empty()) files.push_back(s->real);
    return files;
}

// A cell of the page: side `s`'s image, or why run `run` has none.
std::string page_cell(const std::string& page, const Side& s, const std::string& run) {
    using launcher::html_escape;
    return s.real.empty() ? "<td class=\"low\">" + html_escape(no_image(run, s)) + "</td>"
                          : "<td><img src=\"" + html_escape(page_path(page, s.path)) + "\"></td>";
}

// `e` as a row of the page at `page`: both images (or why one is missing), then what compare found.
std::string page_row(const std::string& page, const Prompt& e, const CompareOptions& o) {
    using launcher::html_escape;
    const nlohmann::json& record = e.a.record.is_object() ? e.a.record : e.b.record;
    const std::string found = e.measured() ? "PSNR " + number(e.psnr, 2) + " dB<br>SSIM " + number(e.ssim, 4)
                              : e.paired() ? "sizes " + e.size_a + " and " + e.size_b
                                           : std::string();
    return "<tr>" + page_cell(page, e.a, o.a) + page_cell(page, e.b, o.b) + "<td" +
           (e.fails ? " class=\"low\"" : "") + ">#" + std::to_string(e.index) + "<br>" +
           html_escape(string_field(record, "prompt")) + "<br>" + found + html_escape(differences(e)) +
           "</td></tr>\n";
}

void write_page(const std::string& path, const CompareOptions& o, const std::vector<Prompt>& entries) {
    using launcher::html_escape;
    std::string html =
        std::string(kPageStart) +
        "<style>"
        "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}td{padding:4px;vertical-align:"
        "top}"
        "img{max-width:320px;image-rendering:pixelated}.low{color:#b00}</style></head><body>\n<h1>" +
        html_escape(o.a) + " &harr; " + html_escape(o.b) + "</h1>\n<table>\n";
    for (const Prompt& e : entries) html += page_row(path, e, o);
    html += "</table></body></html>\n";
    protocol::write_file_atomically(path, html);
}

}  // namespace

double psnr(const RgbImage& a, const RgbImage& b) {
    check_same_size(a, b);
    double squares = 0;
    for (std::size_t i = 0; i < a.rgb.size(); ++i) {
        const double d = static_cast<double>(a.rgb[i]) - static_cast<double>(b.rgb[i]);
        squares += d * d;
    }
    if (squares == 0) return std::numeric_limits<double>::infinity();
    const double mse = squares / static_cast<double>(a.rgb.size());
    return 10 * std::log10(255.0 * 255.0 / mse);
}

double ssim(const RgbImage& a, const RgbImage& b) {
    check_same_size(a, b);
    const int w = a.width, h = a.height;
    if (w < 2 * kRadius + 1 || h < 2 * kRadius + 1) return std::numeric_limits<double>::quiet_NaN();
    const double c1 = std::pow(0.01 * 255, 2), c2 = std::pow(0.03 * 255, 2);
    const std::size_t n = static_cast<std::size_t>(w) * static_cast<std::size_t>(h);
    double total = 0;
    for (int channel = 0; channel < 3; ++channel) {
        std::vector<double> x(n), y(n), xx(n), yy(n), xy(n);
        for (std::size_t i = 0; i < n; ++i) {
            x[i] = a.rgb[3 * i + static_cast<std::size_t>(channel)];
            y[i] = b.rgb[3 * i + static_cast<std::size_t>(channel)];
            xx[i] = x[i] * x[i], yy[i] = y[i] * y[i], xy[i] = x[i] * y[i];
        }
        const std::vector<double> ux = blurred(x, w, h), uy = blurred(y, w, h), uxx = blurred(xx, w, h),
                                  uyy = blurred(yy, w, h), uxy = blurred(xy, w, h);
        double sum = 0;
        for (int r = kRadius; r < h - kRadius; ++r)
            for (int c = kRadius; c < w - kRadius; ++c) {
                const std::size_t i = static_cast<std::size_t>(r * w + c);
                const double vx = uxx[i] - ux[i] * ux[i], vy = uyy[i] - uy[i] * uy[i],
                             vxy = uxy[i] - ux[i] * uy[i];
                sum += (2 * ux[i] * uy[i] + c1) * (2 * vxy + c2) /
                       ((ux[i] * ux[i] + uy[i] * uy[i] + c1) * (vx + vy + c2));
            }
        total += sum / (static_cast<double>(w - 2 * kRadius) * static_cast<double>(h - 2 * kRadius));
    }
    return total / 3;
}

int run_compare(const CompareOptions& o, std::ostream& out) {
    std::vector<Prompt> entries = entries_of(o);
    const std::string gallery = o.gallery.empty() ? o.b + "/compare.html" : o.gallery;
    check_gallery(gallery, run_files(o, entries));
    Summary summary;
    for (Prompt& e : entries) {
        if (e.paired()) measure(e);
        judge(e, o);
        summary.add(e);
        if (o.json)
            out << entry_json(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        else
            out << entry_line(e, o) << "\n";
    }
    write_page(gallery, o, entries);
    if (o.json)
        out << summary_json(summary, gallery).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            << "\n";
    else
        out << summary_line(summary, launcher::utf8_for_display(gallery)) << "\n";
    return summary.fails > 0 ? 1 : 0;
}

}  // namespace dp::cli
