#include "cli/env_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "launcher/build_info.h"
#include "launcher/system_info.h"

namespace dp::cli {
namespace {

bool exists(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0;
}

// The python3 a rank would run (the first on PATH) and the versions of the packages a torchrun or
// accelerate script imports, read from their installed metadata (importlib.metadata: nothing is
// imported, so this stays fast even with torch installed). null when there is no python3; a
// package not installed is null.
nlohmann::json python_facts() {
    const char* script =
        "import json, sys\n"
        "from importlib import metadata\n"
        "def v(name):\n"
        "    try:\n"
        "        return metadata.version(name)\n"
        "    except Exception:\n"
        "        return None\n"
        "print(json.dumps({'executable': sys.executable, 'version': sys.version.split()[0], "
        "'torch': v('torch'), 'diffusers': v('diffusers'), 'transformers': v('transformers'), "
        "'accelerate': v('accelerate')}))\n";
    // `timeout` bounds a python3 that hangs; stderr is dropped (a broken site-packages says why
    // on its own when the user runs it).
    const std::string command = "timeout 20 python3 -c \"" + std::string(script) + "\" 2>/dev/null";
    FILE* pipe = ::popen(command.c_str(), "r");
    if (!pipe) return nullptr;
    std::string out;
    std::array<char, 4096> buf{};
    while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe)) out += buf.data();
    if (::pclose(pipe) != 0) return nullptr;
    const nlohmann::json facts = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
    return facts.is_object() ? facts : nlohmann::json(nullptr);
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The variables in effect that change what dp-launch does: its own DP_* settings, and what a
// scheduler or an operator set (Slurm, Open MPI / PMI, torchrun's PET_* twins, RANK, MASTER_*).
nlohmann::json variables_in_effect() {
    nlohmann::json dp = nlohmann::json::object(), cluster = nlohmann::json::object();
    static const char* kPlain[] = {
        "RANK",        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",    "MASTER_ADDR",
        "MASTER_PORT", "NODE_RANK",  "GROUP_RANK", "CUDA_VISIBLE_DEVICES"};
    for (char** e = environ; e && *e; ++e) {
        const std::string entry = *e;
        const std::size_t eq = entry.find('=');
        if (eq == std::string::npos) continue;
        const std::string name = entry.substr(0, eq), value = entry.substr(eq + 1);
        if (starts_with(name, "DP_")) {
            dp[name] = value;
            continue;
        }
        bool plain = false;
        for (const char* p : kPlain) plain = plain || name == p;
        if (plain || starts_with(name, "SLURM_") || starts_with(name, "OMPI_COMM_WORLD_") ||
            starts_with(name, "PMI_") || starts_with(name, "PET_"))
            cluster[name] = value;
    }
    return {{"dp", dp}, {"cluster", cluster}};
}

nlohmann::json collect() {
    using namespace dp::launcher;
    nlohmann::json facts;
    facts["dp_launch_version"] = kVersion;
    facts["dp_launch_commit"] = kSourceCommit;
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
    facts["python3"] = python_facts();
    facts["variables"] = variables_in_effect();
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
    // What a rank's `python3 script.py` would find (command mode).
    const nlohmann::json& py = facts["python3"];
    if (py.is_null()) {
        out += "python3:        not found on PATH (command mode runs scripts with it)\n";
    } else {
        out += "python3:        " + or_none(py["version"]) + " at " + or_none(py["executable"]) + "\n";
        for (const char* package : {"torch", "diffusers", "transformers", "accelerate"})
            out += std::string("  ") + package + ":" + std::string(13 - std::string(package).size(), ' ') +
                   (py[package].is_null() ? std::string("not installed") : or_none(py[package])) + "\n";
    }
    for (const auto& [title, key] :
         {std::pair<const char*, const char*>{"DP_* variables", "dp"}, {"cluster variables", "cluster"}}) {
        const nlohmann::json& vars = facts["variables"][key];
        out += std::string(title) + ":" + (vars.empty() ? " none\n" : "\n");
        for (const auto& [name, value] : vars.items())
            out += "  " + name + "=" + value.get<std::string>() + "\n";
    }
    return out;
}

}  // namespace dp::cli
