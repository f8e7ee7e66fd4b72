#pragma once
// Note [one call-argument table]: every per-prompt call argument of the pipelines is one row here:
// diffusers' name, type, range, each family's default, the flag (whose env twin and config key
// follow from it), whether it shapes the pixels (--resume compares it, the manifest records it),
// whether prompts that differ in it may share a batch, and which family reads it as its
// classifier-free guidance scale (the cost model counts the branches from that). The option table
// (cli/), the prompt-file reader and the job's settings (launcher/), the job file and the requests
// (here), the queue's batching and the cost model (strategies/), the worker's requests and the
// families' code (runtime/) all read these rows. Adding a call argument is its row plus the family
// code that uses it.
//
// Universal rows (num_inference_steps, width, height) are taken by every family and live in the
// requests' own fields; the others live in a request's CallValues. std and nlohmann/json only.

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "protocol/schedulers.h"
#include "protocol/step_cache_setting.h"

namespace dp::protocol {

enum class CallType {
    kNumber,              // a finite number
    kWhole,               // a whole number
    kBlocks,              // a list of distinct transformer block indices
    kAdapters,            // a list of LoRA adapters (Adapter)
    kCache,               // a step cache (StepCache)
    kImage,               // an input image file (InputImage): img2img's `image`
    kScheduler,           // a scheduler's name or config file (SchedulerChoice, Note [one scheduler table])
    kSchedulerOverrides,  // a scheduler's config keys (SchedulerOverrides)
    kNumbers,             // a list of numbers (the sigmas or timesteps of a schedule)
};

// How a family's classifier-free guidance depends on an argument that is its scale.
enum class Guidance {
    kNone,                // not a guidance scale of the family
    kAbove1,              // a negative branch runs when the scale is above 1 (SD3's guidance_scale)
    kAbove1WithNegative,  // ... and a negative prompt is given (FLUX's and Qwen-Image's true CFG)
    kAbove0,              // a negative branch runs when the scale is above 0 (Z-Image's: positive +
                          // scale x (positive - negative))
};

// The scale at or below which `guidance` runs no negative branch: 0 for kAbove0, else 1.
double guidance_threshold(Guidance guidance);

// A family's use of a row, as the family declares it in its facts file (Note [a family in one
// place], strategies/families/): the rows its pipeline takes, at which default. Every family takes
// the universal rows; it declares one to give its default.
struct ArgumentUse {
    const char* name;       // the row's
    double value = 0;       // its default (kBlocks: none, always empty); universal width/height: unused
    double max = 0;         // 0: the row's max; else this family's own limit
    bool ignored = false;   // accepted and ignored, as diffusers does (FLUX.1-schnell's guidance_scale)
    bool required = false;  // every line must give it, or the job (FluxFillPipeline's image and mask)
    Guidance guidance = Guidance::kNone;
};

struct CallArgument {
    const char* name;  // diffusers' name: the JSONL key, the job file's and the manifest's
    CallType type;
    double min, max;  // what any family accepts (kBlocks: the indices)
    const char*
        flags;  // "--guidance-scale,--guidance_scale": env DP_GUIDANCE_SCALE, config key guidance_scale
    const char* value_name;  // the flag's value in --help: "X"
    const char* help;
    bool universal = false;       // every family takes it; requests hold it in a field of their own
    const char* alias = nullptr;  // another JSONL key for it ("steps"); a line gives at most one of them
    bool model_default = false;   // a model folder's generation_defaults.json may set its default
    bool pixels = true;           // it changes an image's pixels: --resume compares it
    bool shared_batch = false;    // prompts that differ in it may still share a batch
    // Its value has an effect only while this kBlocks row is not empty (the skip-layer settings
    // without skipped blocks): the manifest leaves it out and --resume does not compare it then.
    const char* active_with = nullptr;
    const char* below = nullptr;      // its value must be below this row's (skip_layer_guidance_start)
    const char* below_why = nullptr;  // what a value not below it breaks: "the start must be below the stop"
    const char* unit = nullptr;       // what its values measure, for messages: "fractions of the steps"
    bool above_min = false;           // kNumber: `min` itself is refused (strength: above 0)
    // Its default is diffusers' None: a request holds it only when given (padding_mask_crop, where
    // 0 is a value of its own).
    bool none_default = false;
    // kNumber: true and false are taken as 1 and 0, as diffusers takes a bool or a number
    // (cfg_normalization).
    bool boolean = false;
    // Every family takes it, with no value by default (the schedulers' rows): no facts file names it.
    bool every_family = false;

