#include "protocol/rank_pool.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "protocol/atomic_file.h"
#include "protocol/errors.h"

namespace dp::protocol {

std::string pool_rank_dir(const std::string& pool, int rank) {
    return pool + "/rank-" + std::to_string(rank);
}

std::string pool_pid_path(const std::string& pool, int rank) { return pool_rank_dir(pool, rank) + "/pid"; }

std::string pool_request_path(const std::string& pool, int rank) {
    return pool_rank_dir(pool, rank) + "/request.json";
}

void write_pool_request(const std::string& pool, int rank, const PoolRequest& request) {
    const std::string dir = pool_rank_dir(pool, rank);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
        throw IoError("cannot create " + dir + ": " + std::strerror(errno));
    const nlohmann::json j = {{"job", request.job}, {"status", request.status}, {"exit", request.exit}};
    write_file_atomically(pool_request_path(pool, rank), j.dump() + "\n");
}

std::optional<PoolRequest> take_pool_request(const std::string& pool, int rank) {
    const std::string path = pool_request_path(pool, rank);
    const std::string taken = path + ".taken";
    if (std::rename(path.c_str(), taken.c_str()) != 0) return std::nullopt;
    std::ifstream in(taken, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::remove(taken.c_str());
    const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("job") || !j["job"].is_string() || !j.contains("status") ||
        !j["status"].is_string() || !j.contains("exit") || !j["exit"].is_string())
        throw InputDataError(path + ": not a warm rank's request (job, status and exit, each a path)");
    return PoolRequest{j["job"], j["status"], j["exit"]};
}

}  // namespace dp::protocol
