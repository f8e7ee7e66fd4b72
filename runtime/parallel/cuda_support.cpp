#include "runtime/parallel/cuda_support.h"

#include <ATen/Context.h>
#include <dlfcn.h>
#include <unistd.h>

#include <iostream>
#include <mutex>

namespace dp::runtime {

// Note [CUDA loaded on demand]: libtorch_cuda and the CUDA libraries it needs (cuBLAS, cuDNN, NCCL,
// ...) cost a process about 0.3 s of start-up in their static registrations, and every rank and
// every model check is a process. The worker links only LibTorch's CPU half; the calls that need
// the CUDA half are in our plugin libdp_cuda.so (runtime/parallel/cuda_plugin.cpp), which links it.
// The first question about CUDA (cuda_available()) loads the plugin where NVIDIA's driver
// (libcuda.so.1) is, before ATen is asked: ATen fixes its CUDA hooks at the first question, and the
// plugin's load registers them. Without the driver no CUDA device can exist, so nothing is loaded
// and the answer is the one LibTorch would give. Every CUDA question in the worker goes through
// cuda_available(), never at::hasCUDA() directly.
namespace {

const CudaPluginApi* g_plugin = nullptr;

std::string own_folder() {
    char path[4096];
    const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (n <= 0) return ".";
    const std::string exe(path, static_cast<std::size_t>(n));
    const std::size_t slash = exe.rfind('/');
    return slash == std::string::npos ? "." : exe.substr(0, slash);
}

void load_plugin() {
    if (!::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) return;  // no driver: no CUDA device
    const std::string file = own_folder() + "/../lib/" + DP_CUDA_PLUGIN_NAME;
    std::string why;
    g_plugin = load_cuda_plugin(file, why);
    if (!g_plugin)
        std::cerr << "dp-worker: NVIDIA's driver is here but CUDA is not: " << why
                  << "; running on the CPU (build with the CUDA toolkit for GPUs)" << std::endl;
}

}  // namespace

const CudaPluginApi* load_cuda_plugin(const std::string& file, std::string& why) {
    if (::access(file.c_str(), R_OK) != 0) {
        why = file + " is not there (this build has no CUDA plugin)";
        return nullptr;
    }
    void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
        const char* e = ::dlerror();
        why = file + " does not load: " + (e ? e : "unknown error");
        return nullptr;
    }
    const auto entry = reinterpret_cast<CudaPluginEntry>(::dlsym(handle, kCudaPluginEntry));
    const CudaPluginApi* api = entry ? entry() : nullptr;
    if (!api || api->version != CudaPluginApi::kVersion) {
        why = file + " is not this build's plugin (no " + kCudaPluginEntry + " of version " +
              std::to_string(CudaPluginApi::kVersion) + ")";
        return nullptr;
    }
    return api;
}

const CudaPluginApi* cuda_plugin() {
    cuda_available();
    return g_plugin;
}

bool cuda_available() {
    static std::once_flag once;
    std::call_once(once, load_plugin);
    return g_plugin && at::hasCUDA();
}

}  // namespace dp::runtime
