#pragma once
// Choosing MASTER_PORT on a single node without the bind-then-close race.
//
// Note [port reservation]: the usual way (bind port 0, read the port, close, hand the number to
// rank 0) leaves a window in which any other process can be given the same port, which is how
// concurrent torchrun jobs collide with EADDRINUSE. Instead we bind port 0 with SO_REUSEADDR and
// keep that socket open, bound but never listening, for the whole job. The kernel then never hands
// the port out again as an ephemeral port (to another launcher, or to a connect), while rank 0's
// store, which also sets SO_REUSEADDR (c10d's TCPStore and libuv both do), can still bind and
// listen on it: Linux only refuses a second bind when one of the sockets is listening. The
// reservation is released when the launcher exits.

#include <string>

namespace dp::launcher {

class PortReservation {
  public:
    PortReservation() = default;
    // Reserves a free TCP port for a store that `host` names (an address or a host name). Throws
    // SystemError.
    explicit PortReservation(const std::string& host);
    PortReservation(PortReservation&& other) noexcept;
    PortReservation& operator=(PortReservation&& other) noexcept;
    PortReservation(const PortReservation&) = delete;
    PortReservation& operator=(const PortReservation&) = delete;
    ~PortReservation();

    int port() const { return port_; }

  private:
    int fd_ = -1;
    int port_ = 0;
};

// Where rank 0's store listens: MASTER_ADDR and MASTER_PORT as the ranks get them.
struct Rendezvous {
    std::string addr;
    int port = 0;
    PortReservation reservation;  // held for the whole job: Note [port reservation]
};

// `master_addr` (127.0.0.1 when empty) and `master_port`, or a port reserved on that address when
// it is 0. Throws SystemError.
Rendezvous resolve_rendezvous(const std::string& master_addr, int master_port);

// Note [port in use]: a --master-port that another program listens on would have rank 0's store
// fail to bind and the other ranks talk to the stranger until the collective timeout. The
// launcher that starts rank 0 binds the port itself first, as the store will (SO_REUSEADDR, on
// the job's address): when that fails with EADDRINUSE it throws UsageError naming
// the port and what to do, before any rank starts. `master_port` 0 (one is reserved) passes.
void check_master_port_free(const std::string& master_addr, int master_port);

}  // namespace dp::launcher
