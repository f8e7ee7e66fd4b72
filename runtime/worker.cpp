#include "runtime/worker.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "protocol/atomic_file.h"
#include "protocol/image_parameters.h"
#include "protocol/job_file.h"
#include "protocol/rank_pool.h"
#include "protocol/status_events.h"
#include "protocol/write_all.h"
#include "runtime/image_sink.h"
#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/job_agreement.h"
#include "runtime/parallel/communicator.h"
#include "runtime/parallel/cuda_support.h"
#include "runtime/parallel/device_mapping.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/adapters.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/prompt_queue.h"
#include "runtime/rank_failure.h"
#include "strategies/cpu_dtype.h"
#include "strategies/device_map.h"
#include "strategies/mapped_files.h"
#include "strategies/mesh.h"
#include "strategies/model_config.h"
#include "strategies/model_sizes.h"

namespace dp::runtime {
namespace {

using protocol::JobFile;
using protocol::JobRequest;

int env_int(const char* name, int fallback, int lo, int hi) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < lo || n > hi)
        throw protocol::UsageError(std::string(name) + "='" + v + "': expected a whole number from " +
                                   std::to_string(lo) + " to " + std::to_string(hi) +
                                   " (dp-worker is started by dp-launch, which sets it)");
    return static_cast<int>(n);
}

// The launcher's status channel (fd DP_STATUS_FD): one event per line; silently nothing without one.
class StatusChannel {
  public:
    explicit StatusChannel(int fd) : fd_(fd) {}
    // Note [heartbeats are proof of life]: the launcher reads a heartbeat for the rank's phase
    // (which timeout applies) and, in a hang report, what it was doing; any status line shows the
    // rank alive. So a heartbeat of the phase last reported is left out when a line went less
    // than kHeartbeatInterval ago: at one step an image, two heartbeats an image would be most
    // of the launcher's work (docs/benchmarks.md, "At 100 000 prompts"), and a hang report is at most that
    // much out of date.
    void send(const protocol::StatusEvent& event) {
        if (fd_ < 0) return;
        const auto now = std::chrono::steady_clock::now();
        if (const auto* beat = std::get_if<protocol::HeartbeatEvent>(&event)) {
            // --progress json (the job file's step_events): each step is an event a CI reads.
            const bool step =
                every_step_ && beat->phase == protocol::RankPhase::kGenerating && beat->step > 0;
            if (!step && beat->phase == last_phase_ && now - last_sent_ < kHeartbeatInterval) return;
            last_phase_ = beat->phase;
        }
        last_sent_ = now;
        const std::string line = protocol::status_line(event);
        if (!protocol::write_all(fd_, line.data(), line.size()))
            fd_ = -1;  // the launcher is gone; keep working, it will stop us
    }

    void send_every_step() { every_step_ = true; }

  private:
    static constexpr std::chrono::milliseconds kHeartbeatInterval{100};
    int fd_;
    bool every_step_ = false;
    std::optional<protocol::RankPhase> last_phase_;
    std::chrono::steady_clock::time_point last_sent_{};
};

// Test only: DP_TEST_KILL_AT_STEP=RANK:STEP[:SIGNAL] makes rank RANK send itself SIGNAL (SIGKILL
// when it is left out) after its STEP-th denoising step (counted over all its prompts), so that
// the integration tests see what the other ranks of a group do when one dies in the middle of a
// collective, or, with SIGSTOP (19), change a file while the rank is held at a known step.
// Nothing sets it but those tests.
class TestKillSwitch {
  public:
    explicit TestKillSwitch(int rank) {
        const char* v = std::getenv("DP_TEST_KILL_AT_STEP");
        if (!v || !*v) return;
        int target = -1;
        const int n = std::sscanf(v, "%d:%lld:%d", &target, &at_step_, &signal_);
        if (n < 2 || at_step_ < 1 || signal_ < 1 || signal_ >= NSIG)
            throw protocol::UsageError(std::string("DP_TEST_KILL_AT_STEP='") + v +
                                       "': expected RANK:STEP[:SIGNAL] (a test-only setting)");
        armed_ = target == rank;
    }
    // Called after each denoising step.
    void step() {
        if (armed_ && ++steps_ == at_step_) ::raise(signal_);
    }
    bool armed() const { return armed_; }

  private:
    bool armed_ = false;
    long long at_step_ = 0;
    int signal_ = SIGKILL;
    long long steps_ = 0;
};

