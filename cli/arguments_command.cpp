#include "cli/arguments_command.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/job_settings.h"
#include "launcher/prompt_file.h"
#include "protocol/call_arguments.h"
#include "strategies/family.h"
#include "strategies/model_config.h"

namespace dp::cli {
namespace {

using protocol::CallArgument;
using protocol::CallType;

// How `arguments` names each kind of call argument.
const char* type_name(protocol::CallType type) {
    constexpr std::pair<CallType, const char*> kNames[] = {
        {CallType::kNumber, "number"},           {CallType::kWhole, "integer"},
        {CallType::kBlocks, "list of integers"}, {CallType::kAdapters, "list of adapters"},
        {CallType::kCache, "step cache"},        {CallType::kImage, "image file"},
        {CallType::kScheduler, "scheduler"},     {CallType::kSchedulerOverrides, "object"},
        {CallType::kNumbers, "list of numbers"}};
    for (const auto& [t, name] : kNames)
        if (t == type) return name;
    return "value";
}

// One row of the listing.
struct Entry {
    std::string name;
    std::vector<std::string> aliases;
    std::string type;  // "number", "integer", "list of integers", "string"
    nlohmann::json default_value;
    std::string default_text;   // when the JSON value alone would not say it
    nlohmann::json min, max;    // null: no range
    bool min_excluded = false;  // above min (strength)
    std::string flag;           // empty: none
    std::string env;
    bool ignored = false;
    bool required = false;  // every line must give it (or the job)
    bool pixels = true;
    std::string help;
};

std::string env_of(const std::string& flag) {
    std::string env = "DP_";
    for (char c : flag.substr(2))
        env += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return env;
}

nlohmann::json bound(const CallArgument& row, double v) {
    if (row.type == CallType::kNumber) return v;
    return static_cast<int64_t>(v);
}

// A side's default as `arguments` shows it: the model's `v`, in multiples of `m`; where an edit's
// size is its image's, as its pipeline makes it (Note [output size]), that. Empty: `v` alone.
std::string side_default_text(const strategies::ModelInfo& model, int v, int64_t m) {
    const std::string multiples = m > 1 ? " (multiples of " + std::to_string(m) + ")" : "";
    const protocol::FamilyArgument* image = model.arguments.find("image");
    const strategies::FamilyFacts& facts = strategies::facts_of(*model.spec);
    if (!image || !facts.size_from_input) return m > 1 ? std::to_string(v) + multiples : std::string();
    return (image->required ? std::string() : std::to_string(v) + "; an edit: ") +
           (facts.input_size ? std::string(facts.size_from_first_picture ? "its first" : "its last") +
                                   " picture's, as the pipeline sizes it"
                             : std::string("its image's, rounded down")) +
           multiples;
}

// Every key a line may hold for `model`, with the default a line that leaves it out gets under `job`.
std::vector<Entry> entries(const launcher::JobOptions& job, const strategies::ModelInfo& model) {
    std::vector<Entry> out;
    launcher::PromptRecord empty;
    empty.prompt = "-";
    const protocol::JobRequest defaults = launcher::job_request(empty, job, model);
    {
        Entry e;
        e.name = "negative_prompt";
        e.type = "string";
        e.default_value =
            defaults.negative_prompt ? nlohmann::json(*defaults.negative_prompt) : nlohmann::json();
        e.flag = "--negative-prompt";
        e.help = "What the image should not show; null: none (diffusers' None, over --negative-prompt)";
        out.push_back(e);
    }
    {
        Entry e;
        e.name = "seed";
        e.type = "integer";
        e.default_text = "--seed + the line's index";
        e.min = 0;
        e.max = std::numeric_limits<uint64_t>::max();
        e.flag = "--seed";
        e.help =
            "The seed of the line's initial noise, drawn on the CPU as diffusers' torch.Generator(\"cpu\") "
            "does";
        out.push_back(e);
    }
    {
        Entry e;
        e.name = "num_images_per_prompt";
        e.type = "integer";
        e.default_value = job.images_per_prompt;
        e.min = 1;
        e.max = launcher::kMaxImagesPerPrompt;
        e.flag = "--num-images-per-prompt";
        e.help = "Images of the line, with seeds seed, seed + 1, ..., each a record and a file of its own";
        e.pixels = false;
        out.push_back(e);
    }
    for (const protocol::FamilyArgument& a : model.arguments.all()) {
        const CallArgument& row = *a.row;
        Entry e;
        e.name = row.name;
        if (row.alias) e.aliases.push_back(row.alias);
        e.flag = row.long_flag();
        e.help = row.help;
        e.ignored = a.ignored;
        e.required = a.required;
        if (a.required) e.default_text = "required";
        if (a.row->none_default) e.default_value = nullptr, e.default_text = "none";
        e.pixels = row.pixels && !a.ignored;
        e.type = type_name(row.type);
        if (row.type == CallType::kBlocks) {
            e.min = 0;
            e.max = model.shape.layers - 1;  // the model's transformer blocks
        } else if (row.type != CallType::kImage && row.type != CallType::kScheduler &&
                   row.type != CallType::kSchedulerOverrides) {  // a path or a name has no range
            e.min_excluded = row.above_min;
            e.min = bound(row, row.min);
            e.max = bound(row, a.max);
        }
        if (row.universal) {
            const bool side = e.name == "width" || e.name == "height";
            const int v = e.name == "width"    ? defaults.width
                          : e.name == "height" ? defaults.height
                                               : defaults.steps;
            e.default_value = v;
            if (side) {  // the model's own sizes: multiples of its patch in pixels, up to its largest
                const int64_t m = std::max<int64_t>(1, model.sizes.multiple());
                const int64_t lo = (static_cast<int64_t>(row.min) + m - 1) / m * m;
                int64_t hi = static_cast<int64_t>(row.max);
                if (model.sizes.max_side() > 0) hi = std::min(hi, model.sizes.max_side());
                e.min = lo;
                e.max = hi / m * m;
                e.default_text = side_default_text(model, v, m);
            }
        } else if (const protocol::CallValue* v = defaults.arguments.find(row.name)) {
            e.default_value = protocol::call_value_json(*v);
        } else if (!row.none_default) {
            e.default_value = protocol::call_value_json(a.value);  // ignored: accepted at any value
        }
        if (row.type == CallType::kScheduler && e.default_value == "")
            e.default_text = "the model's own (scheduler/scheduler_config.json)";
        if (a.ignored) e.help += " (accepted and ignored by " + model.family_name + ", as diffusers does)";
        out.push_back(e);
    }
    {
        Entry e;
        e.name = "name";
        e.type = "string";
        e.default_text = "the prompt's first words";
        e.help = "The image's file name after its index (1 to 200 bytes, made path-safe)";
        e.pixels = false;
        out.push_back(e);
    }
    for (Entry& e : out)
        if (!e.flag.empty()) e.env = env_of(e.flag);
    return out;
}

std::string shown(const Entry& e) {
    if (!e.default_text.empty()) return e.default_text;
    return e.default_value.is_null() ? "null" : e.default_value.dump();
}

// A bound as text: 100 rather than 100.0.
std::string bound_text(const nlohmann::json& v) {
    if (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())))
        return std::to_string(static_cast<int64_t>(v.get<double>()));
    return v.dump();
}

