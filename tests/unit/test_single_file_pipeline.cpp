// Single files in the worker: a tiny FLUX.1-dev pipeline whose transformer comes from one file in
// Black Forest Labs' original layout (bf16, fp8, ComfyUI's scaled fp8), the rest from its diffusers
// folder, gives the images diffusers gives with FluxTransformer2DModel.from_single_file
// (scripts/golden/golden_single_file.py; the scaled file's reference is its dequantized weights),
// and the single-process image under tp2 (fused rows narrowed to each rank's share) and ulysses2;
// the same for the tiny Z-Image's transformer in ComfyUI's layout (scripts/golden/golden_z_image_files.py:
// fused qkv, prefixed or not) and its Q8_0 GGUF (arch lumina2).
// GGUF files (scripts/golden/golden_gguf.py): every type's blocks dequantize to gguf-py's values to
// the bit, and Q8_0, Q4_K and Q6_K transformers give the exact dequantization's image (diffusers
// dequantizes in fp16, so its latents differ by up to 2e-3: checked within that, and its image
// within one level), and the Q4_K file the single-process image under tp2.
#include "unit/doctest_torch.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "runtime/io/gguf_quants.h"
#include "runtime/io/tensor_io.h"
#include "runtime/io/weights.h"
#include "runtime/models/flux/flux_transformer.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/pipeline.h"
#include "strategies/family.h"
#include "strategies/mesh.h"
#include "strategies/single_file.h"
#include "support/test_paths.h"
#include "unit/golden_request.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;

namespace {

std::shared_ptr<SafetensorsFile> golden() {
    return SafetensorsFile::open(golden_path("single_file_pipeline.safetensors"));
}

std::shared_ptr<SafetensorsFile> z_image_golden() {
    return SafetensorsFile::open(golden_path("z_image_files.safetensors"));
}

GenerateRequest request_of(const nlohmann::json& c) { return dp::test::golden_request(c); }

// The case's folder (its "folder", else the tiny FLUX.1-dev's) with its transformer from its file.
PipelineOptions options_for(const nlohmann::json& c) {
    PipelineOptions o;
    o.model_dir = c.contains("folder") ? dp::test::repository_path(c.at("folder").get<std::string>())
                                       : std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev";
    if (c.contains("file"))
        o.component_files["transformer"] = dp::test::repository_path(c.at("file").get<std::string>());
    return o;
}

// The single-process pipeline's result for golden case `c`, which must not fail.
GenerateResult generate_alone(const nlohmann::json& c) {
    GenerateResult out = load_pipeline(options_for(c), ParallelContext::single())->generate(request_of(c));
    REQUIRE(out.error.empty());
    return out;
}

// Case `c`'s `request` on two ranks under `degrees`: each rank's latents are `alone`'s within
// `tolerance` (the order of a sum's terms differs between the layouts).
void check_on_two_ranks(const nlohmann::json& c, const GenerateRequest& request, const at::Tensor& alone,
                        const dp::strategies::MeshDegrees& degrees, double tolerance = 1e-5) {
    std::vector<at::Tensor> out(2);
    dp::test::run_ranks(2, [&](int rank, Communicator& group) {
        const ParallelContext parallel(group, dp::strategies::Mesh(2, degrees));
        out[static_cast<std::size_t>(rank)] =
            load_pipeline(options_for(c), parallel)->generate(request).latents;
    });
    for (const at::Tensor& t : out) CHECK((t - alone).abs().max().item<double>() <= tolerance);
}

}  // namespace

TEST_CASE(
    "a transformer from one file in its original layout gives diffusers' from_single_file image: FLUX.1 in "
    "Black Forest Labs', Z-Image in ComfyUI's (prefixed or not), bf16, fp8 and scaled fp8") {
    int checked = 0;
    for (const auto& [file, names] :
         {std::pair{golden(), std::vector<std::string>{"bfl_bf16", "bfl_fp8", "bfl_scaled_fp8"}},
          std::pair{z_image_golden(),
                    std::vector<std::string>{"comfy_bf16", "comfy_fp8", "comfy_scaled_fp8"}}})
        for (const std::string& name : names) {
            const nlohmann::json all = dp::test::golden_cases(file);
            CAPTURE(name);
            const GenerateResult out = generate_alone(all.at(name));
            const at::Tensor ref = load_tensor(file, name + ".latents", at::kFloat);
            const at::Tensor folder = load_tensor(file, "folder.latents", at::kFloat);
            const double diff = (out.latents.reshape(ref.sizes()) - ref).abs().max().item<double>();
            const double effect = (folder - ref).abs().max().item<double>();
            MESSAGE(name << ": max |latent diff| " << diff
                         << " against diffusers; the stored precision moves them by " << effect);
            CHECK(effect > 1e-3);  // the file's rounding shows: the weights came from it, not the folder
            CHECK(diff <= 1e-4);
            const at::Tensor ref_image = load_tensor(file, name + ".image", at::kByte);
            const at::Tensor d = (out.image.to(at::kInt) - ref_image.to(at::kInt)).abs();
            CHECK(d.le(1).to(at::kDouble).mean().item<double>() >= 0.999);
            ++checked;
        }
    CHECK(checked == 6);
}

