#include "launcher/node_exchange.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "launcher/errors.h"
#include "protocol/atomic_file.h"
#include "strategies/model_files.h"

namespace dp::launcher {
namespace {

constexpr const char* kFolder = "/.dp-nodes";
constexpr double kBeatEveryS = 1.0;
constexpr auto kPollEvery = std::chrono::milliseconds(200);
constexpr std::size_t kMaxStateBytes = 1 << 16;

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The file's text (at most kMaxStateBytes); empty when it cannot be read.
std::string read_small(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return {};
    std::string text(kMaxStateBytes, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<std::size_t>(in.gcount()));
    return text;
}

nlohmann::json parse_object(const std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    return j.is_object() ? j : nlohmann::json::object();
}

std::vector<std::string> entries(const std::string& dir) {
    std::vector<std::string> names;
    if (DIR* d = opendir(dir.c_str())) {
        while (const dirent* e = readdir(d)) {
            const std::string name = e->d_name;
            if (name != "." && name != "..") names.push_back(name);
        }
        closedir(d);
    }
    return names;
}

}  // namespace

NodeExchange::NodeExchange(std::string output_dir, int index, int count, double lost_after_s)
    : output_dir_(std::move(output_dir)), index_(index), count_(count), lost_after_s_(lost_after_s) {}

std::string NodeExchange::dir() const { return output_dir_ + kFolder + "/" + job_id_; }
std::string NodeExchange::state_path(int k) const {
    return dir() + "/launcher-" + std::to_string(k) + ".state";
}
std::string NodeExchange::records_path(int k) const {
    return dir() + "/launcher-" + std::to_string(k) + ".jsonl";
}

void NodeExchange::set_job_id(const std::string& id) {
    if (!job_id_.empty() || id.empty()) return;
    job_id_ = id;
    std::error_code failed;
    std::filesystem::create_directories(dir(), failed);
    if (failed)
        throw IoError("cannot create " + dir() + " (the launchers' shared files): " + failed.message());
    if (index_ == 0) return;  // launcher 0's records go to manifest.jsonl
    const std::string path = records_path(index_);
    protocol::write_file_atomically(path, "");
    records_ = ManifestAppender(path);
    for (const nlohmann::json& r : buffered_) records_.append(r);
    buffered_.clear();
    beat();
}

bool NodeExchange::append(const nlohmann::json& record) {
    if (!records_.is_open()) {
        buffered_.push_back(record);
        return true;
    }
    return records_.append(record);
}

void NodeExchange::beat(std::optional<int> exit_code) {
    if (job_id_.empty()) return;
    const double now = now_s();
    if (!exit_code && now - last_beat_ < kBeatEveryS) return;
    last_beat_ = now;
    nlohmann::json state = {
        {"job_id", job_id_}, {"launcher", index_}, {"beat", ++beats_}, {"finished", false}};
    if (exit_code) {
        state["finished"] = true;
        state["exit_code"] = *exit_code;
    }
    try {
        protocol::write_file_atomically(state_path(index_), state.dump() + "\n");
    } catch (const IoError&) {
        // A beat that could not be written is a beat missed; the others call us lost if it lasts.
    }
}

std::vector<NodeExchange::Peer> NodeExchange::gather() {
    std::vector<Peer> peers;
    if (job_id_.empty()) return peers;
    struct Seen {
        std::string text;
        double changed = 0;
        bool done = false;
    };
    std::vector<Seen> seen(static_cast<std::size_t>(count_));
    const double start = now_s();
    for (Seen& s : seen) s.changed = start;
    for (int k = 0; k < count_; ++k) {
        Peer p;
        p.index = k;
        peers.push_back(p);
    }
    while (true) {
        beat();
        bool waiting = false;
        const double now = now_s();
        for (int k = 0; k < count_; ++k) {
            Seen& s = seen[static_cast<std::size_t>(k)];
            if (k == index_ || s.done) continue;
            const std::string text = read_small(state_path(k));
            if (text != s.text) s.text = text, s.changed = now;
            const nlohmann::json state = parse_object(text);
            Peer& p = peers[static_cast<std::size_t>(k)];
            if (state.value("finished", false) && state.value("job_id", "") == job_id_) {
                p.finished = true;
                p.exit_code = state.value("exit_code", 1);
                s.done = true;
            } else if (now - s.changed >= lost_after_s_) {
                p.silent_s = now - s.changed;
                s.done = true;
            } else {
                waiting = true;
            }
        }
        if (!waiting) break;
        std::this_thread::sleep_for(kPollEvery);
    }
    for (Peer& p : peers)
        if (p.index != index_) p.records = read_manifest(records_path(p.index));
    peers.erase(peers.begin() + index_);
    return peers;
}

void NodeExchange::publish_result(const nlohmann::json& result) {
    if (job_id_.empty()) return;
    nlohmann::json r = result;
    r["job_id"] = job_id_;
    protocol::write_file_atomically(dir() + "/result.json", r.dump() + "\n");
}

std::optional<nlohmann::json> NodeExchange::await_result(double& silent_s) {
    silent_s = 0;
    if (job_id_.empty()) return std::nullopt;
    std::string text;
    double changed = now_s();
    while (true) {
        beat();
        const nlohmann::json result = parse_object(read_small(dir() + "/result.json"));
        if (result.value("job_id", "") == job_id_) return result;
        const double now = now_s();
        const std::string state = read_small(state_path(0));
        if (state != text) text = state, changed = now;
        if (now - changed >= lost_after_s_) {
            silent_s = now - changed;
            return std::nullopt;
        }
        std::this_thread::sleep_for(kPollEvery);
    }
}

std::map<int64_t, nlohmann::json> NodeExchange::read_node_records(const std::string& output_dir) {
    std::map<int64_t, nlohmann::json> records;
    const std::string root = output_dir + kFolder;
    for (const std::string& run : entries(root)) {
        if (!strategies::is_directory(root + "/" + run)) continue;
        for (const std::string& name : entries(root + "/" + run)) {
            if (name.size() < 6 || name.compare(name.size() - 6, 6, ".jsonl") != 0) continue;
            for (auto& [index, r] : read_manifest(root + "/" + run + "/" + name))
                records[index] = std::move(r);
        }
    }
    return records;
}

void NodeExchange::remove_runs(const std::string& output_dir, const std::string& keep) {
    const std::string root = output_dir + kFolder;
    for (const std::string& run : entries(root)) {
        if (run == keep) continue;
        const std::string path = root + "/" + run;
        if (!strategies::is_directory(path)) continue;
        for (const std::string& name : entries(path)) std::remove((path + "/" + name).c_str());
        rmdir(path.c_str());
    }
}

std::string launcher_name(int index, bool per_rank) {
    return per_rank ? "rank " + std::to_string(index) + "'s dp-launch" : "node " + std::to_string(index);
}

}  // namespace dp::launcher
