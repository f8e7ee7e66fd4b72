#include "protocol/status_events.h"

#include <cmath>

#include <climits>
#include <nlohmann/json.hpp>

#include "protocol/errors.h"
#include "protocol/json_fields.h"

namespace dp::protocol {

namespace {

constexpr std::size_t kMaxMessageBytes = 4096;

// Each kind's name on the wire, in the variant's order.
constexpr const char* kEventNames[] = {"start",     "image",  "failed", "error",
                                       "heartbeat", "joined", "take",   "phases"};
static_assert(std::size(kEventNames) == std::variant_size_v<StatusEvent>);

std::string cut(const std::string& text) {
    return text.size() <= kMaxMessageBytes ? text : text.substr(0, kMaxMessageBytes) + "...";
}

nlohmann::json fields(const StartEvent& e) {
    nlohmann::json j = {{"rank", e.rank}, {"device", e.device}, {"first", e.first}, {"count", e.count}};
    if (!e.dtype.empty()) j["dtype"] = e.dtype;
    if (!e.schedule.empty()) j["schedule"] = e.schedule;
    return j;
}
nlohmann::json fields(const ImageEvent& e) {
    nlohmann::json j = {{"rank", e.rank}, {"index", e.index}, {"file", e.file},    {"sha256", e.sha256},
                        {"ms", e.ms},     {"width", e.width}, {"height", e.height}};
    if (e.computed_steps >= 0) j["computed_steps"] = e.computed_steps;
    if (!e.mag_ratios.empty()) j["mag_ratios"] = e.mag_ratios;
    return j;
}
nlohmann::json fields(const FailedEvent& e) {
    return {{"rank", e.rank}, {"index", e.index}, {"error", cut(e.error)}};
}
nlohmann::json fields(const HeartbeatEvent& e) {
    return {{"rank", e.rank},
            {"phase", phase_name(e.phase)},
            {"index", e.index},
            {"step", e.step},
            {"steps", e.steps}};
}
nlohmann::json fields(const RankErrorEvent& e) {
    return {{"rank", e.rank}, {"exit_code", e.exit_code}, {"message", cut(e.message)}};
}

nlohmann::json fields(const JoinedEvent& e) { return {{"rank", e.rank}, {"job_id", e.job_id}}; }
nlohmann::json fields(const TakeEvent& e) { return {{"rank", e.rank}, {"indices", e.indices}}; }

nlohmann::json fields(const PhasesEvent& e) {
    return {{"rank", e.rank},
            {"load_ms", e.load_ms},
            {"encode_ms", e.encode_ms},
            {"steps_ms", e.steps_ms},
            {"decode_ms", e.decode_ms},
            {"write_ms", e.write_ms},
            {"passes", e.passes},
            {"flops", e.flops},
            {"gemm_flops", e.gemm_flops},
            {"gemm_rate", e.gemm_rate},
            {"attention_rate", e.attention_rate},
            {"gemm_ms", e.gemm_ms},
            {"attention_ms", e.attention_ms}};
}

int read_rank(detail::Fields& f) { return static_cast<int>(f.integer("rank", 0, INT_MAX)); }

void read(detail::Fields& f, StartEvent& e) {
    e.rank = read_rank(f);
    e.device = f.string("device");
    e.first = f.integer("first", 0, INT64_MAX);
    e.count = f.integer("count", 0, INT64_MAX);
    if (f.has("dtype")) {
        e.dtype = f.string("dtype");
        if (e.dtype != "fp32" && e.dtype != "bf16" && e.dtype != "fp16")
            throw InputDataError(f.path("dtype") + " '" + e.dtype.substr(0, 40) +
                                 "': expected fp32, bf16 or fp16");
    }
    if (f.has("schedule")) {
        e.schedule = f.string("schedule");
        if (e.schedule != "static" && e.schedule != "dynamic")
            throw InputDataError(f.path("schedule") + " '" + e.schedule.substr(0, 40) +
                                 "': expected static or dynamic");
    }
}
void read(detail::Fields& f, ImageEvent& e) {
    e.rank = read_rank(f);
    e.index = f.integer("index", 0, INT64_MAX);
    e.file = f.string("file");
    e.sha256 = f.string("sha256");
    e.ms = f.number("ms", 0, 1e18);
    e.width = static_cast<int>(f.integer("width", 0, INT_MAX));
    e.height = static_cast<int>(f.integer("height", 0, INT_MAX));
    if (f.has("computed_steps")) e.computed_steps = f.integer("computed_steps", 0, INT64_MAX);
    if (f.has("mag_ratios")) {
        const nlohmann::json& ratios = f.array("mag_ratios");
        for (std::size_t i = 0; i < ratios.size(); ++i) {
            if (!ratios[i].is_number() || !std::isfinite(ratios[i].get<double>()))
                throw InputDataError(f.path("mag_ratios", i) + ": expected a finite number");
            e.mag_ratios.push_back(ratios[i].get<double>());
        }
    }
}
void read(detail::Fields& f, FailedEvent& e) {
    e.rank = read_rank(f);
    e.index = f.integer("index", 0, INT64_MAX);
    e.error = f.string("error");
}
void read(detail::Fields& f, RankErrorEvent& e) {
    e.rank = read_rank(f);
    e.exit_code = static_cast<int>(f.integer("exit_code", 1, 255));
    e.message = f.string("message");
}

void read(detail::Fields& f, JoinedEvent& e) {
    e.rank = read_rank(f);
    e.job_id = f.string("job_id");
}

void read(detail::Fields& f, TakeEvent& e) {
    e.rank = read_rank(f);
    const nlohmann::json& list = f.array("indices");
    for (std::size_t i = 0; i < list.size(); ++i) {
        if (!list[i].is_number_integer() || list[i].get<int64_t>() < 0)
            throw InputDataError(f.path("indices", i) + ": expected a prompt index (an integer >= 0)");
        e.indices.push_back(list[i].get<int64_t>());
    }
}

void read(detail::Fields& f, PhasesEvent& e) {
    e.rank = read_rank(f);
    e.load_ms = f.number("load_ms", 0, 1e18);
    e.encode_ms = f.number("encode_ms", 0, 1e18);
    e.steps_ms = f.number("steps_ms", 0, 1e18);
    e.decode_ms = f.number("decode_ms", 0, 1e18);
    e.write_ms = f.number("write_ms", 0, 1e18);
    e.passes = f.integer("passes", 0, INT64_MAX);
    e.flops = f.number("flops", 0, 1e30);
    e.gemm_flops = f.number("gemm_flops", 0, e.flops);
    e.gemm_rate = f.number("gemm_rate", 0, 1e30);
    if (f.has("attention_rate")) e.attention_rate = f.number("attention_rate", 0, 1e30);
    // Each within the steps (their kernels ran in them), to a rounding of the sums.
    const double steps = e.steps_ms * (1 + 1e-9) + 1e-6;
    if (f.has("gemm_ms")) e.gemm_ms = f.number("gemm_ms", 0, steps);
    if (f.has("attention_ms")) e.attention_ms = f.number("attention_ms", 0, steps);
}

void read(detail::Fields& f, HeartbeatEvent& e) {
    e.rank = read_rank(f);
    const std::string phase = f.string("phase");
    bool known = false;
    for (RankPhase p : {RankPhase::kLoading, RankPhase::kGenerating, RankPhase::kWaiting})
        if (phase == phase_name(p)) e.phase = p, known = true;
    if (!known)
        throw InputDataError(f.path("phase") + " '" + phase.substr(0, 40) +
                             "': expected loading, generating or waiting");
    e.index = f.integer("index", -1, INT64_MAX);
    e.step = static_cast<int>(f.integer("step", 0, INT_MAX));
    e.steps = static_cast<int>(f.integer("steps", 0, INT_MAX));
}

// The event of kind `name`, or nullopt when no kind has that name.
template <std::size_t I = 0>
std::optional<StatusEvent> read_kind(const nlohmann::json& name, detail::Fields& f) {
    if constexpr (I == std::variant_size_v<StatusEvent>) {
        return std::nullopt;
    } else {
        if (name != kEventNames[I]) return read_kind<I + 1>(name, f);
        std::variant_alternative_t<I, StatusEvent> event;
        try {
            read(f, event);
            f.no_other_keys();
        } catch (const InputDataError& e) {
            throw InputDataError(std::string("status event '") + kEventNames[I] + "': " + e.what());
        }
        return event;
    }
}

}  // namespace

const char* phase_name(RankPhase phase) {
    switch (phase) {
        case RankPhase::kLoading:
            return "loading";
        case RankPhase::kGenerating:
            return "generating";
        case RankPhase::kWaiting:
            return "waiting";
    }
    return "?";
}

std::string describe(const HeartbeatEvent& beat) {
    switch (beat.phase) {
        case RankPhase::kLoading:
            return "loading the model";
        case RankPhase::kGenerating:
            return "step " + std::to_string(beat.step) + " of " + std::to_string(beat.steps) + " of prompt " +
                   std::to_string(beat.index);
        case RankPhase::kWaiting:
            return "waiting for the other ranks";
    }
    return "?";
}

std::string status_line(const StatusEvent& event) {
    nlohmann::json j = std::visit([](const auto& e) { return fields(e); }, event);
    j["event"] = kEventNames[event.index()];
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::optional<StatusEvent> parse_status_line(std::string_view line) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::nullopt;
    const auto name = j.find("event");
    if (name == j.end() || !name->is_string()) return std::nullopt;
    detail::Fields f(j, "");
    f.string("event");
    return read_kind(*name, f);
}

}  // namespace dp::protocol
