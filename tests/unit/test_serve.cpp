// dp-launch serve's pieces without a server: the job database (order, restart, cancel), which
// words of the command line each job's dp-launch takes, the flags, the key check, the image names
// a request may fetch, and how queued jobs become one batch and each image its job's again.
// tests/scripts/serve_check.sh runs the server itself.
#include <doctest/doctest.h>
#include <png.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cli/command_line.h"
#include "cli/serve_command.h"
#include "launcher/model_location.h"
#include "launcher/prompt_file.h"
#include "launcher/resolved_job.h"
#include "serve/batch.h"
#include "serve/body_check.h"
#include "serve/edit_uploads.h"
#include "serve/http_api.h"
#include "serve/job_store.h"
#include "serve/run_records.h"
#include "serve/server.h"

using namespace dp;
using serve::JobState;

namespace {

std::string temp_root() {
    char tmpl[] = "/tmp/dp-serve-unit-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    return tmpl;
}

cli::EnvLookup env_of(const std::map<std::string, std::string>& vars) {
    return [vars](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    };
}

}  // namespace

TEST_CASE("the job database claims jobs oldest first, survives a reopen, and queues a killed run first") {
    const std::string root = temp_root();
    const std::string db = root + "/jobs.sqlite3";
    std::string first, second, third;
    {
        serve::JobStore store(db);
        first = store.add("jobs", "{\"prompt\": \"a\"}\n", 1, 1).id;
        second = store.add("generations", "{\"prompt\": \"b\", \"num_images_per_prompt\": 2}\n", 1, 2).id;
        third = store.add("jobs", "{\"prompt\": \"c\"}\n", 1, 1).id;
        CHECK(first == "job-000001");
        CHECK(store.queue_position(first) == 0);
        CHECK(store.queue_position(third) == 2);
        CHECK(store.active() == 3);
        const auto claimed = store.claim_next();
        REQUIRE(claimed);
        CHECK(claimed->id == first);
        CHECK(claimed->state == JobState::kRunning);
        CHECK(claimed->attempts == 1);
        CHECK(store.queue_position(first) == -1);
        CHECK(store.queue_position(second) == 0);
        // the server is killed here: `first` stays running in the file
    }
    serve::JobStore store(db);
    CHECK(store.body(second) == "{\"prompt\": \"b\", \"num_images_per_prompt\": 2}\n");
    CHECK(store.get(second)->images == 2);
    CHECK(store.requeue_running() == 1);
    // The interrupted job goes first, ahead of those queued before the kill.
    CHECK(store.queue_position(first) == 0);
    CHECK(store.queue_position(second) == 1);
    const auto again = store.claim_next();
    REQUIRE(again);
    CHECK(again->id == first);
    CHECK(again->attempts == 2);
    store.finish(first, JobState::kDone, 0, "");
    CHECK(store.get(first)->state == JobState::kDone);
    CHECK(store.get(first)->finished > 0);
    // Cancel: a queued job at once, a running one marked for the runner, a finished one refused.
    CHECK(store.cancel(third));
    CHECK(store.get(third)->state == JobState::kCancelled);
    const auto running = store.claim_next();
    REQUIRE(running);
    CHECK(running->id == second);
    CHECK(store.cancel(second));
    CHECK(store.get(second)->state == JobState::kRunning);
    CHECK(store.get(second)->cancel_requested);
    CHECK_FALSE(store.cancel(first));
    CHECK_FALSE(store.claim_next());
    const std::map<JobState, int64_t> counts = store.counts();
    CHECK(counts.at(JobState::kDone) == 1);
    CHECK(counts.at(JobState::kRunning) == 1);
    CHECK(counts.at(JobState::kCancelled) == 1);
    CHECK(counts.at(JobState::kQueued) == 0);
    // Ids are spelled one way; anything else is no job.
    for (const char* other : {"job-1", "job-0000001", "job-00000x", "../job-000001", "", "job-"})
        CHECK_FALSE(store.get(other));
    std::system(("rm -rf " + root).c_str());
}

TEST_CASE("a file that is not a job database is refused with its name") {
    const std::string root = temp_root();
    std::ofstream(root + "/jobs.sqlite3")
        << "this is not SQLite, but long enough to look at its header......";
    try {
        serve::JobStore store(root + "/jobs.sqlite3");
        FAIL("a text file was opened as the job database");
    } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()).find(root + "/jobs.sqlite3") != std::string::npos);
    }
    std::system(("rm -rf " + root).c_str());
}

