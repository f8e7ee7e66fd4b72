#include "launcher/memory_guard.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "launcher/errors.h"
#include "launcher/system_info.h"
#include "strategies/config_sizes.h"
#include "strategies/model_sizes.h"

namespace dp::launcher {
namespace {

std::string gib(int64_t bytes) {
    char buf[32];
    if (bytes >= (1LL << 30))
        std::snprintf(buf, sizeof(buf), "%.1f GiB",
                      static_cast<double>(bytes) / static_cast<double>(1LL << 30));
    else
        std::snprintf(buf, sizeof(buf), "%.0f MiB",
                      static_cast<double>(bytes) / static_cast<double>(1LL << 20));
    return buf;
}

// The first whole number in `path`, or -1 ("max" and unreadable files too).
int64_t read_number(const std::string& path) {
    std::ifstream in(path);
    std::string word;
    if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return -1;
    try {
        return std::stoll(word);
    } catch (const std::exception&) {
        return -1;
    }
}

}  // namespace

int64_t available_memory_bytes() {
    int64_t available = 0;
    std::ifstream meminfo("/proc/meminfo");
    for (std::string line; std::getline(meminfo, line);) {
        if (line.rfind("MemAvailable:", 0) != 0) continue;
        std::istringstream fields(line.substr(13));
        long long kb = 0;
        if (fields >> kb) available = static_cast<int64_t>(kb) * 1024;
    }
    // cgroup v2: this process's group's limit less its usage.
    std::ifstream cgroup("/proc/self/cgroup");
    std::string line, path;
    while (std::getline(cgroup, line))
        if (line.rfind("0::", 0) == 0) path = line.substr(3);
    if (!path.empty()) {
        const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
        const int64_t limit = read_number(dir + "/memory.max"), used = read_number(dir + "/memory.current");
        if (limit > 0 && used >= 0) {
            const int64_t room = std::max<int64_t>(limit - used, 0);
            available = available > 0 ? std::min(available, room) : room;
        }
    }
    return available;
}

void check_memory_fits(const LaunchSpec& launch, const ResolvedJob& resolved, int64_t available) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    const std::string& dtype = resolved.dtype;
    if (job.force || !model.spec) return;
    const bool cpu = job.device == "cpu" || (job.device == "auto" && visible_gpu_count() == 0);
    if (!cpu || !resolved.device_map().empty()) return;
    const int64_t element_bytes = dtype == "fp32" ? 4 : 2;
    int64_t per_rank = 0;
    try {
        const int tp = std::max(1, resolved.degrees().tp);
        // Random weights are built from the configs (Note [sizes from configs]).
        const std::vector<strategies::ComponentSize> sizes =
            job.random_weights ? strategies::random_weight_component_sizes(job.model, *model.spec,
                                                                           element_bytes, resolved.left_out)
                               : strategies::pipeline_component_sizes(job.model, *model.spec, element_bytes,
                                                                      job.variant, resolved.left_out);
        for (const strategies::ComponentSize& c : sizes) {
            const bool split = c.name == model.spec->transformer ||
                               std::find(model.spec->tp_components.begin(), model.spec->tp_components.end(),
                                         c.name) != model.spec->tp_components.end();
            per_rank += split ? (c.bytes + tp - 1) / tp : c.bytes;
        }
    } catch (const std::exception&) {
        return;  // the sizes cannot be read: the model's checks say why
    }
    if (available < 0) available = available_memory_bytes();
    if (available <= 0) return;
    const auto ranks = static_cast<int64_t>(launch.local_ranks().size());
    const int64_t each = per_rank + kRankBaseBytes;
    const int64_t need = kSharedLibraryBytes + ranks * each;
    if (need <= available) return;
    const int64_t fit = std::max<int64_t>(available - kSharedLibraryBytes, 0) / each;
    throw UsageError(
        std::to_string(ranks) + " rank(s) on this machine would need about " + gib(need) + " (each " +
        gib(per_rank) + " of weights in " + dtype + " and about " + gib(kRankBaseBytes) +
        " of LibTorch's own, and its libraries once), and " + gib(available) + " is available; " +
        (fit > 0 ? "start at most " + std::to_string(fit) + " rank(s) here (-n " + std::to_string(fit) + ")"
                 : "no rank fits") +
        ", free memory, or pass --force to start them anyway");
}

}  // namespace dp::launcher
