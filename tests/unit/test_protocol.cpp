// The launcher <-> worker contract: the job file and the status events round-trip field by field,
// and whatever is not a job file this build reads is refused with the file and the key named.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "launcher/phase_report.h"
#include "protocol/errors.h"
#include "protocol/image_parameters.h"
#include "protocol/job_file.h"
#include "protocol/status_events.h"
#include "strategies/model_config.h"

using namespace dp::protocol;

namespace {

// A job file with no field at its default, so that a field the serialisation drops shows.
JobFile full_job() {
    JobFile job;
    job.model_dir = "/models/sd3 tiny";
    job.family = "sd3";
    job.random_weights = 18446744073709551615ull;
    job.output_dir = "out/ünï";
    job.dtype = "bf16";
    job.device = "cpu";
    job.batch_size = 3;
    job.variant = "fp16";
    job.no_t5 = true;
    job.mesh = {2, 2, 3, 5, 7};
    job.collective_timeout_s = 12.5;
    job.schedule = "dynamic";
    job.image_format = "webp";
    job.quality = 77;
    job.save_latents = true;
    job.comm_report = true;
    DeviceMapPlan plan;
    plan.devices = {"cpu:0", "cpu:1"};
    plan.placements = {{"text_encoder", -1, "cpu:1", 1000},
                       {"transformer", 0, "cpu:0", 2000},
                       {"transformer", 1, "cpu:1", 3000}};
    job.device_map = DeviceMapRequest{"auto", "cpu:0=450KB,cpu:1=2MB", plan};
    JobRequest a;
    a.index = 4;
    a.file = "00004-a-red-circle.png";
    a.prompt = "a red \"circle\"\n";
    a.negative_prompt = "ugly";
    a.seed = 9007199254740993ull;  // not exact as a double
    a.steps = 40;
    a.width = 24;
    a.height = 8;
    a.arguments.set("guidance_scale", 4.25);
    a.arguments.set("max_sequence_length", int64_t{77});
    a.arguments.set("skip_guidance_layers", std::vector<int>{7, 8, 9});
    a.arguments.set("skip_layer_guidance_scale", 3.5);
    a.arguments.set("skip_layer_guidance_start", 0.05);
    a.arguments.set("skip_layer_guidance_stop", 0.5);
    JobRequest b = a;
    b.index = 7;
    b.file = "00007-b.png";
    b.negative_prompt.reset();  // none given: null, not ""
    job.requests = {a, b};
    return job;
}

void check_same(const JobFile& x, const JobFile& y) {
    CHECK(x.model_dir == y.model_dir);
    CHECK(x.family == y.family);
    CHECK(x.random_weights == y.random_weights);
    CHECK(x.output_dir == y.output_dir);
    CHECK(x.dtype == y.dtype);
    CHECK(x.device == y.device);
    CHECK(x.batch_size == y.batch_size);
    CHECK(x.variant == y.variant);
    CHECK(x.no_t5 == y.no_t5);
    CHECK(x.mesh.dp == y.mesh.dp);
    CHECK(x.mesh.cfg == y.mesh.cfg);
    CHECK(x.mesh.ring == y.mesh.ring);
    CHECK(x.mesh.ulysses == y.mesh.ulysses);
    CHECK(x.mesh.tp == y.mesh.tp);
    CHECK(x.collective_timeout_s == y.collective_timeout_s);
    CHECK(x.schedule == y.schedule);
    CHECK(x.image_format == y.image_format);
    CHECK(x.quality == y.quality);
    CHECK(x.save_latents == y.save_latents);
    CHECK(x.cache_report == y.cache_report);
    CHECK(x.comm_report == y.comm_report);
    REQUIRE(x.device_map.has_value() == y.device_map.has_value());
    if (x.device_map) {
        CHECK(x.device_map->spec == y.device_map->spec);
        CHECK(x.device_map->max_memory == y.device_map->max_memory);
        REQUIRE(x.device_map->plan.has_value() == y.device_map->plan.has_value());
        if (x.device_map->plan) {
            CHECK(x.device_map->plan->devices == y.device_map->plan->devices);
            REQUIRE(x.device_map->plan->placements.size() == y.device_map->plan->placements.size());
            for (std::size_t i = 0; i < x.device_map->plan->placements.size(); ++i) {
                const DevicePlacement &p = x.device_map->plan->placements[i],
                                      &q = y.device_map->plan->placements[i];
                CHECK(p.component == q.component);
                CHECK(p.block == q.block);
                CHECK(p.device == q.device);
                CHECK(p.bytes == q.bytes);
            }
        }
    }
    REQUIRE(x.requests.size() == y.requests.size());
    for (std::size_t i = 0; i < x.requests.size(); ++i) {
        const JobRequest &r = x.requests[i], &s = y.requests[i];
        CHECK(r.index == s.index);
        CHECK(r.file == s.file);
        CHECK(r.prompt == s.prompt);
        CHECK(r.negative_prompt == s.negative_prompt);
        CHECK(r.seed == s.seed);
        CHECK(r.steps == s.steps);
        CHECK(r.width == s.width);
        CHECK(r.height == s.height);
        CHECK(r.arguments.items().size() == s.arguments.items().size());
        CHECK(r.arguments == s.arguments);
    }
}

std::string temp_path(const std::string& name) {
    return "/tmp/dp-protocol-test-" + std::to_string(getpid()) + "-" + name;
}

// The message read_job_file gives for a file with `text`, checked as the worker checks it (its
// family's call arguments).
std::string refusal(const std::string& text) {
    const std::string path = temp_path("bad.json");
    std::ofstream(path, std::ios::binary) << text;
    std::string message;
    try {
        read_job_file(path, dp::strategies::check_job_family);
        message = "(accepted)";
    } catch (const InputDataError& e) {
        message = e.what();
        CHECK(e.exit_code() == kExitInputData);
    }
    std::remove(path.c_str());
    return message;
}

// full_job() as JSON with `edit` applied.
std::string edited(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = full_job();
    edit(j);
    return j.dump();
}

}  // namespace