TEST_CASE("each job's dp-launch takes serve's launch and pipeline words, not serve's own, -o or -q") {
    struct Case {
        std::vector<std::string> given;
        std::vector<std::string> job;
    };
    const std::vector<Case> cases = {
        {{"serve", "-n", "2", "--model", "m", "--port", "0", "-o", "root"}, {"-n", "2", "--model", "m"}},
        {{"-n", "2", "serve", "--host=0.0.0.0", "--api-key", "k", "--output-dir=r", "--steps", "4", "-q"},
         {"-n", "2", "--steps", "4"}},
        {{"serve", "--max-queue", "3", "--max-prompts=9", "-oroot", "--ulysses", "2", "--quiet", "--tp", "2"},
         {"--ulysses", "2", "--tp", "2"}},
        {{"serve", "--output_dir", "r", "--max-image-side", "512", "--request-timeout", "5", "--dtype",
          "fp32"},
         {"--dtype", "fp32"}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.given);
        std::string problem;
        CHECK(cli::job_args_for_serve(c.given, problem) == c.job);
        CHECK(problem.empty());
    }
    for (const char* refused : {"--resume", "--overwrite", "--dry-run"}) {
        std::string problem;
        cli::job_args_for_serve({"serve", refused}, problem);
        CHECK(problem.find(refused) != std::string::npos);
    }
}

TEST_CASE("serve's flags: flag over DP_* twin over default, each range refused with what is accepted") {
    serve::ServeOptions o;
    cli::ServeFlags flags;
    CHECK(cli::serve_options_from(flags, env_of({}), o).empty());
    CHECK(o.host == "127.0.0.1");
    CHECK(o.port == serve::kDefaultPort);
    CHECK(o.api_key.empty());
    flags.port = "9001";
    CHECK(cli::serve_options_from(flags, env_of({{"DP_SERVE_PORT", "9002"}, {"DP_API_KEY", "abc"}}), o)
              .empty());
    CHECK(o.port == 9001);
    CHECK(o.api_key == "abc");
    const std::vector<std::pair<std::string, std::string>> bad_env = {
        {"DP_SERVE_PORT", "65536"},   {"DP_MAX_QUEUE", "0"},         {"DP_MAX_PROMPTS", "-1"},
        {"DP_MAX_IMAGES", "x"},       {"DP_MAX_REQUEST_BYTES", "0"}, {"DP_MAX_IMAGE_SIDE", "8"},
        {"DP_REQUEST_TIMEOUT", "-3"}, {"DP_BATCH_IMAGES", "0"}};
    for (const auto& [name, value] : bad_env) {
        CAPTURE(name);
        serve::ServeOptions out;
        const std::string why = cli::serve_options_from(cli::ServeFlags{}, env_of({{name, value}}), out);
        CHECK(why.find(name) != std::string::npos);
    }
    serve::ServeOptions out;
    CHECK(cli::serve_options_from(cli::ServeFlags{}, env_of({{"DP_API_KEY", "a b"}}), out)
              .find("white space") != std::string::npos);
}

TEST_CASE("serve on the command line: its refusals are usage errors before anything starts") {
    const cli::EnvLookup none = env_of({});
    const cli::CommandLine ok = cli::parse_command_line({"serve", "--port", "0", "-n", "2"}, none);
    CHECK(ok.action == cli::CommandLine::Action::kServe);
    CHECK(ok.serve.port == 0);
    CHECK(ok.serve.job_args == std::vector<std::string>{"-n", "2"});
    for (const std::vector<std::string>& bad : {std::vector<std::string>{"serve", "prompts.txt"},
                                                {"serve", "--prompt", "a cat"},
                                                {"serve", "--resume"},
                                                {"serve", "--port", "x"},
                                                {"serve", "--", "./prog"}}) {
        CAPTURE(bad);
        const cli::CommandLine r = cli::parse_command_line(bad, none);
        CHECK(r.action == cli::CommandLine::Action::kFail);
        CHECK(r.exit_code == 2);
    }
}

