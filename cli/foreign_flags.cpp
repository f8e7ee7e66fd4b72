#include "cli/foreign_flags.h"

#include <filesystem>

#include "launcher/prompt_file.h"
#include "launcher/spelling.h"

namespace dp::cli {
namespace {

// `name` in the '-' spelling: accelerate's --use_fsdp is --use-fsdp.
std::string dashed(std::string name) {
    for (std::size_t i = 2; i < name.size(); ++i)
        if (name[i] == '_') name[i] = '-';
    return name;
}

constexpr const char* kOwnSetUp =
    "dp-launch only starts and supervises the ranks: the program sets DeepSpeed, FSDP or Megatron-LM "
    "up itself from RANK, LOCAL_RANK and WORLD_SIZE";
constexpr const char* kCudaOrCpu = "dp-launch runs ranks on CUDA GPUs or CPUs only";
constexpr const char* kNoPinning =
    "dp-launch does not pin ranks to CPUs: run the command under numactl or taskset from a small "
    "script that picks the CPUs from LOCAL_RANK (dp-launch -n 2 -- ./pinned.sh python3 train.py)";

}  // namespace

const std::vector<ForeignFlag>& foreign_flags() {
    static const std::vector<ForeignFlag> list = {
        // torchrun's.
        {{"--rdzv-conf"},
         false,
         "dp-launch has no rendezvous settings: rank 0 runs the store at --master-addr:--master-port, "
         "and --rank-timeout, --load-timeout and --timeout bound the waits"},
        {{"--role"},
         false,
         "every rank runs the same command; tell ranks apart by RANK or LOCAL_RANK in the program"},
        {{"--start-method"},
         false,
         "each rank is its own process, started with exec; there is no start method to choose"},
        {{"--logs-specs"}, false, "--log-dir DIR keeps each rank's output in DIR/rank_N.stdout and .stderr"},
        {{"--max-restarts-per-node"}, false, "--max-restarts N restarts the whole group up to N times"},
        {{"--event-log-handler"},
         false,
         "dp-launch reports a job's events on its stderr and, for the main job, in manifest.jsonl; there "
         "is no handler to register"},
        {{"--log-line-prefix-template"},
         false,
         "each line a rank prints is prefixed [rank N]; --no-prefix leaves the lines as the rank printed "
         "them"},
        {{"--duplicate-stdout-filters", "--duplicate-stderr-filters"},
         false,
         "--log-dir DIR keeps every line of each rank's stdout and stderr in DIR/rank_N.stdout and "
         "DIR/rank_N.stderr: filter those files (grep)"},
        {{"--numa-binding"}, false, kNoPinning},
        {{"--signals-to-handle"},
         false,
         "dp-launch already forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to every rank"},
        {{"--virtual-local-rank"},
         false,
         "every rank sees the GPUs of --gpu-ids (CUDA_VISIBLE_DEVICES) and uses cuda:LOCAL_RANK; to show "
         "each rank only its own GPU, set CUDA_VISIBLE_DEVICES=$LOCAL_RANK in a script the ranks run"},
        {{"--print-completion"},
         false,
         "dp-launch has no completion script; dp-launch --help lists every option"},
        // accelerate launch's.
        {{"--use-deepspeed", "--use-fsdp", "--use-megatron-lm", "--use-parallelism-config", "--deepspeed",
          "--zero-stage", "--zero3-", "--offload-optimizer", "--offload-param",
          "--gradient-accumulation-steps", "--gradient-clipping", "--fsdp-", "--megatron-lm-",
          "--parallelism-config-"},
         true,
         kOwnSetUp},
        {{"--dynamo-"},
         true,
         "compile inside the program (torch.compile); dp-launch sets no ACCELERATE_DYNAMO_* variable"},
        {{"--fp8-"},
         true,
         "accelerate reads its fp8 recipe from ACCELERATE_FP8_* variables: set them in dp-launch's "
         "environment (ACCELERATE_FP8_BACKEND=te dp-launch ...) and every rank inherits them"},
        {{"--main-training-function"},
         false,
         "the script runs as a whole: call the function under if __name__ == '__main__'"},
        {{"--same-network"},
         false,
         "every node reaches --master-addr:--master-port; nothing else is asked of the network"},
        {{"--tpu", "--no-tpu-cluster", "--use-mps-device", "--use-xpu", "--vm", "--downcast-bf16"},
         true,
         kCudaOrCpu},
        {{"--enable-cpu-affinity"}, false, kNoPinning},
        {{"--env"},
         false,
         "every rank inherits dp-launch's environment: set the variable before it (VAR=value dp-launch ...)"},
        {{"--debug"},
         false,
         "accelerate's debug mode is ACCELERATE_DEBUG_MODE=true: set it in dp-launch's environment and every "
         "rank inherits it"},
        {{"--mpirun-hostfile"},
         false,
         "start dp-launch under mpirun yourself (mpirun --hostfile FILE -np N dp-launch -- CMD): it reads "
         "the "
         "MPI allocation (--cluster mpi)"},
        {{"--aws-"},
         true,
         "dp-launch runs on this machine or in a Slurm, MPI or Kubernetes allocation, not SageMaker"},
    };
    return list;
}

std::string foreign_flag_usage(const std::string& name) {
    if (name.rfind("--", 0) != 0) return "";
    const std::string wanted = dashed(name);
    for (const ForeignFlag& f : foreign_flags())
        for (const char* flag : f.flags)
            if (f.prefix ? wanted.rfind(flag, 0) == 0 : wanted == flag)
                return name + " is not a dp-launch option: " + f.instead;
    return "";
}

// accelerate's subcommands, answered with the dp-launch way; empty for any other word.
std::string accelerate_subcommand_usage(const std::string& first) {
    if (first == "config")
        return "'config' is accelerate's: run `accelerate config` with accelerate and pass the file it "
               "writes with --config_file FILE (dp-launch reads the keys that have a meaning here, e.g. "
               "--config_file ~/.cache/huggingface/accelerate/default_config.yaml); or give flags, DP_* "
               "variables or --config FILE, a JSON object such as {\"num_processes\": 4, \"nnodes\": 2}";
    if (first == "launch")
        return "'launch' is accelerate's: dp-launch is the launcher itself, e.g. dp-launch -n 2 -- "
               "python3 train.py";
    if (first == "test" || first == "estimate-memory" || first == "tpu-config" || first == "merge-weights")
        return "'" + first +
               "' is accelerate's; dp-launch's own are env (what the ranks would use) and plan "
               "(what a job would do), e.g. dp-launch env";
    return "";
}

std::string foreign_usage(const std::vector<std::string>& options) {
    std::error_code no_file;
    if (!options.empty() && options.front().size() < 64 && !std::filesystem::exists(options.front(), no_file))
        if (std::string why = accelerate_subcommand_usage(options.front()); !why.empty()) return why;
    for (const std::string& arg : options)
        if (std::string why = foreign_flag_usage(arg.substr(0, arg.find('='))); !why.empty()) return why;
    return "";
}

std::string unknown_flag_usage(const std::string& flag, const std::vector<std::string>& known) {
    const std::string name = flag.substr(0, flag.find('='));
    std::vector<std::string> bare;  // without the leading dashes, so that an abbreviation counts them out
    for (const std::string& k : known)
        if (k.rfind("--", 0) == 0) bare.push_back(k.substr(2));
    std::string hint;
    if (name.rfind("--", 0) == 0) {
        std::vector<std::string> names = launcher::closest_names(name.substr(2), bare);
        if (names.size() > 3) names.resize(3);
        for (std::size_t i = 0; i < names.size(); ++i)
            hint += (i == 0 ? " (did you mean --" : i + 1 == names.size() ? " or --" : ", --") + names[i];
        if (!hint.empty()) hint += "?)";
    }
    return launcher::utf8_for_display(name.substr(0, 80)) + " is not a dp-launch option" + hint;
}

}  // namespace dp::cli
