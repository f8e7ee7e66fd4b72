// Edits (img2img) through the real dp-launch and dp-worker (Note [img2img in the one loop]): a
// batch edit of a folder without a prompt file, its records and names, the same images at any
// number of ranks, --resume making again exactly the edits whose input changed, and every bad
// input refused before anything starts, naming the line.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "integration/job_outputs.h"
#include "integration/launch_harness.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

using namespace dp::test;

namespace {

namespace fs = std::filesystem;

// An input of the golden edits (scripts/golden/golden_img2img.py).
std::string input(const std::string& name) { return std::string(DP_GOLDEN_DIR) + "/img2img/" + name; }

std::vector<std::string> tiny(const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model", DP_TINY_MODEL, "--steps", "3", "-o", out, "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

std::vector<std::string> with_all(std::vector<std::string> head, const std::vector<std::string>& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
}

int64_t mtime_ns(const std::string& path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return -1;
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

TEST_CASE(
    "--prompt with --image FOLDER edits each image once, named after it and recorded with its SHA-256, the "
    "same at 1 and 3 ranks, and --resume makes again exactly the edit whose input changed") {
    const std::string dir = make_temp_dir();
    fs::create_directories(dir + "/photos");
    fs::copy_file(input("in_32x32.png"), dir + "/photos/cat.png");
    fs::copy_file(input("in_37x23.jpg"), dir + "/photos/dog.JPG");
    std::ofstream(dir + "/photos/notes.txt") << "not an image, and not listed";
    const std::vector<std::string> edit = {"--prompt", "make it winter", "--image", dir + "/photos"};

    LaunchResult one = run_launch(tiny(dir + "/one", edit), {}, 120);
    REQUIRE_MESSAGE(one.exit_code == 0, one.err);
    const std::vector<nlohmann::json> records = read_manifest(dir + "/one");
    REQUIRE(records.size() == 2);
    CHECK(records[0]["file"] == "00000-cat.png");
    CHECK(records[1]["file"] == "00001-dog.png");
    CHECK(records[0]["image"]["path"] == fs::canonical(dir + "/photos/cat.png").string());
    CHECK(records[0]["image"]["sha256"].get<std::string>().size() == 64);
    CHECK(records[1]["image"]["width"] == 37);
    CHECK(records[1]["image"]["height"] == 23);
    CHECK(records[1]["strength"] == 0.6);  // StableDiffusion3Img2ImgPipeline's default
    int width = 0, height = 0;
    read_png_rgb(dir + "/one/00001-dog.png", &width, &height);
    CHECK(width == 37);  // the input's size: the tiny model makes any size up to 40
    CHECK(height == 23);

    LaunchResult three = run_launch(tiny(dir + "/three", with_all({"-n", "3"}, edit)), {}, 120);
    REQUIRE_MESSAGE(three.exit_code == 0, three.err);
    for (const char* file : {"00000-cat.png", "00001-dog.png"})
        CHECK(max_pixel_difference(dir + "/one/" + file, dir + "/three/" + file) == 0);

    // The dog's input changes (other bytes, another size): only its edit is made again.
    const int64_t cat_before = mtime_ns(dir + "/one/00000-cat.png");
    fs::copy_file(input("in_32x32.png"), dir + "/photos/dog.JPG", fs::copy_options::overwrite_existing);
    LaunchResult resumed = run_launch(tiny(dir + "/one", with_all({"--resume"}, edit)), {}, 120);
    REQUIRE_MESSAGE(resumed.exit_code == 0, resumed.err);
    CHECK_MESSAGE(resumed.out.find("(1 kept from the earlier run)") != std::string::npos, resumed.out);
    CHECK(mtime_ns(dir + "/one/00000-cat.png") == cat_before);
    read_png_rgb(dir + "/one/00001-dog.png", &width, &height);
    CHECK(width == 32);
    CHECK(read_manifest(dir + "/one")[1]["image"]["width"] == 32);
    // Masks of the same names in a folder: each line inpaints its image with its own mask.
    fs::create_directories(dir + "/masks");
    for (const char* name : {"cat.png", "dog.JPG"})
        fs::copy_file(input("mask_24x16.png"), dir + "/masks/" + name);
    LaunchResult masked = run_launch(
        tiny(dir + "/masked", with_all({"--mask-image", dir + "/masks", "--strength", "0.9"}, edit)), {},
        120);
    // The tiny SD3 model's transformer takes 4 latent channels: diffusers inpaints only with 16.
    CHECK(masked.exit_code == 1);
    CHECK_MESSAGE(
        masked.err.find("blends a mask only for a transformer of 16 latent channels") != std::string::npos,
        masked.err);
    const std::vector<nlohmann::json> failed = read_manifest(dir + "/masked");
    REQUIRE(failed.size() == 2);
    CHECK(failed[1]["mask_image"]["path"] == fs::canonical(dir + "/masks/dog.JPG").string());
    remove_dir(dir);
}

TEST_CASE(
    "padding_mask_crop through dp-launch gives diffusers' image at the input's size, and a mask of another "
    "size is refused") {
    const std::string dir = make_temp_dir();
    const std::string flux = std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev";
    // scripts/golden/golden_img2img.py's flux_png_inpaint_crop, as a line.
    const nlohmann::json line = {{"prompt", "a cat on a sofa"},
                                 {"seed", 71},
                                 {"steps", 3},
                                 {"strength", 0.9},
                                 {"guidance_scale", 3.5},
                                 {"width", 32},
                                 {"height", 32},
                                 {"max_sequence_length", 32},
                                 {"padding_mask_crop", 4},
                                 {"image", input("in_48x32.png")},
                                 {"mask_image", input("mask_48x32.png")}};
    std::ofstream(dir + "/p.jsonl") << line.dump() << "\n";
    LaunchResult r = run_launch({"--model", flux, "-o", dir + "/out", "-q", dir + "/p.jsonl"}, {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::vector<nlohmann::json> records = read_manifest(dir + "/out");
    REQUIRE(records.size() == 1);
    CHECK(records[0]["padding_mask_crop"] == 4);
    const std::string png = dir + "/out/" + records[0]["file"].get<std::string>();
    int width = 0, height = 0;
    read_png_rgb(png, &width, &height);
    CHECK(width == 48);  // the input's size, not the 32 x 32 it was made at
    CHECK(height == 32);
    const PixelDifference d = png_against_golden(
        png, std::string(DP_GOLDEN_DIR) + "/img2img_pipeline.safetensors", "flux_png_inpaint_crop.image");
    CHECK(d.max == 0);
    // A mask of another size: diffusers' paste through it fails; refused before anything starts.
    nlohmann::json other = line;
    other["mask_image"] = input("mask_24x16.png");
    std::ofstream(dir + "/q.jsonl") << other.dump() << "\n";
    r = run_launch({"--model", flux, "-o", dir + "/out2", "-q", dir + "/q.jsonl"}, {}, 60);
    CHECK(r.exit_code == 65);
    CHECK_MESSAGE(
        r.err.find(":1: key 'padding_mask_crop': the mask is 24 x 16 pixels and the image 48 x 32") !=
            std::string::npos,
        r.err);
    CHECK_FALSE(file_exists(dir + "/out2/manifest.jsonl"));
    remove_dir(dir);
}

TEST_CASE(
    "plan counts an edit as the job makes it: an img2img's size from --image, Kontext's reference tokens "
    "in the image stream, a missing --image refused as the job refuses it") {
    const std::string kontext = std::string(DP_MODELS_DIR) + "/tiny-random-flux-kontext";
    // 48 x 32 at max_area 1536: 3 x 2 latent patches; the reference at 1248 x 832: 78 x 52 = 4056.
    LaunchResult r = run_launch({"plan", "--model", kontext, "--image", input("in_48x32.png"), "--width",
                                 "48", "--height", "32", "--max-area", "1536", "--json"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const nlohmann::json plan = nlohmann::json::parse(r.out);
    CHECK(plan["prompt"]["width"] == 48);
    CHECK(plan["prompt"]["image_tokens"] == 4062);
    CHECK(plan["prompt"]["reference_tokens"] == 4056);
    r = run_launch({"plan", "--model", kontext, "--width", "48", "--height", "32", "--max-area", "1536"});
    CHECK_MESSAGE(r.out.find("48x32 px -> 6 image tokens, ") != std::string::npos, r.out);
    // FLUX.1-dev's img2img: the size is the input's (48 x 32), not the model's default.
    r = run_launch({"plan", "--model", std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev", "--image",
                    input("in_48x32.png")});
    CHECK_MESSAGE(r.out.find("48x32 px -> 6 image tokens, ") != std::string::npos, r.out);
    CHECK(run_launch({"plan", "--model", kontext, "--image", input("missing.png")}).exit_code == 66);
}

TEST_CASE(
    "Qwen-Image-Edit: one prompt over a folder of images (--prompt, --image DIR) as each alone at any rank "
    "count; Edit-Plus's pictures from --image given again; the size and the reference tokens plan counts") {
    const std::string dir = make_temp_dir();
    const std::string edit = std::string(DP_MODELS_DIR) + "/tiny-random-qwen-image-edit";
    const std::string plus = std::string(DP_MODELS_DIR) + "/tiny-random-qwen-image-edit-plus";
    fs::create_directories(dir + "/photos");
    for (const char* name : {"in_32x32.png", "in_37x23.jpg"})
        fs::copy_file(input(name), dir + "/photos/" + name);
    const std::vector<std::string> common = {"--prompt",
                                             "make the sky green",
                                             "--negative-prompt",
                                             "blurry",
                                             "--steps",
                                             "2",
                                             "--width",
                                             "32",
                                             "--height",
                                             "32",
                                             "-q"};
    LaunchResult r = run_launch(
        with_all({"--model", edit, "-n", "2", "--image", dir + "/photos", "-o", dir + "/all"}, common), {},
        120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::vector<nlohmann::json> records = read_manifest(dir + "/all");
    REQUIRE(records.size() == 2);
    for (const nlohmann::json& record : records) {
        const std::string name = fs::path(record["image"]["path"].get<std::string>()).filename().string();
        CAPTURE(name);
        CHECK(record["file"].get<std::string>().find(name.substr(3, 5)) != std::string::npos);  // its name
        const nlohmann::json line = {{"prompt", "make the sky green"},
                                     {"negative_prompt", "blurry"},
                                     {"seed", record["seed"]},
                                     {"image", dir + "/photos/" + name}};
        std::ofstream(dir + "/" + name + ".jsonl") << line.dump() << "\n";
        LaunchResult alone =
            run_launch({"--model", edit, "-n", "1", "--steps", "2", "--width", "32", "--height", "32", "-q",
                        "-o", dir + "/" + name, dir + "/" + name + ".jsonl"},
                       {}, 120);
        REQUIRE_MESSAGE(alone.exit_code == 0, alone.err);
        const std::vector<nlohmann::json> one = read_manifest(dir + "/" + name);
        REQUIRE(one.size() == 1);
        // Within 1 of 255: one process's threads sum a matmul otherwise than two's.
        CHECK(max_pixel_difference(dir + "/" + name + "/" + one[0]["file"].get<std::string>(),
                                   dir + "/all/" + record["file"].get<std::string>()) <= 1);
    }
    // Edit-Plus: --image twice is one line's two pictures, recorded in order.
    r = run_launch(with_all({"--model", plus, "--image", input("in_32x32.png"), "--image",
                             input("in_37x23.jpg"), "-o", dir + "/plus"},
                            common),
                   {}, 120);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::vector<nlohmann::json> two = read_manifest(dir + "/plus");
    REQUIRE(two.size() == 1);
    REQUIRE(two[0]["image"].is_array());
    CHECK(fs::path(two[0]["image"][1]["path"].get<std::string>()).filename() == "in_37x23.jpg");
    // Without a size, the last picture's at 1024 x 1024 pixels' area (1312 x 800 for 37 x 23); each
    // picture's reference tokens at that size for the VAE: 64 x 64 and 82 x 50 patches.
    r = run_launch({"plan", "--model", plus, "--image", input("in_32x32.png"), "--image",
                    input("in_37x23.jpg"), "--json"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const nlohmann::json plan = nlohmann::json::parse(r.out);
    CHECK(plan["prompt"]["width"] == 1312);
    CHECK(plan["prompt"]["height"] == 800);
    CHECK(plan["prompt"]["reference_tokens"] == 4096 + 4100);
    CHECK(plan["prompt"]["image_tokens"] == 82 * 50 + 4096 + 4100);
    // dp-launch arguments says where that default comes from.
    r = run_launch({"arguments", "--model", plus});
    CHECK_MESSAGE(
        r.out.find("its last picture's, as the pipeline sizes it (multiples of 16)") != std::string::npos,
        r.out);
    remove_dir(dir);
}

TEST_CASE("bad inputs are refused before any rank starts, naming the line and what is accepted") {
    const std::string dir = make_temp_dir();
    const std::string good = input("in_32x32.png");
    // A JPEG cut short, a text file named .png, an empty file.
    const std::string jpeg = read_file(input("in_37x23.jpg"));
    std::ofstream(dir + "/cut.jpg", std::ios::binary) << jpeg.substr(0, jpeg.size() / 2);
    std::ofstream(dir + "/text.png") << "hello";
    std::ofstream(dir + "/empty.webp");
    struct Bad {
        std::string line, says;
        int exit_code;
    };
    const std::vector<Bad> bads = {
        {R"({"prompt": "x", "image": "missing.png"})", "p.jsonl:2: key 'image': ", 66},
        {R"({"prompt": "x", "image": "cut.jpg"})", "p.jsonl:2: key 'image': ", 65},
        {R"({"prompt": "x", "image": "text.png"})", "PNG, JPEG or WebP", 65},
        {R"({"prompt": "x", "image": "empty.webp"})", "p.jsonl:2: key 'image': ", 65},
        {R"({"prompt": "x", "image": "cut.jpg", "strength": 0})", "expected a number above 0 to 1", 65},
        {R"({"prompt": "x", "image": 7})", "expected an image file's path", 65},
        {R"({"prompt": "x", "mask_image": "cut.jpg"})", "p.jsonl:2: key 'mask_image': ", 65},
        {R"({"prompt": "x", "image": "text.png", "mask_image": "missing.png"})",
         "p.jsonl:2: key 'image': ", 65},
    };
    for (const Bad& bad : bads) {
        CAPTURE(bad.line);
        std::ofstream(dir + "/p.jsonl") << "{\"prompt\": \"fine\", \"image\": \"" << good << "\"}\n"
                                        << bad.line << "\n";
        LaunchResult r = run_launch(tiny(dir + "/out", {"-n", "2", dir + "/p.jsonl"}));
        CHECK(r.exit_code == bad.exit_code);
        CHECK_MESSAGE(r.err.find(bad.says) != std::string::npos, r.err);
        CHECK(r.seconds < 20);
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
    }
    // FLUX.1-Fill needs an image and its mask on every line; FLUX.1-Kontext takes no mask, and
    // refuses a size that max_area makes too small.
    const std::string fill = std::string(DP_MODELS_DIR) + "/tiny-random-flux-fill";
    const std::string kontext = std::string(DP_MODELS_DIR) + "/tiny-random-flux-kontext";
    const std::string qwen_edit = std::string(DP_MODELS_DIR) + "/tiny-random-qwen-image-edit";
    const std::string qwen_plus = std::string(DP_MODELS_DIR) + "/tiny-random-qwen-image-edit-plus";
    struct ModelBad {
        std::string model, line, says;
    };
    for (const ModelBad& bad : std::vector<ModelBad>{
             {fill, R"({"prompt": "x"})",
              ":2: key 'image': FLUX.1-Fill's pipeline (FluxFillPipeline) needs it"},
             {fill, R"({"prompt": "x", "image": ")" + good + "\"}",
              ":2: key 'mask_image': FLUX.1-Fill's pipeline (FluxFillPipeline) needs it on every line (or "
              "--mask-image for the job)"},
             {kontext, R"({"prompt": "x", "image": ")" + good + R"(", "mask_image": ")" + good + "\"}",
              ":2: key 'mask_image': FLUX.1-Kontext does not take mask_image"},
             {kontext,
              R"({"prompt": "x", "image": ")" + input("in_37x23.jpg") +
                  R"(", "width": 16, "height": 1024, "max_area": 1024})",
              ":2: the image made would be 0 x 256 pixels"},
             // Qwen-Image-Edit needs an image on every line, and takes one; Edit-Plus up to 3.
             {qwen_edit, R"({"prompt": "x"})",
              ":2: key 'image': Qwen-Image-Edit's pipeline (QwenImageEditPipeline) needs it on every line"},
             {qwen_edit, R"({"prompt": "x", "image": [")" + good + R"(", ")" + good + "\"]}",
              ":2: key 'image': a list of 2 pictures; Qwen-Image-Edit's pipeline (QwenImageEditPipeline) "
              "takes one"},
             {qwen_plus,
              R"({"prompt": "x", "image": [")" + good + R"(", ")" + good + R"(", ")" + good + R"(", ")" +
                  good + "\"]}",
              "or a list of 1 to 3 of them (the list has 4 pictures)"},
             {qwen_plus, R"({"prompt": "x", "image": [")" + good + R"(", 7]})", ":2: key 'image': expected"},
             {qwen_plus, R"({"prompt": "x", "image": ")" + good + R"(", "strength": 0.5})",
              ":2: key 'strength': Qwen-Image-Edit-Plus does not take strength"}}) {
        CAPTURE(bad.line);
        std::ofstream(dir + "/p.jsonl")
            << "{\"prompt\": \"fine\", \"image\": \"" << good << "\", \"mask_image\": \"" << good << "\"}\n"
            << bad.line << "\n";
        std::ofstream(dir + "/k.jsonl") << "{\"prompt\": \"fine\"}\n" << bad.line << "\n";
        std::ofstream(dir + "/q.jsonl") << "{\"prompt\": \"fine\", \"image\": \"" << good << "\"}\n"
                                        << bad.line << "\n";
        const std::string file = bad.model == fill      ? "/p.jsonl"
                                 : bad.model == kontext ? "/k.jsonl"
                                                        : "/q.jsonl";
        LaunchResult r = run_launch({"--model", bad.model, "-o", dir + "/out", "-q", dir + file});
        CHECK(r.exit_code == 65);
        CHECK_MESSAGE(r.err.find(bad.says) != std::string::npos, r.err);
        CHECK_FALSE(file_exists(dir + "/out/manifest.jsonl"));
    }
    // The flags: a missing --image (66), --strength 0 (2), a glob with a prompt file (2), a glob that
    // matches nothing (66).
    std::ofstream(dir + "/p.txt") << "one\n";
    CHECK(run_launch(tiny(dir + "/out", {"--image", dir + "/none.png", dir + "/p.txt"})).exit_code == 66);
    LaunchResult zero = run_launch(tiny(dir + "/out", {"--image", good, "--strength", "0", dir + "/p.txt"}));
    CHECK(zero.exit_code == 2);
    CHECK(zero.err.find("--strength '0': expected a number above 0 to 1") != std::string::npos);
    LaunchResult glob = run_launch(tiny(dir + "/out", {"--image", dir + "/*.png", dir + "/p.txt"}));
    CHECK(glob.exit_code == 2);
    CHECK(glob.err.find("goes with --prompt TEXT") != std::string::npos);
    CHECK(run_launch(tiny(dir + "/out", {"--prompt", "x", "--image", dir + "/*.gif"})).exit_code == 66);
    CHECK_FALSE(file_exists(dir + "/out"));
    remove_dir(dir);
}
