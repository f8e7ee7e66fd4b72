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

// Reads accelerate's mapping a key at a time into `out`: the keys with a meaning here as dp-launch's
// config entries (each naming its line), the rest listed as ignored.
struct Reader {
    const std::string& path;
    const std::function<std::string(const std::string&)>& dp_key;
    AccelerateConfig out;
    int total_processes = -1, machines = 1, machine_rank = 0;
    YAML::Node processes_node, rank_node;

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

    // One key of the mapping (`v` not null). Throws UsageError naming its line.
    void read(const std::string& key, const YAML::Node& v);
    // The checks across keys (machine_rank below num_machines), and num_processes per machine.
    void finish();

  private:
    void read_compute_environment(const YAML::Node& v, const std::string& key) const;
    void read_distributed_type(const YAML::Node& v, const std::string& key);
    void read_mixed_precision(const YAML::Node& v, const std::string& key);
    void read_gpu_ids(const YAML::Node& v, const std::string& key);
};

void Reader::read(const std::string& key, const YAML::Node& v) {
    if (key == "compute_environment") {
        read_compute_environment(v, key);
    } else if (key == "distributed_type") {
        read_distributed_type(v, key);
    } else if (key == "num_processes") {
        total_processes = whole(v, key, 1);
        processes_node = v;
    } else if (key == "num_machines") {
        machines = whole(v, key, 1);
        add("nnodes", std::to_string(machines), v, key);
    } else if (key == "machine_rank") {
        machine_rank = whole(v, key, 0);
        rank_node = v;
        add("node_rank", std::to_string(machine_rank), v, key);
    } else if (key == "main_process_ip") {
        add("master_addr", scalar(v, key, "a host name or address"), v, key);
    } else if (key == "main_process_port") {
        add("master_port", std::to_string(whole(v, key, 1)), v, key);
    } else if (key == "mixed_precision") {
        read_mixed_precision(v, key);
    } else if (key == "gpu_ids") {
        read_gpu_ids(v, key);
    } else if (key == "use_cpu") {
        if (launcher::parse_bool(scalar(v, key, "true or false"), where(v, key))) add("cpu", "true", v, key);
    } else if (key == "rdzv_backend") {
        add("rdzv_backend", scalar(v, key, "static or c10d"), v, key);
    } else if (const std::string dp = dp_key(key); !dp.empty()) {
        add(dp, scalar(v, key, "a string, number or boolean"), v, key);
    } else {
        out.ignored.push_back(key);
    }
}

void Reader::read_compute_environment(const YAML::Node& v, const std::string& key) const {
    const std::string env = scalar(v, key, "LOCAL_MACHINE");
    if (env != "LOCAL_MACHINE")
        throw UsageError(where(v, key) + ": " + env +
                         " is not supported: dp-launch runs on this machine or in a Slurm, MPI or "
                         "Kubernetes allocation (accepted: LOCAL_MACHINE)");
}

void Reader::read_distributed_type(const YAML::Node& v, const std::string& key) {
    const std::string type = scalar(v, key, "NO, MULTI_GPU or MULTI_CPU");
    if (type == "MULTI_CPU") {
        add("cpu", "true", v, key);
    } else if (type != "NO" && type != "MULTI_GPU") {
        const std::string why = refused_distributed_type(type);
        throw UsageError(where(v, key) + ": " + type + " is not supported" +
                         (why == "unknown" ? "" : ": " + why) + " (accepted: NO, MULTI_GPU, MULTI_CPU)");
    }
}

void Reader::read_mixed_precision(const YAML::Node& v, const std::string& key) {
    const std::string mp = scalar(v, key, "no, fp16, bf16 or fp8");
    if (mp != "no" && mp != "fp16" && mp != "bf16" && mp != "fp8")
        throw UsageError(where(v, key) + ": '" + mp + "': accepted: no, fp16, bf16, fp8");
    add("mixed_precision", mp, v, key);
}

void Reader::read_gpu_ids(const YAML::Node& v, const std::string& key) {
    std::string ids;
    if (v.IsSequence()) {
        for (const auto& id : v) ids += (ids.empty() ? "" : ",") + scalar(id, key, "a GPU index");
    } else {
        ids = scalar(v, key, "all, or GPU indices such as 0,1");
    }
    add("gpu_ids", ids, v, key);
}

void Reader::finish() {
    if (machine_rank >= machines)
        throw UsageError(where(rank_node, "machine_rank") + " " + std::to_string(machine_rank) +
                         ": must be below num_machines " + std::to_string(machines) + " (accepted: 0 to " +
                         std::to_string(machines - 1) + ")");
    if (total_processes <= 0) return;
    // accelerate's num_processes counts every machine's processes.
    if (total_processes % machines != 0)
        throw UsageError(where(processes_node, "num_processes") + " " + std::to_string(total_processes) +
                         " with num_machines " + std::to_string(machines) +
                         ": accelerate's num_processes is the total over the machines, so it must be a "
                         "multiple of num_machines (or give -n, the processes per node)");
    add("num_processes", std::to_string(total_processes / machines), processes_node, "num_processes");
}

// `text` as a YAML mapping. Throws UsageError naming the line that is not YAML, too deep, or a
// document that is no mapping.
YAML::Node load_mapping(const std::string& text, const std::string& path) {
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
    return doc;
}

}  // namespace

AccelerateConfig parse_accelerate_config(const std::string& text, const std::string& path,
                                         const std::function<std::string(const std::string&)>& dp_key) {
    const YAML::Node doc = load_mapping(text, path);
    Reader r{path, dp_key, {}, -1, 1, 0, {}, {}};
    try {
        for (const auto& item : doc) {
            const YAML::Node& k = item.first;
            if (!k.IsScalar()) throw UsageError(line_of(path, k.Mark()) + ": a key must be a plain name");
            if (!item.second.IsNull())
                r.read(k.Scalar(), item.second);  // accelerate writes null for what is unset
        }
    } catch (const YAML::Exception& e) {
        throw UsageError(line_of(path, e.mark) + ": not a readable accelerate config (" + e.msg + ")");
    }
    r.finish();
    return std::move(r.out);
}

#endif

}  // namespace dp::cli
