#include "strategies/model_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "protocol/errors.h"

namespace dp::strategies {

int open_model_file(const std::string& path) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw protocol::ModelError(path + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const bool dir = S_ISDIR(st.st_mode);
        ::close(fd);
        throw protocol::ModelError(path + ": not a regular file (" +
                                   (dir ? std::string("a folder") : std::string("a FIFO, socket or device")) +
                                   "); a model folder holds plain files");
    }
    const int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

std::string read_model_file(const std::string& path, std::size_t max_bytes) {
    const int fd = open_model_file(path);
    std::string out;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::close(fd);
            throw protocol::ModelError(path + ": cannot read (" + std::strerror(err) + ")");
        }
        if (n == 0) break;
        out.append(buf, static_cast<std::size_t>(n));
        if (out.size() > max_bytes) {
            ::close(fd);
            throw protocol::ModelError(path + ": larger than " + std::to_string(max_bytes >> 20) +
                                       " MiB; is it the right file?");
        }
    }
    ::close(fd);
    return out;
}

bool model_file_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

}  // namespace dp::strategies
