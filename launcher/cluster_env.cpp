#include "launcher/cluster_env.h"

#include <unistd.h>  // environ

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string_view>

#include "launcher/errors.h"
#include "launcher/values.h"

namespace dp::launcher {
namespace {

constexpr const char* kHostlistAccepted =
    "accepted: comma-separated names such as node01, node[01-04,07] or rack[1-2]-node[1-2]";

[[noreturn]] void bad_hostlist(const std::string& source, const std::string& text, const std::string& why) {
    throw UsageError(source + " '" + text + "': " + why + "; " + kHostlistAccepted);
}

bool all_digits(std::string_view s) {
    if (s.empty() || s.size() > 9) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    return true;
}

// One bracket group's numbers as text, padded to the low bound's width ("01-03" -> 01 02 03).
std::vector<std::string> expand_bracket(std::string_view body, const std::string& source,
                                        const std::string& text) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= body.size()) {
        size_t comma = body.find(',', start);
        if (comma == std::string_view::npos) comma = body.size();
        std::string_view item = body.substr(start, comma - start);
        size_t dash = item.find('-');
        std::string_view lo_text = item.substr(0, dash);
        std::string_view hi_text = dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
        if (!all_digits(lo_text) || !all_digits(hi_text))
            bad_hostlist(source, text, "'" + std::string(item) + "' in brackets is not N or N-M");
        long lo = std::atol(std::string(lo_text).c_str());
        long hi = std::atol(std::string(hi_text).c_str());
        if (hi < lo) bad_hostlist(source, text, "the range " + std::string(item) + " is reversed");
        if (hi - lo + 1 + static_cast<long>(out.size()) > kMaxNodes)
            bad_hostlist(source, text, "more than " + std::to_string(kMaxNodes) + " hosts");
        const int width = static_cast<int>(lo_text.size());
        for (long n = lo; n <= hi; ++n) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%0*ld", width, n);
            out.emplace_back(buf);
        }
        start = comma + 1;
    }
    return out;
}

// One host expression without top-level commas: literal parts and bracket groups, expanded as
// their product with the first group varying slowest.
void expand_item(std::string_view item, const std::string& source, const std::string& text,
                 std::vector<std::string>& out) {
    if (item.empty()) bad_hostlist(source, text, "an empty host name");
    std::vector<std::vector<std::string>> parts;
    size_t total = 1;
    size_t i = 0;
    while (i < item.size()) {
        if (item[i] == ']') bad_hostlist(source, text, "a ']' without its '['");
        if (item[i] == '[') {
            size_t close = item.find(']', i);
            if (close == std::string_view::npos) bad_hostlist(source, text, "an unclosed '['");
            std::string_view body = item.substr(i + 1, close - i - 1);
            if (body.find('[') != std::string_view::npos) bad_hostlist(source, text, "a '[' inside brackets");
            parts.push_back(expand_bracket(body, source, text));
            i = close + 1;
        } else {
            size_t next = item.find_first_of("[]", i);
            if (next == std::string_view::npos) next = item.size();
            parts.push_back({std::string(item.substr(i, next - i))});
            i = next;
        }
        total *= parts.back().size();
        if (total + out.size() > static_cast<size_t>(kMaxNodes))
            bad_hostlist(source, text, "more than " + std::to_string(kMaxNodes) + " hosts");
    }
    std::vector<std::string> acc{""};
    for (const auto& part : parts) {
        std::vector<std::string> next;
        next.reserve(acc.size() * part.size());
        for (const auto& prefix : acc)
            for (const auto& p : part) next.push_back(prefix + p);
        acc.swap(next);
    }
    out.insert(out.end(), acc.begin(), acc.end());
}

std::vector<std::string> expand_hostlist(const std::string& text, const std::string& source) {
    std::vector<std::string> out;
    int depth = 0;
    size_t start = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
        if (i < text.size() && text[i] == '[') ++depth;
        if (i < text.size() && text[i] == ']') --depth;
        if (i == text.size() || (text[i] == ',' && depth == 0)) {
            expand_item(std::string_view(text).substr(start, i - start), source, text, out);
            start = i + 1;
        }
    }
    return out;
}

