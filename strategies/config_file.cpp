#include "strategies/config_file.h"

#include "protocol/errors.h"
#include "strategies/model_files.h"

namespace dp::strategies {

nlohmann::json read_config_json(const std::string& path) {
    if (!model_file_exists(path)) throw protocol::ModelError(path + ": cannot read");
    const std::string text = read_model_file(path);  // a FIFO or device is refused, not read
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw protocol::ModelError(path + ": not valid JSON (" + std::string(e.what()).substr(0, 120) + ")");
    }
}

nlohmann::json read_config_object_if_present(const std::string& path) {
    if (!model_file_exists(path)) return nlohmann::json::object();
    nlohmann::json j = read_config_json(path);
    return j.is_object() ? j : nlohmann::json::object();
}

}  // namespace dp::strategies
