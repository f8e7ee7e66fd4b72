#include "runtime/io/weights.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <malloc.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/io/errors.h"
#include "runtime/io/gguf_quants.h"
#include "runtime/io/tensor_io.h"
#include "strategies/model_files.h"

namespace dp::runtime {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
    std::string out = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
}

}  // namespace

WeightStore WeightStore::open_file(const std::string& path, at::ScalarType dtype, at::Device device) {
    WeightStore store(dtype, device);
    store.where_ = path;
    auto file = SafetensorsFile::open(path);
    for (const auto& [name, info] : file->tensors()) store.by_name_[name] = file;
    return store;
}

WeightStore WeightStore::open_single_file(std::shared_ptr<SafetensorsFile> file,
                                          const strategies::SingleFileLayout& layout, at::ScalarType dtype,
                                          at::Device device) {
    WeightStore store(dtype, device);
    store.where_ = file->path();
    for (const auto& [name, stored] : layout.tensors) {
        store.by_name_[name] = file;
        store.stored_[name] = stored;
        const auto shape = layout.shapes.find(name);
        if (shape != layout.shapes.end()) store.stored_shapes_[name] = shape->second;
    }
    return store;
}

WeightStore WeightStore::open_single_file(std::shared_ptr<strategies::GgufFile> file,
                                          const strategies::SingleFileLayout& layout, at::ScalarType dtype,
                                          at::Device device, bool keep_quantized) {
    WeightStore store(dtype, device);
    store.where_ = file->path();
    store.keep_quantized_ = keep_quantized;
    for (const auto& [name, stored] : layout.tensors) {
        store.by_name_[name] = nullptr;  // the names; the bytes are the GGUF file's
        store.stored_[name] = stored;
        const auto shape = layout.shapes.find(name);
        if (shape != layout.shapes.end()) store.stored_shapes_[name] = shape->second;
    }
    store.gguf_ = std::move(file);
    return store;
}

namespace {

// Note [single files]: the rows of the stored tensor that `stored` is, in order, and of them those
// of the slice [start, start + length) of dim 0 (a tensor-parallel shard narrows the ranges); any
// other slice takes every row.
std::vector<std::pair<int64_t, int64_t>> stored_rows(const strategies::StoredTensor& stored,
                                                     const std::vector<int64_t>& shape, int64_t dim,
                                                     int64_t start, int64_t length) {
    std::vector<std::pair<int64_t, int64_t>> rows = stored.rows;
    if (rows.empty()) rows = {{0, shape.empty() ? 1 : shape[0]}};
    if (dim != 0) return rows;
    std::vector<std::pair<int64_t, int64_t>> part;
    int64_t at = 0;
    for (const auto& [first, count] : rows) {
        const int64_t lo = std::max(at, start), hi = std::min(at + count, start + length);
        if (lo < hi) part.emplace_back(first + (lo - at), hi - lo);
        at += count;
    }
    return part;
}

}  // namespace

at::Tensor QuantizedWeight::dequantize() const {
    at::Tensor out = at::empty({rows, columns}, at::kFloat);
    float* values = out.data_ptr<float>();
    // Rows are independent: dequantized in parallel, each exactly as at load.
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            dequantize_rows(*type, reinterpret_cast<const std::byte*>(row_data[static_cast<std::size_t>(r)]),
                            1, columns, values + r * columns);
    });
    return out.to(device, dtype);
}