const std::string* find(const Environment& env, const char* name) {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
}

// The first of `names` that is set, with its name; nullptr when none is.
const std::string* find_any(const Environment& env, std::initializer_list<const char*> names,
                            std::string& which) {
    for (const char* n : names)
        if (const std::string* v = find(env, n)) {
            which = n;
            return v;
        }
    return nullptr;
}

std::string names_text(std::initializer_list<const char*> names) {
    std::string s;
    for (const char* n : names) s += (s.empty() ? "" : " or ") + std::string(n);
    return s;
}

// A whole number from `lo` to `hi` in the first set variable of `names`; throws naming all of
// them, and `who` (the scheduler), when none is set.
int require_int(const Environment& env, std::initializer_list<const char*> names, int lo, int hi,
                const std::string& who) {
    std::string which;
    const std::string* v = find_any(env, names, which);
    if (!v) throw UsageError(who + ": " + names_text(names) + " is not set");
    return parse_int(*v, lo, hi, which);
}

std::optional<int> optional_int(const Environment& env, std::initializer_list<const char*> names, int lo,
                                int hi) {
    std::string which;
    const std::string* v = find_any(env, names, which);
    if (!v) return std::nullopt;
    return parse_int(*v, lo, hi, which);
}

void check_below(const char* name, int value, const char* bound_name, int bound) {
    if (value >= bound)
        throw UsageError(std::string(name) + "=" + std::to_string(value) + " is not below " + bound_name +
                         "=" + std::to_string(bound) + ": the scheduler's variables disagree");
}

std::vector<int> gpu_list(const Environment& env) {
    std::string which;
    if (const std::string* v =
            find_any(env, {"CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"}, which)) {
        if (v->empty()) return {};
        return parse_gpu_ids(*v, which);
    }
    if (auto n = optional_int(env, {"SLURM_GPUS_ON_NODE"}, 0, kMaxLocalProcesses)) {
        std::vector<int> ids(*n);
        std::iota(ids.begin(), ids.end(), 0);
        return ids;
    }
    return {};
}

// MASTER_ADDR / MASTER_PORT, when the environment sets them, win over what a scheduler derives.
void master_from_env(const Environment& env, const char* addr_name, const char* port_name,
                     ClusterAllocation& a) {
    if (const std::string* v = find(env, addr_name)) a.master_addr = parse_host(*v, addr_name);
    if (const std::string* v = find(env, port_name)) a.master_port = parse_int(*v, 1, 65535, port_name);
}

// Per rank: the same number of ranks on every node, so that nnodes * local_world_size is the world.
void check_even(ClusterAllocation& a, const std::string& what) {
    if (a.local_world_size <= 0 || a.world_size % a.local_world_size != 0)
        throw UsageError(a.name + ": " + what + ": dp-launch needs the same number of ranks on every node (" +
                         std::to_string(a.world_size) + " ranks, " + std::to_string(a.local_world_size) +
                         " on this node); start the same number per node (srun --ntasks-per-node, "
                         "mpirun --npernode)");
    a.nnodes = a.world_size / a.local_world_size;
}

