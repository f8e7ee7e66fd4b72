#pragma once
// The launcher's names for the shared error hierarchy (protocol/errors.h). Library code throws;
// `main` maps each kind to its exit code.

#include <string>

#include "protocol/errors.h"

namespace dp::launcher {

using protocol::kExitFailure;
using protocol::kExitInputData;
using protocol::kExitInternal;
using protocol::kExitIo;
using protocol::kExitOk;
using protocol::kExitSystem;
using protocol::kExitUsage;

using protocol::Error;
using protocol::InputDataError;
using protocol::IoError;
using protocol::SystemError;
using protocol::UsageError;

// "what: strerror(errno)" for the current errno.
std::string errno_message(const std::string& what);

}  // namespace dp::launcher
