// A rank that dies or hangs in the middle of a collective: the others leave with exit code 75
// within the group's timeout instead of carrying on, and dp-launch books the unfinished prompts
// as not run. The dying rank is made by the worker's test-only DP_TEST_KILL_AT_STEP. A weight file
// that changes under a running rank (held by DP_TEST_KILL_AT_STEP's SIGSTOP while it changes)
// ends the job with 74 and the file named.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "integration/launch_harness.h"
#include "launcher/port.h"
#include "protocol/errors.h"
#include "protocol/job_file.h"
#include "protocol/status_events.h"
#include "support/test_paths.h"

using namespace dp::test;
using dp::protocol::StatusEvent;

namespace {

// A tp=2 job on the tiny model: each of its denoising steps calls all_reduce on the tp group.
std::string write_tp2_job(const std::string& dir, int steps, double timeout_s) {
    dp::protocol::JobFile job;
    job.model_dir = DP_TINY_MODEL;
    job.family = "sd3";
    job.output_dir = dir + "/out";
    mkdir(job.output_dir.c_str(), 0777);
    job.device = "cpu";
    job.mesh.tp = 2;
    job.collective_timeout_s = timeout_s;
    for (int i = 0; i < 2; ++i) {
        dp::protocol::JobRequest r;
        r.index = i;
        r.file = "0000" + std::to_string(i) + "-p.png";
        r.prompt = "prompt " + std::to_string(i);
        r.steps = steps;
        r.width = r.height = 16;
        job.requests.push_back(r);
    }
    const std::string path = dir + "/job.json";
    dp::protocol::write_job_file(path, job);
    return path;
}

std::vector<StatusEvent> events(const std::string& text) {
    std::vector<StatusEvent> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        if (auto e = dp::protocol::parse_status_line(line)) out.push_back(*e);
    return out;
}

template <typename T>
int count_of(const std::vector<StatusEvent>& events) {
    int n = 0;
    for (const StatusEvent& e : events) n += std::holds_alternative<T>(e);
    return n;
}

// The two ranks of a tp=2 job, started directly: no launcher stops rank 0 when rank 1 goes.
struct TwoRanks {
    dp::launcher::PortReservation port{"127.0.0.1"};
    std::vector<std::unique_ptr<DirectProcess>> ranks;

    TwoRanks(const std::string& dir, const std::string& job,
             const std::map<std::string, std::string>& extra) {
        for (int r = 0; r < 2; ++r) {
            std::map<std::string, std::string> env = {{"RANK", std::to_string(r)},
                                                      {"LOCAL_RANK", std::to_string(r)},
                                                      {"WORLD_SIZE", "2"},
                                                      {"MASTER_ADDR", "127.0.0.1"},
                                                      {"MASTER_PORT", std::to_string(port.port())},
                                                      {"DP_STATUS_FD", "3"}};
            env.insert(extra.begin(), extra.end());
            ranks.push_back(
                std::make_unique<DirectProcess>(std::vector<std::string>{DP_WORKER_BIN, "--job", job}, env,
                                                dir + "/rank" + std::to_string(r)));
        }
    }
};

}  // namespace

TEST_CASE("a rank killed in the middle of a collective: the other exits 75 within the group's timeout") {
    const std::string dir = make_temp_dir();
    const double timeout_s = 20;
    const std::string job = write_tp2_job(dir, 200, timeout_s);
    TwoRanks job_ranks(dir, job, {{"DP_TEST_KILL_AT_STEP", "1:5"}});
    DirectProcess& survivor = *job_ranks.ranks[0];
    DirectProcess& killed = *job_ranks.ranks[1];

    CHECK(killed.wait(120) == 128 + SIGKILL);
    const int code = survivor.wait(timeout_s + 30);
    const std::string err = survivor.stderr_text();
    CHECK_MESSAGE(code == dp::protocol::kExitCommunication, err);
    CHECK(survivor.exited_at() - killed.exited_at() < timeout_s + 5);
    // The survivor says why on its status channel, and books no prompt as failed.
    const std::vector<StatusEvent> seen = events(survivor.status_text());
    CHECK(count_of<dp::protocol::StartEvent>(seen) == 1);
    CHECK(count_of<dp::protocol::FailedEvent>(seen) == 0);
    CHECK(count_of<dp::protocol::ImageEvent>(seen) == 0);
    REQUIRE(!seen.empty());
    const auto* error = std::get_if<dp::protocol::RankErrorEvent>(&seen.back());
    REQUIRE_MESSAGE(error, survivor.status_text());
    CHECK(error->rank == 0);
    CHECK(error->exit_code == 75);
    // Names the collective: under tp a step's first is AdaLN's all_gather, then the all_reduces.
    CHECK_MESSAGE((error->message.find("all_gather") != std::string::npos ||
                   error->message.find("all_reduce") != std::string::npos),
                  error->message);
    CHECK(err.find("dp-worker: ") != std::string::npos);
    CHECK(processes_with_marker(survivor.marker()).empty());
    CHECK(processes_with_marker(killed.marker()).empty());
}

