#include "runtime/worker.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "runtime/communicator.h"
#include "runtime/device_mapping.h"
#include "runtime/errors.h"
#include "runtime/image_sink.h"
#include "runtime/models/sd3_transformer.h"
#include "runtime/pipeline.h"
#include "runtime/split.h"
#include "runtime/tensor_io.h"
#include "strategies/device_map.h"
#include "strategies/mesh.h"
#include "strategies/model_sizes.h"

namespace dp::runtime {
namespace {

int env_int(const char* name, int fallback, int lo, int hi) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < lo || n > hi)
        throw Error(std::string(name) + "='" + v + "': expected a whole number from " + std::to_string(lo) +
                        " to " + std::to_string(hi) + " (dp-worker is started by dp-launch, which sets it)",
                    2);
    return static_cast<int>(n);
}

struct Request {
    int64_t index = 0;
    GenerateRequest generate;
    std::string file;
};

std::vector<Request> read_requests(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot read the request list", 74);
    std::vector<Request> out;
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (line.empty()) continue;
        try {
            const nlohmann::json j = nlohmann::json::parse(line);
            Request r;
            r.index = j.at("index").get<int64_t>();
            r.generate.prompt = j.at("prompt").get<std::string>();
            r.generate.negative_prompt = j.at("negative_prompt").get<std::string>();
            r.generate.seed = j.at("seed").get<uint64_t>();
            r.generate.steps = j.at("steps").get<int>();
            r.generate.guidance_scale = j.at("guidance_scale").get<double>();
            r.generate.width = j.at("width").get<int>();
            r.generate.height = j.at("height").get<int>();
            r.file = j.at("file").get<std::string>();
            if (r.file.empty() || r.file.find('/') != std::string::npos || r.file[0] == '.')
                throw std::runtime_error("bad file name");
            out.push_back(std::move(r));
        } catch (const std::exception& e) {
            throw Error(path + ":" + std::to_string(line_no) + ": not a request written by dp-launch (" +
                            e.what() + ")",
                        65);
        }
    }
    return out;
}

// One JSON line per event on the launcher's status channel; silently nothing without one.
class StatusChannel {
  public:
    StatusChannel() : fd_(env_int("DP_STATUS_FD", -1, -1, 1 << 20)) {}
    void send(const nlohmann::json& event) {
        if (fd_ < 0) return;
        std::string line = event.dump() + "\n";
        const char* p = line.data();
        std::size_t n = line.size();
        while (n > 0) {
            const ssize_t w = ::write(fd_, p, n);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                fd_ = -1;  // the launcher is gone; keep working, it will stop us
                return;
            }
            p += w;
            n -= static_cast<std::size_t>(w);
        }
    }

  private:
    int fd_;
};

// device_map's plan as the executor's slots: budgets from --max-memory or the visible GPUs, or a
// map written by hand. Throws Error (exit 2) for a plan that cannot work.
std::shared_ptr<DeviceMapping> make_device_mapping(const WorkerOptions& o, int element_bytes) {
    strategies::DeviceMapPlan plan;
    try {
        std::vector<strategies::DeviceBudget> gpus;
        if (o.max_memory.empty() && (o.device_map == "balanced" || o.device_map == "auto")) {
            for (const auto& [device, bytes] : DeviceMapping::visible_gpu_budgets())
                gpus.push_back({device, bytes});
            if (gpus.size() < 2)
                throw std::invalid_argument(
                    std::to_string(gpus.size()) +
                    " GPU(s) visible; device_map needs two or more (to try it on the CPU, "
                    "name CPU devices: --max-memory cpu:0=1GB,cpu:1=1GB)");
        }
        plan = strategies::plan_device_map_spec(o.model_dir, element_bytes, o.device_map, o.max_memory, gpus);
    } catch (const std::exception& e) {
        throw Error("--device-map " + o.device_map + ": " + e.what(), 2);
    }
    const auto blocks = static_cast<std::size_t>(
        Sd3TransformerConfig::from_json_file(o.model_dir + "/transformer/config.json").num_layers);
    auto mapping = std::make_shared<DeviceMapping>();
    mapping->labels = plan.devices;
    for (const std::string& label : plan.devices)
        mapping->devices.push_back(DeviceMapping::device_for(label));
    auto slot = [&](const std::string& label) {
        return static_cast<int>(std::find(plan.devices.begin(), plan.devices.end(), label) -
                                plan.devices.begin());
    };
    for (const strategies::Placement& p : plan.placements) {
        if (p.component == "text_encoder") mapping->text_encoder = slot(p.device);
        if (p.component == "text_encoder_2") mapping->text_encoder_2 = slot(p.device);
        if (p.component == "vae") mapping->vae = slot(p.device);
        if (p.component != "transformer") continue;
        if (p.block < 0) {  // whole: every block on one device
            mapping->transformer_blocks.assign(blocks, slot(p.device));
        } else {
            if (static_cast<int>(mapping->transformer_blocks.size()) <= p.block)
                mapping->transformer_blocks.resize(static_cast<std::size_t>(p.block) + 1, 0);
            mapping->transformer_blocks[static_cast<std::size_t>(p.block)] = slot(p.device);
        }
    }
    std::cerr << "dp-worker: device_map " << o.device_map << ":\n"
              << strategies::describe_device_map(plan) << std::flush;
    return mapping;
}

}  // namespace

