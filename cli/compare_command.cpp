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

struct Pair {
    int64_t index = 0;
    std::string a, b;            // paths, as RUN/FILE
    std::string real_a, real_b;  // where they are (image_in_run)
    std::string prompt;
    double psnr = 0, ssim = 0;
    bool same_size = true;
    std::string size_a, size_b;
};

std::string number(double v, int digits) {
    if (std::isinf(v)) return "inf";
    std::ostringstream s;
    s << std::fixed << std::setprecision(digits) << v;
    return s.str();
}

// The records of RUN's manifest that name an image, by index.
std::map<int64_t, nlohmann::json> images_of(const std::string& run) {
    const std::string manifest = run + "/manifest.jsonl";
    if (!std::filesystem::is_regular_file(manifest))
        throw UsageError(launcher::utf8_for_display(run) +
                         ": no manifest.jsonl (an output folder of dp-launch?)");
    std::map<int64_t, nlohmann::json> out;
    for (auto& [index, record] : launcher::read_manifest(manifest))
        if (record.value("status", "") == "ok" && record.contains("file") && record["file"].is_string())
            out.emplace(index, std::move(record));
    return out;
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

// The manifests of runs `o.a` and `o.b` and the images their records `a` and `b` name.
std::vector<std::string> run_files(const CompareOptions& o, const std::map<int64_t, nlohmann::json>& a,
                                   const std::map<int64_t, nlohmann::json>& b) {
    std::vector<std::string> files = {o.a + "/manifest.jsonl", o.b + "/manifest.jsonl"};
    for (const auto& [index, record] : a) files.push_back(o.a + "/" + record["file"].get<std::string>());
    for (const auto& [index, record] : b) files.push_back(o.b + "/" + record["file"].get<std::string>());
    return files;
}

void write_page(const std::string& path, const CompareOptions& o, const std::vector<Pair>& pairs) {
    using launcher::html_escape;
    std::string html =
        std::string(kPageStart) +
        "<style>"
        "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}td{padding:4px;vertical-align:"
        "top}"
        "img{max-width:320px;image-rendering:pixelated}.low{color:#b00}</style></head><body>\n<h1>" +
        html_escape(o.a) + " &harr; " + html_escape(o.b) + "</h1>\n<table>\n";
    for (const Pair& p : pairs) {
        const bool low =
            !p.same_size || (o.min_psnr && p.psnr < *o.min_psnr) || (o.min_ssim && p.ssim < *o.min_ssim);
        html += "<tr><td><img src=\"" + html_escape(page_path(path, p.a)) + "\"></td><td><img src=\"" +
                html_escape(page_path(path, p.b)) + "\"></td><td" + (low ? " class=\"low\"" : "") + ">#" +
                std::to_string(p.index) + "<br>" + html_escape(p.prompt) + "<br>" +
                (p.same_size ? "PSNR " + number(p.psnr, 2) + " dB<br>SSIM " + number(p.ssim, 4)
                             : "sizes " + p.size_a + " and " + p.size_b) +
                "</td></tr>\n";
    }
    html += "</table></body></html>\n";
    protocol::write_file_atomically(path, html);
}

// `real`, or InputDataError that `shown` is missing when it is empty.
const std::string& existing(const std::string& real, const std::string& shown) {
    if (real.empty()) throw InputDataError(launcher::utf8_for_display(shown) + ": missing");
    return real;
}

// Sets `p`'s sizes from its PNGs' headers and, when they are the same, its PSNR and SSIM.
void measure(Pair& p) {
    PngFile a(p.real_a, p.a), b(p.real_b, p.b);
    p.size_a = a.size();
    p.size_b = b.size();
    p.same_size = p.size_a == p.size_b;
    if (!p.same_size) return;
    const RgbImage ia = a.decode(), ib = b.decode();
    p.psnr = psnr(ia, ib);
    p.ssim = ssim(ia, ib);
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
    const std::map<int64_t, nlohmann::json> a = images_of(o.a), b = images_of(o.b);
    const std::string gallery = o.gallery.empty() ? o.b + "/compare.html" : o.gallery;
    check_gallery(gallery, run_files(o, a, b));
    const std::filesystem::path real_a = std::filesystem::canonical(o.a),
                                real_b = std::filesystem::canonical(o.b);
    std::vector<Pair> pairs;
    for (const auto& [index, record] : a) {
        const auto other = b.find(index);
        if (other == b.end()) continue;
        Pair p;
        p.index = index;
        const std::string file_a = record["file"], file_b = other->second["file"];
        p.a = o.a + "/" + file_a;
        p.b = o.b + "/" + file_b;
        p.real_a = existing(image_in_run(o.a, real_a, index, file_a), p.a);
        p.real_b = existing(image_in_run(o.b, real_b, index, file_b), p.b);
        p.prompt = record.value("prompt", "");
        measure(p);
        pairs.push_back(std::move(p));
    }
    if (pairs.empty())
        throw UsageError(launcher::utf8_for_display(o.a) + " and " + launcher::utf8_for_display(o.b) +
                         ": no prompt index has an image in both (" + std::to_string(a.size()) + " and " +
                         std::to_string(b.size()) + " images)");
    int below = 0;
    double psnr_sum = 0, ssim_sum = 0, psnr_min = std::numeric_limits<double>::infinity(), ssim_min = 1;
    int finite = 0, with_ssim = 0;
    for (const Pair& p : pairs) {
        const bool low = !p.same_size || (o.min_psnr && p.psnr < *o.min_psnr) ||
                         (o.min_ssim && (std::isnan(p.ssim) || p.ssim < *o.min_ssim));
        below += low;
        if (p.same_size) {
            psnr_min = std::min(psnr_min, p.psnr);
            if (!std::isinf(p.psnr)) psnr_sum += p.psnr, ++finite;
            if (!std::isnan(p.ssim)) ssim_sum += p.ssim, ssim_min = std::min(ssim_min, p.ssim), ++with_ssim;
        }
        if (o.json) {
            // "a_hex" for a path that is not UTF-8 (Note [paths in the job file]): never a throw on dump.
            nlohmann::json j = {{"index", p.index}};
            protocol::put_path(j, "a", p.a);
            protocol::put_path(j, "b", p.b);
            j["below"] = low;
            if (p.same_size) {
                j["psnr"] = std::isinf(p.psnr) ? nlohmann::json("inf") : nlohmann::json(p.psnr);
                j["ssim"] = std::isnan(p.ssim) ? nlohmann::json(nullptr) : nlohmann::json(p.ssim);
            } else {
                j["sizes"] = {p.size_a, p.size_b};
            }
            out << j.dump() << "\n";
        } else {
            out << "#" << p.index << "  "
                << (p.same_size ? "PSNR " + number(p.psnr, 2) + " dB  SSIM " + number(p.ssim, 4)
                                : "different sizes: " + p.size_a + " and " + p.size_b)
                << (low ? "  below the budget" : "") << "\n";
        }
    }
    write_page(gallery, o, pairs);
    if (o.json) {
        nlohmann::json summary{
            {"pairs", pairs.size()},
            {"psnr_mean_finite", finite ? nlohmann::json(psnr_sum / finite) : nlohmann::json(nullptr)},
            {"psnr_min", std::isinf(psnr_min) ? nlohmann::json("inf") : nlohmann::json(psnr_min)},
            {"ssim_mean", with_ssim ? nlohmann::json(ssim_sum / with_ssim) : nlohmann::json(nullptr)},
            {"ssim_min", ssim_min},
            {"below", below}};
        protocol::put_path(summary, "gallery", gallery);
        out << summary.dump() << "\n";
    } else {
        out << pairs.size() << " pairs (" << a.size() - pairs.size() << " and " << b.size() - pairs.size()
            << " images without a pair): PSNR worst " << number(psnr_min, 2) << " dB, mean of the finite "
            << (finite ? number(psnr_sum / finite, 2) : std::string("none")) << " dB; SSIM worst "
            << number(ssim_min, 4) << ", mean "
            << (with_ssim ? number(ssim_sum / with_ssim, 4) : std::string("none")) << "; " << below
            << " below the budget; pairs side by side in " << launcher::utf8_for_display(gallery) << "\n";
    }
    return below > 0 ? 1 : 0;
}

}  // namespace dp::cli
