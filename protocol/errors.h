#pragma once
// The one list of exit codes and the one error hierarchy of dp-launch and dp-worker. Library code
// throws; each program's main maps the error to its exit code, which also says whether running
// the same thing again may succeed (README "Exit codes"). std only: both sides include it.

#include <stdexcept>
#include <string>

namespace dp::protocol {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;     // main job: some prompts failed or were not run
inline constexpr int kExitInternal = 1;    // a bug in dp-launch or dp-worker: please report it
inline constexpr int kExitUsage = 2;       // a flag, DP_* variable or config entry is wrong
inline constexpr int kExitInputData = 65;  // sysexits EX_DATAERR: a prompt file or model is bad
inline constexpr int kExitNoInput = 66;    // sysexits EX_NOINPUT: the prompt file cannot be read
inline constexpr int kExitSystem = 71;     // sysexits EX_OSERR: fork, pipe, signalfd, socket failed
inline constexpr int kExitIo = 74;         // sysexits EX_IOERR: a file could not be written
// sysexits EX_TEMPFAIL: a collective failed or timed out (another rank died, the network failed);
// running the job again may succeed.
inline constexpr int kExitCommunication = 75;

class Error : public std::runtime_error {
  public:
    Error(const std::string& what, int exit_code) : std::runtime_error(what), exit_code_(exit_code) {}
    int exit_code() const { return exit_code_; }

  private:
    int exit_code_;
};

// One kind of error: its exit code, and a type of its own to catch it by (the tag).
template <int kCode, typename Tag>
class ErrorOf : public Error {
  public:
    explicit ErrorOf(const std::string& what) : Error(what, kCode) {}
};

// A flag, environment variable or config entry is wrong. The message names it and what is accepted.
using UsageError = ErrorOf<kExitUsage, struct UsageTag>;
// A file the user supplied (prompt file, request) has bad contents.
using InputDataError = ErrorOf<kExitInputData, struct InputDataTag>;
// A model folder, weights file or config the user supplied is missing, corrupt, inconsistent or
// unsupported. The message names the file, and the tensor or key when there is one.
using ModelError = ErrorOf<kExitInputData, struct ModelTag>;
using IoError = ErrorOf<kExitIo, struct IoTag>;
using SystemError = ErrorOf<kExitSystem, struct SystemTag>;
// A collective failed or timed out. The message names the collective, the group and the timeout.
// After it the group's order is broken: the rank must stop calling collectives and exit.
using CommunicationError = ErrorOf<kExitCommunication, struct CommunicationTag>;
// A broken promise inside our own code (a bug), never the user's input.
using InternalError = ErrorOf<kExitInternal, struct InternalTag>;

}  // namespace dp::protocol
