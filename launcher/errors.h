#pragma once
// The error hierarchy of dp-launch. Library code throws; `main` maps each kind to its exit code.

#include <stdexcept>
#include <string>

namespace dp::launcher {

// Documented exit codes of dp-launch itself (README "Exit codes"). A failing rank's own exit code,
// or 128 + signal, is passed through unchanged.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInputData = 65;  // sysexits EX_DATAERR
inline constexpr int kExitSystem = 71;     // sysexits EX_OSERR: fork, pipe, signalfd failed
inline constexpr int kExitIo = 74;         // sysexits EX_IOERR: a log file could not be written

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

// A file the user supplied has bad contents.
class InputDataError : public Error {
  public:
    explicit InputDataError(const std::string& what) : Error(what, kExitInputData) {}
};

class IoError : public Error {
  public:
    explicit IoError(const std::string& what) : Error(what, kExitIo) {}
};

class SystemError : public Error {
  public:
    explicit SystemError(const std::string& what) : Error(what, kExitSystem) {}
};

// "what: strerror(errno)" for the current errno.
std::string errno_message(const std::string& what);

}  // namespace dp::launcher
