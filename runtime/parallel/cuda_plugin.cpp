// libdp_cuda.so: the worker's calls into libtorch_cuda, loaded only where a CUDA device can exist
// (Note [CUDA loaded on demand] in runtime/parallel/cuda_support.cpp). Loading it runs
// libtorch_cuda's static registrations: ATen's CUDA hooks, the CUDA kernels and c10d's NCCL
// backend.
#ifdef DP_WITH_CUDA_HEADERS
#include <ATen/cuda/CUDAContext.h>
#endif
#ifdef DP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "runtime/parallel/cuda_support.h"

namespace {

#ifdef DP_WITH_NCCL
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                            std::chrono::milliseconds timeout) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}
#endif

#ifdef DP_WITH_CUDA_HEADERS
int64_t device_memory(int index) {
    return static_cast<int64_t>(
        at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->totalGlobalMem);
}
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) const dp::runtime::CudaPluginApi* dp_cuda_plugin_api() {
    static const dp::runtime::CudaPluginApi api = [] {
        dp::runtime::CudaPluginApi a;
#ifdef DP_WITH_NCCL
        a.make_nccl = &make_nccl;
#endif
#ifdef DP_WITH_CUDA_HEADERS
        a.device_memory = &device_memory;
#endif
        return a;
    }();
    return &api;
}
