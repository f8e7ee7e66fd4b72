#include "launcher/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>

#include "launcher/errors.h"
#include "launcher/hang_watch.h"
#include "launcher/line_splitter.h"
#include "launcher/orphan_guard.h"
#include "launcher/port.h"
#include "launcher/process.h"
#include "launcher/rank_env.h"
#include "launcher/rank_output.h"
#include "launcher/start_signals.h"
#include "launcher/system_info.h"
#include "launcher/terminal.h"
#include "protocol/status_events.h"

namespace dp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kStragglerDrainMs = 2000;  // how long to wait for output pipes once every rank exited
// A hang, or the job past --timeout: running it again may succeed (README "Exit codes").
constexpr int kExitRetry = protocol::kExitCommunication;
// How long the other ranks may take to exit on their own after one exits 75 (Note [a lost peer is
// a consequence]).
constexpr std::chrono::milliseconds kSettle{2000};

using Stream = RankStream;

// One rank: what hang detection reads of it (rank, pid, running, the last line heard, the last
// heartbeat), and the rest.
struct Rank : RankLiveness {
    int local_rank = 0;
    bool signalled_by_launcher = false;
    int wait_status = 0;
    Clock::time_point started, ended;
    RankOutput output;  // its stdout and stderr
    Stream status;      // only with a listener
};

// Why dp-launch itself stopped the job.
enum class StopReason { kNone, kHang, kJobTimeout };

// Note [a rank killed by SIGBUS]: a process dies by SIGBUS when a page of a file it mapped cannot
// be read: the file was truncated under it, or the disk failed. dp-worker reports its own mapped
// files by name and exits 74 (Note [files that change under a job], strategies/mapped_files.h);
// a rank that dies by SIGBUS all the same (another program as the rank, a library's mapping) is
// the same failure, so it is reported as such and gives 74 too, not a 135 a scheduler would retry.
int exit_code_of(int wait_status) {
    if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGBUS) return protocol::kExitIo;
    if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
    return kExitInternal;
}

std::string describe_status(int wait_status) {
    if (WIFEXITED(wait_status)) return "exited with code " + std::to_string(WEXITSTATUS(wait_status));
    if (WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGBUS)
        return "killed by SIGBUS (a mapped file changed or the disk failed)";
    if (WIFSIGNALED(wait_status)) return "killed by " + signal_name(WTERMSIG(wait_status));
    return "ended with wait status " + std::to_string(wait_status);
}

std::string now_iso8601() {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", &tm);
    return buf;
}

// Blocks the job signals for the launcher's lifetime, so they arrive through a signalfd.
class SignalChannel {
  public:
    SignalChannel() {
        sigemptyset(&mask_);
        sigaddset(&mask_, SIGCHLD);
        for (int sig : kJobSignals) sigaddset(&mask_, sig);
        if (sigprocmask(SIG_BLOCK, &mask_, &previous_) != 0) throw SystemError(errno_message("sigprocmask"));
        fd_.reset(signalfd(-1, &mask_, SFD_CLOEXEC | SFD_NONBLOCK));
        if (!fd_) throw SystemError(errno_message("signalfd"));
    }
    ~SignalChannel() { sigprocmask(SIG_SETMASK, &previous_, nullptr); }
    int fd() const { return fd_.get(); }

  private:
    sigset_t mask_{}, previous_{};
    UniqueFd fd_;
};

