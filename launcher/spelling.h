#pragma once
// "Did you mean": the known name closest to a mistyped one (a flag, a config key, a prompt line's
// key, a choice), as git and cargo suggest a command. Pure.

#include <string>
#include <string_view>
#include <vector>

namespace dp::launcher {

// The edit distance between `a` and `b`: insertions, deletions, substitutions and swaps of two
// neighbouring characters (optimal string alignment), after '_' is read as '-' and letters as
// lower case, so that --num_process and --Num-Processes are near --num-processes.
std::size_t spelling_distance(std::string_view a, std::string_view b);

// The names of `known` that `given` was probably meant to be: those at the smallest distance, if
// it is at most a third of the name's length (at least 1, at most 3); else the names `given`
// begins (at least 4 characters of it), as argparse's abbreviations. Empty when none is close, or
// when `given` is one of them exactly (a name that differs only in case or '_' is suggested).
std::vector<std::string> closest_names(std::string_view given, const std::vector<std::string>& known);

// " (did you mean 'x'?)", " (did you mean 'x' or 'y'?)" for closest_names, quoted by `quote`
// ("'" for keys and values, "" for flags); empty when there is none.
std::string did_you_mean(std::string_view given, const std::vector<std::string>& known,
                         const std::string& quote = "'");

}  // namespace dp::launcher
