// Batch jobs that lose nothing: one job per output folder, a manifest whose records are whole on a
// full disk, restarts and --resume that make only the images that are missing, and a job killed
// at random moments that ends with the images of an uninterrupted run.
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "launcher/manifest.h"
#include "launcher/output_folder.h"
#include "protocol/atomic_file.h"
#include "protocol/errors.h"
#include "strategies/sha256.h"
#include "support/test_paths.h"

using namespace dp::test;

namespace {

std::vector<std::string> args_for(const std::string& out, std::vector<std::string> extra,
                                  const std::string& steps = "2") {
    std::vector<std::string> args = {"--model",  DP_TINY_MODEL, "--steps", steps, "--width", "16",
                                     "--height", "16",          "-o",      out,   "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

std::string numbered_prompts(const std::string& dir, int n, const std::string& name = "p.txt") {
    std::string text;
    for (int i = 0; i < n; ++i) text += "prompt number " + std::to_string(i) + "\n";
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
}

// Every line of the manifest parsed; a line that does not parse fails the test.
std::vector<nlohmann::json> whole_records(const std::string& out) {
    std::vector<nlohmann::json> records;
    for (const std::string& line : lines_of(read_file(out + "/manifest.jsonl"))) {
        CAPTURE(line);
        nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
        CHECK_FALSE(r.is_discarded());
        if (!r.is_discarded()) records.push_back(r);
    }
    return records;
}

std::vector<std::string> names_in(const std::string& dir) {
    std::vector<std::string> names;
    if (DIR* d = opendir(dir.c_str())) {
        while (const dirent* e = readdir(d))
            if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
                names.push_back(e->d_name);
        closedir(d);
    }
    return names;
}

// Temporary files and job files: what a finished or refused job must never leave behind.
std::vector<std::string> leftovers_in(const std::string& dir) {
    std::vector<std::string> found;
    for (const std::string& n : names_in(dir))
        if (n.find(".tmp.") != std::string::npos || n.rfind(".dp-job-", 0) == 0) found.push_back(n);
    return found;
}

std::string join(const std::vector<std::string>& words) {
    std::string text;
    for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
    return text;
}

int64_t mtime_ns(const std::string& path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return -1;
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// A small tmpfs mounted at a fresh folder for the test's life; mounted() is false (and why() says
// why) where mounting is not permitted.
class SmallFilesystem {
  public:
    explicit SmallFilesystem(const std::string& size) : dir_(make_temp_dir()) {
        if (mount("tmpfs", dir_.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0)
            mounted_ = true;
        else
            why_ = std::string("mount -t tmpfs: ") + std::strerror(errno);
    }
    ~SmallFilesystem() {
        if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
        rmdir(dir_.c_str());
    }
    const std::string& dir() const { return dir_; }
    bool mounted() const { return mounted_; }
    const std::string& why() const { return why_; }

  private:
    std::string dir_;
    bool mounted_ = false;
    std::string why_;
};

// Fills `dir`'s filesystem until about `leave` bytes are free, with the file DIR/filler.
void fill_until(const std::string& dir, std::size_t leave) {
    std::ofstream filler(dir + "/filler", std::ios::binary);
    const std::string page(4096, 'f');
    while (filler.write(page.data(), page.size()) && filler.flush()) {
    }
    filler.close();
    // Free some pages again: `leave` bytes, rounded to pages.
    struct stat st {};
    stat((dir + "/filler").c_str(), &st);
    const off_t keep = st.st_size > static_cast<off_t>(leave) ? st.st_size - static_cast<off_t>(leave) : 0;
    REQUIRE(truncate((dir + "/filler").c_str(), keep / 4096 * 4096) == 0);
}

}  // namespace

TEST_CASE("the manifest as a killed run leaves it: later records win, a torn last line is skipped") {
    const std::string dir = make_temp_dir();
    std::ofstream(dir + "/m.jsonl")
        << "{\"index\": 1, \"status\": \"invalid\"}\n{\"index\": 0, \"status\": \"ok\"}\n"
           "{\"index\": 1, \"status\": \"ok\"}\n{\"index\": 2, \"prom";
    const auto records = dp::launcher::read_manifest(dir + "/m.jsonl");
    REQUIRE(records.size() == 2);
    CHECK(records.at(1)["status"] == "ok");
    CHECK(dp::launcher::read_manifest(dir + "/none.jsonl").empty());

    std::ofstream(dir + "/abc") << "abc";
    CHECK(dp::strategies::file_sha256(dir + "/abc") ==
          "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");  // FIPS 180-2's example
    std::ofstream(dir + "/long") << std::string(1000, 'a');  // several blocks, padding in its own
    CHECK(dp::strategies::file_sha256(dir + "/long") ==
          "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");

    const nlohmann::json had = {{"model", "m"},          {"seed", 3},   {"steps", 2},
                                {"guidance_scale", 7.0}, {"width", 16}, {"height", 16},
                                {"negative_prompt", ""}};
    nlohmann::json now = had;
    now["guidance_scale"] = 7;  // the same number
    now["dtype"] = "fp32";      // the default an older record left out
    CHECK(dp::launcher::pixel_setting_differences(had, now).empty());
    now["steps"] = 4;
    now["random_weights"] = 9;
    CHECK(join(dp::launcher::pixel_setting_differences(had, now)) ==
          "random_weights none (now 9) steps 2 (now 4)");
}

TEST_CASE("the output folder's lock: a second holder is refused and told who owns it") {
    const std::string dir = make_temp_dir();
    dp::launcher::OutputLock first = dp::launcher::OutputLock::acquire(dir);
    try {
        dp::launcher::OutputLock::acquire(dir);
        FAIL("a second lock of one folder was granted");
    } catch (const dp::protocol::UsageError& e) {
        const std::string what = e.what();
        CHECK(what.find("another job is writing there (dp-launch pid " + std::to_string(getpid())) !=
              std::string::npos);
        CHECK(what.find(", started 20") != std::string::npos);
    }
    first = dp::launcher::OutputLock();  // released: the next job gets it
    CHECK(dp::launcher::OutputLock::acquire(dir).held());
}

TEST_CASE("two jobs started together into one output folder: one wins, the other exits 2 naming it") {
    const std::string dir = make_temp_dir();
    const std::string prompts = numbered_prompts(dir, 3);
    for (int attempt = 0; attempt < 6; ++attempt) {
        CAPTURE(attempt);
        const std::string out = dir + "/out" + std::to_string(attempt);
        Launch a(args_for(out, {prompts})), b(args_for(out, {prompts}));
        const LaunchResult ra = a.wait(120), rb = b.wait(120);
        const LaunchResult& loser = ra.exit_code == 0 ? rb : ra;
        CHECK_MESSAGE(((ra.exit_code == 0) != (rb.exit_code == 0)), std::string(ra.err + rb.err));
        CHECK(loser.exit_code == 2);
        CHECK_MESSAGE(loser.err.find("another job is writing there (dp-launch pid ") != std::string::npos,
                      loser.err);
        CHECK(whole_records(out).size() == 3);
        CHECK(leftovers_in(out).empty());
        CHECK(processes_with_marker(a.marker()).empty());
        CHECK(processes_with_marker(b.marker()).empty());
    }
}

TEST_CASE("a manifest on a full disk: every record is whole, or absent") {
    SmallFilesystem fs("256k");
    if (!fs.mounted()) {
        MESSAGE("skipped: " << fs.why());
        return;
    }
    const std::string path = fs.dir() + "/manifest.jsonl";
    std::ofstream(path).close();
    dp::launcher::ManifestAppender appender(path);
    int written = 0;
    for (int i = 0; i < 10000; ++i) {
        const nlohmann::json record = {{"index", i}, {"prompt", std::string(1000 + i % 777, 'p')}};
        if (!appender.append(record)) {
            CHECK(errno == ENOSPC);
            break;
        }
        ++written;
    }
    REQUIRE(written > 10);
    REQUIRE(written < 10000);
    const std::vector<std::string> lines = lines_of(read_file(path));
    CHECK(lines.size() == static_cast<std::size_t>(written));
    CHECK(read_file(path).back() == '\n');
    CHECK(dp::launcher::read_manifest(path).size() == static_cast<std::size_t>(written));
    // The gallery or the sorted manifest on the same full disk: refused, no temporary file left.
    CHECK_THROWS_AS(dp::protocol::write_file_atomically(fs.dir() + "/index.html", std::string(64 << 10, 'x')),
                    dp::protocol::IoError);
    CHECK(join(leftovers_in(fs.dir())).empty());
}

TEST_CASE(
    "a job on a full disk exits 74 with a whole manifest and no temporary file; --resume then ends it") {
    SmallFilesystem fs("512k");
    if (!fs.mounted()) {
        MESSAGE("skipped: " << fs.why());
        return;
    }
    // Long prompts: each record is about a page, as each image is.
    const std::string dir = make_temp_dir();
    std::string text;
    for (int i = 0; i < 24; ++i)
        text += "prompt " + std::to_string(i) + " " + std::string(3000, 'a' + i % 26) + "\n";
    std::ofstream(dir + "/p.txt") << text;
    const std::string out = fs.dir() + "/out";
    REQUIRE(mkdir(out.c_str(), 0755) == 0);
    fill_until(fs.dir(), 120 << 10);  // room for the job file, not for every image and record
    const LaunchResult r = run_launch(args_for(out, {dir + "/p.txt"}), {}, 120);
    const std::string tail = r.err.substr(r.err.size() > 1500 ? r.err.size() - 1500 : 0);
    CHECK_MESSAGE(r.exit_code == 74, tail);
    CHECK_MESSAGE(r.err.find("No space left on device") != std::string::npos, tail);
    const std::vector<nlohmann::json> records = whole_records(out);
    CHECK(records.size() <= 24);
    CHECK(join(leftovers_in(out)).empty());

    REQUIRE(std::remove((fs.dir() + "/filler").c_str()) == 0);
    const LaunchResult again = run_launch(args_for(out, {"--resume", dir + "/p.txt"}), {}, 120);
    CHECK_MESSAGE(again.exit_code == 0,
                  again.err.substr(again.err.size() > 1500 ? again.err.size() - 1500 : 0));
    const std::vector<nlohmann::json> done = whole_records(out);
    CHECK(done.size() == 24);
    for (const nlohmann::json& d : done) CHECK(d["status"] == "ok");
    CHECK(file_exists(out + "/index.html"));
    CHECK(join(leftovers_in(out)).empty());
}

TEST_CASE(
    "--max-restarts after a rank is killed: the restart makes only the missing images, each counted once") {
    const std::string dir = make_temp_dir();
    const std::string prompts = numbered_prompts(dir, 8);
    // Rank 1 takes prompts 4-7 (2 steps each) and dies in its 7th step, after 3 images. Started
    // over, it would die there again; resumed, it has at most 2 prompts left.
    std::vector<std::string> args = {
        "--model", DP_TINY_MODEL, "--steps", "2", "--width",        "16", "--height", "16",
        "-o",      dir + "/out",  "-n",      "2", "--max-restarts", "1",  prompts};
    Launch launch(args, {{"DP_TEST_KILL_AT_STEP", "1:7"}});
    const LaunchResult r = launch.wait(120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("restarting all 2 ranks") != std::string::npos);
    CHECK(r.out.find("dp-launch: 8 images, 0 failed, 0 invalid, 0 not run") == 0);
    for (const std::string& line : lines_of(r.err)) {
        long long done = 0, total = 0;
        if (std::sscanf(line.c_str(), "dp-launch: progress %lld/%lld", &done, &total) == 2) {
            CAPTURE(line);
            CHECK(done <= total);
            CHECK(total == 8);
        }
    }
    const std::vector<nlohmann::json> records = whole_records(dir + "/out");
    REQUIRE(records.size() == 8);
    for (const nlohmann::json& rec : records) CHECK(rec["status"] == "ok");
    CHECK(processes_with_marker(launch.marker()).empty());
}

TEST_CASE("--resume keeps the valid images and makes the rest, and other settings are refused") {
    const std::string dir = make_temp_dir();
    const std::string out = dir + "/out";
    const std::string prompts = numbered_prompts(dir, 6);
    REQUIRE(run_launch(args_for(out, {"-n", "2", prompts}), {}, 120).exit_code == 0);
    const std::vector<nlohmann::json> first = whole_records(out);
    REQUIRE(first.size() == 6);
    const auto file = [&](int i) {
        return out + "/" + first[static_cast<std::size_t>(i)]["file"].get<std::string>();
    };
    const std::string reference_3 = read_file(file(3));

    // A rerun without --resume or --overwrite refuses; settings that change pixels are named.
    CHECK(run_launch(args_for(out, {prompts})).exit_code == 2);
    const LaunchResult other = run_launch(args_for(out, {"--resume", "--seed", "5", prompts}, "3"));
    CHECK(other.exit_code == 2);
    CHECK_MESSAGE(other.err.find("steps 2 (now 3)") != std::string::npos, other.err);
    CHECK(other.err.find("seed 0 (now 5)") != std::string::npos);
    CHECK(run_launch(args_for(out, {"--resume", "--dtype", "bf16", prompts}))
              .err.find("dtype 'fp32' (now 'bf16')") != std::string::npos);
    CHECK(read_file(out + "/manifest.jsonl").size() > 0);

    // Prompt 1's image is deleted, 3's tampered with, 4 failed; 6 is new. A killed run's leftovers.
    std::remove(file(1).c_str());
    std::ofstream(file(3), std::ios::binary | std::ios::app) << "tampered";
    std::string manifest_text;
    for (nlohmann::json rec : first) {
        if (rec["index"] == 4) rec["status"] = "failed";
        manifest_text += rec.dump() + "\n";
    }
    manifest_text += "{\"index\": 5, \"prom";  // a torn last line
    std::ofstream(out + "/manifest.jsonl", std::ios::binary | std::ios::trunc) << manifest_text;
    std::ofstream(dir + "/p.txt", std::ios::app) << "prompt number 6\n";
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, nullptr, 0);
    std::ofstream(out + "/.dp-job-" + std::to_string(dead) + ".json") << "{}";
    std::ofstream(out + "/.00002-x.png.tmp." + std::to_string(dead)) << "half";
    std::ofstream(out + "/manifest.jsonl.tmp." + std::to_string(dead)) << "half";
    std::map<int, int64_t> before;
    for (int i : {0, 2, 5}) before[i] = mtime_ns(file(i));

    const LaunchResult resumed = run_launch(args_for(out, {"--resume", prompts}), {}, 120);
    REQUIRE_MESSAGE(resumed.exit_code == 0, resumed.err);
    CHECK(resumed.out.find("dp-launch: 7 images, 0 failed") == 0);
    CHECK(resumed.out.find("(3 kept from the earlier run)") != std::string::npos);
    for (int i : {0, 2, 5}) CHECK(mtime_ns(file(i)) == before[i]);  // kept: not made again
    CHECK(read_file(file(3)) == reference_3);
    CHECK(file_exists(file(1)));
    const std::vector<nlohmann::json> records = whole_records(out);
    REQUIRE(records.size() == 7);
    for (std::size_t i = 0; i < records.size(); ++i) {
        CHECK(records[i]["index"] == static_cast<int>(i));
        CHECK(records[i]["status"] == "ok");
    }
    CHECK(join(leftovers_in(out)).empty());

    // --overwrite with fewer prompts: the earlier images it does not make again are removed.
    const std::string fewer = numbered_prompts(dir, 2, "fewer.txt");
    REQUIRE(run_launch(args_for(out, {"--overwrite", fewer}), {}, 120).exit_code == 0);
    CHECK(whole_records(out).size() == 2);
    std::set<std::string> pngs;
    for (const std::string& n : names_in(out))
        if (n.size() > 4 && n.substr(n.size() - 4) == ".png") pngs.insert(n);
    CHECK(pngs.size() == 2);
}

TEST_CASE("a job killed at 20 random moments and resumed each time ends as an uninterrupted run") {
    const std::string dir = make_temp_dir();
    const int n = 30;
    const std::string prompts = numbered_prompts(dir, n);
    const std::string reference = dir + "/reference", out = dir + "/out";
    REQUIRE(run_launch(args_for(reference, {prompts}), {}, 120).exit_code == 0);
    const std::vector<nlohmann::json> expected = whole_records(reference);
    REQUIRE(expected.size() == static_cast<std::size_t>(n));

    std::mt19937 random(20261201);
    // Each kill comes a random 0-1.5 images' time after a random 0-1 more images are recorded:
    // during start-up, loading, generating, writing an image or appending its record. The job
    // advances about an image between kills, however fast this machine is today.
    double image_ms = 0;
    for (const nlohmann::json& r : expected) image_ms += r["ms"].get<double>() / n;
    std::uniform_int_distribution<int> more_images(0, 1), delay_ms(0, static_cast<int>(1.5 * image_ms) + 1);
    const auto images_recorded = [&] {
        const std::string text =
            file_exists(out + "/manifest.jsonl") ? read_file(out + "/manifest.jsonl") : "";
        int count = 0;
        for (std::size_t at = 0; (at = text.find("\"status\":\"ok\"", at)) != std::string::npos; ++at)
            ++count;
        return count;
    };
    int completed_early = 0, mid_job = 0;
    for (int kill_number = 0; kill_number < 20; ++kill_number) {
        CAPTURE(kill_number);
        const int target = images_recorded() + more_images(random);
        const int delay = delay_ms(random);
        Launch launch(args_for(out, {"--resume", prompts}));
        const auto ended = [&] {
            siginfo_t info{};
            return waitid(P_PID, static_cast<id_t>(launch.pid()), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                   info.si_pid == launch.pid();
        };
        bool exited = false;
        while (!(exited = ended()) && images_recorded() < target) usleep(2000);
        const double deadline = monotonic_seconds() + delay / 1000.0;
        while (!exited && monotonic_seconds() < deadline) {
            usleep(2000);
            exited = ended();
        }
        completed_early += exited;  // it ended before its moment came
        launch.signal(SIGKILL);
        launch.wait(30);
        // Its ranks die of their parent-death signal; the guard kills what is left.
        CHECK(wait_until([&] { return processes_with_marker(launch.marker()).empty(); }, 30));
        // Every record but a torn last line parses.
        const std::vector<std::string> lines =
            lines_of(file_exists(out + "/manifest.jsonl") ? read_file(out + "/manifest.jsonl") : "");
        int ok = 0;
        for (std::size_t i = 0; i < lines.size(); ++i) {
            const nlohmann::json r = nlohmann::json::parse(lines[i], nullptr, false);
            if (i + 1 < lines.size()) CHECK_FALSE(r.is_discarded());
            ok += !r.is_discarded() && r.value("status", "") == "ok";
        }
        mid_job += ok > 0 && ok < n;
    }
    const LaunchResult last = run_launch(args_for(out, {"--resume", prompts}), {}, 120);
    REQUIRE_MESSAGE(last.exit_code == 0, last.err);
    const std::vector<nlohmann::json> records = whole_records(out);
    REQUIRE(records.size() == static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        CAPTURE(i);
        const nlohmann::json& got = records[static_cast<std::size_t>(i)];
        const nlohmann::json& want = expected[static_cast<std::size_t>(i)];
        CHECK(got["index"] == i);
        CHECK(got["status"] == "ok");
        CHECK(got["sha256"] == want["sha256"]);
        CHECK(read_file(out + "/" + got["file"].get<std::string>()) ==
              read_file(reference + "/" + want["file"].get<std::string>()));
    }
    CHECK(join(leftovers_in(out)).empty());
    std::size_t pngs = 0;
    for (const std::string& name : names_in(out))
        pngs += name.size() > 4 && name.substr(name.size() - 4) == ".png";
    CHECK(pngs == static_cast<std::size_t>(n));
    MESSAGE(mid_job << " of 20 kills left some of the images made; " << completed_early
                    << " runs finished before their kill");
}

TEST_CASE(
    "--resume after prompts were inserted: the images no record names go to superseded/, --overwrite removes "
    "them") {
    const std::string dir = make_temp_dir();
    const std::string out = dir + "/out";
    std::ofstream(dir + "/a.txt", std::ios::binary) << "a lighthouse\na red circle\n";
    LaunchResult first = run_launch(args_for(out, {dir + "/a.txt"}), {{"DP_SAVE_LATENTS", "1"}}, 120);
    REQUIRE_MESSAGE(first.exit_code == 0, first.err);
    const std::vector<nlohmann::json> before = whole_records(out);
    REQUIRE(before.size() == 2);
    const std::string moved = before[1].at("file");  // "00001-a-red-circle.png": its prompt moves to index 2
    // A line inserted before the others: "a red circle" is now prompt 2, another file.
    std::ofstream(dir + "/a.txt", std::ios::binary) << "a lighthouse\na blue square\na red circle\n";
    LaunchResult again =
        run_launch(args_for(out, {"--resume", dir + "/a.txt"}), {{"DP_SAVE_LATENTS", "1"}}, 120);
    REQUIRE_MESSAGE(again.exit_code == 0, again.err);
    CHECK_MESSAGE(again.err.find("1 image(s) of the earlier run that no prompt of this job makes moved to") !=
                      std::string::npos,
                  again.err);
    std::set<std::string> listed;
    for (const nlohmann::json& r : whole_records(out)) listed.insert(r.at("file").get<std::string>());
    CHECK(listed.size() == 3);
    CHECK_FALSE(listed.count(moved));
    CHECK_FALSE(file_exists(out + "/" + moved));
    CHECK(file_exists(out + "/superseded/" + moved));
    CHECK(file_exists(out + "/superseded/" + moved + ".latents.safetensors"));
    // Every PNG left in the folder is one a record names.
    for (const std::string& name : names_in(out))
        if (name.size() > 4 && name.compare(name.size() - 4, 4, ".png") == 0)
            CHECK_MESSAGE(listed.count(name), name);
    // --overwrite with fewer prompts: the images no prompt makes are removed.
    std::ofstream(dir + "/a.txt", std::ios::binary) << "a lighthouse\n";
    LaunchResult fewer = run_launch(args_for(out, {"--overwrite", dir + "/a.txt"}), {}, 120);
    REQUIRE_MESSAGE(fewer.exit_code == 0, fewer.err);
    CHECK(fewer.err.find("removed") != std::string::npos);
    int pngs = 0;
    for (const std::string& name : names_in(out))
        pngs += name.size() > 4 && name.compare(name.size() - 4, 4, ".png") == 0;
    CHECK(pngs == 1);
    std::filesystem::remove_all(dir);
}

TEST_CASE("--resume after the model's weights changed in place at the same path: other pixels, refused") {
    const std::string dir = make_temp_dir();
    const std::string model = dir + "/model";
    std::filesystem::copy(DP_TINY_MODEL, model, std::filesystem::copy_options::recursive);
    const std::string out = dir + "/out";
    const std::string prompts = numbered_prompts(dir, 2);
    std::vector<std::string> first = args_for(out, {prompts});
    first[1] = model;
    LaunchResult r = run_launch(first, {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(whole_records(out)[0].at("weights").get<std::string>().size() == 64);
    // The same settings, the same files: --resume keeps both images.
    std::vector<std::string> resume = args_for(out, {"--resume", prompts});
    resume[1] = model;
    LaunchResult same = run_launch(resume, {}, 120);
    CHECK_MESSAGE(same.exit_code == 0, same.err);
    // One byte of the transformer's data changed, the file's size and name the same.
    const std::string weights = model + "/transformer/diffusion_pytorch_model.safetensors";
    std::string bytes = read_file(weights);
    bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x40);
    std::ofstream(weights, std::ios::binary | std::ios::trunc) << bytes;
    LaunchResult changed = run_launch(resume, {}, 120);
    CHECK(changed.exit_code == 2);
    CHECK_MESSAGE(changed.err.find("weight files") != std::string::npos, changed.err);
    std::filesystem::remove_all(dir);
}

TEST_CASE("--resume keeps images of the same scheduler and refuses another scheduler, config or sigmas") {
    const std::string dir = make_temp_dir();
    const std::string out = dir + "/out";
    const std::string prompts = numbered_prompts(dir, 2);
    const std::vector<std::string> karras = {"--scheduler",        "euler",
                                             "--scheduler-config", R"({"use_karras_sigmas": true})",
                                             "--sigmas",           "0.9,0.4"};
    const auto with = [&](std::vector<std::string> flags) {
        flags.push_back(prompts);
        return args_for(out, flags);
    };
    std::vector<std::string> first = karras;
    REQUIRE_MESSAGE(run_launch(with(first), {}, 120).exit_code == 0, "first run");
    CHECK(whole_records(out)[0]["scheduler_resolved"]["config"]["use_karras_sigmas"] == true);
    const std::string file = out + "/" + whole_records(out)[1]["file"].get<std::string>();
    const int64_t made = mtime_ns(file);

    std::vector<std::string> same = karras;
    same.push_back("--resume");
    const LaunchResult kept = run_launch(with(same), {}, 120);
    REQUIRE_MESSAGE(kept.exit_code == 0, kept.err);
    CHECK(kept.out.find("(2 kept from the earlier run)") != std::string::npos);
    CHECK(mtime_ns(file) == made);

    struct Row {
        std::vector<std::string> flags;
        const char* named;
    };
    const Row rows[] = {
        {{"--scheduler", "lcm", "--scheduler-config", R"({"use_karras_sigmas": true})", "--sigmas",
          "0.9,0.4"},
         "scheduler 'euler' (now 'lcm')"},
        {{"--scheduler", "euler", "--scheduler-config", R"({"use_exponential_sigmas": true})", "--sigmas",
          "0.9,0.4"},
         "scheduler_config {\"use_karras_sigmas\":true} (now {\"use_exponential_sigmas\":true})"},
        {{"--scheduler", "euler", "--scheduler-config", R"({"use_karras_sigmas": true})", "--sigmas",
          "0.9,0.5"},
         "sigmas [0.9,0.4] (now [0.9,0.5])"},
        {{}, "scheduler 'euler' (now '')"},
    };
    for (const Row& row : rows) {
        CAPTURE(row.named);
        std::vector<std::string> flags = row.flags;
        flags.push_back("--resume");
        const LaunchResult refused = run_launch(with(flags), {}, 120);
        CHECK(refused.exit_code == 2);
        CHECK_MESSAGE(refused.err.find(row.named) != std::string::npos, refused.err);
        CHECK(mtime_ns(file) == made);
    }
    std::filesystem::remove_all(dir);
}
