#include "serve/http_api.h"

#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "protocol/atomic_file.h"
#include "protocol/strict_json.h"
#include "serve/edit_uploads.h"
#include "serve/live_page.h"
#include "serve/run_records.h"

namespace dp::serve {
namespace {

using nlohmann::json;

void answer_error(httplib::Response& res, int status, const std::string& message, const std::string& type) {
    res.status = status;
    res.set_content(json{{"error", {{"message", message}, {"type", type}, {"code", status}}}}.dump() + "\n",
                    "application/json");
}

void answer_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump() + "\n", "application/json");
}

std::string base64(const std::string& bytes) {
    std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
    const int n =
        EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                        reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
    out.resize(static_cast<std::size_t>(n));
    return out;
}

std::string content_type(const std::string& name) {
    const auto ends = [&](const char* s) {
        const std::string e(s);
        return name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
    };
    if (ends(".png")) return "image/png";
    if (ends(".jpg") || ends(".jpeg")) return "image/jpeg";
    if (ends(".webp")) return "image/webp";
    return "application/octet-stream";
}

// A job as the API shows it; with its records when `records` is set.
json job_json(ApiContext& c, const JobRow& row, bool records) {
    const std::vector<json> made = run_records(run_folder(c.options, row.id));
    int64_t ok = 0, not_ok = 0;
    for (const json& r : made) (r.value("status", "") == "ok" ? ok : not_ok) += 1;
    json j = {{"id", row.id},
              {"object", "job"},
              {"kind", row.kind},
              {"state", state_name(row.state)},
              {"created", row.created},
              {"prompts", row.prompts},
              {"images", row.images},
              {"images_done", ok},
              {"images_failed", not_ok},
              {"progress", row.images > 0 ? static_cast<double>(ok) / static_cast<double>(row.images) : 0.0},
              {"attempts", row.attempts},
              {"manifest", "/v1/jobs/" + row.id + "/manifest"}};
    if (row.started > 0) j["started"] = row.started;
    if (row.finished > 0) j["finished"] = row.finished;
    if (row.state == JobState::kQueued) j["queue_position"] = c.store.queue_position(row.id);
    if (row.cancel_requested) j["cancel_requested"] = true;
    if (row.exit_code >= 0 && row.state != JobState::kRunning && row.state != JobState::kQueued)
        j["exit_code"] = row.exit_code;
    if (!row.error.empty()) j["error"] = row.error;
    if (records) j["records"] = made;
    return j;
}

// The queue is full: 429 with a Retry-After of about one job's time.
bool refuse_when_full(ApiContext& c, httplib::Response& res) {
    if (c.store.active() < c.options.max_queue) return false;
    const RunnerStats s = c.runner.stats();
    const double per_job = s.jobs_run > 0 ? s.busy_s / static_cast<double>(s.jobs_run) : 5.0;
    res.set_header("Retry-After", std::to_string(std::max<long>(1, std::lround(per_job))));
    answer_error(res, 429,
                 "the queue is full (" + std::to_string(c.options.max_queue) +
                     " jobs queued or running, --max-queue): retry after the time Retry-After gives",
                 "rate_limit_exceeded");
    return true;
}

// Checks `jsonl` and queues it as a job of `kind`; nullopt with `res` answered when refused. Its
// lines may name the files in `uploads` (the request's own, Note [edits over HTTP]) and no other.
std::optional<JobRow> queue_job(ApiContext& c, const std::string& kind, const std::string& jsonl,
                                httplib::Response& res, const std::string& uploads = "") {
    const BodyCheck check = c.check(jsonl, uploads);
    if (!check.problem.empty()) {
        answer_error(res, check.status, check.problem, "invalid_request_error");
        return std::nullopt;
    }
    if (refuse_when_full(c, res)) return std::nullopt;
    JobRow row = c.store.add(kind, jsonl, check.prompts, check.images);
    c.runner.wake();
    return row;
}