TEST_CASE("a transformer from one file gives the single-process image under tp2 and ulysses2") {
    const nlohmann::json all = dp::test::golden_cases(golden());
    for (const std::string name : {"bfl_bf16", "bfl_scaled_fp8"}) {
        CAPTURE(name);
        const nlohmann::json& c = all.at(name);
        const GenerateRequest request = request_of(c);
        const at::Tensor alone =
            load_pipeline(options_for(c), ParallelContext::single())->generate(request).latents;
        std::vector<dp::strategies::MeshDegrees> layouts(2);
        layouts[0].tp = 2;
        layouts[1].ulysses = 2;
        for (const dp::strategies::MeshDegrees& degrees : layouts) {
            CAPTURE(degrees.tp);
            CAPTURE(degrees.ulysses);
            check_on_two_ranks(c, request, alone, degrees);
        }
    }
}

TEST_CASE("GGUF blocks of every type dequantize to the values gguf-py gives, to the bit") {
    const auto file = SafetensorsFile::open(golden_path("gguf_quants.safetensors"));
    const nlohmann::json all = dp::test::golden_cases(file);
    int checked = 0;
    for (const auto& [name, c] : all.items()) {
        CAPTURE(name);
        const dp::strategies::GgmlType* type = dp::strategies::ggml_type(c.at("type_id").get<uint32_t>());
        REQUIRE(type != nullptr);
        CHECK(type->name == name);
        const at::Tensor blocks = load_tensor(file, name + ".blocks", at::kByte).contiguous();
        const at::Tensor values = load_tensor(file, name + ".values", at::kFloat).reshape({-1});
        REQUIRE(blocks.numel() % type->block_bytes == 0);
        const int64_t n = blocks.numel() / type->block_bytes * type->block_elements;
        REQUIRE(values.numel() == n);
        at::Tensor out = at::empty({n}, at::kFloat);
        dequantize_rows(*type, reinterpret_cast<const std::byte*>(blocks.data_ptr<uint8_t>()), 1, n,
                        out.data_ptr<float>());
        CHECK(at::equal(out, values));
        ++checked;
    }
    CHECK(checked == 12);
}

TEST_CASE(
    "a transformer from GGUF files gives ggml's exact image, and diffusers' within its fp16: FLUX.1 (Q8_0, "
    "Q4_K, Q6_K), Z-Image (Q8_0, arch lumina2)") {
    for (const auto& [file, names] :
         {std::pair{SafetensorsFile::open(golden_path("gguf_pipeline.safetensors")),
                    std::vector<std::string>{"q8_0", "q4_k", "q6_k"}},
          std::pair{z_image_golden(), std::vector<std::string>{"q8_0"}}})
        for (const std::string& name : names) {
            const nlohmann::json all = dp::test::golden_cases(file);
            CAPTURE(name);
            const GenerateResult out = generate_alone(all.at(name));
            const at::Tensor exact = load_tensor(file, name + "_exact.latents", at::kFloat);
            const at::Tensor diffusers = load_tensor(file, name + ".latents", at::kFloat);
            const at::Tensor mine = out.latents.reshape(exact.sizes());
            const double to_exact = max_diff(mine, exact);
            const double to_diffusers = max_diff(mine, diffusers);
            MESSAGE(name << ": max |latent diff| " << to_exact << " against the exact dequantization, "
                         << to_diffusers << " against diffusers (which dequantizes in fp16)");
            CHECK(to_exact <= 1e-4);
            CHECK(to_diffusers <= 3e-3);
            const at::Tensor ref_image = load_tensor(file, name + ".image", at::kByte);
            CHECK((out.image.to(at::kInt) - ref_image.to(at::kInt)).abs().le(1).all().item<bool>());
        }
}

