#include "runtime/pipeline/schedulers.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <nlohmann/json.hpp>
#ifdef DP_HAVE_BOOST_MATH
#include <boost/math/special_functions/beta.hpp>
#endif

#include "runtime/io/errors.h"

namespace dp::runtime {
namespace {

// numpy.linspace(start, stop, num) in float64, including its exact last element.
std::vector<double> np_linspace(double start, double stop, int num) {
    std::vector<double> out(static_cast<std::size_t>(std::max(num, 0)));
    if (num == 1) out[0] = start;
    if (num < 2) return out;
    const double step = (stop - start) / (num - 1);
    for (int i = 0; i < num; ++i) out[static_cast<std::size_t>(i)] = static_cast<double>(i) * step + start;
    out.back() = stop;
    return out;
}

double config_number(const nlohmann::json& c, const char* key, double fallback) {
    return c.contains(key) && c.at(key).is_number() ? c.at(key).get<double>() : fallback;
}

// A 0-dim float32 tensor: diffusers' schedulers do their scalar arithmetic on such tensors.
at::Tensor f32(float v) { return at::scalar_tensor(v, at::kFloat); }

// scipy.stats.beta.ppf(q, 0.6, 0.6): the inverse of the regularized incomplete beta function.
double beta_ppf(double q) {
#ifdef DP_HAVE_BOOST_MATH
    if (q <= 0) return 0;
    if (q >= 1) return 1;
    return boost::math::ibeta_inv(0.6, 0.6, q);
#else
    (void)q;
    throw ModelError("use_beta_sigmas: this build has no Boost.Math (libboost-dev) for the beta schedule");
#endif
}

// --- The flow-matching schedule (Euler, LCM; Heun's own in part) ---

// The shift, terminal stretch and inversion of FlowMatchEulerDiscreteScheduler.set_timesteps on
// sigmas held as T (float64 from its own linspace, float32 from a user's list), as numpy computes.
struct FlowSchedule {
    double shift = 1, base_shift = 0.5, max_shift = 1.15;
    bool dynamic = false, linear = false, invert = false;
    std::optional<double> terminal;
    int karras_like = 0;  // 1 Karras, 2 exponential, 3 beta
    int train = 1000;

    // `shift_key`: the config key of the static shift (UniPC's flow_shift).
    explicit FlowSchedule(const nlohmann::json& c, const char* shift_key = "shift") {
        train = c.at("num_train_timesteps").get<int>();
        shift = c.at(shift_key).get<double>();
        dynamic = c.value("use_dynamic_shifting", false);
        linear = c.value("time_shift_type", std::string("exponential")) == "linear";
        invert = c.value("invert_sigmas", false);
        if (c.contains("shift_terminal") && c.at("shift_terminal").is_number() &&
            c.at("shift_terminal").get<double>() != 0)
            terminal = c.at("shift_terminal").get<double>();
        karras_like = c.value("use_karras_sigmas", false)        ? 1
                      : c.value("use_exponential_sigmas", false) ? 2
                      : c.value("use_beta_sigmas", false)        ? 3
                                                                 : 0;
    }

    template <typename T>
    std::vector<double> shaped(std::vector<T> s, std::optional<double> mu) const {
        if (dynamic && !mu) throw InternalError("a dynamic shift needs mu");
        for (T& v : s) {
            if (dynamic) {
                const T e = static_cast<T>(linear ? *mu : std::exp(*mu));
                v = e / (e + (T(1) / v - T(1)));
            } else {
                v = static_cast<T>(shift) * v / (T(1) + static_cast<T>(shift - 1) * v);
            }
        }
        // One step from sigma 1 leaves nothing to stretch: diffusers divides 0 by 0 there (NaN sigmas,
        // a NaN image); the schedule stays 1 -> 0.
        if (terminal && !s.empty() && s.back() < T(1)) {
            const T scale = (T(1) - s.back()) / static_cast<T>(1 - *terminal);
            for (T& v : s) v = T(1) - (T(1) - v) / scale;
        }
        std::vector<double> out(s.begin(), s.end());
        if (karras_like && !out.empty()) out = converted(out);
        return out;
    }

