#include "cli/launch_options.h"

#include "cli/accelerate_config.h"
#include "cli/accelerate_options.h"
#include "cli/option_groups.h"
#include "cli/option_rows.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

#include "launcher/cluster_env.h"
#include "launcher/errors.h"
#include "launcher/model_location.h"
#include "launcher/prompt_file.h"
#include "launcher/spelling.h"
#include "launcher/system_info.h"
#include "launcher/values.h"
#include "protocol/job_file.h"
#include "strategies/model_config.h"
#include "strategies/single_file.h"

namespace dp::cli {

using namespace rows;
using launcher::JobOptions;
using launcher::LaunchSpec;
using launcher::UsageError;

std::string OptionDef::range_text() const {
    switch (kind) {
        case OptionKind::kInt:
        case OptionKind::kNumber:
            return (lo_excluded ? "above " : "") + launcher::number_text(lo) + " to " +
                   launcher::number_text(hi) + (unit.empty() ? "" : " " + unit);
        case OptionKind::kU64:
            return "0 to " + std::to_string(UINT64_MAX);
        default:
            return "";
    }
}

std::string OptionDef::help_text() const {
    std::string out = help;
    if (const std::string range = range_text(); !range.empty()) out += " [" + range + "]";
    if (!default_text.empty()) out += " [default: " + default_text + "]";
    return out + " [env: " + env + "]";
}

namespace {

// torchrun's --nproc-per-node: gpu is the visible GPUs (refused without one), cpu the usable CPUs.
int read_process_count(const std::string& t, const std::vector<int>& gpu_ids, const std::string& src) {
    if (t == "gpu") {
        const int gpus = gpu_ids.empty() ? launcher::visible_gpu_count() : static_cast<int>(gpu_ids.size());
        if (gpus < 1)
            throw UsageError(src +
                             " 'gpu': no GPU is visible (CUDA_VISIBLE_DEVICES, the driver); give a number "
                             "of processes, or 'cpu'");
        return std::min(gpus, launcher::kMaxLocalProcesses);
    }
    if (t == "cpu") return std::clamp(launcher::usable_cpu_count(), 1, launcher::kMaxLocalProcesses);
    if (t == "auto") return launcher::parse_process_count(t, gpu_ids, src);
    return launcher::parse_int(t, 1, launcher::kMaxLocalProcesses, src, "'auto', 'gpu', 'cpu' or ");
}

// --nnodes N, or torchrun's MIN:MAX when MIN equals MAX.
int read_node_count(const std::string& t, const std::string& src) {
    const std::size_t colon = t.find(':');
    if (colon == std::string::npos) return launcher::parse_int(t, 1, launcher::kMaxNodes, src);
    const int lo =
        launcher::parse_int(t.substr(0, colon), 1, launcher::kMaxNodes, src + " (MIN of " + t + ")");
    const int hi =
        launcher::parse_int(t.substr(colon + 1), 1, launcher::kMaxNodes, src + " (MAX of " + t + ")");
    if (lo != hi)
        throw UsageError(src + " '" + t.substr(0, 40) +
                         "': a range of nodes needs elastic membership (nodes joining and leaving), which "
                         "dp-launch does not have: every node starts together; give one number, e.g. " +
                         src + " " + std::to_string(hi));
    return lo;
}

// torchrun's --tee/--redirects: 0 to 3 for every rank, or LOCAL_RANK:0-3 pairs such as 0:1,1:2.
std::string read_stream_choice(const std::string& t, const std::string& src) {
    const std::string accepted =
        "expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or per local rank "
        "as 0:3,1:2";
    auto digit = [](const std::string& d) { return d.size() == 1 && d[0] >= '0' && d[0] <= '3'; };
    if (digit(t)) return t;
    std::stringstream items(t);
    std::size_t count = 0;
    for (std::string item; std::getline(items, item, ',');) {
        const std::size_t colon = item.find(':');
        bool ok = colon != std::string::npos && digit(item.substr(colon + 1)) && colon > 0 &&
                  item.find_first_not_of("0123456789") == colon;
        if (!ok) throw UsageError(src + " '" + t.substr(0, 80) + "': " + accepted);
        ++count;
    }
    if (count == 0 || t.back() == ',') throw UsageError(src + " '" + t.substr(0, 80) + "': " + accepted);
    return t;
}

// --local-ranks-filter 0,2: distinct local ranks.
std::vector<int> read_rank_list(const std::string& t, const std::string& src) {
    std::vector<int> ranks;
    std::stringstream items(t);
    for (std::string item; std::getline(items, item, ',');) {
        const int r = launcher::parse_int(item, 0, launcher::kMaxLocalProcesses - 1,
                                          src + " (in " + t.substr(0, 80) + ")");
        if (std::find(ranks.begin(), ranks.end(), r) != ranks.end())
            throw UsageError(src + " '" + t.substr(0, 80) + "': local rank " + std::to_string(r) +
                             " is listed twice; expected distinct local ranks such as 0,2");
        ranks.push_back(r);
    }
    if (ranks.empty() || t.back() == ',')
        throw UsageError(src + " '" + t.substr(0, 80) + "': expected distinct local ranks such as 0,2");
    return ranks;
}

// --rdzv-endpoint HOST[:PORT], [IPV6]:PORT or a bare IPv6 address: rank 0's store.
void read_endpoint(LaunchSpec& s, const std::string& t, const std::string& src) {
    std::string host = t, port;
    if (!t.empty() && t.front() == '[') {
        const std::size_t close = t.find(']');
        if (close != std::string::npos) {
            host = t.substr(0, close + 1);
            if (close + 1 < t.size()) {
                if (t[close + 1] != ':')
                    throw UsageError(src + " '" + t.substr(0, 80) +
                                     "': expected HOST[:PORT], e.g. node0:29500");
                port = t.substr(close + 2);
            }
        }
    } else if (std::count(t.begin(), t.end(), ':') == 1) {
        host = t.substr(0, t.find(':'));
        port = t.substr(t.find(':') + 1);
    }
    s.master_addr = launcher::parse_host(host, src);
    if (!port.empty() || t.back() == ':')
        s.master_port = launcher::parse_int(port, 0, 65535, src + " (port)");
    s.rdzv_endpoint = t;
}

}  // namespace

const std::vector<LaunchOptionRow>& launch_option_table() {
    using S = LaunchSpec;
    static const std::vector<LaunchOptionRow> table = finish<S>(
        {
            row<S>(
                "--gpu-ids,--gpu_ids", "IDS", OptionKind::kText,
                "GPUs to use, e.g. 0,2; sets CUDA_VISIBLE_DEVICES for every rank; all (accelerate's): every "
                "visible GPU, CUDA_VISIBLE_DEVICES left as it is",
                [](S& s, const std::string& t, const std::string& src) {
                    s.gpu_ids = t == "all" ? std::vector<int>{} : launcher::parse_gpu_ids(t, src);
                },
                [](const S& s) { return launcher::gpu_ids_text(s.gpu_ids); }),
            applied(
                read_by(whole<S>("-n,--num-processes,--num_processes,--nproc-per-node,--nproc_per_node",
                                 "N|auto|gpu|cpu", &S::num_processes, 1, launcher::kMaxLocalProcesses,
                                 "Processes (ranks) to start on this node; 'auto' starts one per "
                                 "visible GPU, or 1 without GPUs (torchrun's auto would start one per CPU: "
                                 "say cpu for that); 'gpu' one per visible GPU, refused without one; 'cpu' "
                                 "one per usable CPU. accelerate's --num_processes with --num_machines is "
                                 "the total over the machines, as in accelerate"),
                        [](S& s, const std::string& t, const std::string& src) {
                            s.num_processes = read_process_count(t, s.gpu_ids, src);
                        }),
                "auto"),
            read_by(
                whole<S>("--nnodes,--num-machines,--num_machines", "N", &S::nnodes, 1, launcher::kMaxNodes,
                         "Number of nodes in the job; torchrun's MIN:MAX only as N:N (no elastic "
                         "membership)"),
                [](S& s, const std::string& t, const std::string& src) {
                    s.nnodes = read_node_count(t, src);
                }),
            whole<S>("--node-rank,--node_rank,--machine-rank,--machine_rank", "R", &S::node_rank, 0,
                     launcher::kMaxNodes - 1, "This node's rank, below --nnodes"),
            described(row<S>(
                          "--master-addr,--master_addr,--main-process-ip,--main_process_ip", "HOST",
                          OptionKind::kText,
                          "Host of node rank 0, where rank 0 runs the store (required with several nodes)",
                          [](S& s, const std::string& t, const std::string& src) {
                              s.master_addr = launcher::parse_host(t, src);
                          },
                          [](const S& s) { return s.master_addr; }),
                      "127.0.0.1 on a single node"),
            described(
                whole<S>("--master-port,--master_port,--main-process-port,--main_process_port", "PORT",
                         &S::master_port, 1, 65535, "Port of rank 0's store (required with several nodes)"),
                "a free port, reserved for the job on a single node"),
            described(row<S>(
                          "--local-addr,--local_addr", "HOST", OptionKind::kText,
                          "This node's own address, as torchrun's: the ranks' Gloo connections use it "
                          "(on a cluster: this node's host in the allocation's node list)",
                          [](S& s, const std::string& t, const std::string& src) {
                              s.local_addr = launcher::parse_host(t, src);
                          },
                          [](const S& s) { return s.local_addr; }),
                      "the address the host name resolves to (127.0.0.1 on a single node)"),
            number<S>("--node-timeout,--node_timeout", "SECONDS", &S::node_timeout_s, 1, 86400, "seconds",
                      "Main job on several nodes: a node whose dp-launch writes nothing to the shared output "
                      "folder for this long is lost (its prompts are reported not run)"),
            choice<S>(
                "--cluster", &S::cluster, {"auto", "none", "slurm", "mpi", "env"},
                "The allocation to run in: auto finds Slurm (SLURM_*), MPI (OMPI_COMM_WORLD_*, PMI_*), a "
                "PyTorchJob (PET_*) or an operator's RANK/WORLD_SIZE and says what it found; none ignores "
                "them; the others name one. Flags given win over it"),
            on_off<S>(
                "--standalone", &S::standalone,
                "torchrun's single-node mode: one node, rank 0's store on 127.0.0.1 at a free port (what "
                "dp-launch does on one node anyway); refused with --nnodes above 1"),
            choice<S>(
                "--rdzv-backend,--rdzv_backend", &S::rdzv_backend, {"c10d", "static"},
                "torchrun's rendezvous backend: both mean rank 0's TCPStore at --master-addr:--master-port "
                "(etcd is not supported)"),
            read_by(
                text<S>("--rdzv-endpoint,--rdzv_endpoint", "HOST[:PORT]", &S::rdzv_endpoint,
                        "Rank 0's store, as torchrun's: sets --master-addr and, with :PORT, --master-port "
                        "(it wins over them, as in torchrun)"),
                read_endpoint),
            on_off<S>("-m,--module", &S::module,
                      "The command's first word is a Python module: each rank runs python3 -m MODULE ARGS"),
            on_off<S>("--no-python,--no_python", &S::no_python,
                      "Run the command as it is, even a .py script (without it, a first word ending in .py "
                      "runs as python3 SCRIPT.py, as torchrun does)"),
            on_off<S>("--run-path,--run_path", &S::run_path,
                      "torchrun's run-the-script-by-path: a .py command runs under python3 already, so this "
                      "changes nothing"),
            read_by(
                text<S>(
                    "-t,--tee", "0-3|R:0-3,...", &S::tee,
                    "torchrun's tee: dp-launch always shows every rank's stdout and stderr on the terminal "
                    "and --log-dir keeps them in files, so any value is accepted and changes nothing"),
                [](S& s, const std::string& t, const std::string& src) {
                    s.tee = read_stream_choice(t, src);
                }),
            read_by(text<S>("-r,--redirects", "0-3|R:0-3,...", &S::redirects,
                            "torchrun's redirects: dp-launch never hides a rank's output from the terminal; "
                            "--log-dir also keeps it in files, so any value is accepted and changes nothing"),
                    [](S& s, const std::string& t, const std::string& src) {
                        s.redirects = read_stream_choice(t, src);
                    }),
            row<S>(
                "--local-ranks-filter,--local_ranks_filter", "R,...", OptionKind::kText,
                "Show only these local ranks' output on the terminal, e.g. 0 (--log-dir still keeps every "
                "rank's)",
                [](S& s, const std::string& t, const std::string& src) {
                    s.shown_local_ranks = read_rank_list(t, src);
                },
                [](const S& s) { return launcher::gpu_ids_text(s.shown_local_ranks); }),
            number<S>(
                "--monitor-interval,--monitor_interval", "SECONDS", &S::monitor_interval_s, 0, 3600,
                "seconds",
                "torchrun's polling interval: accepted, and changes nothing, since dp-launch's supervision "
                "is event-driven (a rank's exit is seen when it happens)"),
            on_off<S>(
                "--multi-gpu,--multi_gpu", &S::multi_gpu,
                "accelerate's multi-GPU mode: one rank per visible GPU unless -n is given, as dp-launch "
                "does anyway"),
            whole<S>("--max-restarts,--max_restarts", "N", &S::max_restarts, 0, 1000,
                     "Restart the whole group up to N times after a failure"),
            number<S>("--shutdown-grace,--shutdown_grace,--shutdown-timeout,--shutdown_timeout", "SECONDS",
                      &S::shutdown_grace_s, 0, 3600, "seconds",
                      "After a failure or a stop signal, time between SIGTERM and SIGKILL"),
            number<S>("--rank-timeout,--rank_timeout", "SECONDS", &S::rank_timeout_s, 0, 86400, "seconds",
                      "Main job: stop the job (exit 75) when a rank sends no heartbeat for this long while "
                      "it generates; 0: never"),
            number<S>("--load-timeout,--load_timeout", "SECONDS", &S::load_timeout_s, 0, 86400, "seconds",
                      "Main job: the same allowance while a rank starts and loads the model; 0: never"),
            number<S>("--timeout", "SECONDS", &S::timeout_s, 0, 604800, "seconds",
                      "Stop the whole job (exit 75) when it runs longer than this; 0: no limit"),
            text<S>("--log-dir,--log_dir", "DIR", &S::log_dir,
                    "Also append each rank's stdout and stderr to DIR/rank_N.stdout and DIR/rank_N.stderr, "
                    "and dp-launch's own lines to DIR/launcher.log",
                    "a directory path"),
            read_by(text<S>("--run-id,--run_id,--rdzv-id,--rdzv_id", "ID", &S::run_id,
                            "Job id, exported as TORCHELASTIC_RUN_ID"),
                    [](S& s, const std::string& t, const std::string& src) {
                        if (t.empty() || t.size() > 128 ||
                            t.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                "0123456789_.-") != std::string::npos)
                            throw UsageError(src + " '" + t.substr(0, 80) +
                                             "': expected 1 to 128 letters, digits, '_', '.' or '-'");
                        s.run_id = t;
                    }),
            on_off<S>("--no-prefix,--no_prefix", &S::prefix_output,
                      "Do not prefix output lines with [rank N]",
                      /*inverted=*/true),
            on_off<S>("-q,--quiet", &S::quiet,
                      "Print no line of dp-launch's own except failure reports and the job's one summary "
                      "line (no progress, no mesh or allocation lines)"),
            choice<S>("--progress", &S::progress, {"auto", "bar", "lines", "json", "none"},
                      "Main job: auto is a bar on a terminal, else a line every 5 s; json writes one JSON "
                      "object per event (job_start, rank_loading, rank_ready, step, image, failure, "
                      "rank_error, progress, summary) to stdout for CI, even with -q"),
            on_off<S>("--dry-run,--dry_run", &S::dry_run,
                      "Print each rank's command and environment, start nothing"),
        },
        "Launch options");
    return table;
}