ClusterAllocation detect_slurm(const Environment& env) {
    std::string which;
    const std::string* job = find_any(env, {"SLURM_JOB_ID", "SLURM_JOBID"}, which);
    ClusterAllocation a;
    a.kind = ClusterKind::kSlurm;
    const unsigned long long job_id = parse_u64(*job, which);
    a.name = "Slurm job " + std::to_string(job_id);
    const bool in_step = find(env, "SLURM_STEP_ID") || find(env, "SLURM_STEPID");
    a.nnodes = require_int(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1, kMaxNodes,
                           a.name);
    if (in_step) {
        a.node_rank = require_int(env, {"SLURM_NODEID"}, 0, kMaxNodes, a.name);
        check_below("SLURM_NODEID", a.node_rank, "SLURM_NNODES", a.nnodes);
    } else if (a.nnodes > 1) {
        throw UsageError(a.name + " has " + std::to_string(a.nnodes) +
                         " nodes, but this is its batch script (no SLURM_STEP_ID), which runs on the first "
                         "node only: start one dp-launch per node with `srun --ntasks-per-node=1 dp-launch "
                         "...`, or pass --cluster none to run on this node alone");
    }
    std::string list_name;
    if (const std::string* list =
            find_any(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, list_name)) {
        a.hosts = expand_hostlist(*list, list_name);
        // A step's own list names exactly its nodes; the job's may name more than a step uses.
        const bool step_list = list_name == "SLURM_STEP_NODELIST" || !in_step;
        if (step_list ? static_cast<int>(a.hosts.size()) != a.nnodes
                      : static_cast<int>(a.hosts.size()) < a.nnodes)
            throw UsageError(list_name + "=" + *list + " names " + std::to_string(a.hosts.size()) +
                             " hosts, but SLURM_NNODES=" + std::to_string(a.nnodes));
        a.master_addr = a.hosts.front();
    }
    a.master_port = slurm_master_port(job_id);
    master_from_env(env, "MASTER_ADDR", "MASTER_PORT", a);
    a.gpus = gpu_list(env);

    const int ntasks = in_step ? require_int(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, 1,
                                             kMaxNodes * kMaxLocalProcesses / 64, a.name)
                               : a.nnodes;
    a.per_rank = ntasks > a.nnodes;
    if (!a.per_rank) return a;
    a.world_size = ntasks;
    a.rank = require_int(env, {"SLURM_PROCID"}, 0, kMaxNodes * 64, a.name);
    check_below("SLURM_PROCID", a.rank, "SLURM_NTASKS", ntasks);
    a.local_rank = require_int(env, {"SLURM_LOCALID"}, 0, kMaxLocalProcesses, a.name);
    std::string tpn_name;
    if (const std::string* tpn = find_any(
            env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}, tpn_name)) {
        std::vector<int> counts = expand_slurm_tasks_per_node(*tpn, tpn_name);
        if (counts.size() == 1 && tpn_name == "SLURM_NTASKS_PER_NODE") counts.assign(a.nnodes, counts[0]);
        if (static_cast<int>(counts.size()) != a.nnodes)
            throw UsageError(tpn_name + "=" + *tpn + " gives " + std::to_string(counts.size()) +
                             " nodes, but SLURM_NNODES=" + std::to_string(a.nnodes));
        for (int c : counts)
            if (c != counts.front())
                throw UsageError(a.name + ": " + tpn_name + "=" + *tpn +
                                 ": dp-launch needs the same number of ranks on every node; start them "
                                 "with srun --ntasks-per-node");
        a.local_world_size = counts[a.node_rank];
    } else {
        a.local_world_size = ntasks % a.nnodes == 0 ? ntasks / a.nnodes : 0;
    }
    const int nnodes = a.nnodes;
    check_even(a, "SLURM_NTASKS=" + std::to_string(ntasks));
    if (a.nnodes != nnodes)
        throw UsageError(a.name + ": " + std::to_string(ntasks) + " tasks of " +
                         std::to_string(a.local_world_size) +
                         " per node do not fill SLURM_NNODES=" + std::to_string(nnodes));
    check_below("SLURM_LOCALID", a.local_rank, "the tasks on this node", a.local_world_size);
    return a;
}

