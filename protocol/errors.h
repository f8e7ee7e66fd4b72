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

// A flag, environment variable or config entry is wrong. The message names it and what is accepted.
class UsageError : public Error {
  public:
    explicit UsageError(const std::string& what) : Error(what, kExitUsage) {}
};

// A file the user supplied (prompt file, request) has bad contents.
class InputDataError : public Error {
  public:
    explicit InputDataError(const std::string& what) : Error(what, kExitInputData) {}
};

// A model folder, weights file or config the user supplied is missing, corrupt, inconsistent or
// unsupported. The message names the file, and the tensor or key when there is one.
class ModelError : public Error {
  public:
    explicit ModelError(const std::string& what) : Error(what, kExitInputData) {}
};

class IoError : public Error {
  public:
    explicit IoError(const std::string& what) : Error(what, kExitIo) {}
};

class SystemError : public Error {
  public:
    explicit SystemError(const std::string& what) : Error(what, kExitSystem) {}
};

// A collective failed or timed out. The message names the collective, the group and the timeout.
// After it the group's order is broken: the rank must stop calling collectives and exit.
class CommunicationError : public Error {
  public:
    explicit CommunicationError(const std::string& what) : Error(what, kExitCommunication) {}
};

// A broken promise inside our own code (a bug), never the user's input.
class InternalError : public Error {
  public:
    explicit InternalError(const std::string& what) : Error(what, kExitInternal) {}
};

}  // namespace dp::protocol
