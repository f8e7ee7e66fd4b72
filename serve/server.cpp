#include <arpa/inet.h>
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "launcher/errors.h"
#include "launcher/terminal.h"
#include "launcher/unique_fd.h"
#include "serve/http_api.h"
#include "serve/job_runner.h"
#include "serve/server.h"

namespace dp::serve {
namespace {

// The root held by this server alone: a second server on it would run its jobs twice. The lock
// goes with the process, however it ends.
launcher::UniqueFd lock_root(const std::string& root) {
    const std::string path = root + "/.serve.lock";
    launcher::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd) throw launcher::IoError(launcher::errno_message("cannot open " + path));
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0)
        throw launcher::UsageError("another dp-launch serve uses " + root +
                                   " (its .serve.lock is held): stop it, or give this one another -o");
    return fd;
}

void make_folder(const std::string& path) {
    std::error_code error;
    std::filesystem::create_directories(path, error);
    if (error) throw launcher::IoError("cannot create " + path + ": " + error.message());
}

}  // namespace

bool is_loopback_host(const std::string& host) {
    if (host == "localhost" || host == "::1" || host == "[::1]") return true;
    in_addr v4{};
    if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    return false;
}

int run_server(const ServeOptions& options, const BodyChecker& check, const std::string& model) {
    if (!is_loopback_host(options.host) && options.api_key.empty())
        throw launcher::UsageError(
            "--host " + options.host +
            " is not loopback: a server others can reach needs --api-key KEY (or DP_API_KEY); "
            "every request must then carry it");
    make_folder(options.root);
    const launcher::UniqueFd lock = lock_root(options.root);
    make_folder(requests_folder(options));
    JobStore store(options.root + "/jobs.sqlite3");
    const int resumed = store.requeue_running();

    // SIGTERM and SIGINT to one thread, which stops the server; every other thread (and each
    // job's dp-launch, whose mask is reset) keeps them blocked.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    ::signal(SIGPIPE, SIG_IGN);  // a client gone mid-answer

    JobRunner runner(options, store);
    ApiContext context{options, store, runner, check, model};
    httplib::Server server;
    server.new_task_queue = [] { return new httplib::ThreadPool(32); };  // generations wait in theirs
    add_routes(server, context);
    int port = options.port;
    if (port == 0) {
        port = server.bind_to_any_port(options.host);
        if (port < 0) port = 0;
    } else if (!server.bind_to_port(options.host, port)) {
        port = 0;
    }
    if (port <= 0)
        throw launcher::UsageError(
            "cannot listen on " + options.host + ":" + std::to_string(options.port) +
            " (in use, or not an address of this host): give another --port or --host");

    std::thread jobs([&runner] { runner.run(); });
    std::thread stopper([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        if (!options.quiet && sig != 0)
            launcher::Terminal::instance().say(
                "serve: stopping (the running job ends at a step boundary and "
                "resumes at the next start)");
        runner.stop();
        server.stop();
    });
    // Said even with -q: the address is what a script waits for.
    launcher::Terminal::instance().say(
        "serve: listening on http://" + options.host + ":" + std::to_string(port) + "/ (root " +
        options.root + ", " + std::to_string(options.world_size) + " rank(s) a job" +
        (resumed ? ", " + std::to_string(resumed) + " job(s) resumed" : "") + ")");
    const bool listened = server.listen_after_bind();
    runner.stop();
    pthread_kill(stopper.native_handle(), SIGTERM);  // no-op when it already returned
    stopper.join();
    jobs.join();
    return listened ? launcher::kExitOk : launcher::kExitSystem;
}

}  // namespace dp::serve