    // _convert_to_karras / _convert_to_exponential / _convert_to_beta from the shifted sigmas'
    // ends, in float64 (beta: scipy.stats.beta.ppf(1 - linspace(0, 1, n), 0.6, 0.6)).
    std::vector<double> converted(const std::vector<double>& in) const {
        const double lo = in.back(), hi = in.front();
        const int n = static_cast<int>(in.size());
        std::vector<double> out;
        if (karras_like == 1) {
            const double rho = 7.0, min_inv = std::pow(lo, 1 / rho), max_inv = std::pow(hi, 1 / rho);
            for (double r : np_linspace(0, 1, n))
                out.push_back(std::pow(max_inv + r * (min_inv - max_inv), rho));
        } else if (karras_like == 2) {
            for (double x : np_linspace(std::log(hi), std::log(lo), n)) out.push_back(std::exp(x));
        } else {
            for (double t : np_linspace(0, 1, n)) out.push_back(lo + beta_ppf(1 - t) * (hi - lo));
        }
        return out;
    }
};

// FlowMatchEulerDiscreteScheduler's (and FlowMatchLCMScheduler's) schedule and step.
class FlowMatchScheduler : public Scheduler {
  public:
    FlowMatchScheduler(const nlohmann::json& c, bool lcm)
        : Scheduler(1), schedule_(c), lcm_(lcm), stochastic_(lcm || c.value("stochastic_sampling", false)) {
        // The training schedule's ends, float32 as the constructor keeps them (shifted unless dynamic).
        const float n = static_cast<float>(schedule_.train);
        const auto shifted = [&](float s) {
            if (schedule_.dynamic) return s;
            const float a = static_cast<float>(schedule_.shift) * s;
            return a / (1.0f + static_cast<float>(schedule_.shift - 1.0) * s);
        };
        sigma_min_ = shifted(1.0f / n);
        sigma_max_ = shifted(n / n);
    }

    void set_timesteps(const ScheduleInputs& in) override {
        const double n = schedule_.train;
        std::vector<double> s;
        std::vector<float> given_t(in.timesteps.begin(), in.timesteps.end());  // np.float32
        if (!in.sigmas.empty()) {
            s = schedule_.shaped(std::vector<float>(in.sigmas.begin(), in.sigmas.end()), in.mu);
        } else if (!given_t.empty()) {
            std::vector<float> f;
            for (float t : given_t) f.push_back(t / static_cast<float>(n));
            s = schedule_.shaped(f, in.mu);
        } else {
            std::vector<double> t = np_linspace(static_cast<double>(sigma_max_) * n,
                                                static_cast<double>(sigma_min_) * n, in.steps);
            for (double& v : t) v /= n;
            s = schedule_.shaped(t, in.mu);
        }
        sigmas_.assign(s.begin(), s.end());
        timesteps_.clear();
        for (std::size_t i = 0; i < sigmas_.size(); ++i) {
            if (schedule_.invert) sigmas_[i] = 1.0f - sigmas_[i];
            timesteps_.push_back(!given_t.empty() && !schedule_.invert ? given_t[i]
                                                                       : sigmas_[i] * static_cast<float>(n));
        }
        sigmas_.push_back(schedule_.invert ? 1.0f : 0.0f);
    }

    at::Tensor step(const at::Tensor& out, int index, const at::Tensor& sample,
                    const StepNoise& noise) override {
        const auto i = static_cast<std::size_t>(index);
        const at::Tensor x = sample.to(at::kFloat);
        const at::Tensor sigma = f32(sigmas_.at(i)), next = f32(sigmas_.at(i + 1));
        at::Tensor prev;
        if (stochastic_) {
            const at::Tensor x0 = x - sigma * out;
            prev = (1.0 - next) * x0 + next * noise(x0);
        } else {
            prev = x + (next - sigma) * out;
        }
        return prev.to(out.scalar_type());
    }