// OpenAI's image request `body` as a prompt line of n images: its keys (n, size, response_format,
// model, user), the rest our prompt line's. False with `res` answered when a key is wrong.
bool generation_line(ApiContext& c, const json& body, json& line, std::string& format,
                     httplib::Response& res) {
    line = json::object();
    int64_t n = 1;
    format = "b64_json";
    const auto refuse = [&](int status, const std::string& why) {
        answer_error(res, status, why, "invalid_request_error");
        return false;
    };
    for (const auto& [key, value] : body.items()) {
        if (key == "model" || key == "user") {  // OpenAI's; this server has one model
            if (!value.is_string()) return refuse(400, "\"" + key + "\" must be a string");
        } else if (key == "n") {
            if (!value.is_number_integer() || value.get<int64_t>() < 1)
                return refuse(400, "\"n\" must be an integer of at least 1");
            n = value.get<int64_t>();
            if (n > c.options.max_images)
                return refuse(413, "\"n\" is " + std::to_string(n) + "; this server makes at most " +
                                       std::to_string(c.options.max_images) +
                                       " images a request (--max-images)");
        } else if (key == "size") {
            const std::string size = value.is_string() ? value.get<std::string>() : "";
            int w = 0, h = 0;
            char x = 0, extra = 0;
            if (size == "auto") continue;
            if (std::sscanf(size.c_str(), "%d%c%d%c", &w, &x, &h, &extra) != 3 || x != 'x' || w < 1 || h < 1)
                return refuse(400, "\"size\" must be \"WIDTHxHEIGHT\" (e.g. \"512x512\") or \"auto\"");
            line["width"] = w;
            line["height"] = h;
        } else if (key == "response_format") {
            format = value.is_string() ? value.get<std::string>() : "";
            if (format != "b64_json" && format != "url")
                return refuse(400, "\"response_format\" must be \"b64_json\" or \"url\"");
        } else {
            line[key] = value;  // prompt, seed, negative_prompt, the call arguments: checked as a line
        }
    }
    if (n > 1) line["num_images_per_prompt"] = n;
    return true;
}

// Queues `line` as a job of `kind` and answers with its images once made, as OpenAI does
// (b64_json or absolute urls), or 202 with the job after --request-timeout.
void answer_images(ApiContext& c, const httplib::Request& req, httplib::Response& res,
                   const std::string& kind, const json& line, const std::string& format,
                   const std::string& uploads = "") {
    const std::optional<JobRow> row = queue_job(c, kind, line.dump() + "\n", res, uploads);
    if (!row) return;
    if (!c.runner.wait_finished(row->id, c.options.request_timeout_s)) {
        res.set_header("Location", "/v1/jobs/" + row->id);
        return answer_json(res, 202, job_json(c, *c.store.get(row->id), false));
    }
    const JobRow done = *c.store.get(row->id);
    if (done.state != JobState::kDone)
        return answer_error(
            res, done.state == JobState::kCancelled ? 409 : 500,
            row->id + " " + state_name(done.state) + (done.error.empty() ? "" : ": " + done.error),
            "server_error");
    json data = json::array();
    for (const json& r : run_records(run_folder(c.options, row->id))) {
        if (r.value("status", "") != "ok") continue;
        const std::string file = r.value("file", "");
        if (format == "url")  // absolute, as OpenAI's are: by the Host the client used
            data.push_back({{"url", "http://" + req.get_header_value("Host") + "/v1/jobs/" + row->id +
                                        "/images/" + file}});
        else
            data.push_back({{"b64_json", base64(read_bytes(run_folder(c.options, row->id) + "/" + file))}});
    }
    answer_json(res, 200,
                {{"created", static_cast<int64_t>(done.created)}, {"job", row->id}, {"data", data}});
}

// POST /v1/images/generations: OpenAI's keys, the rest our prompt line's, one line of n images.
void generations(ApiContext& c, const httplib::Request& req, httplib::Response& res) {
    json body;
    if (const std::string why = protocol::parse_strict_json(req.body, body); !why.empty())
        return answer_error(res, 400, "the body is not JSON: " + why, "invalid_request_error");
    if (!body.is_object())
        return answer_error(res, 400, "the body must be a JSON object with at least \"prompt\"",
                            "invalid_request_error");
    json line;
    std::string format;
    if (generation_line(c, body, line, format, res)) answer_images(c, req, res, "generations", line, format);
}

// A form field's value as JSON: a number, true, false, null, an array or an object as such; any
// other text (and always prompt, negative_prompt, size, response_format, model and user) as a string.
json form_value(const std::string& key, const std::string& text) {
    for (const char* text_key : {"prompt", "negative_prompt", "size", "response_format", "model", "user"})
        if (key == text_key) return text;
    json value;
    if (protocol::parse_strict_json(text, value).empty() && !value.is_string()) return value;
    return text;
}

