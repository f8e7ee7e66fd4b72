#include "runtime/models/flow_match_scheduler.h"

#include <ATen/ATen.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/errors.h"

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

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback, const std::string& path) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    try {
        return j[key].get<T>();
    } catch (const nlohmann::json::exception&) {
        throw ModelError(path + ": '" + key + "' has the wrong type (" + j[key].dump().substr(0, 40) + ")");
    }
}

}  // namespace

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_json_text(const std::string& text,
                                                                  const std::string& path) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw ModelError(path + ": not valid JSON (" + std::string(e.what()).substr(0, 200) + ")");
    }
    if (!j.is_object()) throw ModelError(path + ": expected a JSON object");
    const std::string cls = get_or<std::string>(j, "_class_name", "FlowMatchEulerDiscreteScheduler", path);
    if (cls != "FlowMatchEulerDiscreteScheduler")
        throw ModelError(path + ": scheduler class '" + cls +
                         "' is not supported (supported: FlowMatchEulerDiscreteScheduler)");
    for (const char* unsupported :
         {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"})
        if (get_or<bool>(j, unsupported, false, path))
            throw ModelError(path + ": '" + unsupported + "': true is not supported; set it to false");
    FlowMatchSchedulerConfig c;
    c.num_train_timesteps = get_or<int>(j, "num_train_timesteps", c.num_train_timesteps, path);
    c.shift = get_or<double>(j, "shift", c.shift, path);
    c.use_dynamic_shifting = get_or<bool>(j, "use_dynamic_shifting", c.use_dynamic_shifting, path);
    c.base_shift = get_or<double>(j, "base_shift", c.base_shift, path);
    c.max_shift = get_or<double>(j, "max_shift", c.max_shift, path);
    c.base_image_seq_len = get_or<int>(j, "base_image_seq_len", c.base_image_seq_len, path);
    c.max_image_seq_len = get_or<int>(j, "max_image_seq_len", c.max_image_seq_len, path);
    c.invert_sigmas = get_or<bool>(j, "invert_sigmas", c.invert_sigmas, path);
    if (j.contains("shift_terminal") && !j["shift_terminal"].is_null())
        c.shift_terminal = get_or<double>(j, "shift_terminal", 0, path);
    const std::string shift_type = get_or<std::string>(j, "time_shift_type", "exponential", path);
    if (shift_type != "exponential" && shift_type != "linear")
        throw ModelError(path + ": time_shift_type '" + shift_type + "' (accepted: exponential, linear)");
    c.linear_time_shift = shift_type == "linear";
    if (c.num_train_timesteps < 1 || c.num_train_timesteps > 1000000)
        throw ModelError(path + ": num_train_timesteps must be from 1 to 1000000");
    if (!(c.shift > 0) || !std::isfinite(c.shift))
        throw ModelError(path + ": shift must be a positive number");
    if (c.use_dynamic_shifting && c.max_image_seq_len == c.base_image_seq_len)
        throw ModelError(path + ": max_image_seq_len must differ from base_image_seq_len");
    return c;
}

FlowMatchSchedulerConfig FlowMatchSchedulerConfig::from_json_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw ModelError(path + ": cannot read (" + std::strerror(errno) + ")");
    std::stringstream ss;
    ss << in.rdbuf();
    return from_json_text(ss.str(), path);
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
    if (config_.use_dynamic_shifting && !mu)
        throw ModelError("this scheduler uses dynamic shifting: set_timesteps needs mu (see flow_match_mu)");
    const double n = config_.num_train_timesteps;
    std::vector<double> t =
        linspace(static_cast<double>(sigma_max_) * n, static_cast<double>(sigma_min_) * n, steps);
    std::vector<double> s(t.size());
    for (std::size_t i = 0; i < t.size(); ++i) {
        double sigma = t[i] / n;
        if (config_.use_dynamic_shifting) {
            const double inv = 1.0 / sigma - 1.0;  // diffusers calls time_shift(mu, 1.0, t)
            sigma = config_.linear_time_shift ? *mu / (*mu + inv) : std::exp(*mu) / (std::exp(*mu) + inv);
        } else {
            sigma = config_.shift * sigma / (1.0 + (config_.shift - 1.0) * sigma);
        }
        s[i] = sigma;
    }
    if (config_.shift_terminal) {
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