const OptionDef& config_option() {
    static const OptionDef def = [] {
        OptionDef d;
        name_option(
            d, "--config,--config-file,--config_file", "FILE", OptionKind::kText,
            "Option defaults: accelerate's YAML config (what `accelerate config` writes; keys with no "
            "meaning here are listed as ignored) or a JSON object of dp-launch options, e.g. "
            "{\"num_processes\": 4}; flags and DP_* variables win over it");
        d.group = option_group(d.key, "Configuration");
        return d;
    }();
    return def;
}

const std::vector<const OptionDef*>& all_option_defs() {
    static const std::vector<const OptionDef*> all = [] {
        std::vector<const OptionDef*> out;
        for (const LaunchOptionRow& r : launch_option_table()) out.push_back(&r);
        for (const LaunchOptionRow& r : accelerate_option_table()) out.push_back(&r);
        out.push_back(&config_option());
        for (const JobOptionRow& r : job_option_table()) out.push_back(&r);
        return out;
    }();
    return all;
}

void add_launch_options(CLI::App& app, RawLaunchOptions& raw) {
    for (const OptionDef* def : all_option_defs()) {
        std::string& value = raw.values[def->key];
        CLI::Option* opt = nullptr;
        if (def->kind == OptionKind::kSwitch) {
            // The bare flag gives "true"; --flag=VALUE gives VALUE, read like the environment's.
            opt = app.add_flag(def->flags, value, def->help_text())
                      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
        } else if (def->repeatable) {
            opt = app.add_option(def->flags, value, def->help_text())
                      ->type_name(def->value_name)
                      ->multi_option_policy(CLI::MultiOptionPolicy::Join);  // joined with '\n'
        } else {
            opt = app.add_option(def->flags, value, def->help_text())->type_name(def->value_name);
        }
        opt->group(def->group);
        raw.options[def->key] = opt;
    }
}