  private:
    FlowSchedule schedule_;
    bool lcm_, stochastic_;
    float sigma_min_ = 0, sigma_max_ = 1;
};

// FlowMatchHeunDiscreteScheduler: each step an Euler pass, then a second at the next sigma whose
// derivative is averaged with the first's.
class HeunScheduler : public Scheduler {
  public:
    explicit HeunScheduler(const nlohmann::json& c)
        : Scheduler(2), train_(c.at("num_train_timesteps").get<int>()) {
        shift_ = c.at("shift").get<double>();
        const float n = static_cast<float>(train_);
        const auto shifted = [&](float s) {
            const float a = static_cast<float>(shift_) * s;
            return a / (1.0f + static_cast<float>(shift_ - 1.0) * s);
        };
        sigma_min_ = shifted(1.0f / n);
        sigma_max_ = shifted(n / n);
    }

    void set_timesteps(const ScheduleInputs& in) override {
        const double n = train_;
        std::vector<float> s;
        for (double t : np_linspace(static_cast<double>(sigma_max_) * n, static_cast<double>(sigma_min_) * n,
                                    in.steps)) {
            const double v = t / n;
            s.push_back(static_cast<float>(shift_ * v / (1 + (shift_ - 1) * v)));
        }
        timesteps_ = {s[0] * static_cast<float>(n)};
        sigmas_ = {s[0]};
        for (std::size_t i = 1; i < s.size(); ++i) {
            const float t = s[i] * static_cast<float>(n);
            timesteps_.insert(timesteps_.end(), {t, t});
            sigmas_.insert(sigmas_.end(), {s[i], s[i]});
        }
        sigmas_.push_back(0.0f);
        derivative_ = at::Tensor();
    }

    at::Tensor step(const at::Tensor& out, int index, const at::Tensor& sample, const StepNoise&) override {
        const auto i = static_cast<std::size_t>(index);
        at::Tensor x = sample.to(at::kFloat);
        at::Tensor prev;
        // Note [Heun's derivative]: diffusers takes it as (x - (x - out * sigma)) / sigma, which is the
        // model's output itself; at the schedule's last sigma (1 / 1000 shifted) that difference
        // cancels catastrophically and multiplies a rounding step of x by 1 / sigma, so two runs whose
        // x differ in the last bit (another strategy's sums) end 1e-3 apart. The output itself is
        // taken here: the same up to diffusers' own rounding there, and alike under every strategy.
        if (!derivative_.defined()) {  // first order: sigma -> the next
            const at::Tensor sigma = f32(sigmas_.at(i)), next = f32(sigmas_.at(i + 1));
            derivative_ = out.to(at::kFloat);
            dt_ = next - sigma;
            sample_ = x;
            prev = x + derivative_ * dt_;
        } else {  // second order, from the first pass's sample
            const at::Tensor derivative = 0.5 * (derivative_ + out.to(at::kFloat));
            prev = sample_ + derivative * dt_;
            derivative_ = sample_ = dt_ = at::Tensor();
        }
        return prev.to(out.scalar_type());
    }

  private:
    int train_;
    double shift_;
    float sigma_min_ = 0, sigma_max_ = 1;
    at::Tensor derivative_, dt_, sample_;
};

// --- The multistep solvers on flow sigmas (alpha_t = 1 - sigma, sigma_t = sigma) ---

at::Tensor lambda_of(const at::Tensor& sigma) { return at::log(1 - sigma) - at::log(sigma); }

// DPMSolverMultistepScheduler with use_flow_sigmas and a flow prediction.
class DpmSolverScheduler : public Scheduler {
  public:
    explicit DpmSolverScheduler(const nlohmann::json& c)
        : Scheduler(1),
          train_(c.at("num_train_timesteps").get<int>()),
          order_(c.at("solver_order").get<int>()),
          flow_shift_(c.at("flow_shift").get<double>()),
          sde_(c.at("algorithm_type") == "sde-dpmsolver++"),
          heun_(c.at("solver_type") == "heun"),
          lower_order_final_(c.at("lower_order_final").get<bool>()) {}