TEST_CASE("the job file round-trips every field, through JSON and through a file") {
    const JobFile job = full_job();
    JobFile back = nlohmann::json::parse(nlohmann::json(job).dump()).get<JobFile>();
    check_same(job, back);

    const std::string path = temp_path("job.json");
    write_job_file(path, job);
    check_same(job, read_job_file(path));
    std::remove(path.c_str());

    // The optional parts absent: still absent after the trip.
    JobFile plain;
    plain.model_dir = "m";
    plain.family = "qwen-image";
    plain.output_dir = "o";
    JobFile plain_back = nlohmann::json(plain).get<JobFile>();
    check_same(plain, plain_back);
    CHECK_FALSE(plain_back.random_weights);
    CHECK_FALSE(plain_back.device_map);
    CHECK(plain_back.collective_timeout_s == kDefaultCollectiveTimeoutS);
    // An earlier launcher's file has no schedule: static.
    nlohmann::json unscheduled = plain;
    unscheduled.erase("schedule");
    CHECK(unscheduled.get<JobFile>().schedule == "static");
    // Nor an image format: PNG, and PNG is not written.
    CHECK_FALSE(nlohmann::json(plain).contains("image_format"));
    CHECK(plain_back.image_format == "png");
    // Nor diagnostics: each is false, and an unset one is not written.
    CHECK_FALSE(nlohmann::json(plain).contains("save_latents"));
    CHECK_FALSE((plain_back.save_latents || plain_back.cache_report || plain_back.comm_report));
    nlohmann::json reporting = plain;
    reporting["cache_report"] = true;
    CHECK(reporting.get<JobFile>().cache_report);
    JobFile unplanned = job;
    unplanned.device_map->plan.reset();
    check_same(unplanned, nlohmann::json(unplanned).get<JobFile>());
}

