#pragma once
// The terminal dp-launch writes to. At most one "live line" (the job's progress bar, or a rank's
// latest carriage-return update) stays last on the screen and is redrawn in place, erasing to the
// end of the line; every other line is written above it: the live line is erased first and
// redrawn after. Off a terminal writes are plain and nothing is live. One thread only.

#include <unistd.h>

#include <string>
#include <string_view>

#include "launcher/unique_fd.h"

namespace dp::launcher {

class Terminal {
  public:
    // The process's stdout and stderr.
    static Terminal& instance() {
        static Terminal terminal;
        return terminal;
    }

    bool is_tty(int fd) const { return fd == STDOUT_FILENO ? out_tty_ : fd == STDERR_FILENO && err_tty_; }

    // Writes `text` (whole lines) to fd, above the live line. False when the write failed (EPIPE).
    bool write(int fd, std::string_view text) {
        if (text.empty()) return true;
        const bool around = owner_ && is_tty(fd);
        if (around) erase();
        const bool ok = write_all(fd, text.data(), text.size());
        if (around) redraw();
        return ok;
    }

    // write() for a line of dp-launch's own (not a rank's): also appended to the launcher's log
    // (--log-dir DIR/launcher.log) when there is one.
    bool write_own(int fd, std::string_view text) {
        if (log_) write_all(log_.get(), text.data(), text.size());
        return write(fd, text);
    }
    // "dp-launch: LINE", a line of dp-launch's own on stderr.
    void say(std::string_view line) { write_own(STDERR_FILENO, "dp-launch: " + std::string(line) + "\n"); }
    // Where write_own's lines also go from now on (an O_APPEND file).
    void set_log(UniqueFd log) { log_ = std::move(log); }

    // Makes `text` (one line without '\r' or '\n') the live line of `owner` on fd, a terminal.
    void show(int fd, const void* owner, std::string_view text) {
        if (!is_tty(fd)) return;
        if (owner_ && live_fd_ != fd) erase();
        owner_ = owner;
        live_fd_ = fd;
        live_.assign(text);
        redraw();
    }

    // Ends `owner`'s live line, if it has it: `keep` leaves it on the screen as a line of its own,
    // else it is erased.
    void end(const void* owner, bool keep) {
        if (!owner_ || owner_ != owner) return;
        if (keep) {
            write_all(live_fd_, "\n", 1);
        } else {
            erase();
        }
        owner_ = nullptr;
        live_.clear();
    }

    const void* owner() const { return owner_; }

  private:
    Terminal() : out_tty_(isatty(STDOUT_FILENO) == 1), err_tty_(isatty(STDERR_FILENO) == 1) {}

    void erase() const { write_all(live_fd_, "\r\x1b[K", 4); }
    void redraw() const {
        const std::string text = "\r" + live_ + "\x1b[K";
        write_all(live_fd_, text.data(), text.size());
    }

    bool out_tty_, err_tty_;
    int live_fd_ = -1;
    const void* owner_ = nullptr;
    std::string live_;
    UniqueFd log_;
};

}  // namespace dp::launcher