// Test only: DP_TEST_THREAD_THROWS=bad_alloc|runtime makes the rank throw that from a thread of
// its own before it joins the job, as a library's worker thread may, so that the integration
// tests see the terminate handler report it (Note [resource failures in a rank]).
void test_thread_failure() {
    const char* v = std::getenv("DP_TEST_THREAD_THROWS");
    if (!v || !*v) return;
    const std::string what = v;
    std::thread([what] {
        if (what == "bad_alloc") throw std::bad_alloc();
        throw std::runtime_error("a library's thread failed");
    }).join();
}

// Note [stopping at a step boundary]: SIGTERM, SIGINT or SIGHUP (dp-launch forwards them, e.g. when
// a scheduler preempts the job or a terminal closes) only sets a flag. The rank checks it between denoising
// steps and between batches, abandons the prompt it was making (an image is only ever written whole) and
// exits 128 + the signal; the launcher's manifest keeps every image reported before, so a
// --resume run makes the rest.
volatile sig_atomic_t g_stop_signal = 0;

// Note [stopped while connecting]: while a rank connects to the others (the store, its process
// groups), a stop signal ends it at once, with 128 + the signal: nothing of the job is under way,
// and a flag would be seen only after the store's connection retries (c10d logs each try a signal
// interrupts, with its C++ backtrace) or a lost peer's timeout. Its one line goes to stderr with
// write(2); when dp-launch sent the stop, it shows its own line instead (supervisor.cpp).
volatile sig_atomic_t g_exit_on_stop = 0;
char g_connecting_lines[3][160];  // for SIGTERM, SIGINT and SIGHUP, made before g_exit_on_stop is set

int connecting_line_of(int sig) { return sig == SIGTERM ? 0 : sig == SIGINT ? 1 : 2; }

[[noreturn]] void exit_while_connecting(int sig) {
    const char* line = g_connecting_lines[connecting_line_of(sig)];
    protocol::write_all(STDERR_FILENO, line, std::strlen(line));  // async-signal-safe: write(2) only
    ::_exit(128 + sig);
}

void on_stop_signal(int sig) {
    g_stop_signal = sig;
    if (g_exit_on_stop) exit_while_connecting(sig);
}

// Note [stopped while connecting]: from construction until end(), a stop signal (one that came
// before included) ends the rank at once.
class ExitOnStop {
  public:
    explicit ExitOnStop(int rank) {
        for (const int sig : {SIGTERM, SIGINT, SIGHUP})
            std::snprintf(g_connecting_lines[connecting_line_of(sig)], sizeof(g_connecting_lines[0]),
                          "dp-worker: rank %d stopped by SIG%s while connecting to the other ranks\n", rank,
                          sigabbrev_np(sig));
        g_exit_on_stop = 1;
        if (const int sig = g_stop_signal) exit_while_connecting(sig);
    }
    ExitOnStop(const ExitOnStop&) = delete;
    ExitOnStop& operator=(const ExitOnStop&) = delete;
    ~ExitOnStop() { end(); }
    void end() { g_exit_on_stop = 0; }
};

void install_stop_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGHUP, &sa, nullptr);
    // SIGUSR1 and SIGUSR2 (Slurm's --signal, a user's kill) are forwarded to every rank and change
    // nothing else (docs/launcher.md): a dp-worker has nothing to do on them, and their default
    // action would end it.
    signal(SIGUSR1, SIG_IGN);
    signal(SIGUSR2, SIG_IGN);
}

// Throws the rank's stop (exit code 128 + the signal) when a stop signal has arrived; `where` says
// what the rank leaves undone.
void stop_if_asked(int rank, const std::string& where) {
    const int sig = g_stop_signal;
    if (sig == 0) return;
    const char* name = sigabbrev_np(sig);
    throw Error("rank " + std::to_string(rank) + " stopped by SIG" + (name ? name : "?") + " " + where,
                128 + sig);
}

// Throws IoError (74) naming the first mapped file that changed since it was mapped (Note [files
// that change under a job], strategies/mapped_files.h).
void stop_if_files_changed() {
    const std::string why = strategies::changed_mapped_file();
    if (!why.empty()) throw protocol::IoError(why);
}

