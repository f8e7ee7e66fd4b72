// Every rank of a job agrees on the job before loading anything (Note [one job on every node]):
// ranks as threads over an in-process store, each given its own job file as each node's
// dp-launch writes it.
#include "unit/doctest_torch.h"

#include <atomic>
#include <mutex>
#include <set>

#include "protocol/errors.h"
#include "protocol/status_events.h"
#include "runtime/job_agreement.h"
#include "unit/ranks_as_threads.h"

using dp::protocol::JobFile;
using dp::protocol::JobRequest;

namespace {

JobFile job_for(const std::string& job_id) {
    JobFile job;
    job.model_dir = "/models/tiny";
    job.family = "sd3";
    job.output_dir = "/shared/out";
    job.mesh = {3, 1, 1, 1, 1};
    job.job_id = job_id;
    for (int i = 0; i < 5; ++i) {
        JobRequest r;
        r.index = i;
        r.file = "img" + std::to_string(i) + ".png";
        r.prompt = "prompt " + std::to_string(i);
        r.seed = static_cast<uint64_t>(i);
        job.requests.push_back(r);
    }
    return job;
}

// Runs 3 ranks, rank r with jobs[r]; returns each rank's result or error text.
std::vector<std::string> agree(const std::vector<JobFile>& jobs) {
    std::vector<std::string> out(jobs.size());
    dp::test::run_ranks(static_cast<int>(jobs.size()), [&](int rank, dp::runtime::Communicator& comm) {
        try {
            out[static_cast<std::size_t>(rank)] =
                "id " + dp::runtime::agree_on_job(jobs[static_cast<std::size_t>(rank)], comm);
        } catch (const dp::protocol::UsageError& e) {
            out[static_cast<std::size_t>(rank)] = std::string("usage: ") + e.what();
        }
    });
    return out;
}

}  // namespace

TEST_CASE("ranks with one job agree on rank 0's launcher's job id, whatever their own ids") {
    const auto out = agree({job_for("node0-1"), job_for("node0-1"), job_for("node1-7")});
    for (const std::string& r : out) CHECK(r == "id node0-1");
}

TEST_CASE("a rank with another setting makes every rank refuse, naming the rank and the setting") {
    std::vector<JobFile> jobs = {job_for("a"), job_for("a"), job_for("b")};
    jobs[2].dtype = "bf16";
    for (const std::string& r : agree(jobs)) {
        CAPTURE(r);
        CHECK(r.rfind("usage: rank 2 (node ", 0) == 0);
        CHECK(r.find("dtype \"bf16\" there, \"auto\" on rank 0") != std::string::npos);
        CHECK(r.find("Start every node with the same prompt file") != std::string::npos);
    }
}

TEST_CASE("a rank with other prompts (one changed, one missing) makes every rank refuse, with the counts") {
    std::vector<JobFile> changed = {job_for("a"), job_for("a"), job_for("b")};
    changed[1].requests[3].seed = 99;
    for (const std::string& r : agree(changed)) {
        CAPTURE(r);
        CHECK(r.find("usage: rank 1 ") == 0);
        // Named by field: the seeds differ (the first prompt's are the same, so no values shown).
        CHECK(r.find("its prompts differ in seed (5 to make") != std::string::npos);
    }
    // Other steps on a node (--steps): named, with the first prompt's values.
    std::vector<JobFile> steps = {job_for("a"), job_for("a"), job_for("b")};
    const int other = steps[0].requests[0].steps + 3;
    for (JobRequest& q : steps[2].requests) q.steps = other;
    for (const std::string& r : agree(steps)) {
        CAPTURE(r);
        CHECK(r.find("its prompts differ in steps (first prompt: " + std::to_string(other) + " there, " +
                     std::to_string(steps[0].requests[0].steps) + " on rank 0)") != std::string::npos);
    }
    std::vector<JobFile> fewer = {job_for("a"), job_for("a"), job_for("b")};
    fewer[2].requests.pop_back();
    for (const std::string& r : agree(fewer)) CHECK(r.find("(4 to make") != std::string::npos);
    // The output folder counts too: every node must write into the same one.
    std::vector<JobFile> elsewhere = {job_for("a"), job_for("a"), job_for("b")};
    elsewhere[2].output_dir = "/local/out";
    for (const std::string& r : agree(elsewhere)) CHECK(r.find("output_dir") != std::string::npos);
}

TEST_CASE("the joined event carries the job id through its one serialisation") {
    const dp::protocol::StatusEvent e = dp::protocol::JoinedEvent{4, "host-12-34"};
    const auto back = dp::protocol::parse_status_line(dp::protocol::status_line(e));
    REQUIRE(back);
    const auto& joined = std::get<dp::protocol::JoinedEvent>(*back);
    CHECK(joined.rank == 4);
    CHECK(joined.job_id == "host-12-34");
    CHECK_THROWS_AS(dp::protocol::parse_status_line(R"({"event":"joined","rank":1})"),
                    dp::protocol::InputDataError);
}
