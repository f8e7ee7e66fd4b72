#include "cli/env_command.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "launcher/build_info.h"
#include "launcher/system_info.h"

namespace dp::cli {
namespace {

bool exists(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
}

nlohmann::json collect() {
    using namespace dp::launcher;
    nlohmann::json facts;
    facts["dp_launch_version"] = kVersion;
    facts["build_type"] = kBuildType;
    facts["os"] = os_description();
    facts["usable_cpus"] = usable_cpu_count();
    const std::string torch = kLibTorchVersion;
    facts["libtorch"] =
        torch.empty() ? nlohmann::json(nullptr)
                      : nlohmann::json{{"version", torch},
                                       {"path", kLibTorchDir},
                                       {"present", exists(std::string(kLibTorchDir) + "/lib/libtorch.so")}};
    facts["cuda_toolkit"] =
        *kCudaToolkitVersion ? nlohmann::json(kCudaToolkitVersion) : nlohmann::json(nullptr);
    facts["nccl_headers"] =
        *kNcclHeaderVersion ? nlohmann::json(kNcclHeaderVersion) : nlohmann::json(nullptr);
    const std::string driver = nvidia_driver_version();
    facts["nvidia_driver"] = driver.empty() ? nlohmann::json(nullptr) : nlohmann::json(driver);
    facts["gpus"] = nlohmann::json::array();
    for (const GpuInfo& gpu : driver_gpus())
        facts["gpus"].push_back({{"bus_id", gpu.bus_id}, {"model", gpu.model}});
    facts["visible_gpus"] = visible_gpu_count();
    if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) facts["cuda_visible_devices"] = cvd;
    return facts;
}

std::string or_none(const nlohmann::json& value) {
    if (value.is_null()) return "not found";
    return value.is_string() ? value.get<std::string>() : value.dump();
}

}  // namespace

std::string describe_environment(bool json) {
    const nlohmann::json facts = collect();
    if (json) return facts.dump(2) + "\n";
    std::string out;
    out += "dp-launch:      " + or_none(facts["dp_launch_version"]) + " (" + or_none(facts["build_type"]) +
           ")\n";
    out += "OS:             " + or_none(facts["os"]) + "\n";
    out += "usable CPUs:    " + or_none(facts["usable_cpus"]) + "\n";
    const nlohmann::json& torch = facts["libtorch"];
    out += "LibTorch:       " +
           (torch.is_null() ? std::string("not built with LibTorch")
                            : or_none(torch["version"]) + " at " + or_none(torch["path"]) +
                                  (torch["present"].get<bool>() ? "" : " (missing now)")) +
           "\n";
    out += "CUDA toolkit:   " + or_none(facts["cuda_toolkit"]) + "\n";
    out += "NCCL headers:   " + or_none(facts["nccl_headers"]) + "\n";
    out += "NVIDIA driver:  " + or_none(facts["nvidia_driver"]) + "\n";
    out += "GPUs:           " + std::to_string(facts["gpus"].size()) +
           " (visible to ranks: " + or_none(facts["visible_gpus"]) + ")\n";
    for (const auto& gpu : facts["gpus"])
        out += "  " + or_none(gpu["bus_id"]) + "  " + or_none(gpu["model"]) + "\n";
    return out;
}

}  // namespace dp::cli
