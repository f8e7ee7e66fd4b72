#pragma once
// Note [block runner]: a transformer's blocks for one pass, run in one place for every family, as
// diffusers applies its caches once over any model's blocks (here one explicit function, not
// hooks). A family describes its pass (its image stream, what the blocks read) and hands over one
// block at a time; the runner decides the rest:
//   - the step cache of the call (Note [first block cache], Note [mag cache]): block 0, then the
//     other blocks or their last residual, or every block or the last residual of them all;
//   - TaylorSeer's per-block state (Note [taylorseer cache]): a block's attention outputs are
//     computed or extrapolated through BlockContext::attention;
//   - device_map's placement (Note [device_map blocks]): each block's inputs moved to its device as
//     the pass enters it, the image stream and the conditioning back to the head's at the end; at
//     load, each block's weights on its device.
// No family folder names a cache or a placement; a new cache is one file beside step_cache.h and
// a branch here.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace dp::runtime {

struct StepCaches;  // step_cache.h
struct DeviceMapping;
struct TensorGroup;
class SequenceShard;
class TaylorSeerCache;
class WeightStore;

// One block's place in a pass, as the runner hands it to the family.
class BlockContext {
  public:
    std::size_t index() const { return index_; }  // the block's place in the model, from 0
    bool last() const { return last_; }  // the model's last block: what feeds nothing after it may go
    // The block's attention outputs (each already projected): compute()'s, or on a pass the step
    // cache extrapolates them, its series. A block asks once per pass, with the same outputs in the
    // same order every pass.
    std::vector<at::Tensor> attention(const std::function<std::vector<at::Tensor>()>& compute) const;

  private:
    friend class BlockRunner;
    std::size_t index_ = 0;
    bool last_ = false;
    TaylorSeerCache* taylorseer_ = nullptr;
};

// The transformer blocks' devices, fixed at load: none (every block where the weights load), or
// device_map's slots.
class BlockDevices {
  public:
    BlockDevices() = default;
    // Checks the model's `blocks` and `heads` against the run before anything loads: device_map
    // (when `mapping` is set) places exactly `blocks` blocks, and tp leaves every rank at least
    // one head. The weights then load on block 0's device (where the embeddings and head go).
    // Throws ModelError naming what does not fit.
    BlockDevices(std::shared_ptr<const DeviceMapping> mapping, WeightStore& weights, std::size_t blocks,
                 int64_t heads, const TensorGroup& tp);
    // Loads every block, load(i) with the weights going to block i's device, then returns the
    // weights to block 0's device for what follows the blocks.
    void load_blocks(WeightStore& weights, const std::function<void(std::size_t)>& load) const;
    const DeviceMapping* mapping() const { return mapping_.get(); }

  private:
    std::shared_ptr<const DeviceMapping> mapping_;
    std::size_t blocks_ = 0;
};

// One pass through the blocks, as the family describes it.
struct BlockPass {
    std::size_t blocks = 0;
    // The image stream, which the step caches watch: block 0's input before the pass, and the last
    // block's output after it (the family leaves it there).
    at::Tensor* image = nullptr;
    const SequenceShard* image_shard = nullptr;  // its split over the sequence groups
    // The conditioning every block and the head read (the timestep's, after SiLU).
    at::Tensor* conditioning = nullptr;
    // What else the blocks read (the text stream, rotary tables, biases): each moved to a block's
    // device as the pass enters it; undefined ones are left alone.
    std::vector<at::Tensor*> activations;
    // Blocks that do not run in this pass (SD3's skip-layer guidance); empty: none. A pass that
    // skips any computes in full: no step cache but the first block's, when block 0 runs.
    std::vector<bool> skipped;
};

// What the one loop gives a transformer call (Note [step cache point]): that call's step cache.
class BlockRunner {
  public:
    BlockRunner() = default;  // no step cache: every block computed
    explicit BlockRunner(const StepCaches& caches) : caches_(&caches) {}
    // Runs `pass`: run_block(context) applies block context.index() to the family's streams.
    // Every rank of the call's sequence and tensor groups calls it at the same point.
    void run(const BlockPass& pass, const BlockDevices& devices,
             const std::function<void(const BlockContext&)>& run_block) const;

  private:
    const StepCaches* caches_ = nullptr;
};

}  // namespace dp::runtime
