#pragma once
// Where a component's weights come from: its safetensors files (single or sharded, mmapped), or
// seeded random values for tests and benchmarks. Modules ask for each tensor by its diffusers /
// transformers name with the shape their config implies; the store checks the name exists and
// the shape agrees, converts to the run's dtype and device, and finally reports tensors nobody
// asked for.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/safetensors.h"
#include "runtime/io/shard_source.h"
#include "strategies/gguf.h"
#include "strategies/single_file.h"

namespace dp::runtime {

// One LoRA term of a weight [out, in]: factor * up @ down, with up [out, rank] and down [rank, in]
// in fp32 on the CPU (runtime/io/lora.h makes them from adapter files).
struct WeightDelta {
    at::Tensor down, up;
    double factor = 1;
};
// Base weight name -> the terms that change it, in the adapters' order.
using WeightDeltas = std::map<std::string, std::vector<WeightDelta>>;

class WeightStore : public ShardSource {
  public:
    // The safetensors weights of a component folder: `*.safetensors.index.json` (sharded) or a
    // single `*.safetensors`; with `variant`, `*.safetensors.index.VARIANT.json` or
    // `*.VARIANT.safetensors` (strategies::find_component_weights). Tensors stored in another dtype
    // are converted to `dtype` as they are taken. Throws ModelError when there are none, several
    // unindexed files, or only another variant's.
    static WeightStore open_folder(const std::string& dir, at::ScalarType dtype, at::Device device,
                                   const std::string& variant = "");
    // One file, for tests.
    static WeightStore open_file(const std::string& path, at::ScalarType dtype, at::Device device);
    // A component's single file (Note [single files], strategies/single_file.h): each tensor taken
    // by its diffusers name from where `layout` says `file` keeps it (rows of a fused tensor, times
    // its scale), converted to `dtype` as to(dtype) converts it (fp8 included).
    static WeightStore open_single_file(std::shared_ptr<SafetensorsFile> file,
                                        const strategies::SingleFileLayout& layout, at::ScalarType dtype,
                                        at::Device device);
    // A GGUF file likewise (Note [gguf]): each tensor dequantized to fp32 from the rows it needs
    // (a tp rank's share only), then converted to `dtype`.
    // `keep_quantized`: matrices of a quantized type are given by take_quantized (Note [kept quantized]).
    static WeightStore open_single_file(std::shared_ptr<strategies::GgufFile> file,
                                        const strategies::SingleFileLayout& layout, at::ScalarType dtype,
                                        at::Device device, bool keep_quantized = false);
    // Seeded random weights of whatever shape is asked for: N(0, 0.02) for matrices, ones for
    // norm weights, small values for biases. The same seed and names give the same weights.
    static WeightStore random(uint64_t seed, at::ScalarType dtype, at::Device device);

    // The tensor `name` with shape `shape`. Throws ModelError naming the file and tensor when it is
    // missing or its shape differs.
    at::Tensor take(const std::string& name, const std::vector<int64_t>& shape) override;
    // Its slice [start, start + length) along `dim`, narrowed before it is converted and moved, so
    // that only the slice becomes resident (tensor-parallel shards).
    at::Tensor take_shard(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                          int64_t start, int64_t length) override;
    std::shared_ptr<const QuantizedWeight> take_quantized(const std::string& name,
                                                          const std::vector<int64_t>& shape, int64_t dim,
                                                          int64_t start, int64_t length) override;
    // Bytes of every tensor taken so far, as taken (a shard's, in its dtype): what a module holds
    // is the difference across its loading, so no layer can be left out of its count.
    int64_t taken_bytes() const { return taken_bytes_; }
    // The tensors taken as slices so far (what tensor parallelism split).
    const std::set<std::string>& sharded() const { return sharded_; }
    // Whether `name` exists (a random store has every name).
    bool has(const std::string& name) const;
    // Whether this store makes seeded random values rather than reading files.
    bool is_random() const { return random_; }
    // Marks every tensor whose name starts with `prefix` as not needed (a VAE's encoder, say).
    void skip_prefix(const std::string& prefix);
    // Throws ModelError listing tensors present in the files but never taken (and, with deltas,
    // check_deltas_used's).
    void check_all_taken() const;

