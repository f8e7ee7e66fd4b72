#pragma once
// The headings --help lists the options under, in the order a user scans them (torchrun's and
// accelerate's launchers group theirs the same way), and which rows each holds: presentation only,
// apart from the rows, which say what an option does.

#include <string>
#include <vector>

namespace dp::cli {

struct OptionGroup {
    std::string heading;            // as --help shows it, e.g. "Parallelism (main job)"
    std::vector<std::string> keys;  // the rows' config keys, e.g. "ulysses"
};

// Every group, in --help's order. A family call argument (protocol/call_arguments.h) not listed
// is under the sampling heading.
const std::vector<OptionGroup>& option_groups();

// The heading of the row `key`; `fallback` (its table's own) when no group holds it.
std::string option_group(const std::string& key, const std::string& fallback);

// The headings of option_groups(), in order.
std::vector<std::string> option_group_headings();

}  // namespace dp::cli
