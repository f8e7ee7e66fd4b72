// dp-worker --job FILE: one rank of `dp-launch PROMPTS`. Started by dp-launch, not by hand: every
// setting is in the job file; the rank's place in the job is in its environment.
#include <CLI/CLI.hpp>
#include <iostream>

#include "protocol/errors.h"
#include "protocol/standard_fds.h"
#include "runtime/worker.h"

int main(int argc, char** argv) {
    dp::protocol::open_missing_standard_fds();  // before anything is opened (Note [closed standard
                                                // descriptors])
    CLI::App app(
        "dp-worker: one rank of dp-launch's main job (dp-launch writes the job file and sets the "
        "environment)");
    std::string job;
    std::string pool;
    auto* job_option = app.add_option("--job", job, "the job file dp-launch wrote");
    auto* pool_option = app.add_option(
        "--pool", pool, "wait for jobs in this folder, the model kept loaded (dp-launch serve)");
    job_option->excludes(pool_option);
    bool check = false;
    app.add_flag("--check", check, "check the job's model as a rank would load it, build nothing, and exit");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : dp::protocol::kExitUsage;
    }
    if (!pool.empty()) return dp::runtime::run_pool(pool);
    if (job.empty()) {
        std::cerr << "dp-worker: give --job FILE (or --pool DIR); dp-launch starts it with one" << std::endl;
        return dp::protocol::kExitUsage;
    }
    return check ? dp::runtime::check_model(job) : dp::runtime::run_worker(job);
}
