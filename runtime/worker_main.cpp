// dp-worker: one rank of `dp-launch PROMPTS`. Started by dp-launch, not by hand.
#include <CLI/CLI.hpp>
#include <iostream>

#include "runtime/errors.h"
#include "runtime/worker.h"

int main(int argc, char** argv) {
    CLI::App app(
        "dp-worker: one rank of dp-launch's main job (dp-launch starts it with the right environment)");
    dp::runtime::WorkerOptions o;
    int64_t random_seed = -1;
    app.add_option("--model", o.model_dir, "diffusers model folder")->required();
    app.add_option("--requests", o.requests_file, "request list written by dp-launch")->required();
    app.add_option("--output-dir", o.output_dir, "where images go")->required();
    app.add_option("--dtype", o.dtype)->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    app.add_option("--device", o.device)->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    app.add_option("--random-weights", random_seed, "the model's configs with seeded random weights");
    app.add_flag("--cfg-parallel", o.cfg_parallel, "pairs of ranks split the guidance branches");
    app.add_option("--ulysses", o.ulysses, "ranks that split each image's tokens")->check(CLI::Range(1, 64));
    app.add_option("--ring", o.ring, "ranks that pass keys and values round a ring")
        ->check(CLI::Range(1, 64));
    app.add_option("--tp", o.tp, "ranks that split the transformer's weights")->check(CLI::Range(1, 64));
    app.add_option("--device-map", o.device_map, "balanced, auto or FILE.json: one process, several devices");
    app.add_option("--max-memory", o.max_memory, "device_map's devices and budgets, DEV=SIZE,...");
    app.add_option("--batch-size", o.batch_size, "requests that go through the model together")
        ->check(CLI::Range(1, 64));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (random_seed >= 0) o.random_weights = static_cast<uint64_t>(random_seed);
    try {
        return dp::runtime::run_worker(o);
    } catch (const dp::runtime::Error& e) {
        std::cerr << "dp-worker: " << e.what() << std::endl;
        return e.exit_code();
    } catch (const std::exception& e) {
        std::cerr << "dp-worker: internal error: " << e.what() << std::endl;
        return 1;
    }
}
