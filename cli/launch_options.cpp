#include "cli/launch_options.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "launcher/errors.h"
#include "launcher/values.h"

namespace dp::cli {

using launcher::UsageError;

const std::vector<LaunchOptionDef>& launch_option_table() {
    static const std::vector<LaunchOptionDef> table = {
        {"num_processes", "-n,--num-processes,--num_processes,--nproc-per-node,--nproc_per_node",
         "DP_NUM_PROCESSES", "N|auto", "auto",
         "Processes (ranks) to start on this node; 'auto' starts one per visible GPU, or 1 without GPUs"},
        {"gpu_ids", "--gpu-ids,--gpu_ids", "DP_GPU_IDS", "IDS", nullptr,
         "GPUs to use, e.g. 0,2; sets CUDA_VISIBLE_DEVICES for every rank"},
        {"nnodes", "--nnodes", "DP_NNODES", "N", "1", "Number of nodes in the job"},
        {"node_rank", "--node-rank,--node_rank,--machine-rank,--machine_rank", "DP_NODE_RANK", "R", "0",
         "This node's rank, 0 to nnodes-1"},
        {"master_addr", "--master-addr,--master_addr,--main-process-ip,--main_process_ip", "DP_MASTER_ADDR",
         "HOST", "127.0.0.1",
         "Host of node rank 0, where rank 0 runs the store (required with several nodes)"},
        {"master_port", "--master-port,--master_port,--main-process-port,--main_process_port",
         "DP_MASTER_PORT", "PORT", nullptr,
         "Port of rank 0's store; by default a free port is reserved (single node only)"},
        {"max_restarts", "--max-restarts,--max_restarts", "DP_MAX_RESTARTS", "N", "0",
         "Restart the whole group up to N times after a failure"},
        {"shutdown_grace", "--shutdown-grace,--shutdown_grace", "DP_SHUTDOWN_GRACE", "SECONDS", "5",
         "After a failure or a stop signal, time between SIGTERM and SIGKILL"},
        {"log_dir", "--log-dir,--log_dir", "DP_LOG_DIR", "DIR", nullptr,
         "Also append each rank's stdout and stderr to DIR/rank_N.stdout and DIR/rank_N.stderr"},
        {"run_id", "--run-id,--run_id,--rdzv-id,--rdzv_id", "DP_RUN_ID", "ID", "none",
         "Job id, exported as TORCHELASTIC_RUN_ID"},
        {"no_prefix", "--no-prefix,--no_prefix", "DP_NO_PREFIX", nullptr, nullptr,
         "Do not prefix output lines with [rank N]"},
        {"quiet", "-q,--quiet", "DP_QUIET", nullptr, nullptr,
         "Print none of dp-launch's own status lines (errors still show)"},
        {"dry_run", "--dry-run,--dry_run", "DP_DRY_RUN", nullptr, nullptr,
         "Print each rank's command and environment, start nothing"},
        {"config", "--config,--config-file,--config_file", "DP_CONFIG", "FILE", nullptr,
         "JSON file of option defaults, e.g. {\"num_processes\": 4}; flags and DP_* variables win over it"},
    };
    return table;
}

const std::vector<LaunchOptionDef>& job_option_table() {
    static const std::vector<LaunchOptionDef> table = {
        {"model", "--model", "DP_MODEL", "DIR|NAME", "shapes-sd3",
         "Diffusers model folder (model_index.json, transformer/, ...), or the name of a model shipped with "
         "dp-launch"},
        {"random_weights", "--random-weights,--random_weights", "DP_RANDOM_WEIGHTS", "SEED", nullptr,
         "Use --model's configs with seeded random weights instead of its weights (tests, benchmarks)"},
        {"output_dir", "-o,--output-dir,--output_dir", "DP_OUTPUT_DIR", "DIR", "outputs",
         "Where images and manifest.jsonl go"},
        {"steps", "--steps,--num-inference-steps", "DP_STEPS", "N", "28", "Denoising steps, 1 to 1000"},
        {"guidance_scale", "--guidance-scale,--guidance_scale", "DP_GUIDANCE_SCALE", "X", "7",
         "Classifier-free guidance scale, 0 to 100 (1 or less: no guidance)"},
        {"seed", "--seed", "DP_SEED", "N", "0",
         "Base seed: a prompt without its own seed gets seed + its index"},
        {"width", "--width", "DP_WIDTH", "PX", nullptr, "Image width, 8 to 8192 (default: the model's)"},
        {"height", "--height", "DP_HEIGHT", "PX", nullptr, "Image height, 8 to 8192 (default: the model's)"},
        {"strategy", "--strategy", "DP_STRATEGY", "data|context|tensor|device-map", "data",
         "Fill the degrees from the world: context means Ulysses where the head count allows it, else Ring; "
         "tensor means --tp over all ranks; device-map means --device-map auto in one process"},
        {"dp", "--dp", "DP_DP", "N", nullptr,
         "Data-parallel degree; must equal world / (cfg x ring x ulysses x tp)"},
        {"cfg_parallel", "--cfg-parallel,--cfg_parallel", "DP_CFG_PARALLEL", nullptr, nullptr,
         "CFG parallelism: pairs of ranks run the negative and positive branches and exchange noise "
         "predictions"},
        {"ulysses", "--ulysses", "DP_ULYSSES", "N", "1",
         "Ulysses context parallelism: N ranks split each image's tokens (N must divide the heads)"},
        {"ring", "--ring", "DP_RING", "N", "1",
         "Ring context parallelism: N ranks split each image's tokens and pass keys and values round a ring"},
        {"tp", "--tp", "DP_TP", "N", "1",
         "Tensor parallelism: N ranks split the transformer's attention and MLP weights (tp x ulysses must "
         "divide the heads)"},
        {"device_map", "--device-map,--device_map", "DP_DEVICE_MAP", "balanced|auto|FILE.json", nullptr,
         "One process over several devices: balanced places whole components, auto also splits the "
         "transformer's blocks, FILE.json places them by hand ({\"transformer\": \"cuda:1\", ...})"},
        {"max_memory", "--max-memory,--max_memory", "DP_MAX_MEMORY", "DEV=SIZE,...", nullptr,
         "device_map's devices and budgets, e.g. cuda:0=20GiB,cuda:1=20GiB (default: every visible GPU's "
         "free memory); cpu:0=1GB,cpu:1=1GB tries device_map on the CPU"},
        {"batch_size", "--batch-size,--batch_size", "DP_BATCH_SIZE", "N", "1",
         "Prompts with the same settings that go through the model together on a rank, 1 to 64"},
        {"dtype", "--dtype", "DP_DTYPE", "fp32|bf16|fp16", "fp32", "Precision the model runs in"},
        {"device", "--device", "DP_DEVICE", "auto|cpu|cuda", "auto",
         "auto: cuda:LOCAL_RANK when CUDA is available, else cpu"},
        {"negative_prompt", "--negative-prompt,--negative_prompt", "DP_NEGATIVE_PROMPT", "TEXT", nullptr,
         "Negative prompt for prompts without their own"},
        {"overwrite", "--overwrite", "DP_OVERWRITE", nullptr, nullptr,
         "Replace images and manifest.jsonl already in the output folder"},
        {"skip_invalid", "--skip-invalid,--skip_invalid", "DP_SKIP_INVALID", nullptr, nullptr,
         "Run the valid prompts and record invalid lines in the manifest, instead of refusing to start"},
        {"worker", "--worker", "DP_WORKER", "PATH", nullptr,
         "The dp-worker executable (default: the one next to dp-launch)"},
    };
    return table;
}

void add_launch_options(CLI::App& app, RawLaunchOptions& raw) {
    std::vector<LaunchOptionDef> all = launch_option_table();
    all.insert(all.end(), job_option_table().begin(), job_option_table().end());
    for (const LaunchOptionDef& def : all) {
        std::string help = def.help;
        if (def.default_value) help += std::string(" [default: ") + def.default_value + "]";
        help += std::string(" [env: ") + def.env + "]";
        CLI::Option* opt = nullptr;
        if (def.value_name) {
            opt = app.add_option(def.flags, raw.values[def.key], help)->type_name(def.value_name);
        } else {
            opt = app.add_flag(def.flags)->description(help);
        }
        const bool is_job =
            std::any_of(job_option_table().begin(), job_option_table().end(),
                        [&](const LaunchOptionDef& j) { return std::string(j.key) == def.key; });
        opt->group(std::string(def.key) == "config" ? "Configuration"
                   : is_job                         ? "Pipeline options (with PROMPTS)"
                                                    : "Launch options");
        raw.options[def.key] = opt;
    }
}

namespace {

// Config keys are accepted in any of the option's long spellings, with dashes or underscores.
std::string normalize_key(std::string key) {
    for (char& c : key)
        if (c == '-') c = '_';
    return key;
}

const LaunchOptionDef* find_config_key(const std::string& key) {
    const std::string wanted = normalize_key(key);
    std::vector<const LaunchOptionDef*> all;
    for (const LaunchOptionDef& def : launch_option_table()) all.push_back(&def);
    for (const LaunchOptionDef& def : job_option_table()) all.push_back(&def);
    for (const LaunchOptionDef* d : all) {
        const LaunchOptionDef& def = *d;
        if (wanted == def.key) return &def;
        std::stringstream names(def.flags);
        for (std::string name; std::getline(names, name, ',');)
            if (name.rfind("--", 0) == 0 && normalize_key(name.substr(2)) == wanted) return &def;
    }
    return nullptr;
}

std::string accepted_keys() {
    std::string out;
    for (const auto* table : {&launch_option_table(), &job_option_table()})
        for (const LaunchOptionDef& def : *table)
            if (std::string(def.key) != "config") out += (out.empty() ? "" : ", ") + std::string(def.key);
    return out;
}

struct Setting {
    std::string text;
    std::string source;  // "--nnodes", "DP_NNODES" or "cfg.json: nnodes"
};

constexpr std::size_t kMaxConfigBytes = 1 << 20;

std::map<std::string, Setting> load_config(const std::string& path, const std::string& source) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UsageError(source + " " + path + ": cannot read the file (" + std::strerror(errno) + ")");
    std::string text(kMaxConfigBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxConfigBytes)
        throw UsageError(source + " " + path + ": larger than 1 MiB; is it the right file?");