ClusterAllocation detect_mpi(const Environment& env) {
    ClusterAllocation a;
    a.kind = ClusterKind::kMpi;
    a.per_rank = true;
    const bool open_mpi = find(env, "OMPI_COMM_WORLD_RANK") || find(env, "OMPI_COMM_WORLD_SIZE");
    a.name = open_mpi ? "Open MPI" : "MPI (PMI)";
    // Open MPI's names, else PMI's (and for the local place Intel MPI's, where PMI's are not set).
    const char* rank_name = open_mpi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
    const char* size_name = open_mpi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
    const char* local_rank_name = open_mpi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "PMI_LOCAL_RANK";
    const char* local_size_name = open_mpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "PMI_LOCAL_SIZE";
    a.world_size = require_int(env, {size_name}, 1, kMaxNodes * 64, a.name);
    a.rank = require_int(env, {rank_name}, 0, kMaxNodes * 64, a.name);
    a.local_rank =
        open_mpi ? require_int(env, {local_rank_name}, 0, kMaxLocalProcesses, a.name)
                 : require_int(env, {local_rank_name, "MPI_LOCALRANKID"}, 0, kMaxLocalProcesses, a.name);
    a.local_world_size =
        open_mpi ? require_int(env, {local_size_name}, 1, kMaxLocalProcesses, a.name)
                 : require_int(env, {local_size_name, "MPI_LOCALNRANKS"}, 1, kMaxLocalProcesses, a.name);
    check_below(rank_name, a.rank, size_name, a.world_size);
    check_below(local_rank_name, a.local_rank, local_size_name, a.local_world_size);
    check_even(a, std::string(size_name) + "=" + std::to_string(a.world_size) + ", " + local_size_name + "=" +
                      std::to_string(a.local_world_size));
    // mpirun's default mapping fills a node before the next, so ranks are numbered node by node.
    a.node_rank = a.rank / a.local_world_size;
    master_from_env(env, "MASTER_ADDR", "MASTER_PORT", a);
    a.gpus = gpu_list(env);
    return a;
}

ClusterAllocation detect_env(const Environment& env) {
    ClusterAllocation a;
    a.kind = ClusterKind::kEnv;
    if (const std::string* nnodes = find(env, "PET_NNODES")) {
        a.name = "PyTorchJob (PET_*)";
        if (nnodes->find(':') != std::string::npos)
            throw UsageError("PET_NNODES=" + *nnodes +
                             ": a range of nodes needs elastic membership, which dp-launch does not "
                             "have; set minReplicas equal to maxReplicas");
        a.nnodes = parse_int(*nnodes, 1, kMaxNodes, "PET_NNODES");
        a.node_rank = require_int(env, {"PET_NODE_RANK"}, 0, kMaxNodes, a.name);
        check_below("PET_NODE_RANK", a.node_rank, "PET_NNODES", a.nnodes);
        if (const std::string* n = find(env, "PET_NPROC_PER_NODE")) {
            if (*n != "auto" && *n != "gpu" && *n != "cpu")
                a.local_world_size =
                    parse_int(*n, 1, kMaxLocalProcesses, "PET_NPROC_PER_NODE", "auto, gpu, cpu or ");
        }
        a.world_size = a.nnodes * a.local_world_size;
        master_from_env(env, "PET_MASTER_ADDR", "PET_MASTER_PORT", a);
        if (a.master_addr.empty()) master_from_env(env, "MASTER_ADDR", "MASTER_PORT", a);
        a.gpus = gpu_list(env);
        return a;
    }
    a.name = "RANK/WORLD_SIZE from the environment";
    a.per_rank = true;
    a.world_size = require_int(env, {"WORLD_SIZE"}, 1, kMaxNodes * 64, a.name);
    a.rank = require_int(env, {"RANK"}, 0, kMaxNodes * 64, a.name);
    check_below("RANK", a.rank, "WORLD_SIZE", a.world_size);
    // An operator that starts one rank per pod sets no LOCAL_*: each rank is then its own node.
    a.local_rank = optional_int(env, {"LOCAL_RANK"}, 0, kMaxLocalProcesses).value_or(0);
    auto local_size = optional_int(env, {"LOCAL_WORLD_SIZE"}, 1, kMaxLocalProcesses);
    if (!local_size && a.local_rank > 0)
        throw UsageError(a.name + ": LOCAL_RANK=" + std::to_string(a.local_rank) +
                         " is set but LOCAL_WORLD_SIZE is not; set both, or neither for one rank per node");
    a.local_world_size = local_size.value_or(1);
    check_below("LOCAL_RANK", a.local_rank, "LOCAL_WORLD_SIZE", a.local_world_size);
    check_even(a, "WORLD_SIZE=" + std::to_string(a.world_size) +
                      ", LOCAL_WORLD_SIZE=" + std::to_string(a.local_world_size));
    a.node_rank = optional_int(env, {"GROUP_RANK"}, 0, kMaxNodes).value_or(a.rank / a.local_world_size);
    check_below("GROUP_RANK", a.node_rank, "the node count WORLD_SIZE / LOCAL_WORLD_SIZE", a.nnodes);
    master_from_env(env, "MASTER_ADDR", "MASTER_PORT", a);
    a.gpus = gpu_list(env);
    return a;
}

