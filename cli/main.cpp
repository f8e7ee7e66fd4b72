// dp-launch: parse, then run. All the work is in cli/ and launcher/.
#include <cstdlib>

#include "cli/command_line.h"

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    return dp::cli::run_command_line(
        dp::cli::parse_command_line(args, [](const char* name) { return std::getenv(name); }));
}
