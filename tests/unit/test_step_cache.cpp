// The first-block step cache (runtime/pipeline/step_cache.h, Note [first block cache]) against
// diffusers' FirstBlockCache (scripts/golden/golden_step_cache.py): FLUX.1-dev and Qwen-Image with
// true CFG (a state per branch) give diffusers' cached latents, compare the same relative changes
// with the threshold and compute the same passes in full; the single-process cached latents come
// back under ulysses2 and ring2 with uneven shards, tp2 and cfg2 (Z-Image's too, which diffusers
// does not cache); SD3, which diffusers does not
// cache, computes every pass at threshold 0 and only each branch's first one at a huge threshold.
// MagCache (Note [mag cache]) against diffusers' MagCache (scripts/golden/golden_mag_cache.py): the
// same passes, latents and calibrated ratios, alike under every strategy. The samplers of Note [one
// scheduler table] under the same strategies (Heun and DPM-Solver++), and the caches counting
// Heun's two passes a step.
#include "unit/doctest_torch.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "runtime/io/tensor_io.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/pipeline.h"
#include "strategies/mesh.h"
#include "support/test_paths.h"
#include "unit/golden_request.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;

namespace {

std::shared_ptr<SafetensorsFile> golden() {
    return SafetensorsFile::open(golden_path("step_cache_pipeline.safetensors"));
}
nlohmann::json cases() { return nlohmann::json::parse(golden()->metadata().at("cases")); }
std::shared_ptr<SafetensorsFile> mag_golden() {
    return SafetensorsFile::open(golden_path("mag_cache_pipeline.safetensors"));
}
nlohmann::json mag_cases() { return nlohmann::json::parse(mag_golden()->metadata().at("cases")); }
// The case's call with its cache.
GenerateRequest request_of(const nlohmann::json& c) {
    GenerateRequest r = dp::test::golden_request(c);
    if (!c.at("cache").is_null()) {  // as a prompt line's "cache" object
        dp::protocol::CallValue cache;
        REQUIRE(
            dp::protocol::read_call_value(*dp::protocol::find_call_argument("cache"), c.at("cache"), cache)
                .empty());
        r.arguments.set("cache", cache);
    }
    return r;
}

PipelineOptions options_of(const nlohmann::json& c) {
    PipelineOptions o;
    o.model_dir = dp::test::repository_path(c.at("folder").get<std::string>());
    return o;
}

dp::strategies::MeshDegrees degrees(int ulysses, int ring, int tp, int cfg) {
    dp::strategies::MeshDegrees d;
    d.ulysses = ulysses, d.ring = ring, d.tp = tp, d.cfg = cfg;
    return d;
}

// The latents of `request` on two ranks as `d` places them (rank 0's).
std::vector<GenerateResult> on_two_ranks(const PipelineOptions& o, const GenerateRequest& request,
                                         const dp::strategies::MeshDegrees& d) {
    std::vector<GenerateResult> out(2);
    dp::test::run_ranks(2, [&](int rank, Communicator& group) {
        const ParallelContext parallel(group, dp::strategies::Mesh(2, d));
        out[static_cast<std::size_t>(rank)] = load_pipeline(o, parallel)->generate(request);
    });
    return out;
}

// SD3 (no cache in diffusers): its two branches batched in one call, six steps.
PipelineOptions sd3_options() {
    PipelineOptions o;
    o.model_dir = std::string(DP_MODELS_DIR) + "/tiny-random-sd3";
    return o;
}
GenerateRequest sd3_request() {
    GenerateRequest r;
    r.prompt = "a lighthouse at dusk";
    r.seed = 5;
    r.steps = 6;
    r.width = r.height = 32;
    return r;
}

}  // namespace

