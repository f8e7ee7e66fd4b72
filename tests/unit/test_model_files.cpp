// Model files are opened without blocking and must be regular files: a FIFO, a device or a folder
// is refused at once with the path named, never waited on. A mapped file that changes under the
// process is named (Note [files that change under a job]).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "launcher/component_files.h"
#include "launcher/model_location.h"
#include "launcher/prompt_file.h"
#include "protocol/errors.h"
#include "strategies/lora.h"
#include "strategies/mapped_files.h"
#include "strategies/model_config.h"
#include "strategies/model_files.h"
#include "strategies/model_sizes.h"
#include "unit/st_writer.h"

using namespace dp::strategies;

namespace {
std::string scratch_dir() {
    std::string dir = "/tmp/dp_model_files_" + std::to_string(getpid());
    mkdir(dir.c_str(), 0777);
    return dir;
}
}  // namespace

TEST_CASE("a FIFO, a folder or a device is refused at once, naming the path") {
    const std::string dir = scratch_dir();
    const std::string fifo = dir + "/config.json";
    unlink(fifo.c_str());
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& path : {fifo, dir, std::string("/dev/zero")}) {
        CAPTURE(path);
        CHECK_THROWS_WITH_AS(read_model_file(path),
                             doctest::Contains((path + ": not a regular file").c_str()),
                             dp::protocol::ModelError);
        CHECK_THROWS_AS(open_model_file(path), dp::protocol::ModelError);
        CHECK(model_file_exists(path));
    }
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
    unlink(fifo.c_str());
    rmdir(dir.c_str());
}

TEST_CASE("a regular model file is read whole, within its size limit") {
    const std::string dir = scratch_dir();
    const std::string path = dir + "/model_index.json";
    std::ofstream(path) << "{\"_class_name\": \"StableDiffusion3Pipeline\"}";
    CHECK(read_model_file(path) == "{\"_class_name\": \"StableDiffusion3Pipeline\"}");
    CHECK_THROWS_WITH_AS(read_model_file(path, 10), doctest::Contains("larger than"),
                         dp::protocol::ModelError);
    CHECK_THROWS_WITH_AS(read_model_file(dir + "/missing.json"), doctest::Contains("cannot open"),
                         dp::protocol::ModelError);
    CHECK_FALSE(model_file_exists(dir + "/missing.json"));
    const int fd = open_model_file(path);
    CHECK(fd >= 0);
    char c = 0;
    CHECK(read(fd, &c, 1) == 1);  // blocking mode restored: an ordinary read
    CHECK(c == '{');
    close(fd);
    unlink(path.c_str());
    rmdir(dir.c_str());
}

namespace {

std::string fresh_dir(const std::string& name) {
    const std::string dir = scratch_dir() + "/" + name;
    std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
    return dir;
}

std::string refusal(const std::string& dir, const std::string& variant) {
    try {
        find_component_weights(dir, variant);
    } catch (const dp::protocol::ModelError& e) {
        return e.what();
    }
    return "(accepted)";
}

}  // namespace

TEST_CASE("weight file names: plain, a variant, sharded, and names that are no weights") {
    const std::vector<std::pair<std::string, std::optional<std::string>>> cases = {
        {"diffusion_pytorch_model.safetensors", ""},
        {"model.safetensors", ""},
        {"diffusion_pytorch_model-00001-of-00002.safetensors", ""},
        {"diffusion_pytorch_model.safetensors.index.json", ""},
        {"diffusion_pytorch_model.fp16.safetensors", "fp16"},
        {"model.bf16.safetensors", "bf16"},
        {"diffusion_pytorch_model.fp16-00001-of-00002.safetensors", "fp16"},
        {"diffusion_pytorch_model-00001-of-00002.fp16.safetensors", "fp16"},  // the older layout
        {"diffusion_pytorch_model.safetensors.index.fp16.json", "fp16"},
        {"config.json", std::nullopt},
        {"tensors.json", std::nullopt},
        {".safetensors", std::nullopt},
        {".hidden.safetensors", std::nullopt},
        {"x.safetensors.index.", std::nullopt},
        {"spiece.model", std::nullopt},
    };
    for (const auto& [name, variant] : cases) {
        CAPTURE(name);
        CHECK(weight_file_variant(name) == variant);
    }
}

