#include "runtime/io/config_json.h"

#include <fstream>
#include <sstream>

#include "runtime/io/config_file.h"
#include "runtime/io/errors.h"
#include "strategies/config_file.h"
#include "strategies/model_files.h"

namespace dp::runtime {

ConfigJson::ConfigJson(const std::string& text, std::string path)
    : json_(strategies::parse_config_json(text, path)), path_(std::move(path)) {
    if (!json_.is_object()) throw ModelError(path_ + ": expected a JSON object");
}

std::string read_config_text(const std::string& path) {
    if (!strategies::model_file_exists(path)) throw ModelError(path + ": cannot read (missing config file?)");
    return strategies::read_model_file(path);
}

ConfigJson ConfigJson::from_file(const std::string& path) { return ConfigJson(read_config_text(path), path); }

void ConfigJson::require_class(const char* what, const char* supported) const {
    const std::string cls = string("_class_name", supported);
    if (cls != supported)
        fail("_class_name", "'" + cls + "' is not supported (the supported " + std::string(what) +
                                " class: " + supported + ")");
}

bool ConfigJson::has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }

void ConfigJson::fail(const char* key, const std::string& why) const {
    throw ModelError(path_ + ": '" + key + "' " + why);
}

int64_t ConfigJson::integer(const char* key, int64_t fallback, int64_t lo, int64_t hi) const {
    int64_t v = fallback;
    if (has(key)) {
        if (!json_[key].is_number_integer())
            fail(key, "must be an integer, not " + json_[key].dump().substr(0, 40));
        v = json_[key].get<int64_t>();
    }
    if (v < lo || v > hi)
        fail(key,
             "is " + std::to_string(v) + "; accepted: " + std::to_string(lo) + " to " + std::to_string(hi));
    return v;
}

double ConfigJson::number(const char* key, double fallback, double lo, double hi) const {
    double v = fallback;
    if (has(key)) {
        if (!json_[key].is_number()) fail(key, "must be a number, not " + json_[key].dump().substr(0, 40));
        v = json_[key].get<double>();
    }
    if (!(v >= lo && v <= hi))
        fail(key,
             "is " + std::to_string(v) + "; accepted: " + std::to_string(lo) + " to " + std::to_string(hi));
    return v;
}

bool ConfigJson::boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_boolean()) fail(key, "must be true or false");
    return json_[key].get<bool>();
}

std::string ConfigJson::string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_string()) fail(key, "must be a string");
    return json_[key].get<std::string>();
}

}  // namespace dp::runtime