TEST_CASE("the first-block cache gives diffusers' cached images, deciding as its FirstBlockCache decides") {
    const auto file = golden();
    const nlohmann::json all = cases();
    for (const std::string name : {"flux", "qwen"}) {
        CAPTURE(name);
        const nlohmann::json& c = all.at(name + "_cached");
        const GenerateResult out =
            load_pipeline(options_of(c), ParallelContext::single())->generate(request_of(c));
        REQUIRE(out.error.empty());
        const at::Tensor ref = load_tensor(file, name + "_cached.latents", at::kFloat);
        const at::Tensor uncached = load_tensor(file, name + "_uncached.latents", at::kFloat);
        const double diff = (out.latents.reshape(ref.sizes()) - ref).abs().max().item<double>();
        const double effect = (uncached - ref).abs().max().item<double>();
        MESSAGE(name << ": max |latent diff| " << diff
                     << " against diffusers' cached run; the cache moves them by " << effect);
        CHECK(diff <= 1e-4);
        CHECK(effect > 1e-2);  // the cache skipped passes: without it the latents are others
        CHECK(out.computed_steps == c.at("computed_steps").get<int64_t>());
        // Each branch compares what diffusers compares: cond is the positive branch, uncond the negative.
        REQUIRE(out.cache_metrics.size() == 2);
        for (const auto& [context, branch] : {std::pair<std::string, int>{"cond", 1}, {"uncond", 0}}) {
            if (!c.at("metrics").contains(context)) {
                CHECK(out.cache_metrics[static_cast<std::size_t>(branch)].empty());
                continue;
            }
            const nlohmann::json& theirs = c.at("metrics").at(context);
            const std::vector<double>& mine = out.cache_metrics[static_cast<std::size_t>(branch)];
            REQUIRE(mine.size() == theirs.size());
            for (std::size_t s = 0; s < mine.size(); ++s) {
                CAPTURE(s);
                if (theirs[s].is_null()) {
                    CHECK(mine[s] == -1);
                } else {
                    CHECK(mine[s] == doctest::Approx(theirs[s].get<double>()).epsilon(1e-4));
                }
            }
        }
        const at::Tensor ref_image = load_tensor(file, name + "_cached.image", at::kByte);
        CHECK((out.image.to(at::kInt) - ref_image.to(at::kInt))
                  .abs()
                  .le(1)
                  .to(at::kDouble)
                  .mean()
                  .item<double>() >= 0.999);
    }
}

