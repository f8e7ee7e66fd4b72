// --model ORG/NAME from a Hugging Face cache laid out as huggingface_hub lays it out (refs/,
// snapshots/ of symlinks into blobs/), without any network: the cache folder's variables, a branch,
// a tag, a whole or a short commit, and every way of not being there, each with where it looked
// and how to fetch the model. The caches are real folder trees built in a temp dir.
#include <doctest/doctest.h>

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "launcher/errors.h"
#include "launcher/model_location.h"
#include "protocol/errors.h"
#include "strategies/family.h"
#include "strategies/model_config.h"
#include "strategies/model_sizes.h"
#include "unit/fake_env.h"
#include "unit/test_support.h"

namespace fs = std::filesystem;
using dp::launcher::EnvLookup;
using dp::launcher::resolve_model;

namespace {

const std::string kMain = "0123456789abcdef0123456789abcdef01234567";
const std::string kV2 = "fedcba9876543210fedcba9876543210fedcba98";
const std::string kOther = "0123456f00000000000000000000000000000000";  // shares 7 digits with kMain

using Env = dp::test::FakeEnv;

std::string real(const std::string& path) {
    char buf[PATH_MAX];
    REQUIRE(realpath(path.c_str(), buf) != nullptr);
    return buf;
}

// A snapshot of `model` (a model folder) at `commit` in `repo`, as huggingface_hub stores it:
// each file a blob named by its content's place, linked from snapshots/COMMIT/PATH by a relative
// symlink.
void add_snapshot(const std::string& repo, const std::string& commit, const std::string& model) {
    fs::create_directories(repo + "/blobs");
    const std::string snapshot = repo + "/snapshots/" + commit;
    for (const auto& entry : fs::recursive_directory_iterator(model)) {
        if (!entry.is_regular_file()) continue;
        const std::string rel = fs::relative(entry.path(), model).string();
        std::string blob = commit.substr(0, 8) + "-" + rel;
        for (char& c : blob)
            if (c == '/') c = '_';
        fs::copy_file(entry.path(), repo + "/blobs/" + blob, fs::copy_options::overwrite_existing);
        const fs::path link = fs::path(snapshot) / rel;
        fs::create_directories(link.parent_path());
        std::string up;
        for (std::size_t depth = std::count(rel.begin(), rel.end(), '/') + 2; depth > 0; --depth) up += "../";
        fs::create_symlink(up + "blobs/" + blob, link);
    }
}

// A cache with org/tiny-sd3: refs/main and refs/v2 (a second revision, another commit), a PR ref,
// and a third snapshot that no ref names.
std::string make_cache(const std::string& name) {
    const std::string cache = "/tmp/dp_hub_test_" + std::to_string(getpid()) + "_" + name;
    fs::remove_all(cache);
    const std::string repo = cache + "/models--org--tiny-sd3";
    const std::string model = resolve_model("tiny-random-sd3", "--model");
    add_snapshot(repo, kMain, model);
    add_snapshot(repo, kV2, model);
    add_snapshot(repo, kOther, model);
    fs::create_directories(repo + "/refs/refs/pr");
    std::ofstream(repo + "/refs/main") << kMain;  // huggingface_hub writes no newline
    std::ofstream(repo + "/refs/v2") << kV2 << "\n";
    std::ofstream(repo + "/refs/refs/pr/1") << kV2;
    return cache;
}

int exit_code_of(const std::function<void()>& f, std::string& message) {
    try {
        f();
    } catch (const dp::protocol::Error& e) {
        message = e.what();
        return e.exit_code();
    }
    message = "(accepted)";
    return 0;
}

using dp::test::has;

}  // namespace

TEST_CASE("the cache folder: HF_HUB_CACHE, then HF_HOME/hub, then ~/.cache/huggingface/hub") {
    Env env;
    env.vars["HOME"] = "/home/u";
    CHECK(dp::launcher::hub_cache(env.lookup()).dir == "/home/u/.cache/huggingface/hub");
    env.vars["XDG_CACHE_HOME"] = "/xdg";
    CHECK(dp::launcher::hub_cache(env.lookup()).dir == "/xdg/huggingface/hub");
    env.vars["HF_HOME"] = "~/hf";
    CHECK(dp::launcher::hub_cache(env.lookup()).dir == "/home/u/hf/hub");
    CHECK(dp::launcher::hub_cache(env.lookup()).from == "$HF_HOME/hub");
    env.vars["HUGGINGFACE_HUB_CACHE"] = "/legacy";
    CHECK(dp::launcher::hub_cache(env.lookup()).dir == "/legacy");
    env.vars["HF_HUB_CACHE"] = "/cache";
    CHECK(dp::launcher::hub_cache(env.lookup()).dir == "/cache");
    CHECK(dp::launcher::hub_cache(env.lookup()).from == "$HF_HUB_CACHE");
}