namespace {

const OptionDef* find_config_key(const std::string& key) {
    const std::string wanted = normalize_key(key);
    for (const OptionDef* def : all_option_defs()) {
        if (def == &config_option()) continue;
        if (wanted == def->key) return def;
        std::stringstream names(def->flags);
        for (std::string name; std::getline(names, name, ',');)
            if (name.rfind("--", 0) == 0 && normalize_key(name.substr(2)) == wanted) return def;
    }
    return nullptr;
}

// Every key of a config file, for a mistyped key's suggestion.
std::vector<std::string> config_keys() {
    std::vector<std::string> out;
    for (const OptionDef* def : all_option_defs())
        if (def != &config_option()) out.push_back(def->key);
    return out;
}

std::string accepted_keys() {
    std::string out;
    for (const std::string& key : config_keys()) out += (out.empty() ? "" : ", ") + key;
    return out;
}

struct Setting {
    std::string text;
    std::string source;  // "--nnodes", "DP_NNODES" or "cfg.json: nnodes"
};

// The config file's settings by key, and the line dp-launch prints about the file (empty: none).
struct ConfigSettings : std::map<std::string, Setting> {
    std::string note;
    // `s` for option `key`; one option set twice to two values (two spellings of it) is refused.
    void add(const std::string& key, Setting s) {
        const auto [it, added] = emplace(key, s);
        if (!added && it->second.text != s.text)
            throw UsageError(s.source + " '" + s.text.substr(0, 80) + "' and " + it->second.source + " '" +
                             it->second.text.substr(0, 80) + "' set the same option; give it once");
    }
};

constexpr std::size_t kMaxConfigBytes = 1 << 20;

ConfigSettings load_config(const std::string& path, const std::string& source, const EnvLookup& env) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UsageError(launcher::config_file_problem(source, path, errno, env));
    std::string text(kMaxConfigBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxConfigBytes)
        throw UsageError(source + " " + path + ": larger than 1 MiB; is it the right file?");

