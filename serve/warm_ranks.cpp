#include "serve/warm_ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "launcher/errors.h"
#include "launcher/process.h"
#include "launcher/rank_env.h"
#include "protocol/rank_pool.h"
#include "serve/job_runner.h"

namespace dp::serve {

WarmRanks::WarmRanks(const ServeOptions& options) : options_(options), dir_(options.root + "/.warm-ranks") {}

WarmRanks::~WarmRanks() { stop(); }

void WarmRanks::ensure() {
    if (pid_ > 0) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == 0) {
            if (ranks_alive()) return;
            stop();  // a rank died and its group has not noticed yet: no job would run on it
        }
        pid_ = -1;
    }
    // A fresh folder: nothing a group that ended left (its pids, a request it never took).
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
    std::filesystem::create_directories(dir_, error);
    if (error) throw launcher::IoError("cannot create " + dir_ + ": " + error.message());
    std::vector<std::string> argv = {options_.dp_launch, "warm-ranks", dir_};
    argv.insert(argv.end(), options_.job_args.begin(), options_.job_args.end());
    const std::string log = requests_folder(options_) + "/warm-ranks.log";
    pid_ = launcher::spawn_child_to_files(argv, launcher::current_environment(), log, log).pid;
    ++starts_;
}

bool WarmRanks::ranks_alive() const {
    for (int rank = 0; rank < options_.world_size; ++rank) {
        std::ifstream in(protocol::pool_pid_path(dir_, rank));
        long pid = 0;
        if (in >> pid && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
    }
    return true;
}

void WarmRanks::stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);  // dp-launch stops its ranks within its grace
    for (int i = 0; i < 200; ++i) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) != 0) {
            pid_ = -1;
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    launcher::wait_for(pid_);
    pid_ = -1;
}

}  // namespace dp::serve