// device_map's plan as the executor's slots: the launcher's plan from the job file, or, when the
// budgets are the visible GPUs' free memory, planned here. Throws UsageError for a plan that
// cannot work.
std::shared_ptr<DeviceMapping> make_device_mapping(const JobFile& job, const strategies::ModelInfo& model,
                                                   int element_bytes) {
    const protocol::DeviceMapRequest& request = *job.device_map;
    strategies::DeviceMapPlan plan;
    if (request.plan) {
        plan = (*request.plan);
    } else {
        try {
            if (!request.max_memory.empty() || (request.spec != "balanced" && request.spec != "auto"))
                throw std::invalid_argument(
                    "the job file has no plan, and only budgets measured here may "
                    "be planned here (dp-launch plans the others)");
            std::vector<strategies::DeviceBudget> gpus;
            for (const auto& [device, bytes] : DeviceMapping::visible_gpu_budgets())
                gpus.push_back({device, bytes});
            if (gpus.size() < 2)
                throw std::invalid_argument(std::to_string(gpus.size()) +
                                            " GPU(s) visible; device_map needs two or more (to try it on the "
                                            "CPU, name CPU devices: --max-memory cpu:0=1GB,cpu:1=1GB)");
            plan = strategies::plan_device_map_spec(
                job.model_dir, *model.spec, element_bytes, request.spec, "", gpus, job.variant,
                strategies::components_left_out(job.model_dir, *model.spec, job.no_t5));
        } catch (const std::exception& e) {
            throw protocol::UsageError("--device-map " + request.spec + ": " + e.what());
        }
    }
    auto mapping = DeviceMapping::from_plan(plan, *model.spec, static_cast<std::size_t>(model.shape.layers));
    std::cerr << "dp-worker: device_map " << request.spec << ":\n"
              << strategies::describe_device_map(plan) << std::flush;
    return mapping;
}

GenerateRequest generate_request(const JobRequest& r) {
    GenerateRequest g;
    static_cast<protocol::Generation&>(g) = r;
    return g;
}

// The job's precision on `device`: --dtype auto is bf16 on a GPU, and on a CPU with bf16
// instructions for a transformer `width` features wide or more (Note [bf16 on a CPU that has it]);
// else fp32 (the launcher's launcher::expected_dtype says the same before the ranks start).
at::ScalarType run_dtype(const std::string& dtype, bool on_gpu, int64_t width) {
    if (dtype == "auto")
        return on_gpu || strategies::auto_bf16_on_cpu(strategies::cpu_bf16_instructions(), width)
                   ? at::kBFloat16
                   : at::kFloat;
    return dtype == "bf16" ? at::kBFloat16 : dtype == "fp16" ? at::kHalf : at::kFloat;
}

const char* dtype_name(at::ScalarType dtype) {
    return dtype == at::kBFloat16 ? "bf16" : dtype == at::kHalf ? "fp16" : "fp32";
}

// Whether device_map places the job on GPUs: the launcher's plan says, else the budgets are the
// visible GPUs'.
bool device_map_on_gpus(const JobFile& job) {
    const auto& plan = job.device_map->plan;
    if (!plan) return true;
    return std::any_of(plan->devices.begin(), plan->devices.end(),
                       [](const std::string& d) { return d.rfind("cuda", 0) == 0; });
}

// A problem of the request itself: that prompt fails, the rank goes on. Every other error ends
// the rank (a collective failure above all: after it the group's order is broken).
bool is_prompt_error(const Error& e) {
    return dynamic_cast<const ModelError*>(&e) != nullptr ||
           dynamic_cast<const protocol::InputDataError*>(&e) != nullptr;
}

// The rank's work once the job file is read. Returns its exit code; throws for what ends it.
// The pipeline options every rank of `job` shares (the device and dtype are each rank's own).
PipelineOptions pipeline_options(const JobFile& job, std::shared_ptr<const strategies::ModelInfo> model) {
    PipelineOptions po;
    static_cast<protocol::ModelLoad&>(po) = job;
    po.model_dir = job.model_dir;
    po.model = std::move(model);
    return po;
}

// This rank's device, dtype and device_map for `job` (Note [a model is read once]: `model` read
// once by the caller). Throws UsageError for a device the rank does not have.
void place_rank(const JobFile& job, int world, int local_rank, const strategies::ModelInfo& model,
                PipelineOptions& po) {
    const bool cuda = cuda_available();
    if (job.device_map && world != 1)
        throw protocol::UsageError("--device-map runs one process over several devices; the world has " +
                                   std::to_string(world) + " ranks");
    if (job.device_map) {
        po.dtype = run_dtype(job.dtype, device_map_on_gpus(job), model.shape.width());
        po.device_map = make_device_mapping(job, model, po.dtype == at::kFloat ? 4 : 2);
        po.device =
            po.device_map->devices[static_cast<std::size_t>(po.device_map->transformer_blocks.front())];
    }
    if (job.device == "cuda" && !cuda)
        throw protocol::UsageError(
            "--device cuda: no CUDA device is available to this rank; use --device cpu or auto");
    if (po.device_map) return;
    // The rank's GPU: cuda:LOCAL_RANK, or cuda:0 when the launcher gave this rank one device of its
    // own (CUDA_VISIBLE_DEVICES naming only its GPU, as with one scheduler task per rank).
    auto rank_cuda_device = [&]() {
        const int count = static_cast<int>(at::getNumGPUs());
        if (local_rank < count) return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
        if (count == 1) return at::Device(at::kCUDA, 0);
        const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
        throw protocol::UsageError(
            "LOCAL_RANK " + std::to_string(local_rank) + " has no GPU: " + std::to_string(count) +
            " CUDA device(s) are visible (CUDA_VISIBLE_DEVICES=" +
            (visible ? std::string(visible) : "unset") +
            "); start at most that many ranks per node, or give each rank its own GPU");
    };
    po.device = (job.device == "cpu" || !cuda) ? at::Device(at::kCPU) : rank_cuda_device();
    po.dtype = run_dtype(job.dtype, po.device.is_cuda(), model.shape.width());
}

