#include "runtime/pipeline/block_runner.h"

#include <algorithm>
#include <string>

#include "runtime/io/errors.h"
#include "runtime/io/weights.h"
#include "runtime/parallel/device_mapping.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/step_cache.h"

namespace dp::runtime {

std::vector<at::Tensor> BlockContext::attention(
    const std::function<std::vector<at::Tensor>()>& compute) const {
    const auto id = static_cast<int64_t>(index_);
    if (taylorseer_ && taylorseer_->extrapolates())
        return taylorseer_->predict(id);  // Note [taylorseer cache]
    std::vector<at::Tensor> outputs = compute();
    if (taylorseer_) taylorseer_->update(id, outputs);
    return outputs;
}

// Note [device_map blocks]: under device_map each block's weights load on the device its plan
// names, and a pass carries its activations from block to block (BlockPlacement counts every
// move); the embeddings and the head go with block 0.
BlockDevices::BlockDevices(std::shared_ptr<const DeviceMapping> mapping, WeightStore& w, std::size_t blocks,
                           int64_t heads, const TensorGroup& tp)
    : mapping_(std::move(mapping)), blocks_(blocks) {
    if (mapping_ && mapping_->transformer_blocks.size() != blocks)
        throw ModelError("device_map places " + std::to_string(mapping_->transformer_blocks.size()) +
                         " transformer blocks but the model has " + std::to_string(blocks));
    if (mapping_) w.set_device(mapping_->devices[static_cast<std::size_t>(mapping_->transformer_blocks[0])]);
    if (heads < tp.size)
        throw ModelError("--tp " + std::to_string(tp.size) + ": the model has " + std::to_string(heads) +
                         " attention heads, so a rank would hold none; tp may be at most " +
                         std::to_string(heads));
}

void BlockDevices::load_blocks(WeightStore& w, const std::function<void(std::size_t)>& load) const {
    const auto device_of = [&](std::size_t block) {
        return mapping_->devices[static_cast<std::size_t>(mapping_->transformer_blocks[block])];
    };
    for (std::size_t i = 0; i < blocks_; ++i) {
        if (mapping_) w.set_device(device_of(i));
        load(i);
    }
    if (mapping_ && blocks_ > 0) w.set_device(device_of(0));
}

void BlockRunner::run(const BlockPass& pass, const BlockDevices& devices,
                      const std::function<void(const BlockContext&)>& run_block) const {
    if (!pass.image || !pass.image_shard || !pass.conditioning)
        throw InternalError("a block pass needs its image stream, its shard and its conditioning");
    static const StepCaches kNone;
    const StepCaches& cache = caches_ ? *caches_ : kNone;
    const auto skipped = [&](std::size_t i) { return i < pass.skipped.size() && pass.skipped[i]; };
    const bool skips_any = std::find(pass.skipped.begin(), pass.skipped.end(), true) != pass.skipped.end();

    BlockPlacement placement(devices.mapping());
    std::vector<at::Tensor*> carried = pass.activations;
    carried.insert(carried.begin(), {pass.image, pass.conditioning});
    BlockContext context;
    context.taylorseer_ = skips_any ? nullptr : cache.taylorseer;
    const auto run_one = [&](std::size_t i) {
        if (skipped(i)) return;  // as diffusers: neither stream changes
        placement.enter(i, carried);
        context.index_ = i;
        context.last_ = i + 1 == pass.blocks;
        run_block(context);
    };
    at::Tensor& image = *pass.image;
    const auto run_from = [&](std::size_t first) {
        for (std::size_t i = first; i < pass.blocks; ++i) run_one(i);
        return image;
    };

    if (cache.first_block && pass.blocks > 0 && !skipped(0)) {  // Note [first block cache]
        const at::Tensor before = image;
        run_one(0);
        image = cache.first_block->run(before, image, *pass.image_shard, [&](const at::Tensor& first) {
            image = first;
            return run_from(1);
        });
    } else if (cache.mag && !skips_any) {  // Note [mag cache]: every block, or the last residual
        image = cache.mag->run(image, *pass.image_shard, [&](const at::Tensor& in) {
            image = in;
            return run_from(0);
        });
    } else {
        run_from(0);
    }
    placement.leave({pass.image, pass.conditioning});
}

}  // namespace dp::runtime
