#include "launcher/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "launcher/errors.h"
#include "strategies/sha256.h"

namespace dp::launcher {
namespace {

// Whether the file at `path` is still the one recorded with `sha256`: false when none was
// recorded, or the file is gone or cannot be read (its image is made again).
bool still_has_sha256(const std::string& path, const std::string& sha256) {
    if (sha256.empty()) return false;
    try {
        return strategies::file_sha256(path) == sha256;
    } catch (const Error&) {
        return false;
    }
}

std::string describe(const nlohmann::json& value) {
    if (value.is_string()) return "'" + value.get<std::string>() + "'";
    if (value.is_null()) return "none";
    return value.dump();
}

}  // namespace

JobRecords::Status JobRecords::status_of(const nlohmann::json& record) {
    const auto it = record.find("status");
    if (it == record.end() || !it->is_string()) return Status::kOther;
    const std::string& s = it->get_ref<const std::string&>();
    if (s == "pending") return Status::kPending;
    if (s == "ok") return Status::kOk;
    if (s == "failed") return Status::kFailed;
    if (s == "not_run") return Status::kNotRun;
    if (s == "invalid") return Status::kInvalid;
    return Status::kOther;
}

JobRecords::JobRecords(const std::string& scratch_dir) {
    std::string path = scratch_dir + "/dp-records-XXXXXX";
    scratch_.reset(mkostemp(path.data(), O_CLOEXEC));
    if (!scratch_) throw IoError(errno_message("cannot create a scratch file in " + scratch_dir));
    unlink(path.c_str());  // Note [records on disk]: only this descriptor keeps it
}

JobRecords::Place JobRecords::put(std::string_view line) {
    Place place;
    place.size = static_cast<uint32_t>(line.size());
    std::size_t done = 0;
    while (done < line.size()) {
        const ssize_t n =
            pwrite(scratch_.get(), line.data() + done, line.size() - done, end_ + static_cast<int64_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {  // a full disk: the line stays in memory
            held_.emplace_back(line);
            place.at = -2 - static_cast<int64_t>(held_.size() - 1);
            return place;
        }
        done += static_cast<std::size_t>(n);
    }
    place.at = end_;
    end_ += static_cast<int64_t>(line.size());
    return place;
}

std::string JobRecords::get(const Place& place) const {
    if (place.at < -1) return held_[static_cast<std::size_t>(-2 - place.at)];
    std::string line(place.size, '\0');
    std::size_t done = 0;
    while (place.at >= 0 && done < line.size()) {
        const ssize_t n = pread(scratch_.get(), line.data() + done, line.size() - done,
                                place.at + static_cast<int64_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            throw IoError(errno_message("cannot read back the job's records from their scratch file"));
        done += static_cast<std::size_t>(n);
    }
    return line;
}

std::string JobRecords::set(const nlohmann::json& record) {
    const auto index = record.find("index");
    if (index == record.end() || !index->is_number_integer() || index->get<int64_t>() < 0)
        throw std::invalid_argument("a job record without an index");
    const auto i = static_cast<std::size_t>(index->get<int64_t>());
    if (i >= entries_.size()) entries_.resize(i + 1);
    Entry& e = entries_[i];
    if (e.status != Status::kAbsent) --counts_[static_cast<std::size_t>(e.status)];
    e.status = status_of(record);
    ++counts_[static_cast<std::size_t>(e.status)];
    std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    e.record = put(line);
    return line;
}

void JobRecords::set_request(int64_t index, std::string_view line) {
    if (index < 0) throw std::invalid_argument("a request without an index");
    const auto i = static_cast<std::size_t>(index);
    if (i >= entries_.size()) entries_.resize(i + 1);
    entries_[i].request = put(line);
}

JobRecords::Status JobRecords::status(int64_t index) const {
    if (index < 0 || static_cast<std::size_t>(index) >= entries_.size()) return Status::kAbsent;
    return entries_[static_cast<std::size_t>(index)].status;
}

std::string JobRecords::record_line(int64_t index) const {
    if (status(index) == Status::kAbsent) return "";
    return get(entries_[static_cast<std::size_t>(index)].record);
}

nlohmann::json JobRecords::record(int64_t index) const { return nlohmann::json::parse(record_line(index)); }

std::string JobRecords::request_line(int64_t index) const {
    if (index < 0 || static_cast<std::size_t>(index) >= entries_.size()) return "";
    return get(entries_[static_cast<std::size_t>(index)].request);
}

int64_t JobRecords::size() const {
    int64_t n = 0;
    for (std::size_t s = 1; s < std::size(counts_); ++s) n += counts_[s];
    return n;
}

void JobRecords::for_each(const std::function<void(int64_t, const nlohmann::json&)>& visit) const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
        if (entries_[i].status != Status::kAbsent)
            visit(static_cast<int64_t>(i), record(static_cast<int64_t>(i)));
}

void JobRecords::for_each_index(const std::function<void(int64_t, Status)>& visit) const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
        if (entries_[i].status != Status::kAbsent) visit(static_cast<int64_t>(i), entries_[i].status);
}

std::map<int64_t, nlohmann::json> read_manifest(const std::string& path) {
    std::map<int64_t, nlohmann::json> records;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        if (errno == ENOENT) return records;
        throw IoError(errno_message("cannot read " + path));
    }
    for (std::string line; std::getline(in, line);) {
        nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!r.is_object() || !r.contains("index") || !r["index"].is_number_integer()) continue;
        const int64_t index = r["index"].get<int64_t>();
        records[index] = std::move(r);
    }
    return records;
}

