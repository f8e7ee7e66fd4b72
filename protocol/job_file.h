#pragma once
// The job file: everything a rank of the main job is told, written once by dp-launch and read by
// every dp-worker (`dp-worker --job FILE`). The worker has no settings of its own on its command
// line; a new pipeline setting is one field here, filled by the launcher, used by the worker.
// One struct, one serialisation (to_json / from_json below), used by both sides.
//
//   {"format": "dp-launch job", "version": 2, "model_dir": "...", "random_weights": 7,
//    "output_dir": "...", "dtype": "auto", "device": "auto", "batch_size": 1, "variant": "",
//    "no_t5": false, "offload": false, "keep_quantized": false (optional),
//    "mesh": {"dp": 2, "cfg": 1, "ring": 1, "ulysses": 1, "tp": 2}, "collective_timeout_s": 300,
//    "schedule": "dynamic",
//    "device_map": {"spec": "auto", "max_memory": "cpu:0=1GB,cpu:1=1GB",
//                   "plan": {"devices": ["cpu:0", "cpu:1"],
//                            "placements": [{"component": "vae", "block": -1, "device": "cpu:1",
//                                            "bytes": 1024}, ...]}},
//    "family": "sd3",
//    "requests": [{"index": 0, "file": "00000-a-cat.png", "prompt": "a cat", "negative_prompt": "",
//                  "seed": 0, "steps": 28, "width": 0, "height": 0, ...the family's call
//                  arguments by name (call_arguments.h)...}, ...]}
//
// random_weights, schedule and device_map are optional; so is device_map.plan (absent: the budgets are the
// worker's visible GPUs' free memory, which only the worker can measure); so are the diagnostics
// "save_latents", "cache_report" and "comm_report" (absent: false). std and nlohmann/json only.

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/atomic_file.h"
#include "protocol/call_arguments.h"
#include "protocol/job_layout.h"