TEST_CASE("a job file that is not one this build reads is refused, naming the file and the key") {
    const std::string path = temp_path("bad.json");
    for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
             {"", path + ": not a dp-launch job file (not JSON"},
             {"[1, 2]", path + ": format: not a dp-launch job file"},
             {R"({"format": "something else", "version": 1})", path + ": format: not a dp-launch job file"},
             {edited([](auto& j) { j["version"] = 1; }),
              path + ": version: 1 is not the version this dp-worker reads (4); dp-launch and dp-worker come "
                     "from different builds"},
             {edited([](auto& j) { j["image_format"] = "gif"; }),
              path + ": image_format: 'gif': expected png, jpeg or webp"},
             {edited([](auto& j) { j["quality"] = 0; }),
              path + ": quality: expected a whole number from 1 to 100, got 0"},
             {edited([](auto& j) { j.erase("output_dir"); }),
              path + ": output_dir: missing (expected a string)"},
             {edited([](auto& j) { j["batch_size"] = "2"; }),
              path + ": batch_size: expected a whole number from 1 to 65536, got \"2\""},
             {edited([](auto& j) { j["mesh"]["tp"] = 0; }),
              path + ": mesh.tp: expected a whole number from 1"},
             {edited([](auto& j) { j["mesh"]["pp"] = 2; }), path + ": mesh.pp: not a key of this format"},
             {edited([](auto& j) { j["dtype"] = "fp8"; }),
              path + ": dtype: 'fp8': expected auto, fp32, bf16 or fp16"},
             {edited([](auto& j) { j.erase("variant"); }), path + ": variant: missing (expected a string)"},
             {edited([](auto& j) { j["variant"] = "../fp16"; }),
              path + ": variant: '../fp16': expected empty or a name of letters, digits, '_' and '-'"},
             {edited([](auto& j) { j["no_t5"] = 1; }), path + ": no_t5: expected true or false, got 1"},
             {edited([](auto& j) { j["requests"][0]["max_sequence_length"] = 1025; }),
              path + ": requests[0].max_sequence_length: expected a whole number from 1 to 1024, got 1025"},
             {edited([](auto& j) { j["requests"][0]["true_cfg_scale"] = 2.0; }),
              path + ": requests[0].true_cfg_scale: sd3 does not read it"},
             {edited([](auto& j) { j["family"] = "sdxl"; }),
              path + ": family: 'sdxl' is not a model family this dp-worker runs"},
             {edited([](auto& j) { j.erase("family"); }), path + ": family: missing (expected a string)"},
             {edited([](auto& j) { j["requests"][0]["negative_prompt"] = 3; }),
              path + ": requests[0].negative_prompt: expected a string or null"},
             {edited([](auto& j) {
                  j["requests"][1]["skip_guidance_layers"] = {7, 7};
              }),
              path + ": requests[1].skip_guidance_layers: block 7 is listed twice"},
             {edited([](auto& j) { j["requests"][1]["skip_guidance_layers"] = {"7"}; }),
              path + ": requests[1].skip_guidance_layers: expected a list of distinct transformer block "
                     "indices"},
             {edited([](auto& j) { j["requests"][0]["skip_layer_guidance_start"] = 0.5; }),
              path + ": requests[0].skip_layer_guidance_start: must be below skip_layer_guidance_stop"},
             {edited([](auto& j) { j["requests"][0]["skip_layer_guidance_stop"] = 1.5; }),
              path + ": requests[0].skip_layer_guidance_stop: expected a number from 0 to 1, got 1.5"},
             {edited([](auto& j) { j["schedule"] = "greedy"; }),
              path + ": schedule: 'greedy': expected static or dynamic"},
             {edited([](auto& j) { j["collective_timeout_s"] = 0; }),
              path + ": collective_timeout_s: expected a number"},
             {edited([](auto& j) { j["requests"][1]["seed"] = -1; }),
              path + ": requests[1].seed: expected a whole number from 0 to 2^64 - 1, got -1"},
             {edited([](auto& j) { j["requests"][0]["file"] = "../x.png"; }),
              path + ": requests[0].file: '../x.png' is not a file name inside the output folder"},
             {edited([](auto& j) { j["requests"][0].erase("prompt"); }),
              path + ": requests[0].prompt: missing"},
             {edited([](auto& j) { j["device_map"]["plan"]["placements"][2]["device"] = "cuda:3"; }),
              path + ": device_map.plan.placements[2].device: 'cuda:3' is not one of the plan's devices"},
             {edited([](auto& j) { j["steps"] = 3; }), path + ": steps: not a key of this format"}}) {
        CAPTURE(text);
        const std::string got = refusal(text);
        CHECK_MESSAGE(got.find(message) == 0, got);
    }
    bool unreadable = false;
    try {
        read_job_file(temp_path("missing.json"));
    } catch (const Error& e) {
        unreadable =
            e.exit_code() == kExitNoInput &&
            std::string(e.what()).find("missing.json: cannot read the job file") != std::string::npos;
    }
    CHECK(unreadable);
}

