#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include "launcher/port.h"

using dp::launcher::PortReservation;

namespace {
// Binds and listens on `port` with SO_REUSEADDR, as rank 0's store does. Returns the fd or -1.
int listen_like_a_store(int port) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 8) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int ephemeral_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    socklen_t len = sizeof(addr);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    int port = ntohs(addr.sin_port);
    close(fd);
    return port;
}
}  // namespace

TEST_CASE("a reserved port is a real port that rank 0's store can still listen on") {
    PortReservation r("127.0.0.1");
    REQUIRE(r.port() > 0);
    REQUIRE(r.port() < 65536);
    int store = listen_like_a_store(r.port());
    CHECK(store >= 0);
    if (store >= 0) close(store);
}

TEST_CASE("while reserved, the port is never handed out as an ephemeral port") {
    PortReservation r("127.0.0.1");
    std::set<int> handed_out;
    for (int i = 0; i < 2000; ++i) handed_out.insert(ephemeral_port());
    CHECK(handed_out.count(r.port()) == 0);
}

TEST_CASE("two reservations never share a port, and moving keeps it") {
    PortReservation a("127.0.0.1"), b("::1");
    CHECK(a.port() != b.port());
    const int port = a.port();
    PortReservation moved(std::move(a));
    CHECK(moved.port() == port);
    CHECK(a.port() == 0);
}