// POST /v1/images/edits (Note [edits over HTTP], edit_uploads.cpp): OpenAI's multipart request,
// "image" (and "mask") files and the generations keys as fields.
void edits(ApiContext& c, const httplib::Request& req, httplib::Response& res) {
    const auto refuse = [&](const std::string& why) { answer_error(res, 400, why, "invalid_request_error"); };
    if (!req.is_multipart_form_data())
        return refuse(
            "send multipart/form-data (curl -F): image=@FILE (PNG, JPEG or WebP), prompt=TEXT, and "
            "optionally mask=@FILE, n, size, response_format and the prompt line's keys");
    json body = json::object();
    std::vector<std::string> images;  // one, or several for a model that takes them (Qwen-Image-Edit-2509)
    std::string mask;
    for (const auto& [key, field] : req.files) {
        if (key == "image" || key == "image[]") {
            images.push_back(field.content);
        } else if (key == "mask") {
            mask = field.content;
        } else if (key == "mask_image") {
            return refuse("give the mask as the file field \"mask\"");
        } else {
            body[key] = form_value(key, field.content);
        }
    }
    if (images.empty()) return refuse("\"image\": the image to edit, a PNG, JPEG or WebP file, is missing");
    json line;
    std::string format;
    if (!generation_line(c, body, line, format, res)) return;
    std::string folder;
    try {
        folder = make_upload_folder(c.options.root);
        const std::optional<std::string> from_alpha =
            mask.empty() ? mask_from_alpha(images.front(), true) : mask_from_alpha(mask, false);
        json pictures = json::array();
        for (std::size_t i = 0; i < images.size(); ++i) {
            const std::string file = folder + "/image" + (i == 0 ? "" : "-" + std::to_string(i + 1));
            protocol::write_file_atomically(file, images[i]);
            pictures.push_back(file);
        }
        line["image"] = images.size() == 1 ? pictures.front() : pictures;
        if (!mask.empty() || from_alpha) {
            protocol::write_file_atomically(folder + "/mask", from_alpha ? *from_alpha : mask);
            line["mask_image"] = folder + "/mask";
        }
    } catch (const std::exception& e) {
        std::error_code ignored;
        if (!folder.empty()) std::filesystem::remove_all(folder, ignored);
        return answer_error(res, 500, std::string("cannot keep the upload: ") + e.what(), "server_error");
    }
    answer_images(c, req, res, "edits", line, format, folder);
    if (res.status == 400 || res.status == 413 || res.status == 429) {  // refused: nothing kept
        std::error_code ignored;
        std::filesystem::remove_all(folder, ignored);
    }
}

std::string metrics(ApiContext& c) {
    const std::map<JobState, int64_t> counts = c.store.counts();
    const RunnerStats s = c.runner.stats();
    std::ostringstream out;
    out << "# HELP dp_queue_depth Jobs waiting to run.\n# TYPE dp_queue_depth gauge\n"
        << "dp_queue_depth " << counts.at(JobState::kQueued) << "\n"
        << "# HELP dp_jobs Jobs in the server's database, by state.\n# TYPE dp_jobs gauge\n";
    for (const auto& [state, count] : counts)
        out << "dp_jobs{state=\"" << state_name(state) << "\"} " << count << "\n";
    out << "# HELP dp_images_total Images the server's runs made since it started.\n"
        << "# TYPE dp_images_total counter\ndp_images_total " << s.images << "\n"
        << "# HELP dp_images_per_second Images made per second of running jobs since the start.\n"
        << "# TYPE dp_images_per_second gauge\ndp_images_per_second "
        << (s.busy_s > 0 ? static_cast<double>(s.images) / s.busy_s : 0.0) << "\n"
        << "# HELP dp_image_seconds Mean time per image of the last run, as its records give it.\n"
        << "# TYPE dp_image_seconds gauge\ndp_image_seconds " << s.last_image_ms / 1000.0 << "\n"
        << "# HELP dp_ranks Ranks by state: running while a job runs.\n# TYPE dp_ranks gauge\n"
        << "dp_ranks{state=\"running\"} " << (s.running.empty() ? 0 : c.options.world_size) << "\n"
        << "dp_ranks{state=\"idle\"} " << (s.running.empty() ? c.options.world_size : 0) << "\n"
        << "# HELP dp_healthy 1 while the server is healthy.\n# TYPE dp_healthy gauge\ndp_healthy "
        << (s.healthy ? 1 : 0) << "\n";
    return out.str();
}