    void set_timesteps(const ScheduleInputs& in) override {
        const double shift = in.mu ? std::exp(*in.mu) : flow_shift_;
        const std::vector<double> alphas = np_linspace(1, 1.0 / train_, in.steps + 1);
        std::vector<double> s;
        for (auto it = alphas.rbegin(); it != alphas.rend(); ++it) {  // flipped, the last (0) dropped
            const double v = 1.0 - *it;
            s.push_back(shift * v / (1 + (shift - 1) * v));
        }
        s.pop_back();
        sigmas_.clear();
        timesteps_.clear();
        for (double v : s) {
            sigmas_.push_back(static_cast<float>(v));
            timesteps_.push_back(static_cast<float>(static_cast<int64_t>(v * train_)));  // int64, truncated
        }
        sigmas_.push_back(0.0f);
        outputs_.clear();
        lower_order_nums_ = 0;
    }

    at::Tensor step(const at::Tensor& out, int index, const at::Tensor& sample,
                    const StepNoise& noise) override {
        const auto i = static_cast<std::size_t>(index);
        const auto n = static_cast<std::size_t>(timesteps_.size());
        const bool last = i == n - 1, second_last = i + 2 == n;
        // final_sigmas_type "zero" (the one taken here) always ends with a first-order step.
        const bool lower_final = last;
        const bool lower_second = second_last && lower_order_final_ && n < 15;
        const at::Tensor x0 = sample - f32(sigmas_.at(i)) * out;  // convert_model_output
        outputs_.push_back(x0);
        if (static_cast<int>(outputs_.size()) > order_) outputs_.pop_front();
        const at::Tensor x = sample.to(at::kFloat);
        const at::Tensor z = sde_ ? noise(x) : at::Tensor();
        at::Tensor prev;
        if (order_ == 1 || lower_order_nums_ < 1 || lower_final)
            prev = first_order(x0, i, x, z);
        else if (order_ == 2 || lower_order_nums_ < 2 || lower_second)
            prev = second_order(i, x, z);
        else
            prev = third_order(i, x);
        if (lower_order_nums_ < order_) ++lower_order_nums_;
        return prev.to(x0.scalar_type());
    }

  private:
    at::Tensor first_order(const at::Tensor& m, std::size_t i, const at::Tensor& x,
                           const at::Tensor& z) const {
        const at::Tensor st = f32(sigmas_.at(i + 1)), ss = f32(sigmas_.at(i));
        const at::Tensor at_ = 1 - st;
        const at::Tensor h = lambda_of(st) - lambda_of(ss);
        if (!sde_) return (st / ss) * x - (at_ * (at::exp(-h) - 1.0)) * m;
        return (st / ss * at::exp(-h)) * x + (at_ * (1 - at::exp(-2.0 * h))) * m +
               st * at::sqrt(1.0 - at::exp(-2 * h)) * z;
    }

    at::Tensor second_order(std::size_t i, const at::Tensor& x, const at::Tensor& z) const {
        const at::Tensor st = f32(sigmas_.at(i + 1)), s0 = f32(sigmas_.at(i)), s1 = f32(sigmas_.at(i - 1));
        const at::Tensor at_ = 1 - st;
        const at::Tensor lt = lambda_of(st), l0 = lambda_of(s0), l1 = lambda_of(s1);
        const at::Tensor &m0 = outputs_.back(), &m1 = outputs_[outputs_.size() - 2];
        const at::Tensor h = lt - l0, h0 = l0 - l1, r0 = h0 / h;
        const at::Tensor D0 = m0, D1 = (1.0 / r0) * (m0 - m1);
        if (!sde_) {
            if (!heun_)
                return (st / s0) * x - (at_ * (at::exp(-h) - 1.0)) * D0 -
                       0.5 * (at_ * (at::exp(-h) - 1.0)) * D1;
            return (st / s0) * x - (at_ * (at::exp(-h) - 1.0)) * D0 +
                   (at_ * ((at::exp(-h) - 1.0) / h + 1.0)) * D1;
        }
        const at::Tensor base = (st / s0 * at::exp(-h)) * x + (at_ * (1 - at::exp(-2.0 * h))) * D0;
        const at::Tensor noise = st * at::sqrt(1.0 - at::exp(-2 * h)) * z;
        if (!heun_) return base + 0.5 * (at_ * (1 - at::exp(-2.0 * h))) * D1 + noise;
        return base + (at_ * ((1.0 - at::exp(-2.0 * h)) / (-2.0 * h) + 1.0)) * D1 + noise;
    }

