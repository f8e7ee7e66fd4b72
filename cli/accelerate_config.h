#pragma once
// accelerate's YAML config file (what `accelerate config` writes) read as dp-launch option settings:
// its keys mapped to dp-launch's, the rest listed as ignored. Pure: reads a string, never prints.

#include <functional>
#include <string>
#include <vector>

namespace dp::cli {

// One setting from the file: a dp-launch option key, its text, and "FILE:LINE: key" for errors.
struct ConfigEntry {
    std::string key;
    std::string text;
    std::string source;
};

struct AccelerateConfig {
    std::vector<ConfigEntry> entries;
    std::vector<std::string> ignored;  // the file's keys with no meaning for dp-launch, in file order
};

// True when `path` ends in .yaml/.yml, or does not end in .json and `text`'s first non-space
// character is not '{'.
bool is_yaml_config(const std::string& path, const std::string& text);

// True when this dp-launch was built with yaml-cpp (DP_WITH_YAML).
bool yaml_config_supported();

// `dp_key` maps a key that is not accelerate's to a dp-launch option key, or "" when there is none.
// Throws launcher::UsageError naming FILE:LINE, the key and what is accepted for a wrong type or
// value, a refused distributed_type or compute_environment, a file that is not a YAML mapping or is
// nested too deep, and, without yaml-cpp, for any file.
AccelerateConfig parse_accelerate_config(const std::string& text, const std::string& path,
                                         const std::function<std::string(const std::string&)>& dp_key);

}  // namespace dp::cli
