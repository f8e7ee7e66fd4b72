#pragma once
// `dp-launch serve`: the HTTP API over a queue of jobs in the output root, each run as the batch
// job runs it (docs/serve.md).
#include <string>

#include "serve/http_api.h"
#include "serve/serve_options.h"

namespace dp::serve {

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(const std::string& host);

// Runs the server until SIGTERM or SIGINT: listens, answers, runs the queued jobs one after
// another, each as the batch job would run it, resuming first those a killed server left running.
// `check` judges a request's prompt lines; `model` is what /health and the page name. Returns the
// exit code (0 after a signal). Throws launcher::UsageError (exit 2) before anything starts for a
// non-loopback host without a key, a port it cannot bind, or a root another server holds.
int run_server(const ServeOptions& options, const BodyChecker& check, const std::string& model);

}  // namespace dp::serve