class Job {
  public:
    Job(const LaunchSpec& spec, Rendezvous& rendezvous, StatusListener* listener)
        : spec_(spec), rendezvous_(rendezvous), listener_(listener) {
        // Descendants orphaned while the job runs become our children: Note [orphan guard].
        prctl(PR_SET_CHILD_SUBREAPER, 1);
        watch_ = HangWatch({spec.load_timeout_s, spec.rank_timeout_s, spec.timeout_s, listener != nullptr,
                            spec.launcher_count() == 1},
                           Clock::now());
        timer_.reset(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
        if (!timer_) throw SystemError(errno_message("timerfd_create"));
        base_env_ = current_environment();
        // Every local rank, or the ones a per-rank scheduler task starts (Note [cluster shapes]).
        const std::vector<int> locals = spec.local_ranks();
        ranks_.resize(locals.size());
        for (std::size_t k = 0; k < locals.size(); ++k) {
            const int i = locals[k];
            Rank& r = ranks_[k];
            r.local_rank = i;
            r.rank = spec.node_rank * spec.num_processes + i;
            r.output.out.terminal_fd = STDOUT_FILENO;
            r.output.err.terminal_fd = STDERR_FILENO;
            const bool shown = spec.shown_local_ranks.empty() ||
                               std::find(spec.shown_local_ranks.begin(), spec.shown_local_ranks.end(), i) !=
                                   spec.shown_local_ranks.end();
            r.output.setup(spec.prefix_output ? "[rank " + std::to_string(r.rank) + "] " : std::string(),
                           shown, &sinks_, [this](const std::string& line) { say(line); });
        }
        for (const Rank& r : ranks_) live_.push_back(&r);
        if (!spec.log_dir.empty()) open_logs();
    }

    int run() {
        for (int restart = 0;; ++restart) {
            run_attempt(restart);
            if (stop_reason_ != StopReason::kNone) {
                if (stop_reason_ == StopReason::kHang && launcher_signal_ == 0 &&
                    restart < spec_.max_restarts) {
                    if (!spec_.quiet)
                        say("restarting all " + std::to_string(ranks_.size()) + " ranks (restart " +
                            std::to_string(restart + 1) + " of " + std::to_string(spec_.max_restarts) +
                            ") after " + stop_message_);
                    if (listener_) listener_->on_restart();
                    continue;
                }
                report(stop_message_,
                       stopped_rank_ >= 0 ? &ranks_[static_cast<std::size_t>(stopped_rank_)] : nullptr,
                       "<- silent", kExitRetry);
                return kExitRetry;
            }
            if (first_failure_ < 0) {
                if (launcher_signal_ != 0) {
                    if (!spec_.quiet) say("stopped by " + signal_name(launcher_signal_) + stop_moment_);
                    return 128 + launcher_signal_;
                }
                return kExitOk;
            }
            const Rank& failed = ranks_[static_cast<std::size_t>(first_failure_)];
            if (launcher_signal_ == 0 && restart < spec_.max_restarts) {
                if (!spec_.quiet)
                    say("restarting all " + std::to_string(ranks_.size()) + " ranks (restart " +
                        std::to_string(restart + 1) + " of " + std::to_string(spec_.max_restarts) +
                        ") after rank " + std::to_string(failed.rank) + " " +
                        describe_status(failed.wait_status));
                if (listener_) listener_->on_restart();
                continue;
            }
            report("rank " + std::to_string(failed.rank) + " " + describe_status(failed.wait_status), &failed,
                   "<- first failure", exit_code_of(failed.wait_status));
            return exit_code_of(failed.wait_status);
        }
    }

  private:
    void say(const std::string& line) { Terminal::instance().say(line); }

    void open_logs() {
        std::error_code failed;  // a file of that name is "Not a directory"
        std::filesystem::create_directories(spec_.log_dir, failed);
        if (failed)
            throw IoError("--log-dir " + spec_.log_dir + ": cannot create it (" + failed.message() + ")");
        for (Rank& r : ranks_) {
            for (auto [stream, suffix] :
                 {std::pair{&r.output.out, ".stdout"}, std::pair{&r.output.err, ".stderr"}}) {
                const std::string path = spec_.log_dir + "/rank_" + std::to_string(r.rank) + suffix;
                stream->log.reset(open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
                if (!stream->log) throw IoError(errno_message("--log-dir: cannot open " + path));
            }
        }
    }

    void run_attempt(int restart) {
        first_failure_ = -1;
        lost_peer_.reset();
        settle_until_.reset();
        stop_reason_ = StopReason::kNone;
        stopped_rank_ = -1;
        grace_armed_ = false;
        itimerspec off{};
        timerfd_settime(timer_.get(), 0, &off, nullptr);

        // Note [signals before the ranks start]: a stop signal that came before them starts none.
        if (restart == 0) {
            if (const int sig = take_stop_signal()) {
                launcher_signal_ = sig;
                stop_moment_ = " before any rank started";
                return;
            }
        }
        RankEnvInputs inputs;
        inputs.master_addr = rendezvous_.addr;
        inputs.master_port = rendezvous_.port;
        inputs.restart_count = restart;
        inputs.usable_cpus = usable_cpu_count();
        inputs.launcher_pid = getpid();
        inputs.job_id = guard_.job_id();
        for (Rank& r : ranks_) {
            if (r.output.out.log || r.output.err.log) {
                const std::string header = "==== dp-launch run " + spec_.run_id + ", rank " +
                                           std::to_string(r.rank) + ", attempt " + std::to_string(restart) +
                                           ", " + now_iso8601() + " ====\n";
                for (Stream* s : {&r.output.out, &r.output.err}) r.output.write_log(*s, header);
            }
            EnvVars vars = rank_variables(spec_, inputs, r.local_rank, base_env_);
            UniqueFd status_write;
            if (listener_) {
                int fds[2];
                if (pipe2(fds, O_CLOEXEC) != 0)
                    throw SystemError(errno_message("cannot create a status pipe"));
                r.status.pipe.reset(fds[0]);
                status_write.reset(fds[1]);
                fcntl(fds[0], F_SETFL, O_NONBLOCK);
                r.status.lines = LineSplitter();
                vars.emplace_back("DP_STATUS_FD", std::to_string(kStatusFd));
            }
            const std::vector<std::string> env = merge_environment(base_env_, vars);
            ChildProcess child;
            try {
                // The main job's dp-worker ranks ignore SIGUSR1 and SIGUSR2 from their first instruction.
                child = spawn_child(spec_.command, env, status_write ? status_write.get() : -1,
                                    listener_ != nullptr);
            } catch (...) {
                kill_all(SIGKILL);
                for (Rank& started : ranks_)
                    if (started.running) wait_for(started.pid);
                throw;
            }
            guard_.watch(child.pid);
            r.pid = child.pid;
            r.running = true;
            r.signalled_by_launcher = false;
            r.wait_status = 0;
            r.started = Clock::now();
            r.heard = r.started;
            r.beat.reset();
            r.output.restart(std::move(child.stdout_read), std::move(child.stderr_read));
            // A signal that arrived while we were still spawning reaches this rank too.
            if (launcher_signal_ != 0 || first_failure_ >= 0)
                signal_rank(r, launcher_signal_ ? launcher_signal_ : SIGTERM);
        }
        supervise();
        for (Rank& r : ranks_) guard_.forget(r.pid);
    }

    void supervise() {
        bool stragglers_killed = false;
        std::vector<pollfd> fds;
        std::vector<Stream*> streams;
        while (true) {
            const bool any_running =
                std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
            if (!any_running && !stragglers_killed) {
                // Whatever a rank left running goes with it: its process group, then every other
                // process of the job (Note [orphan guard]).
                for (Rank& r : ranks_) kill(-r.pid, SIGKILL);
                kill_job_processes(guard_.job_id(), {getpid()}, guard_.pid());
                stragglers_killed = true;
            }
            fds.clear();
            streams.clear();
            fds.push_back({signals_.fd(), POLLIN, 0});
            fds.push_back({timer_.get(), POLLIN, 0});
            for (Rank& r : ranks_) {
                for (Stream* s : {&r.output.out, &r.output.err, &r.status}) {
                    if (!s->pipe) continue;
                    fds.push_back({s->pipe.get(), POLLIN, 0});
                    streams.push_back(s);
                }
            }
            if (!any_running && streams.empty()) return;

            int timeout = any_running ? ms_until_next_deadline() : kStragglerDrainMs;
            if (const int tick = listener_ && any_running ? listener_->tick_ms() : -1;
                tick >= 0 && (timeout < 0 || tick < timeout))
                timeout = tick;
            const int ready = poll(fds.data(), fds.size(), timeout);
            if (listener_) listener_->on_tick();
            if (ready < 0) {
                if (errno == EINTR) continue;
                throw SystemError(errno_message("poll"));
            }
            if (ready == 0 && any_running) {
                check_deadlines();
                continue;
            }
            if (ready == 0) {
                // Only a process outside the ranks' groups can still hold their pipes open.
                say("some rank output is held open by a process that left its rank's process group; not "
                    "waiting for it");
                for (Stream* s : streams) finish_stream(*owner_of(s), *s);
                return;
            }
            if (fds[0].revents & POLLIN) drain_signals();
            if (fds[1].revents & POLLIN) on_grace_expired();
            for (std::size_t i = 0; i < streams.size(); ++i)
                if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))
                    pump(*owner_of(streams[i]), *streams[i]);
            if (any_running) check_deadlines();
        }
    }