    at::Tensor third_order(std::size_t i, const at::Tensor& x) const {
        const at::Tensor st = f32(sigmas_.at(i + 1)), s0 = f32(sigmas_.at(i));
        const at::Tensor s1 = f32(sigmas_.at(i - 1)), s2 = f32(sigmas_.at(i - 2));
        const at::Tensor at_ = 1 - st;
        const at::Tensor lt = lambda_of(st), l0 = lambda_of(s0), l1 = lambda_of(s1), l2 = lambda_of(s2);
        const std::size_t k = outputs_.size();
        const at::Tensor &m0 = outputs_[k - 1], &m1 = outputs_[k - 2], &m2 = outputs_[k - 3];
        const at::Tensor h = lt - l0, h0 = l0 - l1, h1 = l1 - l2, r0 = h0 / h, r1 = h1 / h;
        const at::Tensor D1_0 = (1.0 / r0) * (m0 - m1), D1_1 = (1.0 / r1) * (m1 - m2);
        const at::Tensor D1 = D1_0 + (r0 / (r0 + r1)) * (D1_0 - D1_1);
        const at::Tensor D2 = (1.0 / (r0 + r1)) * (D1_0 - D1_1);
        return (st / s0) * x - (at_ * (at::exp(-h) - 1.0)) * m0 +
               (at_ * ((at::exp(-h) - 1.0) / h + 1.0)) * D1 -
               (at_ * ((at::exp(-h) - 1.0 + h) / at::pow(h, 2) - 0.5)) * D2;
    }

    int train_, order_;
    double flow_shift_;
    bool sde_, heun_, lower_order_final_;
    std::deque<at::Tensor> outputs_;  // the converted outputs, the latest last
    int lower_order_nums_ = 0;
};

// UniPCMultistepScheduler (predict_x0, bh1 or bh2) with use_flow_sigmas and a flow prediction.
class UniPcScheduler : public Scheduler {
  public:
    explicit UniPcScheduler(const nlohmann::json& c)
        : Scheduler(1),
          train_(c.at("num_train_timesteps").get<int>()),
          order_(c.at("solver_order").get<int>()),
          schedule_(c, "flow_shift"),
          bh2_(c.at("solver_type") == "bh2"),
          lower_order_final_(c.at("lower_order_final").get<bool>()),
          sigma_min_last_(c.at("final_sigmas_type") == "sigma_min") {
        for (const nlohmann::json& i : c.at("disable_corrector")) disabled_.push_back(i.get<int64_t>());
    }

    void set_timesteps(const ScheduleInputs& in) override {
        std::vector<double> s = in.sigmas;
        if (s.empty()) {
            s = np_linspace(1, 1.0 / train_, in.steps + 1);
            s.pop_back();
        }
        s = schedule_.shaped(s, in.mu);  // float64 throughout, as UniPC's numpy arrays
        if (std::fabs(s[0] - 1) < 1e-6) s[0] -= 1e-6;
        sigmas_.clear();
        timesteps_.clear();
        for (double v : s) {
            sigmas_.push_back(static_cast<float>(v));
            timesteps_.push_back(static_cast<float>(static_cast<int64_t>(v * train_)));
        }
        sigmas_.push_back(sigma_min_last_ ? static_cast<float>(s.back()) : 0.0f);
        outputs_.clear();
        last_sample_ = at::Tensor();
        lower_order_nums_ = 0;
        this_order_ = 0;
    }

