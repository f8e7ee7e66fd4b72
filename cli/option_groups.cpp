#include "cli/option_groups.h"

#include "protocol/call_arguments.h"

namespace dp::cli {

const std::vector<OptionGroup>& option_groups() {
    static const std::vector<OptionGroup> groups = {
        {"Launcher: processes, nodes and the command",
         {"num_processes",
          "gpu_ids",
          "nnodes",
          "node_rank",
          "master_addr",
          "master_port",
          "local_addr",
          "cluster",
          "standalone",
          "rdzv_backend",
          "rdzv_endpoint",
          "run_id",
          "module",
          "no_python",
          "run_path",
          "multi_gpu",
          "mixed_precision",
          "cpu",
          "num_cpu_threads_per_process",
          "config",
          "dry_run"}},
        {"Model (main job: with PROMPTS)",
         {"model", "revision", "variant", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3",
          "vae", "keep_quantized", "quantize", "offload", "no_t5", "random_weights", "dtype", "device",
          "force", "worker"}},
        {"Prompts and sampling (main job): each prompt line's defaults",
         {"prompt", "num_images_per_prompt", "steps", "preset", "seed", "width", "height",
          "negative_prompt"}},
        {"Parallelism (main job)",
         {"strategy", "dp", "cfg_parallel", "ulysses", "ring", "tp", "device_map", "max_memory", "batch_size",
          "schedule"}},
        {"Output",
         {"output_dir", "format", "quality", "overwrite", "resume", "skip_invalid", "progress", "log_dir",
          "quiet", "no_prefix", "tee", "redirects", "local_ranks_filter"}},
        {"Resilience: failures, hangs and time limits",
         {"max_restarts", "shutdown_grace", "rank_timeout", "load_timeout", "timeout", "collective_timeout",
          "node_timeout", "monitor_interval"}},
    };
    return groups;
}

std::string option_group(const std::string& key, const std::string& fallback) {
    for (const OptionGroup& g : option_groups())
        for (const std::string& k : g.keys)
            if (k == key) return g.heading;
    if (const protocol::CallArgument* a = protocol::find_call_argument(key); a && a->name == key)
        return option_groups().at(2).heading;
    return fallback;
}

std::vector<std::string> option_group_headings() {
    std::vector<std::string> out;
    for (const OptionGroup& g : option_groups()) out.push_back(g.heading);
    return out;
}

}  // namespace dp::cli
