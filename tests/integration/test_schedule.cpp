// The dynamic schedule (Note [dynamic schedule], runtime/prompt_queue.h) against the static split,
// with real dp-launch and dp-worker processes over Gloo and the shipped shapes model at few steps:
// the same PNG bytes and the same manifest apart from `rank` and `ms`, for data parallelism at 1,
// 2 and 3 ranks and for replicas of cfg and ulysses pairs, over an uneven prompt file.
#include <doctest/doctest.h>

#include <csignal>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "launcher/port.h"

using namespace dp::test;

namespace {

// Ten prompts, three of them costlier (more steps, a larger size) and two of those near the start,
// so that the static split is uneven and the dynamic order differs from the file's.
std::string uneven_prompts(const std::string& dir) {
    const std::string path = dir + "/uneven.jsonl";
    std::ofstream out(path);
    const char* colours[] = {"red", "green", "blue", "yellow", "orange"};
    for (int i = 0; i < 10; ++i) {
        nlohmann::json p = {{"prompt", std::string("a ") + colours[i % 5] + (i % 2 ? " circle" : " square")}};
        if (i == 1 || i == 2) p["steps"] = 5;
        if (i == 6) p["width"] = 32, p["height"] = 32;  // the job's size is 16x16
        out << p.dump() << "\n";
    }
    return path;
}

// Each record by index, without what depends on who made it and how fast.
std::map<int64_t, nlohmann::json> comparable(const std::vector<nlohmann::json>& records) {
    std::map<int64_t, nlohmann::json> by_index;
    for (nlohmann::json r : records) {
        r.erase("rank");
        r.erase("ms");
        by_index[r.at("index").get<int64_t>()] = r;
    }
    return by_index;
}

}  // namespace

TEST_CASE(
    "dynamic and static schedules give byte-identical images and manifests at 1, 2, 3 ranks, cfg2 and "
    "ulysses2") {
    const std::string dir = make_temp_dir();
    const std::string prompts = uneven_prompts(dir);
    const std::vector<std::vector<std::string>> meshes = {
        {"-n", "1"}, {"-n", "2"}, {"-n", "3"}, {"-n", "4", "--cfg-parallel"}, {"-n", "4", "--ulysses", "2"}};
    for (const std::vector<std::string>& mesh : meshes) {
        std::string name;
        for (const std::string& a : mesh) name += a + " ";
        CAPTURE(name);
        std::map<std::string, std::map<int64_t, nlohmann::json>> manifest;  // by schedule
        std::map<std::string, std::string> out_dir;
        for (const std::string schedule : {"static", "dynamic"}) {
            const std::string out = dir + "/" + std::to_string(&mesh - meshes.data()) + schedule;
            std::vector<std::string> args = mesh;
            for (const char* a : {"--steps", "2", "--width", "16", "--height", "16", "--device", "cpu",
                                  "--schedule", schedule.c_str(), "-o", out.c_str(), prompts.c_str()})
                args.push_back(a);
            const LaunchResult r = run_leaving_nothing(args, {}, 240);
            REQUIRE_MESSAGE(r.exit_code == 0, r.err);
            // Several replicas: the start line names the schedule and why.
            if (mesh[1] != "1")
                CHECK(r.err.find("schedule " + schedule + " (--schedule " + schedule + ")") !=
                      std::string::npos);
            const std::vector<nlohmann::json> records = read_manifest(out);
            REQUIRE(records.size() == 10);
            std::set<int> ranks;
            for (const nlohmann::json& rec : records) {
                CHECK(rec.at("status") == "ok");
                ranks.insert(rec.at("rank").get<int>());
            }
            manifest[schedule] = comparable(records);
            out_dir[schedule] = out;
            if (schedule == "static" && mesh[1] == "2" && mesh.size() == 2)
                CHECK(ranks == std::set<int>{0, 1});
        }
        CHECK(manifest["static"] == manifest["dynamic"]);
        for (const auto& [index, rec] : manifest["static"]) {
            const std::string file = rec.at("file").get<std::string>();
            CAPTURE(file);
            CHECK(read_file(out_dir["static"] + "/" + file) == read_file(out_dir["dynamic"] + "/" + file));
        }
    }
}

