// The main job over several dp-launch processes on one machine, as nodes of a cluster would run
// it: two launchers on the loopback addresses 127.0.0.2 and 127.0.0.3 (or one per rank under
// simulated Slurm), one shared output folder. They must give one result: the same exit code, one
// manifest listing every prompt, one gallery, and the images of a one-node run
// (Note [one job, several launchers]).
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "launcher/port.h"
#include "support/test_paths.h"

using namespace dp::test;

namespace {

constexpr int kPrompts = 10;

std::string prompt_file(const std::string& dir) {
    std::string text;
    for (int i = 0; i < kPrompts; ++i) text += "a prompt for node test " + std::to_string(i) + "\n";
    const std::string path = dir + "/prompts.txt";
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

std::vector<std::string> job_args(const std::string& out, const std::string& prompts,
                                  const std::string& steps = "2") {
    return {"--model",  DP_TINY_MODEL, "--device",       "cpu", "--steps", steps, "--width", "16",
            "--height", "16",          "--node-timeout", "4",   "-o",      out,   prompts};
}

std::vector<std::string> with(std::vector<std::string> head, const std::vector<std::string>& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
}

// Node `node` of a two-node job whose rank 0 listens on 127.0.0.2:port.
std::vector<std::string> node_args(int node, int port, const std::vector<std::string>& job) {
    return with(
        {"-n", "2", "--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr", "127.0.0.2",
         "--master-port", std::to_string(port), "--local-addr", node == 0 ? "127.0.0.2" : "127.0.0.3"},
        job);
}

// A one-node run of the same prompts: the images every layout must reproduce.
std::map<int64_t, std::string> one_node_images(const std::string& dir, const std::string& prompts,
                                               const std::string& steps = "2") {
    const std::string out = dir + "/one-node";
    const LaunchResult r = run_launch(with({"-n", "1", "-q"}, job_args(out, prompts, steps)), {}, 240);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    std::map<int64_t, std::string> sha;
    for (const nlohmann::json& rec : read_manifest(out))
        sha[rec.at("index").get<int64_t>()] = rec.value("sha256", "");
    REQUIRE(sha.size() == kPrompts);
    return sha;
}

// One manifest with every prompt once, made, with the one-node run's images, and one gallery;
// `world` ranks made them (0: not checked).
void check_one_result(const std::string& out, const std::map<int64_t, std::string>& expected, int world) {
    const std::vector<nlohmann::json> records = read_manifest(out);
    std::set<int64_t> seen;
    std::set<int> ranks;
    for (const nlohmann::json& rec : records) {
        CAPTURE(rec.dump());
        const int64_t index = rec.at("index").get<int64_t>();
        CHECK(seen.insert(index).second);
        CHECK(rec.value("status", "") == "ok");
        CHECK(rec.value("sha256", "") == expected.at(index));
        ranks.insert(rec.value("rank", -1));
        const std::string file = out + "/" + rec.value("file", "?");
        CHECK_MESSAGE(max_pixel_difference(file, out + "/../one-node/" + rec.value("file", "?")) == 0, file);
    }
    CHECK(seen.size() == kPrompts);
    if (world > 0) CHECK(static_cast<int>(ranks.size()) == world);  // every rank made some
    const std::string gallery = read_file(out + "/index.html");
    for (const nlohmann::json& rec : records)
        CHECK_MESSAGE(gallery.find(rec.value("file", "?")) != std::string::npos, rec.value("file", "?"));
}

// Slurm's variables for task `procid` of `ntasks` over 2 nodes of the loopback addresses.
std::map<std::string, std::string> slurm_task(const std::string& job_id, int procid, int per_node) {
    return {{"SLURM_JOB_ID", job_id},
            {"SLURM_STEP_ID", "0"},
            {"SLURM_NNODES", "2"},
            {"SLURM_NODEID", std::to_string(procid / per_node)},
            {"SLURM_PROCID", std::to_string(procid)},
            {"SLURM_LOCALID", std::to_string(procid % per_node)},
            {"SLURM_NTASKS", std::to_string(2 * per_node)},
            {"SLURM_TASKS_PER_NODE", std::to_string(per_node) + "(x2)"},
            {"SLURM_JOB_NODELIST", "127.0.0.[2-3]"}};
}

// A port kept free for the test's job (rank 0's store may still bind it: Note [port reservation]).
dp::launcher::PortReservation reserve() { return dp::launcher::PortReservation("127.0.0.2"); }

// A reserved port that a Slurm job id derives (20000 + id % 20000 is below 40000), and that id.
std::pair<dp::launcher::PortReservation, std::string> reserve_for_slurm() {
    for (int tries = 0; tries < 200; ++tries) {
        dp::launcher::PortReservation r = reserve();
        if (r.port() >= 20000 && r.port() < 40000) {
            const std::string id = std::to_string(20000 * 7 + r.port() - 20000);
            return {std::move(r), id};
        }
    }
    FAIL("no ephemeral port below 40000 in 200 tries");
    return {};
}

// Whether node `k`'s dp-launch has recorded an image in the shared folder.
bool node_recorded_image(const std::string& out, int k) {
    const std::string root = out + "/.dp-nodes";
    DIR* d = opendir(root.c_str());
    if (!d) return false;
    std::vector<std::string> runs;
    while (const dirent* e = readdir(d)) runs.push_back(e->d_name);
    closedir(d);
    for (const std::string& run : runs)
        if (read_file(root + "/" + run + "/launcher-" + std::to_string(k) + ".jsonl").find("\"ok\"") !=
            std::string::npos)
            return true;
    return false;
}

// One job of `tasks` simulated Slurm tasks, `per_node` to each of two nodes, each a dp-launch with
// `head` before the job's arguments: every task exits 0 and passes `check` (given the job id), and
// the job makes one node's images, once.
template <class Check>
void run_slurm_job(int tasks, int per_node, const std::vector<std::string>& head, Check check) {
    const std::string dir = make_temp_dir();
    const std::string prompts = prompt_file(dir);
    const auto expected = one_node_images(dir, prompts);
    const std::string out = dir + "/out";
    const auto [reserved, job_id] = reserve_for_slurm();
    std::vector<std::unique_ptr<Launch>> launches;
    for (int procid = 0; procid < tasks; ++procid)
        launches.push_back(std::make_unique<Launch>(with(head, job_args(out, prompts)),
                                                    slurm_task(job_id, procid, per_node)));
    for (auto& l : launches) {
        const LaunchResult r = l->wait(240);
        CHECK_MESSAGE(r.exit_code == 0, r.err);
        check(r, job_id);
    }
    check_one_result(out, expected, 4);
}

}  // namespace

TEST_CASE(
    "two nodes on 127.0.0.2 and 127.0.0.3 with 2 ranks each: both exit 0 with one manifest and gallery") {
    const std::string dir = make_temp_dir();
    const std::string prompts = prompt_file(dir);
    const auto expected = one_node_images(dir, prompts);
    const std::string out = dir + "/out";
    const auto reserved = reserve();
    const int port = reserved.port();
    Launch node1(node_args(1, port, job_args(out, prompts)));
    Launch node0(node_args(0, port, job_args(out, prompts)));
    const LaunchResult r0 = node0.wait(240), r1 = node1.wait(240);
    REQUIRE_MESSAGE(r0.exit_code == 0, r0.err);
    REQUIRE_MESSAGE(r1.exit_code == 0, r1.err);
    check_one_result(out, expected, 4);
    // Both print the job's one summary line: every prompt of the job, not the node's half.
    for (const LaunchResult* r : {&r0, &r1})
        CHECK_MESSAGE(
            r->out.find("dp-launch: 10 images, 0 failed, 0 invalid, 0 not run") != std::string::npos, r->out);
    CHECK(processes_with_marker(node0.marker()).empty());
    CHECK(processes_with_marker(node1.marker()).empty());
}

TEST_CASE("simulated Slurm, one dp-launch per node (srun --ntasks-per-node=1): one result") {
    run_slurm_job(2, 1, {"-n", "2"}, [](const LaunchResult& r, const std::string& job_id) {
        CHECK_MESSAGE(r.err.find("dp-launch: Slurm job " + job_id) != std::string::npos, r.err);
    });
}

TEST_CASE("simulated Slurm, one dp-launch per rank (srun --ntasks-per-node=2): one result") {
    run_slurm_job(4, 2, {}, [](const LaunchResult& r, const std::string&) {
        CHECK_MESSAGE(r.out.find("dp-launch: 10 images, 0 failed") != std::string::npos, r.out);
    });
}

TEST_CASE(
    "a node killed mid-job: the survivor names the prompts not run, and --resume on both completes them") {
    const std::string dir = make_temp_dir();
    const std::string prompts = prompt_file(dir);
    const std::string out = dir + "/out";
    const std::string steps = "30";  // ~150 ms an image: node 1 is killed between its images
    const auto expected = one_node_images(dir, prompts, steps);
    {
        const auto reserved = reserve();
        const int port = reserved.port();
        Launch node1(node_args(1, port, job_args(out, prompts, steps)));
        Launch node0(node_args(0, port, job_args(out, prompts, steps)));
        // Node 1 has recorded an image of its share, and has more to make.
        REQUIRE(wait_until([&] { return node_recorded_image(out, 1); }, 120));
        node1.signal(SIGKILL);
        const LaunchResult r0 = node0.wait(240);
        node1.wait(30);
        CHECK_MESSAGE(r0.exit_code == 75, r0.err);
        CHECK_MESSAGE(r0.err.find("node 1 wrote nothing") != std::string::npos, r0.err);
        // Every prompt has its record; the lost node's unmade ones say so.
        const std::vector<nlohmann::json> records = read_manifest(out);
        CHECK(records.size() == kPrompts);
        int not_run = 0;
        for (const nlohmann::json& rec : records)
            if (rec.value("status", "") == "not_run") {
                ++not_run;
                CHECK_MESSAGE(rec.value("error", "").find("node 1 lost") != std::string::npos, rec.dump());
            }
        CHECK(not_run > 0);
        CHECK(processes_with_marker(node0.marker()).empty());
        CHECK(processes_with_marker(node1.marker()).empty());
    }
    // Both nodes again with --resume: only the missing images are made.
    const auto reserved = reserve();
    const int port = reserved.port();
    Launch node1(node_args(1, port, with({"--resume"}, job_args(out, prompts, steps))));
    Launch node0(node_args(0, port, with({"--resume"}, job_args(out, prompts, steps))));
    const LaunchResult r0 = node0.wait(240), r1 = node1.wait(240);
    REQUIRE_MESSAGE(r0.exit_code == 0, r0.err);
    REQUIRE_MESSAGE(r1.exit_code == 0, r1.err);
    CHECK_MESSAGE(r0.out.find("kept from the earlier run") != std::string::npos, r0.out);
    check_one_result(out, expected, 0);
}

TEST_CASE("a node started with other settings than node 0 is refused on every node before any model loads") {
    const std::string dir = make_temp_dir();
    const std::string prompts = prompt_file(dir);
    const std::string out = dir + "/out";
    const auto reserved = reserve();
    const int port = reserved.port();
    Launch node1(node_args(1, port, job_args(out, prompts, "3")));
    Launch node0(node_args(0, port, job_args(out, prompts, "2")));
    const LaunchResult r0 = node0.wait(120), r1 = node1.wait(120);
    for (const LaunchResult* r : {&r0, &r1}) {
        CHECK_MESSAGE(r->exit_code == 2, r->err);
        CHECK_MESSAGE(r->err.find("was started with another job than rank 0") != std::string::npos, r->err);
        // Steps are per prompt: named as the prompts' field that differs, with both values.
        CHECK_MESSAGE(r->err.find("its prompts differ in steps (first prompt: 3 there, 2 on rank 0)") !=
                          std::string::npos,
                      r->err);
        CHECK(r->err.find("loading") == std::string::npos);
    }
    // No image was made.
    for (const nlohmann::json& rec : read_manifest(out)) CHECK(rec.value("status", "") != "ok");
}

TEST_CASE("a node that never starts is named within --node-timeout, from either side") {
    const std::string dir = make_temp_dir();
    const std::string prompts = prompt_file(dir);
    const auto reserved = reserve();
    const int port = reserved.port();
    // Node 0 alone: its rank 0 waits for ranks 2 and 3 (node 1) for --node-timeout 4, then names them.
    {
        Launch node0(node_args(0, port, job_args(dir + "/out0", prompts)));
        const LaunchResult r = node0.wait(120);
        INFO(r.err);
        CHECK(r.exit_code == 75);
        CHECK(r.seconds < 4 + 20);  // not the collective timeout (300 s)
        CHECK(r.err.find("2 of 4 ranks never joined the job's store at 127.0.0.2:" + std::to_string(port) +
                         " within 4 s (--node-timeout): rank(s) 2, 3, on node(s) 1") != std::string::npos);
    }
    // Node 1 alone: its ranks find no store for --node-timeout.
    {
        Launch node1(node_args(1, port, job_args(dir + "/out1", prompts)));
        const LaunchResult r = node1.wait(120);
        INFO(r.err);
        CHECK(r.exit_code == 75);
        CHECK(r.seconds < 4 + 20);
        CHECK(r.err.find("could not join the job's gloo group through the store at 127.0.0.2:" +
                         std::to_string(port) + " within 4 s (--node-timeout)") != std::string::npos);
    }
}
