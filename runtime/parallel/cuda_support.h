#pragma once
// LibTorch's CUDA half on demand (Note [CUDA loaded on demand] in cuda_support.cpp): whether a
// CUDA device can be used, and the calls of libdp_cuda.so (cuda_plugin.cpp), which need
// libtorch_cuda. Both sides are built by the same build with the same compiler, so C++ types cross
// the boundary. Light header: no ATen.

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace c10d {
class Store;
class Backend;
}  // namespace c10d

namespace dp::runtime {

struct CudaPluginApi {
    static constexpr int kVersion = 1;
    int version = kVersion;
    // c10d's NCCL process group for `rank` of `size` over `store`; null where the build had no
    // nccl.h.
    using MakeNccl = c10::intrusive_ptr<c10d::Backend> (*)(const c10::intrusive_ptr<c10d::Store>& store,
                                                           int rank, int size,
                                                           std::chrono::milliseconds timeout);
    MakeNccl make_nccl = nullptr;
    // The memory of CUDA device `index`, in bytes; null where the build had no CUDA headers.
    int64_t (*device_memory)(int index) = nullptr;
};

// The plugin's one exported symbol.
using CudaPluginEntry = const CudaPluginApi* (*)();
inline constexpr const char* kCudaPluginEntry = "dp_cuda_plugin_api";

// Whether a CUDA device can be used, LibTorch's CUDA half loaded first where NVIDIA's driver is.
// Every CUDA question goes through this, never at::hasCUDA().
bool cuda_available();

// The plugin's calls once it is loaded (cuda_available() loads it), else null.
const CudaPluginApi* cuda_plugin();

// Loads the plugin `file` (RTLD_GLOBAL) and returns its calls, or null with `why` filled.
const CudaPluginApi* load_cuda_plugin(const std::string& file, std::string& why);

}  // namespace dp::runtime
