#pragma once
// device_map's executor: one process, its components (and the transformer's blocks) on several
// devices. Each part loads its weights on its device; activations move between devices where the
// plan changes device, and every move is counted.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dp::runtime {

struct DeviceMapping {
    std::vector<std::string> labels;  // "cuda:1", "cpu:0", ...: the plan's devices
    std::vector<at::Device> devices;  // what each label runs on ("cpu:N" all run on the CPU)
    int text_encoder = 0, text_encoder_2 = 0, vae = 0;  // slots, indices into labels
    std::vector<int> transformer_blocks;  // block i's slot; the embeddings and head go with block 0

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

}  // namespace dp::runtime
