// The job's c10d store is reachable from the job's own address only: on one node rank 0's store
// listens on 127.0.0.1, never on every interface (Note [store on the job's address only]).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "launcher/port.h"
#include "support/test_paths.h"

using namespace dp::test;

namespace {

// The local addresses of the sockets listening on TCP `port`, as /proc/net/tcp and tcp6 show
// them ("127.0.0.1", "0.0.0.0", "::" ...).
std::vector<std::string> listening_addresses(int port) {
    std::vector<std::string> out;
    for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        std::ifstream in(table);
        std::string line;
        std::getline(in, line);  // header
        while (std::getline(in, line)) {
            std::istringstream fields(line);
            std::string slot, local, remote, state;
            fields >> slot >> local >> remote >> state;
            const std::size_t colon = local.find(':');
            if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
            if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
            const std::string hex = local.substr(0, colon);
            char text[INET6_ADDRSTRLEN] = {};
            if (hex.size() == 8) {
                in_addr a{};
                a.s_addr = static_cast<in_addr_t>(std::stoul(hex, nullptr, 16));  // stored as in memory
                inet_ntop(AF_INET, &a, text, sizeof(text));
            } else {
                in6_addr a{};
                for (int w = 0; w < 4; ++w) {
                    const uint32_t word =
                        static_cast<uint32_t>(std::stoul(hex.substr(8 * w, 8), nullptr, 16));
                    std::memcpy(a.s6_addr + 4 * w, &word, 4);
                }
                inet_ntop(AF_INET6, &a, text, sizeof(text));
            }
            out.emplace_back(text);
        }
    }
    return out;
}

}  // namespace

TEST_CASE("the socket scan tells a loopback listener from one on every interface") {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof(any)) == 0);
    REQUIRE(listen(fd, 1) == 0);
    socklen_t len = sizeof(any);
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&any), &len) == 0);
    CHECK(listening_addresses(ntohs(any.sin_port)) == std::vector<std::string>{"0.0.0.0"});
    close(fd);
}

TEST_CASE("on one node the job's store listens on loopback only, while the job runs") {
    const dp::launcher::PortReservation reserved("127.0.0.1");
    const int port = reserved.port();
    const std::string dir = make_temp_dir();
    { std::ofstream(dir + "/p.txt") << "one prompt\nanother prompt\n"; }
    Launch job({"-n", "2", "--master-port", std::to_string(port), "--model", DP_TINY_MODEL, "--device", "cpu",
                "--steps", "1000", "--width", "16", "--height", "16", "-o", dir + "/out", dir + "/p.txt"});
    const bool up = wait_until([&] { return !listening_addresses(port).empty(); }, 90);
    const std::vector<std::string> addresses = listening_addresses(port);
    job.signal(SIGTERM);
    job.wait(60);
    REQUIRE_MESSAGE(up, "no rank listened on the job's port " << port);
    std::string seen;
    for (const std::string& a : addresses) seen += a + " ";
    CHECK_MESSAGE(addresses == std::vector<std::string>{"127.0.0.1"}, "listening on: " << seen);
    CHECK(processes_with_marker(job.marker()).empty());
}

TEST_CASE(
    "a --master-port another program listens on is a usage error before any rank starts or any file is "
    "written") {
    // A stranger listening on the port, on loopback or on every interface.
    for (const char* where : {"127.0.0.1", "0.0.0.0"}) {
        CAPTURE(where);
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        inet_pton(AF_INET, where, &addr.sin_addr);
        REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
        REQUIRE(listen(fd, 4) == 0);
        socklen_t len = sizeof(addr);
        REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
        const std::string port = std::to_string(ntohs(addr.sin_port));
        const std::string dir = make_temp_dir();
        const std::string marker = dir + "/ran";
        // Any command: nothing runs.
        LaunchResult command =
            run_launch({"-n", "2", "--master-port", port, "--", "sh", "-c", "touch " + marker});
        CHECK(command.exit_code == 2);
        CHECK_MESSAGE(command.err.find("--master-port " + port +
                                       " is in use on this machine by another program") != std::string::npos,
                      command.err);
        CHECK_FALSE(file_exists(marker));
        // The main job: no output folder either.
        { std::ofstream(dir + "/p.txt") << "one prompt\n"; }
        LaunchResult job =
            run_launch({"-n", "2", "--master-port", port, "--model", DP_TINY_MODEL, "--steps", "1", "--width",
                        "16", "--height", "16", "-o", dir + "/out", dir + "/p.txt"});
        CHECK(job.exit_code == 2);
        CHECK(job.err.find("is in use on this machine") != std::string::npos);
        CHECK_FALSE(file_exists(dir + "/out"));
        close(fd);
        // Free again: the same port runs.
        LaunchResult free =
            run_launch({"-n", "2", "--master-port", port, "--", "sh", "-c", "touch " + marker});
        CHECK_MESSAGE(free.exit_code == 0, free.err);
        CHECK(file_exists(marker));
        remove_dir(dir);
    }
}