TEST_CASE("every status event round-trips field by field, as one line") {
    const StartEvent start{3, "cuda:1", 40, 12, "bf16", "static"};
    const ImageEvent image{2, 17, "00017-x.png", std::string(64, 'a'), 812.5, 16, 24};
    const FailedEvent failed{1, 5, "image size 512x16: outside the \"position table\""};
    const RankErrorEvent error{4, kExitCommunication, "all_reduce on group 'tp' failed"};
    for (const StatusEvent& event : std::vector<StatusEvent>{start, image, failed, error}) {
        const std::string line = status_line(event);
        CAPTURE(line);
        REQUIRE(line.back() == '\n');
        CHECK(line.find('\n') == line.size() - 1);
        const std::optional<StatusEvent> back = parse_status_line(line);
        REQUIRE(back.has_value());
        REQUIRE(back->index() == event.index());
    }
    const auto s = std::get<StartEvent>(*parse_status_line(status_line(start)));
    CHECK(s.rank == 3);
    CHECK(s.device == "cuda:1");
    CHECK(s.first == 40);
    CHECK(s.count == 12);
    CHECK(s.dtype == "bf16");
    // An older rank's start event has no dtype; another value is refused.
    CHECK(std::get<StartEvent>(*parse_status_line(status_line(StartEvent{0, "cpu", 0, 1, "", ""})))
              .dtype.empty());
    bool refused = false;
    try {
        parse_status_line(
            R"({"event": "start", "rank": 0, "device": "cpu", "first": 0, "count": 1, "dtype": "auto"})");
    } catch (const InputDataError& e) {
        refused = std::string(e.what()) == "status event 'start': dtype 'auto': expected fp32, bf16 or fp16";
    }
    CHECK(refused);
    const auto i = std::get<ImageEvent>(*parse_status_line(status_line(image)));
    CHECK(i.rank == 2);
    CHECK(i.index == 17);
    CHECK(i.file == "00017-x.png");
    CHECK(i.sha256 == std::string(64, 'a'));
    CHECK(i.ms == 812.5);
    CHECK(i.width == 16);
    CHECK(i.height == 24);
    const auto f = std::get<FailedEvent>(*parse_status_line(status_line(failed)));
    CHECK(f.rank == 1);
    CHECK(f.index == 5);
    CHECK(f.error == failed.error);
    const auto e = std::get<RankErrorEvent>(*parse_status_line(status_line(error)));
    CHECK(e.rank == 4);
    CHECK(e.exit_code == 75);
    CHECK(e.message == error.message);
}

namespace {
// Why a status line is refused, or "accepted".
std::string refusal(const char* text) {
    try {
        parse_status_line(text);
    } catch (const InputDataError& e) {
        return std::string(e.what());
    }
    return std::string("accepted");
}
}  // namespace