void add_job_routes(httplib::Server& server, ApiContext& c) {
    server.Post("/v1/jobs", [&c](const httplib::Request& req, httplib::Response& res) {
        const std::optional<JobRow> row = queue_job(c, "jobs", req.body, res);
        if (!row) return;
        res.set_header("Location", "/v1/jobs/" + row->id);
        answer_json(res, 202, job_json(c, *row, false));
    });
    server.Get("/v1/jobs", [&c](const httplib::Request&, httplib::Response& res) {
        json data = json::array();
        for (const JobRow& row : c.store.recent(100)) data.push_back(job_json(c, row, false));
        answer_json(res, 200, {{"object", "list"}, {"data", data}});
    });
    server.Get(R"(/v1/jobs/([^/]+))", [&c](const httplib::Request& req, httplib::Response& res) {
        const std::optional<JobRow> row = c.store.get(req.matches[1]);
        if (!row) return answer_error(res, 404, "no job " + std::string(req.matches[1]), "not_found");
        answer_json(res, 200, job_json(c, *row, true));
    });
    server.Get(R"(/v1/jobs/([^/]+)/manifest)", [&c](const httplib::Request& req, httplib::Response& res) {
        const std::optional<JobRow> row = c.store.get(req.matches[1]);
        if (!row) return answer_error(res, 404, "no job " + std::string(req.matches[1]), "not_found");
        const std::string path = run_folder(c.options, row->id) + "/manifest.jsonl";
        std::ifstream probe(path);
        if (!probe)
            return answer_error(res, 404,
                                row->id + " has no manifest yet (it is " + state_name(row->state) + ")",
                                "not_found");
        res.set_content(read_bytes(path), "application/x-ndjson");
    });
    server.Get(
        R"(/v1/jobs/([^/]+)/images/([^/]+))", [&c](const httplib::Request& req, httplib::Response& res) {
            const std::optional<JobRow> row = c.store.get(req.matches[1]);
            if (!row) return answer_error(res, 404, "no job " + std::string(req.matches[1]), "not_found");
            const std::string name = req.matches[2];
            if (!is_recorded_image(run_records(run_folder(c.options, row->id)), name))
                return answer_error(res, 404,
                                    row->id + " has no image named " + json(name).dump() +
                                        " (the names are its records' \"file\")",
                                    "not_found");
            res.set_content(read_bytes(run_folder(c.options, row->id) + "/" + name), content_type(name));
        });
    server.Delete(R"(/v1/jobs/([^/]+))", [&c](const httplib::Request& req, httplib::Response& res) {
        const std::optional<JobRow> row = c.store.get(req.matches[1]);
        if (!row) return answer_error(res, 404, "no job " + std::string(req.matches[1]), "not_found");
        if (!c.store.cancel(row->id))
            return answer_error(res, 409, row->id + " is already " + state_name(row->state), "conflict");
        c.runner.cancel(row->id);
        const JobRow now = *c.store.get(row->id);
        answer_json(res, now.state == JobState::kCancelled ? 200 : 202, job_json(c, now, false));
    });
}

}  // namespace

bool key_matches(const std::string& expected, const std::string& given) {
    if (expected.empty()) return true;
    if (given.size() != expected.size()) return false;
    return CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

void add_routes(httplib::Server& server, ApiContext& c) {
    server.set_payload_max_length(static_cast<std::size_t>(c.options.max_body_bytes));
    server.set_pre_routing_handler([&c](const httplib::Request& req, httplib::Response& res) {
        if (c.options.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string given = req.get_header_value("X-API-Key");
        const std::string auth = req.get_header_value("Authorization");
        if (given.empty() && auth.rfind("Bearer ", 0) == 0) given = auth.substr(7);
        if (given.empty() && req.path == "/" && req.has_param("key")) given = req.get_param_value("key");
        if (key_matches(c.options.api_key, given)) return httplib::Server::HandlerResponse::Unhandled;
        res.set_header("WWW-Authenticate", "Bearer");
        answer_error(res, 401,
                     given.empty() ? "this server needs its API key: send \"Authorization: Bearer KEY\""
                                   : "the API key is not this server's",
                     "invalid_api_key");
        return httplib::Server::HandlerResponse::Handled;
    });
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        if (res.status == 413)
            return answer_error(res, 413,
                                "the request body is larger than this server takes (--max-request-bytes)",
                                "invalid_request_error");
        if (res.status == 404)
            return answer_error(res, 404, "no such path: " + req.method + " " + req.path, "not_found");
        answer_error(res, res.status,
                     "the request could not be served (HTTP " + std::to_string(res.status) + ")",
                     "invalid_request_error");
    });
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        answer_error(res, 500, "internal error: " + what, "server_error");
    });
    server.Post("/v1/images/generations",
                [&c](const httplib::Request& req, httplib::Response& res) { generations(c, req, res); });
    server.Post("/v1/images/edits",
                [&c](const httplib::Request& req, httplib::Response& res) { edits(c, req, res); });
    add_job_routes(server, c);
    server.Get("/health", [&c](const httplib::Request&, httplib::Response& res) {
        const RunnerStats s = c.runner.stats();
        json body = {{"status", s.healthy ? "ok" : "unhealthy"},
                     {"model", c.model},
                     {"queued", c.store.counts().at(JobState::kQueued)}};
        body["running"] = s.running.empty() ? json(nullptr) : json(s.running);
        if (!s.healthy) body["reason"] = s.unhealthy_reason;
        answer_json(res, s.healthy ? 200 : 503, body);
    });
    server.Get("/metrics", [&c](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics(c), "text/plain; version=0.0.4");
    });
    server.Get("/", [&c](const httplib::Request&, httplib::Response& res) {
        res.set_content(live_page_html(c.model), "text/html; charset=utf-8");
    });
}

}  // namespace dp::serve
