#include "cli/accelerate_config.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "launcher/errors.h"
#include "launcher/values.h"

#ifdef DP_WITH_YAML
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>
#endif

namespace dp::cli {

using launcher::UsageError;

bool is_yaml_config(const std::string& path, const std::string& text) {
    auto ends_with = [&](std::string_view suffix) {
        if (path.size() < suffix.size()) return false;
        return std::equal(suffix.rbegin(), suffix.rend(), path.rbegin(),
                          [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
    };
    if (ends_with(".yaml") || ends_with(".yml")) return true;
    if (ends_with(".json")) return false;
    const auto first = std::find_if(text.begin(), text.end(),
                                    [](char c) { return !std::isspace(static_cast<unsigned char>(c)); });
    return first == text.end() || *first != '{';
}

#ifndef DP_WITH_YAML

bool yaml_config_supported() { return false; }

AccelerateConfig parse_accelerate_config(const std::string&, const std::string& path,
                                         const std::function<std::string(const std::string&)>&) {
    throw UsageError(path +
                     ": a YAML config file, but this dp-launch was built without YAML support "
                     "(libyaml-cpp-dev); give the options as flags or as a JSON --config file");
}

#else

bool yaml_config_supported() { return true; }

namespace {

// Flow collections nested deeper than this are refused before yaml-cpp sees them.
constexpr int kMaxFlowDepth = 64;

std::string line_of(const std::string& path, const YAML::Mark& mark) {
    return path + (mark.line >= 0 ? ":" + std::to_string(mark.line + 1) : "");
}

void check_flow_depth(const std::string& text, const std::string& path) {
    int depth = 0, line = 1;
    for (char c : text) {
        if (c == '\n') ++line;
        if (c == '[' || c == '{') {
            if (++depth > kMaxFlowDepth)
                throw UsageError(path + ":" + std::to_string(line) + ": nested more than " +
                                 std::to_string(kMaxFlowDepth) +
                                 " levels deep; an accelerate config is a flat mapping of keys");
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
}

// The distributed_type values dp-launch refuses, with what to do instead.
std::string refused_distributed_type(const std::string& type) {
    if (type == "DEEPSPEED" || type == "FSDP" || type == "MEGATRON_LM")
        return "dp-launch only starts and supervises the ranks: the program sets DeepSpeed, FSDP or "
               "Megatron-LM up itself from RANK, LOCAL_RANK and WORLD_SIZE";
    if (type == "XLA" || type == "TPU" || type.rfind("MULTI_", 0) == 0)
        return "dp-launch runs ranks on CUDA GPUs or CPUs only";
    return "unknown";
}

struct Reader {
    const std::string& path;
    AccelerateConfig out;

    std::string where(const YAML::Node& node, const std::string& key) const {
        return line_of(path, node.Mark()) + ": " + key;
    }
    std::string scalar(const YAML::Node& node, const std::string& key, const std::string& expected) const {
        if (!node.IsScalar()) throw UsageError(where(node, key) + ": expected " + expected);
        return node.Scalar();
    }
    int whole(const YAML::Node& node, const std::string& key, int lo) const {
        const std::string text = scalar(node, key, "a whole number");
        const bool digits = !text.empty() && text.size() <= 9 &&
                            std::all_of(text.begin(), text.end(),
                                        [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
        if (!digits || std::stoi(text) < lo)
            throw UsageError(where(node, key) + ": '" + text + "': expected a whole number from " +
                             std::to_string(lo));
        return std::stoi(text);
    }
    void add(const std::string& key, const std::string& text, const YAML::Node& node,
             const std::string& name) {
        out.entries.push_back({key, text, where(node, name)});
    }
};

}  // namespace

AccelerateConfig parse_accelerate_config(const std::string& text, const std::string& path,
                                         const std::function<std::string(const std::string&)>& dp_key) {
    check_flow_depth(text, path);
    YAML::Node doc;
    try {
        doc = YAML::Load(text);
    } catch (const YAML::DeepRecursion& e) {
        throw UsageError(line_of(path, e.mark) + ": nested too deep; an accelerate config is a flat mapping");
    } catch (const YAML::Exception& e) {
        throw UsageError(line_of(path, e.mark) + ": not valid YAML (" + e.msg + ")");
    }
    if (!doc.IsMap())
        throw UsageError(path +
                         ": expected a YAML mapping of accelerate's keys, as `accelerate config` writes "
                         "(e.g. num_processes: 4), or a JSON object of dp-launch options");
    Reader r{path, {}};
    int total_processes = -1, machines = 1;
    int machine_rank = 0;
    YAML::Node processes_node, rank_node;
    try {
        for (const auto& item : doc) {
            const YAML::Node& k = item.first;
            const YAML::Node& v = item.second;
            if (!k.IsScalar()) throw UsageError(line_of(path, k.Mark()) + ": a key must be a plain name");
            const std::string key = k.Scalar();
            if (v.IsNull()) continue;  // accelerate writes null for what is unset
            if (key == "compute_environment") {
                const std::string env = r.scalar(v, key, "LOCAL_MACHINE");
                if (env != "LOCAL_MACHINE")
                    throw UsageError(
                        r.where(v, key) + ": " + env +
                        " is not supported: dp-launch runs on this machine or in a Slurm, MPI or "
                        "Kubernetes allocation (accepted: LOCAL_MACHINE)");
            } else if (key == "distributed_type") {
                const std::string type = r.scalar(v, key, "NO, MULTI_GPU or MULTI_CPU");
                if (type == "MULTI_CPU") {
                    r.add("device", "cpu", v, key);
                } else if (type != "NO" && type != "MULTI_GPU") {
                    const std::string why = refused_distributed_type(type);
                    throw UsageError(r.where(v, key) + ": " + type + " is not supported" +
                                     (why == "unknown" ? "" : ": " + why) +
                                     " (accepted: NO, MULTI_GPU, MULTI_CPU)");
                }
            } else if (key == "num_processes") {
                total_processes = r.whole(v, key, 1);
                processes_node = v;
            } else if (key == "num_machines") {
                machines = r.whole(v, key, 1);
                r.add("nnodes", std::to_string(machines), v, key);
            } else if (key == "machine_rank") {
                machine_rank = r.whole(v, key, 0);
                rank_node = v;
                r.add("node_rank", std::to_string(machine_rank), v, key);
            } else if (key == "main_process_ip") {
                r.add("master_addr", r.scalar(v, key, "a host name or address"), v, key);
            } else if (key == "main_process_port") {
                r.add("master_port", std::to_string(r.whole(v, key, 1)), v, key);
            } else if (key == "mixed_precision") {
                const std::string mp = r.scalar(v, key, "no, fp16 or bf16");
                if (mp != "no" && mp != "fp16" && mp != "bf16")
                    throw UsageError(
                        r.where(v, key) + ": '" + mp + "': accepted: no, fp16, bf16" +
                        (mp == "fp8" ? " (dp-launch's ranks compute in fp32, bf16 or fp16)" : ""));
                r.add("mixed_precision", mp, v, key);
            } else if (key == "gpu_ids") {
                std::string ids;
                if (v.IsSequence()) {
                    for (const auto& id : v)
                        ids += (ids.empty() ? "" : ",") + r.scalar(id, key, "a GPU index");
                } else {
                    ids = r.scalar(v, key, "all, or GPU indices such as 0,1");
                }
                r.add("gpu_ids", ids, v, key);
            } else if (key == "use_cpu") {
                if (launcher::parse_bool(r.scalar(v, key, "true or false"), r.where(v, key)))
                    r.add("device", "cpu", v, key);
            } else if (key == "rdzv_backend") {
                r.add("rdzv_backend", r.scalar(v, key, "static or c10d"), v, key);
            } else if (const std::string dp = dp_key(key); !dp.empty()) {
                r.add(dp, r.scalar(v, key, "a string, number or boolean"), v, key);
            } else {
                r.out.ignored.push_back(key);
            }
        }
    } catch (const YAML::Exception& e) {
        throw UsageError(line_of(path, e.mark) + ": not a readable accelerate config (" + e.msg + ")");
    }
    if (machine_rank >= machines)
        throw UsageError(r.where(rank_node, "machine_rank") + " " + std::to_string(machine_rank) +
                         ": must be below num_machines " + std::to_string(machines) + " (accepted: 0 to " +
                         std::to_string(machines - 1) + ")");
    if (total_processes > 0) {
        // accelerate's num_processes counts every machine's processes.
        if (total_processes % machines != 0)
            throw UsageError(r.where(processes_node, "num_processes") + " " +
                             std::to_string(total_processes) + " with num_machines " +
                             std::to_string(machines) +
                             ": accelerate's num_processes is the total over the machines, so it must be a "
                             "multiple of num_machines (or give -n, the processes per node)");
        r.add("num_processes", std::to_string(total_processes / machines), processes_node, "num_processes");
    }
    return std::move(r.out);
}

#endif

}  // namespace dp::cli
