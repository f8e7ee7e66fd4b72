#include "launcher/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include "launcher/errors.h"

namespace dp::launcher {

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(getpid())) {
    fd_.reset(open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd_) throw IoError(errno_message("cannot create " + tmp_));
    buffer_.reserve(kBufferBytes);
}

AtomicFile::~AtomicFile() {
    if (fd_) {
        fd_.reset();
        std::remove(tmp_.c_str());
    }
}

void AtomicFile::write(std::string_view text) {
    if (buffer_.size() + text.size() > kBufferBytes) flush();
    if (text.size() >= kBufferBytes) {
        if (!write_all(fd_.get(), text.data(), text.size())) fail(errno_message("cannot write " + tmp_));
        return;
    }
    buffer_.append(text);
}

void AtomicFile::flush() {
    if (!buffer_.empty() && !write_all(fd_.get(), buffer_.data(), buffer_.size()))
        fail(errno_message("cannot write " + tmp_));
    buffer_.clear();
}

void AtomicFile::fail(const std::string& what) {
    fd_.reset();
    std::remove(tmp_.c_str());
    throw IoError(what);
}

void AtomicFile::commit() {
    flush();
    if (::close(fd_.release()) != 0) fail(errno_message("cannot write " + tmp_));
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        const std::string message = errno_message("cannot rename " + tmp_ + " to " + path_);
        std::remove(tmp_.c_str());
        throw IoError(message);
    }
}

}  // namespace dp::launcher
