#pragma once
// Note [phase split]: the job summary's account of where each rank's time went (the
// protocol::PhasesEvent its rank sent): load, encode, steps, decode, write, and the steps' FLOP
// rate against the rate the rank's GEMMs reach at the same shapes (MFU).

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "protocol/status_events.h"

namespace dp::launcher {

// One line a rank, "dp-launch: rank 0 time by phase: load 0.21 s, ...", at most `max_ranks` of
// them (then how many more); empty when no rank sent its phases.
std::string phase_lines(const std::map<int, protocol::PhasesEvent>& phases, int max_ranks = 8);

// The same figures for --progress json's summary event: one object a rank, with the steps' FLOP
// rate and MFU where they are known.
nlohmann::json phase_json(const std::map<int, protocol::PhasesEvent>& phases);

// The steps' FLOP rate (FLOP/s) and its fraction of the GEMM rate; 0 where not known.
double steps_flop_rate(const protocol::PhasesEvent& p);
double model_flops_utilisation(const protocol::PhasesEvent& p);
// The share of the steps' time outside their GEMMs and attention (norms, RoPE, modulation,
// elementwise work, copies, waits): what is left of the steps once their kernels' own time is taken
// away, where the rank timed them (the CPU: Note [kernel time in the steps]); else once the GEMMs'
// and the attention's FLOPs at their measured rates are; -1 where neither is known.
double outside_share(const protocol::PhasesEvent& p);

}  // namespace dp::launcher
