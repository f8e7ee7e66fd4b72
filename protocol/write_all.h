#pragma once
// The one loop that writes a whole buffer to a descriptor, for both sides (the launcher's
// terminal, logs and atomic files; safe between fork and exec: ::write only). POSIX only.

#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace dp::protocol {

// Writes all of `size` bytes to `fd`, retrying on EINTR and short writes. False on any other
// error (errno says which).
inline bool write_all(int fd, const char* data, std::size_t size) {
    while (size > 0) {
        const ssize_t n = ::write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        data += n;
        size -= static_cast<std::size_t>(n);
    }
    return true;
}

}  // namespace dp::protocol