std::string range(const Entry& e) {
    if (e.min.is_null()) return "";
    return (e.min_excluded ? "above " : "") + bound_text(e.min) + " to " + bound_text(e.max);
}

// What each kind of line runs on `model`, as diffusers' classes do for the same weights.
std::string line_kinds(const strategies::ModelInfo& model) {
    const strategies::ParallelSpec& spec = *model.spec;
    std::string required;
    for (const protocol::FamilyArgument& a : model.arguments.all())
        if (a.required) required += std::string(required.empty() ? "\"" : " and \"") + a.row->name + "\"";
    if (!required.empty())
        return "Every line needs " + required + " (or the job's flags): each runs " + spec.pipeline_class +
               (spec.inpaint_class.empty() ? "." : " (the mask's white part repainted).");
    std::string out = "A line without \"image\" runs " + spec.pipeline_class + " (text to image)";
    if (spec.img2img_class.empty()) return out + "; this model edits no images.";
    if (spec.img2img_class == spec.pipeline_class)
        return out +
               "; a line with \"image\" runs it too, the image a reference the model sees beside "
               "what it makes (an instruction edit).";
    out += "; a line with \"image\" runs " + spec.img2img_class +
           " (img2img: the image redone from the noise level \"strength\" selects)";
    if (spec.inpaint_class.empty()) return out + ".";
    return out + ", and with \"mask_image\" too " + spec.inpaint_class +
           " (inpainting: only the mask's white part redone).";
}

}  // namespace

