#include "launcher/rank_output.h"

#include <utility>

#include "launcher/errors.h"
#include "launcher/terminal.h"

namespace dp::launcher {

void RankOutput::setup(std::string prefix, bool shown, OutputSinks* sinks,
                       std::function<void(const std::string&)> say) {
    prefix_ = std::move(prefix);
    shown_ = shown;
    sinks_ = sinks;
    say_ = std::move(say);
}

void RankOutput::restart(UniqueFd out_pipe, UniqueFd err_pipe) {
    out.pipe = std::move(out_pipe);
    err.pipe = std::move(err_pipe);
    for (RankStream* s : {&out, &err}) {
        s->lines = LineSplitter();
        s->update.clear();
    }
    stderr_tail_.clear();
}

void RankOutput::write_log(RankStream& s, std::string_view data) {
    if (s.log && !write_all(s.log.get(), data.data(), data.size())) {
        if (say_) say_(errno_message("cannot write a --log-dir file; that rank's log stops here"));
        s.log.reset();
    }
}

void RankOutput::feed(RankStream& s, std::string_view data) {
    write_log(s, data);
    buffer_.clear();
    if (!shown_) {  // --local-ranks-filter: logged, and kept for a failure report, not shown
        s.lines.feed(data, [&](std::string_view line) { keep_tail(s, line); });
        return;
    }
    if (Terminal::instance().is_tty(s.terminal_fd)) {
        relay_pieces(s, data);
        return;
    }
    s.lines.feed(data, [&](std::string_view line) { add_line(s, line); });
    flush(s);
}

void RankOutput::hide() {
    shown_ = false;
    for (const RankStream* s : {&out, &err}) Terminal::instance().end(s, /*keep=*/false);
}

void RankOutput::finish(RankStream& s) {
    buffer_.clear();
    if (!shown_) {
        s.lines.finish([&](std::string_view line) { keep_tail(s, line); });
    } else if (Terminal::instance().is_tty(s.terminal_fd)) {
        s.lines.finish([&](std::string_view line) { relay_line(s, line); });
        Terminal::instance().end(&s, /*keep=*/true);  // its last carriage-return update stays
    } else {
        s.lines.finish([&](std::string_view line) { add_line(s, line); });
        flush(s);
    }
    s.pipe.reset();
}

void RankOutput::relay_pieces(RankStream& s, std::string_view data) {
    Terminal& terminal = Terminal::instance();
    s.lines.feed_pieces(data, [&](std::string_view piece, char end) {
        if (end != '\r') {
            relay_line(s, piece);
        } else if (!piece.empty()) {
            s.update.assign(piece);
            terminal.show(s.terminal_fd, &s, prefix_ + s.update);
        }
    });
    if (!s.lines.pending().empty())
        terminal.show(s.terminal_fd, &s, prefix_ + std::string(s.lines.pending()));
}

void RankOutput::relay_line(RankStream& s, std::string_view piece) {
    // "text\r\n" ends the line "text".
    const std::string line = piece.empty() && !s.update.empty() ? s.update : std::string(piece);
    s.update.clear();
    keep_tail(s, line);
    Terminal& terminal = Terminal::instance();
    terminal.end(&s, /*keep=*/false);
    bool& open = sinks_->open(s.terminal_fd);
    if (open && !terminal.write(s.terminal_fd, prefix_ + line + "\n")) open = false;
}

void RankOutput::add_line(RankStream& s, std::string_view line) {
    buffer_ += prefix_;
    buffer_.append(line);
    buffer_ += '\n';
    keep_tail(s, line);
}

void RankOutput::keep_tail(RankStream& s, std::string_view line) {
    if (&s != &err) return;
    stderr_tail_.emplace_back(line.substr(0, kTailLineBytes));
    if (stderr_tail_.size() > kTailLines) stderr_tail_.pop_front();
}

void RankOutput::flush(RankStream& s) {
    bool& open = sinks_->open(s.terminal_fd);
    if (open && !Terminal::instance().write(s.terminal_fd, buffer_)) open = false;  // EPIPE
}

}  // namespace dp::launcher
