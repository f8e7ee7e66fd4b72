#include "cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "launcher/adapter_files.h"
#include "launcher/component_files.h"
#include "launcher/errors.h"
#include "launcher/input_images.h"
#include "launcher/job.h"
#include "launcher/job_settings.h"
#include "launcher/prompt_file.h"
#include "launcher/resolved_job.h"
#include "strategies/config_file.h"
#include "strategies/cost_model.h"
#include "strategies/family.h"
#include "strategies/mesh.h"
#include "strategies/model_config.h"
#include "strategies/model_files.h"
#include "strategies/model_sizes.h"
#include "strategies/pass_flops.h"
#include "strategies/step_traffic.h"
#include "strategies/strategy.h"

namespace dp::cli {
using namespace dp::launcher;
namespace {

// Keys in the order the text gives its sections.
using Json = nlohmann::ordered_json;

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
void describe_schedules(std::ostream& out, Json& facts, const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    const int replicas = resolved.degrees().dp;
    const PromptFile file = read_prompts(
        prompt_source(job), [&](const PromptRecord& p) { return prompt_setting_problem(p, job, model); });
    std::vector<protocol::JobRequest> requests;
    for (const PromptRecord& p : file.prompts) requests.push_back(job_request(p, job, model));
    const strategies::ScheduleChoice c = strategies::choose_schedule(
        job.schedule, requests, strategies::cost_rules(model.sizes, model.arguments), replicas,
        job.batch_size);
    const strategies::Makespans& m = c.makespans;
    const std::string source = job.prompt_texts.empty() ? utf8_for_display(job.prompts) : "--prompt";
    facts["schedules"] = {{"prompts", requests.size()},
                          {"source", source},
                          {"invalid_lines", file.invalid.size()},
                          {"replicas", replicas},
                          {"cost_unit", "image tokens x steps x guidance branches"},
                          {"static", m.static_split},
                          {"dynamic", m.dynamic},
                          {"ideal", m.ideal},
                          {"total", m.total},
                          {"runs", c.schedule},
                          {"why", c.why},
                          {"units", c.units}};
    out << "schedules: " << requests.size() << " prompt(s) of " << source;
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
}

// `count` read with with_variant_or_plain; a file that cannot be read is an InputDataError naming it.
template <class Count>
auto read_counts(const JobOptions& job, const Count& count) {
    try {
        return with_variant_or_plain(job, count);
    } catch (const std::runtime_error& e) {
        throw InputDataError(e.what());
    }
}

// One prompt at the job's settings as the transformer sees it: its size (the model's default where
// the job sets none) and its tokens.
struct PlanPrompt {
    long long width = 0, height = 0, image_tokens = 0, text_tokens = 0;
    long long reference_tokens = 0;  // of image_tokens, an edit's reference image's (FLUX.1-Kontext)
};

PlanPrompt plan_prompt(const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    PlanPrompt p;
    // The job's --image read as a job reads it (refused as there), unless a batch edit's glob or
    // folder: its size makes an img2img's default size and a reference's tokens.
    protocol::CallValues arguments = job.arguments;
    launcher::InputImages images;
    if (!launcher::image_is_a_batch(job) && !job.arguments.image("image").empty()) {
        images.check(job.arguments.image("image"), "", "--image");
        arguments.set("image", images.resolved(job.arguments.image("image"), ""));
    }
    // The size a line of the job makes (Note [output size]: FLUX.1-Kontext's scaled to max_area).
    const auto [width, height] =
        launcher::line_size(launcher::PromptRecord{}, job, model, model.arguments.completed(arguments));
    p.width = width, p.height = height;
    // Patches a side as the pipeline makes them (FLUX packs 2x2 before a transformer of patch 1).
    const long long vae_scale = model.sizes.vae_scale, grid = model.sizes.patch_size;
    p.image_tokens = (p.width / vae_scale / grid) * (p.height / vae_scale / grid);
    // A reference image's tokens follow the latents' in the image stream (Note [edit conditioning]).
    const protocol::InputImage& input = arguments.image("image");
    p.reference_tokens =
        strategies::reference_tokens(strategies::cost_rules(model.sizes, model.arguments), input);
    p.image_tokens += p.reference_tokens;
    const long long max_sequence = static_cast<long long>(
        job.arguments.has("max_sequence_length") ? job.arguments.number("max_sequence_length")
                                                 : model.arguments.default_number("max_sequence_length"));
    p.text_tokens = strategies::plan_text_tokens(model, max_sequence, resolved.left_out);
    return p;
}

// The model's transformer, the prompt's tokens and the run's precision.
void describe_model(std::ostream& out, Json& facts, const ResolvedJob& resolved, const PlanPrompt& prompt) {
    const strategies::TransformerShape& shape = resolved.model.shape;
    const bool text_up_to = strategies::stream_split(*resolved.model.spec, "text");
    const std::string precision = describe_dtype(resolved.options, resolved.strategy, shape.width());
    facts["model"] = {{"path", utf8_for_display(resolved.options.model)},
                      {"dtype", resolved.dtype},
                      {"precision", precision},
                      {"transformer",
                       {{"blocks", shape.layers},
                        {"width", shape.width()},
                        {"heads", shape.heads},
                        {"head_dim", shape.head_dim}}}};
    facts["prompt"] = {{"width", prompt.width},
                       {"height", prompt.height},
                       {"image_tokens", prompt.image_tokens},
                       {"reference_tokens", prompt.reference_tokens},
                       {"text_tokens", prompt.text_tokens},
                       {"text_tokens_at_most", text_up_to}};
    out << "model: " << resolved.options.model << "\n  transformer: " << shape.layers << " blocks, width "
        << shape.width() << ", " << shape.heads << " heads of " << shape.head_dim << "; " << prompt.width
        << "x" << prompt.height << " px -> " << prompt.image_tokens << " image tokens"
        << (prompt.reference_tokens
                ? " (" + std::to_string(prompt.reference_tokens) + " of them the reference image's)"
                : std::string())
        << ", " << (text_up_to ? "up to " : "") << prompt.text_tokens
        << " text tokens\n  precision: " << precision << "\n";
}

// The world, each rank's place in the mesh and role, device_map's placement, the sub-groups and
// the strategy's notes.
void describe_mesh(std::ostream& out, Json& facts, const LaunchSpec& launch, const ResolvedJob& resolved) {
    const strategies::ResolvedStrategy& strategy = resolved.strategy;
    const int world = launch.world_size();
    const strategies::MeshDegrees& deg = strategy.degrees;
    const strategies::Mesh mesh(world, deg);
    facts["world"] = {{"ranks", world}, {"nodes", launch.nnodes}, {"mesh", Json::object()}};
    for (int d = 0; d < strategies::kMeshDims; ++d) {
        const auto dim = static_cast<strategies::MeshDim>(d);
        facts["world"]["mesh"][strategies::mesh_dim_name(dim)] = deg.of(dim);
    }
    facts["device_map"] = nullptr;  // one process per GPU
    facts["ranks"] = Json::array();
    out << "world: " << world << " rank(s) on " << launch.nnodes << " node(s); mesh " << mesh.describe()
        << "\n";
    out << "ranks:\n";
    for (int r = 0; r < world; ++r) {
        const auto c = mesh.coords(r);
        facts["ranks"].push_back(
            {{"rank", r},
             {"dp", c[0]},
             {"cfg", c[1]},
             {"ring", c[2]},
             {"ulysses", c[3]},
             {"tp", c[4]},
             {"prompt_share", deg.dp > 1 ? Json(c[0]) : Json()},
             {"branch", deg.cfg > 1 ? Json(c[1] == 0 ? "negative" : "positive") : Json()},
             {"writes_images", mesh.writes_outputs(r)}});
        out << "  rank " << r << ": dp " << c[0] << ", cfg " << c[1] << ", ring " << c[2] << ", ulysses "
            << c[3] << ", tp " << c[4] << " -- "
            << (deg.dp > 1 ? "prompt share " + std::to_string(c[0]) + " of " + std::to_string(deg.dp)
                           : std::string("all prompts"))
            << (deg.cfg > 1 ? (c[1] == 0 ? ", negative branch" : ", positive branch") : "")
            << (mesh.writes_outputs(r) ? ", writes the images" : "") << "\n";
    }
    if (!resolved.device_map().empty()) {
        const auto& plan = strategy.device_map_plan;
        Json placements = Json();  // null: the budgets are known only at the job's start
        if (plan) {
            placements = Json::array();
            for (const strategies::Placement& p : plan->placements)
                placements.push_back({{"component", p.component},
                                      {"block", p.block < 0 ? Json() : Json(p.block)},
                                      {"device", p.device},
                                      {"bytes", p.bytes}});
        }
        facts["device_map"] = {{"mode", resolved.device_map()}, {"placements", placements}};
        out << "device_map " << resolved.device_map() << ": one process"
            << (plan ? ", components and blocks placed:\n" + strategies::describe_device_map(*plan)
                     : "; budgets are each visible GPU's free memory when the job starts (pass "
                       "--max-memory cuda:0=SIZE,cuda:1=SIZE to see the placement here)\n");
    }
    out << "sub-groups:\n";
    facts["sub_groups"] = Json::object();
    for (int d = 1; d < strategies::kMeshDims; ++d) {
        const auto dim = static_cast<strategies::MeshDim>(d);
        if (deg.of(dim) == 1) continue;
        out << "  " << strategies::mesh_dim_name(dim) << ":";
        facts["sub_groups"][strategies::mesh_dim_name(dim)] = mesh.groups(dim);
        for (const auto& g : mesh.groups(dim)) {
            out << " [";
            for (std::size_t i = 0; i < g.size(); ++i) out << (i ? "," : "") << g[i];
            out << "]";
        }
        out << "\n";
    }
    if (deg.replica_size() == 1) out << "  none (data parallelism only)\n";
    for (const std::string& note : strategy.notes) out << "note: " << note << "\n";
    facts["notes"] = strategy.notes;
}

// The transformer's parameters by whether the spec's TP rules split them, and the share of the
// busiest tp rank (Note [uneven heads]): the figures plan prints are that rank's.
struct TransformerElements {
    std::map<std::string, int64_t> counts;  // tensor -> elements
    long long whole = 0, split = 0;         // replicated on every rank; split over tp
    long long heads = 0,
              heads_tp = 0;  // heads_tp: the busiest tp rank's; 0 when tp x ulysses exceed the heads
    int tp = 1;
    bool even() const { return heads_tp == 0 || heads % tp == 0; }
    long long per_rank() const { return even() ? whole + split / tp : whole + split * heads_tp / heads; }
};

TransformerElements transformer_elements(const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    const strategies::MeshDegrees& deg = resolved.degrees();
    TransformerElements t;
    t.heads = model.shape.heads;
    t.tp = deg.tp;
    if (t.heads >= static_cast<long long>(deg.tp) * deg.ulysses)
        t.heads_tp = strategies::head_split(t.heads, deg.tp, deg.ulysses).tp_shares.front();
    t.counts = read_counts(job, [&](const std::string& variant) {
        return strategies::tensor_element_counts(job.model + "/" + model.spec->transformer, variant);
    });
    for (const auto& [name, n] : t.counts)
        (strategies::tp_splits_tensor(*model.spec, name) ? t.split : t.whole) += n;
    return t;
}

void describe_transformer_parameters(std::ostream& out, Json& facts, const TransformerElements& t,
                                     const std::string& dtype, long long f) {
    facts["transformer_parameters"] = {
        {"bytes_per_rank", t.per_rank() * f},
        {"replicated_bytes", t.whole * f},
        {"tp_split_bytes", t.split * f},
        {"tp", t.tp},
        {"heads", t.heads},
        {"heads_on_busiest_tp_rank", t.heads_tp == 0 ? Json() : Json(t.heads_tp)},
        {"even", t.even()}};
    if (t.even())
        out << "transformer parameters per rank (" << dtype << "): " << bytes_text(t.per_rank() * f) << " = "
            << bytes_text(t.whole * f) << " replicated + " << bytes_text(t.split * f) << " / tp " << t.tp
            << "\n";
    else  // the attention layers split by heads; the MLPs evenly, a smaller share
        out << "transformer parameters per rank (" << dtype << "): up to " << bytes_text(t.per_rank() * f)
            << " = " << bytes_text(t.whole * f) << " replicated + " << bytes_text(t.split * f)
            << " x at most " << t.heads_tp << "/" << t.heads << " on the ranks with " << t.heads_tp
            << " heads (tp " << t.tp << ")\n";
}

// A text encoder the spec's rules split over tp like the transformer (SD3's T5, Qwen-Image's
// Qwen2.5-VL): a rank's bytes of it, without the tensors the pipeline never loads (its vision tower).
long long text_encoder_rank_bytes(const JobOptions& job, const strategies::ModelInfo& model,
                                  const std::string& component, int tp, long long f) {
    const strategies::ParallelSpec& spec = *model.spec;
    const auto counts = read_counts(job, [&](const std::string& variant) {
        return strategies::tensor_element_counts(job.model + "/" + component, variant);
    });
    long long whole = 0, split = 0;
    for (const auto& [name, n] : counts) {
        const bool unloaded =
            std::any_of(spec.unloaded_tensors.begin(), spec.unloaded_tensors.end(),
                        [&](const auto& u) { return u.first == component && name.rfind(u.second, 0) == 0; });
        if (!unloaded) (strategies::tp_splits_tensor(spec, name) ? split : whole) += n;
    }
    return (whole + split / tp) * f;
}

// One component's weights on a rank.
struct RankWeight {
    std::string component;
    long long bytes = 0;
    bool tp_share = false;  // split over tp (the transformer, a text encoder the spec splits)
};

// What a rank's weights come to, in pipeline order: its transformer share (`transformer_bytes`)
// and every other component whole or its tp share, without the tensors the pipeline never loads
// (scripts/bench/sd35_large_memory.sh compares a rank's peak RSS with it).
std::vector<RankWeight> rank_weights(const ResolvedJob& resolved, long long transformer_bytes, long long f) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    const strategies::ParallelSpec& spec = *model.spec;
    const int tp = resolved.degrees().tp;
    const std::vector<strategies::ComponentSize> sizes = read_counts(job, [&](const std::string& variant) {
        return strategies::pipeline_component_sizes(job.model, spec, f, variant, resolved.left_out);
    });
    std::vector<RankWeight> out;
    for (const strategies::ComponentSize& c : sizes) {
        const bool text_encoder = std::find(spec.tp_components.begin(), spec.tp_components.end(), c.name) !=
                                  spec.tp_components.end();
        const long long bytes = c.name == spec.transformer ? transformer_bytes
                                : text_encoder ? text_encoder_rank_bytes(job, model, c.name, tp, f)
                                               : c.bytes;
        out.push_back({c.name, bytes, c.name == spec.transformer || text_encoder});
    }
    return out;
}

void describe_rank_weights(std::ostream& out, Json& facts, const std::vector<RankWeight>& weights, int tp,
                           const std::string& dtype) {
    long long total = 0;
    std::string parts;
    Json components = Json::array();
    for (const RankWeight& w : weights) {
        total += w.bytes;
        components.push_back(
            {{"component", w.component}, {"bytes", w.bytes}, {"tp_share", w.tp_share && tp > 1}});
        parts += "  " + w.component + ": " + bytes_text(w.bytes) +
                 (w.tp_share && tp > 1 ? ", its tp share" : "") + "\n";
    }
    facts["weights_per_rank"] = {{"bytes", total}, {"components", components}};
    out << "weights per rank (" << dtype << "): " << bytes_text(total) << "\n" << parts;
}

// Components from one file each (Note [component files]): checked as a job checks them (without
// their SHA-256), with their layout and format, and for GGUF which way its weights run (Note [kept
// quantized]).
void describe_component_files(std::ostream& out, Json& facts, const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    const std::string& dtype = resolved.dtype;
    const int tp = resolved.degrees().tp;
    facts["component_files"] = Json::array();
    for (const ComponentFile& c :
         check_component_files(job.component_files, model, job.variant, /*hash=*/false, job.model_file)) {
        const long long kept = static_cast<long long>(c.quantized_bytes) /
                               (c.component == model.spec->transformer && tp > 1 ? tp : 1);
        facts["component_files"].push_back(
            {{"component", c.component},
             {"path", utf8_for_display(c.path)},
             {"layout", c.layout},
             {"format", c.format},
             {"quantized_bytes_per_rank", c.quantized_bytes == 0 ? Json() : Json(kept)},
             {"kept_quantized", c.quantized_bytes != 0 && job.keep_quantized}});
        out << "component file: " << c.component << " from " << utf8_for_display(c.path) << " (" << c.layout
            << ", " << c.format
            << (c.format.find("fp8") != std::string::npos
                    ? "; converted to the run's dtype at load. GPUs of compute capability 8.9 and later "
                      "(Ada, "
                      "Hopper: L40, H100, H200) could keep fp8 and multiply in it; dp-launch "
                      "does not yet"
                    : "")
            << ")\n";
        if (c.quantized_bytes == 0) continue;
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
}

// The bytes each rank sends per denoising step, for one prompt (Note [step traffic];
// docs/strategies.md, "Strategy guide").
void describe_step_traffic(std::ostream& out, Json& facts, const ResolvedJob& resolved,
                           const PlanPrompt& prompt, const std::map<std::string, int64_t>& transformer_counts,
                           long long f) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    strategies::StepTrafficInput step;
    step.image_tokens = prompt.image_tokens;
    step.text_tokens = prompt.text_tokens;
    // Both guidance branches in one batch (Qwen-Image's only with a negative prompt).
    const bool guided = model.arguments.runs_two_branches(job.arguments, job.negative_prompt.has_value());
    step.branches = guided && !job.cfg_parallel ? 2 : 1;
    step.element_bytes = f;
    const std::map<std::string, int64_t> traffic =
        strategies::step_traffic(*model.spec, model.shape, resolved.degrees(), transformer_counts, step);
    facts["step_traffic"] = {{"branches_per_batch", step.branches}, {"bytes_per_rank_per_step", traffic}};
    out << "estimated bytes sent per rank per denoising step, per prompt:";
    if (traffic.empty()) out << " none";
    for (const auto& [kind, bytes] : traffic) out << "\n  " << kind << ": " << bytes_text(bytes);
    out << "\n";
}

// Note [FLOPs of a pass]: a pass's work, a rank's share of it under the mesh, and an image's (its
// passes and guidance branches at the job's settings, from noise).
void describe_flops(std::ostream& out, Json& facts, const ResolvedJob& resolved, const PlanPrompt& prompt) {
    const strategies::ModelInfo& model = resolved.model;
    const strategies::PassFlopsCount count = strategies::facts_of(*model.spec).pass_flops;
    const Json config =
        strategies::read_config_object_if_present(model.dir + "/" + model.spec->transformer + "/config.json");
    if (!count || !config.is_object() || config.empty()) {
        facts["flops"] = nullptr;
        return;
    }
    const JobOptions& job = resolved.options;
    const strategies::PassTokens tokens{prompt.image_tokens, prompt.text_tokens};
    const strategies::PassFlops pass = count(config, tokens);
    const strategies::RankFlops rank = strategies::rank_flops(count, config, tokens, resolved.degrees(),
                                                              strategies::stream_split(*model.spec, "text"));
    const long long steps = static_cast<long long>(
        job.arguments.has("num_inference_steps") ? job.arguments.number("num_inference_steps")
                                                 : model.arguments.default_number("num_inference_steps"));
    const long long passes = strategies::model_passes(steps, job.arguments);
    const int branches =
        model.arguments.runs_two_branches(job.arguments, job.negative_prompt.has_value()) ? 2 : 1;
    const double image = pass.total() * static_cast<double>(passes) * branches;
    facts["flops"] = {{"per_pass", pass.total()},
                      {"per_pass_gemm", pass.gemm()},
                      {"per_pass_attention", pass.attention},
                      {"per_pass_per_rank", rank.total()},
                      {"passes_per_image", passes},
                      {"branches", branches},
                      {"per_image", image}};
    out << "FLOPs per image: " << strategies::flops_text(image) << " (" << passes << " transformer passes x "
        << branches << " guidance branch" << (branches > 1 ? "es" : "") << " of "
        << strategies::flops_text(pass.total()) << ": " << strategies::flops_text(pass.gemm())
        << " in weight products, " << strategies::flops_text(pass.attention)
        << " in attention; the VAE and text encoders not counted)\n  per rank per pass: "
        << strategies::flops_text(rank.total()) << "\n";
}

// What the job itself would refuse, though a plan can still be made: the folder's and the
// settings' problems, then what a rank would refuse, checked as a job checks it before its ranks
// start (Note [checking a model before the ranks start]); a folder of configs only (a plan for
// weights one does not have yet) has nothing a rank could load.
std::vector<std::string> job_refusals(const LaunchSpec& launch, const ResolvedJob& resolved) {
    const JobOptions& job = resolved.options;
    std::vector<std::string> refusals = model_problems(job, resolved.model);
    try {
        const std::vector<std::string> more = job_setting_problems(resolved);
        refusals.insert(refusals.end(), more.begin(), more.end());
    } catch (const Error& e) {
        refusals.push_back(e.what());
    }
    if (refusals.empty() && !job.random_weights && job.component_files.empty() &&
        strategies::components_without_weights(job.model, *resolved.model.spec).empty()) {
        try {
            check_model_with_worker(launch, resolved);
        } catch (const Error& e) {
            refusals.push_back(e.what());
        }
    }
    return refusals;
}

// What the job's --lora adapters change, and what a replica's switch to or from them costs: the
// weights they change, made again in place from their files, each rank its share (Note [adapter
// switches], runtime/pipeline/adapters.h); a component whose rank keeps a changed weight only as a
// fused copy (a row-parallel layer over segments, under tp) is built again whole. Measured
// figures: docs/benchmarks.md, "LoRA adapter switches".
void describe_adapters(std::ostream& out, Json& facts, const ResolvedJob& resolved,
                       const std::map<std::string, long long>& component_rank_bytes,
                       long long element_bytes) {
    const JobOptions& job = resolved.options;
    const strategies::ModelInfo& model = resolved.model;
    const int tp = resolved.degrees().tp;
    const protocol::Adapters& adapters = job.arguments.adapters("lora");
    facts["adapters"] = Json::array();
    if (adapters.empty()) return;
    AdapterFiles files(model, job.variant);
    files.check(adapters, "--lora");
    const strategies::ParallelSpec& spec = *model.spec;
    out << "adapters (--lora):\n";
    for (const protocol::Adapter& a : adapters) {
        const strategies::LoraLayout& layout = files.layout(a.path);
        std::map<std::string, std::set<std::string>> weights;
        for (const strategies::LoraTerm& t : layout.terms) weights[t.component].insert(t.weight);
        long long remade = 0;
        std::string where, rebuilt;
        Json changes = Json::object(), rebuilt_whole = Json::array();
        for (const auto& [component, names] : weights) {
            where += (where.empty() ? "" : ", ") + std::to_string(names.size()) + " of " + component;
            changes[component] = names.size();
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
                rebuilt_whole.push_back(component);
            }
            remade += bytes;
        }
        const std::string scale = protocol::call_value_text(protocol::Adapters{a}).substr(a.path.size() + 1);
        facts["adapters"].push_back({{"path", utf8_for_display(a.path)},
                                     {"scale", scale},
                                     {"format", layout.format},
                                     {"weights_changed", changes},
                                     {"switch_bytes_per_rank", remade},
                                     {"built_again_whole", rebuilt_whole}});
        out << "  " << utf8_for_display(a.path) << " at " << scale << " (" << layout.format << "): changes "
            << where << " weights\n"
            << "    a switch to or from it makes again " << bytes_text(remade) << " of weights per rank"
            << (tp > 1 ? " (their tp share)" : "") << " from their files"
            << (rebuilt.empty()
                    ? std::string(", in place")
                    : "; builds " + rebuilt + " again whole (a changed weight is a fused copy under tp)")
            << "\n";
    }
}

}  // namespace

