#pragma once
// The server's HTTP API (cpp-httplib), docs/serve.md:
//   POST /v1/images/generations   OpenAI's request; our call arguments as extra fields
//   POST /v1/jobs                 a JSONL body, a whole prompt file
//   GET  /v1/jobs[/{id}]          state, queue position, progress, the records
//   GET  /v1/jobs/{id}/manifest   the run's manifest.jsonl
//   GET  /v1/jobs/{id}/images/{name}
//   DELETE /v1/jobs/{id}          cancel: at the next step boundary, the images made kept
//   GET  /health, /metrics, /     health, Prometheus text, the live page
// Every answer that is not 2xx is {"error": {"message", "type", "code"}}, OpenAI's shape.
#include <cstdint>
#include <functional>
#include <string>

#include "serve/job_runner.h"
#include "serve/job_store.h"
#include "serve/serve_options.h"

namespace httplib {
class Server;
}

namespace dp::serve {

// What a request's prompt lines are, checked as the batch job checks a prompt file (the same
// call-argument table) before anything is written.
struct BodyCheck {
    std::string problem;  // empty: every line is valid
    int status = 400;     // 400, or 413 past a limit
    int64_t prompts = 0;  // lines
    int64_t images = 0;   // images they make
};
// Checks a request's JSONL; its lines may name the files in the folder `uploads` (the request's
// own uploads, Note [edits over HTTP]; empty: none) and no other file on the server.
using BodyChecker = std::function<BodyCheck(const std::string& jsonl, const std::string& uploads)>;

struct ApiContext {
    const ServeOptions& options;
    JobStore& store;
    JobRunner& runner;
    BodyChecker check;
    std::string model;  // what /health and the page name
};

// Adds every route, the key check (when options.api_key is set) and the error answers to `server`.
void add_routes(httplib::Server& server, ApiContext& context);

// The API key a request carries: "Authorization: Bearer KEY" or "X-API-Key: KEY" (for the live
// page only, ?key=KEY), compared in constant time. True when no key is set.
bool key_matches(const std::string& expected, const std::string& given);

}  // namespace dp::serve
