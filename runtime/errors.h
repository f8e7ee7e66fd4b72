#pragma once
// Errors of the worker side. They carry the same documented exit codes as the launcher's
// (README "Exit codes"); dp-worker's main maps them. Light header: no LibTorch.
//
// The launcher keeps its own hierarchy (launcher/errors.h) because runtime/ must not link
// launcher/; the codes are the contract they share.

#include <stdexcept>
#include <string>

namespace dp::runtime {

class Error : public std::runtime_error {
  public:
    Error(const std::string& what, int exit_code) : std::runtime_error(what), exit_code_(exit_code) {}
    int exit_code() const { return exit_code_; }

  private:
    int exit_code_;
};

// A model folder, weights file or config the user supplied is missing, corrupt or inconsistent.
// The message names the file, and the tensor or key when there is one.
class ModelError : public Error {
  public:
    explicit ModelError(const std::string& what) : Error(what, 65) {}
};

}  // namespace dp::runtime
