// Single files in the worker: a tiny FLUX.1-dev pipeline whose transformer comes from one file in
// Black Forest Labs' original layout (bf16, fp8, ComfyUI's scaled fp8), the rest from its diffusers
// folder, gives the images diffusers gives with FluxTransformer2DModel.from_single_file
// (scripts/golden/golden_single_file.py; the scaled file's reference is its dequantized weights),
// and the single-process image under tp2 (fused rows narrowed to each rank's share) and ulysses2.
#include "unit/doctest_torch.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "runtime/io/tensor_io.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/pipeline.h"
#include "strategies/mesh.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;

namespace {

std::shared_ptr<SafetensorsFile> golden() { return SafetensorsFile::open(golden_path("single_file_pipeline.safetensors")); }

nlohmann::json cases() { return nlohmann::json::parse(golden()->metadata().at("cases")); }

std::string root_path(const std::string& relative) { return std::string(DP_GOLDEN_DIR) + "/../../../" + relative; }

GenerateRequest request_of(const nlohmann::json& c) {
    GenerateRequest r;
    r.prompt = c.at("prompt").get<std::string>();
    r.seed = c.at("seed").get<uint64_t>();
    r.steps = c.at("steps").get<int>();
    r.width = c.at("width").get<int>();
    r.height = c.at("height").get<int>();
    r.arguments.set("guidance_scale", c.at("guidance_scale").get<double>());
    r.arguments.set("max_sequence_length", int64_t{c.at("max_sequence_length").get<int>()});
    return r;
}

PipelineOptions options_for(const nlohmann::json& c) {
    PipelineOptions o;
    o.model_dir = std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev";
    if (c.contains("file")) o.component_files["transformer"] = root_path(c.at("file").get<std::string>());
    return o;
}

}  // namespace

TEST_CASE("a FLUX.1 transformer from one file in Black Forest Labs' layout gives diffusers' from_single_file image") {
    const auto file = golden();
    const nlohmann::json all = cases();
    int checked = 0;
    for (const std::string name : {"bfl_bf16", "bfl_fp8", "bfl_scaled_fp8"}) {
        CAPTURE(name);
        const nlohmann::json& c = all.at(name);
        const GenerateResult out = load_pipeline(options_for(c), ParallelContext::single())->generate(request_of(c));
        REQUIRE(out.error.empty());
        const at::Tensor ref = load_tensor(file, name + ".latents", at::kFloat);
        const at::Tensor folder = load_tensor(file, "folder.latents", at::kFloat);
        const double diff = (out.latents.reshape(ref.sizes()) - ref).abs().max().item<double>();
        const double effect = (folder - ref).abs().max().item<double>();
        MESSAGE(name << ": max |latent diff| " << diff << " against diffusers; the stored precision moves them by "
                     << effect);
        CHECK(effect > 1e-3);  // the file's rounding shows: the weights came from it, not the folder
        CHECK(diff <= 1e-4);
        const at::Tensor ref_image = load_tensor(file, name + ".image", at::kByte);
        const at::Tensor d = (out.image.to(at::kInt) - ref_image.to(at::kInt)).abs();
        CHECK(d.le(1).to(at::kDouble).mean().item<double>() >= 0.999);
        ++checked;
    }
    CHECK(checked == 3);
}

TEST_CASE("a transformer from one file gives the single-process image under tp2 and ulysses2") {
    const nlohmann::json all = cases();
    for (const std::string name : {"bfl_bf16", "bfl_scaled_fp8"}) {
        CAPTURE(name);
        const nlohmann::json& c = all.at(name);
        const GenerateRequest request = request_of(c);
        const at::Tensor alone = load_pipeline(options_for(c), ParallelContext::single())->generate(request).latents;
        std::vector<dp::strategies::MeshDegrees> layouts(2);
        layouts[0].tp = 2;
        layouts[1].ulysses = 2;
        for (const dp::strategies::MeshDegrees& degrees : layouts) {
            CAPTURE(degrees.tp);
            CAPTURE(degrees.ulysses);
            std::vector<at::Tensor> out(2);
            dp::test::run_ranks(2, [&](int rank, Communicator& group) {
                const ParallelContext parallel(group, dp::strategies::Mesh(2, degrees));
                out[static_cast<std::size_t>(rank)] = load_pipeline(options_for(c), parallel)->generate(request).latents;
            });
            for (const at::Tensor& t : out) CHECK((t - alone).abs().max().item<double>() <= 1e-5);
        }
    }
}
