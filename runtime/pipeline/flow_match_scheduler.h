#pragma once
// FlowMatchEulerDiscreteScheduler, as configured by diffusers' scheduler_config.json: the sigma
// schedule (shifted, optionally resolution-dependent) and the Euler step of rectified flow.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime/io/config_file.h"

namespace dp::runtime {

struct FlowMatchSchedulerConfig : ConfigFile<FlowMatchSchedulerConfig> {
    int num_train_timesteps = 1000;
    double shift = 1.0;
    bool use_dynamic_shifting = false;
    double base_shift = 0.5;
    double max_shift = 1.15;
    int base_image_seq_len = 256;
    int max_image_seq_len = 4096;
    bool invert_sigmas = false;
    std::optional<double> shift_terminal;
    bool linear_time_shift = false;  // time_shift_type "linear" instead of "exponential"

    // Reads scheduler_config.json. Options we do not implement (Karras, exponential or beta
    // sigmas, stochastic sampling) are a ModelError naming the key, not silently ignored.
    static FlowMatchSchedulerConfig from_json_text(const std::string& text, const std::string& path);
};

// numpy.linspace(1, 1 / steps, steps) as numpy computes it (start + i * step, the last element
// exactly 1 / steps): the sigmas FluxPipeline and QwenImagePipeline pass to the scheduler.
std::vector<double> linspace_sigmas(int steps);

// diffusers' calculate_shift: mu for a resolution-dependent shift, linear in the image tokens.
double flow_match_mu(const FlowMatchSchedulerConfig& config, int image_seq_len);

class FlowMatchEulerScheduler {
  public:
    explicit FlowMatchEulerScheduler(FlowMatchSchedulerConfig config);

    // Computes `steps` timesteps and steps + 1 sigmas (the last 0, or 1 when inverted). `mu` is
    // required when the config uses dynamic shifting.
    void set_timesteps(int steps, std::optional<double> mu = std::nullopt);
    // The same from explicit sigmas in (0, 1] (diffusers' set_timesteps(sigmas=...)), shifted as
    // the config says: QwenImagePipeline passes linspace(1, 1 / steps, steps).
    void set_sigmas(const std::vector<double>& sigmas, std::optional<double> mu = std::nullopt);

    const std::vector<float>& sigmas() const { return sigmas_; }
    const std::vector<float>& timesteps() const { return timesteps_; }
    const FlowMatchSchedulerConfig& config() const { return config_; }

    // One Euler step from step `index`: sample + (sigma[index+1] - sigma[index]) * model_output,
    // computed in fp32 and returned in model_output's dtype.
    at::Tensor step(const at::Tensor& model_output, int index, const at::Tensor& sample) const;

  private:
    void shift_sigmas(std::vector<double> sigmas, std::optional<double> mu);
    FlowMatchSchedulerConfig config_;
    float sigma_min_ = 0;
    float sigma_max_ = 1;
    std::vector<float> sigmas_;
    std::vector<float> timesteps_;
};

}  // namespace dp::runtime
