#pragma once
// manifest.jsonl, the main job's record of every prompt (README "Output"): reading the one a
// killed or finished run left, appending records whole, and deciding which earlier images a
// resumed job may keep.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/unique_fd.h"

namespace dp::launcher {

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
    bool is_open() const { return static_cast<bool>(fd_); }
    void close() { fd_.reset(); }

  private:
    UniqueFd fd_;
    int64_t size_ = 0;  // the bytes of whole records in the file
};

// The settings that change an image's pixels (model, random weights, variant, dtype, no_t5, seed,
// steps, guidance, size, negative prompt, max_sequence_length and skip-layer guidance) on which an
// earlier record differs from the one a new job would write, as "steps 4 (now 2)". A size of 0 in
// `now` (the model's default) is not compared, nor are the skip-layer scale, start and stop when
// neither record skips a block.
std::vector<std::string> pixel_setting_differences(const nlohmann::json& earlier, const nlohmann::json& now);

// For --resume: the earlier records (read_manifest) whose images a job whose prompts have
// `records` (status "pending", settings resolved) keeps: status ok, the same prompt and file, and
// the file in `dir` still has the recorded SHA-256. Throws UsageError naming the differences when
// an earlier image was made with other pixel settings.
std::map<int64_t, nlohmann::json> images_to_keep(const std::map<int64_t, nlohmann::json>& earlier,
                                                 const std::map<int64_t, nlohmann::json>& records,
                                                 const std::string& dir);

// The hex SHA-256 of a file's bytes; empty when it cannot be read.
std::string file_sha256(const std::string& path);

}  // namespace dp::launcher
