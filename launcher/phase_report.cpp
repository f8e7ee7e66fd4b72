#include "launcher/phase_report.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "strategies/pass_flops.h"

namespace dp::launcher {

double steps_flop_rate(const protocol::PhasesEvent& p) {
    return p.steps_ms > 0 && p.flops > 0 ? p.flops / (p.steps_ms / 1000) : 0;
}

double model_flops_utilisation(const protocol::PhasesEvent& p) {
    return p.gemm_rate > 0 ? steps_flop_rate(p) / p.gemm_rate : 0;
}

namespace {

// Whether the rank timed its steps' kernels (Note [kernel time in the steps]).
bool kernels_timed(const protocol::PhasesEvent& p) { return p.gemm_ms > 0 || p.attention_ms > 0; }

}  // namespace

double outside_share(const protocol::PhasesEvent& p) {
    if (p.steps_ms > 0 && kernels_timed(p))
        return std::max(0.0, 1 - (p.gemm_ms + p.attention_ms) / p.steps_ms);
    if (p.gemm_rate <= 0 || p.attention_rate <= 0 || p.steps_ms <= 0 || p.flops <= 0) return -1;
    const double known_s = p.gemm_flops / p.gemm_rate + (p.flops - p.gemm_flops) / p.attention_rate;
    return std::max(0.0, 1 - known_s / (p.steps_ms / 1000));
}

std::string phase_lines(const std::map<int, protocol::PhasesEvent>& phases, int max_ranks) {
    std::string out;
    int shown = 0;
    for (const auto& [rank, p] : phases) {
        if (shown++ == max_ranks) {
            out += "dp-launch: ... and " +
                   std::to_string(phases.size() - static_cast<std::size_t>(max_ranks)) + " more ranks\n";
            break;
        }
        char line[512];
        std::snprintf(line, sizeof(line),
                      "dp-launch: rank %d time by phase: load %.2f s, encode %.2f s, steps %.2f s, decode "
                      "%.2f s, write %.2f s",
                      rank, p.load_ms / 1000, p.encode_ms / 1000, p.steps_ms / 1000, p.decode_ms / 1000,
                      p.write_ms / 1000);
        out += line;
        if (p.passes > 0 && p.flops > 0) {
            out += "; " + std::to_string(p.passes) + " transformer passes, " +
                   strategies::flops_text(p.flops) + " at " + strategies::flops_text(steps_flop_rate(p)) +
                   "/s";
            if (p.gemm_rate > 0) {
                std::snprintf(line, sizeof(line), ", MFU %.0f %% of the %s/s its GEMMs reach at those shapes",
                              100 * model_flops_utilisation(p), strategies::flops_text(p.gemm_rate).c_str());
                out += line;
            }
            if (const double rest = outside_share(p); rest >= 0 && kernels_timed(p)) {
                std::snprintf(
                    line, sizeof(line),
                    "; GEMMs %.0f %%, attention %.0f %%, outside GEMMs and attention %.0f %% of the steps",
                    100 * p.gemm_ms / p.steps_ms, 100 * p.attention_ms / p.steps_ms, 100 * rest);
                out += line;
            } else if (rest >= 0) {
                std::snprintf(line, sizeof(line), "; outside GEMMs and attention %.0f %% of the steps",
                              100 * rest);
                out += line;
            }
        }
        out += "\n";
    }
    return out;
}

nlohmann::json phase_json(const std::map<int, protocol::PhasesEvent>& phases) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& [rank, p] : phases) {
        nlohmann::json j = nlohmann::json::parse(protocol::status_line(p));
        j.erase("event");
        if (p.flops > 0 && p.steps_ms > 0) j["flop_rate"] = steps_flop_rate(p);
        if (p.gemm_rate > 0 && p.flops > 0) j["mfu"] = model_flops_utilisation(p);
        if (const double rest = outside_share(p); rest >= 0) j["outside_gemm_attention"] = rest;
        if (kernels_timed(p) && p.steps_ms > 0) {
            j["gemm_share"] = p.gemm_ms / p.steps_ms;
            j["attention_share"] = p.attention_ms / p.steps_ms;
        }
        all.push_back(std::move(j));
    }
    return all;
}

}  // namespace dp::launcher
