// dp-launch on a pseudo-terminal: --help at its width; its progress bar and the ranks' carriage-return
// updates are redrawn in place and erased before any other line; and -q prints nothing on success.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "integration/launch_harness.h"

using namespace dp::test;

namespace {

struct PtyRun {
    int exit_code = -1;
    std::string bytes;       // what dp-launch wrote to the terminal, stdout and stderr together
    std::vector<double> at;  // at[i]: when bytes[i] was read (monotonic seconds)
    double exited = 0;
};

// Runs dp-launch with stdin, stdout and stderr on a new pseudo-terminal (output post-processing
// off, so "\n" is not turned into "\r\n") and reads everything it writes until it exits.
// `columns`: the terminal's width, with COLUMNS unset, so that dp-launch has only the terminal's word.
PtyRun run_on_pty(const std::vector<std::string>& args, double timeout_s = 60, unsigned short columns = 0) {
    int master = -1;
    winsize size{};
    size.ws_row = 50;
    size.ws_col = columns;
    const pid_t pid = forkpty(&master, nullptr, nullptr, columns ? &size : nullptr);
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (columns) unsetenv("COLUMNS");
        termios t{};
        if (tcgetattr(STDOUT_FILENO, &t) == 0) {
            t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
            tcsetattr(STDOUT_FILENO, TCSANOW, &t);
        }
        std::vector<char*> argv{const_cast<char*>(launcher_bin())};
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
    }
    PtyRun run;
    const double deadline = monotonic_seconds() + timeout_s;
    int status = 0;
    bool reaped = false, eof = false;
    while (!(reaped && eof)) {
        pollfd p{master, POLLIN, 0};
        if (!eof && poll(&p, 1, 20) > 0) {
            char buf[4096];
            const ssize_t n = read(master, buf, sizeof(buf));
            if (n > 0) {
                run.bytes.append(buf, static_cast<std::size_t>(n));
                run.at.insert(run.at.end(), static_cast<std::size_t>(n), monotonic_seconds());
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            eof = true;  // EIO: every writer of the terminal is gone
        } else if (reaped) {
            eof = true;  // exited, and nothing more to read
        }
        if (!reaped && waitpid(pid, &status, WNOHANG) == pid) {
            reaped = true;
            run.exited = monotonic_seconds();
        }
        if (monotonic_seconds() > deadline) {
            kill(pid, SIGKILL);
            if (!reaped) waitpid(pid, &status, 0);
            close(master);
            FAIL("dp-launch did not exit within " << timeout_s << " s; it wrote: " << run.bytes);
        }
    }
    close(master);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return run;
}

// The lines a terminal shows for `bytes`: "\r" returns to the start of the line, ESC[K erases to
// its end, other bytes overwrite; "\n" ends the line. The last, unfinished line is included.
std::vector<std::string> screen_lines(const std::string& bytes) {
    std::vector<std::string> lines;
    std::string line;
    std::size_t col = 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        const char c = bytes[i];
        if (c == '\n') {
            lines.push_back(line);
            line.clear();
            col = 0;
        } else if (c == '\r') {
            col = 0;
        } else if (c == '\x1b' && bytes.compare(i, 3, "\x1b[K") == 0) {
            line.resize(col);
            i += 2;
        } else {
            if (col < line.size()) {
                line[col] = c;
            } else {
                line.push_back(c);
            }
            ++col;
        }
    }
    if (!line.empty()) lines.push_back(line);
    return lines;
}

std::string shown(const std::vector<std::string>& lines) {
    std::string s;
    for (const std::string& l : lines) s += l + "\n";
    return s;
}

std::string script(const std::string& dir, const std::string& name, const std::string& body) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body;
    chmod(path.c_str(), 0755);
    return path;
}

