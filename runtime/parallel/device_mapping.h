#pragma once
// device_map's executor: one process, its components (and the transformer's blocks) on several
// devices. Each part loads its weights on its device; activations move between devices where the
// plan changes device (BlockPlacement), and every move is counted.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strategies/device_map.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

struct DeviceMapping {
    std::vector<std::string> labels;        // "cuda:1", "cpu:0", ...: the plan's devices
    std::vector<at::Device> devices;        // what each label runs on ("cpu:N" all run on the CPU)
    std::map<std::string, int> components;  // component (model_index.json key) -> slot in labels
    std::vector<int> transformer_blocks;    // block i's slot; the embeddings and head go with block 0

    // A component's slot; one the plan does not name goes with transformer block 0.
    int slot_of(const std::string& component) const;
    at::Device device_of(const std::string& component) const {
        return devices[static_cast<std::size_t>(slot_of(component))];
    }

    // The executor's slots for `plan`: each placement's device, the transformer (spec.transformer)
    // block by block over its `blocks` blocks. Throws UsageError for a device that is not there.
    static std::shared_ptr<DeviceMapping> from_plan(const strategies::DeviceMapPlan& plan,
                                                    const strategies::ParallelSpec& spec, std::size_t blocks);

    // A "kind:N" label as the device it runs on. Throws Error (exit 2) for a CUDA device that is
    // not there.
    static at::Device device_for(const std::string& label);

    // `t` moved from slot `from` to slot `to`; counted when the slots differ (even two CPU
    // "devices", so that a test on CPU sees the moves a GPU run makes).
    at::Tensor move(const at::Tensor& t, int from, int to) const;
    uint64_t moved_bytes() const { return moved_bytes_.load(); }
    int64_t moves() const { return moves_.load(); }

    // device_map's default budgets: 90 % of each visible GPU's memory, as ("cuda:N", bytes).
    // Empty without CUDA.
    static std::vector<std::pair<std::string, int64_t>> visible_gpu_budgets();

  private:
    mutable std::atomic<uint64_t> moved_bytes_{0};
    mutable std::atomic<int64_t> moves_{0};
};

// The walk of one forward pass through a model's blocks under a device mapping: it moves the
// activations it is given to each block's device as the pass enters the block, and back to the
// head's (block 0's) at the end. Without a mapping it does nothing.
class BlockPlacement {
  public:
    explicit BlockPlacement(const DeviceMapping* mapping) : mapping_(mapping) {
        if (mapping_) slot_ = head_ = mapping_->transformer_blocks.front();
    }
    // Before block `block` runs: `activations` moved to its device.
    void enter(std::size_t block, const std::vector<at::Tensor*>& activations) {
        if (mapping_) move_to(mapping_->transformer_blocks[block], activations);
    }
    // After the last block: `activations` back on the head's device.
    void leave(const std::vector<at::Tensor*>& activations) {
        if (mapping_) move_to(head_, activations);
    }

  private:
    void move_to(int slot, const std::vector<at::Tensor*>& activations) {
        if (slot == slot_) return;
        for (at::Tensor* t : activations) *t = mapping_->move(*t, slot_, slot);
        slot_ = slot;
    }
    const DeviceMapping* mapping_;
    int slot_ = 0, head_ = 0;
};

}  // namespace dp::runtime
