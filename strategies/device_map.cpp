#include "strategies/device_map.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
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
    for (const DeviceBudget& b : budgets) {
        for (const std::string& seen : plan.devices)
            if (seen == b.device) throw std::invalid_argument("device " + b.device + " is given twice");
        plan.devices.push_back(b.device);
    }

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

std::string canonical_device(const std::string& text) {
    auto number = [&](const std::string& digits) {
        if (digits.empty() || digits.size() > 4 ||
            digits.find_first_not_of("0123456789") != std::string::npos)
            throw std::invalid_argument("device '" + text.substr(0, 40) +
                                        "': expected cuda:N, cpu:N, cpu or a GPU number N");
        return std::to_string(std::stoi(digits));
    };
    if (text == "cpu") return "cpu:0";
    if (text.rfind("cuda:", 0) == 0) return "cuda:" + number(text.substr(5));
    if (text.rfind("cpu:", 0) == 0) return "cpu:" + number(text.substr(4));
    return "cuda:" + number(text);
}

std::vector<DeviceBudget> parse_max_memory(const std::string& text) {
    std::vector<DeviceBudget> out;
    std::size_t start = 0;
    while (start <= text.size()) {
        const std::size_t comma = std::min(text.find(',', start), text.size());
        const std::string entry = text.substr(start, comma - start);
        start = comma + 1;
        const std::size_t eq = entry.find('=');
        if (eq == std::string::npos)
            throw std::invalid_argument("--max-memory entry '" + entry.substr(0, 40) +
                                        "': expected DEVICE=SIZE, e.g. cuda:0=20GiB or cpu:0=64MB");
        DeviceBudget b;
        b.device = canonical_device(entry.substr(0, eq));
        const std::string size = entry.substr(eq + 1);
        std::size_t unit_at = 0;
        while (unit_at < size.size() &&
               (std::isdigit(static_cast<unsigned char>(size[unit_at])) || size[unit_at] == '.'))
            ++unit_at;
        const std::string unit = size.substr(unit_at);
        static const std::pair<const char*, double> units[] = {{"", 1},
                                                               {"B", 1},
                                                               {"KB", 1e3},
                                                               {"MB", 1e6},
                                                               {"GB", 1e9},
                                                               {"TB", 1e12},
                                                               {"KiB", 1024.0},
                                                               {"MiB", 1048576.0},
                                                               {"GiB", 1073741824.0},
                                                               {"TiB", 1099511627776.0}};
        double scale = -1;
        for (const auto& [name, factor] : units)
            if (unit == name) scale = factor;
        double value = -1;
        if (unit_at > 0 &&
            std::count(size.begin(), size.begin() + static_cast<std::ptrdiff_t>(unit_at), '.') <= 1) {
            try {
                value = std::stod(size.substr(0, unit_at));
            } catch (const std::exception&) {
            }
        }
        if (scale < 0 || value <= 0 || !std::isfinite(value * scale) || value * scale > 9e18)
            throw std::invalid_argument("--max-memory " + b.device + ": size '" + size.substr(0, 40) +
                                        "' is not a positive size (bytes, or with B, KB, MB, GB, TB, KiB, "
                                        "MiB, GiB, TiB)");
        b.bytes = static_cast<int64_t>(value * scale);
        for (const DeviceBudget& seen : out)
            if (seen.device == b.device)
                throw std::invalid_argument("--max-memory names " + b.device + " twice");
        out.push_back(b);
    }
    return out;
}