TEST_CASE(
    "the first-block cache decides as one process does under ulysses2 and ring2 (uneven shards), tp2 and "
    "cfg2: FLUX.1, Qwen-Image, Z-Image, FLUX.2-klein") {
    const nlohmann::json all = cases();
    // FLUX at 48x48: 9 image tokens, over two ranks 5 and 4 (the text's too are split).
    nlohmann::json flux = all.at("flux_cached");
    flux["width"] = 48, flux["height"] = 48;
    const GenerateRequest request = request_of(flux);
    const GenerateResult alone =
        load_pipeline(options_of(flux), ParallelContext::single())->generate(request);
    MESSAGE("FLUX 48x48: " << alone.computed_steps << " of 8 passes computed in full");
    CHECK(alone.computed_steps > 1);
    CHECK(alone.computed_steps < 8);
    for (const dp::strategies::MeshDegrees& d :
         {degrees(2, 1, 1, 1), degrees(1, 2, 1, 1), degrees(1, 1, 2, 1)}) {
        CAPTURE(d.ulysses);
        CAPTURE(d.ring);
        CAPTURE(d.tp);
        for (const GenerateResult& r : on_two_ranks(options_of(flux), request, d)) {
            CHECK(r.computed_steps == alone.computed_steps);
            CHECK((r.latents - alone.latents).abs().max().item<double>() <= 1e-5);
        }
    }
    // The shared block runner's cache over a family diffusers does not cache: some passes reused,
    // and the same ones under ulysses2, ring2 and tp2 (unguided), cfg2 (guided at `scale`).
    dp::protocol::CallValue cache;
    REQUIRE(dp::protocol::read_call_value(*dp::protocol::find_call_argument("cache"),
                                          "first_block_cache:threshold=0.9", cache)
                .empty());
    // `tp_within`: tp2's bound (its row-parallel sums add in another order).
    const auto over_ranks = [&](const std::string& what, const PipelineOptions& options, GenerateRequest r,
                                const PipelineOptions& guided_options, const char* scale, double tp_within) {
        r.arguments.set("cache", cache);
        const GenerateResult one = load_pipeline(options, ParallelContext::single())->generate(r);
        MESSAGE(what << ": " << one.computed_steps << " of 8 passes computed in full");
        CHECK(one.computed_steps > 1);
        CHECK(one.computed_steps < 8);
        for (const dp::strategies::MeshDegrees& d :
             {degrees(2, 1, 1, 1), degrees(1, 2, 1, 1), degrees(1, 1, 2, 1)})
            for (const GenerateResult& out : on_two_ranks(options, r, d)) {
                CAPTURE(what);
                CAPTURE(d.ulysses);
                CAPTURE(d.ring);
                CAPTURE(d.tp);
                CHECK(out.computed_steps == one.computed_steps);
                const double diff = (out.latents - one.latents).abs().max().item<double>();
                MESSAGE(what << ", ulysses " << d.ulysses << " ring " << d.ring << " tp " << d.tp
                             << ": max |latent diff| " << diff);
                CHECK(diff <= (d.tp > 1 ? tp_within : 1e-5));
            }
        r.arguments.set(scale, 4.0);
        const GenerateResult guided = load_pipeline(guided_options, ParallelContext::single())->generate(r);
        for (const GenerateResult& out : on_two_ranks(guided_options, r, degrees(1, 1, 1, 2))) {
            CHECK(out.computed_steps == guided.computed_steps);
            CHECK((out.latents - guided.latents).abs().max().item<double>() <= 1e-5);
        }
    };
    // Z-Image's one stream, unguided at 48x32 (6 image tokens, 32 with their pads).
    PipelineOptions z_image;
    z_image.model_dir = std::string(DP_MODELS_DIR) + "/tiny-random-z-image";
    const GenerateRequest z = dp::test::golden_request({{"prompt", "a lighthouse"},
                                                        {"seed", 3},
                                                        {"steps", 8},
                                                        {"width", 48},
                                                        {"height", 32},
                                                        {"guidance_scale", 0.0}});
    over_ranks("Z-Image 48x32", z_image, z, z_image, "guidance_scale", 1e-5);
    // Note [steps without guidance]: with cfg_truncation 0.2 the last 2 of 4 steps take the positive
    // prediction alone; one process runs only its rows then (threshold 0: every pass counted), two
    // ranks of a cfg group each their own branch, to the same latents.
    GenerateRequest truncated = z;
    truncated.steps = 4;
    truncated.arguments.set("guidance_scale", 4.0);
    truncated.arguments.set("cfg_truncation", 0.2);
    dp::protocol::CallValue every_pass;
    REQUIRE(dp::protocol::read_call_value(*dp::protocol::find_call_argument("cache"),
                                          "first_block_cache:threshold=0", every_pass)
                .empty());
    truncated.arguments.set("cache", every_pass);
    const GenerateResult fewer = load_pipeline(z_image, ParallelContext::single())->generate(truncated);
    CHECK(fewer.computed_steps == 2 * 2 + 2);
    for (const GenerateResult& r : on_two_ranks(z_image, truncated, degrees(1, 1, 1, 2))) {
        CHECK(r.computed_steps == 2 * 4);
        CHECK((r.latents - fewer.latents).abs().max().item<double>() <= 1e-5);
    }
    // FLUX.2 klein at 24x40 (15 noise tokens) with a reference picture (12 more), its text
    // encoder split under tp2; its -base folder guided. Every one of the 512 text tokens goes on,
    // the pads too: the golden folder's pad embedding is of its words' size, so tp's other
    // summation order moves them no more than the words.
    PipelineOptions klein, klein_base;
    klein.model_dir = std::string(DP_MODELS_DIR) + "/tiny-random-flux2-klein";
    klein_base.model_dir = klein.model_dir + "-base";
    over_ranks("FLUX.2-klein 24x40 with a reference", klein,
               dp::test::golden_request({{"prompt", "a lighthouse"},
                                         {"seed", 3},
                                         {"steps", 8},
                                         {"width", 24},
                                         {"height", 40},
                                         {"images", {"tests/data/golden/flux2/ref_96x72.png"}}}),
               klein_base, "guidance_scale", 1e-5);
    // Qwen-Image's two branches on two ranks, each with its own state; the count is both branches'.
    const nlohmann::json& qwen = all.at("qwen_cached");
    const GenerateRequest guided = request_of(qwen);
    const GenerateResult both = load_pipeline(options_of(qwen), ParallelContext::single())->generate(guided);
    for (const GenerateResult& r : on_two_ranks(options_of(qwen), guided, degrees(1, 1, 1, 2))) {
        CHECK(r.computed_steps == both.computed_steps);
        CHECK((r.latents - both.latents).abs().max().item<double>() <= 1e-5);
    }
}

