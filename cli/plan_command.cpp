#include "cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "launcher/adapter_files.h"
#include "launcher/component_files.h"
#include "launcher/errors.h"
#include "launcher/job_settings.h"
#include "launcher/prompt_file.h"
#include "strategies/config_file.h"
#include "strategies/cost_model.h"
#include "strategies/mesh.h"
#include "strategies/model_config.h"
#include "strategies/model_files.h"
#include "strategies/model_sizes.h"
#include "strategies/strategy.h"

namespace dp::cli {
using namespace dp::launcher;
namespace {

std::string bytes_text(long long b) {
    char buf[64];
    if (b >= (1LL << 30))
        std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
    else if (b >= (1LL << 20))
        std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
    else if (b >= 1024)
        std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
    else
        std::snprintf(buf, sizeof(buf), "%lld B", b);
    return std::string(buf) + " (" + std::to_string(b) + ")";
}

// `count` of the job's weight variant; when the folder lacks it (a warning below says so), of the
// plain weights, which have the same shapes.
template <class Count>
auto with_variant_or_plain(const JobOptions& job, const Count& count) {
    try {
        return count(job.variant);
    } catch (const protocol::ModelError&) {
        if (job.variant.empty()) throw;
        return count("");
    }
}

// The expected makespan of each schedule over the prompts of job.prompts (docs/strategies.md, "Schedules").
std::string schedule_plan(const JobOptions& job, const strategies::ModelInfo& model, int replicas) {
    const PromptFile file = read_prompt_file(
        job.prompts, [&](const PromptRecord& p) { return prompt_setting_problem(p, job, model); });
    std::vector<protocol::JobRequest> requests;
    for (const PromptRecord& p : file.prompts) requests.push_back(job_request(p, job, model));
    const strategies::ScheduleChoice c = strategies::choose_schedule(
        job.schedule, requests, strategies::cost_rules(model.sizes, model.arguments), replicas,
        job.batch_size);
    const strategies::Makespans& m = c.makespans;
    std::ostringstream out;
    out << "schedules: " << requests.size() << " prompt(s) of " << utf8_for_display(job.prompts);
    if (!file.invalid.empty()) out << " (" << file.invalid.size() << " invalid line(s) left out)";
    out << " over " << replicas
        << " model replica(s); cost units are image tokens x steps x guidance branches\n";
    const auto row = [&](const char* name, double cost) {
        char line[160];
        std::snprintf(line, sizeof(line), "  %-8s %.0f%s", name, cost, m.ideal > 0 ? "" : "\n");
        out << line;
        if (m.ideal > 0) {
            std::snprintf(line, sizeof(line), " (%.2fx the ideal)\n", cost / m.ideal);
            out << line;
        }
    };
    row("static:", static_cast<double>(m.static_split));
    row("dynamic:", static_cast<double>(m.dynamic));
    char ideal[160];
    std::snprintf(ideal, sizeof(ideal), "  ideal:   %.1f (the total %lld over %d replica(s))\n", m.ideal,
                  static_cast<long long>(m.total), replicas);
    out << ideal << "  runs: " << strategies::describe_schedule(c) << "\n";
    return out.str();
}

}  // namespace

// What the job's --lora adapters change, and what a replica's switch to or from them costs: the
// weights they change, made again in place from their files, each rank its share (Note [adapter
// switches], runtime/pipeline/adapters.h); a component whose rank keeps a changed weight only as a
// fused copy (a row-parallel layer over segments, under tp) is built again whole. Measured
// figures: docs/benchmarks.md, "LoRA adapter switches".
std::string adapter_plan(const JobOptions& job, const strategies::ModelInfo& model,
                         const std::map<std::string, long long>& component_rank_bytes, int tp,
                         long long element_bytes) {
    const protocol::Adapters& adapters = job.arguments.adapters("lora");
    if (adapters.empty()) return {};
    AdapterFiles files(model, job.variant);
    files.check(adapters, "--lora");
    const strategies::ParallelSpec& spec = *model.spec;
    std::ostringstream out;
    out << "adapters (--lora):\n";
    for (const protocol::Adapter& a : adapters) {
        const strategies::LoraLayout& layout = files.layout(a.path);
        std::map<std::string, std::set<std::string>> weights;
        for (const strategies::LoraTerm& t : layout.terms) weights[t.component].insert(t.weight);
        long long remade = 0;
        std::string where, rebuilt;
        for (const auto& [component, names] : weights) {
            where += (where.empty() ? "" : ", ") + std::to_string(names.size()) + " of " + component;
            const bool split = component == spec.transformer ||
                               std::find(spec.tp_components.begin(), spec.tp_components.end(), component) !=
                                   spec.tp_components.end();
            long long bytes = 0;
            bool whole = false;
            for (const std::string& name : names) {
                const std::vector<int64_t>& shape = files.tensors().at(component).at(name);
                long long n = 1;
                for (int64_t d : shape) n *= d;
                const bool tp_split = split && tp > 1 && strategies::tp_splits_tensor(spec, name);
                bytes += (tp_split ? n / tp : n) * element_bytes;
                const std::string layer = name.substr(0, name.rfind('.'));
                if (tp_split &&
                    strategies::tp_rule_for_layer(spec, layer).split == strategies::TpSplit::kRowSegments)
                    whole = true;
            }
            const auto it = component_rank_bytes.find(component);
            if (whole && it != component_rank_bytes.end()) {
                bytes = it->second;
                rebuilt += (rebuilt.empty() ? "" : ", ") + component;
            }
            remade += bytes;
        }
        out << "  " << utf8_for_display(a.path) << " at "
            << protocol::call_value_text(protocol::Adapters{a}).substr(a.path.size() + 1) << " ("
            << layout.format << "): changes " << where << " weights\n"
            << "    a switch to or from it makes again " << bytes_text(remade) << " of weights per rank"
            << (tp > 1 ? " (their tp share)" : "") << " from their files"
            << (rebuilt.empty()
                    ? std::string(", in place")
                    : "; builds " + rebuilt + " again whole (a changed weight is a fused copy under tp)")
            << "\n";
    }
    return out.str();
}

std::string describe_plan(const LaunchSpec& launch, const JobOptions& requested) {
    const strategies::ModelInfo model = strategies::read_model_info(requested.model);  // read once
    const strategies::ResolvedStrategy strategy = resolve_job_strategy(launch, requested, model);
    const JobOptions job = with_strategy(requested, strategy);
    const int world = launch.world_size();
    const strategies::MeshDegrees& deg = strategy.degrees;
    const strategies::Mesh mesh(world, deg);

    const strategies::ParallelSpec& spec = *model.spec;
    const strategies::TransformerShape& shape = model.shape;
    const long long heads = shape.heads, hd = shape.head_dim, layers = shape.layers;
    const long long patch = shape.patch_size, channels = shape.in_channels;
    const long long width_d = shape.width();
    const long long vae_scale = model.sizes.vae_scale;
    const long long px_w = job.width ? job.width : model.sizes.default_side,
                    px_h = job.height ? job.height : model.sizes.default_side;
    // Patches a side as the pipeline makes them (FLUX packs 2x2 before a transformer of patch 1).
    const long long grid = model.sizes.patch_size;
    const long long tokens = (px_w / vae_scale / grid) * (px_h / vae_scale / grid);
    const protocol::FamilyArguments& arguments = model.arguments;
    const long long max_sequence = static_cast<long long>(
        job.arguments.has("max_sequence_length") ? job.arguments.number("max_sequence_length")
                                                 : arguments.default_number("max_sequence_length"));
    long long text = max_sequence;  // Qwen-Image: at most this, as long as the prompt
    if (spec.family == "sd3") {
        // CLIP's tokens, then T5's max_sequence_length; without T5 (none in the folder, or --no-t5)
        // one that stands for its zero positions (the worker's Note [constant text tail]).
        const nlohmann::json tok =
            strategies::read_config_object_if_present(job.model + "/tokenizer/tokenizer_config.json");
        const long long clip_length =
            tok.contains("model_max_length") && tok["model_max_length"].is_number_integer()
                ? tok["model_max_length"].get<long long>()
                : 77;
        const nlohmann::json index =
            strategies::read_config_object_if_present(job.model + "/model_index.json");
        const bool t5 = !job.no_t5 && index.contains("text_encoder_3") &&
                        index["text_encoder_3"].is_array() && index["text_encoder_3"].size() == 2 &&
                        index["text_encoder_3"][1].is_string();
        text = clip_length + (t5 ? max_sequence : 1);
    }
    const bool text_split = strategies::stream_split(spec, "text");
    const std::string dtype = expected_dtype(job, strategy.device_map_plan);
    const long long f = dtype == "fp32" ? 4 : 2;

    std::ostringstream out;
    out << "model: " << job.model << "\n  transformer: " << layers << " blocks, width " << width_d << ", "
        << heads << " heads of " << hd << "; " << px_w << "x" << px_h << " px -> " << tokens
        << " image tokens, " << (text_split ? "up to " : "") << text
        << " text tokens\n  precision: " << describe_dtype(job, strategy.device_map_plan) << "\n";
    out << "world: " << world << " rank(s) on " << launch.nnodes << " node(s); mesh " << mesh.describe()
        << "\n";
    out << "ranks:\n";
    for (int r = 0; r < world; ++r) {
        const auto c = mesh.coords(r);
        const bool writer = mesh.writes_outputs(r);
        out << "  rank " << r << ": dp " << c[0] << ", cfg " << c[1] << ", ring " << c[2] << ", ulysses "
            << c[3] << ", tp " << c[4] << " -- "
            << (deg.dp > 1 ? "prompt share " + std::to_string(c[0]) + " of " + std::to_string(deg.dp)
                           : std::string("all prompts"))
            << (deg.cfg > 1 ? (c[1] == 0 ? ", negative branch" : ", positive branch") : "")
            << (writer ? ", writes the images" : "") << "\n";
    }
    if (!job.device_map.empty()) {
        const auto& plan = strategy.device_map_plan;
        out << "device_map " << job.device_map << ": one process"
            << (plan ? ", components and blocks placed:\n" + strategies::describe_device_map(*plan)
                     : "; budgets are each visible GPU's free memory when the job starts (pass "
                       "--max-memory cuda:0=SIZE,cuda:1=SIZE to see the placement here)\n");
    }
    out << "sub-groups:\n";
    for (int d = 1; d < strategies::kMeshDims; ++d) {
        const auto dim = static_cast<strategies::MeshDim>(d);
        if (deg.of(dim) == 1) continue;
        out << "  " << strategies::mesh_dim_name(dim) << ":";
        for (const auto& g : mesh.groups(dim)) {
            out << " [";
            for (std::size_t i = 0; i < g.size(); ++i) out << (i ? "," : "") << g[i];
            out << "]";
        }
        out << "\n";
    }
    if (deg.replica_size() == 1) out << "  none (data parallelism only)\n";
    for (const std::string& note : strategy.notes) out << "note: " << note << "\n";
    // Heads on the busiest rank (Note [uneven heads]): the figures below are that rank's.
    const bool heads_fit = heads >= static_cast<long long>(deg.tp) * deg.ulysses;
    const long long h_tp =
        heads_fit ? strategies::head_split(heads, deg.tp, deg.ulysses).tp_shares.front() : 0;
    const long long h_attend = heads_fit ? strategies::head_split(heads, deg.tp, deg.ulysses).most() : 0;

    long long split = 0, whole = 0;
    std::map<std::string, int64_t> counts;
    try {
        counts = with_variant_or_plain(job, [&](const std::string& variant) {
            return strategies::tensor_element_counts(job.model + "/" + spec.transformer, variant);
        });
    } catch (const std::runtime_error& e) {
        throw InputDataError(e.what());
    }
    for (const auto& [name, n] : counts) (strategies::tp_splits_tensor(spec, name) ? split : whole) += n;
    // Layers split by output features and gathered (AdaLN's modulations): every rank sends its
    // share of each one's outputs, padded to the largest share, per prompt of the batch.
    long long gathered_features = 0;
    for (const auto& [name, n] : counts) {
        const std::size_t dot = name.rfind(".weight");
        if (dot == std::string::npos || dot + 7 != name.size()) continue;
        if (strategies::tp_rule_for_layer(spec, name.substr(0, dot)).split ==
            strategies::TpSplit::kColumnGathered)
            gathered_features += (n / width_d + deg.tp - 1) / deg.tp;
    }
    if (!heads_fit || heads % deg.tp == 0)
        out << "transformer parameters per rank (" << dtype
            << "): " << bytes_text((whole + split / deg.tp) * f) << " = " << bytes_text(whole * f)
            << " replicated + " << bytes_text(split * f) << " / tp " << deg.tp << "\n";
    else  // the attention layers split by heads; the MLPs evenly, a smaller share
        out << "transformer parameters per rank (" << dtype << "): up to "
            << bytes_text((whole + split * h_tp / heads) * f) << " = " << bytes_text(whole * f)
            << " replicated + " << bytes_text(split * f) << " x at most " << h_tp << "/" << heads
            << " on the ranks with " << h_tp << " heads (tp " << deg.tp << ")\n";
    // What a rank's weights come to: its transformer share (above) and every other component
    // whole, without the tensors the pipeline never loads (scripts/bench/sd35_large_memory.sh
    // compares a rank's peak RSS with it).
    std::vector<strategies::ComponentSize> sizes;
    const std::vector<std::string> left_out = strategies::components_left_out(job.model, spec, job.no_t5);
    try {
        sizes = with_variant_or_plain(job, [&](const std::string& variant) {
            return strategies::pipeline_component_sizes(job.model, spec, f, variant, left_out);
        });
    } catch (const std::runtime_error& e) {
        throw InputDataError(e.what());
    }
    const long long transformer_rank =
        (!heads_fit || heads % deg.tp == 0 ? whole + split / deg.tp : whole + split * h_tp / heads) * f;
    // A text encoder the spec's rules split over tp like the transformer (SD3's T5, Qwen-Image's
    // Qwen2.5-VL), without the tensors the pipeline never loads (its vision tower).
    auto text_encoder_rank = [&](const strategies::ComponentSize& c) {
        long long t5_whole = 0, t5_split = 0;
        try {
            const auto t5_counts = with_variant_or_plain(job, [&](const std::string& variant) {
                return strategies::tensor_element_counts(job.model + "/" + c.name, variant);
            });
            for (const auto& [name, n] : t5_counts) {
                const bool unloaded = std::any_of(
                    spec.unloaded_tensors.begin(), spec.unloaded_tensors.end(),
                    [&](const auto& u) { return u.first == c.name && name.rfind(u.second, 0) == 0; });
                if (!unloaded) (strategies::tp_splits_tensor(spec, name) ? t5_split : t5_whole) += n;
            }
        } catch (const std::runtime_error& e) {
            throw InputDataError(e.what());
        }
        return (t5_whole + t5_split / deg.tp) * f;
    };
    long long rank_bytes = 0;
    std::string parts;
    std::map<std::string, long long> component_rank_bytes;
    for (const strategies::ComponentSize& c : sizes) {
        const bool text_encoder = std::find(spec.tp_components.begin(), spec.tp_components.end(), c.name) !=
                                  spec.tp_components.end();
        const bool split_by_tp = c.name == spec.transformer || text_encoder;
        const long long bytes = c.name == spec.transformer ? transformer_rank
                                : text_encoder             ? text_encoder_rank(c)
                                                           : c.bytes;
        rank_bytes += bytes;
        component_rank_bytes[c.name] = bytes;
        parts += "  " + c.name + ": " + bytes_text(bytes) +
                 (split_by_tp && deg.tp > 1 ? ", its tp share" : "") + "\n";
    }
    out << "weights per rank (" << dtype << "): " << bytes_text(rank_bytes) << "\n" << parts;
    out << adapter_plan(job, model, component_rank_bytes, deg.tp, f);
    // Components from one file each (Note [component files]): checked as a job checks them.
    for (const ComponentFile& c :
         check_component_files(job.component_files, model, job.variant, /*hash=*/false, job.model_file)) {
        out << "component file: " << c.component << " from " << utf8_for_display(c.path) << " (" << c.layout
            << ", " << c.format
            << (c.format.find("fp8") != std::string::npos
                    ? "; converted to the run's dtype at load. GPUs of compute capability 8.9 and later "
                      "(Ada, "
                      "Hopper: L40, H100, H200) could keep fp8 and multiply in it; dp-launch "
                      "does not yet"
                    : "")
            << ")\n";
        // Note [kept quantized]: which way the GGUF weights run.
        if (c.quantized_bytes == 0) continue;
        const long long kept = static_cast<long long>(c.quantized_bytes) /
                               (c.component == spec.transformer && deg.tp > 1 ? deg.tp : 1);
        if (job.keep_quantized)
            out << "  GGUF weights kept quantized (--keep-quantized): about " << bytes_text(kept)
                << " of blocks per rank, each layer dequantized to " << dtype
                << " as it runs (the least memory; a dequantization per use)\n";
        else
            out << "  GGUF weights dequantized to " << dtype
                << " at load (the fastest); --keep-quantized keeps "
                << "about " << bytes_text(kept)
                << " of blocks per rank instead and dequantizes each layer as it runs\n";
    }

    // Bytes each rank sends per denoising step, for one prompt (docs/strategies.md, "Strategy guide").
    const long long split_tokens = deg.ring * deg.ulysses;
    const long long n = (tokens + split_tokens - 1) / split_tokens * split_tokens;
    // Both guidance branches in one batch (Qwen-Image's only with a negative prompt).
    const bool guided = arguments.runs_two_branches(job.arguments, job.negative_prompt.has_value());
    const long long b = guided && !job.cfg_parallel ? 2 : 1;
    std::map<std::string, long long> step;
    if (deg.cfg > 1) step["all_gather"] += channels * tokens * patch * patch * f;
    // A split text stream (Qwen-Image) travels with the image's tokens, padded to the ranks; a
    // replicated one (SD3) is computed whole on every rank, its attention output gathered.
    const long long m = text_split ? (text + split_tokens - 1) / split_tokens * split_tokens : 0;
    const long long text_rank = text_split ? m / split_tokens : text;
    if (deg.ulysses > 1) {
        // q, k, v leave with the tp shard's heads; the output comes back with this rank's, from
        // every Ulysses rank; the text output is gathered padded to the largest share.
        // The last block's text output is not needed, so a split text's does not come back there.
        step["all_to_all"] += (layers * b * (3 * h_tp + deg.ulysses * h_attend) * ((n + m) / split_tokens) -
                               b * deg.ulysses * h_attend * (m / split_tokens)) *
                              hd * f;
        step["all_gather"] += ((text_split ? 0 : (layers - 1) * b * h_attend * text * hd) +
                               b * (n / split_tokens) * channels * patch * patch) *
                              f;
    }
    if (deg.ring > 1) {
        step["send"] += 2 * layers * (deg.ring - 1) * b * h_attend * ((n + m) / deg.ring) * hd * f;
        step["all_gather"] += b * (n / deg.ring) * channels * patch * patch * f;
    }
    if (deg.tp > 1 && shape.more_layers > 0) {
        // FLUX: a double block reduces after each stream's attention and MLP outputs (the last one's
        // text too: the single blocks go on with it), a single block once, over both streams.
        // The last single block's text is not needed: only its image tokens are reduced.
        const long long both = n / split_tokens + text_rank, doubles = layers - shape.more_layers;
        step["all_reduce"] += b * width_d * (both * (2 * doubles + shape.more_layers) - text_rank) * f;
        step["all_gather"] += b * gathered_features * f;
    } else if (deg.tp > 1) {
        step["all_reduce"] +=
            b * width_d * (2 * (n / split_tokens) * layers + 2 * text_rank * (layers - 1)) * f;
        step["all_gather"] += b * gathered_features * f;
    }
    out << "estimated bytes sent per rank per denoising step, per prompt:";
    if (step.empty()) out << " none";
    for (const auto& [kind, bytes] : step) out << "\n  " << kind << ": " << bytes_text(bytes);
    out << "\n";
    if (!job.prompts.empty()) out << schedule_plan(job, model, deg.dp);
    // What the job itself would refuse, though a plan can still be made.
    std::vector<std::string> refusals = model_problems(job, model);
    try {
        const std::vector<std::string> more = job_setting_problems(job, model);
        refusals.insert(refusals.end(), more.begin(), more.end());
    } catch (const Error& e) {
        refusals.push_back(e.what());
    }
    // What a rank would refuse, checked as a job checks it before its ranks start (Note [checking
    // a model before the ranks start]); a folder of configs only (a plan for weights one does not
    // have yet) has nothing a rank could load.
    if (refusals.empty() && !job.random_weights && job.component_files.empty() &&
        strategies::components_without_weights(job.model, *model.spec).empty()) {
        try {
            check_model_with_worker(launch, job, model, strategy);
        } catch (const Error& e) {
            refusals.push_back(e.what());
        }
    }
    for (const std::string& why : refusals) out << "warning: the job would refuse this: " << why << "\n";
    return out.str();
}

}  // namespace dp::cli
