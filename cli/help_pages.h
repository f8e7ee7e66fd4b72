#pragma once
// What --help says besides the options, page by page: the usage lines, the examples, the notes and
// the exit codes of dp-launch, and each subcommand's usage and the launcher's options it takes.

#include "cli/help_format.h"

namespace dp::cli {

// dp-launch's one-line description, the first line of its --help.
extern const char* const kProgramSummary;

// Sets the pages of dp-launch and of its subcommands env, plan, arguments and compare.
void set_help_pages(HelpFormatter& formatter);

}  // namespace dp::cli