TEST_CASE("the dynamic schedule's start and take events round-trip, and bad fields are refused") {
    const StartEvent start{1, "cpu", 0, 0, "fp32", "dynamic"};
    CHECK(std::get<StartEvent>(*parse_status_line(status_line(start))).schedule == "dynamic");
    const TakeEvent take{2, {7, 3, 11}};
    const std::string line = status_line(take);
    CHECK(line == "{\"event\":\"take\",\"indices\":[7,3,11],\"rank\":2}\n");
    const auto t = std::get<TakeEvent>(*parse_status_line(line));
    CHECK(t.rank == 2);
    CHECK(t.indices == std::vector<int64_t>{7, 3, 11});
    CHECK(
        refusal(
            R"({"event": "start", "rank": 0, "device": "cpu", "first": 0, "count": 0, "schedule": "greedy"})") ==
        "status event 'start': schedule 'greedy': expected static or dynamic");
    CHECK(refusal(R"({"event": "take", "rank": 0, "indices": [1, -2]})") ==
          "status event 'take': indices[1]: expected a prompt index (an integer >= 0)");
    CHECK(refusal(R"({"event": "take", "rank": 0})").find("indices") != std::string::npos);
}

TEST_CASE(
    "a rank's phases round-trip, the summary prints them with the steps' MFU, and bad fields are refused") {
    PhasesEvent p;
    p.rank = 1, p.load_ms = 250, p.encode_ms = 40, p.steps_ms = 2000, p.decode_ms = 300, p.write_ms = 10;
    p.passes = 16, p.flops = 4e12, p.gemm_flops = 3.5e12, p.gemm_rate = 4e12, p.attention_rate = 1e12;
    const auto back = std::get<PhasesEvent>(*parse_status_line(status_line(p)));
    CHECK(back.rank == 1);
    CHECK(back.load_ms == 250);
    CHECK(back.encode_ms == 40);
    CHECK(back.steps_ms == 2000);
    CHECK(back.decode_ms == 300);
    CHECK(back.write_ms == 10);
    CHECK(back.passes == 16);
    CHECK(back.flops == 4e12);
    CHECK(back.gemm_flops == 3.5e12);
    CHECK(back.gemm_rate == 4e12);
    CHECK(back.attention_rate == 1e12);
    // 3.5 TFLOP at 4 TFLOP/s (0.875 s) and 0.5 TFLOP at 1 TFLOP/s (0.5 s) of the 2 s: 31 % outside.
    CHECK(dp::launcher::outside_share(p) == doctest::Approx(0.3125));
    // 4 TFLOP in 2 s is 2 TFLOP/s, half of the 4 TFLOP/s the GEMMs reach.
    CHECK(dp::launcher::steps_flop_rate(p) == doctest::Approx(2e12));
    CHECK(dp::launcher::model_flops_utilisation(p) == doctest::Approx(0.5));
    const std::string line = dp::launcher::phase_lines({{1, p}});
    CHECK(line ==
          "dp-launch: rank 1 time by phase: load 0.25 s, encode 0.04 s, steps 2.00 s, decode 0.30 s, write "
          "0.01 s; "
          "16 transformer passes, 4 TFLOP at 2 TFLOP/s, MFU 50 % of the 4 TFLOP/s its GEMMs reach at those "
          "shapes; outside GEMMs and attention 31 % of the steps\n");
    const nlohmann::json j = dp::launcher::phase_json({{1, p}});
    CHECK(j[0]["mfu"].get<double>() == doctest::Approx(0.5));
    CHECK(j[0]["steps_ms"] == 2000);
    PhasesEvent unmeasured = p;
    unmeasured.gemm_rate = 0;
    CHECK(dp::launcher::phase_lines({{0, unmeasured}}).find("MFU") == std::string::npos);
    CHECK(dp::launcher::phase_lines({}).empty());
    std::map<int, PhasesEvent> many;
    for (int r = 0; r < 10; ++r) many[r] = p;
    CHECK(dp::launcher::phase_lines(many).find("... and 2 more ranks") != std::string::npos);
    // Kernels timed in the steps (the CPU, Note [kernel time in the steps]): their own time, not the
    // rates, says what is outside them.
    PhasesEvent timed = p;
    timed.gemm_ms = 1100, timed.attention_ms = 700;
    const auto timed_back = std::get<PhasesEvent>(*parse_status_line(status_line(timed)));
    CHECK(timed_back.gemm_ms == 1100);
    CHECK(timed_back.attention_ms == 700);
    CHECK(dp::launcher::outside_share(timed) == doctest::Approx(0.1));
    CHECK(dp::launcher::phase_lines({{1, timed}})
              .find("; GEMMs 55 %, attention 35 %, outside GEMMs and attention 10 % of the steps\n") !=
          std::string::npos);
    const nlohmann::json tj = dp::launcher::phase_json({{1, timed}});
    CHECK(tj[0]["gemm_share"].get<double>() == doctest::Approx(0.55));
    CHECK(tj[0]["outside_gemm_attention"].get<double>() == doctest::Approx(0.1));
    CHECK(refusal(
              R"({"event": "phases", "rank": 0, "load_ms": 1, "encode_ms": 0, "steps_ms": 10, "decode_ms": 0,
                      "write_ms": 0, "passes": 0, "flops": 0, "gemm_flops": 0, "gemm_rate": 0, "gemm_ms": 11})")
              .find("gemm_ms") != std::string::npos);
    CHECK(refusal(
              R"({"event": "phases", "rank": 0, "load_ms": -1, "encode_ms": 0, "steps_ms": 0, "decode_ms": 0,
                      "write_ms": 0, "passes": 0, "flops": 0, "gemm_flops": 0, "gemm_rate": 0})")
              .find("load_ms") != std::string::npos);
    CHECK(
        refusal(R"({"event": "phases", "rank": 0, "load_ms": 1, "encode_ms": 0, "steps_ms": 0, "decode_ms": 0,
                      "write_ms": 0, "passes": 0, "flops": 1, "gemm_flops": 2, "gemm_rate": 0})")
            .find("gemm_flops") != std::string::npos);
}

