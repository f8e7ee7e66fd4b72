#pragma once
// The cost model of the main job: what one prompt costs relative to another, and how long the job
// takes under each schedule of its prompts over the model replicas. Pure (no LibTorch): the launcher
// picks the schedule with it (--schedule auto), `dp-launch plan` prints it, and every rank orders the
// dynamic queue with it, so that all of them agree.
//
// A prompt's cost is passes x image tokens x branches (a pass a step; Heun's 2 x steps - 1): the
// transformer's work per pass grows with
// the tokens it attends over, and a call with classifier-free guidance runs the transformer on two
// branches. Text tokens, the text encoders and the VAE are left out: they are the same for every
// prompt of a job or small beside the denoising loop. The unit is one image token for one step.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "protocol/job_file.h"
#include "strategies/model_config.h"
#include "strategies/parallel_spec.h"
#include "strategies/work_split.h"

namespace dp::strategies {

// What the cost of a prompt depends on, for one model.
struct CostRules {
    int64_t pixels_per_token = 1;  // along a side: the VAE's scale x the (packed) patch size
    int64_t default_side = 0;      // the width and height of a request that says 0
    // The family's call arguments: which is its guidance scale, and whether a second branch
    // also needs a negative prompt (protocol::FamilyArguments::runs_two_branches).
    protocol::FamilyArguments arguments;
    // What a replica's switch to another LoRA adapter set costs (Note [adapter switches]): the
    // components it changes are built again, about two steps of an image at the default size in
    // the figures measured (docs/benchmarks.md, "LoRA adapter switches").
    int64_t adapter_switch = 0;
    // An edit's reference size, where the family's transformer takes its image beside the latents
    // as tokens of their own (FamilyFacts::reference_size); nullptr: none.
    std::pair<int64_t, int64_t> (*reference_size)(int64_t width, int64_t height, int64_t multiple) = nullptr;
};

// The tokens an edit's image (each picture of it, decoded) adds to each step's image stream under
// `rules`: a reference's (FLUX.1-Kontext, Qwen-Image-Edit), else 0.
int64_t reference_tokens(const CostRules& rules, const protocol::InputImage& image);

// The rules of a model from its size rule and its call arguments (model_config.h).
CostRules cost_rules(const ImageSizeRule& sizes, const protocol::FamilyArguments& arguments);

// Whether `request` runs two guidance branches: its CFG scale is above 1 (and, where the family
// asks for one, it has a negative prompt).
bool runs_two_branches(const protocol::JobRequest& request, const CostRules& rules);

// The transformer passes of `steps` steps under the scheduler `arguments` name: a pass a step, a
// sampler of two passes a step (Heun) 2 x steps - 1 (Note [one scheduler table]).
int64_t model_passes(int64_t steps, const protocol::CallValues& arguments);

// steps x image tokens x branches (1 or 2). Throws std::invalid_argument for a size that is not
// positive after the default.
int64_t prompt_cost(const protocol::JobRequest& request, const CostRules& rules);

// Every request's cost, in the requests' order.
std::vector<int64_t> prompt_costs(const std::vector<protocol::JobRequest>& requests, const CostRules& rules);

// The dynamic schedule's order: positions into `costs`, the costliest first, equal costs by
// position (so the cheapest prompts come last and fill the replicas' ends).
std::vector<std::size_t> dynamic_order(const std::vector<int64_t>& costs);

// `order` with the requests of each LoRA adapter set together (Note [adapter switches],
// runtime/pipeline/adapters.h), the sets in the order their first request comes, each set's
// requests in `order`'s: a replica then switches about once per set, not once per prompt, and
// makes the same images (each is its own prompt's, whenever it is made).
std::vector<std::size_t> grouped_by_adapters(const std::vector<protocol::JobRequest>& requests,
                                             const std::vector<std::size_t>& order);

// Work units, what a replica makes in one go: runs of consecutive positions of `order` (a static
// share in the job's order, or dynamic_order's) whose requests may share a batch
// (protocol::same_batch_settings), at most `batch_size` long. Each unit lists positions into
// `requests`.
std::vector<std::vector<std::size_t>> work_units(const std::vector<protocol::JobRequest>& requests,
                                                 const std::vector<std::size_t>& order, int batch_size);

// Note [claims by adapter set]: under the dynamic schedule the units of each adapter set are one
// run (grouped_by_adapters), and each run has its own claim counter. A replica starts on set
// `replica % sets` and claims the next unit of its current set while there is one; when the set is
// used up it turns to the next set, in order and round, that is not used up. So replicas spread
// over the sets and switch only when their set runs out, and every unit is claimed once (each
// counter is one atomic step in the store). The runtime's queue and the cost model's simulation
// both follow it.
//
// The runs of consecutive `units` of the same adapter set (`set_ids`: each unit's, as
// adapter_set_ids numbers its first request's): [begin, end) into `units`, one per set when the
// units are grouped.
std::vector<Range> adapter_set_runs(const std::vector<std::vector<std::size_t>>& units,
                                    const std::vector<std::size_t>& set_ids);
// The set (index into the runs) replica `replica` claims from first.
inline std::size_t first_claim_set(int replica, std::size_t sets) {
    return sets == 0 ? 0 : static_cast<std::size_t>(replica) % sets;
}
// The set to claim from after `current` is used up: the next one, in order and round, that
// `used_up` does not mark; `used_up.size()` when every set is.
std::size_t next_claim_set(std::size_t current, const std::vector<bool>& used_up);

// How long the job takes, in cost units, with `replicas` replicas each making one unit at a time.
struct Makespans {
    int64_t total = 0;         // every prompt's cost
    int64_t static_split = 0;  // accelerate's contiguous shares (work_split.h): the costliest share
    int64_t dynamic =
        0;  // list scheduling of `units`: the replica free first claims (Note [claims by adapter set])
    double ideal = 0;           // total / replicas: no replica ever idle
    bool costs_differ = false;  // some prompt costs more than another
};

// `costs`: every request's cost in the job file's order; `units`: the dynamic schedule's units
// (positions into `costs`), each costing the sum of its prompts. With `sets` (each request's
// adapter set, an id; 0: none), a replica pays `switch_cost` each time its next prompt has another
// set than its last one (a replica starts with none). Throws std::invalid_argument when
// replicas < 1.
Makespans makespans(const std::vector<int64_t>& costs, const std::vector<std::vector<std::size_t>>& units,
                    int replicas, const std::vector<std::size_t>& sets = {}, int64_t switch_cost = 0);

// Each request's adapter set as an id: 0 for none, then 1, 2, ... in the order sets first come.
std::vector<std::size_t> adapter_set_ids(const std::vector<protocol::JobRequest>& requests);

// What --schedule auto gives: "dynamic" when the prompts' costs differ, else "static".
std::string auto_schedule(const Makespans& m);

// The schedule a job runs with, and why, in words for its start line.
struct ScheduleChoice {
    std::string schedule;  // "static" or "dynamic"
    // "--schedule dynamic", "auto: the prompts' estimated costs differ (1280 to 5120)", ...
    std::string why;
    Makespans makespans;
    std::size_t units = 0;  // the dynamic schedule's work units
};

// `requested` is --schedule's value (auto, static or dynamic); `requests` the job's pending ones in
// the job file's order; `replicas` the model replicas (dp). Auto is static with one replica (there
// is nothing to balance). Throws std::invalid_argument for another value of `requested`.
ScheduleChoice choose_schedule(const std::string& requested,
                               const std::vector<protocol::JobRequest>& requests, const CostRules& rules,
                               int replicas, int batch_size);

// "schedule dynamic (auto: ...); expected makespan 0.71x the static split's, 1.02x the ideal".
std::string describe_schedule(const ScheduleChoice& choice);

}  // namespace dp::strategies
