#include "runtime/parallel/communicator.h"

#include <ATen/ATen.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <set>
#include <thread>

// Gloo's headers come from Debian's libgloo-dev: the wheel ships ProcessGroupGloo.hpp without the
// gloo headers it includes. We only hold gloo objects through pointers, so the class layouts we
// compile against do not depend on the gloo version inside libtorch_cpu.
// (USE_C10D_GLOO comes with LibTorch's compile definitions.) NCCL's process group is in
// libtorch_cuda, reached through our CUDA plugin (Note [CUDA loaded on demand]).
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "runtime/io/errors.h"
#include "runtime/parallel/cuda_support.h"

namespace dp::runtime {

struct Communicator::Impl {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::Backend> backend;
};

namespace {

std::string first_line(const std::exception& e) {
    std::string why = e.what();
    if (auto nl = why.find('\n'); nl != std::string::npos) why = why.substr(0, nl);
    return why;
}

// The process group of `o.backend` over `store`, for rank o.rank of o.world_size.
c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                               const CommunicatorOptions& o) {
    if (o.backend == "gloo") {
        auto go = c10d::ProcessGroupGloo::Options::create(o.timeout);
        // The address given; else on one node everything stays on loopback, and across nodes gloo
        // picks the host's own address.
        const bool local =
            o.master_addr.rfind("127.", 0) == 0 || o.master_addr == "localhost" || o.master_addr == "::1";
        go->devices.push_back(!o.local_addr.empty()
                                  ? c10d::ProcessGroupGloo::createDeviceForHostname(o.local_addr)
                              : local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                      : c10d::ProcessGroupGloo::createDefaultDevice());
        return c10::make_intrusive<c10d::ProcessGroupGloo>(store, o.rank, o.world_size, go);
    }
    if (o.backend == "nccl") {
        const CudaPluginApi* cuda = cuda_plugin();
        if (!cuda || !cuda->make_nccl)
            throw Error(
                "the nccl backend needs CUDA and NCCL, which this machine or build lacks (no NVIDIA "
                "driver, or no CUDA toolkit with nccl.h at build time); use --device cpu",
                1);
        return cuda->make_nccl(store, o.rank, o.world_size, o.timeout);
    }
    throw Error("unknown collective backend '" + o.backend + "' (known: gloo, nccl)", 2);
}

// Note [store on the job's address only]: c10d's TCPStore server listens on every interface of
// the host, so anything that can reach the machine can connect to a running job's store and
// write keys. Rank 0 instead makes the listening socket itself, bound to the master address
// (127.0.0.1 on one node; the address the other nodes connect to on several), and hands it to
// the store (TCPStoreOptions::masterListenFd, which the store then owns). SO_REUSEADDR lets it
// bind the port the launcher keeps reserved (Note [port reservation]).
int listen_on_master_address(const std::string& host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0)
        throw CommunicationError("the store's address " + host + " does not resolve: " + gai_strerror(rc));
    // A host name that resolves to loopback here but not on the other nodes (Debian's
    // "127.0.1.1 host" line) would shut them out: the store then listens on every interface, as
    // c10d's does, and says so.
    // A numeric address is meant as given (127.0.0.2 names one loopback "node" of a test).
    in6_addr numeric{};
    const bool loopback_literal = host == "localhost" || inet_pton(AF_INET, host.c_str(), &numeric) == 1 ||
                                  inet_pton(AF_INET6, host.c_str(), &numeric) == 1;
    const addrinfo* first = found;
    const bool resolves_to_loopback =
        first &&
        ((first->ai_family == AF_INET &&
          (ntohl(reinterpret_cast<const sockaddr_in*>(first->ai_addr)->sin_addr.s_addr) >> 24) == 127) ||
         (first->ai_family == AF_INET6 &&
          IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(first->ai_addr)->sin6_addr)));
    if (resolves_to_loopback && !loopback_literal) {
        freeaddrinfo(found);
        std::cerr << "dp-worker: MASTER_ADDR " << host
                  << " resolves to a loopback address on rank 0's host; its store listens on every "
                     "interface so that other nodes can reach it (give rank 0's network address to "
                     "restrict it)"
                  << std::endl;
        return -1;
    }
    std::string why = "no address";
    int fd = -1;
    for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
        fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        const int on = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
        if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
            why = std::strerror(errno);
            ::close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(found);
    if (fd < 0)
        throw CommunicationError("rank 0 cannot listen for the job's store on " + host + ":" +
                                 std::to_string(port) + ": " + why +
                                 " (MASTER_ADDR must be an address of rank 0's host)");
    return fd;
}

}  // namespace

