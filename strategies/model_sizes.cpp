#include "strategies/model_sizes.h"
#include "strategies/text.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "strategies/model_config.h"
#include "strategies/model_files.h"
#include "strategies/safetensors.h"

namespace dp::strategies {
namespace {

bool is_dir(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Adds each tensor's element count (and with `shapes`, its shape) from a config-only folder's tensor
// manifest (a safetensors header's JSON without the data offsets): false when it is not such JSON
// or a shape is not a list of sizes.
bool add_manifest_counts(const std::string& header, std::map<std::string, int64_t>& counts,
                         std::map<std::string, std::vector<int64_t>>* shapes = nullptr) {
    try {
        const nlohmann::json h = nlohmann::json::parse(header);
        if (!h.is_object()) return false;
        for (const auto& [name, info] : h.items()) {
            if (name == "__metadata__") continue;
            int64_t n = 1;
            std::vector<int64_t> shape;
            for (const auto& dim : info.at("shape")) {
                const int64_t v = dim.get<int64_t>();
                if (v < 0 || (v > 0 && n > (int64_t{1} << 50) / v)) return false;
                n *= v;
                shape.push_back(v);
            }
            counts[name] = n;
            if (shapes) (*shapes)[name] = std::move(shape);
        }
        return true;
    } catch (const std::exception&) {
        return false;
    }
}

bool has_safetensors(const std::string& dir) {
    bool found = false;
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            const std::string n = e->d_name;
            found = found || (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0);
        }
        closedir(d);
    }
    return found;
}

}  // namespace

namespace {

std::map<std::string, int64_t> read_safetensors_counts(const std::string& dir, const std::string& variant,
                                                       std::map<std::string, std::vector<int64_t>>* shapes) {
    // The files the worker loads (Note [weight variants]): one file, or the shards an index names.
    const ComponentWeights weights = find_component_weights(dir, variant);
    std::set<std::string> files;
    if (weights.index.empty()) {
        files.insert(weights.file);
    } else {
        for (const auto& [tensor, shard] : read_weight_index(weights.index)) files.insert(dir + "/" + shard);
    }
    // Each file's header through the one safetensors reader (its shapes and offsets checked).
    std::map<std::string, int64_t> counts;
    for (const std::string& path : files) {
        // Held while its tensors are read: the map lives in the file object.
        const std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(path);
        for (const auto& [name, info] : file->tensors()) {
            int64_t n = 1;
            for (const int64_t d : info.shape) n *= d;
            counts[name] = n;
            if (shapes) (*shapes)[name] = info.shape;
        }
    }
    return counts;
}

std::map<std::string, int64_t> read_tensor_counts(const std::string& dir, const std::string& variant,
                                                  std::map<std::string, std::vector<int64_t>>* shapes) {
    if (has_safetensors(dir)) return read_safetensors_counts(dir, variant, shapes);
    const std::string manifest = dir + "/" + kTensorManifest;
    if (!model_file_exists(manifest))
        throw std::runtime_error(dir + ": no *.safetensors weights, and no " + std::string(kTensorManifest) +
                                 " (the tensor list of a config-only folder)");
    const std::string text = read_model_file(manifest, std::size_t{16} << 20);  // ModelError names it
    std::map<std::string, int64_t> counts;
    if (!add_manifest_counts(text, counts, shapes) || counts.empty())
        throw std::runtime_error(
            manifest +
            ": not a tensor manifest (expected {\"NAME\": {\"dtype\": ..., \"shape\": [...]}, "
            "...}, as scripts/models/make_config_folders.py writes it)");
    return counts;
}

}  // namespace

std::map<std::string, int64_t> safetensors_element_counts(const std::string& dir,
                                                          const std::string& variant) {
    return read_safetensors_counts(dir, variant, nullptr);
}

std::map<std::string, int64_t> tensor_element_counts(const std::string& dir, const std::string& variant) {
    return read_tensor_counts(dir, variant, nullptr);
}

std::map<std::string, std::vector<int64_t>> tensor_shapes(const std::string& dir,
                                                          const std::string& variant) {
    std::map<std::string, std::vector<int64_t>> shapes;
    read_tensor_counts(dir, variant, &shapes);
    return shapes;
}

std::vector<std::string> components_without_weights(const std::string& model_dir, const ParallelSpec& spec) {
    std::vector<std::string> out;
    for (const std::string& name : spec.components) {
        const std::string dir = model_dir + "/" + name;
        if (is_dir(dir) && !has_safetensors(dir) && model_file_exists(dir + "/" + kTensorManifest))
            out.push_back(name);
    }
    return out;
}