std::string describe_arguments(const launcher::JobOptions& job, bool json) {
    const strategies::ModelInfo model = strategies::read_model_info(job.model);
    // What the job would refuse of this model and these settings, refused here as the job does
    // (the same checks, the same exit code), rather than defaults printed that no prompt could run.
    launcher::check_model_and_settings(job, model, job.device_map);
    const std::vector<Entry> all = entries(job, model);
    if (json) {
        nlohmann::json out = nlohmann::json::array();
        for (const Entry& e : all)
            out.push_back({{"name", e.name},
                           {"jsonl_key", e.name},
                           {"aliases", e.aliases},
                           {"type", e.type},
                           {"default", e.default_value},
                           {"min", e.min},
                           {"min_excluded", e.min_excluded},
                           {"max", e.max},
                           {"flag", e.flag.empty() ? nlohmann::json() : nlohmann::json(e.flag)},
                           {"env", e.env.empty() ? nlohmann::json() : nlohmann::json(e.env)},
                           {"ignored", e.ignored},
                           {"required", e.required},
                           {"shapes_pixels", e.pixels},
                           {"help", e.help}});
        return out.dump(2) + "\n";
    }
    std::ostringstream text;
    text << "Call arguments of " << launcher::utf8_for_display(job.model) << " (" << model.family_name << ", "
         << model.spec->pipeline_class
         << "). A JSONL prompt line needs \"prompt\" and may set these keys; a line "
         << "that leaves one out gets its default:\n";
    const std::vector<std::string> header = {"KEY", "TYPE", "RANGE", "DEFAULT", "FLAG"};
    std::vector<std::vector<std::string>> rows;
    for (const Entry& e : all) {
        std::string key = e.name;
        for (const std::string& alias : e.aliases) key += " (or " + alias + ")";
        rows.push_back({key, e.type, range(e), shown(e), e.flag.empty() ? "-" : e.flag});
    }
    std::vector<std::size_t> width(header.size());
    for (std::size_t c = 0; c < header.size(); ++c) {
        width[c] = header[c].size();
        for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
    }
    const auto line = [&](const std::vector<std::string>& cells, const std::string& tail) {
        text << " ";
        for (std::size_t c = 0; c < cells.size(); ++c)
            text << " " << cells[c] << std::string(width[c] - cells[c].size() + 1, ' ');
        text << tail << "\n";
    };
    line(header, " WHAT IT DOES");
    for (std::size_t i = 0; i < rows.size(); ++i) line(rows[i], " " + all[i].help);
    text << "Any other key is refused (exit 65). `dp-launch arguments --model M --json` prints the same as "
            "JSON.\n";
    // What each kind of line runs, as diffusers' classes do for the same weights.
    text << line_kinds(model) << "\n";
    return text.str();
}

}  // namespace dp::cli