TEST_CASE("repo ids: ORG/NAME of letters, digits, '-', '_' and '.', as huggingface_hub accepts them") {
    for (const char* ok : {"stabilityai/stable-diffusion-3.5-medium", "a/b", "Org_1/Name.v2"}) {
        CAPTURE(ok);
        CHECK(dp::launcher::repo_id_problem(ok).empty());
    }
    for (const char* bad :
         {"a", "a/b/c", "/b", "a/", "a b/c", "a/-b", "a/b.", "a--b/c", "a/b..c", "a/b.git", "\xc3\xa9/b"}) {
        CAPTURE(bad);
        CHECK_FALSE(dp::launcher::repo_id_problem(bad).empty());
    }
}

TEST_CASE("--model ORG/NAME: the snapshot a branch, a tag or a commit names, as a real folder") {
    const std::string cache = make_cache("found");
    Env env;
    env.vars["HF_HUB_CACHE"] = cache;
    const std::string snapshots = real(cache) + "/models--org--tiny-sd3/snapshots/";
    const auto find = [&](const std::string& revision) {
        return resolve_model("org/tiny-sd3", "--model", revision, env.lookup());
    };
    CHECK(find("") == snapshots + kMain);
    CHECK(find("main") == snapshots + kMain);
    CHECK(find("v2") == snapshots + kV2);              // a second revision: another snapshot
    CHECK(find("refs/pr/1") == snapshots + kV2);       // refs may nest, as pull requests' do
    CHECK(find(kOther) == snapshots + kOther);         // a whole commit needs no ref
    CHECK(find(kV2.substr(0, 7)) == snapshots + kV2);  // a unique prefix of 7 or more
    // The folder the job file gets is real, though its files are symlinks into blobs/.
    struct stat st {};
    REQUIRE(lstat(find("").c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    REQUIRE(lstat((find("") + "/transformer/config.json").c_str(), &st) == 0);
    CHECK(S_ISLNK(st.st_mode));
    // What the launcher reads of the model works through the symlinks.
    const std::string model = find("");
    const auto& spec = dp::strategies::parallel_spec_for_model(model);
    CHECK(dp::strategies::read_transformer_shape(model, spec).layers == 2);
    CHECK(dp::strategies::model_folder_problems(model, spec, {}).empty());
    CHECK(dp::strategies::pipeline_component_sizes(model, spec, 4).size() == 4);

    // Through the command line, with --revision.
    const auto parse = [&](std::vector<std::string> args) {
        return dp::cli::parse_command_line(args, env.lookup());
    };
    const dp::cli::CommandLine c = parse({"--model", "org/tiny-sd3", "--revision", "v2", "p.txt"});
    REQUIRE_MESSAGE(c.action == dp::cli::CommandLine::Action::kLaunch, c.message);
    CHECK(c.job->model == snapshots + kV2);
    CHECK(c.job->revision == "v2");
    env.vars["DP_MODEL"] = "org/tiny-sd3";
    CHECK(parse({"p.txt"}).job->model == snapshots + kMain);
    fs::remove_all(cache);
}

TEST_CASE("an existing path always wins over the cache") {
    const std::string cache = make_cache("path_wins");
    const std::string here = "/tmp/dp_hub_test_" + std::to_string(getpid()) + "_cwd";
    fs::create_directories(here + "/org/tiny-sd3");
    std::ofstream(here + "/org/tiny-sd3/model_index.json") << "{}";
    Env env;
    env.vars["HF_HUB_CACHE"] = cache;
    const fs::path before = fs::current_path();
    fs::current_path(here);
    CHECK(resolve_model("org/tiny-sd3", "--model", "", env.lookup()) == "org/tiny-sd3");
    std::string message;
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "v2", env.lookup()); }, message) == 2);
    CHECK(has(message,
              "--revision v2: --model org/tiny-sd3 is a folder; --revision applies to a Hugging Face repo"));
    fs::current_path(before);
    fs::remove_all(here);
    fs::remove_all(cache);
}

