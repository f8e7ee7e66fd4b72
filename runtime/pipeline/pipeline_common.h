#pragma once
// What every family's pipeline does the same way: when it loads, it checks the folder against the
// family's rules before reading a weight, finds each component's device and opens its weights
// (the files, or seeded random ones); when it has decoded, it makes the uint8 images.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/weights.h"
#include "runtime/pipeline/adapters.h"
#include "runtime/pipeline/pipeline.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {

class ConfigJson;
class ParallelContext;

// What would stop `spec`'s family's pipeline loading, checked before a weight is read: a
// model_index.json of another pipeline class, everything the folder's files say
// (strategies::model_folder_problems, all listed in one ModelError), offload with device_map or
// training, and a device map whose run device is not transformer block 0's.
void require_loadable(const PipelineOptions& options, const strategies::ParallelSpec& spec);

// The folder's scheduler/scheduler_config.json as its text, checked as the loop's schedulers take it
// (read at the start of a load, so that an option we do not run is refused before any weight is
// read; Note [one scheduler table]).
std::string read_scheduler_config(const PipelineOptions& options);

// What every family's components hold besides its own: the options they are built with (Note
// [offload]: again at each use), the rank's place, the scheduler the loop is handed and the VAE's
// pixels per latent (1: pixel space).
struct ComponentsBase {
    PipelineOptions options;
    const ParallelContext* parallel = nullptr;
    std::string scheduler;  // the folder's scheduler_config.json (read_scheduler_config)
    int64_t vae_scale = 1;
    // The start of a load: the options, the place (which must outlive the pipeline) and the
    // scheduler (read_scheduler_config).
    void start(const PipelineOptions& o, const ParallelContext& place) {
        options = o;
        parallel = &place;
        scheduler = read_scheduler_config(o);
    }
};

struct Conditioning;  // family_pipeline.h

// Each row's `lengths[k]` hidden states of `hidden` [n, L, D] after its first `drop`, zero-padded to
// the longest, with the mask of its own tokens: a decoder's batch as diffusers keeps its tokens
// (Qwen-Image's _extract_masked_hidden, Z-Image's prompt_embeds[i][mask[i]]).
Conditioning kept_tokens(const at::Tensor& hidden, const std::vector<int64_t>& lengths, int64_t drop);

// Throws ModelError unless a text encoder's max_sequence_length of `value` is from 1 to `max`
// (what diffusers refuses past).
void check_max_sequence_length(int value, int max);

// The model folder as the options' caller read it, or read now.
strategies::ModelInfo model_info_of(const PipelineOptions& options);

// A component's device: its device_map slot's, else the run's.
at::Device device_of(const PipelineOptions& options, const std::string& component);

// The component's weights on `device`: its folder's safetensors (the options' variant), or with
// random_weights seeded random values, different for each `salt`; with the options' current
// adapters' changes of it (AdapterState).
WeightStore open_weights(const PipelineOptions& options, const std::string& component, uint64_t salt,
                         at::Device device);

// The class model_index.json names for a component, or empty when it names none.
std::string component_class(const ConfigJson& index, const char* key);