TEST_CASE("a request may fetch only the images its job's records name, by plain name") {
    const std::vector<nlohmann::json> records = {{{"file", "00000-a-cat.png"}, {"status", "ok"}},
                                                 {{"file", "00001-a-dog.png"}, {"status", "failed"}},
                                                 {{"index", 2}, {"status", "invalid"}}};
    CHECK(serve::is_recorded_image(records, "00000-a-cat.png"));
    for (const char* no : {"00001-a-dog.png", "manifest.jsonl", "../jobs.sqlite3", ".serve.lock", "",
                           "00000-a-cat.png/..", "a b.png", "%2e%2e"})
        CHECK_FALSE(serve::is_recorded_image(records, no));
}

TEST_CASE("the API key is compared whole, and loopback is 127/8, ::1 and localhost") {
    CHECK(serve::key_matches("", ""));
    CHECK(serve::key_matches("", "anything"));
    CHECK(serve::key_matches("k3y", "k3y"));
    CHECK_FALSE(serve::key_matches("k3y", ""));
    CHECK_FALSE(serve::key_matches("k3y", "k3"));
    CHECK_FALSE(serve::key_matches("k3y", "k3yy"));
    CHECK_FALSE(serve::key_matches("k3y", "K3Y"));
    for (const char* yes : {"127.0.0.1", "127.1.2.3", "::1", "localhost"})
        CHECK(serve::is_loopback_host(yes));
    for (const char* no : {"0.0.0.0", "10.0.0.1", "::", "128.0.0.1", "example.com", ""})
        CHECK_FALSE(serve::is_loopback_host(no));
}

namespace {

// A 2 x 1 RGB PNG written by libpng with text chunks `texts` (key, text), as the worker writes one.
std::string png_with_texts(const std::vector<std::pair<std::string, std::string>>& texts) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
    png_infop info = png_create_info_struct(png);
    std::string out;
    png_set_write_fn(
        png, &out,
        [](png_structp p, png_bytep data, png_size_t n) {
            static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<const char*>(data), n);
        },
        nullptr);
    png_set_IHDR(png, info, 2, 1, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    std::vector<png_text> chunks(texts.size());
    for (std::size_t i = 0; i < texts.size(); ++i) {
        chunks[i].compression = PNG_TEXT_COMPRESSION_NONE;
        chunks[i].key = const_cast<char*>(texts[i].first.c_str());
        chunks[i].text = const_cast<char*>(texts[i].second.c_str());
    }
    png_set_text(png, info, chunks.data(), static_cast<int>(chunks.size()));
    png_write_info(png, info);
    unsigned char row[6] = {10, 20, 30, 200, 150, 100};
    png_write_row(png, row);
    png_write_end(png, nullptr);
    png_destroy_write_struct(&png, &info);
    return out;
}

// What libpng reads back from `bytes` (which it checks, CRCs included): the texts and the pixels.
std::pair<std::map<std::string, std::string>, std::vector<unsigned char>> read_png(const std::string& bytes) {
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    REQUIRE(png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()));
    image.format = PNG_FORMAT_RGB;
    std::vector<unsigned char> pixels(PNG_IMAGE_SIZE(image));
    REQUIRE(png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr));
    std::map<std::string, std::string> texts;
    struct Source {
        const std::string& bytes;
        std::size_t at = 0;
    } source{bytes};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
    png_infop info = png_create_info_struct(png);
    png_set_read_fn(png, &source, [](png_structp p, png_bytep data, png_size_t n) {
        auto* s = static_cast<Source*>(png_get_io_ptr(p));
        std::memcpy(data, s->bytes.data() + s->at, n);
        s->at += n;
    });
    png_read_info(png, info);
    png_textp text = nullptr;
    const int n = png_get_text(png, info, &text, nullptr);
    for (int i = 0; i < n; ++i) texts[text[i].key] = text[i].text;
    png_destroy_read_struct(&png, &info, nullptr);
    return {texts, pixels};
}

}  // namespace

