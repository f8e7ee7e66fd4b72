// The samplers of Note [one scheduler table] against diffusers' own output, written by
// scripts/golden/: tests/data/golden/scheduler.safetensors and qwen_scheduler.safetensors (the
// models' own FlowMatchEulerDiscreteScheduler configs), and schedulers.safetensors (every name on
// the small SD3, FLUX.1 and Qwen-Image configs at several step counts and sizes, their overrides,
// a prompt's sigmas and timesteps, and a sampler run of each: the sigmas, timesteps and every
// sample element-wise, stochastic ones drawing from each row's own generator); and whole pipelines
// (scheduler_pipelines.safetensors): each name on the small SD3, FLUX.1-dev and Qwen-Image folders,
// a prompt's sigmas, a stochastic batch, and a Lightning-style adapter with its preset's schedule,
// every case a request of its own through one pipeline per folder.
#include "unit/doctest_torch.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/adapters.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/pipeline/schedulers.h"
#include "support/test_paths.h"
#include "unit/golden_request.h"

using namespace dp::runtime;
using dp::protocol::ResolvedScheduler;
using dp::protocol::SchedulerChoice;
using dp::protocol::SchedulerOverrides;

namespace {

double max_abs_diff(const std::vector<float>& ours, const at::Tensor& ref) {
    REQUIRE(static_cast<int64_t>(ours.size()) == ref.numel());
    return (at::tensor(at::ArrayRef<float>(ours)) - ref.to(at::kFloat)).abs().max().item<double>();
}

std::vector<double> list_of(const nlohmann::json& j) {
    return j.is_null() ? std::vector<double>{} : j.get<std::vector<double>>();
}

// `model` with `name` and `overrides` as a prompt line gives them, resolved (an error text, or empty).
std::string resolved(const nlohmann::json& model, const std::string& name, const nlohmann::json& overrides,
                     ResolvedScheduler& out) {
    SchedulerChoice choice;
    choice.name = name;
    SchedulerOverrides keys;
    if (overrides.is_object() && !overrides.empty()) keys.json = overrides.dump();
    return dp::protocol::resolve_scheduler(model, choice, keys, out);
}

SigmaSchedule rule_of(const std::string& pipeline) {
    return pipeline == "sd3"    ? SigmaSchedule::kScheduler
           : pipeline == "flux" ? SigmaSchedule::kEvenlySpacedUnlessFlowSigmas
                                : SigmaSchedule::kEvenlySpaced;
}

// What diffusers refuses to run well and we refuse by name: UniPC's Karras sigmas (built from its
// DDPM betas), its NaN endings, DPM-Solver++'s sigma_min ending (a DDPM sigma after flow ones).
const std::set<std::string>& refused_variants() {
    static const std::set<std::string> v = {"unipc+karras", "unipc+bh1", "unipc+no_lower_final",
                                            "dpm++-2m+sigma_min"};
    return v;
}

}  // namespace