// Note [offload]: with PipelineOptions::offload a component is not kept. It is built on the run's
// device each time it runs, from its (mmapped) files, and freed as soon as it has run, so that the
// device holds one component's weights at a time, as diffusers' enable_model_cpu_offload does. A
// component's uses are few and long (the text encoder once per batch, the transformer for all the
// steps, the VAE once), so building it again costs about what moving it costs diffusers.
template <class T>
class Component {
  public:
    // Makes the component; where `store` is given, the weights it was made from are left there,
    // for switches of adapters in place.
    using Make = std::function<std::unique_ptr<T>(std::shared_ptr<WeightStore>* store)>;
    Component() = default;
    // Without offload `make` runs now, once; with it, on a use() while no earlier use is alive.
    Component(Make make, bool offload) : state_(std::make_shared<State>()) {
        state_->make = std::move(make);
        state_->offload = offload;
        if (!offload) state_->kept = std::shared_ptr<const T>(state_->make(&state_->store));
    }
    // The component, alive while the returned pointer is. With offload, every use() while one
    // returned pointer lives gets that same one: the denoising loop holds the transformer for a
    // batch's steps (FamilyPipeline::hold_transformer), and each step's use() finds it.
    std::shared_ptr<const T> use() const {
        State& s = *state_;
        if (s.kept) return s.kept;
        if (!s.offload) return s.kept = std::shared_ptr<const T>(s.make(&s.store));  // a rebuild that failed
        if (std::shared_ptr<const T> live = s.live.lock()) return live;
        std::shared_ptr<const T> made(s.make(nullptr));
        s.live = made;
        return made;
    }
    // The component when it is kept; nullptr with offload.
    const T* kept() const { return state_ ? state_->kept.get() : nullptr; }
    // What switches it to other adapters (AdapterState, Note [adapter switches]): a kept one has
    // the changed weights made again in place, or is freed and built again when its module does
    // not hold them as taken; with offload the next use builds it anyway. Does nothing once the
    // component is gone.
    AdapterState::Switcher switcher() const {
        std::weak_ptr<State> weak = state_;
        return [weak](std::shared_ptr<const WeightDeltas> deltas, const std::set<std::string>& names) {
            using Switched = AdapterState::Switched;
            const std::shared_ptr<State> s = weak.lock();
            if (!s || s->offload) return Switched::kAtNextUse;
            if (s->kept && s->store && s->store->retake(std::move(deltas), names)) return Switched::kInPlace;
            s->kept.reset();  // the old weights go before the new ones are made
            s->store.reset();
            s->kept = std::shared_ptr<const T>(s->make(&s->store));
            return Switched::kRebuilt;
        };
    }

  private:
    struct State {
        Make make;
        bool offload = false;
        std::shared_ptr<const T> kept;
        std::shared_ptr<WeightStore> store;  // what `kept` was made from
        std::weak_ptr<const T> live;
    };
    std::shared_ptr<State> state_;
};

// A component of `options.model_dir`: `build` makes it from its weights on `device` (every weight
// taken, checked), kept or built at each use with offload (Note [offload]). With `parameters` and
// PipelineOptions::trainable, its weights are listed there under `name` (a trainer's). `options`
// must outlive it.
template <class T, class Build>
Component<T> component_of(
    const PipelineOptions* options, const char* name, uint64_t salt, at::Device device, Build build,
    std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>>* parameters =
        nullptr) {
    if (options->check_only) {
        // Note [checking a model before the ranks start]: its weight files opened (headers,
        // offsets, dtypes, shard paths checked), nothing built.
        if (!options->random_weights) open_weights(*options, name, salt, at::Device(at::kCPU));
        return Component<T>();
    }
    Component<T> c(
        [options, name, salt, device, build, parameters](std::shared_ptr<WeightStore>* store) {
            auto w = std::make_shared<WeightStore>(open_weights(*options, name, salt, device));
            const bool keep = parameters && options->trainable;
            if (keep) w->keep_as_parameters();
            std::unique_ptr<T> m = build(*w);
            w->check_all_taken();
            if (keep) parameters->emplace_back(name, w->parameters());
            if (store && options->adapters) {
                w->forget_unheld();
                *store = std::move(w);
            }
            return m;
        },
        options->offload);
    if (options->adapters) options->adapters->add_component(name, c.switcher());
    return c;
}

// The request's width and height (0: the pipeline's defaults), after checking them and its steps.
// Throws ModelError naming the size and the multiple the pipeline needs.
std::pair<int, int> checked_size(const DiffusionPipeline& pipeline, const GenerateRequest& request);

// Each request's image and final latents from the decoded images [n, 3, H, W] in [-1, 1] as
// diffusers postprocesses them ([0, 1], clamp, fp32, x 255, round half to even, uint8), and its
// error when its latents are not finite (a NaN would pass the clamp as a black image).
void finish_results(std::vector<GenerateResult>& results, const at::Tensor& images, const at::Tensor& latents,
                    int steps);

// Latents [B, C, H, W] <-> packed [B, (H / 2)(W / 2), 4C], as diffusers' _pack_latents and
// _unpack_latents order the 2x2 patches (Qwen-Image's and FLUX's transformers take them packed).
at::Tensor pack_latents(const at::Tensor& latents);
at::Tensor unpack_latents(const at::Tensor& packed, int64_t height, int64_t width);

}  // namespace dp::runtime
