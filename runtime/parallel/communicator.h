#pragma once
// Communicator: the collectives the worker and the strategies use, over a c10d process group
// (ProcessGroupGloo on CPU, ProcessGroupNCCL on GPU) created over c10d's TCPStore. Nothing here is
// a transport of our own.
//
// Contract, as c10d's: every rank of the group calls the same collectives in the same order, with
// tensors of the same shape and dtype. Each call blocks until it has completed on this rank, or
// throws CommunicationError (exit code 75) when it fails or the group's timeout passes, naming the
// collective, the group and the timeout. After that the group's order is broken: the rank must
// stop calling collectives on it.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace dp::runtime {

struct CommunicatorOptions {
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    int rank = 0;
    int world_size = 1;
    std::string backend = "gloo";  // or "nccl"
    // How long one collective (and the rendezvous) may take before it fails.
    std::chrono::milliseconds timeout{300000};
    std::string name = "world";  // the group's name in messages: "world", "tp/0.0.0.0./", ...
    // This rank's own address for Gloo's connections (dp-launch --local-addr); empty: 127.0.0.1
    // when the master is a loopback address, else the address the host name resolves to.
    std::string local_addr;
    // Note [a node that never arrives]: how long rank 0 waits for every rank to join the store
    // (0: `timeout`), and the ranks per node, which a message names a missing node by (0: none).
    std::chrono::milliseconds join_timeout{0};
    int ranks_per_node = 0;
};

// A store shared by ranks that run as threads of this process (c10d's HashStore), for tests
// that run a group in one process.
class InProcessStore {
  public:
    InProcessStore();
    ~InProcessStore();
    InProcessStore(const InProcessStore&) = delete;
    InProcessStore& operator=(const InProcessStore&) = delete;
    const c10::intrusive_ptr<c10d::Store>& store() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

class Communicator {
  public:
    // Joins the group: rank 0 hosts the TCPStore at master_addr:master_port. Throws Error when the
    // rendezvous does not complete within the timeout or the backend is not built in.
    explicit Communicator(const CommunicatorOptions& options);
    // Joins the group through `store`, which every rank shares: any c10d store, such as
    // an InProcessStore for ranks that run as threads of one process (tests). master_addr and
    // master_port are not used.
    Communicator(const c10::intrusive_ptr<c10d::Store>& store, const CommunicatorOptions& options);
    Communicator(const InProcessStore& store, const CommunicatorOptions& options)
        : Communicator(store.store(), options) {}
    ~Communicator();
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return options_.rank; }
    int size() const { return options_.world_size; }
    const std::string& name() const { return options_.name; }
    const std::string& backend() const { return options_.backend; }

    void barrier();
    // The group's store (c10d's), for small values every rank can read: `get` waits for the key
    // up to the group's timeout. Keys are this group's (a sub-group's are prefixed by its tag).
    void store_set(const std::string& key, const std::string& value);
    std::string store_get(const std::string& key);
    // Adds `delta` to the integer at `key` (0 while absent) and returns the sum, in one step of the
    // store: ranks that add at the same time each get a different sum.
    int64_t store_add(const std::string& key, int64_t delta);
    void all_reduce(at::Tensor& tensor);      // sum, in place
    void all_reduce_max(at::Tensor& tensor);  // maximum, in place
    std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
    // All_gather of blocks whose dim 0 differs by rank: rank i holds rows[i] rows (the other dims
    // equal), and gets every block back, block i from rank i. On the wire each block is padded to
    // the most rows (and counted so in bytes()); equal rows are a plain all_gather.
    std::vector<at::Tensor> all_gather(const at::Tensor& tensor, const std::vector<int64_t>& rows);
    void broadcast(at::Tensor& tensor, int root);
    // Splits dim 0 into size() equal blocks, sends block i to rank i, and returns the blocks
    // received, block i from rank i, in the same shape.
    at::Tensor all_to_all(const at::Tensor& tensor);
    // Unequal splits (c10d's all_to_all_single with split sizes): sends the next send_rows[i] rows
    // of dim 0 to rank i, and returns the rows received, receive_rows[i] from rank i, in rank order.
    // Rank j's send_rows[i] must equal rank i's receive_rows[j].
    at::Tensor all_to_all(const at::Tensor& tensor, const std::vector<int64_t>& send_rows,
                          const std::vector<int64_t>& receive_rows);
    // Sends `tensor` to the next rank ((rank + 1) % size) and returns what the previous rank sent:
    // one step of a ring.
    at::Tensor ring_shift(const at::Tensor& tensor);

    // A sub-group of `ranks` (global ranks, in group order) over this group's store, under `tag`.
    // Only members call it, each once per tag; returns their Communicator, whose rank() and size()
    // are within the sub-group.
    std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& tag);

    // Bytes this rank sent into each kind of collective ("all_reduce", "all_gather", ...).
    const std::map<std::string, uint64_t>& bytes() const { return bytes_; }

  private:
    struct Impl;
    Communicator(const CommunicatorOptions& options, std::unique_ptr<Impl> impl);
    // Waits for `work`; throws CommunicationError naming `what`, the group and the timeout.
    void finish(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const;
    CommunicatorOptions options_;
    std::unique_ptr<Impl> impl_;
    std::map<std::string, uint64_t> bytes_;
};

}  // namespace dp::runtime
