// Supervision: failures, grace periods, signals, restarts, and no process left behind.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "integration/launch_harness.h"

using namespace dp::test;

namespace {
long long stamp(const std::string& path) { return std::stoll(read_file(path)); }

void check_nothing_left(const std::string& marker) {
    // The kernel delivers a parent-death SIGKILL asynchronously: allow it a moment.
    const bool clean = wait_until([&] { return processes_with_marker(marker).empty(); }, 2.0);
    std::string left;
    for (pid_t p : processes_with_marker(marker)) left += std::to_string(p) + " ";
    CHECK_MESSAGE(clean, "processes of the job still alive: " << left);
}
}  // namespace

TEST_CASE("one rank exits 3: the others get SIGTERM within 100 ms and dp-launch exits 3 with a report") {
    const std::string dir = make_temp_dir();
    Launch launch({"-n", "4", "--", worker_bin(), "fail", "2", "3", dir});
    LaunchResult r = launch.wait(30);
    CHECK(r.exit_code == 3);
    const long long failed_at = stamp(dir + "/exit_2");
    for (int rank : {0, 1, 3}) {
        CAPTURE(rank);
        REQUIRE(file_exists(dir + "/term_" + std::to_string(rank)));
        const double ms = static_cast<double>(stamp(dir + "/term_" + std::to_string(rank)) - failed_at) / 1e6;
        MESSAGE("rank " << rank << " got SIGTERM " << ms << " ms after rank 2 exited");
        CHECK(ms >= 0);
        CHECK(ms < 100);
    }
    CHECK(r.err.find("job failed: rank 2 exited with code 3") != std::string::npos);
    CHECK(r.err.find("<- first failure") != std::string::npos);
    CHECK(r.err.find("| rank 2: something went wrong") != std::string::npos);
    CHECK(r.err.find("killed by SIGTERM") == std::string::npos);  // the others exited 143 themselves
    CHECK(r.err.find("exited with code 143 (stopped by dp-launch)") != std::string::npos);
    check_nothing_left(launch.marker());
}

TEST_CASE("the report shows the failing rank's last stderr lines and the exit code passes through") {
    LaunchResult r = run_launch({"-n", "2", "--", worker_bin(), "stderr-exit", "42"});
    CHECK(r.exit_code == 42);
    CHECK(r.err.find("last 10 line(s) of rank") != std::string::npos);
    CHECK(r.err.find("    | stderr line 15") != std::string::npos);
    CHECK(r.err.find("    | stderr line 5\n") == std::string::npos);  // only the last 10
}

TEST_CASE("a rank killed by a signal gives 128 + signal") {
    LaunchResult r = run_launch({"-n", "1", "--", "sh", "-c", "kill -SEGV $$"});
    CHECK(r.exit_code == 128 + SIGSEGV);
    CHECK(r.err.find("killed by SIGSEGV") != std::string::npos);
}

TEST_CASE("a rank killed by SIGBUS gives 74 and says a mapped file changed, not a retryable 135") {
    const std::string dir = make_temp_dir();
    LaunchResult r = run_launch({"-n", "1", "--", worker_bin(), "sigbus", dir});
    CHECK_MESSAGE(r.exit_code == 74, r.err);
    CHECK_MESSAGE(
        r.err.find("rank 0 killed by SIGBUS (a mapped file changed or the disk failed)") != std::string::npos,
        r.err);
    CHECK_MESSAGE(r.err.find("may succeed") == std::string::npos, r.err);
}

TEST_CASE("a command that does not exist exits 127 and says so") {
    LaunchResult r = run_launch({"-n", "2", "--", "/nonexistent/program"});
    CHECK(r.exit_code == 127);
    CHECK(r.err.find("cannot run '/nonexistent/program': command not found") != std::string::npos);
}

TEST_CASE("a rank that ignores SIGTERM is SIGKILLed after the grace period") {
    const std::string dir = make_temp_dir();
    // Rank 0 fails at once; rank 1 ignores SIGTERM.
    Launch launch({"-n", "2", "--shutdown-grace", "0.5", "--", "sh", "-c",
                   std::string("if [ $RANK = 0 ]; then sleep 0.3; exit 5; else exec ") + worker_bin() +
                       " ignore-term " + dir + "; fi"});
    LaunchResult r = launch.wait(30);
    CHECK(r.exit_code == 5);
    CHECK(r.err.find("still running after the 0.50 s grace period: sending SIGKILL") != std::string::npos);
    CHECK(r.err.find("killed by SIGKILL (stopped by dp-launch)") != std::string::npos);
    CHECK(r.seconds < 5);
    check_nothing_left(launch.marker());
}