TEST_CASE(
    "a GGUF Q4_K transformer gives the single-process image under tp2, fp8 under ulysses2, and Z-Image's "
    "fused qkv from fp8 under tp2") {
    const auto gguf = SafetensorsFile::open(golden_path("gguf_pipeline.safetensors"));
    const nlohmann::json q4 = dp::test::golden_cases(gguf).at("q4_k");
    const nlohmann::json fp8 = dp::test::golden_cases(golden()).at("bfl_fp8");
    // Z-Image's fused qkv, narrowed to each rank's share; its latents reach 4.2 (the tiny FLUX.1's
    // 2): 1.4e-5 measured is the same relative error.
    const nlohmann::json z_image = dp::test::golden_cases(z_image_golden()).at("comfy_fp8");
    dp::strategies::MeshDegrees tp2;
    tp2.tp = 2;
    check_on_two_ranks(
        z_image, request_of(z_image),
        load_pipeline(options_for(z_image), ParallelContext::single())->generate(request_of(z_image)).latents,
        tp2, 2e-5);
    for (const auto& [c, degrees] :
         {std::pair<nlohmann::json, dp::strategies::MeshDegrees>{q4,
                                                                 [] {
                                                                     dp::strategies::MeshDegrees d;
                                                                     d.tp = 2;
                                                                     return d;
                                                                 }()},
          {fp8, [] {
               dp::strategies::MeshDegrees d;
               d.ulysses = 2;
               return d;
           }()}}) {
        CAPTURE(c.at("file").get<std::string>());
        const GenerateRequest request = request_of(c);
        const at::Tensor alone =
            load_pipeline(options_for(c), ParallelContext::single())->generate(request).latents;
        check_on_two_ranks(c, request, alone, degrees);
    }
}

TEST_CASE(
    "GGUF weights kept quantized: the image of the weights dequantized at load, to the bit, in a fraction of "
    "the memory") {
    const auto gguf = SafetensorsFile::open(golden_path("gguf_pipeline.safetensors"));
    const nlohmann::json q4 = dp::test::golden_cases(gguf).at("q4_k");
    // The transformer alone: what it holds, both ways.
    const std::string path = dp::test::repository_path(q4.at("file").get<std::string>());
    const std::string folder = std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev";
    const FluxTransformerConfig config =
        FluxTransformerConfig::from_json_file(folder + "/transformer/config.json");
    const auto file = dp::strategies::GgufFile::open(path);
    const auto layout =
        dp::strategies::read_single_file_layout(*file, dp::strategies::family_spec("flux"), "transformer");
    REQUIRE(layout.quantized_bytes > 0);
    int64_t bytes[2] = {0, 0};
    for (const bool keep : {false, true}) {
        WeightStore w = WeightStore::open_single_file(file, layout, at::kFloat, at::kCPU, keep);
        bytes[keep] = FluxTransformer(config, w).parameter_bytes();
        w.check_all_taken();
    }
    MESSAGE("tiny FLUX.1 transformer from Q4_K: " << bytes[0] << " bytes dequantized at load, " << bytes[1]
                                                  << " kept quantized");
    CHECK(bytes[1] * 3 < bytes[0]);  // Q4_K is 4.5 bits a weight against fp32's 32, less what stays F32
    // The pipeline: the same latents, to the bit, alone and under tp2 (each rank's rows of blocks).
    const GenerateRequest request = request_of(q4);
    PipelineOptions load_time = options_for(q4), kept = options_for(q4);
    kept.keep_quantized = true;
    const at::Tensor reference =
        load_pipeline(load_time, ParallelContext::single())->generate(request).latents;
    const GenerateResult alone = load_pipeline(kept, ParallelContext::single())->generate(request);
    REQUIRE(alone.error.empty());
    CHECK(at::equal(alone.latents, reference));
    dp::strategies::MeshDegrees degrees;
    degrees.tp = 2;
    std::vector<at::Tensor> out(2), dense(2);
    dp::test::run_ranks(2, [&](int rank, Communicator& group) {
        const ParallelContext parallel(group, dp::strategies::Mesh(2, degrees));
        out[static_cast<std::size_t>(rank)] = load_pipeline(kept, parallel)->generate(request).latents;
        dense[static_cast<std::size_t>(rank)] = load_pipeline(load_time, parallel)->generate(request).latents;
    });
    for (std::size_t r = 0; r < 2; ++r) CHECK(at::equal(out[r], dense[r]));
}

