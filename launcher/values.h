#pragma once
// Parsers for option values. Each takes the text and the name of where it came from ("--nnodes",
// "DP_NNODES", "dp.json: nnodes") and throws UsageError naming that source and what is accepted.

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/strict_json.h"

namespace dp::launcher {

inline constexpr int kMaxLocalProcesses = 1024;
inline constexpr int kMaxNodes = 65536;

// A whole decimal integer in [lo, hi]; no sign games, no trailing text. `alternatives` ("'auto' or ")
// prefixes what the error says is accepted.
int parse_int(std::string_view text, int lo, int hi, const std::string& source,
              std::string_view alternatives = {});

// A whole decimal number from 0 to 2^64-1.
uint64_t parse_u64(std::string_view text, const std::string& source);

// A decimal number (no exponent) in [lo, hi] (in (lo, hi] with `above_lo`). `unit` ("seconds")
// is named in what the error says is accepted.
double parse_number(std::string_view text, double lo, double hi, const std::string& source,
                    std::string_view unit = {}, bool above_lo = false);

// parse_number from 0 to hi, in seconds.
double parse_seconds(std::string_view text, double hi, const std::string& source);

// The shortest decimal text that reads back as `value`: 7, 1.5, 3600.
std::string number_text(double value);

// One of `choices`, exactly.
std::string parse_choice(std::string_view text, const std::vector<std::string>& choices,
                         const std::string& source);

// true/false, 1/0, yes/no, on/off (any case).
bool parse_bool(std::string_view text, const std::string& source);

// "0,2,3": distinct device indices.
std::vector<int> parse_gpu_ids(std::string_view text, const std::string& source);
// The text parse_gpu_ids reads: "0,2,3".
std::string gpu_ids_text(const std::vector<int>& ids);

// "7,8,9": distinct transformer block indices, each 0 to 100000 (the model's own count is checked
// against it later); the empty text is none.
std::vector<int> parse_block_list(std::string_view text, const std::string& source);
// The text parse_block_list reads: "7,8,9", or empty.
std::string block_list_text(const std::vector<int>& blocks);

// An IPv4 or IPv6 literal (optionally in brackets) or an RFC 1123 host name. Returns it without
// brackets.
std::string parse_host(std::string_view text, const std::string& source);

// "N" or "auto". Auto is the number of visible GPUs (given ids first, then CUDA_VISIBLE_DEVICES,
// then the driver's device list), else 1.
int parse_process_count(std::string_view text, const std::vector<int>& gpu_ids, const std::string& source);

// The strict JSON reader (protocol/strict_json.h), for option values and config files.
using protocol::kMaxJsonDepth;
using protocol::parse_strict_json;

}  // namespace dp::launcher
