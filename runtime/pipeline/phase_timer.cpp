#include "runtime/pipeline/phase_timer.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace dp::runtime {

namespace {

void wait_for(const at::Device& device) {
    if (device.is_cpu()) return;
    c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
}

}  // namespace

PhaseClock::PhaseClock(at::Device device) : device_(device), last_(std::chrono::steady_clock::now()) {}

double PhaseClock::lap_ms() {
    wait_for(device_);
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    return ms;
}

double measure_gemm_rate(const std::vector<strategies::GemmShape>& gemms, at::ScalarType dtype,
                         at::Device device, double budget_ms) {
    // Each distinct shape once, with the products of the pass that have it.
    std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> counts;
    for (const strategies::GemmShape& g : gemms)
        if (g.m > 0 && g.k > 0 && g.n > 0) counts[{g.m, g.k, g.n}] += g.count;
    std::vector<strategies::GemmShape> shapes;
    for (const auto& [mkn, count] : counts)
        shapes.push_back({std::get<0>(mkn), std::get<1>(mkn), std::get<2>(mkn), count});
    std::sort(
        shapes.begin(), shapes.end(),
        [](const strategies::GemmShape& a, const strategies::GemmShape& b) { return a.flops() > b.flops(); });
    c10::InferenceMode inference;
    const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
    double flops = 0, seconds = 0;
    PhaseClock spent(device);
    double spent_ms = 0;
    for (const strategies::GemmShape& g : shapes) {
        if (spent_ms > budget_ms && seconds > 0) break;
        PhaseClock clock(device);
        const at::Tensor x = at::full({g.m, g.k}, 0.5, options), w = at::full({g.n, g.k}, 0.25, options);
        at::linear(x, w);  // the warm-up: the library's first call of a shape sets it up
        clock.lap_ms();
        double ms = 0;
        for (int rep = 0; rep < 3; ++rep) {  // the fastest of three: what the library reaches
            at::linear(x, w);
            const double one = clock.lap_ms();
            ms = rep == 0 ? one : std::min(ms, one);
        }
        spent_ms += spent.lap_ms();
        if (ms <= 0) continue;
        flops += g.flops();
        seconds += ms / 1000 * static_cast<double>(g.count);
    }
    return seconds > 0 ? flops / seconds : 0;
}

}  // namespace dp::runtime