bool has_slurm(const Environment& env) { return find(env, "SLURM_JOB_ID") || find(env, "SLURM_JOBID"); }
bool has_mpi(const Environment& env) {
    return find(env, "OMPI_COMM_WORLD_RANK") || find(env, "OMPI_COMM_WORLD_SIZE") || find(env, "PMI_RANK") ||
           find(env, "PMI_SIZE");
}
bool has_env(const Environment& env) {
    return find(env, "PET_NNODES") || find(env, "RANK") || find(env, "WORLD_SIZE");
}

std::string flag_of(const std::string& field) {
    std::string flag = "--" + field;
    for (char& c : flag)
        if (c == '_') c = '-';
    return flag;
}

}  // namespace

ClusterChoice parse_cluster_choice(const std::string& text, const std::string& source) {
    const std::string c = parse_choice(text, {"auto", "none", "slurm", "mpi", "env"}, source);
    if (c == "none") return ClusterChoice::kNone;
    if (c == "slurm") return ClusterChoice::kSlurm;
    if (c == "mpi") return ClusterChoice::kMpi;
    if (c == "env") return ClusterChoice::kEnv;
    return ClusterChoice::kAuto;
}

std::string cluster_choice_text(ClusterChoice choice) {
    switch (choice) {
        case ClusterChoice::kNone:
            return "none";
        case ClusterChoice::kSlurm:
            return "slurm";
        case ClusterChoice::kMpi:
            return "mpi";
        case ClusterChoice::kEnv:
            return "env";
        case ClusterChoice::kAuto:
            break;
    }
    return "auto";
}

std::vector<std::string> expand_slurm_hostlist(const std::string& text) {
    return expand_hostlist(text, "Slurm host list");
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& text, const std::string& source) {
    std::vector<int> out;
    size_t start = 0;
    while (start <= text.size()) {
        size_t comma = text.find(',', start);
        if (comma == std::string::npos) comma = text.size();
        const std::string item = text.substr(start, comma - start);
        const size_t paren = item.find("(x");
        const std::string count_text = item.substr(0, paren);
        int repeat = 1;
        if (paren != std::string::npos) {
            if (item.back() != ')')
                throw UsageError(source + "=" + text + ": '" + item + "' is not N or N(xR), as 2(x3),1");
            repeat =
                parse_int(item.substr(paren + 2, item.size() - paren - 3), 1, kMaxNodes, source + " repeat");
        }
        const int count = parse_int(count_text, 1, kMaxLocalProcesses, source + " tasks");
        if (out.size() + repeat > static_cast<size_t>(kMaxNodes))
            throw UsageError(source + "=" + text + ": more than " + std::to_string(kMaxNodes) + " nodes");
        out.insert(out.end(), repeat, count);
        start = comma + 1;
    }
    return out;
}

int slurm_master_port(unsigned long long job_id) { return 20000 + static_cast<int>(job_id % 20000); }