// The rendezvous of rank `rank` of `world` from torchrun's environment and the job's timeouts.
CommunicatorOptions communicator_options(const JobFile& job, int rank, int world, const at::Device& device) {
    CommunicatorOptions co;
    co.rank = rank;
    co.world_size = world;
    if (const char* addr = std::getenv("MASTER_ADDR")) co.master_addr = addr;
    co.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
    co.backend = device.is_cuda() ? "nccl" : "gloo";
    co.timeout = std::chrono::milliseconds(static_cast<int64_t>(job.collective_timeout_s * 1000));
    if (const char* addr = std::getenv("DP_LOCAL_ADDR")) co.local_addr = addr;
    // Note [a node that never arrives]: a multi-node job's ranks join within --node-timeout.
    co.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(job.node_timeout_s * 1000));
    co.ranks_per_node = env_int("LOCAL_WORLD_SIZE", 0, 0, 1 << 20);
    return co;
}

// The GEMM and attention rates measured at a set of shapes (RankWork::phases), by those shapes.
using RateCache = std::map<std::string, std::pair<double, double>>;

// A rank's prompts through its pipeline: each batch the queue gives it generated, its images
// written (by the replica's writer) and reported on the status channel.
class RankWork {
  public:
    RankWork(const JobFile& job, const strategies::ModelInfo& model, int rank, StatusChannel& status,
             bool writer)
        : job_(job), rank_(rank), status_(status), writer_(writer), kill_switch_(rank) {
        made_by_.model = std::filesystem::path(job.model_dir).filename().string();
        if (const protocol::FamilyArgument* cfg = model.arguments.guidance_scale())
            made_by_.cfg_name = cfg->row->name;
        encoding_.format = image_format_named(job.image_format);
        encoding_.quality = job.quality;
    }