TEST_CASE("every scheduler's sigmas, timesteps and sampler run match diffusers") {
    auto file = SafetensorsFile::open(golden_path("schedulers.safetensors"));
    const auto cases = nlohmann::json::parse(file->metadata().at("cases"));
    int checked = 0, refused = 0;
    std::set<std::string> names;
    for (const auto& [name, c] : cases.items()) {
        CAPTURE(name);
        ResolvedScheduler s;
        const std::string why = resolved(c["model_config"], c["scheduler"], c["overrides"], s);
        if (refused_variants().count(name.substr(0, name.find(':')))) {
            CHECK_FALSE(why.empty());
            ++refused;
            continue;
        }
        REQUIRE_MESSAGE(why.empty(), why);
        names.insert(s.kind->name);
        const int steps = c["steps"].get<int>();
        const std::vector<double> sigmas = list_of(c["sigmas"]), timesteps = list_of(c["timesteps"]);
        CHECK(dp::protocol::schedule_problem(s, steps, sigmas, timesteps).empty());
        const double mu = calculate_shift(s.json(), c["image_seq_len"].get<int64_t>());
        if (!c["mu"].is_null()) CHECK(mu == doctest::Approx(c["mu"].get<double>()).epsilon(1e-12));
        CHECK(takes_mu(s) == !c["mu"].is_null());
        std::unique_ptr<Scheduler> scheduler = make_scheduler(s);
        scheduler->set_timesteps(schedule_inputs(s, rule_of(c["pipeline"]), steps, sigmas, timesteps, mu));
        CHECK(scheduler->order() == c["order"].get<int>());
        CHECK(max_abs_diff(scheduler->sigmas(), load_tensor(file, name + ".sigmas", at::kFloat)) <= 1e-6);
        CHECK(max_abs_diff(scheduler->timesteps(), load_tensor(file, name + ".timesteps", at::kFloat)) <=
              1e-3);
        // The sampler run: v = 0.3 x + (t / 1000) b at each call, noise from seeds 10 and 11 after x0.
        std::vector<at::Generator> gens;
        for (int64_t seed : c.value("seeds", std::vector<int64_t>{10, 11}))
            gens.push_back(at::detail::createCPUGenerator(static_cast<uint64_t>(seed)));
        std::vector<at::Tensor> rows;
        for (at::Generator& g : gens)
            rows.push_back(at::randn({1, 4, 4, 4}, g, at::TensorOptions().dtype(at::kFloat)));
        at::Tensor x = load_tensor(file, name + ".x0", at::kFloat);
        CHECK((at::cat(rows, 0) - x).abs().max().item<double>() == 0);
        const at::Tensor b = load_tensor(file, name + ".b", at::kFloat);
        const at::Tensor trajectory = load_tensor(file, name + ".trajectory", at::kFloat);
        const StepNoise noise = [&gens](const at::Tensor& like) {
            std::vector<at::Tensor> drawn;
            for (at::Generator& g : gens)
                drawn.push_back(at::randn({1, 4, 4, 4}, g, at::TensorOptions().dtype(at::kFloat)));
            return at::cat(drawn, 0).to(like.device());
        };
        REQUIRE(trajectory.size(0) == static_cast<int64_t>(scheduler->timesteps().size()));
        // Heun: diffusers' own rounding where its derivative cancels (Note [Heun's derivative]): a
        // float32 step of x over the smallest sigma.
        float smallest = 1;
        for (float sigma : scheduler->sigmas())
            if (sigma > 0) smallest = std::min(smallest, sigma);
        for (std::size_t i = 0; i < scheduler->timesteps().size(); ++i) {
            const at::Tensor v = 0.3 * x + (scheduler->timesteps()[i] / 1000.0f) * b;
            const double cancelled =
                s.kind->order == 2 ? 2 * 1.2e-7 * x.abs().max().item<double>() / smallest : 0;
            x = scheduler->step(v, static_cast<int>(i), x, noise);
            const at::Tensor ref = trajectory[static_cast<int64_t>(i)];
            const double scale = std::max(1.0, ref.abs().max().item<double>());
            CAPTURE(i);
            CHECK((x - ref).abs().max().item<double>() <= 2e-5 * scale + cancelled);
        }
        ++checked;
    }
    MESSAGE(checked << " cases checked, " << refused << " refused");
    CHECK(checked >= 185);
    CHECK(refused == 4 * 2);
    CHECK(names == std::set<std::string>{"euler", "heun", "lcm", "dpm++-2m", "dpm++-2m-sde", "unipc"});
}

