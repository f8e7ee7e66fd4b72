#pragma once
// What every family's transformer holds besides its layers: its config, its place in the mesh, its
// blocks' devices (Note [block runner]) and the bytes it loaded. A family's transformer derives from
// TransformerBase<its config> and loads its layers in its constructor.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/io/config_file.h"
#include "runtime/io/weights.h"
#include "runtime/models/common/layers.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/parallel/parallel_linear.h"
#include "runtime/pipeline/block_runner.h"
#include "strategies/family.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

class ConfigJson;

// Throws ModelError unless `timestep` holds one value per prompt of `batch` (or one for all), and
// `guidance` likewise exactly when the model has a guidance embedder; `with` and `without` name
// the model of each kind ("FLUX.1-dev", "FLUX.1-schnell").
void check_time_inputs(const at::Tensor& timestep, const at::Tensor& guidance, int64_t batch,
                       bool guidance_embeds, const std::string& with, const std::string& without);

// A config's axes_dims_rope (rotary dims per position axis, FLUX's): `fallback` when absent, else
// as many even integers as `fallback` has, summing to `head_dim`; `axes` names them for the
// message ("index, row, column"). Throws ModelError naming the key.
std::vector<int64_t> rope_axes_dims(const ConfigJson& c, const std::vector<int64_t>& fallback,
                                    int64_t head_dim, const std::string& axes);

template <typename Config>
class TransformerBase {
  public:
    const Config& config() const { return config_; }
    // Bytes of the weights this rank holds (its shards under tensor parallelism): every tensor it
    // took from its store.
    int64_t parameter_bytes() const { return parameter_bytes_; }

  protected:
    // Checks the model's `blocks` and heads against the run before anything loads (BlockDevices:
    // device_map places every block, tp leaves each rank a head); the weights then load on block
    // 0's device. `parallel` must outlive the transformer; `family` names the parallel spec its
    // layers split by (strategies::family_spec).
    TransformerBase(const Config& config, WeightStore& weights, const ParallelContext& parallel,
                    std::shared_ptr<const DeviceMapping> mapping, std::size_t blocks, const char* family)
        : parallel_(&parallel),
          config_(config),
          devices_(std::move(mapping), weights, blocks, config.num_attention_heads, parallel.tensor()),
          spec_(&strategies::family_spec(family)),
          text_split_(strategies::stream_split(*spec_, "text")),
          loaded_before_(weights.taken_bytes()) {}
    // The loader of every linear layer from `weights`, split as the family's spec says over this
    // rank's tensor group.
    LinearLoader linear_loader(WeightStore& weights) const {
        return LinearLoader(weights, *spec_, parallel_->tensor());
    }
    // At the end of the family's constructor: what it took from `weights` is its parameter bytes.
    void loaded(const WeightStore& weights) { parameter_bytes_ = weights.taken_bytes() - loaded_before_; }

    const ParallelContext* parallel_;
    Config config_;
    BlockDevices devices_;
    const strategies::ParallelSpec* spec_;
    bool text_split_;  // the spec's text stream: split like the image, or replicated

  private:
    int64_t loaded_before_ = 0, parameter_bytes_ = 0;
};

}  // namespace dp::runtime