TEST_CASE(
    "queued jobs as one batch: each line carries the seed of its job's own run, and each image maps back "
    "to its job's index and line (Note [jobs batched together])") {
    const std::vector<std::string> bodies = {
        "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\", \"seed\": 7}\n",
        "{\"prompt\": \"c\", \"num_images_per_prompt\": 2}\r\n{\"prompt\": \"d\", \"seed\": null}",
        "{\"prompt\": \"e\", \"name\": \"my e\", \"guidance_scale\": 3.5}\n"};
    const serve::BatchPlan plan = serve::plan_batch(bodies, {100, 1});
    // The batch's lines, read as dp-launch reads a prompt file: the seeds each job's run gives.
    const launcher::PromptFile merged = launcher::parse_prompt_file(plan.jsonl, "batch", true);
    REQUIRE(merged.invalid.empty());
    std::vector<uint64_t> seeds;
    for (const launcher::PromptRecord& p : merged.prompts) seeds.push_back(p.seed.value_or(0));
    CHECK(seeds == std::vector<uint64_t>{100, 7, 100, 101, 102, 100});
    CHECK(merged.prompts.back().name == "my e");
    CHECK(merged.prompts.back().arguments.items().size() == 1);
    REQUIRE(plan.images.size() == 6);
    const std::vector<std::tuple<std::size_t, int64_t, int64_t>> expected = {{0, 0, 1}, {0, 1, 3}, {1, 0, 1},
                                                                             {1, 1, 1}, {1, 2, 2}, {2, 0, 1}};
    for (std::size_t i = 0; i < expected.size(); ++i) {
        CAPTURE(i);
        CHECK(std::tuple(plan.images[i].job, plan.images[i].index, plan.images[i].line) == expected[i]);
    }
    CHECK(plan.job_images == std::vector<int64_t>{2, 3, 1});
    // The job's --num-images-per-prompt counts in every index after a line.
    const serve::BatchPlan three = serve::plan_batch({"{\"prompt\": \"x\"}\n{\"prompt\": \"y\"}\n"}, {5, 3});
    CHECK(three.images.size() == 6);
    CHECK(three.jsonl == "{\"prompt\":\"x\",\"seed\":5}\n{\"prompt\":\"y\",\"seed\":8}\n");
    CHECK_THROWS_AS(serve::plan_batch({"{\"prompt\": \"a\"}\n{\"prompt\": 3}\n"}, {}), std::runtime_error);
}

TEST_CASE("a batch image becomes its job's: the name its own run gives it, and its PNG record rewritten") {
    CHECK(serve::name_in_job("00012-a-red-fox.png", 3) == "00003-a-red-fox.png");
    CHECK(serve::name_in_job("123456-image.png", 7) == "00007-image.png");
    CHECK(serve::name_in_job("00001-a-cat.png", 100000) == "100000-a-cat.png");
    const std::string record =
        "{\"file\":\"00012-a-red-fox.png\",\"guidance_scale\":2.5,\"index\":12,\"prompt\":\"a red fox "
        "\\u00e9\","
        "\"seed\":18446744073709551615,\"steps\":4}";
    const std::string batch = png_with_texts({{"parameters", "a red fox\nSteps: 4"}, {"dp-launch", record}});
    const std::string job = serve::png_for_job(batch, 3, "00003-a-red-fox.png");
    REQUIRE_FALSE(job.empty());
    const auto [texts, pixels] = read_png(job);
    CHECK(pixels == read_png(batch).second);
    CHECK(texts.at("parameters") == "a red fox\nSteps: 4");
    // What the job's own run writes: the same record, its index and file, dumped the same way.
    CHECK(texts.at("dp-launch") ==
          "{\"file\":\"00003-a-red-fox.png\",\"guidance_scale\":2.5,\"index\":3,\"prompt\":\"a red fox "
          "\\u00e9\","
          "\"seed\":18446744073709551615,\"steps\":4}");
    CHECK(serve::png_for_job(job, 12, "00012-a-red-fox.png") == batch);
    // Anything else is no image of the batch's.
    CHECK(serve::png_for_job("not a png", 0, "x.png").empty());
    CHECK(serve::png_for_job(png_with_texts({{"parameters", "a"}}), 0, "x.png").empty());
    CHECK(serve::png_for_job(batch.substr(0, batch.size() / 2), 0, "x.png").empty());
    std::string broken = batch;
    broken[8 + 3] = '\x7f';  // IHDR's length past the file
    CHECK(serve::png_for_job(broken, 0, "x.png").empty());
}

