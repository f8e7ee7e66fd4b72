#pragma once
// Note [step cache setting]: a prompt's step cache, named as diffusers' enable_cache configs are:
// - "first_block_cache:threshold=T" (FirstBlockCacheConfig: after the first transformer block, the
//   relative change of its residual since the last pass computed in full; at or below T the other
//   blocks' last residual is reused);
// - "taylorseer_cache:cache_interval=N,disable_cache_before_step=N,disable_cache_after_step=N,
//   max_order=K,taylor_factors_dtype=bfloat16|float32" (TaylorSeerCacheConfig, its defaults 5, 3,
//   none, 1, bfloat16: every attention's output is computed on the passes the schedule says and
//   extrapolated by a Taylor series on the others);
// - "mag_cache:threshold=T,max_skip_steps=K,retention_ratio=R,mag_ratios=RATIOS" (MagCacheConfig, its
//   defaults 0.06, 3, 0.2: whether a pass skips every block follows from the model's magnitude
//   ratios alone). RATIOS is "flux" (the ratios MagCache publishes for FLUX.1, diffusers'
//   FLUX_MAG_RATIOS), a JSON file (a list of numbers, or an object whose "mag_ratios" is one: what
//   calibration writes), or the numbers themselves separated by spaces (how the setting is recorded).
//   They are taken to the prompt's steps as diffusers' nearest_interp does; num_inference_steps is
//   always the prompt's steps.
// - "mag_cache:calibrate=true" (MagCacheConfig(calibrate=True)): every pass computed, and each image's
//   ratios measured (the manifest's "mag_ratios"; the job writes their mean to OUTPUT/mag_ratios.json).
// "none" is no cache. The JSONL key also takes {"type": ..., KEY: VALUE, ...}, mag_ratios a list.
// std only (the ratio file is read with nlohmann/json in the .cpp).

#include <cstdint>
#include <string>
#include <vector>

namespace dp::protocol {

struct StepCache {
    std::string type;  // "first_block_cache", "taylorseer_cache", "mag_cache"; empty: none
    double threshold = 0;
    int64_t cache_interval = 5, disable_cache_before_step = 3, disable_cache_after_step = -1;  // -1: none
    int64_t max_order = 1;
    bool float32_factors = false;  // taylor_factors_dtype: float32, else bfloat16
    int64_t max_skip_steps = 3;
    double retention_ratio = 0.2;
    std::vector<float> mag_ratios;  // as given (float32, as diffusers holds them); empty when calibrating
    bool calibrate = false;
    bool enabled() const { return !type.empty(); }
    bool first_block() const { return type == "first_block_cache"; }
    bool taylorseer() const { return type == "taylorseer_cache"; }
    bool mag() const { return type == "mag_cache"; }
    // TaylorSeer: whether pass `step` (of a branch) computes its attentions.
    bool computes(int64_t step) const;
    // MagCache: the ratios for `steps` steps (diffusers' nearest_interp when the counts differ).
    std::vector<float> mag_ratios_for(int64_t steps) const;
    // "first_block_cache:threshold=0.08", "taylorseer_cache:cache_interval=5,...", "mag_cache:...", or
    // "none"; parse_step_cache gives the same setting back from it.
    std::string text() const;
    bool operator==(const StepCache& o) const { return text() == o.text(); }
    bool operator!=(const StepCache& o) const { return !(*this == o); }
};
// `text` as a step cache (`max`: the largest threshold taken): an error text saying what is
// accepted, or empty. A mag_ratios file is read here (relative to the working directory).
std::string parse_step_cache(const std::string& text, StepCache& out, double max);

// MagCache's calibration file: {"mag_ratios": [...], ...}. An error text, or empty.
std::string read_mag_ratios_file(const std::string& path, std::vector<float>& out);

}  // namespace dp::protocol
