#include "launcher/own_usage.h"

#include <sys/resource.h>

#include <cstdio>

namespace dp::launcher {

void write_own_usage(const std::string& path) {
    rusage self{};
    if (getrusage(RUSAGE_SELF, &self) != 0) return;
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return;
    const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
    std::fprintf(f, "{\"max_rss_kb\": %ld, \"user_s\": %.3f, \"system_s\": %.3f}\n", self.ru_maxrss,
                 seconds(self.ru_utime), seconds(self.ru_stime));
    std::fclose(f);
}

}  // namespace dp::launcher