std::shared_ptr<const QuantizedWeight> WeightStore::take_quantized(const std::string& name,
                                                                   const std::vector<int64_t>& shape,
                                                                   int64_t dim, int64_t start,
                                                                   int64_t length) {
    // Note [kept quantized]: a matrix of a quantized type, whole or cut at block boundaries, that
    // no adapter changes and no trainer keeps; anything else is taken as a tensor.
    if (!keep_quantized_ || !gguf_ || keep_ || shape.size() != 2) return nullptr;
    if (deltas_ && deltas_->count(name)) return nullptr;
    const auto stored = stored_.find(name);
    if (stored == stored_.end() || stored->second.identity || stored->second.squeeze ||
        !stored->second.scale.empty())
        return nullptr;
    const auto known = stored_shapes_.find(name);
    if (known == stored_shapes_.end() || known->second != shape) return nullptr;  // take() names the problem
    const strategies::GgufTensorInfo& info = gguf_->info(stored->second.tensor);
    const std::string type = info.type->name;
    if (type == "F32" || type == "F16" || type == "BF16" || info.shape.size() != 2) return nullptr;
    const int64_t block = static_cast<int64_t>(info.type->block_elements);
    const int64_t block_bytes = static_cast<int64_t>(info.type->block_bytes);
    if (dim == 1 && (start % block != 0 || length % block != 0)) return nullptr;
    const std::vector<std::pair<int64_t, int64_t>> rows =
        stored_rows(stored->second, shape, dim, start, length);
    auto q = std::make_shared<QuantizedWeight>();
    q->type = info.type;
    q->columns = dim == 1 ? length : shape[1];
    q->row_bytes = q->columns / block * block_bytes;
    q->dtype = dtype_;
    q->device = device_;
    const int64_t skip = dim == 1 ? start / block * block_bytes : 0;
    q->mapping = gguf_;
    const std::byte* data = gguf_->data(stored->second.tensor);
    for (const auto& [first, count] : rows) {
        for (int64_t r = first; r < first + count; ++r)
            q->row_data.push_back(
                reinterpret_cast<const uint8_t*>(data + r * static_cast<int64_t>(info.row_bytes) + skip));
        q->rows += count;
    }
    taken_.insert(name);
    if (dim >= 0) sharded_.insert(name);
    taken_bytes_ += q->bytes();
    return q;
}

at::Tensor WeightStore::gguf_rows(const std::string& tensor, int64_t first, int64_t count) const {
    const strategies::GgufTensorInfo& info = gguf_->info(tensor);
    const int64_t row = info.shape.back();
    std::vector<int64_t> shape = info.shape;
    if (shape.size() == 1) {  // one row: its elements are the rows asked for, read whole
        at::Tensor all = at::empty({row}, at::kFloat);
        dequantize_rows(*info.type, gguf_->data(tensor), 1, row, all.data_ptr<float>());
        return all.narrow(0, first, count).contiguous();
    }
    // Rows of the first dimension; each is whole blocks along the last, one after the other.
    int64_t inner_rows = 1;
    for (std::size_t i = 1; i + 1 < shape.size(); ++i) inner_rows *= shape[i];
    shape[0] = count;
    at::Tensor out = at::empty(shape, at::kFloat);
    dequantize_rows(*info.type, gguf_->data(tensor) + first * inner_rows * info.row_bytes, count * inner_rows,
                    row, out.data_ptr<float>());
    return out;
}

WeightStore WeightStore::open_folder(const std::string& dir, at::ScalarType dtype, at::Device device,
                                     const std::string& variant) {
    const strategies::ComponentWeights files = strategies::find_component_weights(dir, variant);
    if (files.index.empty()) {
        WeightStore store = open_file(files.file, dtype, device);
        store.where_ = dir;
        return store;
    }
    WeightStore store(dtype, device);
    store.where_ = dir;
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (const auto& [name, shard] : strategies::read_weight_index(files.index)) {
        if (!shards.count(shard)) shards[shard] = SafetensorsFile::open(dir + "/" + shard);
        if (!shards[shard]->contains(name))
            throw ModelError(files.index + ": says '" + name + "' is in " + shard +
                             ", but that file has no such tensor");
        store.by_name_[name] = shards[shard];
    }
    return store;
}

WeightStore WeightStore::random(uint64_t seed, at::ScalarType dtype, at::Device device) {
    WeightStore store(dtype, device);
    store.where_ = "random(seed=" + std::to_string(seed) + ")";
    store.random_ = true;
    store.seed_ = seed;
    return store;
}

bool WeightStore::has(const std::string& name) const { return random_ || by_name_.count(name) > 0; }