    bool stopping() const {
        return first_failure_ >= 0 || launcher_signal_ != 0 || stop_reason_ != StopReason::kNone;
    }

    // poll's timeout: until the first of the settle time, the job's --timeout and the ranks'
    // silence deadlines (Note [hang detection], hang_watch.h); -1: none.
    int ms_until_next_deadline() const {
        if (stopping()) return -1;
        const Clock::time_point now = Clock::now();
        std::optional<Clock::time_point> next = watch_.next_deadline(live_, now);
        if (settle_until_ && (!next || *settle_until_ < *next)) next = settle_until_;
        if (!next) return -1;
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
        return static_cast<int>(std::clamp<long long>(ms, 0, 24LL * 3600 * 1000));
    }

    void check_deadlines() {
        if (stopping()) return;
        const Clock::time_point now = Clock::now();
        if (settle_until_ && now >= *settle_until_) {  // no other rank failed meanwhile
            commit_failure(*lost_peer_);
            return;
        }
        const std::optional<HangVerdict> verdict = watch_.check(live_, now);
        if (!verdict) return;
        const bool hang = verdict->kind == HangKind::kHang;
        stop_reason_ = hang ? StopReason::kHang : StopReason::kJobTimeout;
        stopped_rank_ = hang ? static_cast<int>(verdict->index) : -1;
        stop_message_ = verdict->message;
        say(stop_message_ + (hang ? "; stopping the job" : "; stopping every rank"));
        stop_all(SIGTERM);
    }

