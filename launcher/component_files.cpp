#include "launcher/component_files.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "launcher/errors.h"
#include "launcher/prompt_file.h"
#include "protocol/errors.h"
#include "strategies/model_config.h"
#include "strategies/model_files.h"
#include "strategies/model_sizes.h"
#include "strategies/safetensors.h"
#include "strategies/sha256.h"
#include "strategies/single_file.h"

namespace dp::launcher {

const std::vector<std::pair<const char*, const char*>>& component_file_flags() {
    static const std::vector<std::pair<const char*, const char*>> flags = {
        {"--transformer", "transformer"},
        {"--text-encoder", "text_encoder"},
        {"--text-encoder-2", "text_encoder_2"},
        {"--text-encoder-3", "text_encoder_3"},
        {"--vae", "vae"}};
    return flags;
}

std::vector<ComponentFile> check_component_files(const std::map<std::string, std::string>& files,
                                                 const strategies::ModelInfo& model,
                                                 const std::string& variant, bool hash,
                                                 const std::string& model_file) {
    std::vector<ComponentFile> out;
    std::map<std::string, std::string> hashes;  // a whole-pipeline file is read once
    const strategies::ParallelSpec& spec = *model.spec;
    for (const auto& [component_flag, component] : component_file_flags()) {
        const auto it = files.find(component);
        if (it == files.end()) continue;
        const std::string flag = !model_file.empty() && it->second == model_file ? "--model" : component_flag;
        const std::string shown = utf8_for_display(it->second.substr(0, 300));
        // The folder's own components: a family's (SD3's T5, a VAE) may be left out of a model.
        const std::vector<std::string> has = strategies::folder_components(model.dir, spec);
        if (std::find(has.begin(), has.end(), component) == has.end()) {
            std::string components;
            for (const std::string& c : has) components += (components.empty() ? "" : ", ") + c;
            const bool family_has =
                std::find(spec.components.begin(), spec.components.end(), component) != spec.components.end();
            throw UsageError(std::string(flag) + " " + shown + ": " +
                             (family_has
                                  ? "the model " + utf8_for_display(model.dir) + " (" + model.family_name +
                                        ") has no " + component + " (its model_index.json names none)"
                                  : spec.display_name + " has no " + component) +
                             "; its components: " + components);
        }
        if (!strategies::model_file_exists(it->second))
            throw protocol::Error(std::string(flag) + " " + shown + ": " +
                                      strategies::missing_file_text(it->second, "no such file"),
                                  protocol::kExitNoInput);
        ComponentFile f;
        f.flag = flag;
        f.component = component;
        char resolved[PATH_MAX];
        f.path = ::realpath(it->second.c_str(), resolved) ? std::string(resolved) : it->second;
        try {
            // A valid safetensors or GGUF file, or 65.
            const strategies::SingleFileLayout layout =
                strategies::read_single_file_layout(f.path, spec, component);
            // The component's tensors, from the folder's weights or its tensors.json; a folder with
            // its config alone says none, and the ranks check each tensor as they load it.
            const std::string dir = model.dir + "/" + component;
            if (!strategies::weight_variants(dir).empty() ||
                strategies::model_file_exists(dir + "/tensors.json")) {
                const auto expected = strategies::tensor_shapes(dir, variant);
                const std::string problem = strategies::single_file_problem(layout, expected);
                if (!problem.empty()) throw protocol::ModelError(problem);
            }
            f.layout = layout.layout;
            f.format = layout.format;
            f.quantized_bytes = layout.quantized_bytes;
        } catch (const protocol::Error& e) {
            throw protocol::Error(std::string(flag) + " " + utf8_for_display(e.what()), e.exit_code());
        } catch (const std::exception& e) {
            throw protocol::ModelError(std::string(flag) + " " + shown + ": " + utf8_for_display(e.what()));
        }
        if (hash) {
            const auto known = hashes.find(f.path);
            f.sha256 =
                known != hashes.end() ? known->second : (hashes[f.path] = strategies::file_sha256(f.path));
        }
        out.push_back(std::move(f));
    }
    return out;
}

}  // namespace dp::launcher
