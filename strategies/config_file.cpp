#include "strategies/config_file.h"

#include "protocol/errors.h"
#include "strategies/model_files.h"

namespace dp::strategies {

nlohmann::json parse_config_json(const std::string& text, const std::string& path) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw protocol::ModelError(path + ": not valid JSON (" + std::string(e.what()).substr(0, 200) + ")");
    }
}

nlohmann::json read_config_json(const std::string& path) {
    if (!model_file_exists(path)) throw protocol::ModelError(path + ": cannot read");
    return parse_config_json(read_model_file(path), path);  // a FIFO or device is refused, not read
}

nlohmann::json read_config_object_if_present(const std::string& path) {
    if (!model_file_exists(path)) return nlohmann::json::object();
    nlohmann::json j = read_config_json(path);
    return j.is_object() ? j : nlohmann::json::object();
}

}  // namespace dp::strategies
