// Output multiplexing: whole lines, rank prefixes, bounded memory.
#include <doctest/doctest.h>

#include <unistd.h>
#include <algorithm>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "integration/launch_harness.h"

using namespace dp::test;

TEST_CASE("lines from 4 ranks written in halves never interleave") {
    const int lines_per_rank = 400;
    LaunchResult r = run_launch({"-n", "4", "--", worker_bin(), "lines", std::to_string(lines_per_rank)});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::regex whole(R"(\[rank (\d)\] rank=(\d) line=(\d+) (\d{300}) end)");
    std::map<int, int> next_line;
    std::istringstream in(r.out);
    int count = 0;
    for (std::string line; std::getline(in, line); ++count) {
        std::smatch m;
        REQUIRE_MESSAGE(std::regex_match(line, m, whole), "broken line: " << line.substr(0, 120));
        const int prefix_rank = std::stoi(m[1]);
        CHECK(prefix_rank == std::stoi(m[2]));
        CHECK(std::stoi(m[3]) == std::stoi(m[4]));
        CHECK(std::stoi(m[3]) == next_line[prefix_rank]);  // each rank's lines in order
        next_line[prefix_rank]++;
    }
    CHECK(count == 4 * lines_per_rank);
}

TEST_CASE("stderr lines are prefixed on stderr, and --no-prefix leaves lines bare") {
    LaunchResult r = run_launch({"-n", "2", "--", worker_bin(), "stderr-exit", "0"});
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.find("[rank 1] stderr line 15\n") != std::string::npos);
    CHECK(r.out.empty());
    LaunchResult bare = run_launch({"-n", "1", "--no-prefix", "--", worker_bin(), "stderr-exit", "0"});
    REQUIRE(bare.exit_code == 0);
    CHECK(bare.err.rfind("stderr line 1\n", 0) == 0);
    CHECK(bare.err.find("[rank") == std::string::npos);
}

TEST_CASE("a rank's last line without a newline is flushed when it exits") {
    LaunchResult r = run_launch({"-n", "1", "--", "sh", "-c", "printf 'no newline at the end'"});
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == "[rank 0] no newline at the end\n");
}

namespace {
long peak_rss_kb(pid_t pid) {
    std::istringstream status(read_file("/proc/" + std::to_string(pid) + "/status"));
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
    return -1;
}
}  // namespace

TEST_CASE("64 MB with no newline: the launcher's memory stays bounded and nothing is lost") {
    const long long bytes = 64LL << 20;
    Launch launch({"-n", "1", "--", worker_bin(), "bigline", std::to_string(bytes)});
    const pid_t pid = launch.pid();
    // Sample the launcher's peak RSS while it works, then collect the output.
    long peak = 0;
    LaunchResult r;
    std::thread sampler([&] {
        for (int i = 0; i < 400; ++i) {
            long kb = peak_rss_kb(pid);
            if (kb < 0) break;
            peak = std::max(peak, kb);
            usleep(2000);
        }
    });
    r = launch.wait(120);
    sampler.join();
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    std::size_t xs = 0;
    std::size_t pieces = 0;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
        if (line == "[rank 0] done") continue;
        REQUIRE(line.rfind("[rank 0] ", 0) == 0);
        CHECK(line.size() <= 9 + 64 * 1024);
        xs += line.size() - 9;
        ++pieces;
    }
    CHECK(xs == static_cast<std::size_t>(bytes));
    CHECK(pieces == static_cast<std::size_t>(bytes / (64 * 1024)));
    MESSAGE("launcher peak RSS while relaying 64 MB: " << peak << " kB");
    CHECK(peak > 0);
    CHECK(peak < 16 * 1024);
}

TEST_CASE("--local-ranks-filter shows only those local ranks' output, as torchrun's") {
    LaunchResult r =
        run_launch({"-n", "3", "--local-ranks-filter", "1", "--", "sh", "-c", "echo hello $LOCAL_RANK"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find("[rank 1] hello 1\n") != std::string::npos);
    CHECK(r.out.find("[rank 0]") == std::string::npos);
    CHECK(r.out.find("[rank 2]") == std::string::npos);
    // A hidden rank's failure is still reported, with its last lines.
    LaunchResult f = run_launch({"-n", "2", "--local-ranks-filter", "1", "--", "sh", "-c",
                                 "if [ $LOCAL_RANK = 0 ]; then echo broken >&2; exit 3; fi; sleep 5"});
    CHECK(f.exit_code != 0);
    CHECK_MESSAGE(f.err.find("broken") != std::string::npos, f.err);
}