at::Tensor WeightStore::keep(const std::string& name, at::Tensor t) {
    taken_bytes_ += t.numel() * static_cast<int64_t>(t.element_size());
    if (keep_) {
        t = t.detach().clone().requires_grad_(true);  // a leaf of its own, not a view of a mapping
        parameters_.emplace_back(name, t);
    }
    return t;
}

at::Tensor WeightStore::take(const std::string& name, const std::vector<int64_t>& shape) {
    return remember(name, shape, -1, 0, 0, keep(name, take_tensor(name, shape)));
}

at::Tensor WeightStore::remember(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                 int64_t start, int64_t length, at::Tensor t) {
    if (shape.size() == 2 && !keep_)
        remembered_.emplace(name, Taken{t, shape, dim, start, length, dtype_, device_});
    return t;
}

at::Tensor WeightStore::take_shard(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                   int64_t start, int64_t length) {
    if (dim < 0 || dim >= static_cast<int64_t>(shape.size()) || start < 0 || length < 1 ||
        start + length > shape[static_cast<std::size_t>(dim)])
        throw InternalError("take_shard " + name + ": slice [" + std::to_string(start) + ", +" +
                            std::to_string(length) + ") of dim " + std::to_string(dim) + " is outside " +
                            shape_text(shape));
    sharded_.insert(name);
    return remember(name, shape, dim, start, length,
                    keep(name, take_tensor(name, shape, dim, start, length)));
}

at::Tensor WeightStore::take_tensor(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                    int64_t start, int64_t length) {
    at::Tensor base = take_base(name, shape, dim, start, length);
    if (!deltas_) return base;
    const auto it = deltas_->find(name);
    if (it == deltas_->end()) return base;
    if (shape.size() != 2)
        throw ModelError(where_ + ": an adapter changes '" + name + "', which is not a matrix " +
                         shape_text(shape));
    // Note [adapters change weights at load]: this rank's shard of W + sum(factor * up @ down) is
    // W's shard plus the sum of the shards' products: rows of `up` for a split of the output
    // features (column-parallel), columns of `down` for a split of the input features (row-parallel).
    // The base is never written: the changed weight is a tensor of its own.
    at::Tensor sum;
    for (const WeightDelta& d : it->second) {
        const at::Tensor up = dim == 0 ? d.up.narrow(0, start, length) : d.up;
        const at::Tensor down = dim == 1 ? d.down.narrow(1, start, length) : d.down;
        if (up.size(0) != base.size(0) || down.size(1) != base.size(1))
            throw ModelError(where_ + ": an adapter's change of '" + name + "' is " +
                             std::to_string(d.up.size(0)) + "x" + std::to_string(d.down.size(1)) +
                             " but the weight is " + shape_text(shape));
        // On the weight's device, in fp32 (as peft's merge computes B @ A in the factors' dtype).
        const at::Tensor term = at::matmul(up.to(base.device()), down.to(base.device())).mul_(d.factor);
        sum = sum.defined() ? sum.add_(term) : term;
    }
    adapted_.insert(name);
    return base.to(at::kFloat).add(sum).to(base.scalar_type());
}

void WeightStore::set_deltas(std::shared_ptr<const WeightDeltas> deltas) { deltas_ = std::move(deltas); }

void WeightStore::forget_unheld() {
    for (auto it = remembered_.begin(); it != remembered_.end();)
        it = it->second.held.use_count() > 1 ? std::next(it) : remembered_.erase(it);
}

int64_t WeightStore::remembered_bytes(const std::set<std::string>& names) const {
    int64_t bytes = 0;
    for (const auto& [name, t] : remembered_)
        if (names.count(name)) bytes += t.held.numel() * static_cast<int64_t>(t.held.element_size());
    return bytes;
}

