// dp-test-worker MODE [ARGS...]: a rank with scripted behaviour for the launcher's integration
// tests. Every mode reads RANK from the environment the launcher set.
//
//   env DIR                 write the rank's environment to DIR/rank_<RANK>.env and exit 0
//   fail RANK CODE DIR      rank RANK exits CODE after 200 ms, stamping DIR/exit_<RANK>; the other
//                           ranks stamp DIR/term_<rank> when SIGTERM arrives, then exit 143
//   ignore-term DIR         ignore SIGTERM and SIGINT, stamp DIR/ready_<RANK>, then wait forever
//   tree DIR                start a child in the same process group, write both pids to
//                           DIR/pids_<RANK>, then wait forever
//   fail-first CODE         rank 1 exits CODE on the first attempt (TORCHELASTIC_RESTART_COUNT=0)
//   lines N                 print N long lines, each written in two halves with a pause between
//   bigline BYTES           print BYTES of 'x' with no newline, then a final line "done"
//   signals DIR             log each SIGUSR1/SIGUSR2/SIGHUP/SIGQUIT to DIR/signals_<RANK>; exit on
//                           SIGTERM/SIGINT
//   sleep SECONDS           sleep, then exit 0
//   stderr-exit CODE        print 15 numbered lines to stderr, then exit CODE
//   sigbus DIR              map a file in DIR, truncate it and read past its new end: killed by
//                           SIGBUS, as a rank whose mapped file is truncated under it
//   daemon DIR exit|wait    start a daemon (fork, setsid, fork: it leaves the rank's process group
//                           and session) and a child in the rank's group, write their pids to
//                           DIR/daemon_<RANK>, then exit 0 or wait forever
//   --job PATH              a stand-in for dp-worker in the main job: on its status channel a
//                           start event and heartbeats (loading, then DP_TEST_FAKE_PROMPTS prompts
//                           of DP_TEST_FAKE_STEPS steps, DP_TEST_FAKE_STEP_MS apart, then waiting
//                           for DP_TEST_FAKE_WAIT_S, or R:S for rank R only), then exit 0.
//                           DP_TEST_FAKE_STOP=RANK:STEP: that rank stops itself with SIGSTOP after
//                           its STEP-th step (0: once it is waiting). DP_TEST_FAKE_STEP_MS=R:MS
//                           sets rank R's step time only.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

extern char** environ;

namespace {

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : fallback;
}

long long now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

std::string g_dir;
int g_rank = -1;

// Writes a file whole under a temporary name and renames it into place, so a test that waits for the
// file to exist never reads it empty or half written. Async-signal-safe: open, write, close, rename.
void publish(const char* path, const char* data, size_t size) {
    char tmp[4200];
    std::snprintf(tmp, sizeof(tmp), "%s.partial", path);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    const bool written = write(fd, data, size) == static_cast<ssize_t>(size);
    close(fd);
    if (written) rename(tmp, path);
}

void publish(const std::string& path, const std::string& text) {
    publish(path.c_str(), text.data(), text.size());
}

void stamp(const char* what) {
    char path[4096];
    std::snprintf(path, sizeof(path), "%s/%s_%d", g_dir.c_str(), what, g_rank);
    char buf[32];
    const int n = std::snprintf(buf, sizeof(buf), "%lld\n", now_ns());
    publish(path, buf, static_cast<size_t>(n));
}

void on_term(int) {
    stamp("term");
    _exit(143);
}

void on_logged_signal(int sig) {
    char path[4096];
    std::snprintf(path, sizeof(path), "%s/signals_%d", g_dir.c_str(), g_rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    char buf[32];
    int n = std::snprintf(buf, sizeof(buf), "%d\n", sig);
    if (write(fd, buf, static_cast<size_t>(n)) < 0) {
    }
    close(fd);
    if (sig == SIGTERM || sig == SIGINT) _exit(128 + sig);
}

[[noreturn]] void wait_forever() {
    for (int i = 0; i < 600; ++i) sleep(1);  // bounded: never outlive a broken test by more than 10 min
    std::exit(99);
}

void write_all(int fd, const char* p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return;
        p += w;
        n -= static_cast<size_t>(w);
    }
}