namespace {

// A case of sd3_single_file_pipeline / qwen_single_file_pipeline (scripts/golden/golden_sd3_single_file.py):
// its call, its folder, and the components its file gives.
PipelineOptions file_options(const nlohmann::json& c, const std::vector<std::string>& components) {
    PipelineOptions o;
    o.model_dir = dp::test::repository_path(c.at("folder").get<std::string>());
    for (const std::string& component : components)
        o.component_files[component] = dp::test::repository_path(c.at("file").get<std::string>());
    return o;
}

void check_against(const GenerateResult& out, const std::shared_ptr<SafetensorsFile>& file,
                   const std::string& name, const std::string& folder_case) {
    REQUIRE(out.error.empty());
    const at::Tensor ref = load_tensor(file, name + ".latents", at::kFloat);
    const at::Tensor folder = load_tensor(file, folder_case + ".latents", at::kFloat);
    const double diff = (out.latents.reshape(ref.sizes()) - ref).abs().max().item<double>();
    const double effect = (folder - ref).abs().max().item<double>();
    MESSAGE(name << ": max |latent diff| " << diff << " against diffusers; the file's bf16 moves them by "
                 << effect);
    CHECK(effect > 1e-3);  // the weights came from the file, not the folder
    CHECK(diff <= 1e-4);
    const at::Tensor ref_image = load_tensor(file, name + ".image", at::kByte);
    CHECK(
        (out.image.to(at::kInt) - ref_image.to(at::kInt)).abs().le(1).to(at::kDouble).mean().item<double>() >=
        0.999);
}

}  // namespace

TEST_CASE(
    "SD3.5 in Stability AI's layout, the transformer alone and the whole pipeline in one file, gives "
    "diffusers' from_single_file image") {
    const auto file = SafetensorsFile::open(golden_path("sd3_single_file_pipeline.safetensors"));
    const nlohmann::json all = dp::test::golden_cases(file);
    const nlohmann::json& alone = all.at("stability");
    check_against(load_pipeline(file_options(alone, {"transformer"}), ParallelContext::single())
                      ->generate(dp::test::golden_request(alone)),
                  file, "stability", "folder");
    // Every component from the one file: CLIP-L's projection the identity, as diffusers makes it.
    const nlohmann::json& whole = all.at("stability_all");
    const std::vector<std::string> components = dp::strategies::bundled_components(
        dp::test::repository_path(whole.at("file").get<std::string>()), dp::strategies::family_spec("sd3"));
    CHECK(components.size() == 5);
    check_against(load_pipeline(file_options(whole, components), ParallelContext::single())
                      ->generate(dp::test::golden_request(whole)),
                  file, "stability_all", "folder");
}

TEST_CASE(
    "a Qwen-Image transformer from one file (ComfyUI's split files) gives diffusers' from_single_file image "
    "with true CFG, and fits Qwen-Image-Edit-Plus's folder") {
    const auto file = SafetensorsFile::open(golden_path("qwen_single_file_pipeline.safetensors"));
    const nlohmann::json c = dp::test::golden_cases(file).at("qwen_bf16");
    check_against(load_pipeline(file_options(c, {"transformer"}), ParallelContext::single())
                      ->generate(dp::test::golden_request(c)),
                  file, "qwen_bf16", "qwen_folder");
    // The same file fits Qwen-Image-Edit-Plus (FamilyFacts::names_as): its weights, not the folder's.
    const auto edits = SafetensorsFile::open(golden_path("qwen_edit.safetensors"));
    const nlohmann::json edit = dp::test::golden_cases(edits).at("plus_two_plain");
    PipelineOptions o = file_options(edit, {});
    o.component_files["transformer"] = dp::test::repository_path(c.at("file").get<std::string>());
    const GenerateResult out =
        load_pipeline(o, ParallelContext::single())->generate(dp::test::golden_request(edit));
    REQUIRE(out.error.empty());
    const at::Tensor folder = load_tensor(edits, "plus_two_plain.latents", at::kFloat);
    const double moved = (out.latents.reshape(folder.sizes()) - folder).abs().max().item<double>();
    MESSAGE("Qwen-Image-Edit-Plus with the bf16 file: max |latent diff| " << moved << " from the folder's");
    CHECK(moved > 1e-3);
    CHECK(moved < 1.0);
}
