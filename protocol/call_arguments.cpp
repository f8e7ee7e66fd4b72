#include "protocol/call_arguments.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "protocol/errors.h"
#include "protocol/number_text.h"

namespace dp::protocol {
namespace {

constexpr double kMaxBlockIndex = 100000;  // a transformer block; the model's own count is checked with it

}  // namespace

const std::vector<CallArgument>& call_arguments() {
    // Which families take a row, and at which default, each family declares in its facts file
    // (strategies/families/; Note [a family in one place]).
    static const std::vector<CallArgument> rows = [] {
        std::vector<CallArgument> r;
        const auto add = [&r](const char* name, CallType type, double min, double max, const char* flags,
                              const char* value_name, const char* help) -> CallArgument& {
            r.push_back(CallArgument{name, type, min, max, flags, value_name, help});
            return r.back();
        };
        {
            CallArgument& a =
                add("num_inference_steps", CallType::kWhole, 1, 1000,
                    "--steps,--num-inference-steps,--num_inference_steps", "N", "Denoising steps");
            a.universal = true;
            a.alias = "steps";
            a.model_default = true;
        }
        add("width", CallType::kWhole, 8, 8192, "--width", "PX", "Image width").universal = true;
        add("height", CallType::kWhole, 8, 8192, "--height", "PX", "Image height").universal = true;
        add("guidance_scale", CallType::kNumber, 0, 100, "--guidance-scale,--guidance_scale", "X",
            "SD3's classifier-free guidance scale (1 or less: no guidance); FLUX.1-dev's embedded guidance; "
            "Z-Image's (0: no guidance)")
            .model_default = true;
        add("true_cfg_scale", CallType::kNumber, 0, 100, "--true-cfg-scale,--true_cfg_scale", "X",
            "Qwen-Image's and FLUX.1's classifier-free guidance scale: it runs above 1 for prompts with a "
            "negative prompt")
            .model_default = true;
        add("max_sequence_length", CallType::kWhole, 1, 1024, "--max-sequence-length,--max_sequence_length",
            "N",
            "The text encoder's tokens per prompt (diffusers' max_sequence_length); SD3's and FLUX's T5 take "
            "at "
            "most 512 (SD3 without T5: as many zero positions)")
            .model_default = true;
        // Repeatable on the command line; a prompt line's list replaces the flags' whole list.
        add("lora", CallType::kAdapters, -1000, 1000, "--lora", "PATH[:SCALE]",
            "A LoRA adapter (diffusers/PEFT or kohya safetensors) and its scale (1 when left out); repeat "
            "for "
            "several, applied together")
            .unit = "an adapter's scale";
        add("cache", CallType::kCache, 0, 10, "--cache", "TYPE[:KEY=VALUE,...]",
            "A step cache, as diffusers' enable_cache names it: first_block_cache:threshold=T reuses the "
            "other "
            "blocks' last output while the first block's changes by less than T (relative); taylorseer_cache "
            "extrapolates the attentions between computed steps; mag_cache:mag_ratios=flux|FILE skips whole "
            "steps by the model's magnitude ratios (mag_cache:calibrate=true measures them); none: every "
            "step "
            "computed in full")
            .unit = "a first-block threshold";
        add("skip_guidance_layers", CallType::kBlocks, 0, kMaxBlockIndex,
            "--skip-guidance-layers,--skip_guidance_layers", "BLOCKS",
            "Skip-layer guidance: transformer blocks a third branch skips, a comma list such as 7,8,9 (SD3.5 "
            "medium's); empty: none");
        add("skip_layer_guidance_scale", CallType::kNumber, 0, 100,
            "--skip-layer-guidance-scale,--skip_layer_guidance_scale", "X",
            "How far skip-layer guidance moves the noise away from the skipping branch")
            .active_with = "skip_guidance_layers";
        {
            CallArgument& a =
                add("skip_layer_guidance_start", CallType::kNumber, 0, 1,
                    "--skip-layer-guidance-start,--skip_layer_guidance_start", "F",
                    "Fraction of the steps after which skip-layer guidance runs (below the stop)");
            a.active_with = "skip_guidance_layers";
            a.below = "skip_layer_guidance_stop";
            a.below_why = "the start must be below the stop";
            a.unit = "fractions of the steps";
        }
        {
            CallArgument& a = add("skip_layer_guidance_stop", CallType::kNumber, 0, 1,
                                  "--skip-layer-guidance-stop,--skip_layer_guidance_stop", "F",
                                  "Fraction of the steps after which skip-layer guidance stops");
            a.active_with = "skip_guidance_layers";
            a.unit = "fractions of the steps";
        }
        // Note [input images]: img2img, the pipeline each family's *Img2ImgPipeline is.
        add("image", CallType::kImage, 0, kMaxInputPictures, "--image", "PATH",
            "An image to edit (img2img): a PNG, JPEG or WebP file; in a prompt line, relative to the "
            "prompt file's folder. With --prompt, a glob or a folder gives one line per image, sorted. "
            "A pipeline that takes several pictures (Qwen-Image-Edit-Plus) takes a list "
            "([\"a.png\", \"b.png\"]; the flag given again)");
        add("mask_image", CallType::kImage, 0, 0, "--mask-image,--mask_image", "PATH",
            "Inpainting: a mask of `image` (white: repainted, black: kept), made grey and binarized as "
            "diffusers does; with --prompt and a folder of images, a folder of masks of the same names")
            .active_with = "image";
        {
            CallArgument& a = add("strength", CallType::kNumber, 0, 1, "--strength", "S",
                                  "How much of an image (`image`) is redone: the denoising starts at "
                                  "this fraction of the steps' noise (1: all of it; the steps run are "
                                  "about steps x S)");
            a.above_min = true;
            a.active_with = "image";
        }
        {
            // Note [padding_mask_crop] (runtime/pipeline/image_inputs.h).
            CallArgument& a = add("padding_mask_crop", CallType::kWhole, 0, 8192,
                                  "--padding-mask-crop,--padding_mask_crop", "PX",
                                  "Inpainting on the mask's region only: the region its white part covers, "
                                  "grown by this many pixels and to the output's ratio, is redone at the "
                                  "output size and pasted back into the whole image through the mask (the "
                                  "image made is the input's size; the mask must be too)");
            a.active_with = "mask_image";
            a.none_default = true;
        }
        // FluxKontextPipeline's: the output's width and height scaled to this many pixels at their
        // ratio, each rounded down to the size multiple (Note [output size], strategies/family.h).
        add("max_area", CallType::kWhole, 1024, 8192.0 * 8192.0, "--max-area,--max_area", "PIXELS",
            "The output's pixels (FLUX.1-Kontext): width and height are scaled to this area at their "
            "ratio, each rounded down to the size multiple")
            .model_default = true;
        // Note [Qwen2.5-VL positions with images] (runtime/models/common/qwen2_vision.h).
        add("sequential_positions", CallType::kWhole, 0, 1, "--sequential-positions,--sequential_positions",
            "0|1",
            "Qwen-Image-Edit: 1 gives the text encoder's image tokens sequential positions, as diffusers "
            "0.42.1 with transformers 5 does (diffusers issue #14194); 0: Qwen2.5-VL's three-section "
            "positions, as the model was trained");
        // Z-Image's guidance refinements (ZImagePipeline's call arguments).
        add("cfg_normalization", CallType::kNumber, 0, 100, "--cfg-normalization,--cfg_normalization", "X",
            "Z-Image: above 0, each guided prediction's norm is kept within X times the positive "
            "prediction's (true is 1); 0: off");
        r.back().model_default = true;
        r.back().boolean = true;
        add("cfg_truncation", CallType::kNumber, 0, 1, "--cfg-truncation,--cfg_truncation", "X",
            "Z-Image: steps past this fraction of the schedule ((1000 - timestep) / 1000 above X) run "
            "without guidance; 1: every step guided")
            .model_default = true;
        // Note [one scheduler table] (protocol/schedulers.h): every family takes these.
        add("scheduler", CallType::kScheduler, 0, 0, "--scheduler", "NAME|FILE",
            "The sampler: euler (the models' own), heun, lcm, dpm++-2m, dpm++-2m-sde, unipc, as diffusers' "
            "flow-matching schedulers compute them, or a diffusers scheduler_config.json")
            .every_family = true;
        add("scheduler_config", CallType::kSchedulerOverrides, 0, 0, "--scheduler-config,--scheduler_config",
            "JSON",
            "Scheduler config keys over the model's, diffusers' names: {\"use_karras_sigmas\": true}, "
            "{\"shift\": 3.0}, {\"stochastic_sampling\": true}, {\"solver_order\": 3}")
            .every_family = true;
        add("sigmas", CallType::kNumbers, 0, 1, "--sigmas", "S1,S2,...",
            "The schedule's sigmas, one per step, decreasing in (0, 1] (diffusers' sigmas; the scheduler "
            "still shifts them as its config says)")
            .every_family = true;
        add("timesteps", CallType::kNumbers, 0, 1000000, "--timesteps", "T1,T2,...",
            "The schedule's timesteps, one per step, decreasing (diffusers' timesteps)")
            .every_family = true;
        return r;
    }();
    return rows;
}

const CallArgument* find_call_argument(std::string_view name) {
    for (const CallArgument& a : call_arguments())
        if (name == a.name || (a.alias && name == a.alias)) return &a;
    return nullptr;
}

std::string CallArgument::expected(double family_max) const {
    const double hi = family_max > 0 ? family_max : max;
    switch (type) {
        case CallType::kNumber:
            return "a number " + std::string(above_min ? "above " : "from ") + number_text(min) + " to " +
                   number_text(hi) + (boolean ? ", true (1) or false (0)" : "");
        case CallType::kWhole:
            return "a whole number from " + number_text(min) + " to " + number_text(hi);
        case CallType::kBlocks:
            return "a list of distinct transformer block indices, e.g. [7, 8, 9] ([] for none)";
        case CallType::kAdapters:
            return "a LoRA file's path, {\"path\": PATH, \"scale\": X} with X a number from " +
                   number_text(min) + " to " + number_text(hi) + ", or a list of them ([] for none)";
        case CallType::kCache:
            return "first_block_cache:threshold=T with T a number from " + number_text(min) + " to " +
                   number_text(hi) +
                   ", taylorseer_cache[:KEY=VALUE,...], mag_cache:mag_ratios=flux|FILE[,...], "
                   "mag_cache:calibrate=true, {\"type\": \"first_block_cache\", \"threshold\": T}, or none";
        case CallType::kImage:
            return "an image file's path (PNG, JPEG or WebP), or {\"path\": PATH, \"sha256\": HEX}" +
                   (hi > 1 ? ", or a list of 1 to " + number_text(hi) + " of them" : std::string());
        case CallType::kScheduler:
            return "a scheduler's name (" + scheduler_names() + ") or a diffusers scheduler_config.json path";
        case CallType::kSchedulerOverrides:
            return "an object of diffusers' scheduler config keys, e.g. {\"use_karras_sigmas\": true}";
        case CallType::kNumbers:
            return "a list of numbers from " + number_text(min) + " to " + number_text(hi);
    }
    return {};
}

std::vector<InputImage> InputImage::pictures() const {
    if (empty()) return {};
    std::vector<InputImage> out{*this};
    out.front().more.clear();
    out.insert(out.end(), more.begin(), more.end());
    return out;
}

InputImage InputImage::last() const { return more.empty() ? *this : more.back(); }

InputImage InputImage::of(const std::vector<InputImage>& pictures) {
    if (pictures.empty()) return {};
    InputImage out = pictures.front();
    out.more.assign(pictures.begin() + 1, pictures.end());
    for (InputImage& p : out.more) p.more.clear();
    return out;
}

std::string CallArgument::long_flag() const {
    const std::string all = flags;
    return all.substr(0, all.find(','));
}

// --- CallValues ---

namespace {

const CallArgument& row_named(std::string_view name) {
    const CallArgument* row = find_call_argument(name);
    if (!row) throw InternalError("no call argument is named '" + std::string(name) + "'");
    return *row;
}

bool fits(const CallArgument& row, const CallValue& value) {
    switch (row.type) {
        case CallType::kNumber:
            return std::holds_alternative<double>(value);
        case CallType::kWhole:
            return std::holds_alternative<int64_t>(value);
        case CallType::kBlocks:
            return std::holds_alternative<std::vector<int>>(value);
        case CallType::kAdapters:
            return std::holds_alternative<Adapters>(value);
        case CallType::kCache:
            return std::holds_alternative<StepCache>(value);
        case CallType::kImage:
            return std::holds_alternative<InputImage>(value);
        case CallType::kScheduler:
            return std::holds_alternative<SchedulerChoice>(value);
        case CallType::kSchedulerOverrides:
            return std::holds_alternative<SchedulerOverrides>(value);
        case CallType::kNumbers:
            return std::holds_alternative<std::vector<double>>(value);
    }
    return false;
}

std::size_t row_position(const CallArgument* row) {
    return static_cast<std::size_t>(row - call_arguments().data());
}

}  // namespace

namespace {

// The value of type T that `values` holds for `name`, T's empty value when it holds none, and an
// InternalError naming `what` T is when it holds another kind.
template <typename T>
const T& held_or_none(const CallValues& values, std::string_view name, const char* what) {
    static const T none;
    const CallValue* v = values.find(name);
    if (!v) return none;
    if (const T* held = std::get_if<T>(v)) return *held;
    throw InternalError("the call argument '" + std::string(name) + "' is not " + what);
}

}  // namespace

const CallValue* CallValues::find(std::string_view name) const {
    for (const Item& item : items_)
        if (name == item.first->name || (item.first->alias && name == item.first->alias)) return &item.second;
    return nullptr;
}

double CallValues::number(std::string_view name) const {
    const CallValue* v = find(name);
    if (v && std::holds_alternative<double>(*v)) return std::get<double>(*v);
    if (v && std::holds_alternative<int64_t>(*v)) return static_cast<double>(std::get<int64_t>(*v));
    throw InternalError("the call argument '" + std::string(name) + "' is " +
                        (v ? "not a number" : "not set"));
}

int64_t CallValues::whole(std::string_view name) const {
    const CallValue* v = find(name);
    if (v && std::holds_alternative<int64_t>(*v)) return std::get<int64_t>(*v);
    throw InternalError("the call argument '" + std::string(name) + "' is " +
                        (v ? "not a whole number" : "not set"));
}

const std::vector<int>& CallValues::blocks(std::string_view name) const {
    const CallValue* v = find(name);
    if (v && std::holds_alternative<std::vector<int>>(*v)) return std::get<std::vector<int>>(*v);
    throw InternalError("the call argument '" + std::string(name) + "' is " + (v ? "not a list" : "not set"));
}

const Adapters& CallValues::adapters(std::string_view name) const {
    return held_or_none<Adapters>(*this, name, "a list of adapters");
}

const StepCache& CallValues::cache(std::string_view name) const {
    return held_or_none<StepCache>(*this, name, "a step cache");
}

const InputImage& CallValues::image(std::string_view name) const {
    return held_or_none<InputImage>(*this, name, "an input image");
}

const SchedulerChoice& CallValues::scheduler(std::string_view name) const {
    return held_or_none<SchedulerChoice>(*this, name, "a scheduler");
}

const SchedulerOverrides& CallValues::scheduler_overrides(std::string_view name) const {
    return held_or_none<SchedulerOverrides>(*this, name, "a scheduler's config");
}

const std::vector<double>& CallValues::numbers(std::string_view name) const {
    return held_or_none<std::vector<double>>(*this, name, "a list of numbers");
}

void CallValues::set(const CallArgument& row, CallValue value) {
    if (row.universal)
        throw InternalError(std::string(row.name) + " is held in a request's own field, not its call values");
    if (!fits(row, value)) throw InternalError(std::string("a value of the wrong type for ") + row.name);
    const std::size_t at = row_position(&row);
    auto it = std::find_if(items_.begin(), items_.end(),
                           [&](const Item& item) { return row_position(item.first) >= at; });
    if (it != items_.end() && it->first == &row) {
        it->second = std::move(value);
        return;
    }
    items_.insert(it, Item{&row, std::move(value)});
}

void CallValues::set(std::string_view name, CallValue value) { set(row_named(name), std::move(value)); }

void CallValues::erase(std::string_view name) {
    items_.erase(std::remove_if(items_.begin(), items_.end(),
                                [&](const Item& item) { return name == item.first->name; }),
                 items_.end());
}

bool CallValues::operator==(const CallValues& other) const { return items_ == other.items_; }

int edit_first_step(int steps, double strength) {
    const double init = std::min(steps * strength, static_cast<double>(steps));
    return static_cast<int>(std::max(steps - init, 0.0));
}

void put_path(nlohmann::json& j, const std::string& key, const std::string& path) {
    try {
        (void)nlohmann::json(path).dump();
        j[key] = path;
    } catch (const nlohmann::json::type_error&) {
        static const char* const kDigits = "0123456789abcdef";
        std::string hex;
        for (const unsigned char c : path) {
            hex += kDigits[c >> 4];
            hex += kDigits[c & 15];
        }
        j[key + "_hex"] = hex;
    }
}

bool path_from_hex(const std::string& hex, std::string& out) {
    if (hex.empty() || hex.size() % 2 != 0 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
        return false;
    out.clear();
    for (std::size_t i = 0; i < hex.size(); i += 2)
        out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    return true;
}

nlohmann::json call_value_json(const CallValue& value) {
    if (const double* d = std::get_if<double>(&value)) return *d;
    if (const int64_t* i = std::get_if<int64_t>(&value)) return *i;
    if (const Adapters* adapters = std::get_if<Adapters>(&value)) {
        nlohmann::json out = nlohmann::json::array();
        for (const Adapter& a : *adapters) {
            nlohmann::json j = nlohmann::json::object();
            put_path(j, "path", a.path);
            j["scale"] = a.scale;
            if (!a.sha256.empty()) j["sha256"] = a.sha256;
            out.push_back(std::move(j));
        }
        return out;
    }
    if (const StepCache* c = std::get_if<StepCache>(&value)) return c->text();
    if (const auto* choice = std::get_if<SchedulerChoice>(&value)) return scheduler_choice_json(*choice);
    if (const auto* keys = std::get_if<SchedulerOverrides>(&value))
        return keys->empty() ? nlohmann::json::object() : nlohmann::json::parse(keys->json);
    if (const auto* list = std::get_if<std::vector<double>>(&value)) return *list;
    if (const InputImage* image = std::get_if<InputImage>(&value)) {
        if (image->empty()) return nullptr;
        const auto one = [](const InputImage& picture) {
            nlohmann::json j = nlohmann::json::object();
            put_path(j, "path", picture.path);
            if (!picture.sha256.empty()) j["sha256"] = picture.sha256;
            if (picture.width > 0) j["width"] = picture.width, j["height"] = picture.height;
            return j;
        };
        if (image->more.empty()) return one(*image);
        nlohmann::json list = nlohmann::json::array();  // Note [several input images]
        for (const InputImage& picture : image->pictures()) list.push_back(one(picture));
        return list;
    }
    return std::get<std::vector<int>>(value);
}

std::string parse_adapter_text(const std::string& text, Adapter& out) {
    out = Adapter{};
    out.path = text;
    if (const auto colon = text.rfind(':'); colon != std::string::npos && colon + 1 < text.size()) {
        const std::string tail = text.substr(colon + 1);
        char* end = nullptr;
        const double v = std::strtod(tail.c_str(), &end);
        if (end && *end == '\0' && tail.find_first_not_of("+-.0123456789eE") == std::string::npos) {
            if (!std::isfinite(v)) return "the scale '" + tail + "' is not a finite number";
            out.path = text.substr(0, colon);
            out.scale = v;
        }
    }
    if (out.path.empty()) return "expected PATH or PATH:SCALE";
    if (out.path.find('\0') != std::string::npos) return "the path contains a NUL character";
    return {};
}

std::string call_value_text(const CallValue& value) {
    if (const double* d = std::get_if<double>(&value)) return number_text(*d);
    if (const int64_t* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
    if (const Adapters* adapters = std::get_if<Adapters>(&value)) {
        std::string out;
        for (const Adapter& a : *adapters)
            out += (out.empty() ? "" : " ") + a.path + ":" + number_text(a.scale);
        return out.empty() ? "none" : out;
    }
    if (const StepCache* c = std::get_if<StepCache>(&value)) return c->text();
    if (const auto* choice = std::get_if<SchedulerChoice>(&value))
        return choice->name.empty()     ? "the model's"
               : choice->config.empty() ? choice->name
                                        : choice->name + " " + choice->config;
    if (const auto* keys = std::get_if<SchedulerOverrides>(&value)) return keys->empty() ? "{}" : keys->json;
    if (const auto* list = std::get_if<std::vector<double>>(&value)) {
        std::string out;
        for (double v : *list) out += (out.empty() ? "" : ",") + number_text(v);
        return out.empty() ? "none" : out;
    }
    if (const InputImage* image = std::get_if<InputImage>(&value)) {
        std::string out;
        for (const InputImage& picture : image->pictures()) out += (out.empty() ? "" : ", ") + picture.path;
        return out.empty() ? "none" : out;
    }
    std::string out;
    for (int b : std::get<std::vector<int>>(value)) out += (out.empty() ? "" : ",") + std::to_string(b);
    return out.empty() ? "none" : out;
}

namespace {

// The readers of read_call_value, one per row type: each returns an error text (`expected`, with
// why when there is more to say) or empty, with the value in `out`. `hi`: the row's or the
// family's largest value.

std::string read_number(const CallArgument& row, const nlohmann::json& j, double hi,
                        const std::string& expected, CallValue& out) {
    if (row.boolean && j.is_boolean()) {
        out = j.get<bool>() ? 1.0 : 0.0;
        return {};
    }
    if (!j.is_number() || !std::isfinite(j.get<double>()) || j.get<double>() < row.min ||
        j.get<double>() > hi || (row.above_min && j.get<double>() == row.min))
        return expected;
    out = j.get<double>();
    return {};
}

std::string read_whole(const CallArgument& row, const nlohmann::json& j, double hi,
                       const std::string& expected, CallValue& out) {
    if (!j.is_number_integer()) return expected;
    // A whole number past int64's range is an unsigned one: out of every row's range.
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return expected;
    const int64_t v = j.get<int64_t>();
    if (static_cast<double>(v) < row.min || static_cast<double>(v) > hi) return expected;
    out = v;
    return {};
}

std::string read_blocks(const CallArgument& row, const nlohmann::json& j, double hi,
                        const std::string& expected, CallValue& out) {
    if (!j.is_array()) return expected;
    std::vector<int> blocks;
    for (const nlohmann::json& v : j) {
        if (!v.is_number_integer() || v.get<int64_t>() < row.min || v.get<int64_t>() > hi) return expected;
        const int b = static_cast<int>(v.get<int64_t>());
        if (std::find(blocks.begin(), blocks.end(), b) != blocks.end())
            return "block " + std::to_string(b) + " is listed twice";
        blocks.push_back(b);
    }
    out = std::move(blocks);
    return {};
}

// One key of an adapter given as an object into `a`.
std::string read_adapter_key(const CallArgument& row, const std::string& key, const nlohmann::json& v,
                             double hi, const std::string& expected, Adapter& a) {
    if (key == "path" && v.is_string()) {
        a.path = v.get<std::string>();
    } else if (key == "path_hex" && v.is_string() && path_from_hex(v.get<std::string>(), a.path)) {
        // a path that is not UTF-8, as the job file and the manifest write it
    } else if (key == "scale" && v.is_number() && std::isfinite(v.get<double>()) &&
               v.get<double>() >= row.min && v.get<double>() <= hi) {
        a.scale = v.get<double>();
    } else if (key == "sha256" && v.is_string() && v.get<std::string>().size() == 64 &&
               v.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos) {
        a.sha256 = v.get<std::string>();
    } else if (key == "path" || key == "path_hex" || key == "scale" || key == "sha256") {
        return expected + " (its '" + key + "' is " +
               (key == "sha256" ? "not 64 lowercase hex digits" : "not valid") + ")";
    } else {
        return expected + " (unknown key '" + key.substr(0, 40) +
               "'; an adapter has path (or path_hex), scale "
               "and sha256)";
    }
    return {};
}

// One adapter: a path, or {"path", "scale", "sha256"}.
std::string read_adapter(const CallArgument& row, const nlohmann::json& item, double hi,
                         const std::string& expected, Adapter& a) {
    if (item.is_string()) {
        a.path = item.get<std::string>();
    } else if (item.is_object()) {
        if (item.contains("path") && item.contains("path_hex"))
            return expected + " (give its path as path or path_hex, not both)";
        for (const auto& [key, v] : item.items())
            if (std::string why = read_adapter_key(row, key, v, hi, expected, a); !why.empty()) return why;
    } else {
        return expected;
    }
    if (a.path.empty() || a.path.find('\0') != std::string::npos)
        return expected + " (an adapter's path must be a non-empty string)";
    return {};
}

// An adapter, or a list of them.
std::string read_adapters(const CallArgument& row, const nlohmann::json& j, double hi,
                          const std::string& expected, CallValue& out) {
    const nlohmann::json list = j.is_array() ? j : nlohmann::json::array({j});
    Adapters adapters;
    for (const nlohmann::json& item : list) {
        Adapter a;
        if (std::string why = read_adapter(row, item, hi, expected, a); !why.empty()) return why;
        adapters.push_back(std::move(a));
    }
    out = std::move(adapters);
    return {};
}

// One KEY=VALUE of a step cache given as an object, in the flag's text form (MagCache's ratios as
// numbers separated by spaces); an error text, or empty.
std::string cache_setting_text(const std::string& key, const nlohmann::json& v, const std::string& expected,
                               std::string& text) {
    if (v.is_number() || v.is_string() || v.is_boolean()) {
        text = key + "=" +
               (v.is_string()           ? v.get<std::string>()
                : v.is_boolean()        ? std::string(v.get<bool>() ? "true" : "false")
                : v.is_number_integer() ? std::to_string(v.get<int64_t>())
                                        : number_text(v.get<double>()));
        return {};
    }
    if (key != "mag_ratios" || !v.is_array() || v.empty())
        return expected + " (its '" + key.substr(0, 40) + "' is not valid)";
    std::string numbers;
    for (const nlohmann::json& r : v) {
        if (!r.is_number()) return expected + " (its 'mag_ratios' must be a list of numbers)";
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.9g", r.get<double>());
        numbers += (numbers.empty() ? "" : " ") + std::string(buf);
    }
    text = key + "=" + numbers;
    return {};
}

// A step cache as the flag's text: the text itself, none for null, or {"type": ..., KEY: VALUE}
// as "TYPE:KEY=VALUE,...".
std::string cache_text(const nlohmann::json& j, const std::string& expected, std::string& text) {
    if (j.is_string()) {
        text = j.get<std::string>();
        return {};
    }
    if (j.is_null()) {
        text = "none";
        return {};
    }
    if (!j.is_object()) return expected;
    std::string keys;
    for (const auto& [key, v] : j.items()) {
        if (key == "type" && v.is_string()) {
            text = v.get<std::string>();
            continue;
        }
        std::string setting;
        if (std::string why = key == "type" ? expected + " (its 'type' is not valid)"
                                            : cache_setting_text(key, v, expected, setting);
            !why.empty())
            return why;
        keys += (keys.empty() ? "" : ",") + setting;
    }
    if (text.empty()) return expected + " (it has no \"type\")";
    if (!keys.empty()) text += ":" + keys;
    return {};
}

std::string read_cache(const nlohmann::json& j, double hi, const std::string& expected, CallValue& out) {
    std::string text;
    if (std::string why = cache_text(j, expected, text); !why.empty()) return why;
    StepCache c;
    if (std::string why = parse_step_cache(text, c, hi); !why.empty()) return why;
    out = c;
    return {};
}

// An input image: a path, or {"path" (or "path_hex"), "sha256", "width", "height"} as the job file
// and the manifest write it; null is none.
std::string read_picture(const nlohmann::json& j, const std::string& expected, InputImage& image) {
    if (j.is_string()) {
        image.path = j.get<std::string>();
    } else if (j.is_object()) {
        for (const auto& [key, v] : j.items()) {
            const bool sha = key == "sha256" && v.is_string() && v.get<std::string>().size() == 64 &&
                             v.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos;
            const bool side = (key == "width" || key == "height") && v.is_number_integer() &&
                              v.get<int64_t>() > 0 && v.get<int64_t>() <= (int64_t{1} << 30);
            if (key == "path" && v.is_string())
                image.path = v.get<std::string>();
            else if (key == "path_hex" && v.is_string() && path_from_hex(v.get<std::string>(), image.path))
                continue;
            else if (sha)
                image.sha256 = v.get<std::string>();
            else if (side)
                (key == "width" ? image.width : image.height) = v.get<int64_t>();
            else
                return expected + " (its '" + key.substr(0, 40) +
                       "' is not valid; an image has path (or path_hex), sha256, width and height)";
        }
    } else if (!j.is_null()) {
        return expected;
    }
    if (!j.is_null() && (image.path.empty() || image.path.find('\0') != std::string::npos))
        return expected + " (an image's path must be a non-empty string)";
    return {};
}

// An input image, or a list of 1 to `hi` of them (Note [several input images]).
std::string read_image(const nlohmann::json& j, double hi, const std::string& expected, CallValue& out) {
    if (!j.is_array()) {
        InputImage image;
        if (std::string why = read_picture(j, expected, image); !why.empty()) return why;
        out = std::move(image);
        return {};
    }
    const std::size_t most = static_cast<std::size_t>(std::max(1.0, hi));
    if (j.empty() || j.size() > most)
        return expected + " (the list has " + std::to_string(j.size()) + " pictures)";
    std::vector<InputImage> pictures;
    for (const nlohmann::json& item : j) {
        InputImage picture;
        if (item.is_null() || item.is_array()) return expected + " (a list holds paths or image objects)";
        if (std::string why = read_picture(item, expected, picture); !why.empty()) return why;
        pictures.push_back(std::move(picture));
    }
    out = InputImage::of(pictures);
    return {};
}

// A list of numbers in the row's range (or "S1,S2,..." as the flag gives it); null is none.
std::string read_numbers(const CallArgument& row, const nlohmann::json& j, double hi,
                         const std::string& expected, CallValue& out) {
    std::vector<double> list;
    if (j.is_string()) {
        std::string text = j.get<std::string>();
        std::size_t at = 0;
        while (at <= text.size() && !text.empty()) {
            const std::size_t comma = text.find(',', at);
            const std::string one =
                text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
            char* end = nullptr;
            const double v = std::strtod(one.c_str(), &end);
            if (one.empty() || !end || *end != '\0')
                return expected + " ('" + one.substr(0, 30) + "' is not a number)";
            list.push_back(v);
            if (comma == std::string::npos) break;
            at = comma + 1;
        }
    } else if (j.is_array()) {
        for (const nlohmann::json& v : j) {
            if (!v.is_number()) return expected;
            list.push_back(v.get<double>());
        }
    } else if (!j.is_null()) {
        return expected;
    }
    if (list.size() > 1000) return expected + " (at most 1000 of them)";
    for (double v : list)
        if (!std::isfinite(v) || v < row.min || v > hi) return expected + " (" + number_text(v) + " is not)";
    out = std::move(list);
    return {};
}

std::string read_scheduler(const nlohmann::json& j, CallValue& out) {
    SchedulerChoice choice;
    if (std::string why = read_scheduler_choice(j, choice); !why.empty()) return why;
    out = std::move(choice);
    return {};
}

std::string read_overrides(const nlohmann::json& j, CallValue& out) {
    SchedulerOverrides keys;
    nlohmann::json parsed = j;
    if (j.is_string()) {  // the flag's JSON text
        parsed = nlohmann::json::parse(j.get<std::string>(), nullptr, false);
        if (parsed.is_discarded()) return "expected a JSON object, e.g. {\"use_karras_sigmas\": true}";
    }
    if (std::string why = read_scheduler_overrides(parsed, keys); !why.empty()) return why;
    out = std::move(keys);
    return {};
}

}  // namespace

std::string read_call_value(const CallArgument& row, const nlohmann::json& j, CallValue& out,
                            double family_max) {
    const double hi = family_max > 0 ? family_max : row.max;
    const std::string expected = "expected " + row.expected(family_max);
    switch (row.type) {
        case CallType::kNumber:
            return read_number(row, j, hi, expected, out);
        case CallType::kWhole:
            return read_whole(row, j, hi, expected, out);
        case CallType::kBlocks:
            return read_blocks(row, j, hi, expected, out);
        case CallType::kAdapters:
            return read_adapters(row, j, hi, expected, out);
        case CallType::kCache:
            return read_cache(j, hi, expected, out);
        case CallType::kImage:
            return read_image(j, hi, expected, out);
        case CallType::kScheduler:
            return read_scheduler(j, out);
        case CallType::kSchedulerOverrides:
            return read_overrides(j, out);
        case CallType::kNumbers:
            return read_numbers(row, j, hi, expected, out);
    }
    return expected;
}

// --- FamilyArguments ---

FamilyArguments::FamilyArguments(std::string family, const std::vector<ArgumentUse>& uses)
    : family_(std::move(family)) {
    for (const ArgumentUse& use : uses) {
        const CallArgument* row = find_call_argument(use.name);
        if (!row || row->name != std::string_view(use.name))
            throw InternalError("the model family '" + family_ + "' takes '" + use.name +
                                "', which is no call argument's name");
    }
    for (const CallArgument& row : call_arguments()) {
        const auto use = std::find_if(uses.begin(), uses.end(), [&](const ArgumentUse& u) {
            return row.name == std::string_view(u.name);
        });
        if (use == uses.end() && !row.universal && !row.every_family) continue;  // every family takes those
        const ArgumentUse declared = use == uses.end() ? ArgumentUse{row.name} : *use;
        FamilyArgument a;
        a.row = &row;
        // An image row takes one picture unless the family says more (Note [several input images]).
        a.max = declared.max > 0 ? declared.max : row.type == CallType::kImage ? 1 : row.max;
        a.ignored = declared.ignored;
        a.required = declared.required;
        a.guidance = declared.guidance;
        if (row.type == CallType::kNumber) a.value = declared.value;
        if (row.type == CallType::kWhole) a.value = static_cast<int64_t>(declared.value);
        if (row.type == CallType::kBlocks) a.value = std::vector<int>{};
        if (row.type == CallType::kAdapters) a.value = Adapters{};
        if (row.type == CallType::kCache) a.value = StepCache{};
        if (row.type == CallType::kImage) a.value = InputImage{};
        if (row.type == CallType::kScheduler) a.value = SchedulerChoice{};
        if (row.type == CallType::kSchedulerOverrides) a.value = SchedulerOverrides{};
        if (row.type == CallType::kNumbers) a.value = std::vector<double>{};
        all_.push_back(a);
    }
    std::stable_partition(all_.begin(), all_.end(), [](const FamilyArgument& a) { return a.row->universal; });
}

const FamilyArgument* FamilyArguments::find(std::string_view name) const {
    for (const FamilyArgument& a : all_)
        if (name == a.row->name || (a.row->alias && name == a.row->alias)) return &a;
    return nullptr;
}

bool FamilyArguments::takes(std::string_view name) const {
    const FamilyArgument* a = find(name);
    return a && !a->ignored;
}

bool FamilyArguments::ignores(std::string_view name) const {
    const FamilyArgument* a = find(name);
    return a && a->ignored;
}

std::vector<std::string> FamilyArguments::names() const {
    std::vector<std::string> out;
    for (const FamilyArgument& a : all_)
        if (!a.row->universal && !a.ignored) out.push_back(a.row->name);
    return out;
}

const FamilyArgument* FamilyArguments::guidance_scale() const {
    for (const FamilyArgument& a : all_)
        if (a.guidance != Guidance::kNone) return &a;
    return nullptr;
}

double FamilyArguments::default_number(std::string_view name) const {
    const FamilyArgument* a = find(name);
    if (!a || (a->row->type != CallType::kNumber && a->row->type != CallType::kWhole))
        throw InternalError("the family '" + family_ + "' has no numeric call argument '" +
                            std::string(name) + "'");
    if (const double* d = std::get_if<double>(&a->value)) return *d;
    return static_cast<double>(std::get<int64_t>(a->value));
}

void FamilyArguments::set_default(std::string_view name, CallValue value) {
    for (FamilyArgument& a : all_)
        if (name == a.row->name) {
            if (!fits(*a.row, value))
                throw InternalError(std::string("a default of the wrong type for ") + a.row->name);
            a.value = std::move(value);
            return;
        }
    throw InternalError("the family '" + family_ + "' has no call argument '" + std::string(name) + "'");
}

CallValues FamilyArguments::defaults() const { return completed(CallValues{}); }

CallValues FamilyArguments::completed(const CallValues& values) const {
    CallValues out;
    for (const FamilyArgument& a : all_) {
        if (a.row->universal || a.ignored) continue;
        const CallValue* given = values.find(a.row->name);
        if (!given && a.row->none_default) continue;  // diffusers' None
        out.set(*a.row, given ? *given : a.value);
    }
    return out;
}

double guidance_threshold(Guidance guidance) { return guidance == Guidance::kAbove0 ? 0.0 : 1.0; }

bool FamilyArguments::runs_two_branches(const CallValues& values, bool has_negative_prompt) const {
    const FamilyArgument* g = guidance_scale();
    if (!g) return false;
    const double scale =
        values.has(g->row->name) ? values.number(g->row->name) : default_number(g->row->name);
    if (scale <= guidance_threshold(g->guidance)) return false;
    return g->guidance != Guidance::kAbove1WithNegative || has_negative_prompt;
}

namespace {

// Whether `value` is something rather than an empty list or no image.
bool something(const CallValue& value) {
    if (const auto* adapters = std::get_if<Adapters>(&value)) return !adapters->empty();
    if (const auto* blocks = std::get_if<std::vector<int>>(&value)) return !blocks->empty();
    if (const auto* image = std::get_if<InputImage>(&value)) return !image->empty();
    if (const auto* choice = std::get_if<SchedulerChoice>(&value)) return !choice->empty();
    if (const auto* keys = std::get_if<SchedulerOverrides>(&value)) return !keys->empty();
    if (const auto* list = std::get_if<std::vector<double>>(&value)) return !list->empty();
    return true;
}

}  // namespace

bool in_effect(const CallValues& values, const CallValues::Item& item) {
    if (const char* with = item.first->active_with) {
        const CallValue* v = values.find(with);
        if (v && !something(*v)) return false;
    }
    return something(item.second);
}

}  // namespace dp::protocol