TEST_CASE("SIGINT to dp-launch is forwarded, and no process of the job is left") {
    const std::string dir = make_temp_dir();
    Launch launch({"-n", "3", "--", worker_bin(), "signals", dir});
    REQUIRE(wait_until(
        [&] {
            return file_exists(dir + "/ready_0") && file_exists(dir + "/ready_1") &&
                   file_exists(dir + "/ready_2");
        },
        10));
    launch.signal(SIGINT);
    LaunchResult r = launch.wait(30);
    CHECK(r.exit_code == 128 + SIGINT);
    for (int rank = 0; rank < 3; ++rank)
        CHECK(read_file(dir + "/signals_" + std::to_string(rank)) == std::to_string(SIGINT) + "\n");
    check_nothing_left(launch.marker());
}

TEST_CASE("SIGUSR1, SIGUSR2, SIGHUP and SIGQUIT are forwarded to every rank") {
    const std::string dir = make_temp_dir();
    Launch launch({"-n", "2", "--shutdown-grace", "0.5", "--", worker_bin(), "signals", dir});
    REQUIRE(wait_until([&] { return file_exists(dir + "/ready_0") && file_exists(dir + "/ready_1"); }, 10));
    const std::string expected = std::to_string(SIGUSR1) + "\n" + std::to_string(SIGUSR2) + "\n";
    launch.signal(SIGUSR1);
    REQUIRE(wait_until([&] { return read_file(dir + "/signals_1").size() >= 2; }, 5));
    launch.signal(SIGUSR2);
    REQUIRE(wait_until(
        [&] {
            return read_file(dir + "/signals_0") == expected && read_file(dir + "/signals_1") == expected;
        },
        5));
    launch.signal(
        SIGHUP);  // the workers log it and keep running: dp-launch then stops them after the grace period
    launch.signal(SIGQUIT);
    LaunchResult r = launch.wait(30);
    CHECK(r.exit_code == 128 + SIGHUP);  // the first stop signal names the exit code
    CHECK(read_file(dir + "/signals_0").find(std::to_string(SIGQUIT) + "\n") != std::string::npos);
    check_nothing_left(launch.marker());
}

namespace {
// dp-launch on `args` with `env`, sent `sig` `ms` milliseconds after its main began; nothing of the
// job may be left.
LaunchResult signalled_at_start(const std::vector<std::string>& args,
                                const std::map<std::string, std::string>& env, int sig, int ms) {
    Launch launch(args, env, /*stdin_closed=*/true);
    REQUIRE(launch.wait_for_main());
    usleep(static_cast<useconds_t>(ms) * 1000);
    launch.signal(sig);
    LaunchResult r = launch.wait(30);
    check_nothing_left(launch.marker());
    return r;
}
}  // namespace

TEST_CASE("a job signal in dp-launch's first milliseconds never kills it, in command mode and the main job") {
    // Note [signals before the ranks start]: each job signal, 0 to 20 ms after dp-launch's main
    // began (before, while and after the ranks start; before main, while the dynamic loader maps
    // its libraries, no program can act on one). A stop signal ends the job with 128 + the signal,
    // and one before any rank leaves no output folder. SIGUSR1 and SIGUSR2 are forwarded once the
    // ranks exist: a command that does not handle them is ended by them (the job fails with 128 +
    // the signal); the main job's ranks ignore them, and the job ends as it would have.
    const std::string dir = make_temp_dir();
    const std::string prompts = red_circle_prompts(dir, 2);
    const std::map<std::string, std::string> fast = {{"DP_TEST_FAKE_STEPS", "2"},
                                                     {"DP_TEST_FAKE_STEP_MS", "10"}};
    const auto job_args = [&](const std::string& out) {
        return std::vector<std::string>{"-n", "2", "--worker", worker_bin(), "-o", out, prompts};
    };
    // Undisturbed, the stand-in ranks report no image: every prompt is not run (1).
    const int undisturbed = run_launch(job_args(dir + "/plain"), fast).exit_code;
    CHECK(undisturbed == 1);
    int k = 0;
    for (const bool job : {false, true}) {
        for (const int sig : {SIGUSR1, SIGUSR2, SIGHUP, SIGTERM, SIGINT, SIGQUIT}) {
            for (const int ms : {0, 1, 5, 20}) {
                CAPTURE(job);
                CAPTURE(sig);
                CAPTURE(ms);
                const std::string out = dir + "/out" + std::to_string(k++);
                const LaunchResult r =
                    job ? signalled_at_start(job_args(out), fast, sig, ms)
                        : signalled_at_start({"-n", "2", "--", worker_bin(), "sleep", "3"}, {}, sig, ms);
                INFO(r.err);
                CHECK(r.killed_by == 0);
                const bool user = sig == SIGUSR1 || sig == SIGUSR2;
                CHECK(r.exit_code == (user && job ? undisturbed : 128 + sig));
                if (user && !job)
                    CHECK(r.err.find("killed by SIG" + std::string(sigabbrev_np(sig))) != std::string::npos);
                if (!user)
                    CHECK(r.err.find("stopped by SIG" + std::string(sigabbrev_np(sig))) != std::string::npos);
                if (r.err.find("before any rank started") != std::string::npos) CHECK_FALSE(file_exists(out));
            }
        }
    }
}