    if (is_yaml_config(path, text)) {
        const AccelerateConfig yaml = parse_accelerate_config(text, path, [](const std::string& key) {
            const OptionDef* def = find_config_key(key);
            return def ? def->key : std::string();
        });
        ConfigSettings settings;
        for (const ConfigEntry& e : yaml.entries) settings.add(e.key, {e.text, e.source});
        if (!yaml.ignored.empty()) {
            std::string keys;
            for (const std::string& k : yaml.ignored) keys += (keys.empty() ? "" : ", ") + k;
            settings.note =
                "dp-launch: " + path + ": ignored accelerate keys: " + keys + " (no meaning for dp-launch)";
        }
        return settings;
    }

    nlohmann::json doc;
    if (const std::string why = launcher::parse_strict_json(text, doc); !why.empty())
        throw UsageError(source + " " + path + ": " + why);
    if (!doc.is_object())
        throw UsageError(source + " " + path +
                         ": expected a JSON object of options, e.g. {\"num_processes\": 2}");

    ConfigSettings settings;
    for (const auto& [key, value] : doc.items()) {
        const OptionDef* def = find_config_key(key);
        const std::string where = path + ": " + key;
        if (!def)
            throw UsageError(path + ": unknown key '" + key + "'" +
                             launcher::did_you_mean(key, config_keys()) + " (accepted: " + accepted_keys() +
                             ")");
        std::string as_text;
        if (value.is_string()) {
            as_text = value.get<std::string>();
        } else if (value.is_boolean()) {
            as_text = value.get<bool>() ? "true" : "false";
        } else if (value.is_number()) {
            as_text = value.dump();
        } else if (value.is_array() && def->repeatable) {
            for (const auto& item : value) {
                if (!item.is_string()) throw UsageError(where + ": expected a list of strings");
                as_text += (as_text.empty() ? "" : "\n") + item.get<std::string>();
            }
        } else if (value.is_array() && def->key == "gpu_ids") {
            for (const auto& id : value) {
                if (!id.is_number_integer())
                    throw UsageError(where + ": expected a list of GPU indices, e.g. [0, 1]");
                as_text += (as_text.empty() ? "" : ",") + id.dump();
            }
        } else {
            throw UsageError(where + ": expected a string, number or boolean");
        }
        if (def->kind == OptionKind::kSwitch && !value.is_boolean()) launcher::parse_bool(as_text, where);
        settings.add(def->key, {as_text, where});
    }
    return settings;
}

