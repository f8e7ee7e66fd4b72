#include "runtime/io/tensor_io.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "protocol/atomic_file.h"
#include "runtime/io/errors.h"

namespace dp::runtime {
namespace {

// Each safetensors dtype and LibTorch's type for it: one table for reading and writing.
constexpr std::pair<StDType, at::ScalarType> kDTypes[] = {{StDType::kF64, at::kDouble},
                                                          {StDType::kF32, at::kFloat},
                                                          {StDType::kF16, at::kHalf},
                                                          {StDType::kBF16, at::kBFloat16},
                                                          {StDType::kI64, at::kLong},
                                                          {StDType::kI32, at::kInt},
                                                          {StDType::kI16, at::kShort},
                                                          {StDType::kI8, at::kChar},
                                                          {StDType::kU8, at::kByte},
                                                          {StDType::kBool, at::kBool},
                                                          {StDType::kF8E4M3, at::kFloat8_e4m3fn},
                                                          {StDType::kF8E5M2, at::kFloat8_e5m2}};

at::ScalarType to_scalar_type(StDType dtype) {
    for (const auto& [st, type] : kDTypes)
        if (st == dtype) return type;
    return at::kFloat;
}

StDType to_st_dtype(at::ScalarType type, const std::string& name) {
    for (const auto& [st, t] : kDTypes)
        if (t == type) return st;
    throw ModelError("cannot save tensor '" + name + "': unsupported dtype " +
                     std::string(c10::toString(type)));
}

}  // namespace

namespace {

// Note [Weights are 64-byte aligned]
// A tensor aliases the file's mapping only where its data starts on a 64-byte boundary, the
// alignment LibTorch's CPU allocator gives every tensor it makes; elsewhere it is copied once into
// such a tensor. Alignment is not only a matter of speed: MKL's kernels (gemv, where a linear
// layer sees one row: a timestep or pooled-text embedding) take another path for a misaligned
// operand, and their sums round differently. A safetensors file puts its data wherever the header
// ends, so the same weights stored in two files (an fp32 file, or an fp16 variant converted on
// load) would otherwise give different latents, and a reference that loads into fresh tensors
// (diffusers, transformers) differs from us by a rounding.
constexpr std::uintptr_t kWeightAlignment = 64;

at::Tensor mapped_tensor(const std::shared_ptr<SafetensorsFile>& file, const std::string& name) {
    const StTensorInfo& info = file->info(name);
    const at::ScalarType stored = to_scalar_type(info.dtype);
    const auto* ptr = file->data(name);
    if (reinterpret_cast<std::uintptr_t>(ptr) % kWeightAlignment == 0) {
        // Keep the mapping alive as long as the tensor aliases it.
        auto keep = file;
        return at::from_blob(
            const_cast<std::byte*>(ptr), info.shape, [keep](void*) {}, at::TensorOptions().dtype(stored));
    }
    at::Tensor raw = at::empty(info.shape, at::TensorOptions().dtype(stored));
    std::memcpy(raw.data_ptr(), ptr, info.nbytes);
    return raw;
}

}  // namespace

at::Tensor load_tensor(const std::shared_ptr<SafetensorsFile>& file, const std::string& name,
                       at::ScalarType dtype, at::Device device) {
    return mapped_tensor(file, name).to(device, dtype);
}

at::Tensor load_tensor_slice(const std::shared_ptr<SafetensorsFile>& file, const std::string& name,
                             at::ScalarType dtype, at::Device device, int64_t dim, int64_t start,
                             int64_t length) {
    at::Tensor slice = mapped_tensor(file, name).narrow(dim, start, length);
    // A copy of the slice alone: never a view that keeps the whole tensor (or mapping) alive.
    at::Tensor out = slice.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
    return out.is_contiguous() ? out : out.contiguous();
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::vector<at::Tensor> cpu;
    std::size_t offset = 0;
    for (const auto& [name, tensor] : tensors) {
        at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
        const StDType dtype = to_st_dtype(t.scalar_type(), name);
        const std::size_t nbytes = t.numel() * st_dtype_size(dtype);
        header[name] = {{"dtype", st_dtype_name(dtype)},
                        {"shape", t.sizes().vec()},
                        {"data_offsets", {offset, offset + nbytes}}};
        offset += nbytes;
        cpu.push_back(t);
    }
    std::string text = header.dump();
    // The data starts on a 64-byte boundary, so the first tensor is mapped, not copied, when read
    // back (Note [Weights are 64-byte aligned]).
    text.append((64 - (8 + text.size()) % 64) % 64, ' ');
    // Note [atomic file]: a reader sees the whole file or none.
    protocol::AtomicFile out(path);
    char le[8];
    for (int i = 0; i < 8; ++i)
        le[i] = static_cast<char>((static_cast<std::uint64_t>(text.size()) >> (8 * i)) & 0xff);
    out.write(std::string_view(le, 8));
    out.write(text);
    for (const at::Tensor& t : cpu)
        out.write(std::string_view(static_cast<const char*>(t.data_ptr()),
                                   static_cast<std::size_t>(t.numel() * t.element_size())));
    out.commit();
}

}  // namespace dp::runtime
