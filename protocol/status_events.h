#pragma once
// The status events a rank writes on its status channel (the pipe named by DP_STATUS_FD), one JSON
// object per line, "event" naming the kind. One serialisation (status_line / parse_status_line),
// used by dp-worker's StatusChannel and dp-launch's JobMonitor. std and nlohmann/json only.
//
//   {"event": "start", "rank": 0, "device": "cpu", "dtype": "fp32", "first": 0, "count": 3}
//   {"event": "start", "rank": 0, "device": "cpu", "first": 0, "count": 0, "schedule": "dynamic"}
//   {"event": "take", "rank": 0, "indices": [7, 3]}
//   {"event": "image", "rank": 0, "index": 4, "file": "00004-x.png", "sha256": "...", "ms": 812.5,
//    "width": 16, "height": 16}
//   {"event": "failed", "rank": 0, "index": 5, "error": "..."}
//   {"event": "error", "rank": 1, "exit_code": 75, "message": "all_reduce on group ... timed out"}
//   {"event": "heartbeat", "rank": 0, "phase": "generating", "index": 4, "step": 3, "steps": 28}
//   {"event": "joined", "rank": 2, "job_id": "host-1234-5678"}
//   {"event": "phases", "rank": 0, "load_ms": 210.5, "encode_ms": 40.1, "steps_ms": 3120.0,
//    "decode_ms": 300.2, "write_ms": 12.9, "passes": 16, "flops": 2.1e12, "gemm_flops": 1.9e12,
//    "gemm_rate": 9.4e11, "attention_rate": 6.1e11, "gemm_ms": 2050.3, "attention_ms": 810.7}

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dp::protocol {

// The rank has joined the group and takes requests [first, first + count) of the job file (its
// replica's share; every rank of a replica takes the same ones). Under the dynamic schedule it has
// no fixed share (first and count are 0): it says what it takes in TakeEvents.
struct StartEvent {
    int rank = 0;
    std::string device;  // where its model runs: "cpu", "cuda:1", ...
    int64_t first = 0;
    int64_t count = 0;
    // The precision its model runs in (fp32, bf16, fp16: --dtype auto resolved on the rank's
    // device); empty: not said (the key is optional).
    std::string dtype;
    // "static" or "dynamic" (the job file's schedule); empty: not said, which is static.
    std::string schedule;
};

// Under the dynamic schedule: the rank's replica took these prompts (their indices, in the order it
// makes them) from the job's queue; each ends in an image, failed or not_run event.
struct TakeEvent {
    int rank = 0;
    std::vector<int64_t> indices;
};

// The image of request `index` (the prompt's index) is written, under its final name.
struct ImageEvent {
    int rank = 0;
    int64_t index = 0;
    std::string file;
    std::string sha256;
    double ms = 0;  // generation time, per image of its batch
    int width = 0;
    int height = 0;
    // With a step cache (Note [step cache setting]): the transformer passes computed in full, each
    // guidance branch's counted; -1: no cache (the key is optional).
    int64_t computed_steps = -1;
    // MagCache calibration (Note [step cache setting]): the image's ratio at each step; else empty.
    std::vector<double> mag_ratios{};
};

// The model could not make request `index` (a ModelError for that prompt); the rank goes on.
struct FailedEvent {
    int rank = 0;
    int64_t index = 0;
    std::string error;
};

// The rank stops with `exit_code` (README "Exit codes"), e.g. 75 after a collective failed or
// timed out. Its replica's unfinished requests are not run; none of them failed.
struct RankErrorEvent {
    int rank = 0;
    int exit_code = 1;
    std::string message;
};

// What a rank is doing when it sends a heartbeat.
enum class RankPhase {
    kLoading,     // reading the model's weights
    kGenerating,  // denoising prompt `index`: `step` of `steps` done
    kWaiting,     // its share is done; it waits for the other ranks before leaving
};
const char* phase_name(RankPhase phase);  // "loading", "generating", "waiting"

// The rank is alive and making progress: sent when loading starts, before each batch (step 0)
// and after each denoising step. dp-launch stops the job when a rank sends nothing for longer
// than --rank-timeout (--load-timeout while it loads; never while it waits).
struct HeartbeatEvent {
    int rank = 0;
    RankPhase phase = RankPhase::kLoading;
    int64_t index = -1;  // the prompt being generated; -1 outside kGenerating
    int step = 0;
    int steps = 0;
};

// "loading", "step 3 of 28 of prompt 4", "waiting for the other ranks".
std::string describe(const HeartbeatEvent& beat);

// The rank has joined the job's group and agreed with every other rank on the job (the same
// settings and prompts, Note [one job on every node] in runtime/job_agreement.h). `job_id` is rank
// 0's launcher's: how the launchers of a multi-node job name the files they share.
struct JoinedEvent {
    int rank = 0;
    std::string job_id;
};

// Note [phase split]: where the rank's time went, sent once when its work is done: the model's
// load, the encoders (the prompts' text, an edit's image), the denoising steps, the VAE's decode
// and the image files' writes, in milliseconds; the transformer passes it ran and their FLOPs (its
// share of them, Note [FLOPs of a pass] in strategies/pass_flops.h); and the rate its device's
// GEMMs reach at those passes' shapes (FLOP/s; 0: not measured). steps' FLOP rate over gemm_rate
// is the job's model FLOPs utilisation (MFU). gemm_ms and attention_ms: the steps' time in their
// GEMMs and attention kernels, timed where they ran (the CPU; Note [kernel time in the steps] in
// runtime/parallel/kernel_time.h); 0 where they were not (a GPU, an older rank).
struct PhasesEvent {
    int rank = 0;
    double load_ms = 0, encode_ms = 0, steps_ms = 0, decode_ms = 0, write_ms = 0;
    int64_t passes = 0;
    double flops = 0, gemm_flops = 0;  // all of the passes' FLOPs; of them, the weight products'
    double gemm_rate = 0;
    double attention_rate = 0;  // the rate of its attention kernel at the passes' shapes (0: not measured)
    double gemm_ms = 0, attention_ms = 0;
};

using StatusEvent = std::variant<StartEvent, ImageEvent, FailedEvent, RankErrorEvent, HeartbeatEvent,
                                 JoinedEvent, TakeEvent, PhasesEvent>;

// The event as one line, ending in '\n'. Text that is not UTF-8 is replaced, never refused; a
// message is cut to a few KiB, so that a line always stays far below the launcher's line bound.
std::string status_line(const StatusEvent& event);

// A line of the channel (with or without its '\n'). nullopt: not a status event (a rank may write
// other things on the channel). Throws InputDataError naming the key for an event whose fields
// are wrong.
std::optional<StatusEvent> parse_status_line(std::string_view line);

}  // namespace dp::protocol