    // One unit of the queue: positions into the job's requests that share a batch.
    void run(const DiffusionPipeline& pipeline, const std::vector<std::size_t>& unit, bool dynamic) {
        std::vector<const JobRequest*> group;
        for (const std::size_t k : unit) group.push_back(&job_.requests[k]);
        const JobRequest& first = *group.front();
        if (dynamic) {
            protocol::TakeEvent take{rank_, {}};
            for (const JobRequest* r : group) take.indices.push_back(r->index);
            status_.send(take);
        }
        stop_if_asked(rank_, "before prompt " + std::to_string(first.index));
        stop_if_files_changed();
        status_.send(
            protocol::HeartbeatEvent{rank_, protocol::RankPhase::kGenerating, first.index, 0, first.steps});
        std::vector<GenerateRequest> requests;
        for (const JobRequest* r : group) {
            requests.push_back(generate_request(*r));
            const bool first_of_batch = r == group.front();
            requests.back().on_step = [this, &first, first_of_batch](int step, int steps) {
                if (kill_switch_.armed()) kill_switch_.step();
                if (!first_of_batch) return;  // one heartbeat per step of the batch
                status_.send(protocol::HeartbeatEvent{rank_, protocol::RankPhase::kGenerating, first.index,
                                                      step, steps});
                stop_if_asked(rank_, "after step " + std::to_string(step) + " of " + std::to_string(steps) +
                                         " of prompt " + std::to_string(first.index) + " (abandoned)");
            };
        }
        const auto start = std::chrono::steady_clock::now();
        std::vector<GenerateResult> results;
        try {
            results = pipeline.generate_batch(requests);
        } catch (const Error& e) {
            stop_if_files_changed();  // the cause, when a file changed under the batch
            if (!is_prompt_error(e)) throw;
            for (const JobRequest* r : group) fail(*r, e.what());
            return;
        }
        stop_if_files_changed();  // the images may hold other bytes than the job's records say
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
            static_cast<double>(group.size());
        add_phases(results.front().phases);
        const auto writing = std::chrono::steady_clock::now();
        for (std::size_t k = 0; k < group.size(); ++k) write(*group[k], results[k], ms);
        phases_.write_ms +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - writing).count();
    }
    int failed() const { return failed_; }

    // Note [phase split]: the rank's phases so far, with its load, and the rate its GEMMs reach
    // at its passes' shapes, measured now (within 3 % of its steps' time, at least 50 ms' worth),
    // or as `rates` holds them for these shapes (a warm rank's earlier job: Note [warm ranks]).
    protocol::PhasesEvent phases(double load_ms, at::ScalarType dtype, at::Device device, bool int8,
                                 RateCache& rates) {
        phases_.rank = rank_;
        phases_.load_ms = load_ms;
        std::string key = std::to_string(static_cast<int>(dtype)) + device.str() + (int8 ? "int8" : "");
        for (const strategies::GemmShape& g : shapes_.gemms)
            key += ";" + std::to_string(g.m) + "x" + std::to_string(g.k) + "x" + std::to_string(g.n);
        for (const strategies::AttentionShape& a : shapes_.attentions)
            key += ";" + std::to_string(a.queries) + "/" + std::to_string(a.keys);
        key += ";" + std::to_string(shapes_.heads) + "x" + std::to_string(shapes_.head_dim);
        if (const auto known = rates.find(key); known != rates.end()) {
            phases_.gemm_rate = known->second.first;
            phases_.attention_rate = known->second.second;
            return phases_;
        }
        const double budget_ms = std::max(25.0, 0.015 * phases_.steps_ms);
        if (!shapes_.gemms.empty())
            phases_.gemm_rate = measure_gemm_rate(shapes_.gemms, dtype, device, budget_ms, int8);
        if (!shapes_.attentions.empty())
            phases_.attention_rate = measure_attention_rate(shapes_.attentions, shapes_.heads,
                                                            shapes_.head_dim, dtype, device, budget_ms);
        rates[key] = {phases_.gemm_rate, phases_.attention_rate};
        return phases_;
    }

  private:
    void add_phases(const PhaseTimes& t) {
        phases_.encode_ms += t.encode_ms;
        phases_.steps_ms += t.steps_ms;
        phases_.gemm_ms += t.gemm_ms;
        phases_.attention_ms += t.attention_ms;
        phases_.decode_ms += t.decode_ms;
        phases_.passes += t.passes;
        phases_.flops += t.flops;
        phases_.gemm_flops += t.gemm_flops;
        if (!t.gemms.empty()) shapes_ = t;  // the last batch's shapes stand for the job's
    }

    void fail(const JobRequest& r, const std::string& why) {
        if (!writer_) return;
        ++failed_;
        std::cerr << "prompt " << r.index << ": " << why << std::endl;
        status_.send(protocol::FailedEvent{rank_, r.index, why});
    }

    // One result: its image file and event, or its failure; the writer's only.
    void write(const JobRequest& r, const GenerateResult& result, double ms) {
        if (!writer_) return;
        for (const std::string& w : result.warnings)
            std::cerr << "prompt " << r.index << ": " << w << std::endl;
        if (job_.cache_report && !result.cache_metrics.empty()) {
            // Note [first block cache]: each branch's relative change per pass, to choose a threshold by.
            std::string line = "prompt " + std::to_string(r.index) + ": first-block changes";
            for (std::size_t b = 0; b < result.cache_metrics.size(); ++b) {
                if (result.cache_metrics[b].empty()) continue;
                line += b == 0 ? " (negative branch)" : " (positive branch)";
                for (double m : result.cache_metrics[b])
                    line += " " + (m < 0 ? std::string("-") : std::to_string(m));
            }
            std::cerr << line << std::endl;
        }
        if (!result.error.empty()) return fail(r, result.error);  // no valid image: not a black PNG
        const int width = static_cast<int>(result.image.size(1));
        const int height = static_cast<int>(result.image.size(0));
        // Note [image metadata]: the file says how it was made, at its own size.
        ImageEncoding encoding = encoding_;
        protocol::JobRequest made = r;
        made.width = width, made.height = height;
        encoding.parameters = protocol::image_parameters(made, made_by_);
        encoding.record = protocol::image_record_text(made, made_by_);
        const WrittenImage img = write_image_atomically(
            job_.output_dir + "/" + r.file, result.image.data_ptr<uint8_t>(), width, height, encoding);
        // DP_SAVE_LATENTS=1 (the job file's save_latents): each image's final latents (fp32, before
        // decoding) beside it, as NAME.png.latents.safetensors, to compare runs more finely than by pixels.
        if (job_.save_latents)
            save_safetensors(job_.output_dir + "/" + r.file + ".latents.safetensors",
                             {{"latents", result.latents}}, {{"prompt", r.prompt}});
        status_.send(protocol::ImageEvent{rank_, r.index, r.file, img.sha256, ms, width, height,
                                          result.computed_steps, result.mag_ratios});
    }

    const JobFile& job_;
    const int rank_;
    StatusChannel& status_;
    const bool writer_;
    TestKillSwitch kill_switch_;
    protocol::ImageProvenance made_by_;
    ImageEncoding encoding_;
    int failed_ = 0;
    protocol::PhasesEvent phases_;
    PhaseTimes shapes_;
};