// sigbus DIR: a file of its own mapped, truncated, then read where its end was: the kernel's
// SIGBUS, with the kernel's own action whatever a sanitizer build installed (AddressSanitizer
// reports a SIGBUS itself and exits 1). Returns 3 when the file cannot be set up.
int read_past_a_truncated_mapping(const std::string& dir) {
    const std::string path = dir + "/mapped_" + std::to_string(g_rank);
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const long page = sysconf(_SC_PAGESIZE);
    if (fd < 0 || ftruncate(fd, 2 * page) != 0) return 3;
    void* map = mmap(nullptr, static_cast<size_t>(2 * page), PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED || ftruncate(fd, 0) != 0) return 3;
    signal(SIGBUS, SIG_DFL);
    return static_cast<volatile const char*>(map)[page];  // never returns
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: dp-test-worker MODE [ARGS...]\n");
        return 2;
    }
    const std::string mode = argv[1];
    g_rank = env_int("RANK", -1);
    auto arg = [&](int i) -> std::string {
        if (i >= argc) {
            std::fprintf(stderr, "dp-test-worker %s: missing argument %d\n", mode.c_str(), i - 1);
            std::exit(2);
        }
        return argv[i];
    };

    if (mode == "env") {
        g_dir = arg(2);
        std::string text;
        for (char** e = environ; *e; ++e) text += std::string(*e) + "\n";
        publish(g_dir + "/rank_" + std::to_string(g_rank) + ".env", text);
        return 0;
    }
    if (mode == "fail") {
        const int failing = std::atoi(arg(2).c_str());
        const int code = std::atoi(arg(3).c_str());
        g_dir = arg(4);
        if (g_rank == failing) {
            usleep(200 * 1000);
            std::fprintf(stderr, "rank %d: something went wrong\n", g_rank);
            std::fflush(stderr);
            stamp("exit");
            return code;
        }
        signal(SIGTERM, on_term);
        wait_forever();
    }
    if (mode == "ignore-term") {
        g_dir = arg(2);
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        stamp("ready");
        wait_forever();
    }
    if (mode == "tree") {
        g_dir = arg(2);
        pid_t child = fork();
        if (child == 0) wait_forever();
        publish(g_dir + "/pids_" + std::to_string(g_rank),
                std::to_string(getpid()) + " " + std::to_string(child) + "\n");
        wait_forever();
    }
    if (mode == "fail-first") {
        if (env_int("TORCHELASTIC_RESTART_COUNT", -1) == 0 && g_rank == 1) {
            std::fprintf(stderr, "rank 1: failing on the first attempt\n");
            return std::atoi(arg(2).c_str());
        }
        std::printf("rank %d ok on attempt %d\n", g_rank, env_int("TORCHELASTIC_RESTART_COUNT", -1));
        return 0;
    }
    if (mode == "lines") {
        const int n = std::atoi(arg(2).c_str());
        for (int i = 0; i < n; ++i) {
            char line[512];
            int len = std::snprintf(line, sizeof(line), "rank=%d line=%d %0300d end\n", g_rank, i, i);
            write_all(1, line, static_cast<size_t>(len / 2));
            if (i % 16 == 0) usleep(1000);
            write_all(1, line + len / 2, static_cast<size_t>(len - len / 2));
        }
        return 0;
    }
    if (mode == "bigline") {
        long long remaining = std::atoll(arg(2).c_str());
        static char chunk[1 << 16];
        std::memset(chunk, 'x', sizeof(chunk));
        while (remaining > 0) {
            size_t n = static_cast<size_t>(std::min<long long>(remaining, sizeof(chunk)));
            write_all(1, chunk, n);
            remaining -= static_cast<long long>(n);
        }
        write_all(1, "\ndone\n", 6);
        return 0;
    }
    if (mode == "signals") {
        g_dir = arg(2);
        // Each signal is logged whole before the next is handled: with signal(), a SIGUSR2 that
        // arrives while SIGUSR1's handler runs (slow under a sanitizer) interrupts it and is
        // logged first.
        constexpr int kLogged[] = {SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT, SIGTERM, SIGINT};
        struct sigaction action {};
        action.sa_handler = on_logged_signal;
        sigemptyset(&action.sa_mask);
        for (int sig : kLogged) sigaddset(&action.sa_mask, sig);
        for (int sig : kLogged) sigaction(sig, &action, nullptr);
        stamp("ready");
        wait_forever();
    }
    if (mode == "sleep") {
        usleep(static_cast<useconds_t>(std::atof(arg(2).c_str()) * 1e6));
        return 0;
    }
    if (mode == "daemon") {
        g_dir = arg(2);
        const bool then_exit = arg(3) == "exit";
        int pids[2];
        if (pipe(pids) != 0) return 1;
        const pid_t middle = fork();
        if (middle == 0) {
            setsid();
            const pid_t daemon = fork();
            if (daemon == 0) {
                for (int fd = 0; fd <= 2; ++fd) close(fd);  // a daemon holds none of the rank's pipes
                wait_forever();
            }
            write_all(pids[1], reinterpret_cast<const char*>(&daemon), sizeof(daemon));
            _exit(0);
        }
        pid_t daemon = -1;
        if (read(pids[0], &daemon, sizeof(daemon)) != sizeof(daemon)) return 1;
        waitpid(middle, nullptr, 0);
        const pid_t child = fork();
        if (child == 0) wait_forever();
        publish(g_dir + "/daemon_" + std::to_string(g_rank),
                std::to_string(daemon) + " " + std::to_string(child) + "\n");
        if (then_exit) return 0;
        wait_forever();
    }
    if (mode == "--job") {
        const int fd = env_int("DP_STATUS_FD", -1);
        auto send = [&](const std::string& line) {
            if (fd >= 0) write_all(fd, (line + "\n").data(), line.size() + 1);
        };
        const int prompts = env_int("DP_TEST_FAKE_PROMPTS", 2), steps = env_int("DP_TEST_FAKE_STEPS", 4);
        // "VALUE", or "RANK:VALUE" for that rank only (the others get `fallback`).
        const auto for_rank = [](const char* name, double fallback) {
            const char* v = std::getenv(name);
            if (!v || !*v) return fallback;
            int r = -1;
            double value = 0;
            if (std::sscanf(v, "%d:%lf", &r, &value) == 2) return r == g_rank ? value : fallback;
            return std::atof(v);
        };
        const int step_ms = static_cast<int>(for_rank("DP_TEST_FAKE_STEP_MS", 20));
        int stop_rank = -1, stop_step = -1;
        if (const char* v = std::getenv("DP_TEST_FAKE_STOP")) std::sscanf(v, "%d:%d", &stop_rank, &stop_step);
        const std::string rank = std::to_string(g_rank);
        send("{\"event\":\"start\",\"rank\":" + rank + ",\"device\":\"cpu\",\"first\":0,\"count\":0}");
        send("{\"event\":\"heartbeat\",\"rank\":" + rank +
             ",\"phase\":\"loading\",\"index\":-1,\"step\":0,\"steps\":0}");
        int done = 0;
        for (int p = 0; p < prompts; ++p) {
            for (int k = 0; k <= steps; ++k) {
                if (k > 0) usleep(static_cast<useconds_t>(step_ms) * 1000);
                send("{\"event\":\"heartbeat\",\"rank\":" + rank +
                     ",\"phase\":\"generating\",\"index\":" + std::to_string(p) +
                     ",\"step\":" + std::to_string(k) + ",\"steps\":" + std::to_string(steps) + "}");
                if (k > 0 && g_rank == stop_rank && ++done == stop_step) raise(SIGSTOP);
            }
        }
        send("{\"event\":\"heartbeat\",\"rank\":" + rank +
             ",\"phase\":\"waiting\",\"index\":-1,\"step\":0,\"steps\":0}");
        if (g_rank == stop_rank && stop_step == 0) raise(SIGSTOP);
        usleep(static_cast<useconds_t>(for_rank("DP_TEST_FAKE_WAIT_S", 0) * 1e6));
        return 0;
    }
    if (mode == "stderr-exit") {
        for (int i = 1; i <= 15; ++i) std::fprintf(stderr, "stderr line %d\n", i);
        return std::atoi(arg(2).c_str());
    }
    if (mode == "sigbus") return read_past_a_truncated_mapping(arg(2));
    std::fprintf(stderr, "dp-test-worker: unknown mode '%s'\n", mode.c_str());
    return 2;
}
