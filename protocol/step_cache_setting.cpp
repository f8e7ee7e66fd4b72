#include "protocol/step_cache_setting.h"
#include "protocol/number_text.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

namespace dp::protocol {
namespace {

constexpr std::size_t kMaxRatios = 10000;            // steps a ratio list may cover
constexpr std::size_t kMaxRatioFileBytes = 1 << 20;  // a calibration file is a few hundred bytes

// The ratios MagCache publishes for FLUX.1 (dev and schnell), 28 steps: diffusers' FLUX_MAG_RATIOS.
const std::vector<float>& flux_mag_ratios() {
    static const std::vector<float> r = {
        1.0f,     1.21094f, 1.11719f, 1.07812f, 1.0625f,  1.03906f, 1.03125f, 1.03906f, 1.02344f, 1.03125f,
        1.02344f, 0.98047f, 1.01562f, 1.00781f, 1.0f,     1.00781f, 1.0f,     1.00781f, 1.0f,     1.0f,
        0.99609f, 0.99609f, 0.98047f, 0.98828f, 0.96484f, 0.95703f, 0.93359f, 0.89062f};
    return r;
}

// A ratio list's values: finite and positive (a magnitude ratio), at most kMaxRatios of them.
std::string check_ratios(const std::vector<float>& r) {
    if (r.empty()) return "mag_ratios is empty";
    if (r.size() > kMaxRatios)
        return "mag_ratios has " + std::to_string(r.size()) + " values (at most " +
               std::to_string(kMaxRatios) + ")";
    for (std::size_t i = 0; i < r.size(); ++i)
        if (!std::isfinite(r[i]) || r[i] <= 0)
            return "mag_ratios[" + std::to_string(i) + "] = " + number_text(r[i]) +
                   " is not a positive number";
    return {};
}

// "1 1.21 0.98": the numbers separated by spaces; false when the text is not only that.
bool parse_number_list(const std::string& text, std::vector<float>& out) {
    out.clear();
    const char* p = text.c_str();
    while (*p) {
        while (*p == ' ') ++p;
        if (!*p) break;
        char* end = nullptr;
        const double v = std::strtod(p, &end);
        if (end == p || (*end != ' ' && *end != '\0')) return false;
        out.push_back(static_cast<float>(v));
        p = end;
    }
    return !out.empty();
}

}  // namespace

std::string read_mag_ratios_file(const std::string& path, std::vector<float>& out) {
    out.clear();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return "the mag_ratios file '" + path + "' does not exist";
    if (!S_ISREG(st.st_mode)) return "the mag_ratios file '" + path + "' is not a regular file";
    if (static_cast<std::size_t>(st.st_size) > kMaxRatioFileBytes)
        return "the mag_ratios file '" + path + "' is " + std::to_string(st.st_size) +
               " bytes; a ratio file is a JSON list of numbers (at most 1 MiB)";
    std::ifstream in(path, std::ios::binary);
    if (!in) return "the mag_ratios file '" + path + "' cannot be read";
    const std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    const nlohmann::json* list = &j;
    if (j.is_object() && j.contains("mag_ratios")) list = &j["mag_ratios"];
    const std::string expected =
        "the mag_ratios file '" + path +
        "' must hold a JSON list of numbers, or an object whose \"mag_ratios\" is one "
        "(as mag_cache:calibrate=true writes it)";
    if (j.is_discarded() || !list->is_array()) return expected;
    for (const nlohmann::json& v : *list) {
        if (!v.is_number()) return expected;
        out.push_back(static_cast<float>(v.get<double>()));
    }
    if (const std::string why = check_ratios(out); !why.empty())
        return "the mag_ratios file '" + path + "': " + why;
    return {};
}

std::string StepCache::text() const {
    if (first_block()) return type + ":threshold=" + number_text(threshold);
    if (taylorseer())
        return type + ":cache_interval=" + std::to_string(cache_interval) +
               ",disable_cache_before_step=" + std::to_string(disable_cache_before_step) +
               (disable_cache_after_step >= 0
                    ? ",disable_cache_after_step=" + std::to_string(disable_cache_after_step)
                    : std::string()) +
               ",max_order=" + std::to_string(max_order) +
               ",taylor_factors_dtype=" + (float32_factors ? "float32" : "bfloat16");
    if (mag()) {
        if (calibrate) return type + ":calibrate=true";
        std::string ratios;
        for (const float r : mag_ratios) {
            char buf[32];
            std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(r));  // a float32's exact digits
            ratios += (ratios.empty() ? "" : " ") + std::string(buf);
        }
        return type + ":threshold=" + number_text(threshold) +
               ",max_skip_steps=" + std::to_string(max_skip_steps) +
               ",retention_ratio=" + number_text(retention_ratio) + ",mag_ratios=" + ratios;
    }
    return "none";
}

