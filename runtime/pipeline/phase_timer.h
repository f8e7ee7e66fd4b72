#pragma once
// Note [phase split]: where a rank's time goes, measured where it is spent. The loop times each
// batch's encoders (the prompts' text, an edit's image), its denoising steps and its decode, and
// counts the transformer passes it ran with their FLOPs (Note [FLOPs of a pass],
// strategies/pass_flops.h: this rank's share under the mesh, with the model's own text tokens) and,
// on the CPU, the steps' time in their GEMMs and attention (Note [kernel time in the steps],
// runtime/parallel/kernel_time.h); the worker adds the load and the image writes, measures once at
// the end the rate its GEMMs reach at the passes' own shapes, and sends it all as a
// protocol::PhasesEvent, which the job summary prints (launcher/phase_report.h). On a GPU each
// reading waits for the device's queued work.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "strategies/pass_flops.h"

namespace dp::runtime {

// One batch's phases on this rank (milliseconds) and the transformer work it did.
struct PhaseTimes {
    double encode_ms = 0, steps_ms = 0, decode_ms = 0;
    int64_t passes = 0;  // a prompt's guidance branch through one model call
    // Its branches' text encodings: those the encoders made, those an earlier batch had made
    // (Note [prompts encoded once], family_pipeline.cpp).
    int64_t encodings = 0, reused_encodings = 0;
    double flops = 0, gemm_flops = 0;  // the passes' FLOPs (this rank's share); the GEMMs' of them
    // The steps' time in their GEMMs and attention kernels, where they were timed (the CPU; Note
    // [kernel time in the steps], runtime/parallel/kernel_time.h); 0 elsewhere.
    double gemm_ms = 0, attention_ms = 0;
    std::vector<strategies::GemmShape> gemms;            // one pass's weight products, this rank's share
    std::vector<strategies::AttentionShape> attentions;  // its attentions, this rank's share
    int64_t heads = 0, head_dim = 0;                     // this rank's heads of them
};

// Milliseconds since the clock started or last lapped, once `device`'s queued work is done.
class PhaseClock {
  public:
    explicit PhaseClock(at::Device device);
    double lap_ms();

  private:
    at::Device device_;
    std::chrono::steady_clock::time_point last_;
};

// The rate (FLOP/s) LibTorch's products of `gemms`' shapes reach on `device` in `dtype` (`int8`:
// --quantize int8's products, their tokens' quantization included, Note [int8 compute]): each
// distinct shape the fastest of three after a warm-up, the most FLOPs first, while the time spent
// stays under `budget_ms` (the first always); their FLOPs over their time, each weighted by its
// count. 0 when there is nothing to time.
double measure_gemm_rate(const std::vector<strategies::GemmShape>& gemms, at::ScalarType dtype,
                         at::Device device, double budget_ms, bool int8 = false);
// The same for attentions of `attentions`' shapes, `heads` heads of `head_dim` features each,
// through attention_kernel (the kernel the pipelines' attention runs: ours on an AVX-512 CPU).
double measure_attention_rate(const std::vector<strategies::AttentionShape>& attentions, int64_t heads,
                              int64_t head_dim, at::ScalarType dtype, at::Device device, double budget_ms);

}  // namespace dp::runtime