TEST_CASE("SD3, which diffusers does not cache, runs the first-block cache over its batched branches") {
    const PipelineOptions o = sd3_options();
    GenerateRequest r = sd3_request();
    const auto pipeline = load_pipeline(o, ParallelContext::single());
    const GenerateResult plain = pipeline->generate(r);
    CHECK(plain.computed_steps == -1);
    dp::protocol::StepCache cache;
    cache.type = "first_block_cache";
    cache.threshold = 0;  // every change is above it: every pass computed, the same latents
    r.arguments.set("cache", cache);
    const GenerateResult every = pipeline->generate(r);
    CHECK(every.computed_steps == 12);  // six steps, two branches
    CHECK(at::equal(every.latents, plain.latents));
    cache.threshold = 10;  // no change is above it: each branch computes its first pass only
    r.arguments.set("cache", cache);
    const GenerateResult first = pipeline->generate(r);
    CHECK(first.computed_steps == 2);
    CHECK((first.latents - plain.latents).abs().max().item<double>() > 1e-3);
    // Under cfg2 each rank caches its branch; the count is both branches'.
    for (const GenerateResult& out : on_two_ranks(o, r, degrees(1, 1, 1, 2))) {
        CHECK(out.computed_steps == 2);
        CHECK((out.latents - first.latents).abs().max().item<double>() <= 1e-5);
    }
}

TEST_CASE("TaylorSeer gives diffusers' cached images, each branch with its own factors") {
    const auto file = golden();
    const nlohmann::json all = cases();
    for (const std::string name : {"flux", "qwen"}) {
        for (const std::string factors : {"_float32", ""}) {
            const std::string key = name + "_taylorseer" + factors;
            CAPTURE(key);
            const nlohmann::json& c = all.at(key);
            const GenerateRequest request = request_of(c);
            REQUIRE(request.arguments.cache("cache").taylorseer());
            const GenerateResult out =
                load_pipeline(options_of(c), ParallelContext::single())->generate(request);
            REQUIRE(out.error.empty());
            const at::Tensor ref = load_tensor(file, key + ".latents", at::kFloat);
            const at::Tensor uncached = load_tensor(file, name + "_uncached.latents", at::kFloat);
            const double diff = (out.latents.reshape(ref.sizes()) - ref).abs().max().item<double>();
            const double effect = (uncached - ref).abs().max().item<double>();
            const double scale = ref.abs().max().item<double>();
            MESSAGE(key << ": max |latent diff| " << diff << " against diffusers (latents up to " << scale
                        << "); the cache moves them by " << effect);
            CHECK(effect > 1e-2);
            CHECK(out.computed_steps == c.at("computed_steps").get<int64_t>());
            if (factors == "_float32") {
                CHECK(diff <= 1e-4);  // the kernels' own rounding, as without a cache
            } else {
                // The factors are kept in bfloat16, as diffusers keeps them by default: an attention
                // output that differs by its kernels' rounding can round to the neighbouring bfloat16
                // (2^-8 relative), and the extrapolations carry that. Within a thousandth of the
                // latents' scale, and the image within one level.
                CHECK(diff <= 1e-3 * scale);
            }
            const at::Tensor ref_image = load_tensor(file, key + ".image", at::kByte);
            CHECK((out.image.to(at::kInt) - ref_image.to(at::kInt))
                      .abs()
                      .le(1)
                      .to(at::kDouble)
                      .mean()
                      .item<double>() >= 0.999);
        }
    }
    // The schedule alone decides, so every strategy extrapolates the same passes: ulysses2 and ring2
    // with uneven shards, tp2 and cfg2 give the single-process latents (float32 factors: no rounding
    // to the neighbouring bfloat16 to amplify the strategies' own).
    nlohmann::json flux = all.at("flux_taylorseer_float32");
    flux["width"] = 48, flux["height"] = 48;
    const GenerateResult alone =
        load_pipeline(options_of(flux), ParallelContext::single())->generate(request_of(flux));
    for (const dp::strategies::MeshDegrees& d :
         {degrees(2, 1, 1, 1), degrees(1, 2, 1, 1), degrees(1, 1, 2, 1)})
        for (const GenerateResult& r : on_two_ranks(options_of(flux), request_of(flux), d)) {
            CHECK(r.computed_steps == alone.computed_steps);
            CHECK((r.latents - alone.latents).abs().max().item<double>() <= 1e-5);
        }
    const nlohmann::json& qwen = all.at("qwen_taylorseer_float32");
    const GenerateResult both =
        load_pipeline(options_of(qwen), ParallelContext::single())->generate(request_of(qwen));
    for (const GenerateResult& r : on_two_ranks(options_of(qwen), request_of(qwen), degrees(1, 1, 1, 2))) {
        CHECK(r.computed_steps == both.computed_steps);
        CHECK((r.latents - both.latents).abs().max().item<double>() <= 1e-5);
    }
}

