#pragma once
// `dp-launch serve`: its own flags (each with a DP_* twin), the launch and pipeline flags it
// passes to every job, and running it (serve/server.h).
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/launch_options.h"
#include "launcher/job_options.h"
#include "launcher/launch_spec.h"
#include "serve/serve_options.h"

namespace dp::cli {

// serve's flags as given, read by serve_options_from.
struct ServeFlags {
    std::string host, port, api_key, max_queue, max_prompts, max_images, max_request_bytes, max_image_side,
        request_timeout, batch_images;
};

// Adds the `serve` subcommand to `app`, its flags into `flags`.
CLI::App* add_serve_command(CLI::App& app, ServeFlags& flags);

// `flags` (else their DP_* twins through `env`, else the defaults) into `out`: an error text, or
// empty.
std::string serve_options_from(const ServeFlags& flags, const EnvLookup& env, serve::ServeOptions& out);

// The words of `given` (dp-launch's argv without the program) that each job's dp-launch takes:
// all but "serve", serve's own flags, -o/--output-dir (each job has its own folder under it) and
// -q. Empty text in `problem` unless a flag serve cannot pass on is there (--resume, --overwrite,
// --dry-run, a PROMPTS file).
std::vector<std::string> job_args_for_serve(const std::vector<std::string>& given, std::string& problem);

// Runs the server for `launch` and `job` (resolved here, once, as a batch job is): every refusal
// of the model and the flags before it listens.
int run_serve(const launcher::LaunchSpec& launch, const launcher::JobOptions& job,
              serve::ServeOptions options);

}  // namespace dp::cli
