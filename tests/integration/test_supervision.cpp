// Supervision: failures, grace periods, signals, restarts, and no process left behind.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <sstream>

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