namespace dp::protocol {

inline constexpr const char* kJobFileFormat = "dp-launch job";
// Raised whenever a field changes meaning or a required one is added: a worker refuses a job file
// of another version rather than guess.
// 2: variant, no_t5 and each request's max_sequence_length and skip-layer guidance are required;
// dtype may be "auto".
// 3: each request's true CFG scale is required, and its negative_prompt may be null (none given:
// Qwen-Image then runs no negative branch); max_sequence_length goes to 1024; offload is required.
// 4: the model's family is required, and each request holds that family's call arguments only.
inline constexpr int kJobFileVersion = 4;
// How long a rank waits in one collective (and for the rendezvous) before it gives up with
// CommunicationError, exit code 75.
inline constexpr double kDefaultCollectiveTimeoutS = 300;

struct DeviceMapRequest {
    std::string spec;                   // balanced, auto or FILE.json
    std::string max_memory;             // "DEV=SIZE,..."; empty: the visible GPUs' free memory
    std::optional<DeviceMapPlan> plan;  // the launcher's plan, when it could make one
};

// One prompt with every setting resolved by the launcher.
// What one image is made from: the pipeline's call, as the launcher resolves it and the worker's
// pipeline takes it (runtime's GenerateRequest is this and a step callback).
struct Generation {
    std::string prompt;
    // nullopt: none given (diffusers' negative_prompt=None). SD3 then uses "" (its default);
    // Qwen-Image and FLUX run no negative branch.
    std::optional<std::string> negative_prompt;
    uint64_t seed = 0;
    int steps = 28;
    int width = 0;  // 0: the model's default
    int height = 0;
    // Each call argument of the family by diffusers' name (Note [one call-argument table],
    // call_arguments.h): guidance_scale, max_sequence_length, skip_guidance_layers, ...; one left
    // out takes the model's default, as a diffusers pipeline's keyword does.
    CallValues arguments;
};

// One prompt of the job file with every setting resolved by the launcher.
struct JobRequest : Generation {
    int64_t index = 0;  // the prompt's index in the prompt file
    std::string file;   // the image's name inside output_dir: no '/', never starting with '.'
};

// The batch rule: whether two calls may go through the model together: the same steps, size,
// presence of a negative prompt (where it counts: `negative_counts`) and every call argument that
// does not allow a shared batch (each keeps its own prompt, seed and noise). The launcher's queue
// and the worker's pipeline both ask it, of calls whose arguments are complete.
bool same_batch_settings(const Generation& a, const Generation& b, bool negative_counts = true);

// Whether `name` may be a weight variant: empty (none), or up to 64 letters, digits, '_' and '-'
// (diffusers' fp16, bf16, non_ema), so that NAME.VARIANT.safetensors stays one file name.
bool is_variant_name(const std::string& name);

struct JobFile : ModelLoad {
    std::string model_dir;
    // The model's family as the launcher read it (strategies' family id: "sd3", "flux",
    // "flux-schnell", "qwen-image"); the worker refuses a folder that now says another.
    std::string family;
    std::string output_dir;
    std::string dtype =
        "auto";  // auto (bf16 on a GPU, fp32 on the CPU: the worker resolves it), fp32, bf16, fp16
    std::string device = "auto";  // auto, cpu, cuda
    int batch_size = 1;           // consecutive requests with the same settings generated together
    MeshDegrees mesh;
    double collective_timeout_s = kDefaultCollectiveTimeoutS;
    // Several nodes: how long rank 0 waits for every rank to join the job's store (--node-timeout;
    // Note [a node that never arrives]). Optional in the file: 0 is the collective timeout.
    double node_timeout_s = 0;
    std::optional<DeviceMapRequest> device_map;  // nullopt: everything on one device
    // How the replicas share the requests: "static" (each a contiguous share, accelerate's rule) or
    // "dynamic" (each takes the next batch from the job's queue when free, costliest first; Note
    // [dynamic schedule] in runtime/worker.cpp). Optional in the file: absent is static.
    std::string schedule = "static";
    // How the images are written (--format, --quality): "png", "jpeg" or "webp", and the JPEG or
    // WebP quality from 1 to 100. Optional in the file: absent is png.
    std::string image_format = "png";
    int quality = 90;
    std::vector<JobRequest> requests;  // in the order the ranks split them
    // Diagnostics, optional in the file (absent: false), which the launcher sets from its own
    // environment as the worker read them from its own: each image's final latents beside it
    // (DP_SAVE_LATENTS), each image's step-cache report (DP_CACHE_REPORT), each rank's bytes sent
    // per collective kind (DP_COMM_REPORT). Written only when set.
    bool save_latents = false;
    bool cache_report = false;
    bool comm_report = false;
    // --progress json: every denoising step's heartbeat is sent (not one per 100 ms), each a
    // progress event.
    bool step_events = false;
    // The writing dp-launch's id for this run. Every launcher of a multi-node job writes its own;
    // rank 0's is the job's (JoinedEvent), and it is not one of the settings the nodes compare.
    std::string job_id;
};

void to_json(nlohmann::json& j, const JobRequest& request);
void to_json(nlohmann::json& j, const JobFile& job);
// Throws InputDataError naming the key that is missing, of the wrong type, out of range or
// unknown, and a file of another format or version.
void from_json(const nlohmann::json& j, JobFile& job);

// Writes `job` to `path` through a temporary file and a rename (Note [atomic file]). Throws IoError.
void write_job_file(const std::string& path, const JobFile& job);

// A request as the job file holds it: one line of JSON (to_json's), no newline.
std::string request_line(const JobRequest& request);

// Writes a job file a request at a time, so that the writer never holds the whole file: the
// settings of `header` (its requests are not written), then each add()ed request on a line of its
// own, all to PATH.tmp.PID, which commit() renames over `path`. Without commit() the temporary
// file is removed and `path` stays as it was. Throws IoError.
class JobFileWriter {
  public:
    JobFileWriter(std::string path, const JobFile& header);

    void add(const JobRequest& request) { add_line(request_line(request)); }
    // `line`: request_line's text of a request.
    void add_line(std::string_view line);
    void commit();

  private:
    AtomicFile file_;  // Note [atomic file]
    bool first_ = true;
};
// Throws Error (kExitNoInput) when `path` cannot be read, InputDataError "PATH: KEY: why" when it
// is not a job file this build reads. `check` (when given) checks what the contract leaves to the
// reader's side, the model family and the call arguments it takes (strategies::check_job_family),
// its InputDataError named "PATH: ..." as the others.
JobFile read_job_file(const std::string& path, const std::function<void(const JobFile&)>& check = nullptr);

}  // namespace dp::protocol