// Note [a node that never arrives]: c10d's store server waits for its workers and then says only
// "1/2 clients joined", after the whole collective timeout. Instead every rank marks its arrival
// in the store (dp/joined/RANK) and rank 0 waits for all of them itself, for --node-timeout on a
// multi-node job: ranks that never joined are named, with their nodes, and the job fails (75)
// before anything is loaded. A rank whose store never answers gives up after the same time.
static void await_every_rank(c10d::Store& store, const CommunicatorOptions& o,
                             std::chrono::milliseconds limit) {
    const auto key = [](int r) { return "dp/joined/" + std::to_string(r); };
    store.set(key(o.rank), std::vector<uint8_t>{1});
    if (o.rank != 0) return;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<int> missing;
    for (;;) {
        missing.clear();
        for (int r = 0; r < o.world_size; ++r)
            if (!store.check({key(r)})) missing.push_back(r);
        if (missing.empty()) return;
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::string ranks, nodes;
    std::set<int> seen_nodes;
    for (std::size_t i = 0; i < missing.size() && i < 16; ++i)
        ranks += (i ? ", " : "") + std::to_string(missing[i]);
    if (missing.size() > 16) ranks += " and " + std::to_string(missing.size() - 16) + " more";
    if (o.ranks_per_node > 0)
        for (const int r : missing)
            if (seen_nodes.insert(r / o.ranks_per_node).second)
                nodes += (nodes.empty() ? "" : ", ") + std::to_string(r / o.ranks_per_node);
    const bool several_nodes = o.join_timeout.count() > 0;
    throw CommunicationError(
        std::to_string(missing.size()) + " of " + std::to_string(o.world_size) +
        " ranks never joined the job's store at " + o.master_addr + ":" + std::to_string(o.master_port) +
        " within " + std::to_string(limit.count() / 1000) + " s" +
        (several_nodes ? " (--node-timeout)" : "") + ": rank(s) " + ranks +
        (several_nodes && !nodes.empty() ? ", on node(s) " + nodes : std::string()) +
        (several_nodes
             ? "; start dp-launch there with the same --nnodes, --master-addr and --master-port, or check "
               "that it can reach this address"
             : "; see their errors"));
}

Communicator::Communicator(const CommunicatorOptions& o) : options_(o), impl_(std::make_unique<Impl>()) {
    const std::string where = o.master_addr + ":" + std::to_string(o.master_port);
    const std::chrono::milliseconds join = o.join_timeout.count() > 0 ? o.join_timeout : o.timeout;
    try {
        c10d::TCPStoreOptions so;
        so.port = static_cast<uint16_t>(o.master_port);
        so.isServer = o.rank == 0;
        so.numWorkers = o.world_size;
        so.waitWorkers = false;  // Note [a node that never arrives]: await_every_rank
        so.timeout = join;
        if (so.isServer)
            if (const int fd = listen_on_master_address(o.master_addr, o.master_port); fd >= 0)
                so.masterListenFd = fd;
        impl_->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
        await_every_rank(*impl_->store, o, join);
        impl_->store->setTimeout(o.timeout);
        impl_->backend = make_backend(impl_->store, o);
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        throw CommunicationError(
            "rank " + std::to_string(o.rank) + ": could not join the job's " + o.backend +
            " group through the store at " + where + " within " + std::to_string(join.count() / 1000) + " s" +
            (o.join_timeout.count() > 0 ? " (--node-timeout)" : "") + ": " + first_line(e));
    }
}

Communicator::Communicator(const c10::intrusive_ptr<c10d::Store>& store, const CommunicatorOptions& o)
    : options_(o), impl_(std::make_unique<Impl>()) {
    impl_->store = store;
    try {
        impl_->backend = make_backend(store, o);
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        throw CommunicationError("rank " + std::to_string(o.rank) + ": could not form the " + o.backend +
                                 " group '" + o.name + "': " + first_line(e));
    }
}

struct InProcessStore::Impl {
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
};
InProcessStore::InProcessStore() : impl_(std::make_unique<Impl>()) {}
InProcessStore::~InProcessStore() = default;
const c10::intrusive_ptr<c10d::Store>& InProcessStore::store() const { return impl_->store; }

Communicator::Communicator(const CommunicatorOptions& options, std::unique_ptr<Impl> impl)
    : options_(options), impl_(std::move(impl)) {}

Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::subgroup(const std::vector<int>& ranks, const std::string& tag) {
    const auto me = std::find(ranks.begin(), ranks.end(), rank());
    if (me == ranks.end())
        throw InternalError("rank " + std::to_string(rank()) + " is not in the sub-group " + tag);
    CommunicatorOptions o = options_;
    o.rank = static_cast<int>(me - ranks.begin());
    o.world_size = static_cast<int>(ranks.size());
    o.name = tag;
    auto impl = std::make_unique<Impl>();
    impl->store = c10::make_intrusive<c10d::PrefixStore>(tag, impl_->store);
    try {
        impl->backend = make_backend(impl->store, o);
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        throw CommunicationError("rank " + std::to_string(rank()) + ": could not form the sub-group " + tag +
                                 ": " + first_line(e));
    }
    return std::unique_ptr<Communicator>(new Communicator(o, std::move(impl)));
}

void Communicator::finish(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const {
    try {
        // Gloo completes on the CPU: wait at most the group's timeout. NCCL's wait() only orders
        // the current CUDA stream after the collective; a timeout here would block the CPU until
        // the kernel ends, so its timeout is the process group's own (watchdog) instead.
        const bool done = options_.backend == "nccl" ? work->wait() : work->wait(options_.timeout);
        if (!done) throw std::runtime_error("did not complete");
    } catch (const std::exception& e) {
        throw CommunicationError(std::string(what) + " on group '" + options_.name + "' (rank " +
                                 std::to_string(rank()) + " of " + std::to_string(size()) + ", " +
                                 options_.backend + ") failed or did not complete within its timeout of " +
                                 std::to_string(options_.timeout.count() / 1000.0).substr(0, 5) + " s: " +
                                 first_line(e) + " (another rank of the group may have died; see its log)");
    }
}

void Communicator::barrier() { finish(impl_->backend->barrier(), "barrier"); }

void Communicator::store_set(const std::string& key, const std::string& value) {
    try {
        impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception& e) {
        throw CommunicationError("rank " + std::to_string(rank()) + ": cannot write '" + key +
                                 "' to the job's store: " + first_line(e) +
                                 " (rank 0 may have died; see its log)");
    }
}

std::string Communicator::store_get(const std::string& key) {
    try {
        impl_->store->wait({key}, options_.timeout);
        const std::vector<uint8_t> value = impl_->store->get(key);
        return std::string(value.begin(), value.end());
    } catch (const std::exception& e) {
        throw CommunicationError("rank " + std::to_string(rank()) + ": '" + key +
                                 "' did not appear in the job's store within " +
                                 std::to_string(options_.timeout.count() / 1000) + " s: " + first_line(e) +
                                 " (another rank may have died; see its log)");
    }
}

int64_t Communicator::store_add(const std::string& key, int64_t delta) {
    try {
        return impl_->store->add(key, delta);
    } catch (const std::exception& e) {
        throw CommunicationError("rank " + std::to_string(rank()) + ": cannot add to '" + key +
                                 "' in the job's store: " + first_line(e) +
                                 " (rank 0 may have died; see its log)");
    }
}

void Communicator::all_reduce(at::Tensor& tensor) {
    std::vector<at::Tensor> t = {tensor};
    finish(impl_->backend->allreduce(t), "all_reduce");
    bytes_["all_reduce"] += tensor.numel() * tensor.element_size();
}

void Communicator::all_reduce_max(at::Tensor& tensor) {
    std::vector<at::Tensor> t = {tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MAX;
    finish(impl_->backend->allreduce(t, options), "all_reduce");
    bytes_["all_reduce"] += tensor.numel() * tensor.element_size();
}

std::vector<at::Tensor> Communicator::all_gather(const at::Tensor& tensor) {
    std::vector<std::vector<at::Tensor>> out(1);
    for (int i = 0; i < size(); ++i) out[0].push_back(at::empty_like(tensor));
    std::vector<at::Tensor> in = {tensor};
    finish(impl_->backend->allgather(out, in), "all_gather");
    bytes_["all_gather"] += tensor.numel() * tensor.element_size();
    return out[0];
}

at::Tensor Communicator::all_to_all(const at::Tensor& tensor) {
    if (tensor.size(0) % size() != 0)
        throw InternalError("all_to_all: dim 0 (" + std::to_string(tensor.size(0)) +
                            ") does not divide by the group size " + std::to_string(size()));
    at::Tensor input = tensor.contiguous();
    at::Tensor output = at::empty_like(input);
    std::vector<int64_t> equal;  // empty: equal splits
    finish(impl_->backend->all_to_all_single(output, input, equal, equal), "all_to_all");
    bytes_["all_to_all"] += input.numel() * input.element_size();
    return output;
}

at::Tensor Communicator::all_to_all(const at::Tensor& tensor, const std::vector<int64_t>& send_rows,
                                    const std::vector<int64_t>& receive_rows) {
    const auto rows_of = [](const std::vector<int64_t>& r) {  // -1 when a split is negative
        int64_t total = 0;
        for (int64_t n : r) {
            if (n < 0) return int64_t{-1};
            total += n;
        }
        return total;
    };
    if (static_cast<int>(send_rows.size()) != size() || static_cast<int>(receive_rows.size()) != size() ||
        rows_of(send_rows) != tensor.size(0) || rows_of(receive_rows) < 0)
        throw InternalError("all_to_all: split sizes for " + std::to_string(send_rows.size()) + " and " +
                            std::to_string(receive_rows.size()) + " ranks over dim 0 of " +
                            std::to_string(tensor.size(0)) + " rows, on a group of " +
                            std::to_string(size()));
    at::Tensor input = tensor.contiguous();
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] = rows_of(receive_rows);
    at::Tensor output = at::empty(shape, input.options());
    std::vector<int64_t> out_splits = receive_rows, in_splits = send_rows;
    finish(impl_->backend->all_to_all_single(output, input, out_splits, in_splits), "all_to_all");
    bytes_["all_to_all"] += input.numel() * input.element_size();
    return output;
}

std::vector<at::Tensor> Communicator::all_gather(const at::Tensor& tensor, const std::vector<int64_t>& rows) {
    if (static_cast<int>(rows.size()) != size() || rows[static_cast<std::size_t>(rank())] != tensor.size(0))
        throw InternalError("all_gather: " + std::to_string(rows.size()) + " block sizes for a group of " +
                            std::to_string(size()) + ", this rank's block has " +
                            std::to_string(tensor.size(0)) + " rows");
    const int64_t most = *std::max_element(rows.begin(), rows.end());
    if (most == tensor.size(0) && std::all_of(rows.begin(), rows.end(), [&](int64_t n) { return n == most; }))
        return all_gather(tensor);
    std::vector<int64_t> padded_shape = tensor.sizes().vec();
    padded_shape[0] = most;
    at::Tensor padded = at::zeros(padded_shape, tensor.options());
    padded.narrow(0, 0, tensor.size(0)).copy_(tensor);
    std::vector<at::Tensor> blocks = all_gather(padded);
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = blocks[i].narrow(0, 0, rows[i]);
    return blocks;
}

at::Tensor Communicator::ring_shift(const at::Tensor& tensor) {
    std::vector<at::Tensor> out = {tensor.contiguous()};
    std::vector<at::Tensor> in = {at::empty_like(out[0])};
    const int next = (rank() + 1) % size(), previous = (rank() + size() - 1) % size();
    auto sent = impl_->backend->send(out, next, /*tag=*/7);
    auto received = impl_->backend->recv(in, previous, /*tag=*/7);
    finish(received, "ring recv");
    finish(sent, "ring send");
    bytes_["send"] += out[0].numel() * out[0].element_size();
    return in[0];
}

void Communicator::broadcast(at::Tensor& tensor, int root) {
    std::vector<at::Tensor> t = {tensor};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    finish(impl_->backend->broadcast(t, bo), "broadcast");
    if (rank() == root) bytes_["broadcast"] += tensor.numel() * tensor.element_size();
}

}  // namespace dp::runtime
