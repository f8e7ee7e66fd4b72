#include "launcher/port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "launcher/errors.h"

namespace dp::launcher {

namespace {

// The wildcard address of `host`'s family (rank 0's store listens on every interface), at `port`.
socklen_t wildcard_address(const std::string& host, int port, sockaddr_storage& addr) {
    addr = {};
    auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
    in6_addr scratch{};
    if (inet_pton(AF_INET6, host.c_str(), &scratch) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_addr = in6addr_any;
        v6->sin6_port = htons(static_cast<uint16_t>(port));
        return sizeof(sockaddr_in6);
    }
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_ANY);
    v4->sin_port = htons(static_cast<uint16_t>(port));
    return sizeof(sockaddr_in);
}

}  // namespace

void check_master_port_free(const std::string& master_addr, int master_port) {
    if (master_port <= 0) return;
    const std::string host = master_addr.empty() ? "127.0.0.1" : master_addr;
    // The address the store binds (Note [store on the job's address only]); a host name: every
    // interface of IPv4.
    sockaddr_storage addr{};
    socklen_t len = wildcard_address(host, master_port, addr);
    if (addr.ss_family == AF_INET6)
        inet_pton(AF_INET6, host.c_str(), &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr);
    else
        inet_pton(AF_INET, host.c_str(), &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr);
    const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;  // nothing learnt; the store reports its own failure
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool in_use = bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno == EADDRINUSE;
    close(fd);
    if (in_use)
        throw UsageError(
            "--master-port " + std::to_string(master_port) +
            " is in use on this machine by another program, so rank 0 could not listen on it and "
            "the other ranks would talk to that program; choose a free port, or leave --master-port "
            "out and dp-launch reserves one (with several nodes, every node's launcher needs the "
            "same free port)");
}

PortReservation::PortReservation(const std::string& host) {
    // Reserve on the wildcard address of the host's family: rank 0's store listens on every
    // interface, so the port must be free on all of them.
    sockaddr_storage addr{};
    auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
    socklen_t len = wildcard_address(host, 0, addr);
    fd_ = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw SystemError(errno_message("cannot create a socket to reserve MASTER_PORT"));
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        const std::string message = errno_message("cannot reserve a free port on " + host);
        close(fd_);
        fd_ = -1;
        throw SystemError(message + "; pass --master-port");
    }
    port_ = ntohs(addr.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(std::exchange(other.port_, 0)) {}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0) close(fd_);
        fd_ = std::exchange(other.fd_, -1);
        port_ = std::exchange(other.port_, 0);
    }
    return *this;
}

PortReservation::~PortReservation() {
    if (fd_ >= 0) close(fd_);
}

Rendezvous resolve_rendezvous(const std::string& master_addr, int master_port) {
    Rendezvous r;
    r.addr = master_addr.empty() ? "127.0.0.1" : master_addr;
    if (master_port != 0) {
        r.port = master_port;
    } else {
        r.reservation = PortReservation(r.addr);
        r.port = r.reservation.port();
    }
    return r;
}

}  // namespace dp::launcher
