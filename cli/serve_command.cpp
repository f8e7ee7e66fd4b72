#include "cli/serve_command.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <utility>

#include "launcher/errors.h"
#include "launcher/job.h"
#include "launcher/model_location.h"
#include "launcher/resolved_job.h"
#include "launcher/values.h"
#include "serve/body_check.h"
#include "serve/server.h"

namespace dp::cli {
namespace {

// serve's flags with a value: the flag, its DP_* twin, its field, its value name and help.
struct ServeFlag {
    const char* flag;
    const char* env;
    std::string ServeFlags::*field;
    const char* value;
    const char* help;
};

const std::array<ServeFlag, 10>& serve_flags() {
    static const std::array<ServeFlag, 10> rows = {{
        {"--host", "DP_SERVE_HOST", &ServeFlags::host, "HOST",
         "Address to listen on (default 127.0.0.1; any other needs --api-key)"},
        {"--port", "DP_SERVE_PORT", &ServeFlags::port, "P",
         "Port to listen on, 0 to 65535 (default 8000; 0: any free one, printed)"},
        {"--api-key", "DP_API_KEY", &ServeFlags::api_key, "KEY",
         "Key every request must carry (Authorization: Bearer KEY); prefer DP_API_KEY, which ps does not "
         "show"},
        {"--max-queue", "DP_MAX_QUEUE", &ServeFlags::max_queue, "N",
         "Jobs queued or running before requests are answered 429, 1 to 100000 (default 64)"},
        {"--max-prompts", "DP_MAX_PROMPTS", &ServeFlags::max_prompts, "N",
         "Prompt lines one request may hold, 1 to 100000 (default 1000; more: 413)"},
        {"--max-images", "DP_MAX_IMAGES", &ServeFlags::max_images, "N",
         "Images (n) one generations request may ask for, 1 to 1000 (default 16; more: 413)"},
        {"--max-request-bytes", "DP_MAX_REQUEST_BYTES", &ServeFlags::max_request_bytes, "BYTES",
         "Largest request body, 1 to 67108864 (default 8388608; more: 413)"},
        {"--max-image-side", "DP_MAX_IMAGE_SIDE", &ServeFlags::max_image_side, "PIXELS",
         "Largest width or height a line may ask for, 16 to 16384 (default 4096; more: 413)"},
        {"--request-timeout", "DP_REQUEST_TIMEOUT", &ServeFlags::request_timeout, "SECONDS",
         "How long a generations request waits for its images before it is answered 202 with its job "
         "(default 600)"},
        {"--batch-images", "DP_BATCH_IMAGES", &ServeFlags::batch_images, "N",
         "Queued jobs run together as one batch job of up to N images, each job's folder as its own run "
         "writes it, 1 to 100000 (default 256; 1: each job alone)"},
    }};
    return rows;
}

// The value of `flag` from `flags`, else its twin, else empty.
std::string given(const ServeFlags& flags, const ServeFlag& f, const EnvLookup& env) {
    if (!(flags.*f.field).empty()) return flags.*f.field;
    const char* v = env(f.env);
    return v ? v : "";
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

CLI::App* add_serve_command(CLI::App& app, ServeFlags& flags) {
    CLI::App* serve = app.add_subcommand(
        "serve",
        "Keep a job API on HTTP: POST /v1/images/generations and /v1/jobs (JSONL), each job run as "
        "dp-launch runs it with these flags into its own folder under -o, queued in SQLite there so "
        "that a restart resumes it (docs/serve.md)");
    for (const ServeFlag& f : serve_flags())
        serve->add_option(f.flag, flags.*f.field, std::string(f.help) + " [env " + f.env + "]")
            ->type_name(f.value);
    serve->fallthrough();  // the launch and pipeline options belong to the main app
    return serve;
}

std::string serve_options_from(const ServeFlags& flags, const EnvLookup& env, serve::ServeOptions& out) {
    try {
        const auto& rows = serve_flags();
        const auto value = [&](std::size_t i) { return given(flags, rows[i], env); };
        const auto source = [&](std::size_t i) {
            return (flags.*rows[i].field).empty() ? std::string(rows[i].env) : std::string(rows[i].flag);
        };
        if (!value(0).empty()) out.host = value(0);
        if (!value(1).empty()) out.port = launcher::parse_int(value(1), 0, 65535, source(1));
        out.api_key = value(2);
        if (!value(3).empty()) out.max_queue = launcher::parse_int(value(3), 1, 100000, source(3));
        if (!value(4).empty()) out.max_prompts = launcher::parse_int(value(4), 1, 100000, source(4));
        if (!value(5).empty()) out.max_images = launcher::parse_int(value(5), 1, 1000, source(5));
        if (!value(6).empty()) out.max_body_bytes = launcher::parse_int(value(6), 1, 64 << 20, source(6));
        if (!value(7).empty()) out.max_image_side = launcher::parse_int(value(7), 16, 16384, source(7));
        if (!value(8).empty()) out.request_timeout_s = launcher::parse_seconds(value(8), 86400, source(8));
        if (!value(9).empty()) out.batch_images = launcher::parse_int(value(9), 1, 100000, source(9));
    } catch (const launcher::Error& e) {
        return e.what();
    }
    if (out.host.empty() || out.host.find_first_of(" /") != std::string::npos)
        return "--host '" + out.host +
               "': give an address or host name to listen on (e.g. 127.0.0.1 or 0.0.0.0)";
    if (out.api_key.find_first_of(" \t\r\n") != std::string::npos)
        return "--api-key: a key may not hold white space";
    return {};
}

std::vector<std::string> job_args_for_serve(const std::vector<std::string>& given, std::string& problem) {
    std::vector<std::string> out;
    bool serve_seen = false;
    for (std::size_t i = 0; i < given.size(); ++i) {
        const std::string& a = given[i];
        if (!serve_seen && a == "serve") {
            serve_seen = true;
            continue;
        }
        bool dropped = false;
        for (const ServeFlag& f : serve_flags()) {
            const std::string flag = f.flag;
            if (a == flag) {
                ++i;  // and its value
                dropped = true;
            } else if (starts_with(a, flag + "=")) {
                dropped = true;
            }
        }
        if (dropped) continue;
        if (a == "-o" || a == "--output-dir" || a == "--output_dir") {
            ++i;
            continue;
        }
        if (starts_with(a, "--output-dir=") || starts_with(a, "--output_dir=") ||
            (starts_with(a, "-o") && a.size() > 2))
            continue;
        if (a == "-q" || a == "--quiet") continue;
        for (const char* refused : {"--resume", "--overwrite", "--dry-run"})
            if (a == refused || starts_with(a, std::string(refused) + "="))
                problem =
                    std::string(refused) +
                    " does not go with serve: each job has a folder of its own, and a job a killed server "
                    "left is resumed when it starts again";
        out.push_back(a);
    }
    return out;
}

int run_serve(const launcher::LaunchSpec& launch, const launcher::JobOptions& job,
              serve::ServeOptions options) {
    // Note [a job is resolved once]: the model and flags refused here, before anything listens,
    // exactly as the batch job would refuse them.
    const launcher::ResolvedJob resolved = launcher::resolve_job(launch, job);
    if (launch.nnodes > 1)
        throw launcher::UsageError("serve runs on one node: give it no --nnodes (its ranks are this node's)");
    // Note [checking a model before the ranks start]: once here, not for every job. Each job's
    // ranks are then the warm ranks (Note [warm ranks]): its dp-launch starts dp-attach in their
    // place. With a --worker of one's own, each job starts that worker.
    if (job.worker.empty()) {
        launcher::check_model_with_worker(launch, resolved);
        options.worker = launcher::self_dir() + "/dp-attach";
    } else {
        options.warm = false;
    }
    std::error_code error;
    options.root = std::filesystem::absolute(job.output_dir, error).lexically_normal().string();
    if (error) options.root = job.output_dir;
    options.dp_launch = launcher::self_dir() + "/dp-launch";
    options.world_size = launch.world_size();
    options.quiet = launch.quiet;
    // Note [jobs batched together]: each line's seed is made explicit, which a seed drawn per run
    // (--seed random) has not; only a PNG's record is rewritten for its job; and with --batch-size
    // above 1 which prompts share a forward pass, and so the last bit of an image, would change.
    options.batch = !resolved.options.seed_drawn && resolved.options.image_format == "png" &&
                    resolved.options.batch_size == 1;
    options.base_seed = resolved.options.seed;
    options.images_per_prompt = resolved.options.images_per_prompt;
    return serve::run_server(options, serve::make_body_checker(resolved, options), job.model);
}

}  // namespace dp::cli
