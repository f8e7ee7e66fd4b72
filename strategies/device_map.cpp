#include "strategies/device_map.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace dp::strategies {
namespace {

std::string room_text(const std::vector<DeviceBudget>& budgets, const std::vector<int64_t>& used) {
    std::string out;
    for (std::size_t i = 0; i < budgets.size(); ++i)
        out += (i ? ", " : "") + budgets[i].device + " " + std::to_string(budgets[i].bytes - used[i]) +
               " bytes free";
    return out;
}

}  // namespace

DeviceMapPlan plan_device_map(const std::vector<ComponentSize>& components,
                              const std::vector<DeviceBudget>& budgets, DeviceMapMode mode) {
    if (budgets.size() < 2)
        throw std::invalid_argument("device_map needs at least two devices; with one, run without it");
    for (const DeviceBudget& b : budgets)
        if (b.bytes <= 0)
            throw std::invalid_argument("device " + b.device + ": the memory budget must be positive");
    DeviceMapPlan plan;
    plan.used.assign(budgets.size(), 0);

    auto place_whole = [&](const ComponentSize& c) {
        // The device with the most room left; the first such device on ties.
        std::size_t best = 0;
        for (std::size_t i = 1; i < budgets.size(); ++i)
            if (budgets[i].bytes - plan.used[i] > budgets[best].bytes - plan.used[best]) best = i;
        if (budgets[best].bytes - plan.used[best] < c.bytes)
            throw std::invalid_argument(
                c.name + " (" + std::to_string(c.bytes) + " bytes) fits on no device (" +
                room_text(budgets, plan.used) + ")" +
                (c.block_bytes.empty() ? "" : "; the auto device map splits the transformer's blocks"));
        plan.used[best] += c.bytes;
        plan.placements.push_back({c.name, -1, budgets[best].device, c.bytes});
    };

    std::vector<const ComponentSize*> order;
    for (const ComponentSize& c : components) order.push_back(&c);
    // Largest first, so that the big component gets the emptiest device.
    std::stable_sort(order.begin(), order.end(),
                     [](const ComponentSize* a, const ComponentSize* b) { return a->bytes > b->bytes; });

    for (const ComponentSize* c : order) {
        if (mode == DeviceMapMode::kBalanced || c->block_bytes.empty()) {
            place_whole(*c);
            continue;
        }
        // auto: the blocks in order, each on the first device (in the order given) with room for it.
        const int64_t blocks = std::accumulate(c->block_bytes.begin(), c->block_bytes.end(), int64_t{0});
        if (blocks > c->bytes)
            throw std::invalid_argument(c->name + ": its blocks add up to more than the component");
        const int64_t rest = c->bytes - blocks;  // embeddings and output head: with the first block
        std::size_t device = 0;
        for (std::size_t i = 0; i < c->block_bytes.size(); ++i) {
            const int64_t need = c->block_bytes[i] + (i == 0 ? rest : 0);
            while (device < budgets.size() && budgets[device].bytes - plan.used[device] < need) ++device;
            if (device == budgets.size())
                throw std::invalid_argument(c->name + " block " + std::to_string(i) + " (" +
                                            std::to_string(need) +
                                            " bytes) fits on no device after the earlier blocks (" +
                                            room_text(budgets, plan.used) + ")");
            plan.used[device] += need;
            plan.placements.push_back({c->name, static_cast<int>(i), budgets[device].device, need});
        }
    }
    return plan;
}

}  // namespace dp::strategies
