#pragma once
// A request's prompt lines checked as `dp-launch` checks a prompt file for the same model and
// flags (the one call-argument table, launcher/job_settings.h), before anything is written, plus
// what a server refuses that a batch job takes: a line naming a file on the server.
#include "launcher/resolved_job.h"
#include "serve/http_api.h"

namespace dp::serve {

BodyChecker make_body_checker(const launcher::ResolvedJob& job, const ServeOptions& options);

}  // namespace dp::serve
