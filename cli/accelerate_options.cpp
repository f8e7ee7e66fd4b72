#include "cli/accelerate_options.h"

#include "cli/option_rows.h"

namespace dp::cli {

using namespace rows;
using launcher::LaunchSpec;

const std::vector<LaunchOptionRow>& accelerate_option_table() {
    using S = LaunchSpec;
    static const std::vector<LaunchOptionRow> table = finish<S>(
        {
            choice<S>(
                "--mixed-precision,--mixed_precision", &S::mixed_precision, {"no", "fp16", "bf16", "fp8"},
                "accelerate's mixed precision: a command gets it as ACCELERATE_MIXED_PRECISION; the main "
                "job runs in bf16 or fp16 when it says so and --dtype is auto"),
            on_off<S>("--cpu", &S::use_cpu,
                      "accelerate's CPU-only run: a command gets ACCELERATE_USE_CPU=true; the main job runs "
                      "on the CPU when --device is auto"),
            described(
                whole<S>("--num-cpu-threads-per-process,--num_cpu_threads_per_process", "N",
                         &S::cpu_threads_per_process, 1, 4096,
                         "OMP_NUM_THREADS of every rank, as accelerate sets it, over an inherited value"),
                "usable CPUs / processes, unless OMP_NUM_THREADS is set"),
        },
        "Launch options");
    return table;
}

void apply_accelerate_options(const LaunchSpec& spec, launcher::JobOptions& job) {
    if (job.dtype == "auto" && (spec.mixed_precision == "bf16" || spec.mixed_precision == "fp16"))
        job.dtype = spec.mixed_precision;
    if (job.device == "auto" && spec.use_cpu) job.device = "cpu";
}

}  // namespace dp::cli
