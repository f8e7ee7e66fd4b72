// dp-launch serve's pieces without a server: the job database (order, restart, cancel), which
// words of the command line each job's dp-launch takes, the flags, the key check, the image names
// a request may fetch. tests/scripts/serve_check.sh runs the server itself.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "cli/serve_command.h"
#include "serve/http_api.h"
#include "serve/job_store.h"
#include "serve/run_records.h"
#include "serve/server.h"

using namespace dp;
using serve::JobState;

namespace {

std::string temp_root() {
    char tmpl[] = "/tmp/dp-serve-unit-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    return tmpl;
}

cli::EnvLookup env_of(const std::map<std::string, std::string>& vars) {
    return [vars](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    };
}

}  // namespace

TEST_CASE("the job database claims jobs oldest first, survives a reopen, and queues a killed run first") {
    const std::string root = temp_root();
    const std::string db = root + "/jobs.sqlite3";
    std::string first, second, third;
    {
        serve::JobStore store(db);
        first = store.add("jobs", "{\"prompt\": \"a\"}\n", 1, 1).id;
        second = store.add("generations", "{\"prompt\": \"b\", \"num_images_per_prompt\": 2}\n", 1, 2).id;
        third = store.add("jobs", "{\"prompt\": \"c\"}\n", 1, 1).id;
        CHECK(first == "job-000001");
        CHECK(store.queue_position(first) == 0);
        CHECK(store.queue_position(third) == 2);
        CHECK(store.active() == 3);
        const auto claimed = store.claim_next();
        REQUIRE(claimed);
        CHECK(claimed->id == first);
        CHECK(claimed->state == JobState::kRunning);
        CHECK(claimed->attempts == 1);
        CHECK(store.queue_position(first) == -1);
        CHECK(store.queue_position(second) == 0);
        // the server is killed here: `first` stays running in the file
    }
    serve::JobStore store(db);
    CHECK(store.body(second) == "{\"prompt\": \"b\", \"num_images_per_prompt\": 2}\n");
    CHECK(store.get(second)->images == 2);
    CHECK(store.requeue_running() == 1);
    // The interrupted job goes first, ahead of those queued before the kill.
    CHECK(store.queue_position(first) == 0);
    CHECK(store.queue_position(second) == 1);
    const auto again = store.claim_next();
    REQUIRE(again);
    CHECK(again->id == first);
    CHECK(again->attempts == 2);
    store.finish(first, JobState::kDone, 0, "");
    CHECK(store.get(first)->state == JobState::kDone);
    CHECK(store.get(first)->finished > 0);
    // Cancel: a queued job at once, a running one marked for the runner, a finished one refused.
    CHECK(store.cancel(third));
    CHECK(store.get(third)->state == JobState::kCancelled);
    const auto running = store.claim_next();
    REQUIRE(running);
    CHECK(running->id == second);
    CHECK(store.cancel(second));
    CHECK(store.get(second)->state == JobState::kRunning);
    CHECK(store.get(second)->cancel_requested);
    CHECK_FALSE(store.cancel(first));
    CHECK_FALSE(store.claim_next());
    const std::map<JobState, int64_t> counts = store.counts();
    CHECK(counts.at(JobState::kDone) == 1);
    CHECK(counts.at(JobState::kRunning) == 1);
    CHECK(counts.at(JobState::kCancelled) == 1);
    CHECK(counts.at(JobState::kQueued) == 0);
    // Ids are spelled one way; anything else is no job.
    for (const char* other : {"job-1", "job-0000001", "job-00000x", "../job-000001", "", "job-"})
        CHECK_FALSE(store.get(other));
    std::system(("rm -rf " + root).c_str());
}

TEST_CASE("a file that is not a job database is refused with its name") {
    const std::string root = temp_root();
    std::ofstream(root + "/jobs.sqlite3")
        << "this is not SQLite, but long enough to look at its header......";
    try {
        serve::JobStore store(root + "/jobs.sqlite3");
        FAIL("a text file was opened as the job database");
    } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()).find(root + "/jobs.sqlite3") != std::string::npos);
    }
    std::system(("rm -rf " + root).c_str());
}

TEST_CASE("each job's dp-launch takes serve's launch and pipeline words, not serve's own, -o or -q") {
    struct Case {
        std::vector<std::string> given;
        std::vector<std::string> job;
    };
    const std::vector<Case> cases = {
        {{"serve", "-n", "2", "--model", "m", "--port", "0", "-o", "root"}, {"-n", "2", "--model", "m"}},
        {{"-n", "2", "serve", "--host=0.0.0.0", "--api-key", "k", "--output-dir=r", "--steps", "4", "-q"},
         {"-n", "2", "--steps", "4"}},
        {{"serve", "--max-queue", "3", "--max-prompts=9", "-oroot", "--ulysses", "2", "--quiet", "--tp", "2"},
         {"--ulysses", "2", "--tp", "2"}},
        {{"serve", "--output_dir", "r", "--max-image-side", "512", "--request-timeout", "5", "--dtype",
          "fp32"},
         {"--dtype", "fp32"}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.given);
        std::string problem;
        CHECK(cli::job_args_for_serve(c.given, problem) == c.job);
        CHECK(problem.empty());
    }
    for (const char* refused : {"--resume", "--overwrite", "--dry-run"}) {
        std::string problem;
        cli::job_args_for_serve({"serve", refused}, problem);
        CHECK(problem.find(refused) != std::string::npos);
    }
}