TEST_CASE("a stop signal while dp-launch waits for its prompts on a pipe ends it at once, 128 + the signal") {
    // Note [signals before the ranks start]: a FIFO whose writer (this test) never writes nor
    // closes keeps dp-launch reading; SIGTERM ends that wait, and nothing was made.
    const std::string dir = make_temp_dir();
    const std::string fifo = dir + "/prompts.fifo";
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    const int writer = open(fifo.c_str(), O_RDWR | O_NONBLOCK);  // a writer, so that its open returns
    REQUIRE(writer >= 0);
    for (const int sig : {SIGTERM, SIGINT}) {
        CAPTURE(sig);
        Launch launch({"-n", "2", "--worker", worker_bin(), "-o", dir + "/out", fifo});
        usleep(300 * 1000);
        launch.signal(sig);
        const LaunchResult r = launch.wait(10);
        INFO(r.err);
        CHECK(r.exit_code == 128 + sig);
        CHECK(r.killed_by == 0);
        CHECK(r.err.find("stopped by SIG" + std::string(sigabbrev_np(sig)) + " before any rank started") !=
              std::string::npos);
        CHECK_FALSE(file_exists(dir + "/out"));
        check_nothing_left(launch.marker());
    }
    close(writer);
}

TEST_CASE("a second SIGINT kills at once, without waiting for the grace period") {
    const std::string dir = make_temp_dir();
    Launch launch({"-n", "2", "--shutdown-grace", "60", "--", worker_bin(), "ignore-term", dir});
    REQUIRE(wait_until([&] { return file_exists(dir + "/ready_0") && file_exists(dir + "/ready_1"); }, 10));
    launch.signal(SIGINT);  // forwarded, and ignored by the ranks
    usleep(50 * 1000);
    const double before = monotonic_seconds();
    launch.signal(SIGINT);
    LaunchResult r = launch.wait(30);
    CHECK(monotonic_seconds() - before < 5);
    CHECK(r.exit_code == 128 + SIGINT);
    CHECK(r.err.find("second SIGINT: killing every rank now") != std::string::npos);
    check_nothing_left(launch.marker());
}

TEST_CASE("SIGKILL to dp-launch leaves no rank and no rank's child alive") {
    const std::string dir = make_temp_dir();
    Launch launch({"-n", "2", "--", worker_bin(), "tree", dir});
    REQUIRE(wait_until([&] { return file_exists(dir + "/pids_0") && file_exists(dir + "/pids_1"); }, 10));
    REQUIRE(processes_with_marker(launch.marker()).size() >= 5);  // launcher, guard, 2 ranks, 2 children
    launch.signal(SIGKILL);
    LaunchResult r = launch.wait(10);
    CHECK(r.exit_code == 128 + SIGKILL);
    check_nothing_left(launch.marker());
}

TEST_CASE("children a rank leaves behind are killed when the job ends") {
    Launch launch({"-n", "1", "--", "sh", "-c", "sleep 300 & echo started"});
    LaunchResult r = launch.wait(30);
    CHECK(r.exit_code == 0);
    CHECK(r.out == "[rank 0] started\n");
    CHECK(r.seconds < 10);
    check_nothing_left(launch.marker());
}

