#include "runtime/pipeline/flow_match_scheduler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"

namespace dp::runtime {
namespace {

// The shift in the precision diffusers computes it: float32 tensors times a Python float.
float shift_f32(float sigma, double shift) {
    const float a = static_cast<float>(shift) * sigma;
    const float b = 1.0f + static_cast<float>(shift - 1.0) * sigma;
    return a / b;
}

// numpy.linspace(start, stop, num) in float64, including its exact last element.
std::vector<double> linspace(double start, double stop, int num) {
    std::vector<double> out(static_cast<std::size_t>(num));
    if (num == 1) {
        out[0] = start;
        return out;
    }
    const double step = (stop - start) / (num - 1);
    for (int i = 0; i < num; ++i) out[static_cast<std::size_t>(i)] = static_cast<double>(i) * step + start;
    out.back() = stop;
    return out;
}

}  // namespace

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_json_text(const std::string& text,
                                                                  const std::string& path) {
    const ConfigJson j(text, path);
    j.require_class("scheduler", "FlowMatchEulerDiscreteScheduler");
    for (const char* unsupported :
         {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"})
        if (j.boolean(unsupported, false)) j.fail(unsupported, "true is not supported; set it to false");
    FlowMatchSchedulerConfig c;
    c.num_train_timesteps =
        static_cast<int>(j.integer("num_train_timesteps", c.num_train_timesteps, 1, 1000000));
    c.shift = j.number("shift", c.shift, 1e-6, 1e6);
    c.use_dynamic_shifting = j.boolean("use_dynamic_shifting", c.use_dynamic_shifting);
    c.base_shift = j.number("base_shift", c.base_shift, -1e6, 1e6);
    c.max_shift = j.number("max_shift", c.max_shift, -1e6, 1e6);
    c.base_image_seq_len =
        static_cast<int>(j.integer("base_image_seq_len", c.base_image_seq_len, 1, 1 << 30));
    c.max_image_seq_len = static_cast<int>(j.integer("max_image_seq_len", c.max_image_seq_len, 1, 1 << 30));
    c.invert_sigmas = j.boolean("invert_sigmas", c.invert_sigmas);
    if (j.has("shift_terminal")) c.shift_terminal = j.number("shift_terminal", 0, 0, 1 - 1e-9);
    const std::string shift_type = j.string("time_shift_type", "exponential");
    if (shift_type != "exponential" && shift_type != "linear")
        j.fail("time_shift_type", "is '" + shift_type + "'; accepted: exponential, linear");
    c.linear_time_shift = shift_type == "linear";
    if (c.use_dynamic_shifting && c.max_image_seq_len == c.base_image_seq_len)
        j.fail("max_image_seq_len", "must differ from base_image_seq_len");
    return c;
}

std::vector<double> linspace_sigmas(int steps) {
    std::vector<double> s(static_cast<std::size_t>(std::max(steps, 0)), 1.0);
    if (steps < 2) return s;
    const double step = (1.0 / steps - 1.0) / (steps - 1);
    for (int i = 0; i < steps; ++i) s[static_cast<std::size_t>(i)] = i * step + 1.0;
    s.back() = 1.0 / steps;
    return s;
}

double flow_match_mu(const FlowMatchSchedulerConfig& c, int image_seq_len) {
    const double m = (c.max_shift - c.base_shift) / (c.max_image_seq_len - c.base_image_seq_len);
    const double b = c.base_shift - m * c.base_image_seq_len;
    return image_seq_len * m + b;
}

FlowMatchEulerScheduler::FlowMatchEulerScheduler(FlowMatchSchedulerConfig config)
    : config_(std::move(config)) {
    // The training schedule's ends, in float32 as diffusers keeps them.
    const float n = static_cast<float>(config_.num_train_timesteps);
    const float first = 1.0f / n;  // linspace(1, N, N)[::-1] / N: ends 1/N and 1
    const float last = n / n;
    sigma_min_ = config_.use_dynamic_shifting ? first : shift_f32(first, config_.shift);
    sigma_max_ = config_.use_dynamic_shifting ? last : shift_f32(last, config_.shift);
}

void FlowMatchEulerScheduler::set_timesteps(int steps, std::optional<double> mu) {
    if (steps < 1 || steps > 100000)
        throw ModelError("steps must be from 1 to 100000, got " + std::to_string(steps));
    const double n = config_.num_train_timesteps;
    std::vector<double> t =
        linspace(static_cast<double>(sigma_max_) * n, static_cast<double>(sigma_min_) * n, steps);
    for (double& v : t) v /= n;
    shift_sigmas(std::move(t), mu);
}

void FlowMatchEulerScheduler::set_sigmas(const std::vector<double>& sigmas, std::optional<double> mu) {
    if (sigmas.empty() || sigmas.size() > 100000)
        throw ModelError("the scheduler takes 1 to 100000 sigmas, got " + std::to_string(sigmas.size()));
    std::vector<double> s;
    for (double v : sigmas) {
        if (!(v > 0 && v <= 1)) throw ModelError("sigma " + std::to_string(v) + ": sigmas must be in (0, 1]");
        s.push_back(static_cast<float>(v));  // np.array(sigmas).astype(np.float32)
    }
    shift_sigmas(std::move(s), mu);
}

void FlowMatchEulerScheduler::shift_sigmas(std::vector<double> s, std::optional<double> mu) {
    if (config_.use_dynamic_shifting && !mu)
        throw ModelError("this scheduler uses dynamic shifting: set_timesteps needs mu (see flow_match_mu)");
    for (double& sigma : s) {
        if (config_.use_dynamic_shifting) {
            const double inv = 1.0 / sigma - 1.0;  // diffusers calls time_shift(mu, 1.0, t)
            sigma = config_.linear_time_shift ? *mu / (*mu + inv) : std::exp(*mu) / (std::exp(*mu) + inv);
        } else {
            sigma = config_.shift * sigma / (1.0 + (config_.shift - 1.0) * sigma);
        }
    }
    // One step from sigma 1 leaves nothing to stretch: diffusers divides 0 by 0 there (NaN sigmas,
    // a NaN image); the schedule stays 1 -> 0.
    if (config_.shift_terminal && s.back() < 1.0) {
        const double scale = (1.0 - s.back()) / (1.0 - *config_.shift_terminal);
        for (double& v : s) v = 1.0 - (1.0 - v) / scale;
    }
    sigmas_.assign(s.begin(), s.end());  // float32, as torch.from_numpy(...).to(float32)
    timesteps_.resize(sigmas_.size());
    for (std::size_t i = 0; i < sigmas_.size(); ++i) {
        if (config_.invert_sigmas) sigmas_[i] = 1.0f - sigmas_[i];
        timesteps_[i] = sigmas_[i] * static_cast<float>(config_.num_train_timesteps);
    }
    sigmas_.push_back(config_.invert_sigmas ? 1.0f : 0.0f);
}

at::Tensor FlowMatchEulerScheduler::step(const at::Tensor& model_output, int index,
                                         const at::Tensor& sample) const {
    if (index < 0 || static_cast<std::size_t>(index) + 1 >= sigmas_.size())
        throw ModelError("scheduler step " + std::to_string(index) + " is outside the " +
                         std::to_string(timesteps_.size()) + " steps set");
    const float dt = sigmas_[static_cast<std::size_t>(index) + 1] - sigmas_[static_cast<std::size_t>(index)];
    at::Tensor prev = sample.to(at::kFloat) + model_output * dt;
    return prev.to(model_output.scalar_type());
}

}  // namespace dp::runtime
