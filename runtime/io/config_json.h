#pragma once
// Reading a component's config.json with errors that name the file and key.

#include <nlohmann/json.hpp>
#include <string>

namespace dp::runtime {

class ConfigJson {
  public:
    // Parses `text`; throws ModelError naming `path` when it is not a JSON object.
    ConfigJson(const std::string& text, std::string path);
    static ConfigJson from_file(const std::string& path);

    // The value at `key` (or `fallback` when absent or null), checked to lie in [lo, hi].
    int64_t integer(const char* key, int64_t fallback, int64_t lo, int64_t hi) const;
    double number(const char* key, double fallback, double lo, double hi) const;
    bool boolean(const char* key, bool fallback) const;
    std::string string(const char* key, const std::string& fallback) const;
    bool has(const char* key) const;
    const nlohmann::json& raw() const { return json_; }
    const std::string& path() const { return path_; }
    [[noreturn]] void fail(const char* key, const std::string& why) const;
    // Throws ModelError "PATH: '_class_name' 'NAME' is not supported (the supported WHAT class:
    // CLASS)" unless
    // _class_name is `supported` (or absent: a config of that class).
    void require_class(const char* what, const char* supported) const;

  private:
    nlohmann::json json_;
    std::string path_;
};

}  // namespace dp::runtime
