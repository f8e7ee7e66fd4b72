#pragma once
// torchrun's and accelerate launch's flags that dp-launch does not take, each answered with the
// dp-launch way to do the same, and "did you mean" for any other flag dp-launch does not know.
// Pure: reads argv, never prints.

#include <string>
#include <vector>

namespace dp::cli {

// A foreign flag (or a family of them: `prefix`) and what to do instead.
struct ForeignFlag {
    std::vector<const char*> flags;  // in the '-' spelling; '_' for '-' is the same flag
    bool prefix;                     // every flag that begins with one of `flags`
    const char* instead;
};

// Every refused torchrun and accelerate launch flag (torchrun of PyTorch 2.x, accelerate 1.x).
const std::vector<ForeignFlag>& foreign_flags();

// The answer for `name` ("--use_fsdp", without "=VALUE"): "--use_fsdp is not a dp-launch option:
// ..."; empty when it is no foreign flag.
std::string foreign_flag_usage(const std::string& name);

// The answer for argv before "--" when it holds a foreign flag or starts with one of accelerate's
// subcommands (config, launch, test, ...); empty when it does not.
std::string foreign_usage(const std::vector<std::string>& options);

// "--num-proceses is not a dp-launch option (did you mean --num-processes?)" for a flag that is
// none of `known` (every flag of the program, with its dashes); the suggestion is left out when
// no known flag is close.
std::string unknown_flag_usage(const std::string& flag, const std::vector<std::string>& known);

}  // namespace dp::cli