    // "a number from 0 to 100", "a whole number from 1 to 512", "a list of distinct block indices".
    std::string expected(double family_max = 0) const;
    // The first of `flags`: "--guidance-scale".
    std::string long_flag() const;
};

// Every row, in the order messages and records list them.
const std::vector<CallArgument>& call_arguments();
// The row named `name` (or whose alias it is); nullptr when none.
const CallArgument* find_call_argument(std::string_view name);

// One LoRA adapter of a request (Note [adapters], strategies/lora.h): its file, the scale of its
// change (diffusers' set_adapters weight), and the file's SHA-256 in hex, which the launcher reads
// before any rank starts (empty until then; given in a prompt line, it must match).
struct Adapter {
    std::string path;
    double scale = 1.0;
    std::string sha256;
    bool operator==(const Adapter& o) const {
        return path == o.path && scale == o.scale && sha256 == o.sha256;
    }
    bool operator!=(const Adapter& o) const { return !(*this == o); }
};
using Adapters = std::vector<Adapter>;

// Note [input images]: an image a request edits (img2img's `image`): its file, which the launcher
// reads whole before any rank starts (decodes it, Note [input images are checked first]) and
// fills in as an absolute path with the file's SHA-256 and its decoded size, so that every rank
// reads the same file, the manifest records which bytes made an image, and --resume sees a
// changed file as other pixels. An empty path is none (a text-to-image line).
//
// Note [several input images]: a pipeline that takes a list of pictures (QwenImageEditPlusPipeline's
// `image`: "Picture 1", "Picture 2", ...) gets them in one value: the first in the fields, the
// others in `more`, in order. Every reader of the files (the launcher's checks, the records, the
// hash --resume compares) goes over pictures(); a family takes as many as its use of the row's
// max says (1 unless it says more).
struct InputImage {
    std::string path;
    std::string sha256;             // empty until the launcher reads the file
    int64_t width = 0, height = 0;  // its decoded pixels; 0 until then
    std::vector<InputImage> more;   // the pictures after the first, each without `more`
    InputImage() = default;
    explicit InputImage(std::string file) : path(std::move(file)) {}
    bool empty() const { return path.empty(); }
    // How many pictures: 0 for none.
    std::size_t count() const { return empty() ? 0 : 1 + more.size(); }
    // Each picture alone (without `more`), in order; empty for none.
    std::vector<InputImage> pictures() const;
    // The last picture alone (QwenImageEditPlusPipeline sizes its output by it); none for none.
    InputImage last() const;
    // `pictures` as one value (the first in the fields, the others in `more`).
    static InputImage of(const std::vector<InputImage>& pictures);
    bool operator==(const InputImage& o) const {
        return path == o.path && sha256 == o.sha256 && width == o.width && height == o.height &&
               more == o.more;
    }
    bool operator!=(const InputImage& o) const { return !(*this == o); }
};
// The most pictures a value may list (a family's own limit is its use's max).
inline constexpr int kMaxInputPictures = 3;

// "FILE" or "FILE:SCALE" (the flag's form, --lora): the scale is what follows the last ':' when it
// reads as a number, else the whole text is the path and the scale is 1. An error text, or empty.
std::string parse_adapter_text(const std::string& text, Adapter& out);

// A value of a row: kNumber a double, kWhole an int64_t, kBlocks a list, kAdapters adapters,
// kCache a step cache, kImage an input image, kScheduler a scheduler, kSchedulerOverrides its keys,
// kNumbers a list of numbers.
using CallValue = std::variant<double, int64_t, std::vector<int>, Adapters, StepCache, InputImage,
                               SchedulerChoice, SchedulerOverrides, std::vector<double>>;

// The family call arguments of a request or a setting: the non-universal rows it sets, each once,
// in the table's order.
class CallValues {
  public:
    using Item = std::pair<const CallArgument*, CallValue>;

    bool empty() const { return items_.empty(); }
    bool has(std::string_view name) const { return find(name) != nullptr; }
    const CallValue* find(std::string_view name) const;
    // The value of `name`; throws InternalError when it is not set or not of that type (a kWhole
    // reads as a number too).
    double number(std::string_view name) const;
    int64_t whole(std::string_view name) const;
    const std::vector<int>& blocks(std::string_view name) const;
    // The adapters of `name` (empty when it is not set).
    const Adapters& adapters(std::string_view name) const;
    // The step cache of `name` (none when it is not set).
    const StepCache& cache(std::string_view name) const;
    // The input image of `name` (none when it is not set).
    const InputImage& image(std::string_view name) const;
    // The scheduler, its overrides, a list of numbers of `name` (none or empty when not set).
    const SchedulerChoice& scheduler(std::string_view name) const;
    const SchedulerOverrides& scheduler_overrides(std::string_view name) const;
    const std::vector<double>& numbers(std::string_view name) const;
    // Sets `row` (or the row named `name`) to `value`, of the row's type; throws InternalError otherwise.
    void set(const CallArgument& row, CallValue value);
    void set(std::string_view name, CallValue value);
    void erase(std::string_view name);

