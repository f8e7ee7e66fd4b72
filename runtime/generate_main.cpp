// dp-generate: one image from a model folder, with timings as JSON on stdout. A harness for the
// benchmarks (scripts/bench/pipeline_vs_diffusers.sh) and for checking a model by hand.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "protocol/call_arguments.h"
#include "runtime/io/errors.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/adapters.h"
#include "runtime/pipeline/pipeline.h"
#include "strategies/model_config.h"

namespace {
double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
long peak_rss_kb() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}
// `text`, a flag's value, as `row`'s value of `request` (a repeated --lora adds one). Throws
// CLI::ValidationError saying what is expected.
void set_call_argument(dp::runtime::GenerateRequest& request, const dp::protocol::CallArgument& row,
                       const std::string& text) {
    nlohmann::json value;
    try {
        if (row.type == dp::protocol::CallType::kBlocks) {
            value = nlohmann::json::array();
            for (std::size_t at = 0; at < text.size();) {
                const std::size_t comma = std::min(text.find(',', at), text.size());
                value.push_back(std::stoll(text.substr(at, comma - at)));
                at = comma + 1;
            }
        } else if (row.type == dp::protocol::CallType::kAdapters) {
            dp::protocol::Adapter a;
            if (const std::string why = dp::protocol::parse_adapter_text(text, a); !why.empty())
                throw CLI::ValidationError(row.long_flag(), why);
            value = dp::protocol::call_value_json(dp::protocol::Adapters{a});
            if (const auto* had = request.arguments.find(row.name))  // repeatable: adds one
                value.insert(value.begin(), dp::protocol::call_value_json(*had).begin(),
                             dp::protocol::call_value_json(*had).end());
        } else if (row.type == dp::protocol::CallType::kCache || row.type == dp::protocol::CallType::kImage ||
                   row.type == dp::protocol::CallType::kScheduler ||
                   row.type == dp::protocol::CallType::kSchedulerOverrides ||
                   row.type == dp::protocol::CallType::kNumbers) {
            value = text;
        } else {
            value = nlohmann::json::parse(text);
        }
    } catch (const std::exception&) {
        throw CLI::ValidationError(row.long_flag(), "expected " + row.expected());
    }
    dp::protocol::CallValue v;
    if (const std::string why = dp::protocol::read_call_value(row, value, v); !why.empty())
        throw CLI::ValidationError(row.long_flag(), why);
    request.arguments.set(row, std::move(v));
}

// Each family call argument of the table by its flag (--guidance-scale, --true-cfg-scale, ...);
// left out, the model's default.
void add_call_argument_flags(CLI::App& app, dp::runtime::GenerateRequest& request) {
    for (const dp::protocol::CallArgument& row : dp::protocol::call_arguments()) {
        if (row.universal) continue;
        app.add_option_function<std::string>(
            row.long_flag(),
            [&request, &row](const std::string& text) { set_call_argument(request, row, text); }, row.help);
    }
}
}  // namespace

int main(int argc, char** argv) {
    using namespace dp::runtime;
    CLI::App app("dp-generate: generate one image with a model folder's pipeline and print timings as JSON");
    PipelineOptions options;
    options.adapters = std::make_shared<AdapterState>();
    GenerateRequest request;
    request.prompt = "a photo of a cat";
    std::string dtype = "fp32";
    int64_t random_seed = -1;
    app.add_option("--model", options.model_dir, "diffusers model folder")->required();
    app.add_option("--random-weights", random_seed,
                   "use the folder's configs with random weights of this seed");
    app.add_option("--prompt", request.prompt, "prompt");
    app.add_option_function<std::string>(
        "--negative-prompt", [&](const std::string& text) { request.negative_prompt = text; },
        "negative prompt");
    app.add_option("--seed", request.seed, "seed of the initial noise");
    app.add_option("--steps", request.steps, "denoising steps")->check(CLI::Range(1, 10000));
    add_call_argument_flags(app, request);
    app.add_option("--width", request.width, "width in pixels (default: the model's)");
    app.add_option("--height", request.height, "height in pixels (default: the model's)");
    app.add_option("--dtype", dtype, "fp32, bf16 or fp16")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    CLI11_PARSE(app, argc, argv);
    options.dtype = dtype == "bf16" ? at::kBFloat16 : dtype == "fp16" ? at::kHalf : at::kFloat;
    if (random_seed >= 0) options.random_weights = static_cast<uint64_t>(random_seed);
    try {
        auto start = std::chrono::steady_clock::now();
        auto pipeline = load_pipeline(options, ParallelContext::single());
        const double load_ms = ms_since(start);
        // A switch to the request's adapters, timed on its own (the generation then finds them current).
        double adapter_switch_ms = 0;
        nlohmann::json switched = nlohmann::json::object();
        if (const auto& adapters = request.arguments.adapters("lora"); !adapters.empty()) {
            const dp::strategies::ModelInfo model = dp::strategies::read_model_info(options.model_dir);
            start = std::chrono::steady_clock::now();
            const AdapterState::Report report =
                options.adapters->apply(adapters, *model.spec, options.model_dir, options.variant);
            adapter_switch_ms = ms_since(start);
            static const char* kHow[] = {"in place", "rebuilt", "at next use"};
            for (const auto& [component, how] : report.components)
                switched[component] = kHow[static_cast<int>(how)];
            switched["weights_in_place"] = report.weights;
        }
        std::vector<double> step_ms;
        auto step_start = std::chrono::steady_clock::now();
        request.on_step = [&](int, int) {
            step_ms.push_back(ms_since(step_start));
            step_start = std::chrono::steady_clock::now();
        };
        start = std::chrono::steady_clock::now();
        step_start = start;
        GenerateResult result = pipeline->generate(request);
        const double total_ms = ms_since(start);
        nlohmann::json out = {{"load_ms", load_ms},
                              {"step_ms", step_ms},
                              {"generate_ms", total_ms},
                              {"adapter_switch_ms", adapter_switch_ms},
                              {"adapter_switch", switched},
                              {"peak_rss_kb", peak_rss_kb()},
                              {"threads", at::get_num_threads()},
                              {"image_mean", result.image.to(at::kFloat).mean().item<double>()},
                              {"warnings", result.warnings}};
        std::cout << out.dump() << std::endl;
        return 0;
    } catch (const Error& e) {
        std::cerr << "dp-generate: " << e.what() << std::endl;
        return e.exit_code();
    } catch (const std::exception& e) {
        std::cerr << "dp-generate: " << e.what() << std::endl;
        return 1;
    }
}
