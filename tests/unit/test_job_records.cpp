#include <dirent.h>
#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/manifest.h"
#include "launcher/progress.h"

using dp::launcher::JobRecords;
using Status = JobRecords::Status;

namespace {

std::vector<std::string> entries_of(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    REQUIRE(d != nullptr);
    while (const dirent* e = readdir(d))
        if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
    closedir(d);
    return names;
}

}  // namespace

TEST_CASE(
    "job records: set, replaced, read back in index order and counted by status, from a scratch file no one "
    "sees") {
    char name[] = "/tmp/dp-records-test-XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    const std::string dir = name;
    {
        JobRecords records(dir);
        CHECK(entries_of(dir).empty());  // unlinked at once: nothing is left however the job ends
        for (int i : {4, 0, 2, 1}) {
            records.set(
                {{"index", i}, {"prompt", "p\"" + std::to_string(i) + "\u00e9"}, {"status", "pending"}});
            records.set_request(i, "{\"index\":" + std::to_string(i) + "}");
        }
        records.set({{"index", 3}, {"line", 4}, {"status", "invalid"}, {"error", "empty"}});
        CHECK(records.size() == 5);
        CHECK(records.count(Status::kPending) == 4);
        CHECK(records.count(Status::kInvalid) == 1);
        CHECK(records.status(9) == Status::kAbsent);
        CHECK(records.record_line(9).empty());

        nlohmann::json made = records.record(2);
        CHECK(made.at("prompt") == "p\"2\u00e9");
        made["status"] = "ok";
        made["sha256"] = std::string(64, 'a');
        records.set(made);
        records.set({{"index", 4}, {"status", "failed"}, {"error", "a reason"}});
        CHECK(records.count(Status::kPending) == 2);
        CHECK(records.count(Status::kOk) == 1);
        CHECK(records.count(Status::kFailed) == 1);
        CHECK(records.size() == 5);
        CHECK(records.record(2) == made);
        CHECK(records.record_line(2) == made.dump());
        CHECK(records.request_line(4) == "{\"index\":4}");  // a record replaced keeps its request

        std::vector<int64_t> order;
        std::vector<Status> statuses;
        records.for_each_index([&](int64_t i, Status s) {
            order.push_back(i);
            statuses.push_back(s);
        });
        CHECK(order == std::vector<int64_t>{0, 1, 2, 3, 4});
        CHECK(statuses == std::vector<Status>{Status::kPending, Status::kPending, Status::kOk,
                                              Status::kInvalid, Status::kFailed});
        std::vector<std::string> errors;
        records.for_each([&](int64_t i, const nlohmann::json& r) {
            CHECK(r.at("index") == i);
            errors.push_back(r.value("error", ""));
        });
        CHECK(errors == std::vector<std::string>{"", "", "", "empty", "a reason"});
        CHECK_THROWS_AS(records.set({{"prompt", "no index"}}), std::invalid_argument);
        CHECK(JobRecords::status_of({{"status", "not_run"}}) == Status::kNotRun);
        CHECK(JobRecords::status_of({{"status", "later"}}) == Status::kOther);
    }
    CHECK(entries_of(dir).empty());
    std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_CASE("--progress: auto is a bar on a terminal and lines elsewhere, -q silences all but json") {
    using dp::launcher::progress_mode;
    using dp::launcher::ProgressMode;
    struct Row {
        const char* setting;
        bool quiet, tty;
        ProgressMode mode;
    };
    for (const Row& r :
         {Row{"auto", false, true, ProgressMode::kBar}, Row{"auto", false, false, ProgressMode::kLines},
          Row{"bar", false, false, ProgressMode::kBar}, Row{"lines", false, true, ProgressMode::kLines},
          Row{"none", false, true, ProgressMode::kNone}, Row{"auto", true, true, ProgressMode::kNone},
          Row{"bar", true, true, ProgressMode::kNone}, Row{"json", true, false, ProgressMode::kJson},
          Row{"json", false, true, ProgressMode::kJson}}) {
        CAPTURE(r.setting);
        CAPTURE(r.quiet);
        CHECK(progress_mode(r.setting, r.quiet, r.tty) == r.mode);
    }
}