    const std::vector<Item>& items() const { return items_; }
    bool operator==(const CallValues& other) const;
    bool operator!=(const CallValues& other) const { return !(*this == other); }

  private:
    std::vector<Item> items_;
};

// Whether `item` of `values` changes anything: not an empty list of blocks or adapters nor no
// image, nor a setting of skipped blocks when none are skipped, nor img2img's strength without
// an image (CallArgument::active_with).
bool in_effect(const CallValues& values, const CallValues::Item& item);

// The first of `steps` steps an edit at `strength` runs (diffusers' get_timesteps: int(steps -
// min(steps x strength, steps))); `steps` when none would run (strength 0).
int edit_first_step(int steps, double strength);

// Note [paths in the job file]: a path is bytes on Linux, but JSON text is UTF-8. A path that is
// not UTF-8 is written as "KEY_hex", its bytes in hexadecimal, instead of "KEY", so that every path
// round-trips (the job file's folders and component files, an adapter's path in a request and in
// the manifest); a UTF-8 path is written as it is.
void put_path(nlohmann::json& j, const std::string& key, const std::string& path);
// The bytes `hex` spells (two lowercase hex digits each) into `out`; false when it is not that.
bool path_from_hex(const std::string& hex, std::string& out);

// A value as JSON: a number, a whole number, a list of whole numbers, or a list of adapters
// ({"path", "scale", "sha256"} each, "path_hex" for a path that is not UTF-8; sha256 left out while
// empty).
nlohmann::json call_value_json(const CallValue& value);
// "7.5", "256", "7,8,9", "a.safetensors:0.8 b.safetensors:1" ("none" for an empty list): how
// messages show a value.
std::string call_value_text(const CallValue& value);
// Reads `row`'s value from JSON, against the row's range (or `family_max`): an error text saying
// what is expected ("expected a number from 0 to 100"), or empty.
std::string read_call_value(const CallArgument& row, const nlohmann::json& j, CallValue& out,
                            double family_max = 0);

// One family's call arguments, with their defaults (ParallelSpec::family, or a variant's id).
struct FamilyArgument {
    const CallArgument* row = nullptr;
    CallValue value;  // the default (universal width and height: 0, the model's size)
    double max = 0;   // the family's limit
    bool ignored = false;
    bool required = false;  // ArgumentUse::required
    Guidance guidance = Guidance::kNone;
};

class FamilyArguments {
  public:
    FamilyArguments() = default;
    // The rows family `family` declares it takes (`uses`) and the universal ones, in the table's
    // order, universal ones first. Throws InternalError for a use that names no row.
    FamilyArguments(std::string family, const std::vector<ArgumentUse>& uses);

    const std::string& family() const { return family_; }
    // Every row the family accepts, universal ones first, ignored ones included.
    const std::vector<FamilyArgument>& all() const { return all_; }
    const FamilyArgument* find(std::string_view name) const;
    // Whether the family's pipeline reads it (accepted and not ignored).
    bool takes(std::string_view name) const;
    bool ignores(std::string_view name) const;
    // The names of the rows it reads that are not universal: "guidance_scale, max_sequence_length, ...".
    std::vector<std::string> names() const;
    // The family's classifier-free guidance scale, or nullptr (every family has one today).
    const FamilyArgument* guidance_scale() const;
    // The default of `name` (as a number) and replacing it (generation_defaults.json).
    double default_number(std::string_view name) const;
    void set_default(std::string_view name, CallValue value);
    // The non-universal rows it reads, at their defaults.
    CallValues defaults() const;
    // `values` with every row it reads and `values` leaves out at its default, and nothing else.
    CallValues completed(const CallValues& values) const;

    // Whether a request with these values runs two guidance branches: its guidance scale above 1,
    // and a negative prompt where the family asks for one (Guidance::kAbove1WithNegative).
    bool runs_two_branches(const CallValues& values, bool has_negative_prompt) const;

  private:
    std::string family_;
    std::vector<FamilyArgument> all_;
};

}  // namespace dp::protocol
