#pragma once
// One strict JSON reader for both sides (the launcher's config files and prompt lines, every
// safetensors header the launcher and the worker read): nlohmann's parser keeps the last of two
// equal keys without a word, where the safetensors library and a careful reader refuse them.
// std and nlohmann/json.

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace dp::protocol {

// The deepest nesting of arrays and objects parse_strict_json accepts.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as one JSON document into `out`. Returns an empty text when it is valid, else what
// is wrong in one line: not JSON, a number a double cannot hold (1e309), nesting deeper than
// kMaxJsonDepth, or a key given twice in one object (nlohmann's parser would keep the last one).
// Never throws for any input.
std::string parse_strict_json(std::string_view text, nlohmann::json& out);

// Whether `text` names a JSON file rather than something by name: it has a '/' or ends in .json
// (a scheduler's or a preset's file beside the shipped names).
bool names_a_json_file(std::string_view text);
// The bytes of a user's small file (`what`, e.g. "preset file": at most 1 MiB) into `text`: an
// error text naming it, or empty.
std::string read_small_file(const std::string& path, const std::string& what, std::string& text);

}  // namespace dp::protocol