TEST_CASE("serve's flags: flag over DP_* twin over default, each range refused with what is accepted") {
    serve::ServeOptions o;
    cli::ServeFlags flags;
    CHECK(cli::serve_options_from(flags, env_of({}), o).empty());
    CHECK(o.host == "127.0.0.1");
    CHECK(o.port == serve::kDefaultPort);
    CHECK(o.api_key.empty());
    flags.port = "9001";
    CHECK(cli::serve_options_from(flags, env_of({{"DP_SERVE_PORT", "9002"}, {"DP_API_KEY", "abc"}}), o)
              .empty());
    CHECK(o.port == 9001);
    CHECK(o.api_key == "abc");
    const std::vector<std::pair<std::string, std::string>> bad_env = {
        {"DP_SERVE_PORT", "65536"},  {"DP_MAX_QUEUE", "0"},         {"DP_MAX_PROMPTS", "-1"},
        {"DP_MAX_IMAGES", "x"},      {"DP_MAX_REQUEST_BYTES", "0"}, {"DP_MAX_IMAGE_SIDE", "8"},
        {"DP_REQUEST_TIMEOUT", "-3"}};
    for (const auto& [name, value] : bad_env) {
        CAPTURE(name);
        serve::ServeOptions out;
        const std::string why = cli::serve_options_from(cli::ServeFlags{}, env_of({{name, value}}), out);
        CHECK(why.find(name) != std::string::npos);
    }
    serve::ServeOptions out;
    CHECK(cli::serve_options_from(cli::ServeFlags{}, env_of({{"DP_API_KEY", "a b"}}), out)
              .find("white space") != std::string::npos);
}

TEST_CASE("serve on the command line: its refusals are usage errors before anything starts") {
    const cli::EnvLookup none = env_of({});
    const cli::CommandLine ok = cli::parse_command_line({"serve", "--port", "0", "-n", "2"}, none);
    CHECK(ok.action == cli::CommandLine::Action::kServe);
    CHECK(ok.serve.port == 0);
    CHECK(ok.serve.job_args == std::vector<std::string>{"-n", "2"});
    for (const std::vector<std::string>& bad : {std::vector<std::string>{"serve", "prompts.txt"},
                                                {"serve", "--prompt", "a cat"},
                                                {"serve", "--resume"},
                                                {"serve", "--port", "x"},
                                                {"serve", "--", "./prog"}}) {
        CAPTURE(bad);
        const cli::CommandLine r = cli::parse_command_line(bad, none);
        CHECK(r.action == cli::CommandLine::Action::kFail);
        CHECK(r.exit_code == 2);
    }
}

TEST_CASE("a request may fetch only the images its job's records name, by plain name") {
    const std::vector<nlohmann::json> records = {{{"file", "00000-a-cat.png"}, {"status", "ok"}},
                                                 {{"file", "00001-a-dog.png"}, {"status", "failed"}},
                                                 {{"index", 2}, {"status", "invalid"}}};
    CHECK(serve::is_recorded_image(records, "00000-a-cat.png"));
    for (const char* no : {"00001-a-dog.png", "manifest.jsonl", "../jobs.sqlite3", ".serve.lock", "",
                           "00000-a-cat.png/..", "a b.png", "%2e%2e"})
        CHECK_FALSE(serve::is_recorded_image(records, no));
}

TEST_CASE("the API key is compared whole, and loopback is 127/8, ::1 and localhost") {
    CHECK(serve::key_matches("", ""));
    CHECK(serve::key_matches("", "anything"));
    CHECK(serve::key_matches("k3y", "k3y"));
    CHECK_FALSE(serve::key_matches("k3y", ""));
    CHECK_FALSE(serve::key_matches("k3y", "k3"));
    CHECK_FALSE(serve::key_matches("k3y", "k3yy"));
    CHECK_FALSE(serve::key_matches("k3y", "K3Y"));
    for (const char* yes : {"127.0.0.1", "127.1.2.3", "::1", "localhost"})
        CHECK(serve::is_loopback_host(yes));
    for (const char* no : {"0.0.0.0", "10.0.0.1", "::", "128.0.0.1", "example.com", ""})
        CHECK_FALSE(serve::is_loopback_host(no));
}
