#include "launcher/resolved_job.h"

#include "launcher/errors.h"
#include "launcher/job_settings.h"
#include "strategies/model_sizes.h"

namespace dp::launcher {
namespace {

// The job's strategy options on `launch`'s world, as strategies::resolve_strategy takes them.
strategies::StrategyRequest strategy_request(const LaunchSpec& launch, const JobOptions& job,
                                             const strategies::ModelInfo& model) {
    strategies::StrategyRequest r;
    r.world = launch.world_size();
    r.num_processes = launch.num_processes;
    r.strategy = job.strategy;
    r.cfg_parallel = job.cfg_parallel;
    r.arguments = model.arguments;
    // The job's guidance scale, else the model's own default (its folder's, else its family's).
    r.cfg_scale = cfg_scale_setting(job, model.arguments);
    if (const protocol::FamilyArgument* cfg = model.arguments.guidance_scale(); cfg && !r.cfg_scale)
        r.cfg_scale = model.arguments.default_number(cfg->row->name);
    r.ulysses = job.ulysses;
    r.ring = job.ring;
    r.tp = job.tp;
    r.dp = job.dp;
    r.device_map = job.device_map;
    r.max_memory = job.max_memory;
    r.device = job.device;
    return r;
}

// device_map's plan for `job.strategy`'s device map, made here when its budgets are known without
// a GPU: a FILE.json, or --max-memory. nullopt without a device map, or when the budgets are the
// visible GPUs' free memory, which the worker measures. Throws UsageError for a map that cannot
// work (one device, a component that fits nowhere, a bad file).
std::optional<strategies::DeviceMapPlan> plan_device_map_for(const ResolvedJob& job) {
    const JobOptions& o = job.options;
    const std::string& device_map = job.device_map();
    if (device_map.empty()) return std::nullopt;
    const bool file = device_map != "balanced" && device_map != "auto";
    if (!file && o.max_memory.empty()) return std::nullopt;  // the GPUs' memory: the worker's
    try {
        const auto plan_at = [&](int64_t element_bytes) {
            return strategies::plan_device_map_spec(o.model, *job.model.spec, element_bytes, device_map,
                                                    o.max_memory, {}, o.variant, job.left_out);
        };
        if (o.dtype != "auto") return plan_at(o.dtype == "fp32" ? 4 : 2);
        // --dtype auto is bf16 on GPUs and, where they have bf16 instructions, on CPUs (Note [bf16 on
        // a CPU that has it]): the devices say which.
        strategies::ResolvedStrategy devices = job.strategy;
        devices.device_map_plan.emplace();
        if (!o.max_memory.empty()) {
            for (const strategies::DeviceBudget& b : strategies::parse_max_memory(o.max_memory))
                devices.device_map_plan->devices.push_back(b.device);
        } else {
            devices.device_map_plan = plan_at(4);  // a FILE.json: no budgets to exceed
        }
        return plan_at(expected_dtype(o, devices, job.model.shape.width()) == "fp32" ? 4 : 2);
    } catch (const std::exception& e) {
        throw UsageError("--device-map " + device_map + ": " + e.what());
    }
}

}  // namespace

ResolvedJob resolve_job(const LaunchSpec& launch, const JobOptions& options) {
    ResolvedJob job;
    job.options = options;
    // The model is read here, once (Note [a model is read once], strategies/model_config.h).
    job.model = strategies::read_model_info(options.model);
    job.strategy = strategies::resolve_strategy(strategy_request(launch, options, job.model), *job.model.spec,
                                                static_cast<int>(job.model.shape.heads));
    job.left_out = strategies::components_left_out(options.model, *job.model.spec, options.no_t5);
    // Planned once, here (every error now, before anything starts), when the budgets are known.
    job.strategy.device_map_plan = plan_device_map_for(job);
    job.dtype = expected_dtype(options, job.strategy, job.model.shape.width());
    return job;
}

}  // namespace dp::launcher
