#include "cli/help_pages.h"

#include <string>

#include "cli/option_groups.h"
#include "protocol/errors.h"

namespace dp::cli {

const char* const kProgramSummary =
    "dp-launch: start a command once per rank, torchrun-compatible, and supervise it; or run the "
    "diffusion pipeline over a prompt file.";

namespace {

HelpPage program_page() {
    HelpPage p;
    p.usage = {"dp-launch [OPTIONS] PROMPTS", "dp-launch [OPTIONS] -- COMMAND [ARGS...]",
               "dp-launch [OPTIONS] -m MODULE [ARGS...]", "dp-launch SUBCOMMAND [OPTIONS]"};
    p.examples = {
        {"dp-launch -n 2 --model models/sd3 prompts.txt", "2 ranks split prompts.txt; images in outputs/"},
        {"dp-launch -n 4 -- python train.py --lr 3e-4", "4 ranks of a torchrun-style script"},
        {"dp-launch --gpu-ids 0,2 -- ./my_program", "2 ranks on GPUs 0 and 2"},
        {"dp-launch -n 2 --log-dir logs -- ./job.sh", "also keep each rank's output in logs/"},
        {"dp-launch -n 2 --dry-run -- ./job.sh", "show each rank's environment, start nothing"},
        {"dp-launch --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 -n 8 -- python train.py",
         "node 0 of 2, 8 ranks each"},
        {"dp-launch env --json", "facts for a bug report"},
    };
    p.notes = {
        "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the "
        "other torchrun variables. Precedence: flag > DP_* environment variable > --config file > default. "
        "Every --a-b flag is also taken as --a_b, accelerate's spelling."};
    for (const protocol::ExitCodeClass& c : protocol::kExitCodeClasses)
        p.codes.emplace_back(std::to_string(c.code), c.meaning);
    p.codes.emplace_back("N", "the first failing rank's own exit code, passed through");
    p.codes.emplace_back("128+S",
                         "the first failing rank was killed by signal S, or dp-launch was stopped by it");
    return p;
}

}  // namespace

void set_help_pages(HelpFormatter& formatter) {
    const std::vector<std::string> groups = option_group_headings();
    formatter.set_page("dp-launch", program_page());
    HelpPage env;
    env.usage = {"dp-launch env [--json]"};
    formatter.set_page("env", env);
    // plan resolves the job as the main job would: the launcher's, the model's, the sampling and the
    // parallelism options all count; output and resilience change nothing in a plan.
    HelpPage plan;
    plan.usage = {"dp-launch plan [OPTIONS] [PROMPTS]"};
    plan.parent_groups = {groups.at(0), groups.at(1), groups.at(2), groups.at(3)};
    plan.examples = {{"dp-launch plan --model tiny-random-sd3 -n 4 --ulysses 2 --tp 2",
                      "the mesh, the sub-groups and the bytes per rank of 4 ranks"},
                     {"dp-launch plan -n 2 prompts.jsonl", "also each schedule's expected makespan"}};
    formatter.set_page("plan", plan);
    HelpPage arguments;
    arguments.usage = {"dp-launch arguments [--model M] [OPTIONS] [--json]"};
    arguments.parent_groups = {groups.at(1), groups.at(2)};  // the flags give the defaults it lists
    formatter.set_page("arguments", arguments);
    HelpPage compare;
    compare.usage = {"dp-launch compare RUN_A RUN_B [--min-psnr X] [--min-ssim Y] [--gallery FILE] [--json]"};
    formatter.set_page("compare", compare);
}

}  // namespace dp::cli