std::optional<ClusterAllocation> detect_cluster(const Environment& env, ClusterChoice choice) {
    switch (choice) {
        case ClusterChoice::kNone:
            return std::nullopt;
        case ClusterChoice::kSlurm:
            if (!has_slurm(env))
                throw UsageError(
                    "--cluster slurm: SLURM_JOB_ID is not set; run dp-launch under srun or "
                    "sbatch, or pass --cluster auto or none");
            return detect_slurm(env);
        case ClusterChoice::kMpi:
            if (!has_mpi(env))
                throw UsageError(
                    "--cluster mpi: neither OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI) "
                    "nor PMI_RANK/PMI_SIZE (MPICH, Intel MPI) is set; run dp-launch under "
                    "mpirun, or pass --cluster auto or none");
            return detect_mpi(env);
        case ClusterChoice::kEnv:
            if (!has_env(env))
                throw UsageError(
                    "--cluster env: neither PET_NNODES (PyTorchJob) nor RANK and WORLD_SIZE "
                    "is set; pass --cluster auto or none");
            return detect_env(env);
        case ClusterChoice::kAuto:
            break;
    }
    // mpirun inside a Slurm job starts its daemons as one srun step per node, and every rank
    // inherits that step's SLURM_* (one task per node): OMPI_COMM_WORLD_* is the truer account.
    if (find(env, "OMPI_COMM_WORLD_RANK")) return detect_mpi(env);
    if (has_slurm(env)) return detect_slurm(env);
    if (has_mpi(env)) return detect_mpi(env);
    if (has_env(env)) return detect_env(env);
    return std::nullopt;
}

int rank_gpu(const ClusterAllocation& a) {
    if (static_cast<int>(a.gpus.size()) == a.local_world_size && a.local_rank < a.local_world_size)
        return a.gpus[a.local_rank];
    if (a.gpus.size() == 1) return a.gpus.front();
    return -1;
}

std::string describe_allocation(const ClusterAllocation& a, const std::vector<std::string>& notes) {
    constexpr size_t kShownHosts = 4;
    std::string s =
        "dp-launch: " + a.name + ": " + std::to_string(a.nnodes) + (a.nnodes == 1 ? " node" : " nodes");
    if (!a.hosts.empty()) {
        s += " (";
        for (size_t i = 0; i < a.hosts.size() && i < kShownHosts; ++i) s += (i ? ", " : "") + a.hosts[i];
        if (a.hosts.size() > kShownHosts)
            s += ", ... " + std::to_string(a.hosts.size() - kShownHosts) + " more";
        s += ")";
    }
    s += ", this is node " + std::to_string(a.node_rank);
    if (a.per_rank) {
        s += ", one rank per task (rank " + std::to_string(a.rank) + " of " + std::to_string(a.world_size) +
             ", local rank " + std::to_string(a.local_rank) + ")";
    } else {
        s += ", one dp-launch per node starting its ranks";
        if (a.local_world_size > 0) s += " (" + std::to_string(a.local_world_size) + " per node)";
    }
    if (a.master_addr.empty())
        s += "; master address not given (pass --master-addr)";
    else
        s += "; master " + a.master_addr + (a.master_port ? ":" + std::to_string(a.master_port) : "");
    for (const auto& n : notes) s += "; " + n;
    return s;
}