TEST_CASE("a component's weights for a variant: one file or an index, and errors that name the variants") {
    const std::string dir = fresh_dir("variants");
    dp::test::write_st_file(dir + "/diffusion_pytorch_model.safetensors", {{"w", {2, 3}}});
    dp::test::write_st_file(dir + "/diffusion_pytorch_model.fp16.safetensors", {{"w", {2, 3}}});
    CHECK(find_component_weights(dir, "").file == dir + "/diffusion_pytorch_model.safetensors");
    CHECK(find_component_weights(dir, "fp16").file == dir + "/diffusion_pytorch_model.fp16.safetensors");
    CHECK(find_component_weights(dir, "fp16").index.empty());
    CHECK(weight_variants(dir) == std::set<std::string>{"", "fp16"});
    // Both files hold the same tensor: a count over "every *.safetensors" would say 12.
    CHECK(safetensors_element_counts(dir, "fp16").at("w") == 6);
    CHECK(safetensors_element_counts(dir).size() == 1);
    CHECK(refusal(dir, "bf16") ==
          "--variant bf16: " + dir +
              " has no bf16 weights (NAME.bf16.safetensors or NAME.safetensors.index.bf16.json); "
              "it has plain weights (drop --variant to use them) and the variant(s) fp16");

    // Only a variant's files: the plain run is refused, naming the variant and the flag.
    std::remove((dir + "/diffusion_pytorch_model.safetensors").c_str());
    CHECK(refusal(dir, "") == dir +
                                  ": only variant weights (fp16, e.g. NAME.fp16.safetensors), no plain ones; "
                                  "pass --variant fp16 to use them");

    // Sharded: the variant's index wins over its shards, and counts come from the shards it names.
    const std::string sharded = fresh_dir("sharded");
    dp::test::write_st_file(sharded + "/diffusion_pytorch_model.fp16-00001-of-00002.safetensors",
                            {{"a", {4}}});
    dp::test::write_st_file(sharded + "/diffusion_pytorch_model.fp16-00002-of-00002.safetensors",
                            {{"b", {5}}});
    CHECK_THROWS_WITH_AS(find_component_weights(sharded, "fp16"),
                         doctest::Contains("but no *.safetensors.index.fp16.json"), dp::protocol::ModelError);
    std::ofstream(sharded + "/diffusion_pytorch_model.safetensors.index.fp16.json")
        << R"({"metadata": {}, "weight_map": {"a": "diffusion_pytorch_model.fp16-00001-of-00002.safetensors",
                                               "b": "diffusion_pytorch_model.fp16-00002-of-00002.safetensors"}})";
    CHECK(find_component_weights(sharded, "fp16").index ==
          sharded + "/diffusion_pytorch_model.safetensors.index.fp16.json");
    const auto counts = safetensors_element_counts(sharded, "fp16");
    CHECK(counts == std::map<std::string, int64_t>{{"a", 4}, {"b", 5}});
    CHECK(refusal(sharded, "") == sharded +
                                      ": only variant weights (fp16, e.g. NAME.fp16.safetensors), no plain "
                                      "ones; pass --variant fp16 to use them");
    std::ofstream(sharded + "/bad.safetensors.index.json") << R"({"weight_map": {"a": "../x.safetensors"}})";
    CHECK_THROWS_WITH_AS(safetensors_element_counts(sharded, ""),
                         doctest::Contains("maps to a bad file name"), dp::protocol::ModelError);

    const std::string empty = fresh_dir("empty");
    CHECK(refusal(empty, "") == empty + ": no *.safetensors weights (only safetensors is supported)");
    CHECK(refusal(empty, "fp16").find("it has no *.safetensors weights at all") != std::string::npos);
    CHECK(refusal(empty + "/missing", "").find("cannot open the component folder") != std::string::npos);
}