TEST_CASE("a rank that hangs: the other gives up after the group's timeout with exit code 75") {
    const std::string dir = make_temp_dir();
    const double timeout_s = 4;
    const std::string job = write_tp2_job(dir, 200, timeout_s);
    TwoRanks job_ranks(dir, job, {});
    DirectProcess& survivor = *job_ranks.ranks[0];
    DirectProcess& hung = *job_ranks.ranks[1];
    // Once rank 1 has joined the group (its start event), it stops answering.
    REQUIRE(
        wait_until([&] { return count_of<dp::protocol::StartEvent>(events(hung.status_text())) == 1; }, 60));
    kill(hung.pid(), SIGSTOP);
    const double stopped = monotonic_seconds();
    const int code = survivor.wait(timeout_s + 60);
    CHECK_MESSAGE(code == dp::protocol::kExitCommunication, survivor.stderr_text());
    const double waited = survivor.exited_at() - stopped;
    MESSAGE("rank 0 gave up " << waited << " s after rank 1 stopped, with a timeout of " << timeout_s
                              << " s");
    CHECK(waited > timeout_s - 0.5);  // it did wait for the timeout it was given
    CHECK(waited < timeout_s + 5);
    const std::vector<StatusEvent> seen = events(survivor.status_text());
    REQUIRE(!seen.empty());
    const auto* error = std::get_if<dp::protocol::RankErrorEvent>(&seen.back());
    REQUIRE(error);
    CHECK(error->exit_code == 75);
    CHECK(count_of<dp::protocol::FailedEvent>(seen) == 0);
}

TEST_CASE(
    "under dp-launch, a rank killed mid-job: its unfinished prompts are not run, and dp-launch exits "
    "with that rank's code") {
    const std::string dir = make_temp_dir();
    const std::string prompts = dir + "/p.txt";
    std::ofstream(prompts) << "first\nsecond\nthird\nfourth\n";
    // 4 steps a prompt: rank 1 dies in step 2 of the second prompt, after the first image.
    Launch launch({"--model", DP_TINY_MODEL, "--steps", "4", "--width", "16", "--height", "16", "-o",
                   dir + "/out", "-n", "2", "--tp", "2", prompts},
                  {{"DP_TEST_KILL_AT_STEP", "1:6"}});
    LaunchResult r = launch.wait(120);
    CHECK_MESSAGE(r.exit_code == 128 + SIGKILL, r.err);
    CHECK(r.err.find("rank 1 (pid") != std::string::npos);
    CHECK(r.err.find("job failed: rank 1 killed by SIGKILL") != std::string::npos);
    CHECK(r.out.find("dp-launch: 1 images, 0 failed, 0 invalid, 3 not run") == 0);
    std::vector<nlohmann::json> records;
    std::istringstream in(read_file(dir + "/out/manifest.jsonl"));
    for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    REQUIRE(records.size() == 4);
    CHECK(records[0]["status"] == "ok");
    for (std::size_t i = 1; i < 4; ++i) {
        CAPTURE(i);
        CHECK(records[i]["status"] == "not_run");
        CHECK_FALSE(records[i].contains("file"));
    }
    CHECK(processes_with_marker(launch.marker()).empty());
}