TEST_CASE("not in the cache: exit 66, every place looked at, and how to fetch it") {
    const std::string cache = make_cache("missing");
    Env env;
    env.vars["HF_HUB_CACHE"] = cache;
    const std::string repo = cache + "/models--org--tiny-sd3";
    std::string m;

    CHECK(exit_code_of([&] { resolve_model("org/other", "--model", "", env.lookup()); }, m) == 66);
    CHECK_MESSAGE(has(m, "--model org/other: not found: no folder org/other here ("), m);
    CHECK(has(m, "and no models--org--other in the Hugging Face cache " + cache + " ($HF_HUB_CACHE)"));
    CHECK(has(m, "run `huggingface-cli download org/other`"));
    CHECK(has(m, "on a machine with network"));

    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "v9", env.lookup()); }, m) == 66);
    CHECK_MESSAGE(has(m, "--model org/tiny-sd3 --revision v9: revision v9 is not in the cache " + repo), m);
    CHECK(has(m, "(branches and tags there: main, refs/pr/1, v2)"));
    CHECK(has(m, "(snapshots: " + kMain + ", " + kOther + ", " + kV2 + ")"));
    CHECK(has(m, "`huggingface-cli download org/tiny-sd3 --revision v9`"));

    // Too short a prefix is no commit; an ambiguous one is a usage error that lists the matches.
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", kMain.substr(0, 6), env.lookup()); },
                       m) == 66);
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", kMain.substr(0, 7), env.lookup()); },
                       m) == 2);
    CHECK_MESSAGE(has(m, "several snapshots of org/tiny-sd3 start with it (" + kMain + ", " + kOther + ")"),
                  m);

    // A ref whose snapshot was never downloaded, a snapshot without model_index.json.
    std::ofstream(repo + "/refs/gone") << std::string(40, 'e');
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "gone", env.lookup()); }, m) == 66);
    CHECK_MESSAGE(has(m, "refs/gone -> " + std::string(40, 'e') + ", but " + repo + "/snapshots/" +
                             std::string(40, 'e') + " is missing (an incomplete download)"),
                  m);
    fs::remove(repo + "/snapshots/" + kV2 + "/model_index.json");
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "v2", env.lookup()); }, m) == 66);
    CHECK(has(m, "has no model_index.json: not a whole diffusers model"));

    // A damaged ref is the model's problem (65); a malformed revision or name is a usage error (2).
    std::ofstream(repo + "/refs/bad") << "not a hash";
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "bad", env.lookup()); }, m) == 65);
    CHECK(has(m, "refs/bad: holds 'not a hash', not a commit hash"));
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "../../x", env.lookup()); }, m) == 2);
    CHECK(has(m, "--revision '../../x': expected a branch, a tag or a commit hash"));
    CHECK(exit_code_of([&] { resolve_model("org/tiny sd3", "--model", "", env.lookup()); }, m) == 2);
    CHECK(has(m, "no such folder, and not a Hugging Face repo id"));

    // Through the command line: the exit code and the message as they are.
    const dp::cli::CommandLine c =
        dp::cli::parse_command_line({"--model", "org/other", "p.txt"}, env.lookup());
    CHECK(c.action == dp::cli::CommandLine::Action::kFail);
    CHECK(c.exit_code == 66);
    CHECK(has(c.message, "huggingface-cli download org/other"));
    // A broken symlink into blobs/ is named by the model checks.
    fs::remove(repo + "/blobs/" + kMain.substr(0, 8) + "-transformer_config.json");
    const std::string model = resolve_model("org/tiny-sd3", "--model", "", env.lookup());
    const auto problems =
        dp::strategies::model_folder_problems(model, dp::strategies::family_spec("sd3"), {});
    REQUIRE(problems.size() == 1);
    CHECK_MESSAGE(has(problems[0], "transformer/config.json: a symlink to ../../../blobs/"), problems[0]);
    CHECK(has(problems[0], "which is missing (an incomplete download?"));
    fs::remove_all(cache);
}

TEST_CASE(
    "the cache stays inside itself: refs are small plain files, snapshots its own folders, links into "
    "blobs/") {
    const std::string cache = make_cache("inside");
    Env env;
    env.vars["HF_HUB_CACHE"] = cache;
    const std::string repo = cache + "/models--org--tiny-sd3";
    std::string m;
    // A ref that is a symbolic link to another file is refused unread (its content is not printed).
    std::ofstream(cache + "/secret") << std::string(40, 'a');
    fs::create_symlink(cache + "/secret", repo + "/refs/linked");
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "linked", env.lookup()); }, m) == 65);
    CHECK_MESSAGE(has(m, "a ref must be a plain file holding a commit hash (this one is a symbolic link)"),
                  m);
    CHECK_FALSE(has(m, std::string(40, 'a')));
    // A 200 MB ref is refused by its size, not read.
    { std::ofstream(repo + "/refs/huge") << ""; }
    fs::resize_file(repo + "/refs/huge", 200u << 20);
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "huge", env.lookup()); }, m) == 65);
    CHECK(has(m, "209715200 bytes, not a commit hash"));
    // A snapshot that is a link out of the cache.
    const std::string outside = cache + "_outside";
    fs::remove_all(outside);
    fs::copy(resolve_model("tiny-random-sd3", "--model"), outside, fs::copy_options::recursive);
    const std::string commit(40, 'c');
    fs::create_symlink(outside, repo + "/snapshots/" + commit);
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", commit, env.lookup()); }, m) == 65);
    CHECK_MESSAGE(has(m, "a snapshot must be a folder of the cache, not a symbolic link"), m);
    // A file of a snapshot that links outside blobs/.
    const std::string link = repo + "/snapshots/" + kOther + "/transformer/config.json";
    fs::remove(link);
    fs::create_symlink(outside + "/transformer/config.json", link);
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", kOther, env.lookup()); }, m) == 65);
    CHECK_MESSAGE(has(m, "transformer/config.json: links to " + real(outside) +
                             "/transformer/config.json, outside the cache's"),
                  m);
    // The untouched revision still resolves.
    CHECK(exit_code_of([&] { resolve_model("org/tiny-sd3", "--model", "main", env.lookup()); }, m) == 0);
    fs::remove_all(outside);
    fs::remove_all(cache);
}
