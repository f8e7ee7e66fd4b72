#pragma once
// Note [one config reader]: every component's config.json is read the same way: the file's text
// (a missing file, a FIFO or a device named, never read forever), then the type's from_json_text,
// which checks each key it takes (ConfigJson, config_json.h). A config type derives from
// ConfigFile<itself> for its from_json_file. Light: no JSON header.

#include <string>

namespace dp::runtime {

// The text of the config file at `path`. Throws ModelError "PATH: cannot read (missing config
// file?)" when it is not there.
std::string read_config_text(const std::string& path);

template <typename Config>
struct ConfigFile {
    static Config from_json_file(const std::string& path) {
        return Config::from_json_text(read_config_text(path), path);
    }
};

}  // namespace dp::runtime