TEST_CASE(
    "MagCache gives diffusers' cached images and passes, on FLUX.1's published ratios and on calibrated "
    "ones") {
    const auto file = mag_golden();
    const nlohmann::json all = mag_cases();
    for (const std::string name : {"flux", "qwen"}) {
        const std::string key = name + "_mag";
        CAPTURE(key);
        const nlohmann::json& c = all.at(key);
        const GenerateRequest request = request_of(c);
        const dp::protocol::StepCache& setting = request.arguments.cache("cache");
        REQUIRE(setting.mag());
        // The ratios taken to the steps as diffusers' nearest_interp takes them.
        const std::vector<float> mine = setting.mag_ratios_for(request.steps);
        const std::vector<float> theirs = c.at("interpolated").get<std::vector<float>>();
        CHECK(mine == theirs);
        const GenerateResult out = load_pipeline(options_of(c), ParallelContext::single())->generate(request);
        REQUIRE(out.error.empty());
        const at::Tensor ref = load_tensor(file, key + ".latents", at::kFloat);
        const at::Tensor uncached =
            load_tensor(file, name + "_calibrate.latents", at::kFloat);  // nothing skipped
        const double diff = (out.latents.reshape(ref.sizes()) - ref).abs().max().item<double>();
        const double effect = (uncached - ref).abs().max().item<double>();
        MESSAGE(key << ": max |latent diff| " << diff << " against diffusers; the cache moves them by "
                    << effect);
        CHECK(diff <= 1e-4);
        CHECK(effect > 1e-2);
        CHECK(out.computed_steps == c.at("computed_steps").get<int64_t>());
        const at::Tensor ref_image = load_tensor(file, key + ".image", at::kByte);
        CHECK((out.image.to(at::kInt) - ref_image.to(at::kInt))
                  .abs()
                  .le(1)
                  .to(at::kDouble)
                  .mean()
                  .item<double>() >= 0.999);
    }
}