    at::Tensor step(const at::Tensor& out, int index, const at::Tensor& sample, const StepNoise&) override {
        const auto i = static_cast<std::size_t>(index);
        const bool corrector =
            i > 0 && last_sample_.defined() &&
            std::find(disabled_.begin(), disabled_.end(), static_cast<int64_t>(i) - 1) == disabled_.end();
        const at::Tensor converted = sample - f32(sigmas_.at(i)) * out;
        at::Tensor x = sample;
        if (corrector) x = update(converted, i, last_sample_, this_order_, true).to(sample.scalar_type());
        outputs_.push_back(converted);
        if (static_cast<int>(outputs_.size()) > order_) outputs_.pop_front();
        const int left = static_cast<int>(timesteps_.size() - i);
        const int wanted = lower_order_final_ ? std::min(order_, left) : order_;
        this_order_ = std::min(wanted, lower_order_nums_ + 1);
        last_sample_ = x;
        at::Tensor prev = update(at::Tensor(), i, x, this_order_, false).to(x.scalar_type());
        if (lower_order_nums_ < order_) ++lower_order_nums_;
        return prev;
    }

  private:
    // multistep_uni_p_bh_update (corrector false: from step i to i + 1) and multistep_uni_c_bh_update
    // (corrector: from i - 1 to i, with this step's converted output `model_t`).
    at::Tensor update(const at::Tensor& model_t, std::size_t i, const at::Tensor& x, int order,
                      bool corrector) const {
        const std::size_t t = corrector ? i : i + 1, s = corrector ? i - 1 : i;
        const at::Tensor st = f32(sigmas_.at(t)), s0 = f32(sigmas_.at(s));
        const at::Tensor alpha_t = 1 - st;
        const at::Tensor h = lambda_of(st) - lambda_of(s0);
        const at::Tensor& m0 = outputs_.back();
        std::vector<at::Tensor> rks, D1s;
        for (int k = 1; k < order; ++k) {
            const std::size_t si =
                corrector ? i - static_cast<std::size_t>(k + 1) : i - static_cast<std::size_t>(k);
            const at::Tensor& mk = outputs_[outputs_.size() - 1 - static_cast<std::size_t>(k)];
            const at::Tensor rk = (lambda_of(f32(sigmas_.at(si))) - lambda_of(s0)) / h;
            rks.push_back(rk);
            D1s.push_back((mk - m0) / rk);
        }
        rks.push_back(at::ones({}, at::kFloat));
        const at::Tensor rk = at::stack(rks);
        const at::Tensor hh = -h, h_phi_1 = at::expm1(hh);
        at::Tensor h_phi_k = h_phi_1 / hh - 1;
        const at::Tensor B_h = bh2_ ? at::expm1(hh) : hh;
        std::vector<at::Tensor> R, b;
        double factorial = 1;
        for (int k = 1; k <= order; ++k) {
            R.push_back(at::pow(rk, k - 1));
            b.push_back(h_phi_k * factorial / B_h);
            factorial *= k + 1;
            h_phi_k = h_phi_k / hh - 1 / factorial;
        }
        const at::Tensor Rm = at::stack(R), bv = at::stack(b);
        const at::Tensor base = st / s0 * x - alpha_t * h_phi_1 * m0;
        const auto weighted = [&](const at::Tensor& rhos, std::size_t count) {
            at::Tensor sum;
            for (std::size_t k = 0; k < count; ++k) {
                const at::Tensor term = rhos[static_cast<int64_t>(k)] * D1s[k];
                sum = sum.defined() ? sum + term : term;
            }
            return sum;
        };
        if (!corrector) {
            if (D1s.empty()) return base;
            const at::Tensor rhos = order == 2
                                        ? at::full({1}, 0.5, x.options().device(at::kCPU))
                                        : at::linalg_solve(Rm.narrow(0, 0, order - 1).narrow(1, 0, order - 1),
                                                           bv.narrow(0, 0, order - 1))
                                              .to(x.scalar_type());
            return base - alpha_t * B_h * weighted(rhos, D1s.size());
        }
        const at::Tensor rhos = order == 1 ? at::full({1}, 0.5, x.options().device(at::kCPU))
                                           : at::linalg_solve(Rm, bv).to(x.scalar_type());
        at::Tensor res = rhos[order - 1] * (model_t - m0);
        if (!D1s.empty()) res = weighted(rhos, D1s.size()) + res;
        return base - alpha_t * B_h * res;
    }

