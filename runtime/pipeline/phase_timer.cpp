#include "runtime/pipeline/phase_timer.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>

#include "runtime/parallel/cpu_attention.h"
#include "runtime/parallel/dense_linear.h"
#include "runtime/parallel/int8_linear.h"

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

namespace {

// The fastest of three runs of `run` after a warm-up, in ms (the library's first call of a shape
// sets it up).
double fastest_ms(at::Device device, const std::function<void()>& run) {
    PhaseClock clock(device);
    run();
    clock.lap_ms();
    double ms = 0;
    for (int rep = 0; rep < 3; ++rep) {
        run();
        const double one = clock.lap_ms();
        ms = rep == 0 ? one : std::min(ms, one);
    }
    return ms;
}

// FLOPs over time of `shapes` (`flops` of each, with its count), each timed by `time_ms`, the most
// FLOPs first while the time spent stays under `budget_ms` (the first always).
template <class Shape>
double measured_rate(std::vector<Shape> shapes, at::Device device, double budget_ms,
                     const std::function<double(const Shape&)>& flops,
                     const std::function<double(const Shape&)>& time_ms) {
    std::sort(shapes.begin(), shapes.end(),
              [&](const Shape& a, const Shape& b) { return flops(a) > flops(b); });
    c10::InferenceMode inference;
    double total = 0, seconds = 0, spent_ms = 0;
    PhaseClock spent(device);
    for (const Shape& s : shapes) {
        if (spent_ms > budget_ms && seconds > 0) break;
        const double ms = time_ms(s);
        spent_ms += spent.lap_ms();
        if (ms <= 0) continue;
        total += flops(s);
        seconds += ms / 1000 * static_cast<double>(s.count);
    }
    return seconds > 0 ? total / seconds : 0;
}

}  // namespace

double measure_gemm_rate(const std::vector<strategies::GemmShape>& gemms, at::ScalarType dtype,
                         at::Device device, double budget_ms, bool int8) {
    // Each distinct shape once, with the products of the pass that have it.
    std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> counts;
    for (const strategies::GemmShape& g : gemms)
        if (g.m > 0 && g.k > 0 && g.n > 0) counts[{g.m, g.k, g.n}] += g.count;
    std::vector<strategies::GemmShape> shapes;
    for (const auto& [mkn, count] : counts)
        shapes.push_back({std::get<0>(mkn), std::get<1>(mkn), std::get<2>(mkn), count});
    const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
    return measured_rate<strategies::GemmShape>(
        shapes, device, budget_ms, [](const strategies::GemmShape& g) { return g.flops(); },
        [&](const strategies::GemmShape& g) {
            const at::Tensor x = at::full({g.m, g.k}, 0.5, options), w = at::full({g.n, g.k}, 0.25, options);
            if (!int8) return fastest_ms(device, [&] { dense_linear(x, w, at::Tensor()); });
            const Int8Weight q = quantize_weight(w);
            return fastest_ms(device, [&] { int8_linear(x, q); });
        });
}

double measure_attention_rate(const std::vector<strategies::AttentionShape>& attentions, int64_t heads,
                              int64_t head_dim, at::ScalarType dtype, at::Device device, double budget_ms) {
    if (heads <= 0 || head_dim <= 0) return 0;
    std::map<std::pair<int64_t, int64_t>, int64_t> counts;
    for (const strategies::AttentionShape& a : attentions)
        if (a.queries > 0 && a.keys > 0) counts[{a.queries, a.keys}] += a.count;
    std::vector<strategies::AttentionShape> shapes;
    for (const auto& [qk, count] : counts) shapes.push_back({qk.first, qk.second, count});
    const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
    const double width = static_cast<double>(heads * head_dim);
    return measured_rate<strategies::AttentionShape>(
        shapes, device, budget_ms,
        [width](const strategies::AttentionShape& a) {
            return 4.0 * static_cast<double>(a.queries) * static_cast<double>(a.keys) * width *
                   static_cast<double>(a.count);
        },
        [&](const strategies::AttentionShape& a) {
            const at::Tensor q = at::full({1, heads, a.queries, head_dim}, 0.5, options);
            const at::Tensor kv = at::full({1, heads, a.keys, head_dim}, 0.25, options);
            return fastest_ms(device, [&] { attention_kernel(q, kv, kv, {}, 0); });
        });
}

}  // namespace dp::runtime