TEST_CASE("the models' own Euler schedules match diffusers, Qwen-Image's explicit sigmas too") {
    auto file = SafetensorsFile::open(golden_path("scheduler.safetensors"));
    int checked = 0;
    const nlohmann::json euler_cases = nlohmann::json::parse(file->metadata().at("cases"));
    for (const auto& [name, c] : euler_cases.items()) {
        if (name == "step") continue;
        CAPTURE(name);
        ResolvedScheduler s;
        REQUIRE(resolved(c["config"], "", nullptr, s).empty());
        auto scheduler = make_scheduler(s);
        ScheduleInputs in;
        in.steps = c["steps"].get<int>();
        if (!c["mu"].is_null()) in.mu = c["mu"].get<double>();
        scheduler->set_timesteps(in);
        CHECK(max_abs_diff(scheduler->sigmas(), load_tensor(file, name + ".sigmas", at::kFloat)) <= 1e-6);
        CHECK(max_abs_diff(scheduler->timesteps(), load_tensor(file, name + ".timesteps", at::kFloat)) <=
              1e-4);
        ++checked;
    }
    CHECK(checked == 8);
    auto qwen = SafetensorsFile::open(golden_path("qwen_scheduler.safetensors"));
    const nlohmann::json qwen_cases = nlohmann::json::parse(qwen->metadata().at("cases"));
    for (const auto& [name, c] : qwen_cases.items()) {
        CAPTURE(name);
        ResolvedScheduler s;
        REQUIRE(resolved(c["config"], "", nullptr, s).empty());
        auto scheduler = make_scheduler(s);
        const int steps = c["steps"].get<int>();
        const double mu = calculate_shift(s.json(), c["image_seq_len"].get<int64_t>());
        CHECK(mu == doctest::Approx(c["mu"].get<double>()).epsilon(1e-12));
        scheduler->set_timesteps(schedule_inputs(s, SigmaSchedule::kEvenlySpaced, steps, {}, {}, mu));
        if (name == "qwen_one_step") {
            // diffusers stretches one sigma of 1 to its terminal by 0 / 0: NaN. Ours stays 1 -> 0.
            CHECK(std::isnan(load_tensor(qwen, name + ".sigmas", at::kFloat)[0].item<float>()));
            CHECK(scheduler->sigmas() == std::vector<float>{1.0f, 0.0f});
            continue;
        }
        CHECK(max_abs_diff(scheduler->sigmas(), load_tensor(qwen, name + ".sigmas", at::kFloat)) <= 1e-6);
    }
}

TEST_CASE("scheduler choices the loop does not run, and bad schedules, are refused by name") {
    const nlohmann::json flux = {
        {"_class_name", "FlowMatchEulerDiscreteScheduler"}, {"shift", 3.0}, {"use_dynamic_shifting", true}};
    struct Bad {
        const char* name;
        nlohmann::json overrides;
        const char* says;
    };
    const Bad bad[] = {
        {"euler", {{"use_karras_sigmas", true}, {"use_exponential_sigmas", true}}, "only one of"},
        {"euler", {{"shfit", 3.0}}, "'shfit' is not a key of FlowMatchEulerDiscreteScheduler"},
        {"euler", {{"shift", "big"}}, "'shift' takes a number"},
        {"euler", {{"shift", -1}}, "'shift' is -1: it must be above 0"},
        {"euler", {{"time_shift_type", "cubic"}}, "accepted: exponential, linear"},
        {"dpm++-2m", {{"use_flow_sigmas", false}}, "runs on flow sigmas"},
        {"dpm++-2m", {{"algorithm_type", "dpmsolver"}}, "accepted: dpmsolver++, sde-dpmsolver++"},
        {"dpm++-2m", {{"solver_order", 4}}, "'solver_order' must be 1, 2 or 3"},
        {"dpm++-2m", {{"use_karras_sigmas", true}}, "DDPM betas"},
        {"unipc", {{"solver_type", "bh1"}}, "NaN"},
        {"lcm", {{"scale_factors", nlohmann::json::array({1.0})}}, "'scale_factors' takes only null"},
        {"heun", {{"use_karras_sigmas", true}}, "not a key of FlowMatchHeunDiscreteScheduler"},
    };
    for (const Bad& b : bad) {
        CAPTURE(b.name);
        CAPTURE(b.overrides.dump());
        ResolvedScheduler s;
        const std::string why = resolved(flux, b.name, b.overrides, s);
        CHECK(why.find(b.says) != std::string::npos);
    }
    ResolvedScheduler euler, heun;
    REQUIRE(resolved(flux, "euler", nullptr, euler).empty());
    REQUIRE(resolved(flux, "heun", nullptr, heun).empty());
    using dp::protocol::schedule_problem;
    CHECK(schedule_problem(euler, 3, {1.0, 0.5, 0.25}, {}).empty());
    CHECK(schedule_problem(euler, 3, {1.0, 0.5, 0.5}, {}).find("must decrease") != std::string::npos);
    CHECK(schedule_problem(euler, 3, {1.0, 0.5, 0.0}, {}).find("above 0") != std::string::npos);
    CHECK(schedule_problem(euler, 3, {1.0, NAN, 0.2}, {}).find("sigmas[1]") != std::string::npos);
    CHECK(schedule_problem(euler, 4, {1.0, 0.5, 0.25}, {}).find("3 values for 4 steps") != std::string::npos);
    CHECK(schedule_problem(heun, 3, {1.0, 0.5, 0.25}, {}).find("takes no sigmas") != std::string::npos);
    CHECK(schedule_problem(euler, 2, {}, {999, 999}).find("must decrease") != std::string::npos);
    dp::protocol::SchedulerChoice choice;
    CHECK(dp::protocol::parse_scheduler_choice("eulr", choice).find("known: euler, heun, lcm") !=
          std::string::npos);
    CHECK(dp::protocol::parse_scheduler_choice("dpmpp_2m", choice).empty());
    CHECK(choice.name == "dpm++-2m");
    CHECK(dp::protocol::parse_scheduler_choice("UniPCMultistepScheduler", choice).empty());
    CHECK(choice.name == "unipc");
}