// --config names a file of option defaults, or, a folder, the configs of --model FILE's model
// (Note [a model from one file], strategies/single_file.h): the folder's path and where it came from.
std::optional<Setting> config_folder(const RawLaunchOptions& raw, const EnvLookup& env) {
    const OptionDef& config = config_option();
    std::optional<Setting> s;
    if (raw.options.at(config.key)->count() > 0)
        s = Setting{raw.values.at(config.key), config.long_flag};
    else if (const char* path = env(config.env.c_str()); path && *path)
        s = Setting{path, config.env};
    struct stat st {};
    if (s && ::stat(s->text.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return s;
    return std::nullopt;
}

ConfigSettings load_any_config(const RawLaunchOptions& raw, const EnvLookup& env) {
    const OptionDef& config = config_option();
    if (config_folder(raw, env)) return {};
    if (raw.options.at(config.key)->count() > 0)
        return load_config(raw.values.at(config.key), config.long_flag, env);
    if (const char* path = env(config.env.c_str()); path && *path) return load_config(path, config.env, env);
    return {};
}

// The option's text and where it came from: flag, then environment, then config file.
std::optional<Setting> setting_of(const OptionDef& def, const RawLaunchOptions& raw, const EnvLookup& env,
                                  const ConfigSettings& config) {
    if (raw.options.at(def.key)->count() > 0) return Setting{raw.values.at(def.key), def.long_flag};
    if (const char* value = env(def.env.c_str())) return Setting{value, def.env};
    if (auto it = config.find(def.key); it != config.end()) return it->second;
    return std::nullopt;
}

// Every row of `table`, in order, from its setting or its applied default.
template <class T>
void apply_table(const std::vector<OptionRow<T>>& table, const RawLaunchOptions& raw, const EnvLookup& env,
                 const ConfigSettings& config, T& target) {
    for (const OptionRow<T>& row : table) {
        if (const std::optional<Setting> s = setting_of(row, raw, env, config)) {
            row.set(target, s->text, s->source);
        } else if (row.default_kind == DefaultKind::kApplied) {
            row.set(target, row.default_text, row.long_flag);
        }
    }
}

// The scheduler's allocation, if any, into `spec` (Note [cluster shapes], launcher/cluster_env.h):
// what the flags, DP_* variables or config leave unset comes from it, and spec.cluster_report says
// what was found and which flags won. --standalone is a one-node job whatever the environment.
void apply_cluster(LaunchSpec& spec, const RawLaunchOptions& raw, const EnvLookup& env,
                   const ConfigSettings& config) {
    if (spec.standalone) return;
    const launcher::ClusterChoice choice = launcher::parse_cluster_choice(spec.cluster, "--cluster");
    launcher::Environment vars;
    for (const std::string& name : launcher::cluster_variable_names())
        if (const char* value = env(name.c_str())) vars[name] = value;
    const std::optional<launcher::ClusterAllocation> a = launcher::detect_cluster(vars, choice);
    if (!a) return;
    // The fields the user set, by the flags that set them.
    std::set<std::string> given;
    const std::pair<const char*, std::vector<const char*>> kFields[] = {
        {"--nnodes", {"nnodes"}},
        {"--node-rank", {"node_rank"}},
        {"--master-addr", {"master_addr"}},
        {"--master-port", {"master_port"}},
        {"--local-addr", {"local_addr"}},
        {"--rdzv-endpoint", {"master_addr", "master_port"}},
        {"--num-processes", {"num_processes"}}};
    for (const auto& row : launch_option_table())
        for (const auto& [flag, fields] : kFields)
            if (row.long_flag == flag && setting_of(row, raw, env, config))
                given.insert(fields.begin(), fields.end());
    std::vector<std::string> notes = launcher::apply_allocation(spec, *a, given);
    if (a->per_rank) {
        spec.spawned_local_ranks = {a->local_rank};
        // This task's GPU, so that its rank sees it as its only device; unless --gpu-ids says
        // otherwise or CUDA_VISIBLE_DEVICES already names only it.
        const int gpu = launcher::rank_gpu(*a);
        const auto visible = vars.find("CUDA_VISIBLE_DEVICES");
        const bool only_it = visible != vars.end() && a->gpus.size() == 1;
        bool gpu_ids_given = false;
        for (const auto& row : launch_option_table())
            if (row.key == "gpu_ids" && setting_of(row, raw, env, config)) gpu_ids_given = true;
        if (gpu >= 0 && !only_it && !gpu_ids_given) {
            spec.gpu_ids = {gpu};
            notes.push_back("this task's GPU " + std::to_string(gpu) +
                            " (CUDA_VISIBLE_DEVICES=" + std::to_string(gpu) + ")");
        }
    }
    spec.cluster_report = launcher::describe_allocation(*a, notes);
}

}  // namespace

launcher::LaunchSpec resolve_launch_spec(const RawLaunchOptions& raw, const EnvLookup& env,
                                         bool require_command) {
    LaunchSpec spec;
    if (const char* devices = env("CUDA_VISIBLE_DEVICES"))
        if (const std::string why = launcher::cuda_visible_devices_problem(devices); !why.empty())
            throw UsageError(
                "CUDA_VISIBLE_DEVICES=" + launcher::utf8_for_display(std::string(devices).substr(0, 80)) +
                ": " + why + " (e.g. 0,1 or GPU-8f1e...; empty for no GPU)");
    const ConfigSettings config = load_any_config(raw, env);
    apply_table(launch_option_table(), raw, env, config, spec);
    apply_table(accelerate_option_table(), raw, env, config, spec);
    if (raw.accelerate_total && spec.nnodes > 1) {
        // accelerate's --num_processes counts every machine's processes.
        if (spec.num_processes % spec.nnodes != 0)
            throw UsageError("--num_processes " + std::to_string(spec.num_processes) +
                             " with --num_machines " + std::to_string(spec.nnodes) +
                             ": accelerate's --num_processes is the total over the machines, so it must be a "
                             "multiple of --num_machines (or give -n, the processes per node)");
        spec.num_processes /= spec.nnodes;
    }
    apply_cluster(spec, raw, env, config);
    // Printed with the allocation line, before anything starts.
    if (!config.note.empty())
        spec.cluster_report = config.note + (spec.cluster_report.empty() ? "" : "\n" + spec.cluster_report);
    spec.command = raw.command;
    spec.command = launcher::rank_command(spec);
    launcher::validate_launch_spec(spec, require_command);
    return spec;
}

std::string first_job_option_flag(const RawLaunchOptions& raw) {
    for (const JobOptionRow& row : job_option_table())
        if (raw.options.at(row.key)->count() > 0) return row.long_flag;
    return "";
}

launcher::JobOptions resolve_job_options(const RawLaunchOptions& raw, const EnvLookup& env,
                                         const std::string& prompts) {
    JobOptions job;
    job.prompts = prompts;
    const ConfigSettings config = load_any_config(raw, env);
    apply_table(job_option_table(), raw, env, config, job);
    // The model is found once --revision is known: a Hugging Face repo's snapshot depends on it.
    std::string source = "--model";
    for (const JobOptionRow& row : job_option_table())
        if (row.key == "model")
            if (const std::optional<Setting> s = setting_of(row, raw, env, config)) source = s->source;
    // Note [a model from one file]: --model FILE is the model's transformer; its configs (and the
    // other components) come from --config FOLDER, or the shipped config-only folder of its model.
    const std::optional<Setting> folder = config_folder(raw, env);
    struct stat st {};
    const bool from_file = !job.model.empty() && ::stat(job.model.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    if (from_file) {
        if (job.component_files.count("transformer"))
            throw UsageError(source + " " + launcher::utf8_for_display(job.model) +
                             " is a transformer file, and so is --transformer; give the model's folder as " +
                             source);
        char resolved[PATH_MAX];
        job.component_files["transformer"] = ::realpath(job.model.c_str(), resolved) ? resolved : job.model;
        job.model_file = job.component_files["transformer"];
        try {
            if (folder) {
                source = folder->source;
                job.model = folder->text;
            } else {
                source = source + " " + launcher::utf8_for_display(job.model) + "'s shipped configs";
                job.model = strategies::shipped_config_for(job.model);
            }
        } catch (const protocol::Error& e) {
            throw protocol::Error(std::string("--model ") + launcher::utf8_for_display(e.what()),
                                  e.exit_code());
        }
    } else if (folder) {
        throw UsageError(folder->source + " " + launcher::utf8_for_display(folder->text) +
                         ": a model's config folder goes with --model FILE (a transformer in one file); "
                         "give option defaults as a YAML or JSON file");
    }
    job.model = launcher::resolve_model(job.model, source, job.revision, env);
    // Note [bundled files]: a file of the whole pipeline gives every component it holds that no
    // flag of its own gives.
    if (from_file) {
        const std::string file = job.component_files.at("transformer");
        try {
            const strategies::ModelInfo info = strategies::read_model_info(job.model);
            for (const std::string& component : strategies::bundled_components(file, *info.spec))
                job.component_files.emplace(component, file);
        } catch (const protocol::Error& e) {
            throw protocol::Error(std::string("--model ") + launcher::utf8_for_display(e.what()),
                                  e.exit_code());
        }
    }
    return job;
}

}  // namespace dp::cli
