#include "strategies/cpu_dtype.h"

#include <fstream>
#include <set>
#include <sstream>

namespace dp::strategies {

namespace {

using Flags = std::set<std::string, std::less<>>;

// The words of a /proc/cpuinfo text's "flags" lines.
Flags flags_of(std::string_view cpuinfo) {
    Flags flags;
    std::istringstream lines{std::string(cpuinfo)};
    std::string line;
    while (std::getline(lines, line)) {
        if (line.rfind("flags", 0) != 0) continue;
        std::istringstream words(
            line.substr(line.find(':') == std::string::npos ? line.size() : line.find(':') + 1));
        std::string word;
        while (words >> word) flags.insert(word);
    }
    return flags;
}

// This machine's, read once.
const Flags& machine_flags() {
    static const Flags flags = [] {
        std::ifstream in("/proc/cpuinfo");
        std::stringstream text;
        text << in.rdbuf();
        return flags_of(text.str());
    }();
    return flags;
}

std::string bf16_of(const Flags& flags) {
    return flags.count("amx_bf16") ? "amx_bf16" : flags.count("avx512_bf16") ? "avx512_bf16" : "";
}

}  // namespace

std::string bf16_instructions(std::string_view cpuinfo) { return bf16_of(flags_of(cpuinfo)); }

const std::string& cpu_bf16_instructions() {
    static const std::string instructions = bf16_of(machine_flags());
    return instructions;
}

bool cpu_has(std::string_view flag) { return machine_flags().find(flag) != machine_flags().end(); }

bool auto_bf16_on_cpu(std::string_view instructions, int64_t width) {
    return !instructions.empty() && width >= kCpuBf16MinWidth;
}

}  // namespace dp::strategies
