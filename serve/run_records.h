#pragma once
// What a job's run folder holds, read from its manifest.jsonl as dp-launch wrote it: the records,
// their counts, and which image names a request may fetch.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dp::serve {

// The manifest's records in file order (a line that is not a JSON object, as a record being
// written when the server looks, is left out); empty when there is no manifest yet.
std::vector<nlohmann::json> run_records(const std::string& run_folder);

// The bytes of the file at `path`; empty when it cannot be read.
std::string read_bytes(const std::string& path);

struct RunCount {
    int64_t ok = 0;      // images made
    int64_t failed = 0;  // records that are not ok (failed, invalid, not run)
    double ms = 0;       // the made images' "ms", summed
};
RunCount count_run(const std::string& run_folder);

// True when `name` is a plain file name (letters, digits, '.', '-', '_'; not starting with '.')
// that one of `records` names as its image: the only names a request may fetch, so that no path
// in a request leaves the job's folder.
bool is_recorded_image(const std::vector<nlohmann::json>& records, const std::string& name);

}  // namespace dp::serve
