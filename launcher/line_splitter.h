#pragma once
// Splits a byte stream into whole lines, holding at most `max_line` bytes of an unfinished line.
// A line longer than that is cut into pieces of `max_line` bytes, each delivered as a line of its
// own, so a worker that prints megabytes with no newline cannot grow the launcher's memory.

#include <cstddef>
#include <string>
#include <string_view>

namespace dp::launcher {

inline constexpr std::size_t kDefaultMaxLine = 64 * 1024;

class LineSplitter {
  public:
    explicit LineSplitter(std::size_t max_line = kDefaultMaxLine) : max_line_(max_line ? max_line : 1) {}

    // Calls sink(line) for each line completed by `data`, without its '\n'.
    template <typename Sink>
    void feed(std::string_view data, Sink&& sink) {
        split(data, "\n", [&](std::string_view line, char) { sink(line); });
    }

    // Like feed, for a terminal: a piece also ends at '\r' (a progress bar's redraw), and sink(piece,
    // end) gets the byte that ended it: '\n', '\r', or 0 for a piece cut at max_line bytes.
    template <typename Sink>
    void feed_pieces(std::string_view data, Sink&& sink) {
        split(data, "\r\n", sink);
    }

    // The unfinished line held so far.
    std::string_view pending() const { return pending_; }

    // Delivers an unfinished last line, if any (end of stream).
    template <typename Sink>
    void finish(Sink&& sink) {
        if (!pending_.empty()) emit({}, sink);
    }

    std::size_t pending_bytes() const { return pending_.size(); }

  private:
    // Calls sink(piece, end) for each piece of `data` that ends at one of the bytes `ends` (end: that
    // byte) or fills max_line bytes (end: 0).
    template <typename Sink>
    void split(std::string_view data, const char* ends, Sink&& sink) {
        while (!data.empty()) {
            const std::size_t room = max_line_ - pending_.size();
            // An end right after `room` bytes still ends a piece of exactly max_line bytes.
            const std::size_t end = data.substr(0, room + 1).find_first_of(ends);
            if (end != std::string_view::npos) {
                const char c = data[end];
                emit(data.substr(0, end), [&](std::string_view piece) { sink(piece, c); });
                data.remove_prefix(end + 1);
            } else if (data.size() > room) {
                emit(data.substr(0, room), [&](std::string_view piece) { sink(piece, '\0'); });
                data.remove_prefix(room);
            } else {
                pending_.append(data);
                return;
            }
        }
    }

    template <typename Sink>
    void emit(std::string_view tail, Sink&& sink) {
        if (pending_.empty()) {
            sink(tail);
        } else {
            pending_.append(tail);
            sink(std::string_view(pending_));
            pending_.clear();
        }
    }

    std::size_t max_line_;
    std::string pending_;
};

}  // namespace dp::launcher