TEST_CASE("a heartbeat round-trips in each phase, says what the rank does, and refuses other phases") {
    const HeartbeatEvent generating{2, RankPhase::kGenerating, 7, 3, 28};
    const auto g = std::get<HeartbeatEvent>(*parse_status_line(status_line(generating)));
    CHECK(g.rank == 2);
    CHECK(g.phase == RankPhase::kGenerating);
    CHECK(g.index == 7);
    CHECK(g.step == 3);
    CHECK(g.steps == 28);
    CHECK(describe(g) == "step 3 of 28 of prompt 7");
    for (RankPhase phase : {RankPhase::kLoading, RankPhase::kWaiting}) {
        const HeartbeatEvent beat{0, phase, -1, 0, 0};
        CHECK(std::get<HeartbeatEvent>(*parse_status_line(status_line(beat))).phase == phase);
    }
    CHECK(describe(HeartbeatEvent{0, RankPhase::kLoading, -1, 0, 0}) == "loading the model");
    bool refused = false;
    try {
        parse_status_line(
            R"({"event": "heartbeat", "rank": 0, "phase": "dozing", "index": -1, "step": 0, "steps": 0})");
    } catch (const InputDataError& e) {
        refused = std::string(e.what()) ==
                  "status event 'heartbeat': phase 'dozing': expected loading, generating or waiting";
    }
    CHECK(refused);
}