ManifestAppender::ManifestAppender(const std::string& path) {
    fd_.reset(open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
    struct stat st {};
    if (!fd_ || fstat(fd_.get(), &st) != 0) throw IoError(errno_message("cannot open " + path));
    size_ = st.st_size;
}

bool ManifestAppender::append(const nlohmann::json& record) {
    return append_line(record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

bool ManifestAppender::append_line(std::string_view record_line) {
    if (!fd_) {
        errno = EBADF;
        return false;
    }
    std::string line;
    line.reserve(record_line.size() + 1);
    line.append(record_line).push_back('\n');
    ssize_t n;
    do {
        n = ::write(fd_.get(), line.data(), line.size());
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(line.size())) {
        size_ += n;
        return true;
    }
    const int err = n < 0 ? errno : ENOSPC;  // a short write: the disk filled up part-way
    if (n > 0 && ftruncate(fd_.get(), size_) != 0) {
        // Cannot cut it back: stop appending; the reader skips the torn last line.
        fd_.reset();
    }
    errno = err;
    return false;
}

std::vector<std::string> pixel_setting_differences(const nlohmann::json& earlier, const nlohmann::json& now,
                                                   const protocol::FamilyArguments* family) {
    std::vector<std::string> differences;
    const auto value = [](const nlohmann::json& r, const char* key, const nlohmann::json& fallback) {
        return r.contains(key) ? r[key] : fallback;
    };
    // Each setting with the value a record that leaves it out had (older records).
    std::vector<std::pair<const char*, nlohmann::json>> keys = {{"model", nullptr},
                                                                {"random_weights", nullptr},
                                                                {"variant", ""},
                                                                {"dtype", "fp32"},
                                                                {"no_t5", false},
                                                                {"quantize", nullptr},
                                                                {"seed", nullptr},
                                                                {"steps", nullptr},
                                                                {"width", 0},
                                                                {"height", 0},
                                                                {"negative_prompt", ""},
                                                                {"components", nlohmann::json::object()},
                                                                {"scheduler_resolved", nullptr}};
    // Then every call argument that shapes the pixels: left out, it was the family's default (an
    // older record), or off (a skip-layer setting without skipped blocks: CallArgument::active_with).
    const auto off = [&](const protocol::CallArgument& row, const nlohmann::json& r) {
        if (!row.active_with) return false;
        const nlohmann::json with = value(r, row.active_with, nlohmann::json::array());
        return with.is_null() || with.empty();
    };
    for (const protocol::CallArgument& row : protocol::call_arguments()) {
        if (row.universal || !row.pixels) continue;
        const protocol::FamilyArgument* a = family ? family->find(row.name) : nullptr;
        if (row.type == protocol::CallType::kBlocks || row.type == protocol::CallType::kAdapters) {
            keys.emplace_back(row.name, nlohmann::json::array());
        } else if (row.type == protocol::CallType::kCache) {
            keys.emplace_back(row.name, "none");
        } else if (row.type == protocol::CallType::kImage) {
            keys.emplace_back(row.name, nullptr);  // none: a text-to-image line
        } else if (off(row, earlier) && off(row, now)) {
            continue;  // without skipped blocks the skip-layer settings change nothing
        } else {
            keys.emplace_back(row.name, a ? protocol::call_value_json(a->value) : nlohmann::json());
        }
    }
    // Note [weights fingerprint]: compared where both records have one (older records have none).
    if (earlier.contains("weights") && now.contains("weights") && earlier["weights"] != now["weights"])
        differences.push_back("the model's weight files (changed since, at the same paths)");
    for (const auto& [key, fallback] : keys) {
        if (!earlier.contains(key) && !now.contains(key) && fallback.is_null()) continue;
        const nlohmann::json want = value(now, key, fallback);
        if ((std::string(key) == "width" || std::string(key) == "height") && want == 0) continue;
        const nlohmann::json had = value(earlier, key, fallback);
        if (had != want)
            differences.push_back(std::string(key) + " " + describe(had) + " (now " + describe(want) + ")");
    }
    return differences;
}

std::map<int64_t, nlohmann::json> images_to_keep(const std::map<int64_t, nlohmann::json>& earlier,
                                                 const JobRecords& records, const std::string& dir,
                                                 const protocol::FamilyArguments& family) {
    std::map<int64_t, nlohmann::json> kept;
    std::vector<std::string> differences;
    int64_t refused = 0;
    for (const auto& [index, had] : earlier) {
        if (records.status(index) != JobRecords::Status::kPending) continue;
        const nlohmann::json now = records.record(index);
        if (had.value("status", "") != "ok" || had.value("prompt", "") != now.value("prompt", "") ||
            had.value("file", "") != now.value("file", ""))
            continue;  // no image of this prompt: it is made again
        // Note [input images]: another input (other bytes) or strength is another edit, made again
        // as another prompt is, not a setting that refuses the run.
        const auto differs = [&](const char* key) {
            return had.value(key, nlohmann::json()) != now.value(key, nlohmann::json());
        };
        if (differs("image") || differs("mask_image") || differs("strength")) continue;
        const std::vector<std::string> d = pixel_setting_differences(had, now, &family);
        if (!d.empty()) {
            ++refused;
            for (const std::string& one : d)
                if (std::find(differences.begin(), differences.end(), one) == differences.end())
                    differences.push_back(one);
            continue;
        }
        const std::string file = now.value("file", "");
        if (still_has_sha256(dir + "/" + file, had.value("sha256", ""))) kept[index] = had;
    }
    if (refused > 0) {
        std::string text;
        for (std::size_t i = 0; i < differences.size() && i < 8; ++i)
            text += (i ? ", " : "") + differences[i];
        if (differences.size() > 8) text += ", and " + std::to_string(differences.size() - 8) + " more";
        throw UsageError("--resume: " + std::to_string(refused) + " image(s) in " + dir +
                         " were made with other settings: " + text +
                         "; run with those settings, pass --overwrite to make every image again, or choose "
                         "another --output-dir");
    }
    return kept;
}

}  // namespace dp::launcher