TEST_CASE(
    "OpenAI's edit mask, transparent where the image is edited, becomes diffusers' white-repaints mask") {
    const auto write = [](int format, const std::vector<unsigned char>& pixels, int w, int h) {
        png_image image{};
        image.version = PNG_IMAGE_VERSION;
        image.width = static_cast<png_uint_32>(w);
        image.height = static_cast<png_uint_32>(h);
        image.format = static_cast<png_uint_32>(format);
        png_alloc_size_t size = 0;
        REQUIRE(png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr));
        std::string out(size, '\0');
        REQUIRE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr));
        out.resize(size);
        return out;
    };
    // 4 x 2 RGBA: the first two columns transparent (whatever their colour), the rest opaque or half.
    std::vector<unsigned char> rgba;
    for (int y = 0; y < 2; ++y)
        for (int x = 0; x < 4; ++x)
            rgba.insert(rgba.end(), {200, 10, 10, static_cast<unsigned char>(x < 2 ? 0 : x * 60)});
    const std::optional<std::string> mask = serve::mask_from_alpha(write(PNG_FORMAT_RGBA, rgba, 4, 2), false);
    REQUIRE(mask);
    png_image read{};
    read.version = PNG_IMAGE_VERSION;
    REQUIRE(png_image_begin_read_from_memory(&read, mask->data(), mask->size()));
    CHECK((read.format & PNG_FORMAT_FLAG_ALPHA) == 0);
    read.format = PNG_FORMAT_GRAY;
    std::vector<unsigned char> grey(PNG_IMAGE_SIZE(read));
    REQUIRE(png_image_finish_read(&read, nullptr, grey.data(), 0, nullptr));
    CHECK(grey == std::vector<unsigned char>{255, 255, 0, 0, 255, 255, 0, 0});
    // An opaque image is no mask when one is looked for in it; a mask without alpha, a JPEG or
    // bytes that are no PNG are taken as they are.
    std::vector<unsigned char> opaque(rgba);
    for (std::size_t i = 3; i < opaque.size(); i += 4) opaque[i] = 255;
    CHECK_FALSE(serve::mask_from_alpha(write(PNG_FORMAT_RGBA, opaque, 4, 2), true));
    CHECK(serve::mask_from_alpha(write(PNG_FORMAT_RGBA, opaque, 4, 2), false));
    CHECK_FALSE(
        serve::mask_from_alpha(write(PNG_FORMAT_GRAY, std::vector<unsigned char>(8, 255), 4, 2), false));
    CHECK_FALSE(serve::mask_from_alpha("\xff\xd8\xff\xe0 a JPEG", false));
    CHECK_FALSE(serve::mask_from_alpha("", false));
}

TEST_CASE(
    "a request's lines are checked as the job checks them: images counted with the server's "
    "--num-images-per-prompt, and files named only among the request's own uploads") {
    launcher::LaunchSpec launch;
    launcher::JobOptions job;
    job.model = launcher::resolve_model("tiny-random-sd3", "--model");
    job.images_per_prompt = 3;
    const serve::BodyChecker check = serve::make_body_checker(launcher::resolve_job(launch, job), {});
    const serve::BodyCheck two =
        check("{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"num_images_per_prompt\": 2}\n", "");
    CHECK(two.problem.empty());
    CHECK(two.prompts == 2);
    CHECK(two.images == 5);
    const std::string uploads = temp_root();
    std::ofstream(uploads + "/image") << "not an image";
    const auto line = [](const std::string& path) {
        return nlohmann::json{{"prompt", "a cat"}, {"image", path}}.dump() + "\n";
    };
    // An upload is read as the job would read it, and named as the client sent it.
    const serve::BodyCheck bad = check(line(uploads + "/image"), uploads);
    CHECK(bad.status == 400);
    CHECK(bad.problem.find("uploaded image: not a PNG, JPEG or WebP image") != std::string::npos);
    CHECK(bad.problem.find(uploads) == std::string::npos);
    // Any other file is refused, even beside the uploads or through them.
    for (const std::string& other :
         {std::string("/etc/hostname"), uploads + "/../image", uploads + "x/image"}) {
        CAPTURE(other);
        CHECK(check(line(other), uploads).problem.find("may not name files on the server") !=
              std::string::npos);
        CHECK(check(line(other), "").problem.find("may not name files on the server") != std::string::npos);
    }
    std::system(("rm -rf " + uploads).c_str());
}