bool StepCache::computes(int64_t step) const {
    // diffusers' TaylorSeerCacheHook: the warm-up, every cache_interval-th pass after it (Python's
    // modulo: the pass right after the warm-up is extrapolated), and the cool-down.
    const int64_t after = step - disable_cache_before_step - 1;
    const bool interval = ((after % cache_interval) + cache_interval) % cache_interval == 0;
    return step < disable_cache_before_step || interval ||
           (disable_cache_after_step >= 0 && step >= disable_cache_after_step);
}

std::vector<float> StepCache::mag_ratios_for(int64_t steps) const {
    const std::size_t n = mag_ratios.size();
    if (n == 0 || steps <= 0 || static_cast<std::size_t>(steps) == n) return mag_ratios;
    if (steps == 1) return {mag_ratios.back()};
    // diffusers' nearest_interp: index round(i * scale), the product a float32 and rounded half to even.
    const float scale = static_cast<float>(static_cast<double>(n - 1) / static_cast<double>(steps - 1));
    std::vector<float> out;
    for (int64_t i = 0; i < steps; ++i) {
        const float at = static_cast<float>(i) * scale;
        const auto index = static_cast<std::size_t>(std::nearbyint(at));
        out.push_back(mag_ratios[std::min(index, n - 1)]);
    }
    return out;
}

namespace {

// What parse_step_cache accepts, for its messages.
std::string accepted_step_caches(double max) {
    return "expected first_block_cache:threshold=T (T from 0 to " + number_text(max) +
           "), "
           "taylorseer_cache[:cache_interval=N,disable_cache_before_step=N,disable_"
           "cache_after_step=N,max_order=K,"
           "taylor_factors_dtype=bfloat16|float32], "
           "mag_cache:mag_ratios=flux|FILE[,threshold=T,max_skip_steps=K,"
           "retention_ratio=R], mag_cache:calibrate=true, or none";
}

// One KEY=VALUE of a step cache setting.
struct CacheKey {
    std::string key, value;
    bool has_value = false;  // there is a '=' (a threshold needs one)

    // `value` as a whole number from `lo` to `hi` into `field`: an error text, or empty.
    std::string whole(int64_t lo, int64_t hi, int64_t& field) const {
        char* end = nullptr;
        const long long v = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || !end || *end != '\0' || v < lo || v > hi)
            return key + " '" + value.substr(0, 40) + "' is not a whole number from " + std::to_string(lo) +
                   " to " + std::to_string(hi);
        field = v;
        return {};
    }
    // `value` as a number from `lo` to `hi` into `field`: an error text, or empty.
    std::string number(double lo, double hi, double& field) const {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || !end || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
            return key + " '" + value.substr(0, 40) + "' is not a number from " + number_text(lo) + " to " +
                   number_text(hi);
        field = v;
        return {};
    }
};

// A key TaylorSeer takes, into `out`: an error text or empty; nullopt when it takes no such key
// (or not with that value).
std::optional<std::string> set_taylorseer_key(const CacheKey& k, StepCache& out) {
    if (k.key == "cache_interval") return k.whole(1, 1000000, out.cache_interval);
    if (k.key == "disable_cache_before_step") return k.whole(0, 1000000, out.disable_cache_before_step);
    if (k.key == "disable_cache_after_step") return k.whole(0, 1000000, out.disable_cache_after_step);
    if (k.key == "max_order") return k.whole(0, 8, out.max_order);
    if (k.key == "taylor_factors_dtype" && (k.value == "bfloat16" || k.value == "float32")) {
        out.float32_factors = k.value == "float32";
        return std::string();
    }
    return std::nullopt;
}

// A key MagCache takes besides its threshold, as set_taylorseer_key does. `ratios_given` is set by
// mag_ratios.
std::optional<std::string> set_mag_key(const CacheKey& k, StepCache& out, bool& ratios_given) {
    if (k.key == "max_skip_steps") return k.whole(0, 1000000, out.max_skip_steps);
    if (k.key == "retention_ratio") return k.number(0, 1, out.retention_ratio);
    if (k.key == "calibrate" && (k.value == "true" || k.value == "false" || !k.has_value)) {
        out.calibrate = k.value != "false";
        return std::string();
    }
    if (k.key != "mag_ratios" || k.value.empty()) return std::nullopt;
    ratios_given = true;
    std::string why;
    if (k.value == "flux") {
        out.mag_ratios = flux_mag_ratios();
    } else if (!parse_number_list(k.value, out.mag_ratios)) {
        why = read_mag_ratios_file(k.value, out.mag_ratios);
    }
    return why.empty() ? check_ratios(out.mag_ratios) : why;
}