    // Every line of rank `r`'s status channel: it is alive; a heartbeat says what it is doing.
    void on_status_line(Rank& r, std::string_view line) {
        launcher::on_status_line(r, line, Clock::now());
        listener_->on_status(r.rank, line);
    }

    Rank* owner_of(Stream* s) {
        for (Rank& r : ranks_)
            if (s == &r.output.out || s == &r.output.err || s == &r.status) return &r;
        return nullptr;
    }

    void drain_signals() {
        signalfd_siginfo info{};
        while (read(signals_.fd(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
            const int sig = static_cast<int>(info.ssi_signo);
            if (sig == SIGCHLD) {
                reap();
            } else {
                on_launcher_signal(sig);
            }
        }
    }

    void reap() {
        std::vector<std::size_t> failed;
        // Any child: as a subreaper we also collect orphaned descendants of the ranks.
        int status = 0;
        pid_t pid = 0;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            const auto it = std::find_if(ranks_.begin(), ranks_.end(),
                                         [&](const Rank& r) { return r.running && r.pid == pid; });
            if (it == ranks_.end()) continue;
            const std::size_t i = static_cast<std::size_t>(it - ranks_.begin());
            Rank& r = *it;
            r.running = false;
            r.wait_status = status;
            r.ended = Clock::now();
            if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !r.signalled_by_launcher)
                failed.push_back(i);
        }
        const bool others_running =
            std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
        if (failed.empty() && lost_peer_ && !others_running && !stopping()) commit_failure(*lost_peer_);
        if (failed.empty() || stopping()) return;
        // Note [a lost peer is a consequence]: a rank whose collective failed (exit 75) failed
        // because another rank of its group died or broke off, and that rank may still be on its
        // way out (writing its error, tearing down its group) when the 75 arrives. So the first
        // failure is a rank that did not exit 75 when there is one; while there is none, the
        // others get a short settle window (kSettle, at most the grace period) to exit on their
        // own before they are stopped, so that a bad model (65) is not reported as a retryable 75.
        const auto cause = std::find_if(failed.begin(), failed.end(), [&](std::size_t i) {
            return exit_code_of(ranks_[i].wait_status) != protocol::kExitCommunication;
        });
        if (cause == failed.end()) {
            if (!lost_peer_) lost_peer_ = failed.front();
            if (!settle_until_)
                settle_until_ =
                    Clock::now() + std::min<Clock::duration>(kSettle, from_seconds(spec_.shutdown_grace_s));
            if (others_running && Clock::now() < *settle_until_) return;
        }
        commit_failure(cause != failed.end() ? *cause : *lost_peer_);
    }

