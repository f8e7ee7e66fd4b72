#include "launcher/errors.h"

#include <cerrno>
#include <cstring>

namespace dp::launcher {

std::string errno_message(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace dp::launcher
