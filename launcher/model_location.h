#pragma once
// Where `--model` is: a diffusers folder given by path, a model shipped with dp-launch, or a
// snapshot in the Hugging Face cache, found without any network. Resolved once, in the launcher,
// to a real folder: the job file names that folder, never a name to look up again.

#include <functional>
#include <string>
#include <vector>

namespace dp::launcher {

// Reads an environment variable (std::getenv in dp-launch; a fake in tests).
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup process_env();

// Note [Hugging Face cache]: huggingface_hub keeps repo ORG/NAME in CACHE/models--ORG--NAME/:
// refs/<branch or tag> holds a commit hash, snapshots/<hash>/ holds the repo's files as symlinks
// into blobs/. CACHE is $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub, as huggingface_hub decides it.

// The cache folder, and which variable (or default) gave it, e.g. "$HF_HUB_CACHE".
struct HubCache {
    std::string dir;
    std::string from;
};
HubCache hub_cache(const EnvLookup& env);

// Empty when `name` is a repo id ORG/NAME as huggingface_hub accepts one (letters, digits, '-',
// '_', '.'; no "--" or ".."; neither part starting or ending with '-' or '.'; at most 96
// characters each); else why not.
std::string repo_id_problem(const std::string& name);

// The real path of the snapshot of `repo_id` at `revision` (a branch or tag in refs/, or a commit
// hash: whole, or a unique prefix of at least 7 hex digits) in `cache`. Throws Error with
// kExitNoInput when it is not there, saying every place looked at and how to fetch it, UsageError
// for a malformed revision, and ModelError for a cache that is corrupt. `source` names the option
// in messages ("--model").
std::string find_hub_snapshot(const HubCache& cache, const std::string& repo_id, const std::string& revision,
                              const std::string& source);

// The model folder `name` means: a path as given when it exists (it must hold model_index.json);
// a name without '/' is a shipped model, looked up next to the executable ($DP_MODELS_DIR/NAME,
// EXE/../share/dp-launch/models/NAME, EXE/../../models/NAME); ORG/NAME that is no folder here is a
// Hugging Face repo in the cache at `revision` (empty: main). Throws UsageError naming `source`
// for a malformed name or a revision given with a folder; Error with kExitNoInput for a model that
// is not there, whichever way it is named: no such folder, a folder without model_index.json, no
// shipped model of that name (every place looked at named), or not in the cache.
std::string resolve_model(const std::string& name, const std::string& source,
                          const std::string& revision = "", const EnvLookup& env = process_env());

// Why the option file `path` that `source` (--config, DP_CONFIG) names cannot be read, `err` being
// the open's errno: a name that is no file but a model's (a shipped model, a model folder, a cached
// repo) is said to be a model, with --model NAME suggested; a symlink loop is named as such.
std::string config_file_problem(const std::string& source, const std::string& path, int err,
                                const EnvLookup& env = process_env());

// The folder of this executable (/proc/self/exe), where dp-worker and the shipped models are found;
// "." when it cannot be read.
std::string self_dir();

}  // namespace dp::launcher
