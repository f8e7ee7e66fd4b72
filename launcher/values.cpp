#include "launcher/values.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "launcher/errors.h"
#include "launcher/spelling.h"
#include "launcher/system_info.h"

namespace dp::launcher {
namespace {

std::string quoted(std::string_view text) {
    std::string out = "'";
    for (char c : text.substr(0, 80)) out += (static_cast<unsigned char>(c) < 0x20) ? '?' : c;
    if (text.size() > 80) out += "...";
    return out + "'";
}

[[noreturn]] void reject(const std::string& source, std::string_view text, const std::string& accepted) {
    throw UsageError(source + " " + quoted(text) + ": " + accepted);
}

bool is_hostname(std::string_view s) {
    if (s.empty() || s.size() > 253) return false;
    size_t start = 0;
    while (start <= s.size()) {
        size_t dot = s.find('.', start);
        std::string_view label = s.substr(start, dot == std::string_view::npos ? s.npos : dot - start);
        if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
        for (char c : label)
            if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
        if (dot == std::string_view::npos) break;
        start = dot + 1;
    }
    // An all-numeric dotted name is a malformed IPv4 address, not a host name.
    return !std::all_of(s.begin(), s.end(),
                        [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.'; });
}

}  // namespace

int parse_int(std::string_view text, int lo, int hi, const std::string& source,
              std::string_view alternatives) {
    const std::string accepted = "expected " + std::string(alternatives) + "a whole number from " +
                                 std::to_string(lo) + " to " + std::to_string(hi);
    long long value = 0;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || text.front() == '+' || ptr != end) reject(source, text, accepted);
    if (ec == std::errc::result_out_of_range || value < lo || value > hi) reject(source, text, accepted);
    if (ec != std::errc()) reject(source, text, accepted);
    return static_cast<int>(value);
}

uint64_t parse_u64(std::string_view text, const std::string& source) {
    uint64_t value = 0;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ec != std::errc() || ptr != end)
        reject(source, text, "expected a whole number from 0 to " + std::to_string(UINT64_MAX));
    return value;
}

double parse_number(std::string_view text, double lo, double hi, const std::string& source,
                    std::string_view unit, bool above_lo) {
    const std::string accepted = "expected a number " +
                                 (unit.empty() ? "" : "of " + std::string(unit) + " ") +
                                 (above_lo ? "above " : "from ") + number_text(lo) + " to " + number_text(hi);
    double value = 0;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, value, std::chars_format::fixed);
    if (text.empty() || ptr != end || ec != std::errc() || !std::isfinite(value) || value < lo ||
        value > hi || (above_lo && value == lo))
        reject(source, text, accepted);
    return value;
}

double parse_seconds(std::string_view text, double hi, const std::string& source) {
    return parse_number(text, 0, hi, source, "seconds");
}

std::string number_text(double value) {
    char buf[32];
    auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), value);
    return ec == std::errc() ? std::string(buf, ptr) : std::to_string(value);
}

std::string parse_choice(std::string_view text, const std::vector<std::string>& choices,
                         const std::string& source) {
    if (std::find(choices.begin(), choices.end(), text) != choices.end()) return std::string(text);
    std::string list;
    for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
    reject(source, text, "expected one of " + list + did_you_mean(text, choices));
}

bool parse_bool(std::string_view text, const std::string& source) {
    std::string lower(text);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
    if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
    reject(source, text, "expected true or false (also 1/0, yes/no, on/off)");
}

std::vector<int> parse_gpu_ids(std::string_view text, const std::string& source) {
    const std::string accepted = "expected distinct GPU indices separated by commas, e.g. 0,1,3";
    std::vector<int> ids;
    std::set<int> seen;
    size_t start = 0;
    while (true) {
        size_t comma = text.find(',', start);
        std::string_view item =
            text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
        int id = 0;
        auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
        if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || id < 0 || id > 4095)
            reject(source, text, accepted);
        if (!seen.insert(id).second)
            reject(source, text, "GPU " + std::to_string(id) + " is listed twice; " + accepted);
        ids.push_back(id);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    return ids;
}

std::string gpu_ids_text(const std::vector<int>& ids) {
    std::string out;
    for (int id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
    return out;
}

std::vector<int> parse_block_list(std::string_view text, const std::string& source) {
    const std::string accepted =
        "expected distinct transformer block indices separated by commas, e.g. 7,8,9 "
        "(empty: none)";
    std::vector<int> blocks;
    if (text.empty()) return blocks;
    for (size_t start = 0;;) {
        const size_t comma = text.find(',', start);
        const std::string_view item =
            text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
        int block = 0;
        auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), block);
        if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || block < 0 ||
            block > 100000)
            reject(source, text, accepted);
        if (std::find(blocks.begin(), blocks.end(), block) != blocks.end())
            reject(source, text, "block " + std::to_string(block) + " is listed twice; " + accepted);
        blocks.push_back(block);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    return blocks;
}

std::string block_list_text(const std::vector<int>& blocks) { return gpu_ids_text(blocks); }

std::string parse_host(std::string_view text, const std::string& source) {
    std::string host(text);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    unsigned char buf[16];
    if (inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1)
        return host;
    if (host.find('\0') == std::string::npos && is_hostname(host)) return host;
    reject(source, text, "expected a host name or an IPv4/IPv6 address, e.g. node0.cluster or 10.0.0.1");
}

int parse_process_count(std::string_view text, const std::vector<int>& gpu_ids, const std::string& source) {
    if (text == "auto") {
        int gpus = gpu_ids.empty() ? visible_gpu_count() : static_cast<int>(gpu_ids.size());
        return std::clamp(gpus, 1, kMaxLocalProcesses);
    }
    return parse_int(text, 1, kMaxLocalProcesses, source, "'auto' or ");
}

}  // namespace dp::launcher
