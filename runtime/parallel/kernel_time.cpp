#include "runtime/parallel/kernel_time.h"

#include <chrono>

namespace dp::runtime {

namespace {

thread_local KernelWindow* t_window = nullptr;

long long now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

KernelWindow::KernelWindow(bool open) : open_(open) {
    if (!open_) return;
    outer_ = t_window;
    t_window = this;
}

KernelWindow::~KernelWindow() {
    if (open_) t_window = outer_;
}

KernelTimer::KernelTimer(KernelKind kind) : window_(t_window), kind_(kind) {
    if (!window_ || window_->depth_++ > 0) return;  // none open, or inside another timed call
    start_ns_ = now_ns();
}

KernelTimer::~KernelTimer() {
    if (!window_ || --window_->depth_ > 0) return;
    const double ms = static_cast<double>(now_ns() - start_ns_) / 1e6;
    (kind_ == KernelKind::kGemm ? window_->ms_.gemm : window_->ms_.attention) += ms;
}

}  // namespace dp::runtime
