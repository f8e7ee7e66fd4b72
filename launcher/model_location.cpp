#include "launcher/model_location.h"

#include <dirent.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "launcher/errors.h"
#include "launcher/prompt_file.h"
#include "strategies/model_files.h"

namespace dp::launcher {
namespace {

using protocol::kExitNoInput;

bool exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

bool is_file(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_model_dir(const std::string& dir) { return exists(dir + "/model_index.json"); }

std::string real_path(const std::string& path) {
    char real[PATH_MAX];
    return realpath(path.c_str(), real) ? std::string(real) : path;
}

std::string env_value(const EnvLookup& env, const char* name) {
    const char* v = env(name);
    return v && *v ? std::string(v) : std::string();
}

std::string home_dir(const EnvLookup& env) {
    if (std::string home = env_value(env, "HOME"); !home.empty()) return home;
    const passwd* pw = getpwuid(getuid());
    return pw && pw->pw_dir ? pw->pw_dir : "/";
}

// A leading "~" as huggingface_hub's expanduser reads it.
std::string expand_home(const std::string& path, const EnvLookup& env) {
    if (path == "~" || path.rfind("~/", 0) == 0) return home_dir(env) + path.substr(1);
    return path;
}

bool is_hex(const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string joined(const std::vector<std::string>& items, std::size_t at_most = 8) {
    std::string out;
    for (std::size_t i = 0; i < items.size() && i < at_most; ++i) out += (i ? ", " : "") + items[i];
    if (items.size() > at_most) out += " and " + std::to_string(items.size() - at_most) + " more";
    return out.empty() ? "none" : out;
}

// The names under `dir` (files of nested folders as "a/b", as refs/pr/1 is), sorted.
void list_tree(const std::string& dir, const std::string& prefix, int depth, std::vector<std::string>& out) {
    DIR* d = opendir(dir.c_str());
    if (!d) return;
    while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        const std::string path = dir + "/" + name;
        if (strategies::is_directory(path) && depth > 0)
            list_tree(path, prefix + name + "/", depth - 1, out);
        else
            out.push_back(prefix + name);
    }
    closedir(d);
    std::sort(out.begin(), out.end());
}

// Note [the cache stays inside itself]: a ref is a small plain file holding a commit hash. One
// that is a symbolic link, or longer than any hash, is refused unread (a damaged or hostile cache).
std::string read_ref(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        throw protocol::ModelError(path + ": a ref must be a plain file holding a commit hash (this one is " +
                                   (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file") +
                                   "); the cache is damaged (download the model again)");
    if (st.st_size > 256)
        throw protocol::ModelError(
            path + ": " + std::to_string(st.st_size) +
            " bytes, not a commit hash; the cache is damaged (download the model again)");
    std::ifstream in(path);
    std::string text(256, '\0');
    in.read(&text[0], 256);
    text.resize(static_cast<std::size_t>(in.gcount()));
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    return text;
}

// Note [the cache stays inside itself]: the snapshot a revision names is a folder of the repo's
// snapshots/ (not a link out of it), and every link in it leads into the repo's blobs/ (as
// huggingface_hub makes them). Anything else is refused, naming it, before a byte is read.
void check_snapshot_inside(const std::string& repo_dir, const std::string& snapshot) {
    struct stat st {};
    if (::lstat(snapshot.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
        throw protocol::ModelError(snapshot +
                                   ": a snapshot must be a folder of the cache, not a symbolic link (to " +
                                   utf8_for_display(real_path(snapshot)) + "); the cache is damaged");
    const std::string blobs = real_path(repo_dir + "/blobs") + "/";
    int64_t seen = 0;
    // Each entry by lstat: a link must lead into blobs/, a folder is walked (not through a link).
    const std::function<void(const std::string&, int)> walk = [&](const std::string& dir, int depth) {
        // Closed however the walk ends (a refusal deeper down included).
        const std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
        if (!d) return;
        while (dirent* e = readdir(d.get())) {
            const std::string name = e->d_name;
            if (name == "." || name == "..") continue;
            if (++seen > 100000) break;  // not a model's snapshot; is_model_dir and the loaders say the rest
            const std::string path = dir + "/" + name;
            struct stat entry {};
            if (::lstat(path.c_str(), &entry) != 0) continue;
            if (S_ISLNK(entry.st_mode)) {
                // Where it leads, resolved as far as it exists (a link to a blob not downloaded yet
                // is the model checks' to name).
                char buf[PATH_MAX];
                const ssize_t n = ::readlink(path.c_str(), buf, sizeof(buf) - 1);
                const std::string link =
                    n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
                std::error_code ec;
                const std::string target =
                    std::filesystem::weakly_canonical(link.empty() || link[0] == '/'
                                                          ? std::filesystem::path(link)
                                                          : std::filesystem::path(dir) / link,
                                                      ec)
                        .string();
                if (target.compare(0, blobs.size(), blobs) != 0) {
                    throw protocol::ModelError(
                        path + ": links to " + utf8_for_display(target) + ", outside the cache's " + blobs +
                        "; the cache is damaged or was tampered with (download the model again)");
                }
            } else if (S_ISDIR(entry.st_mode) && depth > 0) {
                walk(path, depth - 1);
            }
        }
    };
    walk(snapshot, 8);
}

bool valid_part(const std::string& part) {
    if (part.empty() || part.size() > 96) return false;
    if (part.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.") !=
        std::string::npos)
        return false;
    const auto edge = [](char c) { return c == '-' || c == '.'; };
    return !edge(part.front()) && !edge(part.back());
}

}  // namespace

EnvLookup process_env() {
    return [](const char* name) -> const char* { return std::getenv(name); };
}

HubCache hub_cache(const EnvLookup& env) {
    if (std::string v = env_value(env, "HF_HUB_CACHE"); !v.empty())
        return {expand_home(v, env), "$HF_HUB_CACHE"};
    if (std::string v = env_value(env, "HUGGINGFACE_HUB_CACHE"); !v.empty())
        return {expand_home(v, env), "$HUGGINGFACE_HUB_CACHE"};
    if (std::string v = env_value(env, "HF_HOME"); !v.empty())
        return {expand_home(v, env) + "/hub", "$HF_HOME/hub"};
    if (std::string v = env_value(env, "XDG_CACHE_HOME"); !v.empty())
        return {expand_home(v, env) + "/huggingface/hub", "$XDG_CACHE_HOME/huggingface/hub"};
    return {home_dir(env) + "/.cache/huggingface/hub", "the default, ~/.cache/huggingface/hub"};
}

std::string repo_id_problem(const std::string& name) {
    const std::size_t slash = name.find('/');
    if (slash == std::string::npos || name.find('/', slash + 1) != std::string::npos)
        return "expected ORG/NAME, with one '/'";
    if (!valid_part(name.substr(0, slash)) || !valid_part(name.substr(slash + 1)))
        return "ORG and NAME are 1 to 96 letters, digits, '-', '_' or '.', neither starting nor ending with "
               "'-' or '.'";
    if (name.find("--") != std::string::npos || name.find("..") != std::string::npos)
        return "'--' and '..' are not allowed in a repo id";
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".git") == 0)
        return "a repo id does not end in .git";
    return {};
}

std::string find_hub_snapshot(const HubCache& cache, const std::string& repo_id, const std::string& revision,
                              const std::string& source) {
    const std::string rev = revision.empty() ? "main" : revision;
    if (rev.size() > 255 || rev.find('\0') != std::string::npos || rev[0] == '/' ||
        rev.find("..") != std::string::npos || rev.find('\\') != std::string::npos || !is_valid_utf8(rev))
        throw UsageError("--revision '" + utf8_for_display(rev.substr(0, 80)) +
                         "': expected a branch, a tag or a commit hash (no '..', not starting with '/')");
    std::string folder = "models--" + repo_id;
    folder.replace(folder.find('/'), 1, "--");
    const std::string repo_dir = cache.dir + "/" + folder;
    const std::string fetch =
        "huggingface-cli download " + repo_id + (revision.empty() ? "" : " --revision " + rev);
    const std::string how = "; to get it, run `" + fetch + "` (huggingface_hub 1.0 and later: `hf download " +
                            repo_id + (revision.empty() ? "" : " --revision " + rev) +
                            "`) on a machine with network, then copy " + repo_dir +
                            " here or set HF_HUB_CACHE to the cache that holds it";
    const std::string what = source + " " + repo_id + (revision.empty() ? "" : " --revision " + rev);
    if (!strategies::is_directory(repo_dir))
        throw Error(what + ": not found: no folder " + repo_id + " here (" + real_path(".") + "), and no " +
                        folder + " in the Hugging Face cache " + cache.dir + " (" + cache.from + ")" + how,
                    kExitNoInput);

    std::vector<std::string> snapshots, refs;
    list_tree(repo_dir + "/snapshots", "", 0, snapshots);
    list_tree(repo_dir + "/refs", "", 3, refs);
    std::string commit;
    std::string via;  // how the commit was found, for messages
    if (rev.size() == 40 && is_hex(rev)) {
        commit = rev;
        via = "commit " + rev;
    } else if (is_file(repo_dir + "/refs/" + rev)) {
        commit = read_ref(repo_dir + "/refs/" + rev);
        if (commit.size() != 40 || !is_hex(commit))
            throw protocol::ModelError(
                repo_dir + "/refs/" + rev + ": holds '" + utf8_for_display(commit.substr(0, 60)) +
                "', not a commit hash; the cache is damaged (download the model again)");
        via = "refs/" + rev + " -> " + commit;
    } else if (rev.size() >= 7 && rev.size() < 40 && is_hex(rev)) {
        std::vector<std::string> matches;
        for (const std::string& s : snapshots)
            if (s.rfind(rev, 0) == 0) matches.push_back(s);
        if (matches.size() > 1)
            throw UsageError("--revision " + rev + ": several snapshots of " + repo_id + " start with it (" +
                             joined(matches) + "); give more of the commit hash");
        if (matches.size() == 1) {
            commit = matches.front();
            via = "commit " + commit;
        }
    }
    if (commit.empty())
        throw Error(what + ": revision " + rev + " is not in the cache " + repo_dir + ": no refs/" + rev +
                        " (branches and tags there: " + joined(refs) + ") and no snapshot whose commit " +
                        (is_hex(rev) ? "starts with it" : "it names") + " (snapshots: " + joined(snapshots) +
                        ")" + how,
                    kExitNoInput);
    const std::string snapshot = repo_dir + "/snapshots/" + commit;
    check_snapshot_inside(repo_dir, snapshot);
    if (!strategies::is_directory(snapshot))
        throw Error(what + ": " + via + ", but " + snapshot + " is missing (an incomplete download)" + how,
                    kExitNoInput);
    if (!is_model_dir(snapshot))
        throw Error(what + ": " + snapshot +
                        " has no model_index.json: not a whole diffusers model (were only some of "
                        "its files downloaded?)" +
                        how,
                    kExitNoInput);
    return real_path(snapshot);
}

std::string resolve_model(const std::string& name, const std::string& source, const std::string& revision,
                          const EnvLookup& env) {
    if (name.empty()) throw UsageError(source + ": expected a model folder or the name of a shipped model");
    const std::string shown = utf8_for_display(name);
    const auto no_revision = [&](const std::string& what) {
        if (!revision.empty())
            throw UsageError("--revision " + utf8_for_display(revision) + ": " + source + " " + shown +
                             " is " + what +
                             "; --revision applies to a Hugging Face repo id (ORG/NAME) found in the cache");
    };
    const bool has_slash = name.find('/') != std::string::npos;
    // A model that is not where it is named is missing input (66), however it is named: a path (a
    // symlink loop included, as for every other input file), a shipped model's name or a repo id
    // (find_hub_snapshot).
    if (const std::string loop = strategies::missing_file_text(name, ""); !loop.empty())
        throw Error(source + " " + shown + ": " + loop, kExitNoInput);
    if (exists(name) && (has_slash || is_model_dir(name))) {  // an existing path always wins
        no_revision("a folder");
        if (!is_model_dir(name))
            throw Error(
                source + " " + shown + ": no model_index.json there (expected a diffusers model folder)",
                kExitNoInput);
        return name;
    }
    if (has_slash) {
        const bool path_like = name[0] == '/' || name[0] == '.' || name[0] == '~' || name.back() == '/' ||
                               std::count(name.begin(), name.end(), '/') > 1;
        if (path_like) {
            no_revision("a folder");
            throw Error(source + " " + shown + ": no such folder (expected a diffusers model folder)",
                        kExitNoInput);
        }
        if (const std::string why = repo_id_problem(name); !why.empty())
            throw UsageError(source + " '" + shown + "': no such folder, and not a Hugging Face repo id (" +
                             why + ")");
        return find_hub_snapshot(hub_cache(env), name, revision, source);
    }
    no_revision("a shipped model's name");
    std::vector<std::string> places;
    if (const std::string dir = env_value(env, "DP_MODELS_DIR"); !dir.empty())
        places.push_back(dir + "/" + name);
    const std::string exe = self_dir();
    places.push_back(exe + "/../share/dp-launch/models/" + name);
    places.push_back(exe + "/../../models/" + name);
    for (const std::string& p : places)
        if (is_model_dir(p)) return real_path(p);
    std::string searched;
    for (const std::string& p : places) searched += (searched.empty() ? "" : ", ") + p;
    throw Error(source + " " + shown +
                    ": no such model folder, and no shipped model of that name (looked in " + searched +
                    "; a Hugging Face repo is named ORG/NAME; a dp-launch copied without its share/ folder "
                    "finds the shipped models through DP_MODELS_DIR, or install it with "
                    "scripts/install.sh or cmake --install)",
                kExitNoInput);
}

std::string config_file_problem(const std::string& source, const std::string& path, int err,
                                const EnvLookup& env) {
    const std::string shown = utf8_for_display(path);
    if (err == ENOENT) {
        try {
            resolve_model(path, "--model", "", env);
            return source + " " + shown + ": " + source +
                   " takes an option file (accelerate's YAML config or a JSON object of dp-launch options), "
                   "and " +
                   shown + " is a model; to run it, give --model " + shown;
        } catch (const Error&) {
            // no model of that name either: the file is missing
        }
    }
    if (err == ELOOP) return source + " " + shown + ": cannot read the file: " + strategies::kSymlinkLoop;
    return source + " " + shown + ": cannot read the file (" + std::strerror(err) + ")";
}

std::string self_dir() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return ".";
    std::string path(buf, static_cast<std::size_t>(n));
    return path.substr(0, path.rfind('/'));
}

}  // namespace dp::launcher