    // Adapters: every weight taken from now on that `deltas` names is its base plus their sum
    // (Note [adapters change weights at load]); the base tensors are never written.
    void set_deltas(std::shared_ptr<const WeightDeltas> deltas);
    // Throws ModelError naming a weight the deltas change that was never taken.
    void check_deltas_used() const;

    // Note [adapter switches in place]: every matrix taken is remembered, with the slice it was
    // taken as. After its module is built, forget_unheld() drops what the module did not keep as it
    // was taken (a fused or reshaped copy, say), so the store holds no memory of its own. A switch
    // of adapters then calls retake(): each remembered tensor of `names` is made again from its
    // base with `deltas` and the module's tensor is pointed at it (Tensor::set_), so the module
    // sees the new weight and every other tensor stays as it is. Returns false, changing nothing,
    // when a weight of `names` is not held as it was taken (never taken, forgotten, or since
    // replaced by its module): then the component must be built again.
    void forget_unheld();
    bool retake(std::shared_ptr<const WeightDeltas> deltas, const std::set<std::string>& names);
    // Bytes of the tensors remembered for `names` (what a retake of them makes).
    int64_t remembered_bytes(const std::set<std::string>& names) const;

    // Training: every tensor taken from now on requires grad and is kept, by name, for the
    // optimizer and for saving (the modules hold the same tensors).
    void keep_as_parameters() { keep_ = true; }
    const std::vector<std::pair<std::string, at::Tensor>>& parameters() const { return parameters_; }

    // Note [int8 compute]: the linear layers whose names end with one of `suffixes` run as int8
    // products (--quantize int8, over the family's allow-list, strategies::ParallelSpec::int8_layers).
    void set_int8_layers(std::vector<std::string> suffixes) { int8_layers_ = std::move(suffixes); }
    bool int8_compute(const std::string& layer) const override;

    // Where the tensors taken from now on go (device_map loads blocks on several devices).
    void set_device(at::Device device) { device_ = device; }
    // The dtype the tensors taken from now on get, converted from the file's (T5 keeps some
    // layers in fp32 in an fp16 run).
    void set_dtype(at::ScalarType dtype) { dtype_ = dtype; }

    const std::string& where() const { return where_; }
    at::ScalarType dtype() const { return dtype_; }
    at::Device device() const { return device_; }

  private:
    // The whole tensor, or with dim >= 0 its slice, converted and on the store's device.
    at::Tensor take_tensor(const std::string& name, const std::vector<int64_t>& shape, int64_t dim = -1,
                           int64_t start = 0, int64_t length = 0);
    at::Tensor take_base(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                         int64_t start, int64_t length);
    at::Tensor keep(const std::string& name, at::Tensor t);
    at::Tensor take_stored(const std::string& file, const strategies::StoredTensor& stored,
                           const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                           int64_t start, int64_t length);
    // `t` as taken; a matrix is remembered for retake().
    at::Tensor remember(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                        int64_t start, int64_t length, at::Tensor t);
    WeightStore(at::ScalarType dtype, at::Device device) : dtype_(dtype), device_(device) {}
    std::string where_;
    at::ScalarType dtype_;
    at::Device device_;
    bool random_ = false;
    bool keep_ = false;
    std::vector<std::pair<std::string, at::Tensor>> parameters_;
    uint64_t seed_ = 0;
    std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name_;  // tensor -> file holding it
    std::map<std::string, strategies::StoredTensor> stored_;           // a single file's: where in it
    std::map<std::string, std::vector<int64_t>> stored_shapes_;
    std::shared_ptr<strategies::GgufFile> gguf_;  // a GGUF single file's
    bool keep_quantized_ = false;
    std::vector<std::string> int8_layers_;
    // The rows [first, first + count) of GGUF tensor `tensor`, in fp32.
    at::Tensor gguf_rows(const std::string& tensor, int64_t first, int64_t count) const;
    std::set<std::string> taken_;
    std::set<std::string> sharded_;
    std::shared_ptr<const WeightDeltas> deltas_;
    std::set<std::string> adapted_;
    struct Taken {  // a matrix as it was taken, and the tensor its module holds
        at::Tensor held;
        std::vector<int64_t> shape;
        int64_t dim = -1, start = 0, length = 0;
        at::ScalarType dtype;
        at::Device device;
    };
    std::multimap<std::string, Taken> remembered_;
    int64_t taken_bytes_ = 0;
};

}  // namespace dp::runtime