// A --worker that reports 3 images over 1.8 s on its status channel, with a line on stderr and one
// on stdout between them.
std::string fake_worker(const std::string& dir) {
    const std::string image = R"({"event":"image","rank":0,"index":%s,"file":"p%s.png","sha256":"00","ms":1,)"
                              R"("width":8,"height":8})";
    const std::string worker = script(
        dir, "worker.sh",
        "s() { printf '%s\\n' \"$1\" >&3; }\n"
        "s '{\"event\":\"start\",\"rank\":0,\"device\":\"cpu\",\"first\":0,\"count\":3}'\n"
        "s "
        "'{\"event\":\"heartbeat\",\"rank\":0,\"phase\":\"generating\",\"index\":0,\"step\":1,\"steps\":2}'\n"
        "sleep 0.3\n"
        "img() { printf '" +
            image +
            "\\n' $1 $1 >&3; }\n"
            "img 0; sleep 0.3\n"
            "echo 'a warning from the worker' >&2; sleep 0.3\n"
            "img 1; sleep 0.3\n"
            "echo 'a line on stdout'; sleep 0.3\n"
            "img 2; sleep 0.3\n");
    return worker;
}

}  // namespace

TEST_CASE(
    "on a terminal a rank's carriage-return updates show prefixed as they come, never mixed with "
    "another rank's lines") {
    const std::string dir = make_temp_dir();
    // Rank 0 draws a bar in place; rank 1 prints whole lines meanwhile.
    const std::string prog =
        script(dir, "bar.sh",
               "if [ \"$RANK\" = 0 ]; then\n"
               "  for i in 1 2 3; do printf '\\rstep %s of 3 ......' $i; sleep 0.4; done\n"
               "  printf '\\rbar done\\n'\n"
               "else\n"
               "  sleep 0.2; echo 'rank one line a'; sleep 0.4; echo 'b'\n"
               "fi\n");
    const PtyRun run = run_on_pty({"-n", "2", "--", prog});
    INFO(run.bytes);
    REQUIRE(run.exit_code == 0);
    const std::vector<std::string> lines = screen_lines(run.bytes);
    INFO(shown(lines));
    // Every line the terminal shows is one rank's, prefixed; no bar is glued to another line.
    for (const std::string& l : lines) {
        CHECK_MESSAGE(l.rfind("[rank ", 0) == 0, l);
        CHECK_MESSAGE(l.find("[rank", 1) == std::string::npos, l);
    }
    CHECK(std::count(lines.begin(), lines.end(), "[rank 1] rank one line a") == 1);
    CHECK(std::count(lines.begin(), lines.end(), "[rank 1] b") == 1);
    CHECK(std::count(lines.begin(), lines.end(), "[rank 0] bar done") == 1);
    // The first update arrived while the rank still ran (it runs 1.2 s more), with its prefix.
    const std::size_t first = run.bytes.find("[rank 0] step 1 of 3");
    REQUIRE(first != std::string::npos);
    CHECK(run.at[first] < run.exited - 0.5);
    CHECK(run.bytes.find("[rank 0] step 3 of 3") != std::string::npos);
    // Each update is drawn from the start of the line and erases what a longer one left.
    const std::regex redraw("\r\\[rank 0\\] step \\d of 3 \\.{6}\x1b\\[K");
    CHECK(std::distance(std::sregex_iterator(run.bytes.begin(), run.bytes.end(), redraw),
                        std::sregex_iterator()) >= 3);
}

TEST_CASE(
    "on a terminal the progress bar is erased before a rank's line and erases to the end of the "
    "line on every redraw") {
    const std::string dir = make_temp_dir();
    const std::string worker = fake_worker(dir);
    std::ofstream(dir + "/prompts.txt") << "one\ntwo\nthree\n";
    const std::vector<std::string> args = {"-n", "1",          "--worker",          worker,
                                           "-o", dir + "/out", dir + "/prompts.txt"};
    const PtyRun run = run_on_pty(args);
    INFO(run.bytes);
    CHECK(run.exit_code == 0);
    const std::vector<std::string> lines = screen_lines(run.bytes);
    INFO(shown(lines));
    // The rank's lines stand alone: the bar was erased before them and redrawn after.
    CHECK(std::count(lines.begin(), lines.end(), "[rank 0] a warning from the worker") == 1);
    CHECK(std::count(lines.begin(), lines.end(), "[rank 0] a line on stdout") == 1);
    const std::regex bar(R"(\[#*\s*\] \d/3  [0-9.]+ images/s  ETA \d+ s)");
    int bars = 0;
    for (const std::string& l : lines) {
        if (l.find("images/s  ETA") == std::string::npos) continue;
        ++bars;
        CHECK_MESSAGE(std::regex_match(l, bar), l);  // nothing stale at the end ("ETA 9 ss")
    }
    CHECK(bars == 1);  // one bar, kept when the job ended
    const std::size_t warning = run.bytes.find("[rank 0] a warning");
    REQUIRE(warning != std::string::npos);
    CHECK(run.bytes.compare(warning - 4, 4, "\r\x1b[K") == 0);  // the bar erased right before it
    // Every redraw ends with ESC[K.
    const std::regex drawn("ETA \\d+ s");
    int redraws = 0;
    for (auto it = std::sregex_iterator(run.bytes.begin(), run.bytes.end(), drawn);
         it != std::sregex_iterator(); ++it) {
        ++redraws;
        const std::size_t end = static_cast<std::size_t>(it->position() + it->length());
        CHECK(run.bytes.compare(end, 3, "\x1b[K") == 0);
    }
    CHECK(redraws >= 4);
    // The summary comes after the bar, on a line of its own.
    CHECK(lines.back().rfind("dp-launch: 3 images, 0 failed", 0) == 0);
}

