#include "launcher/adapter_files.h"

#include <climits>
#include <cmath>
#include <cstdlib>

#include "launcher/prompt_file.h"
#include "protocol/errors.h"
#include "strategies/sha256.h"

namespace dp::launcher {

AdapterFiles::AdapterFiles(const strategies::ModelInfo& model, std::string variant)
    : model_(&model), variant_(std::move(variant)) {}

const AdapterFiles::File& AdapterFiles::file(const std::string& path) {
    const auto it = files_.find(path);
    if (it != files_.end()) return it->second;
    File f;
    const std::string shown = utf8_for_display(path.substr(0, 300));
    try {
        if (!tensors_)
            tensors_ = std::make_shared<const strategies::ModelTensors>(
                strategies::adapter_targets(model_->dir, *model_->spec, variant_));
        char resolved[PATH_MAX];
        f.absolute = ::realpath(path.c_str(), resolved) ? std::string(resolved) : path;
        f.layout = strategies::read_lora_layout(f.absolute, *model_->spec, *tensors_);
        strategies::check_lora_values(f.layout);  // NaN or infinity: every image would be NaN
        f.sha256 = strategies::file_sha256(f.absolute);
    } catch (const protocol::Error& e) {
        // Messages name the path as given; a file's own text is shown safely.
        f.problem = utf8_for_display(e.what());
        f.exit_code = e.exit_code();
    } catch (const std::exception& e) {
        f.problem = shown + ": " + utf8_for_display(e.what());
        f.exit_code = protocol::kExitInputData;
    }
    return files_.emplace(path, std::move(f)).first->second;
}

std::string AdapterFiles::problem(const protocol::Adapters& adapters) {
    for (const protocol::Adapter& a : adapters) {
        if (!std::isfinite(a.scale))
            return "the scale of " + utf8_for_display(a.path) + " is not a finite number";
        const File& f = file(a.path);
        if (!f.problem.empty()) return f.problem;
        if (!a.sha256.empty() && a.sha256 != f.sha256)
            return utf8_for_display(a.path) + ": its SHA-256 is " + f.sha256 + ", not the " + a.sha256 +
                   " the line gives (the file changed?)";
    }
    return {};
}

void AdapterFiles::check(const protocol::Adapters& adapters, const std::string& source) {
    for (const protocol::Adapter& a : adapters) {
        const std::string why = problem({a});
        if (why.empty()) continue;
        const File& f = file(a.path);
        throw protocol::Error(source + " " + why, f.exit_code ? f.exit_code : protocol::kExitInputData);
    }
}

void AdapterFiles::resolve(protocol::CallValues& values) {
    const protocol::CallValue* v = values.find("lora");
    if (!v) return;
    protocol::Adapters adapters = std::get<protocol::Adapters>(*v);
    for (protocol::Adapter& a : adapters) {
        const File& f = file(a.path);
        a.path = f.absolute;
        a.sha256 = f.sha256;
    }
    values.set("lora", std::move(adapters));
}

const strategies::LoraLayout& AdapterFiles::layout(const std::string& path) { return file(path).layout; }

}  // namespace dp::launcher