// A rank joined to its group with its model's settings: what it keeps from one job to the next
// (Note [warm ranks]). The batch job's rank makes one and runs its one job on it.
class RankSession {
  public:
    // Reads the model, places the rank and connects it to the others for `job`'s settings. A stop
    // signal ends the rank at once from here until its first job's queue is made (Note [stopped
    // while connecting]).
    RankSession(const JobFile& job, int rank) : rank_(rank) {
        world_ = env_int("WORLD_SIZE", 1, 1, 1 << 24);
        const int local_rank = env_int("LOCAL_RANK", 0, 0, 1 << 24);
        if (rank >= world_)
            throw protocol::UsageError("RANK " + std::to_string(rank) + " is not below WORLD_SIZE " +
                                       std::to_string(world_));
        if (job.mesh.product() != world_)
            throw protocol::UsageError("the job file's mesh (dp x cfg x ring x ulysses x tp = " +
                                       std::to_string(job.mesh.product()) + ") does not match WORLD_SIZE " +
                                       std::to_string(world_));
        // The model, read once here (Note [a model is read once]); it must still be the family the
        // launcher read.
        model_ = std::make_shared<const strategies::ModelInfo>(strategies::read_model_info(job.model_dir));
        if (model_->family != job.family)
            throw ModelError(job.model_dir + ": the folder's model is now " + model_->family_name + " (" +
                             model_->family + "), but dp-launch started the job for " + job.family +
                             "; run dp-launch again");
        po_ = pipeline_options(job, model_);
        // Adapters only where a prompt asks for them: their state keeps each component's weight files
        // mapped, for switches in place (Note [adapter switches]). Warm ranks keep it for any job.
        for (const protocol::JobRequest& r : job.requests)
            if (!r.arguments.adapters("lora").empty()) po_.adapters = std::make_shared<AdapterState>();
        if (std::getenv(protocol::kPoolDirVariable)) po_.adapters = std::make_shared<AdapterState>();
        place_rank(job, world_, local_rank, *model_, po_);
        const CommunicatorOptions co = communicator_options(job, rank, world_, po_.device);
        ensure_open_file_headroom(world_, co.backend == "gloo");  // Note [resource failures in a rank]
        test_thread_failure();
        connecting_.emplace(rank);  // Note [stopped while connecting]
        comm_.emplace(co);
        keep_library_errors_thrown();  // Note [resource failures in a rank]
        settings_ = model_settings(job);
    }

    // Whether `job` runs on this rank's model and group as they are: every setting but its
    // requests, output folder, schedule, id and diagnostics is the first job's.
    bool same_settings(const JobFile& job) const { return model_settings(job) == settings_; }

    // Runs `job` on the session, reporting on `status`. Returns the rank's exit code; throws for
    // what ends the rank.
    int run(const JobFile& job, StatusChannel& status) {
        // Before anything is loaded: the same job on every node (Note [one job on every node]).
        const std::string job_id = agree_on_job(job, *comm_, rounds_++);
        status.send(protocol::JoinedEvent{rank_, job_id});
        // Every rank forms its sub-groups here, in the same order, so none waits on another.
        if (!parallel_) parallel_.emplace(*comm_, strategies::Mesh(world_, job.mesh));
        PromptQueue queue(job, *model_, *parallel_, *comm_, job_id);
        RankWork work(job, *model_, rank_, status, parallel_->writes_outputs());
        connecting_.reset();
        status.send(protocol::StartEvent{rank_, po_.device.str(), queue.share().begin, queue.share().size(),
                                         dtype_name(po_.dtype), job.schedule});
        if (queue.has_work()) {
            double load_ms = 0;
            if (!pipeline_) {
                status.send(protocol::HeartbeatEvent{rank_, protocol::RankPhase::kLoading, -1, 0, 0});
                PhaseClock loading(po_.device);
                pipeline_ = load_pipeline(po_, *parallel_);
                load_ms = loading.lap_ms();
            }
            while (const std::vector<std::size_t>* unit = queue.next())
                work.run(*pipeline_, *unit, queue.dynamic());
            status.send(work.phases(load_ms, po_.dtype, po_.device, po_.quantize == "int8", rates_));
        }
        // Every rank, with prompts or without, meets the others before leaving.
        stop_if_asked(rank_, "after its share");
        status.send(protocol::HeartbeatEvent{rank_, protocol::RankPhase::kWaiting, -1, 0, 0});
        comm_->barrier();
        if (job.comm_report) report_communication();
        // A prompt that failed is in the manifest and makes dp-launch exit 1; the rank itself did
        // its job, so it exits 0 (a non-zero exit would stop the group, or restart it with
        // --max-restarts).
        if (work.failed() > 0)
            std::cerr << "rank " << rank_ << ": " << work.failed() << " prompt(s) failed" << std::endl;
        return protocol::kExitOk;
    }