TEST_CASE("-q on a terminal: from dp-launch only the summary, after the rank's lines") {
    const std::string dir = make_temp_dir();
    std::ofstream(dir + "/prompts.txt") << "one\ntwo\nthree\n";
    const PtyRun q =
        run_on_pty({"-n", "1", "-q", "--worker", fake_worker(dir), "-o", dir + "/out", dir + "/prompts.txt"});
    INFO(q.bytes);
    CHECK(q.exit_code == 0);
    const std::string lines = shown(screen_lines(q.bytes));
    CHECK(lines.rfind(
              "[rank 0] a warning from the worker\n[rank 0] a line on stdout\ndp-launch: 3 images, 0 failed",
              0) == 0);
    CHECK(lines.find("ETA") == std::string::npos);  // no progress bar
}

TEST_CASE("-q prints no line of dp-launch's own when the job succeeds, and the failure report when not") {
    LaunchResult ok = run_launch({"-n", "2", "-q", "--", "true"});
    CHECK(ok.exit_code == 0);
    CHECK(ok.out.empty());
    CHECK(ok.err.empty());
    LaunchResult bad = run_launch({"-n", "2", "-q", "--", "sh", "-c", "exit 3"});
    CHECK(bad.exit_code == 3);
    CHECK(bad.err.find("dp-launch: job failed: rank") != std::string::npos);
}

namespace {

// The widest line of `text`, in characters (UTF-8 code points).
std::size_t widest_line(const std::string& text) {
    std::size_t widest = 0;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
        widest = std::max<std::size_t>(widest, std::count_if(line.begin(), line.end(), [](char c) {
                                           return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
                                       }));
    return widest;
}

}  // namespace

TEST_CASE("--help fits the terminal: its width on a terminal, COLUMNS when set, else 80") {
    const std::vector<std::vector<std::string>> pages = {
        {"--help"}, {"env", "--help"}, {"plan", "--help"}, {"arguments", "--help"}, {"compare", "--help"}};
    // Not a terminal: COLUMNS, else 80.
    for (const std::string columns : {"60", "80", "120", "", "wide", "0"}) {
        const std::size_t width = columns == "60" ? 60 : columns == "120" ? 120 : 80;
        for (const std::vector<std::string>& args : pages) {
            CAPTURE(columns);
            CAPTURE(args);
            const LaunchResult r = run_launch(args, {{"COLUMNS", columns}});
            REQUIRE(r.exit_code == 0);
            CHECK(r.err.empty());
            CHECK(widest_line(r.out) <= width);
            if (args.front() == "--help") CHECK(widest_line(r.out) >= width - 10);  // the width is used
        }
    }
    // A terminal: its own width (TIOCGWINSZ).
    for (const unsigned short columns : {72, 100}) {
        CAPTURE(columns);
        const PtyRun run = run_on_pty({"--help"}, 60, columns);
        REQUIRE(run.exit_code == 0);
        CHECK(widest_line(run.bytes) <= columns);
        CHECK(widest_line(run.bytes) >= columns - 10u);
        CHECK(run.bytes.find("Exit codes") != std::string::npos);
    }
}