// Note [resource failures in a rank]: real rlimits and real threads.
TEST_CASE(
    "a rank out of file descriptors exits 71 naming the rank and the limit, and leaves no output folder") {
    const std::string dir = make_temp_dir();
    { std::ofstream(dir + "/p.txt") << "a cat\na dog\n"; }
    // The rank's own limit, soft and hard: dp-launch itself keeps its own.
    const std::string wrapper = dir + "/worker.sh";
    std::ofstream(wrapper) << "#!/bin/sh\nulimit -n 16\nexec '" << DP_WORKER_BIN << "' \"$@\"\n";
    chmod(wrapper.c_str(), 0755);
    const std::vector<std::string> job = {"-n", "2",          "--model",     DP_TINY_MODEL, "--steps",
                                          "2",  "--width",    "16",          "--height",    "16",
                                          "-o", dir + "/out", dir + "/p.txt"};
    std::vector<std::string> limited = job;
    limited.insert(limited.begin(), {"--worker", wrapper});
    const LaunchResult r = run_launch(limited, {}, 120);
    INFO(r.err);
    CHECK(r.exit_code == 71);
    CHECK(r.seconds < 30);  // not the store's timeout
    CHECK(r.err.find("the system refused file descriptors: the open-file limit (ulimit -n) is 16") !=
          std::string::npos);
    CHECK(r.err.find("dp-worker: rank ") != std::string::npos);
    CHECK(r.out.find("nothing written (the output folder is as it was before the job)") != std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out"));
    // The same command again, with the limit lifted, just runs.
    const LaunchResult again = run_launch(job, {}, 120);
    CHECK_MESSAGE(again.exit_code == 0, again.err);
}

TEST_CASE("a rank out of address space exits 71 naming the rank and the limit, never LibTorch's abort") {
    // SD3 medium's real sizes with random weights need far more than 6 GB; the libraries map
    // about 3.2 GB, so the rank starts and its first large allocation is refused. --force: the
    // memory guard would refuse the job first on a machine with less than its 29 GiB.
    const std::string dir = make_temp_dir();
    { std::ofstream(dir + "/p.txt") << "a cat\n"; }
    const std::string wrapper = dir + "/worker.sh";
    std::ofstream(wrapper) << "#!/bin/sh\nulimit -v 6000000\nexec '" << DP_WORKER_BIN << "' \"$@\"\n";
    chmod(wrapper.c_str(), 0755);
    const LaunchResult r =
        run_launch({"--worker", wrapper, "-n", "1", "--model", std::string(DP_MODELS_DIR) + "/sd3-medium",
                    "--random-weights", "1", "--force", "--steps", "1", "--width", "64", "--height", "64",
                    "-o", dir + "/out", dir + "/p.txt"},
                   {}, 240);
    INFO(r.err);
    CHECK(r.exit_code == 71);
    CHECK(r.err.find("rank 0: the system refused memory (RAM, or the address-space limit ulimit -v)") !=
          std::string::npos);
    CHECK(r.err.find("SIGABRT") == std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out"));
}

TEST_CASE("an exception escaping a rank's thread is reported with its exit code, never an abort") {
    const std::string dir = make_temp_dir();
    { std::ofstream(dir + "/p.txt") << "a cat\n"; }
    // An existing folder with a file of the user's: kept as it was, only the job's files go.
    mkdir((dir + "/out").c_str(), 0777);
    std::ofstream(dir + "/out/notes.txt") << "mine\n";
    for (const auto& [what, code, says] : std::vector<std::tuple<std::string, int, std::string>>{
             {"bad_alloc", 71,
              "rank 0: the system refused memory (RAM, or the address-space limit ulimit -v): "
              "std::bad_alloc"},
             {"runtime", 1, "rank 0: internal error: a library's thread failed"}}) {
        CAPTURE(what);
        const LaunchResult r = run_launch({"-n", "1", "--model", DP_TINY_MODEL, "--steps", "2", "--width",
                                           "16", "--height", "16", "-o", dir + "/out", dir + "/p.txt"},
                                          {{"DP_TEST_THREAD_THROWS", what}}, 120);
        INFO(r.err);
        CHECK(r.exit_code == code);
        CHECK(r.err.find(says) != std::string::npos);
        CHECK(r.err.find("terminate called") == std::string::npos);
        CHECK(file_exists(dir + "/out/notes.txt"));
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
        CHECK_FALSE(file_exists(dir + "/out/index.html"));
        CHECK_FALSE(file_exists(dir + "/out/.dp-lock"));
    }
}

TEST_CASE(
    "more ranks than the machine's memory holds are refused before anything starts, and --force starts "
    "them") {
    // Twice as many ranks as this machine's available memory holds at LibTorch's base alone, under
    // --dry-run, which checks what a job would start and starts nothing.
    long long available_kb = 0;
    {
        std::ifstream meminfo("/proc/meminfo");
        for (std::string line; std::getline(meminfo, line);)
            if (line.rfind("MemAvailable:", 0) == 0) available_kb = std::stoll(line.substr(13));
    }
    REQUIRE(available_kb > 0);
    const std::string ranks = std::to_string(available_kb / (191 * 1024) * 2 + 2);
    const std::string dir = make_temp_dir();
    { std::ofstream(dir + "/p.txt") << "a cat\n"; }
    const std::vector<std::string> job = {"-n",       ranks, "--dry-run", "--model",    DP_TINY_MODEL,
                                          "--device", "cpu", "-o",        dir + "/out", dir + "/p.txt"};
    const LaunchResult refused = run_launch(job, {}, 60);
    INFO(refused.err);
    CHECK(refused.exit_code == 2);
    CHECK(refused.err.find(ranks + " rank(s) on this machine would need about ") != std::string::npos);
    CHECK(refused.err.find("pass --force to start them anyway") != std::string::npos);
    CHECK_FALSE(file_exists(dir + "/out"));
    std::vector<std::string> forced = job;
    forced.insert(forced.begin(), "--force");
    const LaunchResult started = run_launch(forced, {}, 60);
    CHECK_MESSAGE(started.exit_code == 0, started.err);
    CHECK(started.out.find("over " + ranks + " rank(s)") != std::string::npos);
}

namespace {

// The file at `path` rewritten in place, the same size, a byte in its middle changed, until its
// modification time is not `was` (the clock that stamps files moves in ticks of a few ms).
void rewrite_in_place(const std::string& path, const timespec& was) {
    const double start = monotonic_seconds();
    for (;;) {
        const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        struct stat st {};
        REQUIRE(fstat(fd, &st) == 0);
        REQUIRE(pwrite(fd, "\x7f\x7f\x7f\x7f", 4, st.st_size / 2) == 4);
        REQUIRE(fstat(fd, &st) == 0);
        close(fd);
        if (st.st_mtim.tv_sec != was.tv_sec || st.st_mtim.tv_nsec != was.tv_nsec) return;
        REQUIRE(monotonic_seconds() - start < 5);
    }
}

}  // namespace

TEST_CASE("a weight file truncated or rewritten under a running job ends it with 74, naming the file") {
    // As the ranks name it (dp-launch resolves links).
    const std::string dir = std::filesystem::canonical(make_temp_dir()).string();
    REQUIRE(std::system(("cp -r '" + std::string(DP_TINY_MODEL) + "' '" + dir + "/sd3'").c_str()) == 0);
    const std::string gguf = dir + "/flux_q4_k.gguf";
    REQUIRE(std::system(
                ("cp '" + std::string(DP_GOLDEN_DIR) + "/gguf/flux_q4_k.gguf' '" + gguf + "'").c_str()) == 0);
    const std::string sd3_weights = dir + "/sd3/transformer/diffusion_pytorch_model.safetensors";
    const std::vector<std::string> sd3 = {"--model", dir + "/sd3"};
    const std::vector<std::string> kept = {"--model", std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev",
                                           "--transformer", gguf, "--keep-quantized"};
    struct Case {
        const char* name;
        std::vector<std::string> model;
        std::string file;
        bool truncate;     // else rewritten in place, the same size
        const char* says;  // after the file's path
    };
    const std::vector<Case> cases = {
        {"safetensors truncated", sd3, sd3_weights, true, " changed or was truncated while the job ran ("},
        {"safetensors rewritten in place", sd3, sd3_weights, false, " was rewritten while the job ran"},
        // Its blocks are read from the mapping at every use: the read past the new end is SIGBUS.
        {"kept-quantized GGUF truncated", kept, gguf, true,
         " changed or was truncated while the job ran (mapped at"},
    };
    { std::ofstream(dir + "/p.txt") << "a cat\na dog\na bird\n"; }
    for (const Case& c : cases) {
        CAPTURE(c.name);
        const std::string copy = c.file + ".copy";
        REQUIRE(std::system(("cp '" + c.file + "' '" + copy + "'").c_str()) == 0);
        struct stat before {};
        REQUIRE(stat(c.file.c_str(), &before) == 0);
        std::vector<std::string> args = c.model;
        const std::string out = dir + "/out_" + std::to_string(&c - cases.data());
        args.insert(args.end(), {"-n", "1", "--steps", "4", "--width", "16", "--height", "16", "-o", out,
                                 dir + "/p.txt"});
        // The rank stops itself after its second step; the file changes while it is stopped.
        Launch launch(args, {{"DP_TEST_KILL_AT_STEP", "0:2:" + std::to_string(SIGSTOP)}});
        const pid_t rank = stopped_process(launch.marker(), 120);
        REQUIRE(rank > 0);
        if (c.truncate)
            REQUIRE(truncate(c.file.c_str(), before.st_size / 2) == 0);
        else
            rewrite_in_place(c.file, before.st_mtim);
        kill(rank, SIGCONT);
        const LaunchResult r = launch.wait(120);
        INFO(r.err);
        CHECK(r.exit_code == 74);
        CHECK(r.err.find(c.file + c.says) != std::string::npos);
        CHECK(r.err.find("may succeed") == std::string::npos);
        CHECK(r.err.find("wrote nothing to stderr") == std::string::npos);
        // No image made from the changed file is recorded as made.
        CHECK(read_file(out + "/manifest.jsonl").find("\"status\":\"ok\"") == std::string::npos);
        REQUIRE(std::rename(copy.c_str(), c.file.c_str()) == 0);  // as it was, for the next case
    }
    std::filesystem::remove_all(dir);
}
