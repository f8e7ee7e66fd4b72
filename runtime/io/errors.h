#pragma once
// The worker side's names for the shared error hierarchy (protocol/errors.h); dp-worker's main
// maps them to the documented exit codes. Light header: no LibTorch.

#include "protocol/errors.h"

namespace dp::runtime {

using protocol::CommunicationError;
using protocol::Error;
using protocol::InternalError;
using protocol::kExitIo;
using protocol::ModelError;

}  // namespace dp::runtime