    nlohmann::json doc;
    try {
        doc = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
        std::string why = e.what();
        if (auto pos = why.find("] "); pos != std::string::npos) why = why.substr(pos + 2);
        throw UsageError(source + " " + path + ": not valid JSON: " + why);
    }
    if (!doc.is_object())
        throw UsageError(source + " " + path +
                         ": expected a JSON object of options, e.g. {\"num_processes\": 2}");

    std::map<std::string, Setting> settings;
    for (const auto& [key, value] : doc.items()) {
        const LaunchOptionDef* def = find_config_key(key);
        const std::string where = path + ": " + key;
        if (!def || std::string(def->key) == "config")
            throw UsageError(path + ": unknown key '" + key + "' (accepted: " + accepted_keys() + ")");
        std::string as_text;
        if (value.is_string()) {
            as_text = value.get<std::string>();
        } else if (value.is_boolean()) {
            as_text = value.get<bool>() ? "true" : "false";
        } else if (value.is_number()) {
            as_text = value.dump();
        } else if (value.is_array() && std::string(def->key) == "gpu_ids") {
            for (const auto& id : value) {
                if (!id.is_number_integer())
                    throw UsageError(where + ": expected a list of GPU indices, e.g. [0, 1]");
                as_text += (as_text.empty() ? "" : ",") + id.dump();
            }
        } else {
            throw UsageError(where + ": expected a string, number or boolean");
        }
        if (!def->value_name && !value.is_boolean()) launcher::parse_bool(as_text, where);
        settings[def->key] = {as_text, where};
    }
    return settings;
}

std::string long_name(const LaunchOptionDef& def) {
    std::string flags = def.flags;
    std::size_t start = flags.find("--");
    return flags.substr(start, flags.find(',', start) - start);
}

std::map<std::string, Setting> load_any_config(const RawLaunchOptions& raw, const EnvLookup& env) {
    if (raw.options.at("config")->count() > 0) return load_config(raw.values.at("config"), "--config");
    if (const char* path = env("DP_CONFIG"); path && *path) return load_config(path, "DP_CONFIG");
    return {};
}

// Each option's text and where it came from: flag, then environment, then config file.
std::map<std::string, Setting> collect(const std::vector<LaunchOptionDef>& table, const RawLaunchOptions& raw,
                                       const EnvLookup& env, const std::map<std::string, Setting>& config) {
    std::map<std::string, Setting> chosen;
    for (const LaunchOptionDef& def : table) {
        if (std::string(def.key) == "config") continue;
        if (raw.options.at(def.key)->count() > 0) {
            chosen[def.key] = {def.value_name ? raw.values.at(def.key) : "true", long_name(def)};
        } else if (const char* value = env(def.env)) {
            chosen[def.key] = {value, def.env};
        } else if (auto it = config.find(def.key); it != config.end()) {
            chosen[def.key] = it->second;
        }
    }
    return chosen;
}

uint64_t parse_u64(const Setting& s) {
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(s.text.data(), s.text.data() + s.text.size(), v);
    if (s.text.empty() || ec != std::errc() || ptr != s.text.data() + s.text.size())
        throw UsageError(s.source + " '" + s.text.substr(0, 40) +
                         "': expected a whole number from 0 to 18446744073709551615");
    return v;
}

}  // namespace