bool WeightStore::retake(std::shared_ptr<const WeightDeltas> deltas, const std::set<std::string>& names) {
    // Note [adapter switches in place]: a tensor held by nobody but this store (use_count 1) was
    // copied or replaced by its module, so changing it would change nothing the module computes.
    for (const std::string& name : names) {
        const auto [lo, hi] = remembered_.equal_range(name);
        if (lo == hi) return false;
        for (auto it = lo; it != hi; ++it)
            if (it->second.held.use_count() < 2) return false;
    }
    deltas_ = std::move(deltas);
    const at::ScalarType dtype = dtype_;
    const at::Device device = device_;
    for (const std::string& name : names) {
        const auto [lo, hi] = remembered_.equal_range(name);
        for (auto it = lo; it != hi; ++it) {
            Taken& t = it->second;
            // The new tensor is made in the mode the module's was (an inference tensor only
            // takes set_ inside InferenceMode, a normal one outside it).
            c10::InferenceMode mode(t.held.is_inference());
            dtype_ = t.dtype;
            device_ = t.device;
            at::Tensor fresh = take_tensor(name, t.shape, t.dim, t.start, t.length);
            t.held.set_(fresh);
        }
    }
    dtype_ = dtype;
    device_ = device;
    return true;
}

void WeightStore::check_deltas_used() const {
    if (!deltas_) return;
    for (const auto& [name, terms] : *deltas_)
        if (!adapted_.count(name))
            throw ModelError(where_ + ": an adapter changes '" + name +
                             "', which this model does not load (is the adapter for another model?)");
}

at::Tensor WeightStore::take_base(const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                  int64_t start, int64_t length) {
    taken_.insert(name);
    if (random_) {
        // Each tensor's values depend only on the seed and its name, so a shard holds exactly the
        // values of the whole tensor it comes from.
        at::Generator gen = at::detail::createCPUGenerator(seed_ ^ std::hash<std::string>{}(name));
        const bool is_norm = name.find("norm") != std::string::npos && name.size() > 7 &&
                             name.compare(name.size() - 7, 7, ".weight") == 0;
        // Drawn in fp32 in chunks of rows, each copied (or its part of the shard) into the output
        // and freed, the heap handed back after each tensor: a rank holds its share and one chunk,
        // never the whole tensor in fp32 (the 1.1 GB embedding of Qwen2.5-VL was 2.2 GB of
        // temporaries on every rank).
        std::vector<int64_t> out_shape = shape;
        if (dim >= 0) out_shape[static_cast<std::size_t>(dim)] = length;
        at::Tensor out = at::empty(out_shape, at::TensorOptions().dtype(dtype_).device(device_));
        if (is_norm) return out.fill_(1);
        const double scale = shape.size() == 1 ? 0.01 : 0.02;
        if (shape.empty()) return out.copy_(at::randn(shape, gen, at::kFloat).mul_(scale));
        int64_t row_elements = 1;
        for (std::size_t i = 1; i < shape.size(); ++i) row_elements *= shape[i];
        const int64_t rows = shape[0];
        const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(1, row_elements));
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
            std::vector<int64_t> part = shape;
            part[0] = std::min(chunk, rows - r0);
            const at::Tensor t = at::randn(part, gen, at::kFloat).mul_(scale);
            if (dim < 0) {
                out.narrow(0, r0, part[0]).copy_(t);
            } else if (dim == 0) {  // the rows of this chunk inside [start, start + length)
                const int64_t lo = std::max(r0, start), hi = std::min(r0 + part[0], start + length);
                if (lo < hi) out.narrow(0, lo - start, hi - lo).copy_(t.narrow(0, lo - r0, hi - lo));
            } else {
                out.narrow(0, r0, part[0]).copy_(t.narrow(dim, start, length));
            }
        }
        malloc_trim(0);
        return out;
    }
    auto it = by_name_.find(name);
    if (it == by_name_.end())
        throw ModelError(where_ + ": missing tensor '" + name + "' " + shape_text(shape));
    const auto stored = stored_.find(name);
    if (stored != stored_.end()) return take_stored(where_, stored->second, name, shape, dim, start, length);
    const StTensorInfo& info = it->second->info(name);
    if (info.shape != shape)
        throw ModelError(it->second->path() + ": tensor '" + name + "' has shape " + shape_text(info.shape) +
                         " but the config implies " + shape_text(shape));
    if (dim < 0) return load_tensor(it->second, name, dtype_, device_);
    return load_tensor_slice(it->second, name, dtype_, device_, dim, start, length);
}