std::vector<std::string> apply_allocation(LaunchSpec& spec, const ClusterAllocation& a,
                                          const std::set<std::string>& given) {
    std::vector<std::string> notes;
    auto fill_int = [&](const char* field, int& target, int value, const std::string& what) {
        if (!given.count(field)) {
            target = value;
            return;
        }
        if (target == value) return;
        const std::string flag = flag_of(field) + " " + std::to_string(target);
        if (a.per_rank)
            throw UsageError(flag + " contradicts " + a.name + ", which made this process rank " +
                             std::to_string(a.rank) + " of " + std::to_string(a.world_size) + " (" + what +
                             "); drop " + flag_of(field) + ", or pass --cluster none");
        notes.push_back(flag + " overrides " + a.name + "'s " + what);
    };
    const std::string nodes_text = std::to_string(a.nnodes) + (a.nnodes == 1 ? " node" : " nodes");
    fill_int("nnodes", spec.nnodes, a.nnodes, nodes_text);
    fill_int("node_rank", spec.node_rank, a.node_rank, "node " + std::to_string(a.node_rank));
    if (a.per_rank)
        fill_int("num_processes", spec.num_processes, a.local_world_size,
                 std::to_string(a.local_world_size) + " ranks per node");
    if (!a.master_addr.empty()) {
        if (!given.count("master_addr"))
            spec.master_addr = a.master_addr;
        else if (spec.master_addr != a.master_addr)
            notes.push_back("--master-addr " + spec.master_addr + " overrides " + a.name + "'s " +
                            a.master_addr);
    }
    // This node's own host in the node list: the address its ranks connect from (--local-addr).
    const auto node = static_cast<std::size_t>(spec.node_rank);
    if (!given.count("local_addr") && spec.node_rank == a.node_rank && node < a.hosts.size())
        spec.local_addr = a.hosts[node];
    if (a.master_port != 0) {
        if (!given.count("master_port"))
            spec.master_port = a.master_port;
        else if (spec.master_port != a.master_port)
            notes.push_back("--master-port " + std::to_string(spec.master_port) + " overrides " + a.name +
                            "'s " + std::to_string(a.master_port));
    }
    return notes;
}

Environment environment_map() {
    Environment env;
    for (char** e = environ; e && *e; ++e) {
        std::string_view kv(*e);
        const size_t eq = kv.find('=');
        if (eq == std::string_view::npos) continue;
        env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    }
    return env;
}

const std::vector<std::string>& cluster_variable_names() {
    static const std::vector<std::string> names = {"CUDA_VISIBLE_DEVICES",
                                                   "GROUP_RANK",
                                                   "LOCAL_RANK",
                                                   "LOCAL_WORLD_SIZE",
                                                   "MASTER_ADDR",
                                                   "MASTER_PORT",
                                                   "MPI_LOCALNRANKS",
                                                   "MPI_LOCALRANKID",
                                                   "OMPI_COMM_WORLD_LOCAL_RANK",
                                                   "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                   "OMPI_COMM_WORLD_RANK",
                                                   "OMPI_COMM_WORLD_SIZE",
                                                   "PET_MASTER_ADDR",
                                                   "PET_MASTER_PORT",
                                                   "PET_NNODES",
                                                   "PET_NODE_RANK",
                                                   "PET_NPROC_PER_NODE",
                                                   "PMI_LOCAL_RANK",
                                                   "PMI_LOCAL_SIZE",
                                                   "PMI_RANK",
                                                   "PMI_SIZE",
                                                   "RANK",
                                                   "SLURM_GPUS_ON_NODE",
                                                   "SLURM_JOBID",
                                                   "SLURM_JOB_GPUS",
                                                   "SLURM_JOB_ID",
                                                   "SLURM_JOB_NODELIST",
                                                   "SLURM_JOB_NUM_NODES",
                                                   "SLURM_LOCALID",
                                                   "SLURM_NNODES",
                                                   "SLURM_NODEID",
                                                   "SLURM_NODELIST",
                                                   "SLURM_NPROCS",
                                                   "SLURM_NTASKS",
                                                   "SLURM_NTASKS_PER_NODE",
                                                   "SLURM_PROCID",
                                                   "SLURM_STEPID",
                                                   "SLURM_STEP_GPUS",
                                                   "SLURM_STEP_ID",
                                                   "SLURM_STEP_NODELIST",
                                                   "SLURM_STEP_NUM_NODES",
                                                   "SLURM_STEP_NUM_TASKS",
                                                   "SLURM_STEP_TASKS_PER_NODE",
                                                   "SLURM_TASKS_PER_NODE",
                                                   "WORLD_SIZE"};
    return names;
}

}  // namespace dp::launcher
