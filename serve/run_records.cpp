#include "serve/run_records.h"

#include <cctype>
#include <fstream>

namespace dp::serve {

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<nlohmann::json> run_records(const std::string& run_folder) {
    std::vector<nlohmann::json> records;
    std::ifstream in(run_folder + "/manifest.jsonl", std::ios::binary);
    for (std::string line; std::getline(in, line);) {
        nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (record.is_object()) records.push_back(std::move(record));
    }
    return records;
}

RunCount count_run(const std::string& run_folder) {
    RunCount count;
    for (const nlohmann::json& r : run_records(run_folder)) {
        if (r.value("status", "") == "ok") {
            ++count.ok;
            const auto ms = r.find("ms");
            if (ms != r.end() && ms->is_number()) count.ms += ms->get<double>();
        } else {
            ++count.failed;
        }
    }
    return count;
}

bool is_recorded_image(const std::vector<nlohmann::json>& records, const std::string& name) {
    if (name.empty() || name.size() > 255 || name[0] == '.') return false;
    for (const char c : name)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) return false;
    for (const nlohmann::json& r : records) {
        const auto file = r.find("file");
        if (file != r.end() && file->is_string() && *file == name && r.value("status", "") == "ok")
            return true;
    }
    return false;
}

}  // namespace dp::serve
