#pragma once
// The one list of exit codes and the one error hierarchy of dp-launch and dp-worker. Library code
// throws; each program's main maps the error to its exit code, which also says whether running
// the same thing again may succeed (README "Exit codes"). std only: both sides include it.

#include <stdexcept>
#include <string>

namespace dp::protocol {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // main job: some prompts failed or were not run
inline constexpr int kExitInternal = 1;  // a bug in dp-launch or dp-worker: please report it
inline constexpr int kExitUsage = 2;     // a flag, DP_* variable or config entry is wrong
inline constexpr int kExitInputData =
    65;  // sysexits EX_DATAERR: an input is there but bad (prompt lines, a model)
inline constexpr int kExitNoInput =
    66;  // sysexits EX_NOINPUT: an input is not there (prompt file, model, weights)
inline constexpr int kExitSystem = 71;  // sysexits EX_OSERR: fork, pipe, signalfd, socket failed
inline constexpr int kExitIo = 74;      // sysexits EX_IOERR: a file could not be written
// sysexits EX_TEMPFAIL: a collective failed or timed out (another rank died, the network failed);
// running the job again may succeed.
inline constexpr int kExitCommunication = 75;
// A rank's command cannot be run, as a shell reports it: not executable, not found.
inline constexpr int kExitNotExecutable = 126;
inline constexpr int kExitNotFound = 127;

// Every exit code dp-launch gives of its own, one per class of cause, with what it means in a few
// words: --help's footer is written from it, and a test holds docs/launcher.md's table to it. A
// failing rank's own code N and 128+signal pass through besides.
struct ExitCodeClass {
    int code;
    const char* meaning;
};
inline constexpr ExitCodeClass kExitCodeClasses[] = {
    {kExitOk, "every rank succeeded (main job: every valid prompt has its image)"},
    {kExitFailure, "main job: some prompts failed or were not run; or an internal error"},
    {kExitUsage, "usage: a bad flag, DP_* variable or config file, or outputs in the way"},
    {kExitInputData, "bad input: invalid prompt lines, a corrupt or inconsistent model"},
    {kExitNoInput,
     "missing input: the prompt file, the model (path, name or hub id), a weights file or an image to edit"},
    {kExitSystem, "the system refused a resource (fork, memory, file descriptors)"},
    {kExitIo, "a file could not be written (logs, images, the manifest)"},
    {kExitCommunication, "retry: a rank hung, the job passed --timeout, or a collective failed"},
    {kExitNotExecutable, "the command is not executable"},
    {kExitNotFound, "the command is not found"},
};

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