at::Tensor WeightStore::take_stored(const std::string& file, const strategies::StoredTensor& stored,
                                    const std::string& name, const std::vector<int64_t>& shape, int64_t dim,
                                    int64_t start, int64_t length) {
    const std::shared_ptr<SafetensorsFile>& shared = by_name_.at(name);
    const auto known = stored_shapes_.find(name);
    if (known == stored_shapes_.end() || known->second != shape)
        throw ModelError(file + ": '" + stored.tensor + "' gives '" + name + "' the shape " +
                         (known == stored_shapes_.end() ? std::string("?") : shape_text(known->second)) +
                         " but the config implies " + shape_text(shape));
    if (stored.identity) {  // Note [bundled files]: not in the file
        const at::Tensor eye =
            at::eye(shape.at(0), shape.at(1), at::TensorOptions().dtype(dtype_).device(device_));
        return dim < 0 ? eye : eye.narrow(dim, start, length).contiguous();
    }
    // A 1x1 convolution's weight stands for a linear layer's: its trailing ones dropped.
    const auto squeezed = [&](const at::Tensor& t) {
        return stored.squeeze ? t.reshape({t.size(0), -1}) : t;
    };
    // Note [single files]: the rows of the stored tensor this tensor is, in order, and of them the
    // slice asked for (a tensor-parallel shard of its rows narrows the ranges; of its columns,
    // each range's columns).
    const std::vector<std::pair<int64_t, int64_t>> rows = stored_rows(stored, shape, dim, start, length);
    std::vector<at::Tensor> pieces;
    if (gguf_) {  // dequantized from the rows needed, in fp32, then the run's dtype
        for (const auto& [first, count] : rows) {
            at::Tensor t = gguf_rows(stored.tensor, first, count);
            if (dim == 1) t = t.narrow(1, start, length).contiguous();
            pieces.push_back(t.to(device_, dtype_));
        }
        return squeezed(pieces.size() == 1 ? pieces.front() : at::cat(pieces, 0));
    }
    const bool whole = stored.rows.empty() && dim != 0;
    for (const auto& [first, count] : rows) {
        at::Tensor t =
            whole ? (dim < 0 ? load_tensor(shared, stored.tensor, dtype_, device_)
                             : load_tensor_slice(shared, stored.tensor, dtype_, device_, dim, start, length))
                  : load_tensor_slice(shared, stored.tensor, dtype_, device_, 0, first, count);
        if (!whole && dim == 1) t = t.narrow(1, start, length).contiguous();
        pieces.push_back(t);
        if (whole) break;
    }
    at::Tensor out = pieces.size() == 1 ? pieces.front() : at::cat(pieces, 0);
    if (!stored.scale.empty())  // scaled fp8: the stored values, converted, times the weight's scale
        out = out.mul(load_tensor(shared, stored.scale, dtype_, device_).reshape({}));
    return squeezed(out);
}

void WeightStore::skip_prefix(const std::string& prefix) {
    for (const auto& [name, file] : by_name_)
        if (name.compare(0, prefix.size(), prefix) == 0) taken_.insert(name);
}

void WeightStore::check_all_taken() const {
    check_deltas_used();
    std::vector<std::string> extra;
    for (const auto& [name, file] : by_name_)
        if (!taken_.count(name)) extra.push_back(name);
    if (extra.empty()) return;
    std::string list;
    for (std::size_t i = 0; i < extra.size() && i < 5; ++i)
        list += (i ? ", " : "") + std::string("'") + extra[i] + "'";
    if (extra.size() > 5) list += " and " + std::to_string(extra.size() - 5) + " more";
    throw ModelError(where_ + ": unexpected tensor(s) " + list + " (does config.json match these weights?)");
}

bool WeightStore::int8_compute(const std::string& layer) const {
    return std::any_of(int8_layers_.begin(), int8_layers_.end(), [&](const std::string& suffix) {
        return layer.size() >= suffix.size() &&
               layer.compare(layer.size() - suffix.size(), suffix.size(), suffix) == 0;
    });
}

}  // namespace dp::runtime