TEST_CASE("status lines that are not events are passed over, and a broken event names its key") {
    for (const char* line :
         {"", "hello from a rank", "[1]", "{}", R"({"event": 3})", R"({"event": "checkpoint"})"})
        CHECK_FALSE(parse_status_line(line).has_value());
    auto why = [](const std::string& line) {
        try {
            parse_status_line(line);
        } catch (const InputDataError& e) {
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    CHECK(why(R"({"event": "image", "rank": 0})") ==
          "status event 'image': index: missing (expected a whole number from 0 to 9223372036854775807)");
    CHECK(why(R"({"event": "error", "rank": 0, "exit_code": 0, "message": ""})")
              .find("exit_code: expected a whole number from 1 to 255") != std::string::npos);
    CHECK(why(R"({"event": "start", "rank": 0, "device": "cpu", "first": 0, "count": 1, "extra": 1})") ==
          "status event 'start': extra: not a key of this format");
    // A message that is not UTF-8, or huge, still makes one short line.
    const RankErrorEvent odd{0, 1, "bad \xFF byte" + std::string(100000, 'x')};
    const std::string line = status_line(odd);
    CHECK(line.size() < 5000);
    const auto back = std::get<RankErrorEvent>(*parse_status_line(line));
    CHECK(back.message.substr(0, 4) == "bad ");
}

TEST_CASE("the job file written a request at a time: one line per request, replaced whole on commit") {
    const JobFile job = full_job();
    REQUIRE(job.requests.size() >= 2);
    const std::string path = temp_path("streamed.json");
    std::ofstream(path) << "the earlier file\n";
    {
        dp::protocol::JobFileWriter writer(path, job);
        writer.add(job.requests[0]);
        // Not committed: the earlier file stays and no temporary file is left.
    }
    std::ifstream earlier(path);
    std::string line;
    std::getline(earlier, line);
    CHECK(line == "the earlier file");
    CHECK(access((path + ".tmp." + std::to_string(getpid())).c_str(), F_OK) != 0);
    {
        dp::protocol::JobFileWriter writer(path, job);
        writer.add(job.requests[0]);
        for (std::size_t i = 1; i < job.requests.size(); ++i)
            writer.add_line(dp::protocol::request_line(job.requests[i]));
        writer.commit();
    }
    check_same(job, read_job_file(path));
    std::ifstream in(path);
    std::size_t lines = 0;
    for (std::string l; std::getline(in, l);) ++lines;
    CHECK(lines == job.requests.size() + 2);  // the settings, a line per request, the end
    JobFile empty = job;
    empty.requests.clear();
    {
        dp::protocol::JobFileWriter writer(path, empty);
        writer.commit();
    }
    check_same(empty, read_job_file(path));
    std::remove(path.c_str());
}

TEST_CASE(
    "an image's parameters text is AUTOMATIC1111's, with separators quoted and settings not in effect left "
    "out") {
    Generation g;
    g.prompt = "a cat, sitting";
    g.negative_prompt = "blurry";
    g.seed = 42;
    g.steps = 28;
    g.width = 1024;
    g.height = 768;
    g.arguments.set("guidance_scale", 7.5);
    g.arguments.set("skip_guidance_layers", std::vector<int>{7, 8, 9});
    g.arguments.set("skip_layer_guidance_scale", 2.8);
    const ImageProvenance made_by{"sd3-medium", "guidance_scale"};
    CHECK(
        image_parameters(g, made_by) ==
        "a cat, sitting\nNegative prompt: blurry\nSteps: 28, Sampler: Euler, CFG scale: 7.5, Seed: 42, Size: "
        "1024x768, Model: sd3-medium, skip_guidance_layers: \"7,8,9\", skip_layer_guidance_scale: 2.8, "
        "Version: " +
            made_by_version());
    // No skipped blocks: neither they nor their scale are said; no negative prompt, no line for it.
    g.arguments.set("skip_guidance_layers", std::vector<int>{});
    g.negative_prompt.reset();
    const std::string plain = image_parameters(g, made_by);
    CHECK(plain.find("skip") == std::string::npos);
    CHECK(plain.find("Negative prompt") == std::string::npos);
    CHECK(plain.rfind("a cat, sitting\nSteps: 28,", 0) == 0);
    // The record: the request and the model, ASCII whatever the prompt.
    JobRequest r;
    static_cast<Generation&>(r) = g;
    r.prompt = "über";
    r.index = 3;
    r.file = "00003-ber.png";
    const std::string record = image_record_text(r, made_by);
    CHECK(record.find("\\u00fcber") != std::string::npos);
    for (unsigned char ch : record) CHECK(ch < 0x80);
    const nlohmann::json j = nlohmann::json::parse(record);
    CHECK(j["prompt"] == "über");
    CHECK(j["model"] == "sd3-medium");
    CHECK(j["index"] == 3);
    CHECK_FALSE(j.contains("skip_guidance_layers"));
}
