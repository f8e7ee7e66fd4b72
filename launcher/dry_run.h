#pragma once
// --dry-run: each rank's command and variables as shell lines that can be pasted, started by
// nothing.

#include <string>

#include "launcher/launch_spec.h"

namespace dp::launcher {

// What --dry-run prints: one shell line per rank with the variables dp-launch sets.
std::string describe_dry_run(const LaunchSpec& spec);

// POSIX shell quoting, for printing commands that can be pasted.
std::string shell_quote(const std::string& word);

}  // namespace dp::launcher