    int train_, order_;
    FlowSchedule schedule_;  // its flow sigmas' shift and terminal stretch, Euler's (no spacing: refused)
    bool bh2_, lower_order_final_, sigma_min_last_;
    std::vector<int64_t> disabled_;
    std::deque<at::Tensor> outputs_;
    at::Tensor last_sample_;
    int lower_order_nums_ = 0, this_order_ = 0;
};

}  // namespace

std::unique_ptr<Scheduler> make_scheduler(const protocol::ResolvedScheduler& resolved) {
    if (!resolved.kind) throw InternalError("make_scheduler: an unresolved scheduler");
    const nlohmann::json c = resolved.json();
    const std::string cls = resolved.kind->diffusers_class;
    if (cls == "FlowMatchHeunDiscreteScheduler") return std::make_unique<HeunScheduler>(c);
    if (cls == "FlowMatchLCMScheduler") return std::make_unique<FlowMatchScheduler>(c, true);
    if (cls == "DPMSolverMultistepScheduler") return std::make_unique<DpmSolverScheduler>(c);
    if (cls == "UniPCMultistepScheduler") return std::make_unique<UniPcScheduler>(c);
    return std::make_unique<FlowMatchScheduler>(c, false);
}

bool takes_mu(const protocol::ResolvedScheduler& scheduler) {
    return scheduler.kind->takes_mu && scheduler.json().value("use_dynamic_shifting", false);
}

ScheduleInputs schedule_inputs(const protocol::ResolvedScheduler& scheduler, SigmaSchedule rule, int steps,
                               const std::vector<double>& sigmas, const std::vector<double>& timesteps,
                               double mu) {
    ScheduleInputs in;
    in.steps = steps;
    const bool flow_sigmas = scheduler.json().value("use_flow_sigmas", false);
    if (!sigmas.empty() || !timesteps.empty()) {
        in.sigmas = sigmas;
        in.timesteps = timesteps;
    } else if (rule != SigmaSchedule::kScheduler) {
        in.sigmas = linspace_sigmas(steps);
    }
    if (rule == SigmaSchedule::kEvenlySpacedUnlessFlowSigmas && flow_sigmas) in.sigmas.clear();
    if (!scheduler.kind->takes_sigmas) in.sigmas.clear();
    if (!scheduler.kind->takes_timesteps) in.timesteps.clear();
    if (takes_mu(scheduler)) in.mu = mu;
    return in;
}

std::vector<double> linspace_sigmas(int steps) {
    std::vector<double> s(static_cast<std::size_t>(std::max(steps, 0)), 1.0);
    if (steps < 2) return s;
    const double step = (1.0 / steps - 1.0) / (steps - 1);
    for (int i = 0; i < steps; ++i) s[static_cast<std::size_t>(i)] = i * step + 1.0;
    s.back() = 1.0 / steps;
    return s;
}

double calculate_shift(const nlohmann::json& c, int64_t image_seq_len) {
    const double base_len = config_number(c, "base_image_seq_len", 256),
                 max_len = config_number(c, "max_image_seq_len", 4096);
    const double base = config_number(c, "base_shift", 0.5), top = config_number(c, "max_shift", 1.15);
    const double m = (top - base) / (max_len - base_len);
    const double b = base - m * base_len;
    return static_cast<double>(image_seq_len) * m + b;
}

}  // namespace dp::runtime