TEST_CASE("a symlink to a regular file is a model file, and one to a missing blob says so") {
    // A Hugging Face snapshot: every file is a symlink into ../../blobs/.
    const std::string dir = fresh_dir("snapshot");
    REQUIRE(std::system(("mkdir -p '" + dir + "/blobs' '" + dir + "/snap'").c_str()) == 0);
    std::ofstream(dir + "/blobs/abc") << "{\"k\": 1}";
    REQUIRE(symlink("../blobs/abc", (dir + "/snap/config.json").c_str()) == 0);
    CHECK(read_model_file(dir + "/snap/config.json") == "{\"k\": 1}");
    CHECK_NOTHROW(check_model_file(dir + "/snap/config.json"));
    dp::test::write_st_file(dir + "/blobs/w", {{"t", {3}}});
    REQUIRE(symlink("../blobs/w", (dir + "/snap/model.safetensors").c_str()) == 0);
    CHECK(safetensors_element_counts(dir + "/snap").at("t") == 3);
    REQUIRE(symlink("../blobs/gone", (dir + "/snap/vocab.json").c_str()) == 0);
    CHECK_THROWS_WITH_AS(check_model_file(dir + "/snap/vocab.json"),
                         doctest::Contains("vocab.json: a symlink to ../blobs/gone, which is missing"),
                         dp::protocol::ModelError);
    // A symlink to a folder or a FIFO is still no model file.
    REQUIRE(symlink("../blobs", (dir + "/snap/dir.json").c_str()) == 0);
    CHECK_THROWS_WITH_AS(check_model_file(dir + "/snap/dir.json"),
                         doctest::Contains("not a regular file (a folder)"), dp::protocol::ModelError);
}

TEST_CASE("a symlink loop given as a model, adapter, prompt, component or config file is named as a loop") {
    const std::string dir = fresh_dir("loop");
    const std::string loop = dir + "/loop.safetensors";
    REQUIRE(symlink("loop2", loop.c_str()) == 0);
    REQUIRE(symlink("loop.safetensors", (dir + "/loop2").c_str()) == 0);
    const std::string missing = dir + "/missing.safetensors";
    const dp::launcher::EnvLookup no_env = [](const char*) -> const char* { return nullptr; };
    const dp::strategies::ModelInfo tiny =
        read_model_info(dp::launcher::resolve_model("tiny-random-sd3", "--model", "", no_env));
    struct Row {
        const char* what;
        std::function<void(const std::string&)> read;
        int code;             // for both the loop and a missing file
        const char* missing;  // what a missing file is called
    };
    const std::vector<Row> rows = {
        {"--model", [&](const std::string& p) { dp::launcher::resolve_model(p, "--model", "", no_env); }, 66,
         "no such folder"},
        {"--lora",
         [&](const std::string& p) {
             read_lora_layout(p, *tiny.spec, adapter_targets(tiny.dir, *tiny.spec, ""));
         },
         66, "no such adapter file"},
        {"PROMPTS", [](const std::string& p) { dp::launcher::read_prompt_file(p); }, 66, "No such file"},
        {"--vae",
         [&](const std::string& p) {
             dp::launcher::check_component_files({{"vae", p}}, tiny, "");
         },
         66, "no such file"},
        {"a model file", [](const std::string& p) { check_model_file(p); }, 65, "cannot open"},
    };
    for (const Row& row : rows) {
        CAPTURE(row.what);
        for (const std::string& path : {loop, missing}) {
            CAPTURE(path);
            try {
                row.read(path);
                FAIL("accepted");
            } catch (const dp::protocol::Error& e) {
                const std::string why = e.what();
                CHECK(e.exit_code() == row.code);
                CHECK_MESSAGE(why.find(path) != std::string::npos, why);
                CHECK_MESSAGE(why.find(path == loop ? "a symlink loop" : row.missing) != std::string::npos,
                              why);
                if (path == missing) CHECK_MESSAGE(why.find("symlink loop") == std::string::npos, why);
            }
        }
    }
    CHECK(missing_file_text(loop, "no such file") == dp::strategies::kSymlinkLoop);
    CHECK(missing_file_text(missing, "no such file") == "no such file");
    CHECK(dp::launcher::config_file_problem("--config", loop, ELOOP, no_env) ==
          "--config " + loop + ": cannot read the file: " + dp::strategies::kSymlinkLoop);
}

namespace {

// A file of `pages` pages of 'w' at `path`.
void write_pages(const std::string& path, int pages) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << std::string(static_cast<std::size_t>(pages * sysconf(_SC_PAGESIZE)), 'w');
}