int run_worker(const WorkerOptions& o) {
    const int rank = env_int("RANK", 0, 0, 1 << 24);
    const int world = env_int("WORLD_SIZE", 1, 1, 1 << 24);
    const int local_rank = env_int("LOCAL_RANK", 0, 0, 1 << 24);
    if (rank >= world)
        throw Error("RANK " + std::to_string(rank) + " is not below WORLD_SIZE " + std::to_string(world), 2);

    PipelineOptions po;
    po.model_dir = o.model_dir;
    po.random_weights = o.random_weights;
    po.dtype = o.dtype == "bf16" ? at::kBFloat16 : o.dtype == "fp16" ? at::kHalf : at::kFloat;
    const bool cuda = at::hasCUDA();
    if (!o.device_map.empty() && world != 1)
        throw Error("--device-map runs one process over several devices; the world has " +
                        std::to_string(world) + " ranks",
                    2);
    if (!o.device_map.empty()) {
        po.device_map = make_device_mapping(o, po.dtype == at::kFloat ? 4 : 2);
        po.device =
            po.device_map->devices[static_cast<std::size_t>(po.device_map->transformer_blocks.front())];
    }
    if (o.device == "cuda" && !cuda)
        throw Error("--device cuda: no CUDA device is available to this rank; use --device cpu or auto", 2);
    if (!po.device_map)
        po.device = (o.device == "cpu" || !cuda)
                        ? at::Device(at::kCPU)
                        : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));

    CommunicatorOptions co;
    co.rank = rank;
    co.world_size = world;
    if (const char* addr = std::getenv("MASTER_ADDR")) co.master_addr = addr;
    co.master_port = env_int("MASTER_PORT", 29500, 1, 65535);
    co.backend = po.device.is_cuda() ? "nccl" : "gloo";
    Communicator comm(co);

    const std::vector<Request> all = read_requests(o.requests_file);
    // The mesh: prompts are split over the dp dimension; the ranks of one model replica (its cfg,
    // ulysses and tp ranks) take the same ones, and its first rank writes and reports.
    strategies::MeshDegrees degrees;
    degrees.cfg = o.cfg_parallel ? 2 : 1;
    degrees.ulysses = std::max(1, o.ulysses);
    degrees.tp = std::max(1, o.tp);
    degrees.ring = std::max(1, o.ring);
    const int replica = degrees.cfg * degrees.ring * degrees.ulysses * degrees.tp;
    if (world % replica != 0)
        throw Error("the world of " + std::to_string(world) +
                        " ranks does not divide by cfg x ring x ulysses x tp = " + std::to_string(replica),
                    2);
    degrees.dp = world / replica;
    const strategies::Mesh mesh(world, degrees);
    const auto coords = mesh.coords(rank);
    auto index = [&](strategies::MeshDim dim) { return coords[static_cast<std::size_t>(dim)]; };
    const int dp_index = index(strategies::MeshDim::kDp);
    // A group's tag: its dimension and the coordinates its members share.
    auto tag = [&](strategies::MeshDim dim) {
        std::string t = std::string(strategies::mesh_dim_name(dim)) + "/";
        for (int d = 0; d < strategies::kMeshDims; ++d)
            if (d != static_cast<int>(dim)) t += std::to_string(coords[static_cast<std::size_t>(d)]) + ".";
        return t + "/";
    };
    // Every rank forms its groups in the same order (cfg, ring, ulysses, tp), so none waits on another.
    std::unique_ptr<Communicator> cfg_group, ring_group, ulysses_group, tp_group;
    if (degrees.cfg > 1)
        cfg_group =
            comm.subgroup(mesh.group(rank, strategies::MeshDim::kCfg), tag(strategies::MeshDim::kCfg));
    if (degrees.ring > 1)
        ring_group =
            comm.subgroup(mesh.group(rank, strategies::MeshDim::kRing), tag(strategies::MeshDim::kRing));
    if (degrees.ulysses > 1)
        ulysses_group = comm.subgroup(mesh.group(rank, strategies::MeshDim::kUlysses),
                                      tag(strategies::MeshDim::kUlysses));
    if (degrees.tp > 1)
        tp_group = comm.subgroup(mesh.group(rank, strategies::MeshDim::kTp), tag(strategies::MeshDim::kTp));
    const bool writer = index(strategies::MeshDim::kCfg) == 0 && index(strategies::MeshDim::kUlysses) == 0 &&
                        index(strategies::MeshDim::kTp) == 0 && index(strategies::MeshDim::kRing) == 0;
    const std::vector<Request> mine = split_between_processes(all, degrees.dp, dp_index);
    // DP_SAVE_LATENTS=1: each image's final latents (fp32, before decoding) beside it, as
    // NAME.png.latents.safetensors, to compare runs more finely than by pixels.
    const char* save_latents_env = std::getenv("DP_SAVE_LATENTS");
    const bool save_latents = save_latents_env && *save_latents_env && std::string(save_latents_env) != "0";
    StatusChannel status;
    status.send({{"event", "start"}, {"rank", rank}, {"count", mine.size()}, {"device", po.device.str()}});

    int failed = 0;
    if (!mine.empty()) {
        po.tp_rank = index(strategies::MeshDim::kTp);
        po.tp_size = degrees.tp;
        const auto pipeline = Sd3Pipeline::load(po);
        pipeline->set_tensor_group(tp_group.get());
        pipeline->set_ring_group(ring_group.get());
        pipeline->set_cfg_group(cfg_group.get());
        pipeline->set_ulysses_group(ulysses_group.get());
        std::size_t next = 0;
        while (next < mine.size()) {
            // A batch: consecutive requests that can share the model's shapes.
            std::vector<const Request*> group = {&mine[next++]};
            const GenerateRequest& first = group.front()->generate;
            while (next < mine.size() && static_cast<int>(group.size()) < std::max(1, o.batch_size)) {
                const GenerateRequest& g = mine[next].generate;
                if (g.steps != first.steps || g.guidance_scale != first.guidance_scale ||
                    g.width != first.width || g.height != first.height)
                    break;
                group.push_back(&mine[next++]);
            }
            std::vector<GenerateRequest> requests;
            for (const Request* r : group) requests.push_back(r->generate);
            const auto start = std::chrono::steady_clock::now();
            try {
                std::vector<GenerateResult> results = pipeline->generate_batch(requests);
                const double ms =
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                        .count() /
                    static_cast<double>(group.size());
                for (std::size_t k = 0; k < group.size() && writer; ++k) {
                    const Request& r = *group[k];
                    const GenerateResult& result = results[k];
                    for (const std::string& w : result.warnings)
                        std::cerr << "prompt " << r.index << ": " << w << std::endl;
                    const WrittenImage img = write_png_atomically(
                        o.output_dir + "/" + r.file, result.image.data_ptr<uint8_t>(),
                        static_cast<int>(result.image.size(1)), static_cast<int>(result.image.size(0)));
                    if (save_latents)
                        save_safetensors(o.output_dir + "/" + r.file + ".latents.safetensors",
                                         {{"latents", result.latents}}, {{"prompt", r.generate.prompt}});
                    status.send({{"event", "image"},
                                 {"index", r.index},
                                 {"file", r.file},
                                 {"sha256", img.sha256},
                                 {"rank", rank},
                                 {"ms", ms},
                                 {"width", result.image.size(1)},
                                 {"height", result.image.size(0)}});
                }
            } catch (const Error& e) {
                for (const Request* r : group) {
                    if (!writer) break;
                    ++failed;
                    std::cerr << "prompt " << r->index << ": " << e.what() << std::endl;
                    status.send(
                        {{"event", "failed"}, {"index", r->index}, {"error", e.what()}, {"rank", rank}});
                }
            }
        }
    }
    // Every rank, with prompts or without, meets the others before leaving.
    comm.barrier();
    if (const char* report = std::getenv("DP_COMM_REPORT"); report && *report && std::string(report) != "0") {
        // Bytes this rank sent, per kind of collective, over every group it belongs to (the
        // figures the README's communication formulas predict).
        std::map<std::string, uint64_t> total;
        for (const Communicator* c :
             {&comm, cfg_group.get(), ring_group.get(), ulysses_group.get(), tp_group.get()})
            if (c)
                for (const auto& [kind, n] : c->bytes()) total[kind] += n;
        std::string line = "dp-worker: rank " + std::to_string(rank) + " communication bytes:";
        for (const auto& [kind, n] : total) line += " " + kind + "=" + std::to_string(n);
        std::cerr << line << std::endl;
        if (po.device_map)
            std::cerr << "dp-worker: device_map moved " << po.device_map->moved_bytes() << " bytes in "
                      << po.device_map->moves() << " moves between devices" << std::endl;
    }
    // A prompt that failed is in the manifest and makes dp-launch exit 1; the rank itself did its
    // job, so it exits 0 (a non-zero exit would stop the group, or restart it with --max-restarts).
    if (failed > 0) std::cerr << "rank " << rank << ": " << failed << " prompt(s) failed" << std::endl;
    return 0;
}

}  // namespace dp::runtime
