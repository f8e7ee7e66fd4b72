#include "launcher/system_info.h"

#include <dirent.h>
#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dp::launcher {
namespace {

std::vector<std::string> list_dir(const std::string& path) {
    std::vector<std::string> names;
    if (DIR* dir = opendir(path.c_str())) {
        while (dirent* entry = readdir(dir)) {
            std::string name = entry->d_name;
            if (name != "." && name != "..") names.push_back(name);
        }
        closedir(dir);
    }
    std::sort(names.begin(), names.end());
    return names;
}

std::string trim(std::string s) {
    const char* ws = " \t\r\n";
    s.erase(0, s.find_first_not_of(ws));
    s.erase(s.find_last_not_of(ws) + 1);
    return s;
}

}  // namespace

int usable_cpu_count() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return 1;
}

std::string cuda_visible_devices_problem(const std::string& value) {
    std::stringstream items(value);
    std::string item;
    while (std::getline(items, item, ',')) {
        item = trim(item);
        if (item == "-1" || item == "NoDevFiles") return {};
        const bool index =
            !item.empty() && item.size() <= 4 && item.find_first_not_of("0123456789") == std::string::npos;
        const bool uuid = (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) && item.size() > 4 &&
                          item.size() <= 96 &&
                          item.find_first_not_of("0123456789abcdefABCDEF-/GPUMI", 4) == std::string::npos;
        if (!index && !uuid)
            return "'" + item.substr(0, 40) +
                   "' is not a device index, a GPU-... or MIG-... UUID, -1 or empty";
    }
    if (!value.empty() && value.back() == ',') return "a trailing ',' names no device";
    return {};
}

int visible_gpu_count() {
    if (const char* env = std::getenv("CUDA_VISIBLE_DEVICES")) {
        // CUDA stops at the first entry it cannot parse; an empty value hides every device.
        int count = 0;
        std::stringstream items(env);
        std::string item;
        while (std::getline(items, item, ',')) {
            item = trim(item);
            if (item.empty() || item == "-1" || item == "NoDevFiles") break;
            ++count;
        }
        return count;
    }
    return static_cast<int>(list_dir("/proc/driver/nvidia/gpus").size());
}

std::vector<GpuInfo> driver_gpus() {
    std::vector<GpuInfo> gpus;
    for (const std::string& bus : list_dir("/proc/driver/nvidia/gpus")) {
        GpuInfo gpu{bus, ""};
        std::ifstream info("/proc/driver/nvidia/gpus/" + bus + "/information");
        for (std::string line; std::getline(info, line);)
            if (line.rfind("Model:", 0) == 0) gpu.model = trim(line.substr(6));
        gpus.push_back(gpu);
    }
    return gpus;
}

std::string nvidia_driver_version() {
    std::ifstream in("/proc/driver/nvidia/version");
    std::string line;
    std::getline(in, line);
    return trim(line);
}

std::string os_description() {
    std::string out;
    utsname u{};
    if (uname(&u) == 0) out = std::string(u.sysname) + " " + u.release + " " + u.machine;
    std::ifstream release("/etc/os-release");
    for (std::string line; std::getline(release, line);) {
        if (line.rfind("PRETTY_NAME=", 0) == 0) {
            std::string name = line.substr(12);
            if (name.size() >= 2 && name.front() == '"') name = name.substr(1, name.size() - 2);
            out += " (" + name + ")";
        }
    }
    return out;
}

std::string host_name() {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0 || !*name) return "?";
    return name;
}

}  // namespace dp::launcher