  private:
    // `job` as the job file says it, less what may differ between two jobs of one session.
    static nlohmann::json model_settings(const JobFile& job) {
        nlohmann::json j = job;
        for (const char* key : {"requests", "output_dir", "schedule", "job_id", "save_latents",
                                "cache_report", "comm_report", "step_events"})
            j.erase(key);
        return j;
    }

    void report_communication() const {
        // Bytes this rank sent, per kind of collective, over every group it belongs to (the
        // figures docs/strategies.md's communication formulas predict).
        const std::map<std::string, uint64_t> total = parallel_->bytes();
        std::string line = "dp-worker: rank " + std::to_string(rank_) + " communication bytes:";
        for (const auto& [kind, n] : total) line += " " + kind + "=" + std::to_string(n);
        std::cerr << line << std::endl;
        if (po_.device_map)
            std::cerr << "dp-worker: device_map moved " << po_.device_map->moved_bytes() << " bytes in "
                      << po_.device_map->moves() << " moves between devices" << std::endl;
    }

    const int rank_;
    int world_ = 1;
    std::shared_ptr<const strategies::ModelInfo> model_;
    PipelineOptions po_;
    std::optional<ExitOnStop> connecting_;
    std::optional<Communicator> comm_;
    std::optional<ParallelContext> parallel_;
    std::shared_ptr<const DiffusionPipeline> pipeline_;
    nlohmann::json settings_;
    int rounds_ = 0;   // jobs run: each agrees under keys of its own
    RateCache rates_;  // measured by its jobs, reused by the next at the same shapes
};

// The rank's work once the job file is read. Returns its exit code; throws for what ends it.
int run_rank(const JobFile& job, int rank, StatusChannel& status) {
    RankSession session(job, rank);
    return session.run(job, status);
}

}  // namespace

// The rank's failure on stderr and its status channel; its exit code. A resource failure names
// the rank (Note [resource failures in a rank]).
static int report_failure(int rank, std::optional<StatusChannel>& status, const RankFailure& f) {
    const std::string message =
        f.code == protocol::kExitSystem ? "rank " + std::to_string(rank) + ": " + f.message : f.message;
    std::cerr << "dp-worker: " << message << std::endl;
    if (status) status->send(protocol::RankErrorEvent{rank, f.code, message});
    return f.code;
}

// What ended the rank: a file the job maps that changed under it, whatever error that caused
// (Note [files that change under a job]); else `e` as classify_rank_failure sees it.
static RankFailure failure_of(const std::exception& e, int code, const std::string& what) {
    const std::string changed = strategies::changed_mapped_file();
    if (!changed.empty()) return {strategies::kExitFileChanged, changed};
    return classify_rank_failure(e, code, what);
}