// Writes a byte in the middle of `path` in place until its modification time is not `was` (the
// clock that stamps files moves in ticks of a few ms).
void rewrite_in_place(const std::string& path, const timespec& was) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
        const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        REQUIRE(pwrite(fd, "x", 1, 100) == 1);
        close(fd);
        struct stat st {};
        REQUIRE(stat(path.c_str(), &st) == 0);
        if (st.st_mtim.tv_sec != was.tv_sec || st.st_mtim.tv_nsec != was.tv_nsec) return;
        REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    }
}

// What a child process does with a guarded mapping of `path`: its exit code (128 + the signal
// that killed it) and what it wrote to stderr.
struct ChildEnd {
    int code = -1;
    std::string err;
};
ChildEnd in_child(const std::string& err_path, const std::function<void()>& body) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        const int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        dup2(fd, STDERR_FILENO);
        guard_mapped_files("child: ");
        try {
            body();
        } catch (const dp::protocol::Error& e) {
            const std::string line = std::string("child: ") + e.what() + "\n";
            (void)!write(STDERR_FILENO, line.data(), line.size());
            _exit(e.exit_code());
        }
        _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    std::ifstream in(err_path);
    std::stringstream text;
    text << in.rdbuf();
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text.str()};
}

}  // namespace

TEST_CASE("a mapped file that changes is named: truncated, rewritten in place, replaced or removed") {
    const std::string dir = fresh_dir("mapped");
    const std::string path = dir + "/model.safetensors";
    struct Case {
        const char* name;
        std::function<void(const timespec&)> change;
        std::string says;
    };
    const std::string pages = std::to_string(3 * sysconf(_SC_PAGESIZE));
    const std::vector<Case> cases = {
        {"truncated", [&](const timespec&) { REQUIRE(truncate(path.c_str(), 10) == 0); },
         "changed or was truncated while the job ran (" + pages + " bytes when it was mapped, 10 now)"},
        {"rewritten in place", [&](const timespec& was) { rewrite_in_place(path, was); },
         "was rewritten while the job ran"},
        {"replaced",
         [&](const timespec&) {
             write_pages(path + ".new", 3);
             REQUIRE(rename((path + ".new").c_str(), path.c_str()) == 0);
         },
         "was replaced while the job ran"},
        {"removed", [&](const timespec&) { REQUIRE(unlink(path.c_str()) == 0); },
         "was removed while the job ran"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        write_pages(path, 3);
        struct stat st {};
        REQUIRE(stat(path.c_str(), &st) == 0);
        const MappedModelFile mapped = map_model_file(path, 8, "too small", "8 bytes");
        CHECK(changed_mapped_file().empty());
        c.change(st.st_mtim);
        const std::string why = changed_mapped_file();
        CHECK_MESSAGE(why.find(path + " " + c.says) != std::string::npos, why);
        unmap_model_file(mapped);
        CHECK(changed_mapped_file().empty());  // no longer mapped: nothing can change under it
    }
}

TEST_CASE("a guarded process names a mapped file truncated under it instead of dying by SIGBUS") {
    const std::string dir = fresh_dir("guarded");
    const std::string path = dir + "/weights.gguf";
    const long page = sysconf(_SC_PAGESIZE);
    struct Case {
        const char* name;
        std::function<void()> body;
        int code;
        const char* says;
    };
    const std::vector<Case> cases = {
        {"a read past the new end",
         [&] {
             const MappedModelFile m = map_model_file(path, 8, "too small", "8 bytes");
             REQUIRE(truncate(path.c_str(), page) == 0);
             (void)static_cast<volatile const char*>(m.data)[2 * page];
         },
         74, " changed or was truncated while the job ran (mapped at 0x"},
        {"the same path mapped again as another file",
         [&] {
             unmap_model_file(map_model_file(path, 8, "too small", "8 bytes"));
             write_pages(path + ".new", 2);
             REQUIRE(rename((path + ".new").c_str(), path.c_str()) == 0);
             map_model_file(path, 8, "too small", "8 bytes");
         },
         74, " was replaced while the job ran"},
        // Not in a mapping: the default action, as without the guard.
        {"a SIGBUS sent to it", [] { raise(SIGBUS); }, 128 + SIGBUS, ""},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        write_pages(path, 3);
        const ChildEnd end = in_child(dir + "/stderr", c.body);
        CHECK_MESSAGE(end.code == c.code, end.err);
        if (*c.says) CHECK_MESSAGE(end.err.find("child: " + path + c.says) != std::string::npos, end.err);
    }
}
