#include "protocol/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "protocol/errors.h"
#include "protocol/write_all.h"

namespace dp::protocol {
namespace {

// "what: strerror(errno)".
std::string with_errno(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

std::string atomic_temp_path(const std::string& path) { return path + ".tmp." + std::to_string(getpid()); }

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(atomic_temp_path(path_)) {
    // A new file, whatever was at the name: a leftover of a killed writer with this PID is removed,
    // and O_EXCL neither follows a symbolic link put there nor opens a FIFO (which would block).
    ::unlink(tmp_.c_str());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(with_errno("cannot create " + tmp_));
    buffer_.reserve(kBufferBytes);
}

AtomicFile::~AtomicFile() {
    if (fd_ < 0) return;
    ::close(fd_);
    std::remove(tmp_.c_str());
}

void AtomicFile::write(std::string_view text) {
    if (buffer_.size() + text.size() > kBufferBytes) flush();
    if (text.size() >= kBufferBytes) {
        if (!write_all(fd_, text.data(), text.size())) fail(with_errno("cannot write " + tmp_));
        return;
    }
    buffer_.append(text);
}

void AtomicFile::flush() {
    if (!buffer_.empty() && !write_all(fd_, buffer_.data(), buffer_.size()))
        fail(with_errno("cannot write " + tmp_));
    buffer_.clear();
}

void AtomicFile::fail(const std::string& what) {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    std::remove(tmp_.c_str());
    throw IoError(what);
}

void AtomicFile::commit() {
    flush();
    // EINVAL: a file system that cannot sync (it keeps nothing across a crash to begin with).
    if (::fsync(fd_) != 0 && errno != EINVAL) fail(with_errno("cannot write " + tmp_));
    if (::close(std::exchange(fd_, -1)) != 0) fail(with_errno("cannot write " + tmp_));
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
        fail(with_errno("cannot rename " + tmp_ + " to " + path_));
}

void write_file_atomically(const std::string& path, std::string_view contents) {
    AtomicFile file(path);
    file.write(contents);
    file.commit();
}

}  // namespace dp::protocol
