// FlowMatchEulerDiscreteScheduler against diffusers' own output (tests/data/golden/scheduler.safetensors,
// written by scripts/golden/make_golden.py) and against the closed form.
#include "unit/doctest_torch.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/pipeline/flow_match_scheduler.h"

using namespace dp::runtime;

namespace {
std::shared_ptr<SafetensorsFile> golden() {
    return SafetensorsFile::open(golden_path("scheduler.safetensors"));
}

double max_abs_diff(const std::vector<float>& ours, const at::Tensor& ref) {
    REQUIRE(static_cast<int64_t>(ours.size()) == ref.numel());
    at::Tensor t = at::tensor(at::ArrayRef<float>(ours));
    return (t - ref).abs().max().item<double>();
}

// The sigmas and timesteps `s` set against the golden case `name` of `file`.
void check_against_golden(const FlowMatchEulerScheduler& s, const std::shared_ptr<SafetensorsFile>& file,
                          const std::string& name) {
    const double ds = max_abs_diff(s.sigmas(), load_tensor(file, name + ".sigmas", at::kFloat));
    const double dt = max_abs_diff(s.timesteps(), load_tensor(file, name + ".timesteps", at::kFloat));
    MESSAGE(name << ": max |sigma diff| " << ds << ", max |timestep diff| " << dt);
    CHECK(ds <= 1e-6);
    CHECK(dt <= 1e-4);
}
}  // namespace

TEST_CASE("sigmas and timesteps match diffusers for every golden configuration") {
    auto file = golden();
    const auto cases = nlohmann::json::parse(file->metadata().at("cases"));
    int checked = 0;
    for (const auto& [name, c] : cases.items()) {
        if (name == "step") continue;
        CAPTURE(name);
        FlowMatchEulerScheduler s(FlowMatchSchedulerConfig::from_json_text(c["config"].dump(), name));
        std::optional<double> mu;
        if (!c["mu"].is_null()) mu = c["mu"].get<double>();
        s.set_timesteps(c["steps"].get<int>(), mu);
        check_against_golden(s, file, name);
        ++checked;
    }
    CHECK(checked == 8);
}

TEST_CASE("the Euler step matches diffusers at every index") {
    auto file = golden();
    FlowMatchEulerScheduler s(FlowMatchSchedulerConfig::from_json_text(R"({"shift": 3.0})", "sd3"));
    s.set_timesteps(4);
    at::Tensor sample = load_tensor(file, "step.sample", at::kFloat);
    at::Tensor out = load_tensor(file, "step.model_output", at::kFloat);
    for (int i = 0; i < 4; ++i) {
        at::Tensor ref = load_tensor(file, "step.prev_" + std::to_string(i), at::kFloat);
        CHECK((s.step(out, i, sample) - ref).abs().max().item<double>() <= 1e-6);
    }
    CHECK_THROWS_AS(s.step(out, 4, sample), ModelError);
}

TEST_CASE("closed form: with shift 1 the sigmas are evenly spaced from 1 to 1/N, then 0") {
    FlowMatchEulerScheduler s(FlowMatchSchedulerConfig{});
    s.set_timesteps(5);
    REQUIRE(s.sigmas().size() == 6);
    const double first = 1.0, last = 1.0 / 1000;
    for (int i = 0; i < 5; ++i)
        CHECK(s.sigmas()[static_cast<std::size_t>(i)] ==
              doctest::Approx(first + i * (last - first) / 4).epsilon(1e-6));
    CHECK(s.sigmas().back() == 0.0f);
    CHECK(s.timesteps()[0] == doctest::Approx(1000.0));
}

TEST_CASE("configs we do not implement, and bad values, are refused by name") {
    CHECK_THROWS_WITH_AS(FlowMatchSchedulerConfig::from_json_text(R"({"use_karras_sigmas": true})", "s.json"),
                         doctest::Contains("use_karras_sigmas"), ModelError);
    CHECK_THROWS_WITH_AS(
        FlowMatchSchedulerConfig::from_json_text(R"({"_class_name": "DDIMScheduler"})", "s.json"),
        doctest::Contains("DDIMScheduler"), ModelError);
    CHECK_THROWS_WITH_AS(FlowMatchSchedulerConfig::from_json_text(R"({"shift": "big"})", "s.json"),
                         doctest::Contains("'shift'"), ModelError);
    CHECK_THROWS_AS(FlowMatchSchedulerConfig::from_json_text(R"({"shift": -1})", "s.json"), ModelError);
    CHECK_THROWS_AS(FlowMatchSchedulerConfig::from_json_text("{", "s.json"), ModelError);
    FlowMatchEulerScheduler dynamic(
        FlowMatchSchedulerConfig::from_json_text(R"({"use_dynamic_shifting": true})", "s.json"));
    CHECK_THROWS_WITH_AS(dynamic.set_timesteps(4), doctest::Contains("needs mu"), ModelError);
    CHECK_THROWS_AS(dynamic.set_timesteps(0, 0.5), ModelError);
}

TEST_CASE("explicit sigmas as QwenImagePipeline passes them: dynamic mu from the tokens, shift_terminal") {
    // tests/data/golden/qwen_scheduler.safetensors (scripts/golden/golden_qwen_scheduler.py):
    // linspace(1, 1/N, N) through Qwen-Image's scheduler config, as diffusers sets them.
    auto file = SafetensorsFile::open(golden_path("qwen_scheduler.safetensors"));
    const auto cases = nlohmann::json::parse(file->metadata().at("cases"));
    int checked = 0;
    for (const auto& [name, c] : cases.items()) {
        CAPTURE(name);
        const FlowMatchSchedulerConfig config =
            FlowMatchSchedulerConfig::from_json_text(c["config"].dump(), name);
        FlowMatchEulerScheduler s(config);
        const int steps = c["steps"].get<int>();
        std::vector<double> sigmas;
        for (int i = 0; i < steps; ++i)
            sigmas.push_back(steps == 1 ? 1.0 : 1.0 + (1.0 / steps - 1.0) * i / (steps - 1));
        const double mu = flow_match_mu(config, c["image_seq_len"].get<int>());
        CHECK(mu == doctest::Approx(c["mu"].get<double>()).epsilon(1e-12));
        s.set_sigmas(sigmas, mu);
        if (name == "qwen_one_step") {
            // diffusers stretches one sigma of 1 to its terminal by 0 / 0: NaN. Ours stays 1 -> 0.
            CHECK(std::isnan(load_tensor(file, name + ".sigmas", at::kFloat)[0].item<float>()));
            CHECK(s.sigmas() == std::vector<float>{1.0f, 0.0f});
            CHECK(s.timesteps() == std::vector<float>{1000.0f});
            ++checked;
            continue;
        }
        check_against_golden(s, file, name);
        ++checked;
    }
    CHECK(checked == 4);
    FlowMatchEulerScheduler s(FlowMatchSchedulerConfig::from_json_text(R"({"shift": 3.0})", "sd3"));
    CHECK_THROWS_AS(s.set_sigmas({}), ModelError);
    CHECK_THROWS_AS(s.set_sigmas({1.0, 0.0}), ModelError);
    CHECK_THROWS_AS(s.set_sigmas({1.5}), ModelError);
}
