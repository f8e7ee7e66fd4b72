// Mutation fuzz of the launcher-worker contract: job files and status lines that are cut, flipped,
// stretched or hold numbers no type can take are refused with the protocol's own errors, never
// with an exception from the JSON library, a crash or an abort. Bounded: a fixed number of cases
// from a fixed seed, so a failure replays.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "protocol/errors.h"
#include "protocol/job_file.h"
#include "protocol/status_events.h"

using namespace dp::protocol;

namespace {

// One random edit of `text`: a byte flipped, inserted or deleted, a cut, a number replaced by one
// out of every range, or a string's bytes replaced by ones that are not UTF-8.
std::string mutate(std::string text, std::mt19937_64& rng) {
    auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
    static const char* numbers[] = {
        "1e309", "-1e309", "-1", "0", "1e19", "18446744073709551616", "-0.5", "9223372036854775808",
        "nan",   "1.5"};
    switch (rng() % 7) {
        case 0:
            if (!text.empty()) text[pick(text.size())] ^= static_cast<char>(1 + rng() % 255);
            break;
        case 1:
            text.insert(pick(text.size() + 1), 1, static_cast<char>(rng() % 256));
            break;
        case 2:
            if (!text.empty()) text.erase(pick(text.size()), 1 + pick(8));
            break;
        case 3:
            text.resize(pick(text.size() + 1));
            break;
        case 4: {  // a number -> one of the hostile ones
            std::vector<std::size_t> starts;
            for (std::size_t i = 1; i < text.size(); ++i)
                if ((text[i] >= '0' && text[i] <= '9') &&
                    (text[i - 1] == ':' || text[i - 1] == ' ' || text[i - 1] == '['))
                    starts.push_back(i);
            if (starts.empty()) break;
            const std::size_t at = starts[pick(starts.size())];
            std::size_t end = at;
            while (end < text.size() &&
                   (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
                ++end;
            text.replace(at, end - at, numbers[pick(std::size(numbers))]);
            break;
        }
        case 5: {  // a string's first byte -> invalid UTF-8
            const std::size_t q = text.find('"', pick(text.size()));
            if (q != std::string::npos && q + 1 < text.size()) text.insert(q + 1, "\xff\xfe");
            break;
        }
        default: {  // a key duplicated
            const std::size_t brace = text.find('{');
            if (brace != std::string::npos) text.insert(brace + 1, "\"dtype\": \"fp32\", ");
            break;
        }
    }
    return text;
}

JobFile sample_job() {
    JobFile job;
    job.model_dir = "/models/sd3";
    job.family = "sd3";
    job.output_dir = "out";
    job.mesh.dp = 2;
    job.mesh.tp = 2;
    for (int i = 0; i < 3; ++i) {
        JobRequest r;
        r.index = i;
        r.file = "0000" + std::to_string(i) + "-p.png";
        r.prompt = "prompt " + std::to_string(i);
        r.seed = 7 + static_cast<uint64_t>(i);
        job.requests.push_back(r);
    }
    return job;
}

}  // namespace

TEST_CASE("a mutated job file is read or refused with InputDataError, over 4000 cases") {
    nlohmann::json j;
    to_json(j, sample_job());
    const std::string valid = j.dump();
    std::mt19937_64 rng(20261201);
    int refused = 0, read = 0, not_json = 0;
    for (int i = 0; i < 4000; ++i) {
        std::string text = valid;
        for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) text = mutate(text, rng);
        const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (parsed.is_discarded()) {
            ++not_json;  // read_job_file refuses these itself, before from_json
            continue;
        }
        try {
            JobFile job;
            from_json(parsed, job);
            ++read;
        } catch (const InputDataError&) {
            ++refused;
        } catch (const std::exception& e) {
            FAIL_CHECK("case " << i << " escaped as " << e.what() << ": " << text.substr(0, 300));
        }
    }
    MESSAGE(read << " read, " << refused << " refused, " << not_json << " not JSON");
    CHECK(refused > 300);  // the mutations do reach the reader's checks
}

TEST_CASE("a mutated status line is an event, not an event, or InputDataError, over 4000 cases") {
    const std::vector<std::string> valid = {
        status_line(ImageEvent{1, 4, "00004-p.png", std::string(64, 'a'), 12.5, 40, 40}),
        status_line(FailedEvent{0, 2, "the final latents are not finite"}),
        status_line(RankErrorEvent{1, 75, "all_reduce on group 'tp' failed"}),
    };
    std::mt19937_64 rng(1);
    int refused = 0;
    for (int i = 0; i < 4000; ++i) {
        std::string line = valid[static_cast<std::size_t>(i) % valid.size()];
        for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) line = mutate(line, rng);
        try {
            (void)parse_status_line(line);
        } catch (const InputDataError&) {
            ++refused;
        } catch (const std::exception& e) {
            FAIL_CHECK("case " << i << " escaped as " << e.what() << ": " << line.substr(0, 300));
        }
    }
    CHECK(refused > 100);
}