    // The first failure is `index`: every other rank is stopped.
    void commit_failure(std::size_t index) {
        first_failure_ = static_cast<int>(index);
        settle_until_.reset();
        const Rank& r = ranks_[index];
        stop_all(SIGTERM);
        say("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") " +
            describe_status(r.wait_status) + " after " + seconds_text(r.ended - r.started) +
            "; stopping the other ranks");
    }

    void on_launcher_signal(int sig) {
        if (sig == SIGUSR1 || sig == SIGUSR2) {
            for (Rank& r : ranks_)
                if (r.running) kill(-r.pid, sig);
            return;
        }
        if (sig == SIGINT && ++sigint_count_ >= 2) {
            say("second SIGINT: killing every rank now");
            kill_all(SIGKILL);
            return;
        }
        if (launcher_signal_ == 0) {
            launcher_signal_ = sig;
            quiet_connecting_ranks();
        }
        stop_all(sig);
    }

    // Note [stopped while connecting] (runtime/worker.cpp): a main job rank that has sent no
    // heartbeat yet is starting up and connecting to the others, and a stop ends it at once. What
    // it still writes (a library's complaint about its broken connection) goes to its log, not to
    // the terminal: dp-launch's own line says what happened.
    void quiet_connecting_ranks() {
        if (!listener_) return;
        for (Rank& r : ranks_) {
            if (!r.running || r.beat) continue;
            r.output.hide();
            stop_moment_ = " while the ranks were connecting";
        }
    }

    void signal_rank(Rank& r, int sig) {
        if (!r.running) return;
        kill(-r.pid, sig);
        // A stopped rank acts on its stop signal only once it runs again.
        if (sig != SIGKILL) kill(-r.pid, SIGCONT);
        r.signalled_by_launcher = true;
    }

    // Sends `sig` to every running rank's process group and starts the grace period.
    void stop_all(int sig) {
        for (Rank& r : ranks_) signal_rank(r, sig);
        if (grace_armed_) return;
        grace_armed_ = true;
        if (spec_.shutdown_grace_s <= 0) {
            kill_all(SIGKILL);
            return;
        }
        itimerspec when{};
        const double whole = std::floor(spec_.shutdown_grace_s);
        when.it_value.tv_sec = static_cast<time_t>(whole);
        when.it_value.tv_nsec = static_cast<long>((spec_.shutdown_grace_s - whole) * 1e9);
        timerfd_settime(timer_.get(), 0, &when, nullptr);
    }

    void on_grace_expired() {
        std::uint64_t expirations = 0;
        if (read(timer_.get(), &expirations, sizeof(expirations)) <= 0) return;
        std::string late;
        for (const Rank& r : ranks_)
            if (r.running) late += (late.empty() ? "" : ", ") + std::to_string(r.rank);
        if (!late.empty())
            say("rank(s) " + late + " still running after the " +
                seconds_text(std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(spec_.shutdown_grace_s))) +
                " grace period: sending SIGKILL");
        kill_all(SIGKILL);
    }

    void kill_all(int sig) {
        for (Rank& r : ranks_) signal_rank(r, sig);
    }

    void pump(Rank& r, Stream& s) {
        char buf[64 * 1024];
        const ssize_t n = read(s.pipe.get(), buf, sizeof(buf));
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (n <= 0) {
            finish_stream(r, s);
            return;
        }
        const std::string_view data(buf, static_cast<std::size_t>(n));
        if (&s == &r.status)
            s.lines.feed(data, [&](std::string_view line) { on_status_line(r, line); });
        else
            r.output.feed(s, data);
    }

    void finish_stream(Rank& r, Stream& s) {
        if (&s != &r.status) {
            r.output.finish(s);
            return;
        }
        s.lines.finish([&](std::string_view line) { on_status_line(r, line); });
        s.pipe.reset();
    }

    // The job's end: `headline`, each rank's result with `marked` marked, `marked`'s last stderr
    // lines, and the exit code.
    void report(const std::string& headline, const Rank* marked, const char* mark, int code) {
        std::string text = "dp-launch: job failed: " + headline + "\n";
        char line[256];
        std::snprintf(line, sizeof(line), "  %6s  %8s  %10s  %s\n", "rank", "pid", "elapsed", "result");
        text += line;
        for (const Rank& r : ranks_) {
            std::string result = describe_status(r.wait_status);
            if (&r == marked)
                result += std::string("   ") + mark;
            else if (r.signalled_by_launcher)
                result += " (stopped by dp-launch)";
            std::snprintf(line, sizeof(line), "  %6d  %8d  %10s  ", r.rank, static_cast<int>(r.pid),
                          seconds_text(r.ended - r.started).c_str());
            text += line + result + "\n";
        }
        if (!marked) {
        } else if (marked->output.stderr_tail().empty()) {
            text += "  rank " + std::to_string(marked->rank) + " wrote nothing to stderr\n";
        } else {
            text += "  last " + std::to_string(marked->output.stderr_tail().size()) + " line(s) of rank " +
                    std::to_string(marked->rank) + " stderr:\n";
            for (const std::string& l : marked->output.stderr_tail()) text += "    | " + l + "\n";
        }
        if (!spec_.log_dir.empty()) text += "  full logs: " + spec_.log_dir + "/rank_*.stderr\n";
        text += "dp-launch: exit code " + std::to_string(code) +
                (code == kExitRetry ? " (running the job again may succeed)" : "") + "\n";
        Terminal::instance().write_own(STDERR_FILENO, text);
    }

    const LaunchSpec& spec_;
    Rendezvous& rendezvous_;
    StatusListener* listener_;
    OrphanGuard guard_{new_job_id()};  // before the signal channel: the guard starts with no signals blocked
    SignalChannel signals_;
    UniqueFd timer_;
    std::vector<std::string> base_env_;
    std::vector<Rank> ranks_;
    int first_failure_ = -1;  // index into ranks_
    // Note [a lost peer is a consequence]: the first rank seen exiting 75, and until when the
    // others may still exit on their own.
    std::optional<std::size_t> lost_peer_;
    std::optional<Clock::time_point> settle_until_;
    StopReason stop_reason_ = StopReason::kNone;
    std::string stop_message_;
    int stopped_rank_ = -1;  // index into ranks_: the rank a hang names
    HangWatch watch_;
    std::vector<const RankLiveness*> live_;  // ranks_, as hang detection reads them
    int launcher_signal_ = 0;                // the first stop signal dp-launch received
    std::string stop_moment_;                // when it came, for the message: "" while the ranks ran
    int sigint_count_ = 0;
    bool grace_armed_ = false;
    OutputSinks sinks_;  // dp-launch's own stdout and stderr, shared by the ranks' output
};

}  // namespace

int run_launch(const LaunchSpec& spec, StatusListener* listener) {
    validate_launch_spec(spec);
    if (spec.launcher_index() == 0)
        check_master_port_free(spec.master_addr, spec.master_port);  // Note [port in use]
    signal(SIGPIPE, SIG_IGN);
    Rendezvous rendezvous = resolve_rendezvous(spec.master_addr, spec.master_port);
    Job job(spec, rendezvous, listener);
    return job.run();
}

void open_launcher_log(const LaunchSpec& spec) {
    if (spec.log_dir.empty()) return;
    std::error_code failed;
    std::filesystem::create_directories(spec.log_dir, failed);
    if (failed) throw IoError("--log-dir " + spec.log_dir + ": cannot create it (" + failed.message() + ")");
    const std::string path = spec.log_dir + "/launcher.log";
    UniqueFd log(open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!log) throw IoError(errno_message("--log-dir: cannot open " + path));
    const std::string header = "==== dp-launch run " + spec.run_id + ", launcher pid " +
                               std::to_string(getpid()) + ", " + now_iso8601() + " ====\n";
    write_all(log.get(), header.data(), header.size());
    Terminal::instance().set_log(std::move(log));
}

}  // namespace dp::launcher