TEST_CASE("--max-restarts 1 restarts the group after a first-attempt failure and succeeds") {
    LaunchResult r = run_launch({"-n", "3", "--max-restarts", "1", "--", worker_bin(), "fail-first", "7"});
    CHECK(r.exit_code == 0);
    CHECK(r.err.find("restarting all 3 ranks (restart 1 of 1) after rank 1 exited with code 7") !=
          std::string::npos);
    for (int rank = 0; rank < 3; ++rank)
        CHECK(r.out.find("[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                         " ok on attempt 1") != std::string::npos);
}

TEST_CASE("without restarts left, the failure stands") {
    LaunchResult r = run_launch({"-n", "2", "--", worker_bin(), "fail-first", "7"});
    CHECK(r.exit_code == 7);
    LaunchResult q =
        run_launch({"-n", "2", "-q", "--max-restarts", "1", "--", worker_bin(), "fail-first", "7"});
    CHECK(q.exit_code == 0);
    CHECK(q.err.find("restarting") == std::string::npos);  // --quiet
}

TEST_CASE("a successful job is silent apart from the ranks' own output") {
    LaunchResult r = run_launch({"-n", "4", "--", "true"});
    CHECK(r.exit_code == 0);
    CHECK(r.out.empty());
    CHECK(r.err.empty());
}

namespace {
// The pids a `daemon` rank wrote: its setsid daemon and its child in the rank's group.
std::vector<pid_t> daemon_pids(const std::string& dir, int rank) {
    std::istringstream in(read_file(dir + "/daemon_" + std::to_string(rank)));
    std::vector<pid_t> pids;
    for (pid_t p = 0; in >> p;) pids.push_back(p);
    return pids;
}

bool alive(pid_t pid) {
    const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    const auto paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

}  // namespace

TEST_CASE("SIGKILL to dp-launch alone also kills a daemon a rank started with setsid") {
    const std::string dir = make_temp_dir();
    Launch launch({"-n", "2", "--", worker_bin(), "daemon", dir, "wait"});
    REQUIRE(wait_until([&] { return file_exists(dir + "/daemon_0") && file_exists(dir + "/daemon_1"); }, 10));
    const std::vector<pid_t> daemons = {daemon_pids(dir, 0).at(0), daemon_pids(dir, 1).at(0)};
    for (pid_t d : daemons) REQUIRE(alive(d));
    launch.signal(SIGKILL);
    LaunchResult r = launch.wait(10);
    CHECK(r.exit_code == 128 + SIGKILL);
    check_nothing_left(launch.marker());
    for (pid_t d : daemons) CHECK_MESSAGE(!alive(d), "daemon " << d << " outlived the job");
}

TEST_CASE("SIGKILL to dp-launch's whole process group leaves no rank, child or daemon alive") {
    const std::string dir = make_temp_dir();
    // setsid(1): dp-launch leads a process group (and session) of its own, which the test then kills
    // whole, as a container runtime or `kill -9 -PGID` does.
    DirectProcess launcher(
        {"/usr/bin/setsid", launcher_bin(), "-n", "2", "--", worker_bin(), "daemon", dir, "wait"}, {},
        dir + "/launcher");
    REQUIRE(wait_until([&] { return file_exists(dir + "/daemon_0") && file_exists(dir + "/daemon_1"); }, 10));
    REQUIRE(processes_with_marker(launcher.marker()).size() >=
            8);  // launcher, guard, 2 x (rank, child, daemon)
    REQUIRE(getpgid(launcher.pid()) == launcher.pid());
    kill(-launcher.pid(), SIGKILL);
    CHECK(launcher.wait(10) == 128 + SIGKILL);
    check_nothing_left(launcher.marker());
}

TEST_CASE("timeout -s KILL on dp-launch kills the job's processes, as the issue's reproduction does") {
    const std::string dir = make_temp_dir();
    // timeout(1) puts itself and dp-launch in a new process group and SIGKILLs the group.
    DirectProcess launcher({"/usr/bin/timeout", "-s", "KILL", "1", launcher_bin(), "-n", "2", "--", "sh",
                            "-c", "sleep 40 & touch " + dir + "/started_$RANK; sleep 40"},
                           {}, dir + "/launcher");
    CHECK(launcher.wait(10) == 128 + SIGKILL);
    CHECK(file_exists(dir + "/started_0"));
    check_nothing_left(launcher.marker());
}

TEST_CASE("a daemon a rank started with setsid is killed when the job ends normally") {
    const std::string dir = make_temp_dir();
    Launch launch({"-n", "2", "--", worker_bin(), "daemon", dir, "exit"});
    LaunchResult r = launch.wait(30);
    CHECK(r.exit_code == 0);
    CHECK(r.seconds < 10);
    check_nothing_left(launch.marker());
    for (int rank : {0, 1})
        for (pid_t p : daemon_pids(dir, rank)) CHECK_MESSAGE(!alive(p), "pid " << p << " outlived the job");
}

TEST_CASE("--timeout stops a command-mode job that runs too long, with exit code 75") {
    Launch launch({"-n", "2", "--timeout", "1", "--shutdown-grace", "1", "--", "sleep", "60"});
    LaunchResult r = launch.wait(30);
    CHECK(r.exit_code == 75);
    CHECK(r.seconds < 5);
    CHECK(r.err.find("the job ran past --timeout 1.00 s") != std::string::npos);
    CHECK(r.err.find("exit code 75 (running the job again may succeed)") != std::string::npos);
    check_nothing_left(launch.marker());
}

TEST_CASE(
    "a rank that exits 75 under --timeout: the others get the short settle window, not the job's timeout") {
    // Note [a lost peer is a consequence]: the settle window is due before the job's --timeout.
    Launch launch({"-n", "2", "--timeout", "60", "--shutdown-grace", "1", "--", "sh", "-c",
                   "if [ \"$RANK\" = 0 ]; then exit 75; fi; exec sleep 60"});
    LaunchResult r = launch.wait(30);
    INFO(r.err);
    CHECK(r.exit_code == 75);
    CHECK(r.seconds < 8);
    CHECK(r.err.find("rank 0 exited with code 75") != std::string::npos);
    CHECK(r.err.find("--timeout") == std::string::npos);
    check_nothing_left(launch.marker());
}

namespace {
// Two fake-worker ranks on `prompts` red-circle prompts, with `env`, under --rank-timeout
// `rank_timeout` and a 1 s --shutdown-grace, writing to dir/out: dp-launch must end the job as a
// hang (75) within `within` seconds and leave nothing behind. What it said.
LaunchResult hang_ended(const std::string& dir, const std::string& rank_timeout, int prompts,
                        const std::map<std::string, std::string>& env, double within) {
    std::vector<std::string> args = {"-n", "2", "--rank-timeout", rank_timeout, "--shutdown-grace", "1"};
    args.insert(args.end(), {"--worker", worker_bin(), "-o", dir + "/out", red_circle_prompts(dir, prompts)});
    Launch launch(args, env);
    LaunchResult r = launch.wait(30);
    INFO(r.err);
    CHECK(r.exit_code == 75);
    CHECK(r.seconds < within);
    check_nothing_left(launch.marker());
    return r;
}
}  // namespace

TEST_CASE("a rank stopped with SIGSTOP ends the main job within --rank-timeout, named with its step") {
    const std::string dir = make_temp_dir();
    const LaunchResult r = hang_ended(
        dir, "1", 4,
        {{"DP_TEST_FAKE_STOP", "1:6"}, {"DP_TEST_FAKE_STEPS", "4"}, {"DP_TEST_FAKE_STEP_MS", "20"}}, 6);
    INFO(r.err);
    CHECK(r.err.find("rank 1 hung while step 2 of 4 of prompt 1: no heartbeat for") != std::string::npos);
    CHECK(r.err.find("(--rank-timeout 1.00 s); its process is stopped") != std::string::npos);
    CHECK(r.err.find("<- silent") != std::string::npos);
    CHECK(file_exists(dir + "/out/manifest.jsonl"));
}

TEST_CASE("a rank that waits for the others longer than --rank-timeout is not hung while another works") {
    const std::string dir = make_temp_dir();
    // Rank 1's 4 x 4 steps take 2.4 s; rank 0 is done in 0.3 s and waits 2.5 s for it.
    LaunchResult r = run_launch({"-n", "2", "--rank-timeout", "0.5", "--worker", worker_bin(), "-o",
                                 dir + "/out", red_circle_prompts(dir, 2)},
                                {{"DP_TEST_FAKE_WAIT_S", "0:2.5"}, {"DP_TEST_FAKE_STEP_MS", "1:150"}});
    INFO(r.err);
    CHECK(r.err.find("hung") == std::string::npos);
    CHECK(r.exit_code != 75);
}

TEST_CASE("a rank stopped while it waits for the others is a hang within --rank-timeout, named") {
    const std::string dir = make_temp_dir();
    // Rank 1 finishes its share and stops (SIGSTOP) while waiting; rank 0 still works, then waits.
    const LaunchResult r = hang_ended(
        dir, "1", 4,
        {{"DP_TEST_FAKE_STOP", "1:0"}, {"DP_TEST_FAKE_STEP_MS", "0:100"}, {"DP_TEST_FAKE_WAIT_S", "0:30"}},
        8);  // not the collective timeout
    INFO(r.err);
    CHECK(r.err.find("rank 1 hung while waiting") != std::string::npos);
    CHECK(r.err.find("(--rank-timeout 1.00 s); its process is stopped") != std::string::npos);
}

TEST_CASE("every rank waiting past --rank-timeout is a hang: nobody is working") {
    const std::string dir = make_temp_dir();
    const LaunchResult r = hang_ended(dir, "0.5", 2, {{"DP_TEST_FAKE_WAIT_S", "30"}}, 8);
    INFO(r.err);
    CHECK(r.err.find(
              "every running rank has waited for the others for more than --rank-timeout 0.50 s, so none "
              "is working: rank ") != std::string::npos);
}

TEST_CASE("a rank stopped while it loads is a hang after --rank-timeout, before --load-timeout") {
    const std::string dir = make_temp_dir();
    const std::string script = dir + "/stops.sh";
    // Says it is loading, then stops itself.
    std::ofstream(script) << "#!/bin/sh\n"
                             "printf '{\"event\":\"heartbeat\",\"rank\":%s,\"phase\":\"loading\","
                             "\"index\":-1,\"step\":0,\"steps\":0}\\n' \"$RANK\" >&\"$DP_STATUS_FD\"\n"
                             "kill -STOP $$\nexec sleep 60\n";
    chmod(script.c_str(), 0755);
    Launch launch({"-n", "1", "--load-timeout", "600", "--rank-timeout", "1", "--shutdown-grace", "1",
                   "--worker", script, "-o", dir + "/out", red_circle_prompts(dir, 1)});
    LaunchResult r = launch.wait(30);
    INFO(r.err);
    CHECK(r.exit_code == 75);
    CHECK(r.seconds < 8);
    CHECK(r.err.find("rank 0 hung while loading") != std::string::npos);
    CHECK(r.err.find("(--rank-timeout 1.00 s); its process is stopped") != std::string::npos);
    check_nothing_left(launch.marker());
}

TEST_CASE("a rank that never sends a heartbeat is hung after --load-timeout") {
    const std::string dir = make_temp_dir();
    const std::string script = dir + "/silent.sh";
    std::ofstream(script) << "#!/bin/sh\nexec sleep 60\n";
    chmod(script.c_str(), 0755);
    LaunchResult r = run_launch({"-n", "1", "--load-timeout", "0.5", "--shutdown-grace", "0.5", "--worker",
                                 script, "-o", dir + "/out", red_circle_prompts(dir, 1)});
    CHECK(r.exit_code == 75);
    CHECK(r.err.find("rank 0 hung while starting (no heartbeat yet)") != std::string::npos);
    CHECK(r.err.find("(--load-timeout 0.50 s)") != std::string::npos);
}

TEST_CASE(
    "random weights of a config-only folder too large for the machine are refused before any rank starts") {
    // Note [memory guard], Note [sizes from configs]: tiny-random-sd3's configs alone (no weights,
    // no tensor manifest), its transformer claiming 2000 blocks of width 4096: terabytes in fp32.
    // The ranks would have been OOM-killed minutes later; dp-launch refuses at once (2).
    const std::string dir = make_temp_dir();
    const std::string model = dir + "/model";
    REQUIRE(std::system(("cp -r '" + std::string(DP_MODELS_DIR) + "/tiny-random-sd3' '" + model +
                         "' && find '" + model + "' -name '*.safetensors' -delete")
                            .c_str()) == 0);
    nlohmann::json config = nlohmann::json::parse(read_file(model + "/transformer/config.json"));
    config["num_layers"] = 2000;
    config["num_attention_heads"] = 64;
    config["attention_head_dim"] = 64;
    std::ofstream(model + "/transformer/config.json") << config.dump();
    Launch launch({"-n", "2", "--worker", worker_bin(), "--model", model, "--random-weights", "1", "--device",
                   "cpu", "--dtype", "fp32", "-o", dir + "/out", red_circle_prompts(dir, 2)});
    const LaunchResult r = launch.wait(30);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.seconds < 10);
    CHECK(r.err.find("2 rank(s) on this machine would need about ") != std::string::npos);
    CHECK(r.err.find("or pass --force to start them anyway") != std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out"));  // no rank started, nothing made
    check_nothing_left(launch.marker());
}