TEST_CASE("MagCache calibration computes every pass and measures diffusers' ratios, under every strategy") {
    const auto file = mag_golden();
    const nlohmann::json all = mag_cases();
    for (const std::string name : {"flux", "qwen"}) {
        const std::string key = name + "_calibrate";
        CAPTURE(key);
        const nlohmann::json& c = all.at(key);
        const GenerateRequest request = request_of(c);
        const GenerateResult out = load_pipeline(options_of(c), ParallelContext::single())->generate(request);
        const at::Tensor ref = load_tensor(file, key + ".latents", at::kFloat);
        CHECK((out.latents.reshape(ref.sizes()) - ref).abs().max().item<double>() <= 1e-4);
        CHECK(out.computed_steps == c.at("computed_steps").get<int64_t>());
        // The positive branch's ratios are diffusers' "cond" context's.
        const std::vector<double> theirs = c.at("mag_ratios").at("cond").get<std::vector<double>>();
        REQUIRE(out.mag_ratios.size() == theirs.size());
        for (std::size_t s = 0; s < theirs.size(); ++s) {
            CAPTURE(s);
            CHECK(out.mag_ratios[s] == doctest::Approx(theirs[s]).epsilon(1e-5));
        }
        if (name != "qwen") continue;
        // Each branch measures its own; cfg2 reports the positive one's from both ranks.
        for (const GenerateResult& r : on_two_ranks(options_of(c), request, degrees(1, 1, 1, 2))) {
            REQUIRE(r.mag_ratios.size() == out.mag_ratios.size());
            for (std::size_t s = 0; s < theirs.size(); ++s)
                CHECK(r.mag_ratios[s] == doctest::Approx(out.mag_ratios[s]).epsilon(1e-6));
        }
    }
    // Uneven shards: 9 image tokens over two ranks; the sums over the whole sequence give one ratio.
    nlohmann::json flux = all.at("flux_calibrate");
    flux["width"] = 48, flux["height"] = 48;
    const GenerateResult alone =
        load_pipeline(options_of(flux), ParallelContext::single())->generate(request_of(flux));
    for (const dp::strategies::MeshDegrees& d :
         {degrees(2, 1, 1, 1), degrees(1, 2, 1, 1), degrees(1, 1, 2, 1)})
        for (const GenerateResult& r : on_two_ranks(options_of(flux), request_of(flux), d)) {
            CAPTURE(d.ulysses);
            CAPTURE(d.ring);
            REQUIRE(r.mag_ratios.size() == alone.mag_ratios.size());
            for (std::size_t s = 0; s < alone.mag_ratios.size(); ++s)
                CHECK(r.mag_ratios[s] == doctest::Approx(alone.mag_ratios[s]).epsilon(1e-5));
        }
}

TEST_CASE(
    "MagCache skips the same passes under ulysses2 and ring2 (uneven shards), tp2 and cfg2, and on SD3's "
    "batched branches") {
    const nlohmann::json all = mag_cases();
    nlohmann::json flux = all.at("flux_mag");
    flux["width"] = 48, flux["height"] = 48;
    const GenerateRequest request = request_of(flux);
    const GenerateResult alone =
        load_pipeline(options_of(flux), ParallelContext::single())->generate(request);
    CHECK(alone.computed_steps == flux.at("computed_steps").get<int64_t>());  // the ratios alone decide
    for (const dp::strategies::MeshDegrees& d :
         {degrees(2, 1, 1, 1), degrees(1, 2, 1, 1), degrees(1, 1, 2, 1)})
        for (const GenerateResult& r : on_two_ranks(options_of(flux), request, d)) {
            CAPTURE(d.ulysses);
            CAPTURE(d.ring);
            CHECK(r.computed_steps == alone.computed_steps);
            CHECK((r.latents - alone.latents).abs().max().item<double>() <= 1e-5);
        }
    const nlohmann::json& qwen = all.at("qwen_mag");
    const GenerateResult both =
        load_pipeline(options_of(qwen), ParallelContext::single())->generate(request_of(qwen));
    for (const GenerateResult& r : on_two_ranks(options_of(qwen), request_of(qwen), degrees(1, 1, 1, 2))) {
        CHECK(r.computed_steps == both.computed_steps);
        CHECK((r.latents - both.latents).abs().max().item<double>() <= 1e-5);
    }

    // SD3 (no MagCache in diffusers): its two branches batched in one call, each with its state.
    const PipelineOptions o = sd3_options();
    GenerateRequest r = sd3_request();
    const auto pipeline = load_pipeline(o, ParallelContext::single());
    const GenerateResult plain = pipeline->generate(r);
    dp::protocol::StepCache cache;
    REQUIRE(dp::protocol::parse_step_cache("mag_cache:calibrate=true", cache, 10).empty());
    r.arguments.set("cache", cache);
    const GenerateResult calibrated = pipeline->generate(r);
    CHECK(calibrated.computed_steps == 12);  // six steps, two branches, none skipped
    CHECK(at::equal(calibrated.latents, plain.latents));
    CHECK(calibrated.mag_ratios.size() == 6);
    // Ratios of exactly 1 and no limit on skipping: after the retention step (int(0.5 * 6 + 0.5) = 3)
    // every pass reuses the residual of pass 2.
    REQUIRE(dp::protocol::parse_step_cache(
                "mag_cache:mag_ratios=1 1 1 1 1 1,max_skip_steps=100,retention_ratio=0.5", cache, 10)
                .empty());
    r.arguments.set("cache", cache);
    const GenerateResult skipped = pipeline->generate(r);
    CHECK(skipped.computed_steps == 6);
    CHECK((skipped.latents - plain.latents).abs().max().item<double>() > 1e-3);
    for (const GenerateResult& out : on_two_ranks(o, r, degrees(1, 1, 1, 2))) {
        CHECK(out.computed_steps == 6);
        CHECK((out.latents - skipped.latents).abs().max().item<double>() <= 1e-5);
    }
}