// Note [allocations kept for the next step]: a denoising step allocates and frees the same large
// activations every time (a block's MLP input, a VAE's feature maps of tens of MB). glibc serves a
// block above its mmap threshold (32 MB at most by its own adjustment) with a fresh mapping, and
// gives the top of its heap back to the kernel above its trim threshold: each step then faults in
// and zeroes those pages again. Measured on the medium FLUX.1-dev (docs/benchmarks.md, "Close to
// the machine's limit"): the steps 9 % and the VAE's decode 48 % faster when the heap keeps them.
// The rank's peak memory is unchanged; it is not given back between steps.
static void keep_freed_memory() {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

int run_worker(const std::string& job_path) {
    int rank = 0;
    std::optional<StatusChannel> status;
    keep_freed_memory();
    install_stop_handlers();
    strategies::guard_mapped_files("dp-worker: ");  // before any file is mapped
    try {
        rank = env_int("RANK", 0, 0, 1 << 24);
        const int status_fd = env_int("DP_STATUS_FD", -1, -1, 1 << 20);
        status.emplace(status_fd);
        install_rank_terminate_handler(rank, status_fd);
        const JobFile job = protocol::read_job_file(job_path, strategies::check_job_family);
        if (job.step_events) status->send_every_step();
        return run_rank(job, rank, *status);
    } catch (const Error& e) {
        return report_failure(rank, status, failure_of(e, e.exit_code(), e.what()));
    } catch (const std::exception& e) {
        // Not one of our errors: a resource the system refused (Note [resource failures in a
        // rank]), else a broken promise in our code or a library's, never the input.
        return report_failure(
            rank, status, failure_of(e, protocol::kExitInternal, std::string("internal error: ") + e.what()));
    }
}

namespace {

// One job of a warm rank (Note [warm ranks]): its status events to the request's FIFO, its exit
// code to the request's exit file. The session is made by the first job and kept.
int run_pool_job(const protocol::PoolRequest& request, int rank, std::optional<RankSession>& session) {
    // dp-attach holds the FIFO open for reading: opening it for writing does not wait. When it
    // cannot be opened, the job's dp-attach is gone, and so is the job.
    const int fd = ::open(request.status.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        std::cerr << "dp-worker: rank " << rank << ": the job's status channel " << request.status
                  << " is gone; the job is skipped" << std::endl;
        return protocol::kExitOk;
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a full pipe waits for its reader
    std::optional<StatusChannel> status(std::in_place, fd);
    int code = protocol::kExitOk;
    try {
        const JobFile job = protocol::read_job_file(request.job, strategies::check_job_family);
        if (job.step_events) status->send_every_step();
        if (!session)
            session.emplace(job, rank);
        else if (!session->same_settings(job))
            throw protocol::UsageError(
                "the job's model settings are not the warm ranks' (a server runs one model and one set of "
                "flags; start it again to change them)");
        code = session->run(job, *status);
    } catch (const Error& e) {
        code = report_failure(rank, status, failure_of(e, e.exit_code(), e.what()));
    } catch (const std::exception& e) {
        code = report_failure(
            rank, status, failure_of(e, protocol::kExitInternal, std::string("internal error: ") + e.what()));
    }
    try {
        protocol::write_file_atomically(request.exit, std::to_string(code) + "\n");
    } catch (const std::exception& e) {
        std::cerr << "dp-worker: rank " << rank << ": " << e.what() << std::endl;
        code = protocol::kExitIo;
    }
    status.reset();
    ::close(fd);
    return code;
}

}  // namespace

int run_pool(const std::string& pool) {
    int rank = 0;
    keep_freed_memory();
    install_stop_handlers();
    strategies::guard_mapped_files("dp-worker: ");  // before any file is mapped
    try {
        rank = env_int("RANK", 0, 0, 1 << 24);
        install_rank_terminate_handler(rank, -1);
        std::filesystem::create_directories(protocol::pool_rank_dir(pool, rank));
        protocol::write_file_atomically(protocol::pool_pid_path(pool, rank),
                                        std::to_string(::getpid()) + "\n");
    } catch (const std::exception& e) {
        std::cerr << "dp-worker: rank " << rank << ": cannot wait for jobs in " << pool << ": " << e.what()
                  << std::endl;
        return protocol::kExitIo;
    }
    std::optional<RankSession> session;
    for (;;) {
        std::optional<protocol::PoolRequest> request;
        try {
            request = protocol::take_pool_request(pool, rank);
        } catch (const Error& e) {
            std::cerr << "dp-worker: rank " << rank << ": " << e.what() << std::endl;
            return e.exit_code();
        }
        if (!request) {
            if (const int sig = g_stop_signal) return 128 + sig;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            continue;
        }
        // A job that did not end well may have left the group mid-collective: the rank ends, and
        // the server starts the group again.
        if (const int code = run_pool_job(*request, rank, session); code != protocol::kExitOk) return code;
    }
}

int check_model(const std::string& job_path) {
    // Note [checking a model before the ranks start]: the pipeline's own load, in check mode.
    try {
        const JobFile job = protocol::read_job_file(job_path, strategies::check_job_family);
        PipelineOptions po = pipeline_options(
            job, std::make_shared<const strategies::ModelInfo>(strategies::read_model_info(job.model_dir)));
        po.device = at::Device(at::kCPU);
        po.dtype = at::kFloat;
        po.check_only = true;
        load_pipeline(po, ParallelContext::single());
        return 0;
    } catch (const Error& e) {
        std::cerr << "dp-worker: " << e.what() << std::endl;
        return e.exit_code();
    } catch (const std::exception& e) {
        const RankFailure f =
            classify_rank_failure(e, protocol::kExitInternal, std::string("internal error: ") + e.what());
        std::cerr << "dp-worker: " << f.message << std::endl;
        return f.code;
    }
}

}  // namespace dp::runtime