namespace {

// The block index of a tensor named PREFIX<index>.<rest>, or -1.
int block_index(const std::string& tensor, const std::string& prefix) {
    if (!starts_with(tensor, prefix)) return -1;
    const std::size_t dot = tensor.find('.', prefix.size());
    try {
        const int block = std::stoi(tensor.substr(prefix.size(), dot - prefix.size()));
        return block <= 100000 ? block : -1;
    } catch (const std::exception&) {
        return -1;
    }
}

}  // namespace

std::vector<std::string> components_left_out(const std::string& model_dir, const ParallelSpec& spec,
                                             bool no_t5) {
    if (spec.t5_encoder.empty()) return {};
    if (no_t5) return {spec.t5_encoder};
    nlohmann::json index;
    try {
        index = nlohmann::json::parse(read_model_file(model_dir + "/model_index.json", 1 << 20));
    } catch (const std::exception&) {
        return {};  // parallel_spec_for_model has named what is wrong with it
    }
    const bool named = index.is_object() && index.contains(spec.t5_encoder) &&
                       index[spec.t5_encoder].is_array() && index[spec.t5_encoder].size() == 2 &&
                       index[spec.t5_encoder][1].is_string();
    if (!named) return {spec.t5_encoder};
    return {};
}

std::vector<ComponentSize> pipeline_component_sizes(const std::string& model_dir, const ParallelSpec& spec,
                                                    int64_t element_bytes, const std::string& variant,
                                                    const std::vector<std::string>& left_out) {
    std::vector<ComponentSize> out;
    for (const std::string& name : spec.components) {
        if (std::find(left_out.begin(), left_out.end(), name) != left_out.end()) continue;
        const std::string dir = model_dir + "/" + name;
        const auto& optional = spec.optional_components;
        if (!is_dir(dir) && std::find(optional.begin(), optional.end(), name) != optional.end()) continue;
        ComponentSize c;
        c.name = name;
        const bool blocks = name == spec.transformer;
        // Each prefix's blocks in order; a block's index counts the earlier prefixes' blocks.
        std::vector<std::vector<int64_t>> per_prefix(blocks ? spec.block_prefixes.size() : 0);
        for (const auto& [tensor, n] : tensor_element_counts(dir, variant)) {
            const auto unloaded = [&, t = tensor](const std::pair<std::string, std::string>& u) {
                return u.first == name && starts_with(t, u.second);
            };
            if (std::any_of(spec.unloaded_tensors.begin(), spec.unloaded_tensors.end(), unloaded)) continue;
            c.bytes += n * element_bytes;
            for (std::size_t p = 0; p < per_prefix.size(); ++p) {
                const int block = block_index(tensor, spec.block_prefixes[p]);
                if (block < 0) continue;
                if (static_cast<int>(per_prefix[p].size()) <= block) per_prefix[p].resize(block + 1, 0);
                per_prefix[p][static_cast<std::size_t>(block)] += n * element_bytes;
                break;
            }
        }
        for (const auto& b : per_prefix) c.block_bytes.insert(c.block_bytes.end(), b.begin(), b.end());
        out.push_back(std::move(c));
    }
    return out;
}

DeviceMapPlan plan_device_map_spec(const std::string& model_dir, const ParallelSpec& spec,
                                   int64_t element_bytes, const std::string& device_map,
                                   const std::string& max_memory,
                                   const std::vector<DeviceBudget>& default_budgets,
                                   const std::string& variant, const std::vector<std::string>& left_out) {
    const std::vector<ComponentSize> sizes =
        pipeline_component_sizes(model_dir, spec, element_bytes, variant, left_out);
    if (device_map == "balanced" || device_map == "auto")
        return plan_device_map(sizes, max_memory.empty() ? default_budgets : parse_max_memory(max_memory),
                               device_map == "auto" ? DeviceMapMode::kAuto : DeviceMapMode::kBalanced);
    if (!max_memory.empty())
        throw std::invalid_argument("--max-memory does not apply to a device map written by hand");
    std::string text;
    try {
        text = read_model_file(device_map, 1 << 20);
    } catch (const std::exception& e) {
        throw std::invalid_argument("cannot read it (" + std::string(e.what()) +
                                    "); expected balanced, auto or a readable FILE.json");
    }
    return device_map_from_json(text, sizes, device_map);
}

}  // namespace dp::strategies