namespace {

// A case of scheduler_pipelines.safetensors as its requests (a list of prompts: one each, batched).
std::vector<GenerateRequest> scheduler_requests(const nlohmann::json& c) {
    nlohmann::json call = c;
    if (c.contains("preset_expands_to"))  // what the preset stands for (protocol/presets.h)
        for (const auto& [key, value] : c.at("preset_expands_to").items()) call[key] = value;
    std::vector<GenerateRequest> out;
    const std::size_t n = c.at("prompt").is_array() ? c.at("prompt").size() : 1;
    for (std::size_t k = 0; k < n; ++k) {
        nlohmann::json one = call;
        if (c.at("prompt").is_array()) one["prompt"] = c.at("prompt")[k], one["seed"] = c.at("seed")[k];
        GenerateRequest r = dp::test::golden_request(one);
        if (c.contains("adapters")) {
            dp::protocol::Adapters adapters;
            for (const auto& a : c.at("adapters"))
                adapters.push_back({golden_path("lora/" + a.at("file").get<std::string>()),
                                    a.at("scale").get<double>(), ""});
            r.arguments.set("lora", adapters);
        }
        out.push_back(r);
    }
    return out;
}

// The share of `ours`' channels within 1 of `theirs` (uint8 images).
double within_one(const at::Tensor& ours, const at::Tensor& theirs) {
    return (ours.to(at::kInt) - theirs.to(at::kInt)).abs().le(1).to(at::kDouble).mean().item<double>();
}

}  // namespace

TEST_CASE("each scheduler gives diffusers' images on SD3, FLUX.1 and Qwen-Image, chosen per request") {
    auto file = SafetensorsFile::open(golden_path("scheduler_pipelines.safetensors"));
    const nlohmann::json cases = nlohmann::json::parse(file->metadata().at("cases"));
    std::map<std::string, std::shared_ptr<DiffusionPipeline>>
        pipelines;  // one per folder, every case through it
    int checked = 0;
    for (const auto& [name, c] : cases.items()) {
        CAPTURE(name);
        const std::string folder = c.at("folder").get<std::string>();
        if (!pipelines.count(folder)) {
            PipelineOptions o;
            o.model_dir = dp::test::repository_path(folder);
            o.adapters = std::make_shared<AdapterState>();
            pipelines[folder] = load_pipeline(o, ParallelContext::single());
        }
        const std::vector<GenerateRequest> requests = scheduler_requests(c);
        const std::vector<GenerateResult> out = pipelines[folder]->generate_batch(requests);
        REQUIRE(out.size() == requests.size());
        for (std::size_t k = 0; k < out.size(); ++k) {
            const std::string key = name + (requests.size() > 1 ? "." + std::to_string(k) : "");
            REQUIRE(out[k].error.empty());
            const at::Tensor ref = load_tensor(file, key + ".latents", at::kFloat);
            const double diff = (out[k].latents.reshape(ref.sizes()) - ref).abs().max().item<double>();
            const double scale = std::max(1.0, ref.abs().max().item<double>());
            MESSAGE(key << ": max |latent diff| " << diff << " (largest latent " << scale << ")");
            CHECK(diff <= 1e-4 * scale);
            CHECK(within_one(out[k].image, load_tensor(file, key + ".image", at::kByte)) >= 0.999);
        }
        ++checked;
    }
    CHECK(checked == static_cast<int>(cases.size()));
    CHECK(checked >= 30);
}