TEST_CASE("--schedule auto is dynamic for uneven prompts over several replicas and static for even ones") {
    const std::string dir = make_temp_dir();
    const std::string uneven = uneven_prompts(dir);
    LaunchResult r = run_leaving_nothing(
        {"-n", "2", "--steps", "1", "--width", "16", "--height", "16", "-o", dir + "/a", uneven}, {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("schedule dynamic (auto: the prompts' estimated costs differ (32 to 160))") !=
          std::string::npos);
    std::ofstream(dir + "/even.txt") << "a red circle\na blue square\na green ring\n";
    r = run_leaving_nothing({"-n", "2", "--steps", "1", "-o", dir + "/b", dir + "/even.txt"}, {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("schedule static (auto: every prompt has the same estimated cost)") !=
          std::string::npos);
    // plan over the same file: each schedule's makespan in cost units and auto's pick.
    r = run_launch({"plan", "-n", "2", "--steps", "1", "--width", "16", "--height", "16", uneven});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find("schedules: 10 prompt(s) of " + uneven + " over 2 model replica(s)") !=
          std::string::npos);
    CHECK(r.out.find("  runs: schedule dynamic (auto: ") != std::string::npos);
    r = run_launch({"plan", "-n", "2", "--steps", "1", "--width", "16", "--height", "16", uneven, "--json"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const nlohmann::json schedules = nlohmann::json::parse(r.out)["schedules"];
    CHECK(schedules["prompts"] == 10);
    CHECK(schedules["runs"] == "dynamic");
    CHECK(schedules["dynamic"].get<long long>() <= schedules["static"].get<long long>());
    CHECK(schedules["ideal"].get<double>() * 2 == schedules["total"].get<double>());
}

TEST_CASE("under the dynamic schedule a rank killed mid-job leaves every prompt made once or not run") {
    const std::string dir = make_temp_dir();
    const std::string prompts = uneven_prompts(dir);
    // Rank 1 dies in the middle of its second prompt (2 steps each, 5 for the costly ones).
    Launch launch({"-n", "2", "--steps", "2", "--width", "16", "--height", "16", "--schedule", "dynamic",
                   "--device", "cpu", "-o", dir + "/out", prompts},
                  {{"DP_TEST_KILL_AT_STEP", "1:7"}});
    const LaunchResult r = launch.wait(120);
    CHECK_MESSAGE(r.exit_code == 128 + SIGKILL, r.err);
    const std::vector<nlohmann::json> records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 10);
    int ok = 0, not_run = 0;
    for (const nlohmann::json& rec : records) {
        const std::string status = rec.at("status");
        CAPTURE(rec.dump());
        CHECK((status == "ok" || status == "not_run"));
        ok += status == "ok";
        not_run += status == "not_run";
        CHECK(rec.contains("file") == (status == "ok"));
    }
    CHECK(ok >= 1);
    CHECK(not_run >= 1);
    CHECK(processes_with_marker(launch.marker()).empty());

    // --resume queues only what is missing; the images are a static run's.
    const LaunchResult again =
        run_leaving_nothing({"-n", "2", "--steps", "2", "--width", "16", "--height", "16", "--schedule",
                             "dynamic", "--device", "cpu", "--resume", "-o", dir + "/out", prompts},
                            {}, 120);
    REQUIRE_MESSAGE(again.exit_code == 0, again.err);
    CHECK(again.out.find("dp-launch: 10 images, 0 failed, 0 invalid, 0 not run") == 0);
    CHECK(again.out.find("(" + std::to_string(ok) + " kept from the earlier run)") != std::string::npos);
    const LaunchResult whole = run_leaving_nothing({"-n", "1", "--steps", "2", "--width", "16", "--height",
                                                    "16", "--device", "cpu", "-o", dir + "/static", prompts},
                                                   {}, 120);
    REQUIRE_MESSAGE(whole.exit_code == 0, whole.err);
    const auto resumed = comparable(read_manifest(dir + "/out"));
    const auto reference = comparable(read_manifest(dir + "/static"));
    REQUIRE(resumed.size() == reference.size());
    for (const auto& [index, rec] : reference) {
        CAPTURE(index);
        CHECK(resumed.at(index).at("sha256") == rec.at("sha256"));
    }
}

TEST_CASE(
    "two nodes under the dynamic schedule take from one queue: each prompt once, with a one-node run's "
    "image") {
    const std::string dir = make_temp_dir();
    const std::string prompts = uneven_prompts(dir);
    const std::vector<std::string> job = {"--steps",  "2",   "--width",        "16", "--height", "16",
                                          "--device", "cpu", "--node-timeout", "4",  prompts};
    std::vector<std::string> one = {"-n", "1", "-o", dir + "/one"};
    one.insert(one.end(), job.begin(), job.end());
    const LaunchResult reference = run_leaving_nothing(one, {}, 120);
    REQUIRE_MESSAGE(reference.exit_code == 0, reference.err);
    const dp::launcher::PortReservation reserved("127.0.0.2");
    const auto node = [&](int k) {
        std::vector<std::string> args = {"-n",
                                         "2",
                                         "--nnodes",
                                         "2",
                                         "--node-rank",
                                         std::to_string(k),
                                         "--master-addr",
                                         "127.0.0.2",
                                         "--master-port",
                                         std::to_string(reserved.port()),
                                         "--local-addr",
                                         k == 0 ? "127.0.0.2" : "127.0.0.3",
                                         "--schedule",
                                         "dynamic",
                                         "-o",
                                         dir + "/out"};
        args.insert(args.end(), job.begin(), job.end());
        return args;
    };
    Launch node1(node(1));
    Launch node0(node(0));
    const LaunchResult r0 = node0.wait(240), r1 = node1.wait(240);
    REQUIRE_MESSAGE(r0.exit_code == 0, r0.err);
    REQUIRE_MESSAGE(r1.exit_code == 0, r1.err);
    CHECK(r0.out.find("dp-launch: 10 images, 0 failed, 0 invalid, 0 not run") == 0);
    for (const LaunchResult* r : {&r0, &r1})
        CHECK(r->err.find("schedule dynamic (--schedule dynamic)") != std::string::npos);
    const auto made = comparable(read_manifest(dir + "/out"));
    const auto expected = comparable(read_manifest(dir + "/one"));
    REQUIRE(made.size() == 10);
    for (const auto& [index, rec] : expected) {
        CAPTURE(index);
        CHECK(made.at(index).at("status") == "ok");
        CHECK(made.at(index).at("sha256") == rec.at("sha256"));
    }
    CHECK(processes_with_marker(node0.marker()).empty());
    CHECK(processes_with_marker(node1.marker()).empty());
}
