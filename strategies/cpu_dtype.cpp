#include "strategies/cpu_dtype.h"

#include <fstream>
#include <sstream>

namespace dp::strategies {

std::string bf16_instructions(std::string_view cpuinfo) {
    bool avx512 = false, amx = false;
    std::istringstream lines{std::string(cpuinfo)};
    std::string line;
    while (std::getline(lines, line)) {
        if (line.rfind("flags", 0) != 0) continue;
        std::istringstream words(
            line.substr(line.find(':') == std::string::npos ? line.size() : line.find(':') + 1));
        std::string word;
        while (words >> word) {
            avx512 = avx512 || word == "avx512_bf16";
            amx = amx || word == "amx_bf16";
        }
    }
    return amx ? "amx_bf16" : avx512 ? "avx512_bf16" : "";
}

const std::string& cpu_bf16_instructions() {
    static const std::string instructions = [] {
        std::ifstream in("/proc/cpuinfo");
        std::stringstream text;
        text << in.rdbuf();
        return bf16_instructions(text.str());
    }();
    return instructions;
}

bool auto_bf16_on_cpu(std::string_view instructions, int64_t width) {
    return !instructions.empty() && width >= kCpuBf16MinWidth;
}

}  // namespace dp::strategies
