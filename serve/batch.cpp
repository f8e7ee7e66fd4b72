#include "serve/batch.h"

#include <zlib.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "launcher/prompt_file.h"
#include "protocol/strict_json.h"

namespace dp::serve {

// Note [jobs batched together]: a request of one prompt is about 60 ms of compute on a small
// model, and a job run alone costs about 50 ms of its own (its dp-launch, dp-attach, the check of
// its lines, its manifest and gallery); under -n 2 a one-prompt job also leaves one replica idle.
// So the runner claims the queued jobs that can go together (fresh ones, up to --batch-images
// images) and runs them as one batch job, whose dynamic queue keeps every rank busy. What makes the
// jobs' folders the same as their own runs' (Note [each job is a batch job]):
//  - each line of the batch carries the seed the job's own run gives it (--seed plus the image's
//    index in its job, Note [images per prompt]), and nothing else of an image depends on its
//    index or on the other prompts of the run (the images are the same at any rank count);
//  - as the batch records an image, the runner writes it into its job's folder under the name the
//    job's own run gives it, with the dp-launch text chunk (which names the index and the file)
//    as that run writes it, and appends its record with the job's index, line, file and SHA-256;
//  - a job whose images are all recorded is finished at once, with its gallery, while the batch
//    goes on.
// A batch that ends early (the server stops, a job is cancelled, a rank dies) leaves each
// unfinished job a folder that is a run of its own cut short: it is queued again and runs alone
// with --resume, as any interrupted job does. Only fresh jobs (no folder yet) are batched, and
// only with PNG images, a fixed --seed and --batch-size 1 (cli/serve_command.cpp).

namespace {

std::vector<std::string_view> lines_of(std::string_view text) {
    std::vector<std::string_view> lines;
    std::size_t start = 0;
    while (start <= text.size()) {
        std::size_t end = text.find('\n', start);
        if (end == std::string_view::npos) end = text.size();
        std::string_view line = text.substr(start, end - start);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        lines.push_back(line);
        if (end == text.size()) break;
        start = end + 1;
    }
    return lines;
}

uint32_t big_endian(const unsigned char* p) {
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void put_big_endian(std::string& out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

}  // namespace

BatchPlan plan_batch(const std::vector<std::string>& bodies, const BatchSettings& settings) {
    BatchPlan plan;
    for (std::size_t job = 0; job < bodies.size(); ++job) {
        launcher::PromptFileReader reader("request", launcher::PromptFormat::kJsonl, {}, {},
                                          settings.images_per_prompt);
        reader.feed(bodies[job]);
        const launcher::PromptFile file = reader.finish();
        if (!file.invalid.empty())
            throw std::runtime_error("a queued job's line does not parse: " + file.invalid.front().reason);
        const std::vector<std::string_view> lines = lines_of(bodies[job]);
        for (const launcher::PromptRecord& p : file.prompts) {
            plan.images.push_back({job, p.index, p.line});
            if (p.image != 0) continue;
            nlohmann::json line;
            if (p.line < 1 || static_cast<std::size_t>(p.line) > lines.size() ||
                !protocol::parse_strict_json(lines[static_cast<std::size_t>(p.line - 1)], line).empty() ||
                !line.is_object())
                throw std::runtime_error("a queued job's line " + std::to_string(p.line) + " does not parse");
            line["seed"] = p.seed.value_or(launcher::prompt_seed(settings.base_seed, p.index));
            plan.jsonl += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
        }
        plan.job_images.push_back(static_cast<int64_t>(file.prompts.size()));
    }
    return plan;
}

std::string name_in_job(const std::string& batch_file, int64_t index) {
    char digits[32];
    std::snprintf(digits, sizeof(digits), "%05lld", static_cast<long long>(index));
    const std::size_t dash = batch_file.find('-');
    return digits +
           (dash == std::string::npos ? batch_file.substr(batch_file.find('.')) : batch_file.substr(dash));
}

std::string png_for_job(const std::string& png, int64_t index, const std::string& file) {
    static const char kSignature[] = "\x89PNG\r\n\x1a\n";
    static const char kKey[] = "dp-launch";  // with its NUL: the chunk's keyword
    if (png.size() < 8 || png.compare(0, 8, kSignature, 8) != 0) return {};
    const auto* bytes = reinterpret_cast<const unsigned char*>(png.data());
    std::size_t at = 8;
    while (at + 12 <= png.size()) {
        const uint32_t length = big_endian(bytes + at);
        if (length > png.size() - at - 12) return {};
        const std::size_t data = at + 8, end = data + length + 4;
        const bool record = png.compare(at + 4, 4, "tEXt") == 0 && length > sizeof(kKey) &&
                            std::memcmp(bytes + data, kKey, sizeof(kKey)) == 0;
        if (record) {
            nlohmann::json j = nlohmann::json::parse(
                png.begin() + static_cast<std::ptrdiff_t>(data + sizeof(kKey)),
                png.begin() + static_cast<std::ptrdiff_t>(data + length), nullptr, false);
            if (!j.is_object()) return {};
            j["index"] = index;
            j["file"] = file;
            // As protocol::image_record_text writes it: ASCII, so a tEXt chunk still.
            const std::string text = std::string(kKey, sizeof(kKey)) +
                                     j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
            std::string chunk = "tEXt" + text;
            std::string out = png.substr(0, at);
            put_big_endian(out, static_cast<uint32_t>(text.size()));
            out += chunk;
            put_big_endian(out,
                           static_cast<uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(chunk.data()),
                                                         static_cast<uInt>(chunk.size()))));
            return out + png.substr(end);
        }
        at = end;
    }
    return {};
}

}  // namespace dp::serve
