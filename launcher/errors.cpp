#include "launcher/errors.h"

#include <cerrno>
#include <cstring>

#include "strategies/model_files.h"

namespace dp::launcher {

std::string errno_message(const std::string& what) {
    return what + ": " + (errno == ELOOP ? strategies::kSymlinkLoop : std::strerror(errno));
}

}  // namespace dp::launcher