TEST_CASE(
    "Heun and the DPM-Solver++ samplers give the one-process latents under ulysses2, tp2 and cfg2, "
    "and the step caches count Heun's two passes a step") {
    auto file = SafetensorsFile::open(golden_path("scheduler_pipelines.safetensors"));
    const nlohmann::json all = nlohmann::json::parse(file->metadata().at("cases"));
    for (const char* name :
         {"qwen_heun_cfg", "qwen_dpmpp_2m", "qwen_dpmpp_2m_sde", "sd3_heun", "sd3_dpmpp_2m_sde"}) {
        CAPTURE(name);
        const nlohmann::json& c = all.at(name);
        const GenerateRequest r = dp::test::golden_request(c);
        const GenerateResult one = load_pipeline(options_of(c), ParallelContext::single())->generate(r);
        REQUIRE(one.error.empty());
        const bool guided = c.contains("negative_prompt") && !c.at("negative_prompt").is_null() &&
                            (c.value("true_cfg_scale", 1.0) > 1 || c.value("guidance_scale", 1.0) > 1);
        std::vector<dp::strategies::MeshDegrees> meshes = {degrees(2, 1, 1, 1), degrees(1, 1, 2, 1)};
        if (guided) meshes.push_back(degrees(1, 1, 1, 2));
        for (const dp::strategies::MeshDegrees& d : meshes)
            for (const GenerateResult& out : on_two_ranks(options_of(c), r, d)) {
                CAPTURE(d.ulysses);
                CAPTURE(d.tp);
                CAPTURE(d.cfg);
                const double diff = (out.latents - one.latents).abs().max().item<double>();
                MESSAGE(name << ", ulysses " << d.ulysses << " tp " << d.tp << " cfg " << d.cfg
                             << ": max |latent diff| " << diff);
                CHECK(diff <=
                      (d.tp > 1 ? 1e-4 : 2e-5) * std::max(1.0, one.latents.abs().max().item<double>()));
            }
    }
    // Heun's 4 steps are 7 passes: a cache that reuses nothing computes all 7 of each of SD3's two
    // branches, and the progress counts 7.
    GenerateRequest heun = dp::test::golden_request(all.at("sd3_heun"));
    dp::protocol::CallValue cache;
    REQUIRE(dp::protocol::read_call_value(*dp::protocol::find_call_argument("cache"),
                                          "first_block_cache:threshold=0", cache)
                .empty());
    heun.arguments.set("cache", cache);
    int reported = 0;
    heun.on_step = [&reported](int done, int total) {
        reported = done;
        CHECK(total == 7);
    };
    const GenerateResult out =
        load_pipeline(options_of(all.at("sd3_heun")), ParallelContext::single())->generate(heun);
    CHECK(out.computed_steps == 2 * 7);
    CHECK(reported == 7);
}
