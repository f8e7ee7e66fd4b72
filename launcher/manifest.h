#pragma once
// manifest.jsonl, the main job's record of every prompt (docs/prompt-files.md, "Outputs"): reading the one a
// killed or finished run left, appending records whole, and deciding which earlier images a
// resumed job may keep.

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/unique_fd.h"
#include "protocol/call_arguments.h"

namespace dp::launcher {

// Note [records on disk]
// A job of 100 000 prompts held each record as a JSON tree in a map, with two copies of each
// request beside it: hundreds of bytes per prompt, tens of megabytes per job, and the final
// manifest was built as one string. JobRecords keeps each record's line (and its prompt's request,
// as the job file has it) in a scratch file that is unlinked as soon as it is made, so that
// nothing is left behind however the launcher ends, and holds in memory only where each line is
// and the record's status (40 bytes a prompt), with a count per status. The manifest, the job
// file of a restart and the gallery are then written from it a record at a time.

// The main job's records, one per prompt index: set, replaced, read back and counted by status.
class JobRecords {
  public:
    enum class Status : uint8_t { kAbsent, kPending, kOk, kFailed, kNotRun, kInvalid, kOther };
    static Status status_of(const nlohmann::json& record);

    // The scratch file goes in `scratch_dir`. Throws IoError naming it.
    explicit JobRecords(const std::string& scratch_dir);
    JobRecords(JobRecords&&) = default;
    JobRecords& operator=(JobRecords&&) = default;

    // Sets (or replaces) prompt `record["index"]`'s record and returns its line, as the manifest
    // has it. Throws std::invalid_argument for a record without an index of 0 or more.
    std::string set(const nlohmann::json& record);
    // Sets the request line (protocol::request_line) of prompt `index`.
    void set_request(int64_t index, std::string_view line);

    Status status(int64_t index) const;
    // The record of `index`, which is not kAbsent.
    nlohmann::json record(int64_t index) const;
    // Its record's line as the manifest has it, and its request line ("" when none was set).
    std::string record_line(int64_t index) const;
    std::string request_line(int64_t index) const;

    int64_t count(Status status) const { return counts_[static_cast<std::size_t>(status)]; }
    int64_t size() const;  // the records set
    // Each record in index order, with its index.
    void for_each(const std::function<void(int64_t index, const nlohmann::json& record)>& visit) const;
    // The indices of the records in index order, with their status.
    void for_each_index(const std::function<void(int64_t index, Status status)>& visit) const;

  private:
    struct Place {
        int64_t at = -1;  // the offset in the scratch file; < -1: held_[-at - 2]
        uint32_t size = 0;
    };
    struct Entry {
        Place record, request;
        Status status = Status::kAbsent;
    };
    Place put(std::string_view line);
    std::string get(const Place& place) const;

    UniqueFd scratch_;
    int64_t end_ = 0;
    std::vector<Entry> entries_;     // by index
    std::vector<std::string> held_;  // lines the scratch file could not take (a full disk)
    int64_t counts_[7] = {};
};

// The records of a manifest by index. A prompt's later record wins: the appended form a killed
// run leaves may hold a prompt twice. Lines that do not parse as a record with an index (the torn
// last line of a run killed mid-write) are skipped. Empty when the file does not exist; throws
// IoError when it exists but cannot be read.
std::map<int64_t, nlohmann::json> read_manifest(const std::string& path);

// Appends records to a manifest file, each whole or not at all: one write of its whole line, and
// a write that fails part-way (a full disk) is cut back to the last whole record.
class ManifestAppender {
  public:
    ManifestAppender() = default;
    // Opens `path` (which exists) for appending. Throws IoError.
    explicit ManifestAppender(const std::string& path);

    // False, with errno set and the file as it was, when the record could not be written whole.
    bool append(const nlohmann::json& record);
    // The same for a record's line (JobRecords::set's), without its newline.
    bool append_line(std::string_view line);
    bool is_open() const { return static_cast<bool>(fd_); }
    void close() { fd_.reset(); }

  private:
    UniqueFd fd_;
    int64_t size_ = 0;  // the bytes of whole records in the file
};

// The settings that change an image's pixels (model, random weights, variant, component files, dtype, no_t5,
// seed, steps, size, negative prompt, and every call argument whose row says it shapes the pixels: guidance,
// max_sequence_length, skip-layer guidance, ...) on which an earlier record differs from the one a new job
// would write, as "steps 4 (now 2)". A size of 0 in `now` (the model's default) is not compared, nor is a
// setting that has no effect in either record (the skip-layer scale, start and stop when neither skips a
// block). A call argument a record leaves out (an older one) had `family`'s default; without `family`, it
// counts only when the other record has it.
std::vector<std::string> pixel_setting_differences(const nlohmann::json& earlier, const nlohmann::json& now,
                                                   const protocol::FamilyArguments* family = nullptr);

// For --resume: the earlier records (read_manifest) whose images a job whose prompts have
// `records` (status "pending", settings resolved) keeps: status ok, the same prompt and file, and
// the file in `dir` still has the recorded SHA-256. Throws UsageError naming the differences when
// an earlier image was made with other pixel settings.
std::map<int64_t, nlohmann::json> images_to_keep(const std::map<int64_t, nlohmann::json>& earlier,
                                                 const JobRecords& records, const std::string& dir,
                                                 const protocol::FamilyArguments& family);

}  // namespace dp::launcher