std::string describe_plan(const LaunchSpec& launch, const JobOptions& options, bool json) {
    const ResolvedJob resolved = resolve_job(launch, options);  // the model read once
    const strategies::MeshDegrees& deg = resolved.degrees();
    const PlanPrompt prompt = plan_prompt(resolved);
    const long long f = resolved.dtype == "fp32" ? 4 : 2;

    // Each section writes its text and its facts from the same figures.
    std::ostringstream out;
    Json facts = {{"dp_launch_plan", 1}};
    describe_model(out, facts, resolved, prompt);
    describe_mesh(out, facts, launch, resolved);
    const TransformerElements transformer = transformer_elements(resolved);
    describe_transformer_parameters(out, facts, transformer, resolved.dtype, f);
    const std::vector<RankWeight> weights = rank_weights(resolved, transformer.per_rank() * f, f);
    describe_rank_weights(out, facts, weights, deg.tp, resolved.dtype);
    std::map<std::string, long long> component_rank_bytes;
    for (const RankWeight& w : weights) component_rank_bytes[w.component] = w.bytes;
    describe_adapters(out, facts, resolved, component_rank_bytes, f);
    describe_component_files(out, facts, resolved);
    describe_step_traffic(out, facts, resolved, prompt, transformer.counts, f);
    describe_flops(out, facts, resolved, prompt);
    facts["schedules"] = nullptr;  // without prompts
    if (!options.prompts.empty() || !options.prompt_texts.empty()) describe_schedules(out, facts, resolved);
    const std::vector<std::string> refusals = job_refusals(launch, resolved);
    facts["refusals"] = refusals;
    for (const std::string& why : refusals) out << "warning: the job would refuse this: " << why << "\n";
    // ASCII, so that a file name's bytes that are not UTF-8 (utf8_for_display's replacements) or a
    // terminal control character arrive as JSON escapes.
    return json ? facts.dump(2, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace) + "\n"
                : out.str();
}

}  // namespace dp::cli
