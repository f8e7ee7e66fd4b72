#pragma once
// Note [kernel time in the steps]: on the CPU the denoising steps' own GEMMs (ParallelLinear's
// products, int8 ones with their tokens' quantization) and attention kernels (attend()'s, without
// its exchanges) are timed where they run, so the phase split's share "outside GEMMs and attention"
// is a reading of the steps themselves, not the steps' FLOPs divided by rates measured afterwards
// on a machine whose other work moves them (Note [phase split]). The loop opens a KernelWindow on
// its thread around the steps; each KernelTimer on that thread adds its call's wall time to it. A
// timed call inside another (a product inside attention) counts once, in the outer one. On a GPU
// no window opens: a call returns when its work is queued, so its time says nothing.

namespace dp::runtime {

enum class KernelKind { kGemm, kAttention };

// Milliseconds the steps spent in each kind of kernel.
struct KernelMs {
    double gemm = 0, attention = 0;
};

// Counts this thread's timed calls while it lives (when `open`; a closed one counts nothing and
// leaves an enclosing window counting). Windows nest: the innermost counts.
class KernelWindow {
  public:
    explicit KernelWindow(bool open);
    ~KernelWindow();
    KernelWindow(const KernelWindow&) = delete;
    KernelWindow& operator=(const KernelWindow&) = delete;
    KernelMs elapsed() const { return ms_; }

  private:
    friend class KernelTimer;
    bool open_;
    KernelWindow* outer_ = nullptr;
    int depth_ = 0;  // timed calls running on this thread
    KernelMs ms_;
};

// One kernel call, timed from construction to destruction into this thread's open window.
class KernelTimer {
  public:
    explicit KernelTimer(KernelKind kind);
    ~KernelTimer();
    KernelTimer(const KernelTimer&) = delete;
    KernelTimer& operator=(const KernelTimer&) = delete;

  private:
    KernelWindow* window_;
    KernelKind kind_;
    long long start_ns_ = 0;
};

}  // namespace dp::runtime
