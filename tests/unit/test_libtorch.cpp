// The worker side links the pinned LibTorch from the wheel and computes with it on CPU.
#include "unit/doctest_torch.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include "runtime/libtorch_info.h"
#include "runtime/parallel/cuda_support.h"
#include "support/test_paths.h"

TEST_CASE("the worker is built against the LibTorch the build configured") {
    const std::string expected = DP_EXPECTED_LIBTORCH;  // e.g. "2.15.0+cu132"
    CHECK(!dp::runtime::libtorch_version().empty());
    CHECK(expected.rfind(dp::runtime::libtorch_version(), 0) == 0);
}

TEST_CASE("LibTorch computes on CPU here (a closed-form check)") {
    at::Tensor a = at::arange(1, 101, at::kDouble);  // 1..100
    CHECK(a.sum().item<double>() == doctest::Approx(5050.0));
    at::Tensor m = at::eye(3, at::kFloat) * 2;
    CHECK(at::matmul(m, at::ones({3}, at::kFloat)).sum().item<float>() == doctest::Approx(6.0f));
}

namespace {

// What `command` prints on stdout and stderr, and its exit status.
std::pair<std::string, int> run_shell(const std::string& command) {
    std::string out;
    FILE* p = ::popen((command + " 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
    return {out, ::pclose(p)};
}

bool mapped(const std::string& library) {
    std::ifstream maps("/proc/self/maps");
    const std::string all((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
    return all.find(library) != std::string::npos;
}

}  // namespace

TEST_CASE(
    "LibTorch's CUDA half is loaded only where it can serve: a worker starts without libtorch_cuda, and "
    "the CUDA plugin brings it (Note [CUDA loaded on demand])") {
    if (std::getenv("DP_TEST_PLUGIN_CHILD")) {
        // The child below: a process that has asked nothing about CUDA yet.
        CHECK_FALSE(mapped("libtorch_cuda"));
        std::string why;
        const dp::runtime::CudaPluginApi* api =
            dp::runtime::load_cuda_plugin(dp::test::paths::kCudaPlugin, why);
        REQUIRE_MESSAGE(api != nullptr, why);
        CHECK(api->version == dp::runtime::CudaPluginApi::kVersion);
        CHECK(mapped("libtorch_cuda"));
        // Its registrations ran: without a driver ATen answers, with no device, rather than failing.
        if (!::dlopen("libcuda.so.1", RTLD_LAZY)) CHECK_FALSE(at::hasCUDA());
        CHECK_FALSE(dp::runtime::load_cuda_plugin("/nonexistent/libdp_cuda.so", why));
        CHECK(why.find("is not there") != std::string::npos);
        return;
    }
    // The worker's own start: LD_DEBUG lists every library the loader maps.
    const auto [libs, rc] = run_shell(std::string("LD_DEBUG=libs '") + DP_WORKER_BIN + "' --help");
    CHECK(rc == 0);
    CHECK(libs.find("libtorch_cpu.so") != std::string::npos);
    CHECK_MESSAGE(libs.find("libtorch_cuda.so") == std::string::npos,
                  "dp-worker maps libtorch_cuda at start");
    if (std::string(dp::test::paths::kCudaPlugin).empty()) {
        MESSAGE("skipped the plugin's load: this build has no CUDA toolkit, so no libdp_cuda.so");
        return;
    }
    const auto [out, child] = run_shell("DP_TEST_PLUGIN_CHILD=1 /proc/" + std::to_string(::getpid()) +
                                        "/exe '--test-case=LibTorch*CUDA half*' --no-version");
    CHECK_MESSAGE(child == 0, out);
    CHECK(out.find("1 passed") != std::string::npos);
}