launcher::LaunchSpec resolve_launch_spec(const RawLaunchOptions& raw, const EnvLookup& env,
                                         bool require_command) {
    const std::map<std::string, Setting> chosen =
        collect(launch_option_table(), raw, env, load_any_config(raw, env));
    launcher::LaunchSpec spec;
    auto has = [&](const char* key) { return chosen.count(key) > 0; };
    auto text = [&](const char* key) { return chosen.at(key).text; };
    auto source = [&](const char* key) { return chosen.at(key).source; };

    if (has("gpu_ids")) spec.gpu_ids = launcher::parse_gpu_ids(text("gpu_ids"), source("gpu_ids"));
    spec.num_processes =
        launcher::parse_process_count(has("num_processes") ? text("num_processes") : "auto", spec.gpu_ids,
                                      has("num_processes") ? source("num_processes") : "--num-processes");
    if (has("nnodes"))
        spec.nnodes = launcher::parse_int(text("nnodes"), 1, launcher::kMaxNodes, source("nnodes"));
    if (has("node_rank"))
        spec.node_rank =
            launcher::parse_int(text("node_rank"), 0, launcher::kMaxNodes - 1, source("node_rank"));
    if (has("master_addr"))
        spec.master_addr = launcher::parse_host(text("master_addr"), source("master_addr"));
    if (has("master_port"))
        spec.master_port = launcher::parse_port(text("master_port"), source("master_port"));
    if (has("max_restarts"))
        spec.max_restarts = launcher::parse_int(text("max_restarts"), 0, 1000, source("max_restarts"));
    if (has("shutdown_grace"))
        spec.shutdown_grace_s =
            launcher::parse_seconds(text("shutdown_grace"), 3600, source("shutdown_grace"));
    if (has("log_dir")) {
        spec.log_dir = text("log_dir");
        if (spec.log_dir.empty() || spec.log_dir.find('\0') != std::string::npos)
            throw UsageError(source("log_dir") + ": expected a directory path");
    }
    if (has("run_id")) {
        spec.run_id = text("run_id");
        if (spec.run_id.empty() || spec.run_id.size() > 128 ||
            spec.run_id.find_first_not_of(
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") != std::string::npos)
            throw UsageError(source("run_id") + " '" + spec.run_id.substr(0, 80) +
                             "': expected 1 to 128 letters, digits, '_', '.' or '-'");
    }
    if (has("no_prefix")) spec.prefix_output = !launcher::parse_bool(text("no_prefix"), source("no_prefix"));
    if (has("quiet")) spec.quiet = launcher::parse_bool(text("quiet"), source("quiet"));
    if (has("dry_run")) spec.dry_run = launcher::parse_bool(text("dry_run"), source("dry_run"));
    spec.command = raw.command;
    launcher::validate_launch_spec(spec, require_command);
    return spec;
}

std::string first_job_option_set(const RawLaunchOptions& raw, const EnvLookup& env) {
    const std::map<std::string, Setting> chosen =
        collect(job_option_table(), raw, env, load_any_config(raw, env));
    return chosen.empty() ? "" : chosen.begin()->second.source;
}

launcher::JobOptions resolve_job_options(const RawLaunchOptions& raw, const EnvLookup& env,
                                         const std::string& prompts) {
    const std::map<std::string, Setting> chosen =
        collect(job_option_table(), raw, env, load_any_config(raw, env));
    launcher::JobOptions job;
    job.prompts = prompts;
    auto has = [&](const char* key) { return chosen.count(key) > 0; };
    auto at = [&](const char* key) -> const Setting& { return chosen.at(key); };
    auto text = [&](const char* key) { return chosen.at(key).text; };
    auto one_of = [&](const char* key, std::initializer_list<const char*> allowed) {
        for (const char* a : allowed)
            if (text(key) == a) return text(key);
        std::string list;
        for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        throw UsageError(at(key).source + " '" + text(key).substr(0, 40) + "': expected one of " + list);
    };
    job.model = launcher::resolve_model(has("model") ? text("model") : launcher::kDefaultModel,
                                        has("model") ? at("model").source : "--model");
    if (has("random_weights")) job.random_weights = parse_u64(at("random_weights"));
    if (has("output_dir")) {
        job.output_dir = text("output_dir");
        if (job.output_dir.empty()) throw UsageError(at("output_dir").source + ": expected a folder path");
    }
    while (job.output_dir.size() > 1 && job.output_dir.back() == '/') job.output_dir.pop_back();
    if (has("steps")) job.steps = launcher::parse_int(text("steps"), 1, 1000, at("steps").source);
    if (has("guidance_scale"))
        job.guidance_scale =
            launcher::parse_seconds(text("guidance_scale"), 100, at("guidance_scale").source);
    if (has("seed")) job.seed = parse_u64(at("seed"));
    if (has("width")) job.width = launcher::parse_int(text("width"), 8, 8192, at("width").source);
    if (has("height")) job.height = launcher::parse_int(text("height"), 8, 8192, at("height").source);
    if (has("cfg_parallel"))
        job.cfg_parallel = launcher::parse_bool(text("cfg_parallel"), at("cfg_parallel").source);
    if (has("ulysses")) job.ulysses = launcher::parse_int(text("ulysses"), 1, 64, at("ulysses").source);
    if (has("strategy")) {
        job.strategy = one_of("strategy", {"data", "context", "tensor", "device-map"});
        if (job.strategy == "data") job.strategy.clear();
    }
    if (has("dp"))
        job.dp = launcher::parse_int(text("dp"), 1, launcher::kMaxNodes * launcher::kMaxLocalProcesses,
                                     at("dp").source);
    if (has("ring")) job.ring = launcher::parse_int(text("ring"), 1, 64, at("ring").source);
    if (has("tp")) job.tp = launcher::parse_int(text("tp"), 1, 64, at("tp").source);
    if (has("device_map")) {
        job.device_map = text("device_map");
        if (job.device_map.empty())
            throw UsageError(at("device_map").source + ": expected balanced, auto or a FILE.json");
    }
    if (has("max_memory")) job.max_memory = text("max_memory");
    if (has("batch_size"))
        job.batch_size = launcher::parse_int(text("batch_size"), 1, 64, at("batch_size").source);
    if (has("dtype")) job.dtype = one_of("dtype", {"fp32", "bf16", "fp16"});
    if (has("device")) job.device = one_of("device", {"auto", "cpu", "cuda"});
    if (has("negative_prompt")) job.negative_prompt = text("negative_prompt");
    if (has("overwrite")) job.overwrite = launcher::parse_bool(text("overwrite"), at("overwrite").source);
    if (has("skip_invalid"))
        job.skip_invalid = launcher::parse_bool(text("skip_invalid"), at("skip_invalid").source);
    if (has("worker")) job.worker = text("worker");
    return job;
}

}  // namespace dp::cli