DeviceMapPlan device_map_from_json(const std::string& json_text, const std::vector<ComponentSize>& components,
                                   const std::string& source) {
    auto fail = [&](const std::string& what) { throw std::invalid_argument(source + ": " + what); };
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(json_text);
    } catch (const nlohmann::json::exception&) {
        fail(
            "not valid JSON; expected an object such as {\"text_encoder\": \"cuda:0\", \"transformer\": "
            "\"cuda:1\", ...}");
    }
    if (!j.is_object()) fail("expected a JSON object mapping each component to a device");
    auto device_of = [&](const nlohmann::json& v, const std::string& key) {
        if (v.is_number_integer()) return canonical_device(std::to_string(v.get<int64_t>()));
        if (!v.is_string()) fail(key + ": expected a device such as \"cuda:0\", \"cpu:1\" or 0");
        try {
            return canonical_device(v.get<std::string>());
        } catch (const std::invalid_argument& e) {
            fail(key + ": " + e.what());
        }
        return std::string();
    };
    DeviceMapPlan plan;
    auto add = [&](const std::string& component, int block, const std::string& device, int64_t bytes) {
        std::size_t i = 0;
        while (i < plan.devices.size() && plan.devices[i] != device) ++i;
        if (i == plan.devices.size()) {
            plan.devices.push_back(device);
            plan.used.push_back(0);
        }
        plan.used[i] += bytes;
        plan.placements.push_back({component, block, device, bytes});
    };
    std::string names;
    for (const ComponentSize& c : components) names += (names.empty() ? "" : ", ") + c.name;
    for (const auto& [key, value] : j.items()) {
        bool known = false;
        for (const ComponentSize& c : components) known = known || c.name == key;
        if (!known) fail("'" + key.substr(0, 40) + "' is not a component of this model (" + names + ")");
    }
    for (const ComponentSize& c : components) {
        if (!j.contains(c.name))
            fail("places no device for " + c.name + " (every one of " + names + " is needed)");
        const nlohmann::json& v = j[c.name];
        if (!v.is_array()) {
            add(c.name, -1, device_of(v, c.name), c.bytes);
            continue;
        }
        if (c.block_bytes.empty())
            fail(c.name + ": only the transformer takes a list of devices, one per block");
        if (v.size() != c.block_bytes.size())
            fail(c.name + ": lists " + std::to_string(v.size()) + " devices but the model has " +
                 std::to_string(c.block_bytes.size()) + " blocks");
        int64_t blocks = 0;
        for (int64_t b : c.block_bytes) blocks += b;
        for (std::size_t i = 0; i < v.size(); ++i)
            add(c.name, static_cast<int>(i), device_of(v[i], c.name + "[" + std::to_string(i) + "]"),
                c.block_bytes[i] + (i == 0 ? c.bytes - blocks : 0));
    }
    if (plan.devices.size() < 2)
        fail("puts everything on " +
             (plan.devices.empty() ? std::string("no device") : plan.devices.front()) +
             "; device_map needs at least two devices (with one, run without --device-map)");
    return plan;
}

std::string describe_device_map(const DeviceMapPlan& plan) {
    auto mib = [](int64_t b) {
        char buf[48];
        std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(b) / 1048576.0);
        return std::string(buf);
    };
    std::string out;
    for (std::size_t i = 0; i < plan.placements.size();) {
        const Placement& p = plan.placements[i];
        if (p.block < 0) {
            out += "  " + p.component + ": " + p.device + " (" + mib(p.bytes) + ")\n";
            ++i;
            continue;
        }
        std::size_t j = i;
        int64_t bytes = 0;
        while (j < plan.placements.size() && plan.placements[j].component == p.component &&
               plan.placements[j].device == p.device && plan.placements[j].block >= 0) {
            bytes += plan.placements[j].bytes;
            ++j;
        }
        const int first = p.block, last = plan.placements[j - 1].block;
        out += "  " + p.component + " block" +
               (first == last ? " " + std::to_string(first)
                              : "s " + std::to_string(first) + "-" + std::to_string(last)) +
               (first == 0 ? " (with its embeddings and output head)" : "") + ": " + p.device + " (" +
               mib(bytes) + ")\n";
        i = j;
    }
    for (std::size_t d = 0; d < plan.devices.size(); ++d)
        out += "  " + plan.devices[d] + " holds " + mib(plan.used[d]) + "\n";
    return out;
}

}  // namespace dp::strategies
