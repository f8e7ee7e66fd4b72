#include "runtime/job_agreement.h"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "protocol/errors.h"
#include "runtime/image_sink.h"
#include "runtime/parallel/communicator.h"

namespace dp::runtime {
namespace {

constexpr const char* kPostKey = "dp/job/";

std::string host_name() {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) return "?";
    return name;
}

// What rank `rank` posts: its settings, its requests' digest and where it runs.
nlohmann::json posting(const protocol::JobFile& job, int rank) {
    nlohmann::json settings = job;
    settings.erase("requests");
    settings.erase("job_id");
    // What each node prints for its own diagnostics (DP_SAVE_LATENTS and the reports) may differ.
    for (const char* own : {"save_latents", "cache_report", "comm_report"}) settings.erase(own);
    const nlohmann::json all = job.requests;
    const std::string requests = all.dump();
    // Per field of the requests (steps, seed, prompt, ...): a digest of its column and its first
    // value, so that a difference is named by field (--steps on one node), not only by the digest.
    std::map<std::string, std::string> column_text;
    for (const nlohmann::json& r : all)
        for (const auto& [key, unused] : r.items()) column_text.emplace(key, std::string());
    for (const nlohmann::json& r : all)
        for (auto& [key, text] : column_text)
            text += (r.contains(key) ? r.at(key).dump() : std::string("null")) + "\n";
    nlohmann::json columns = nlohmann::json::object();
    for (const auto& [key, text] : column_text)
        columns[key] = {{"sha256", sha256_hex(text.data(), text.size())},
                        {"first", all.empty() || !all[0].contains(key) ? nlohmann::json() : all[0].at(key)}};
    const char* node = std::getenv("GROUP_RANK");
    return {{"rank", rank},
            {"node", node ? node : "0"},
            {"host", host_name()},
            {"job_id", job.job_id},
            {"settings", settings},
            {"requests", job.requests.size()},
            {"requests_sha256", sha256_hex(requests.data(), requests.size())},
            {"columns", columns}};
}

std::string shown(const nlohmann::json& value) {
    std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

std::string where(const nlohmann::json& p) {
    return "rank " + std::to_string(p.value("rank", -1)) + " (node " + p.value("node", "?") + ", host " +
           p.value("host", "?") + ")";
}

// Empty when `other` runs rank 0's job; else what differs, for the error message.
std::string difference(const nlohmann::json& zero, const nlohmann::json& other) {
    std::string out;
    const nlohmann::json& a = zero.at("settings");
    const nlohmann::json& b = other.at("settings");
    nlohmann::json keys = nlohmann::json::object();
    for (const auto& [k, v] : a.items()) keys[k] = true;
    for (const auto& [k, v] : b.items()) keys[k] = true;
    for (const auto& [k, unused] : keys.items()) {
        const nlohmann::json none = "(none)";
        const nlohmann::json& va = a.contains(k) ? a.at(k) : none;
        const nlohmann::json& vb = b.contains(k) ? b.at(k) : none;
        if (va != vb)
            out += (out.empty() ? "" : ", ") + k + " " + shown(vb) + " there, " + shown(va) + " on rank 0";
    }
    if (zero.at("requests_sha256") != other.at("requests_sha256")) {
        // Which of the prompts' fields differ, with the first prompt's values.
        std::string fields;
        const nlohmann::json none = nlohmann::json::object();
        const nlohmann::json& ca = zero.contains("columns") ? zero.at("columns") : none;
        const nlohmann::json& cb = other.contains("columns") ? other.at("columns") : none;
        nlohmann::json names = nlohmann::json::object();
        for (const auto& [k, v] : ca.items()) names[k] = true;
        for (const auto& [k, v] : cb.items()) names[k] = true;
        for (const auto& [k, unused] : names.items()) {
            const nlohmann::json a_col = ca.contains(k) ? ca.at(k) : nlohmann::json::object();
            const nlohmann::json b_col = cb.contains(k) ? cb.at(k) : nlohmann::json::object();
            if (a_col.value("sha256", "") == b_col.value("sha256", "")) continue;
            const nlohmann::json va = a_col.contains("first") ? a_col.at("first") : nlohmann::json("(none)");
            const nlohmann::json vb = b_col.contains("first") ? b_col.at("first") : nlohmann::json("(none)");
            fields +=
                (fields.empty() ? "" : ", ") + k +
                (va != vb ? " (first prompt: " + shown(vb) + " there, " + shown(va) + " on rank 0)" : "");
        }
        out += std::string(out.empty() ? "" : "; ") + "its prompts differ" +
               (fields.empty() ? std::string() : " in " + fields) + " (" +
               std::to_string(other.value("requests", 0)) + " to make, SHA-256 " +
               other.value("requests_sha256", "").substr(0, 12) + "..., against " +
               std::to_string(zero.value("requests", 0)) + " on rank 0, " +
               zero.value("requests_sha256", "").substr(0, 12) + "...)";
    }
    return out;
}

}  // namespace

std::string agree_on_job(const protocol::JobFile& job, Communicator& comm, int round) {
    const int rank = comm.rank();
    const std::string post_key = std::string(kPostKey) + (round == 0 ? "" : std::to_string(round) + "/");
    const std::string verdict_key = post_key + "verdict";
    const nlohmann::json mine = posting(job, rank);
    comm.store_set(post_key + std::to_string(rank), mine.dump());
    if (rank == 0) {
        std::string verdict;
        for (int r = 1; r < comm.size() && verdict.empty(); ++r) {
            const nlohmann::json other =
                nlohmann::json::parse(comm.store_get(post_key + std::to_string(r)), nullptr, false);
            if (other.is_discarded() || !other.contains("settings")) {
                verdict =
                    "rank " + std::to_string(r) + " posted an unreadable job (another dp-worker build?)";
                continue;
            }
            if (const std::string d = difference(mine, other); !d.empty())
                verdict = where(other) + " was started with another job than " + where(mine) + ": " + d;
        }
        comm.store_set(verdict_key, verdict.empty() ? "ok" : verdict);
        if (!verdict.empty())
            throw protocol::UsageError(verdict +
                                       ". Start every node with the same prompt file, flags and "
                                       "--output-dir (on storage every node sees)");
        return job.job_id;
    }
    const std::string verdict = comm.store_get(verdict_key);
    if (verdict != "ok")
        throw protocol::UsageError(verdict +
                                   ". Start every node with the same prompt file, flags and "
                                   "--output-dir (on storage every node sees)");
    const nlohmann::json zero = nlohmann::json::parse(comm.store_get(post_key + "0"), nullptr, false);
    return zero.is_discarded() ? std::string() : zero.value("job_id", "");
}

}  // namespace dp::runtime