// The keys `c`'s type takes, for the message of one it does not.
std::string keys_taken(const StepCache& c) {
    if (c.first_block()) return "threshold=T";
    if (c.taylorseer())
        return "cache_interval, disable_cache_before_step, disable_cache_after_step, max_order and "
               "taylor_factors_dtype (bfloat16 or float32)";
    return "threshold, max_skip_steps, retention_ratio, mag_ratios (flux, a file, or the numbers) and "
           "calibrate=true";
}

// One KEY=VALUE `item` of `out`'s type into `out`: an error text, or empty.
std::string set_cache_key(const std::string& item, StepCache& out, bool& ratios_given,
                          const std::string& accepted, double max) {
    const std::size_t eq = item.find('=');
    const CacheKey k{item.substr(0, eq), eq == std::string::npos ? "" : item.substr(eq + 1),
                     eq != std::string::npos};
    std::optional<std::string> why;
    if ((out.first_block() || out.mag()) && k.key == "threshold" && k.has_value)
        return k.number(0, max, out.threshold);
    if (out.taylorseer()) why = set_taylorseer_key(k, out);
    if (out.mag()) why = set_mag_key(k, out, ratios_given);
    if (why) return *why;
    if (out.mag() && k.key == "num_inference_steps")
        return "mag_cache takes no num_inference_steps: dp-launch uses each prompt's own steps, and "
               "takes "
               "mag_ratios to them as diffusers does; " +
               accepted;
    return out.type + " takes " + keys_taken(out) + " (got '" + item.substr(0, 40) + "'); " + accepted;
}

}  // namespace

std::string parse_step_cache(const std::string& text, StepCache& out, double max) {
    out = StepCache{};
    const std::string accepted = accepted_step_caches(max);
    if (text == "none" || text.empty()) return {};
    const std::size_t colon = text.find(':');
    const std::string type = text.substr(0, colon);
    if (type == "faster_cache" || type == "pyramid_attention_broadcast")
        return "'" + type + "' is not built yet; " + accepted;
    if (type != "first_block_cache" && type != "taylorseer_cache" && type != "mag_cache")
        return "unknown step cache '" + type.substr(0, 40) + "'; " + accepted;
    out.type = type;
    out.threshold = out.mag() ? 0.06 : 0.05;  // MagCacheConfig's and FirstBlockCacheConfig's defaults
    bool ratios_given = false;
    std::map<std::string, std::string> given;  // key -> its KEY=VALUE item
    std::string rest = colon == std::string::npos ? std::string() : text.substr(colon + 1);
    while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        const std::string item = rest.substr(0, comma);
        rest = comma == std::string::npos ? std::string() : rest.substr(comma + 1);
        // A key given twice is refused, naming both, rather than the last one taken.
        const auto [at, first] = given.emplace(item.substr(0, item.find('=')), item);
        if (!first)
            return at->first + " is given twice ('" + at->second.substr(0, 40) + "' and '" +
                   item.substr(0, 40) + "'); give each key once";
        if (const std::string why = set_cache_key(item, out, ratios_given, accepted, max); !why.empty())
            return why;
    }
    if (out.mag() && out.calibrate)
        for (const auto& [key, item] : given)
            if (key != "calibrate")
                return "mag_cache:calibrate=true computes every pass and measures the ratios, so '" +
                       item.substr(0, 40) +
                       "' would not be used; give calibrate=true alone, or the ratios without it";
    if (out.mag() && out.calibrate) {
        out.mag_ratios.clear();  // calibration measures them: nothing is skipped
        out.threshold = 0.06;
        out.max_skip_steps = 3;
        out.retention_ratio = 0.2;
    } else if (out.mag() && !ratios_given) {
        return "mag_cache needs the model's magnitude ratios: mag_ratios=flux (FLUX.1's published ones), "
               "mag_ratios=FILE (a JSON list), or run once with mag_cache:calibrate=true, which writes "
               "OUTPUT/mag_ratios.json for the next run";
    }
    return {};
}

}  // namespace dp::protocol
