// LoRA adapters in the worker: a weight's change as WeightStore takes it, whole and as either
// tensor-parallel shard, against W + factor * up @ down computed here; and end to end, adapters made
// by peft and saved by diffusers (scripts/golden/golden_lora.py) give diffusers' images
// (load_lora_weights + set_adapters) per request in one pipeline that switches between them, then
// the same image again after the switches (no drift), and the single-process image under tp2,
// ulysses2, ring2 and cfg2. Z-Image's adapter case lives in its own pipeline golden, in the same form.
#include "unit/doctest_torch.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/io/weights.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/pipeline/adapters.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/prompt_queue.h"
#include "strategies/mesh.h"
#include "strategies/model_config.h"
#include "support/test_paths.h"
#include "unit/golden_request.h"
#include "unit/ranks_as_threads.h"

using namespace dp::runtime;

namespace {

std::shared_ptr<SafetensorsFile> golden() {
    return SafetensorsFile::open(golden_path("lora_pipeline.safetensors"));
}

// An adapter's golden case: golden_lora.py's, or a family's own pipeline golden's (Z-Image's).
struct AdapterCase {
    std::shared_ptr<SafetensorsFile> file;
    std::string name;
    nlohmann::json call;
};

// Every family's adapter cases, by family.
std::map<std::string, std::vector<AdapterCase>> adapter_cases() {
    std::map<std::string, std::vector<AdapterCase>> out;
    for (const char* name : {"lora_pipeline.safetensors", "z_image_pipeline.safetensors"}) {
        const auto file = SafetensorsFile::open(golden_path(name));
        const nlohmann::json cases = dp::test::golden_cases(file);
        for (const auto& [case_name, c] : cases.items())
            if (c.contains("adapters"))
                out[c.at("family").get<std::string>()].push_back({file, case_name, c});
    }
    return out;
}

std::string folder_of(const nlohmann::json& c) {
    return dp::test::repository_path(c.at("folder").get<std::string>());
}

GenerateRequest request_of(const nlohmann::json& c) {
    GenerateRequest r = dp::test::golden_request(c);
    dp::protocol::Adapters adapters;
    for (const auto& a : c.at("adapters"))
        adapters.push_back(
            {golden_path("lora/" + a.at("file").get<std::string>()), a.at("scale").get<double>(), ""});
    r.arguments.set("lora", adapters);
    return r;
}

PipelineOptions options_for(const std::string& folder) {
    PipelineOptions o;
    o.model_dir = folder;
    o.adapters = std::make_shared<AdapterState>();
    return o;
}

}  // namespace

TEST_CASE("an adapter changes a weight by factor * up @ down, whole and in either tensor-parallel shard") {
    const std::string path = "/tmp/dp_lora_base_" + std::to_string(getpid()) + ".safetensors";
    const at::Tensor w = seeded({6, 10}, 1);
    save_safetensors(path, {{"layer.weight", w}});
    const at::Tensor up = seeded({6, 3}, 2), down = seeded({3, 10}, 3);
    const at::Tensor up2 = seeded({6, 2}, 4), down2 = seeded({2, 10}, 5);
    auto deltas = std::make_shared<WeightDeltas>();
    (*deltas)["layer.weight"] = {{down, up, 0.75}, {down2, up2, -1.5}};
    const at::Tensor expected = w + 0.75 * at::mm(up, down) + -1.5 * at::mm(up2, down2);

    WeightStore store = WeightStore::open_file(path, at::kFloat, at::kCPU);
    store.set_deltas(deltas);
    CHECK(at::allclose(store.take("layer.weight", {6, 10}), expected, 1e-6, 1e-6));
    WeightStore rows = WeightStore::open_file(path, at::kFloat, at::kCPU);
    rows.set_deltas(deltas);
    CHECK(at::allclose(rows.take_shard("layer.weight", {6, 10}, 0, 2, 3), expected.narrow(0, 2, 3), 1e-6,
                       1e-6));
    WeightStore cols = WeightStore::open_file(path, at::kFloat, at::kCPU);
    cols.set_deltas(deltas);
    CHECK(at::allclose(cols.take_shard("layer.weight", {6, 10}, 1, 4, 5), expected.narrow(1, 4, 5), 1e-6,
                       1e-6));
    // The base is never written: the file's weight, taken again without adapters, is unchanged.
    WeightStore plain = WeightStore::open_file(path, at::kFloat, at::kCPU);
    CHECK(at::equal(plain.take("layer.weight", {6, 10}), w));

    // A change of a weight the model never takes is named.
    auto stray = std::make_shared<WeightDeltas>();
    (*stray)["other.weight"] = {{down, up, 1.0}};
    WeightStore s = WeightStore::open_file(path, at::kFloat, at::kCPU);
    s.set_deltas(stray);
    s.take("layer.weight", {6, 10});
    CHECK_THROWS_WITH_AS(s.check_all_taken(), doctest::Contains("other.weight"), ModelError);
}

TEST_CASE(
    "a switch makes again, in place, only the weights the adapters change, and only where the module holds "
    "them") {
    const std::string path = "/tmp/dp_lora_switch_" + std::to_string(getpid()) + ".safetensors";
    const at::Tensor w = seeded({6, 10}, 1), other = seeded({4, 6}, 2);
    save_safetensors(path,
                     {{"layer.weight", w}, {"other.weight", other}, {"fused.weight", seeded({6, 10}, 3)}});
    const at::Tensor up = seeded({6, 3}, 4), down = seeded({3, 10}, 5);
    auto first = std::make_shared<WeightDeltas>();
    (*first)["layer.weight"] = {{down, up, 0.5}};
    auto second = std::make_shared<WeightDeltas>();
    (*second)["layer.weight"] = {{down, up, -2.0}};

    WeightStore store = WeightStore::open_file(path, at::kFloat, at::kCPU);
    // What a module keeps: two weights as taken, one only as a copy (a fused projection).
    at::Tensor layer = store.take_shard("layer.weight", {6, 10}, 0, 2, 3);
    const at::Tensor kept_other = store.take("other.weight", {4, 6});
    const at::Tensor fused = store.take("fused.weight", {6, 10}).mul(1.0);
    store.forget_unheld();
    const void* other_data = kept_other.data_ptr();

    REQUIRE(store.retake(first, {"layer.weight"}));
    CHECK(at::allclose(layer, (w + 0.5 * at::mm(up, down)).narrow(0, 2, 3), 1e-6, 1e-6));
    REQUIRE(store.retake(second, {"layer.weight"}));
    CHECK(at::allclose(layer, (w - 2.0 * at::mm(up, down)).narrow(0, 2, 3), 1e-6, 1e-6));
    REQUIRE(store.retake(nullptr, {"layer.weight"}));  // back to none: the base, to the bit
    CHECK(at::equal(layer, w.narrow(0, 2, 3)));
    CHECK(kept_other.data_ptr() == other_data);  // what no adapter changes is never touched
    CHECK(at::equal(kept_other, other));
    CHECK(store.remembered_bytes({"layer.weight"}) == 3 * 10 * 4);

    // Not held as taken, or never taken: the caller must build the component again.
    CHECK_FALSE(store.retake(first, {"fused.weight"}));
    CHECK_FALSE(store.retake(first, {"missing.weight"}));
    CHECK(at::equal(layer, w.narrow(0, 2, 3)));  // a refused retake changes nothing
    at::Tensor replaced = layer;
    layer = layer.clone();  // the module replaced its tensor (a move to another device, say)
    replaced.reset();
    CHECK_FALSE(store.retake(first, {"layer.weight"}));
    (void)fused;
    std::remove(path.c_str());
}

TEST_CASE(
    "adapters made by peft and saved by diffusers give diffusers' images, switched per request without "
    "drift") {
    int checked = 0;
    for (const auto& [family, cases] : adapter_cases()) {
        CAPTURE(family);
        const PipelineOptions options = options_for(folder_of(cases.front().call));
        const auto pipeline = load_pipeline(options, ParallelContext::single());
        {  // Every component's changed weights are made again in place, none built again whole.
            const dp::strategies::ModelInfo model = dp::strategies::read_model_info(options.model_dir);
            const AdapterState::Report report = options.adapters->apply(
                request_of(cases.back().call).arguments.adapters("lora"), *model.spec, options.model_dir, "");
            CHECK_FALSE(report.components.empty());
            CHECK(report.weights > 0);
            for (const auto& [component, how] : report.components) {
                CAPTURE(component);
                CHECK(how == AdapterState::Switched::kInPlace);
            }
        }
        at::Tensor first;
        for (const AdapterCase& c : cases) {
            const std::string& name = c.name;
            CAPTURE(name);
            const GenerateResult out = pipeline->generate(request_of(c.call));
            REQUIRE(out.error.empty());
            const at::Tensor ref = load_tensor(c.file, name + ".latents", at::kFloat);
            const at::Tensor base = load_tensor(c.file, name + ".base_latents", at::kFloat);
            const at::Tensor mine = out.latents.reshape(ref.sizes());
            const double diff = (mine - ref).abs().max().item<double>();
            const double effect = (base - ref).abs().max().item<double>();
            MESSAGE(name << ": max |latent diff| " << diff << " against diffusers; the adapters move them by "
                         << effect);
            CHECK(effect > 0.05);  // the adapters change the image
            CHECK(diff <= 1e-4);
            const at::Tensor ref_image = load_tensor(c.file, name + ".image", at::kByte);
            const at::Tensor d = (out.image.to(at::kInt) - ref_image.to(at::kInt)).abs();
            CHECK(d.le(1).to(at::kDouble).mean().item<double>() >= 0.999);
            if (!first.defined()) first = out.latents;
            ++checked;
        }
        // Back to the first request's adapters after the others: the same latents, to the bit.
        const GenerateResult again = pipeline->generate(request_of(cases.front().call));
        CHECK(at::equal(again.latents, first));
        // And with none: the base model's image.
        GenerateRequest plain = request_of(cases.front().call);
        plain.arguments.set("lora", dp::protocol::Adapters{});
        const GenerateResult base = pipeline->generate(plain);
        const at::Tensor ref_base =
            load_tensor(cases.front().file, cases.front().name + ".base_latents", at::kFloat);
        CHECK((base.latents.reshape(ref_base.sizes()) - ref_base).abs().max().item<double>() <= 1e-4);
    }
    CHECK(checked == static_cast<int>(dp::test::golden_cases(golden()).size()) + 1);  // + Z-Image's
}

TEST_CASE(
    "an adapter gives the single-process image under tp2, ulysses2, ring2 and cfg2: FLUX.1, SD3, Qwen-Image, "
    "Z-Image") {
    std::map<std::string, nlohmann::json> all;
    for (const auto& [family, cases] : adapter_cases())
        for (const AdapterCase& c : cases) all[c.name] = c.call;
    for (const char* name : {"flux_kohya", "sd3_all", "qwen_peft", "z_image_peft"}) {
        CAPTURE(name);
        const nlohmann::json& c = all.at(name);
        const std::string folder = folder_of(c);
        const GenerateRequest request = request_of(c);
        const at::Tensor alone =
            load_pipeline(options_for(folder), ParallelContext::single())->generate(request).latents;
        std::vector<dp::strategies::MeshDegrees> layouts(3);
        layouts[0].tp = 2;
        layouts[1].ulysses = 2;
        layouts[2].ring = 2;
        if (std::string(name) == "sd3_all") layouts.emplace_back().cfg = 2;  // SD3 runs two branches here
        for (const dp::strategies::MeshDegrees& degrees : layouts) {
            CAPTURE(degrees.tp);
            CAPTURE(degrees.ulysses);
            CAPTURE(degrees.ring);
            CAPTURE(degrees.cfg);
            std::vector<at::Tensor> out(2), switched(2);
            dp::test::run_ranks(2, [&](int rank, Communicator& group) {
                const ParallelContext parallel(group, dp::strategies::Mesh(2, degrees));
                const auto pipeline = load_pipeline(options_for(folder), parallel);
                out[static_cast<std::size_t>(rank)] = pipeline->generate(request).latents;
                // Switched to none and back (in place, or built again where a rank's module holds
                // a fused copy of a changed weight): the same image.
                GenerateRequest plain = request;
                plain.arguments.set("lora", dp::protocol::Adapters{});
                pipeline->generate(plain);
                switched[static_cast<std::size_t>(rank)] = pipeline->generate(request).latents;
            });
            for (const at::Tensor& t : out) CHECK((t - alone).abs().max().item<double>() <= 1e-5);
            for (std::size_t k = 0; k < 2; ++k) CHECK(at::equal(switched[k], out[k]));
        }
    }
}

TEST_CASE("with offload, each use builds its component with the request's adapters") {
    const nlohmann::json all = dp::test::golden_cases(golden());
    for (const char* name : {"qwen_peft", "flux_kohya"}) {
        CAPTURE(name);
        const nlohmann::json& c = all.at(name);
        const GenerateRequest request = request_of(c);
        const at::Tensor kept =
            load_pipeline(options_for(folder_of(c)), ParallelContext::single())->generate(request).latents;
        PipelineOptions o = options_for(folder_of(c));
        o.offload = true;
        const auto pipeline = load_pipeline(o, ParallelContext::single());
        CHECK(at::equal(pipeline->generate(request).latents, kept));
        GenerateRequest plain = request;
        plain.arguments.set("lora", dp::protocol::Adapters{});
        const at::Tensor base = load_tensor(golden(), std::string(name) + ".base_latents", at::kFloat);
        CHECK((pipeline->generate(plain).latents.reshape(base.sizes()) - base).abs().max().item<double>() <=
              1e-4);
    }
}

TEST_CASE("the dynamic queue: a replica claims the units of its current adapter set first, every unit once") {
    const dp::strategies::ModelInfo model =
        dp::strategies::read_model_info(std::string(DP_MODELS_DIR) + "/tiny-random-flux-dev");
    for (const bool even : {true, false}) {  // 4 prompts of set A and 4 of B, alternating; or 6 and 2
        CAPTURE(even);
        dp::protocol::JobFile job;
        job.schedule = "dynamic";
        job.job_id = std::string("queue-test-") + (even ? "even" : "uneven");
        for (int k = 0; k < 8; ++k) {
            dp::protocol::JobRequest r;
            r.index = k;
            r.steps = 4;
            const bool a = even ? k % 2 == 0 : k != 3 && k != 7;
            r.arguments.set("lora", dp::protocol::Adapters{{a ? "a.safetensors" : "b.safetensors", 1.0, ""}});
            job.requests.push_back(r);
        }
        // The replicas claim in rounds (one unit each, then a barrier), so what each gets is fixed.
        std::vector<std::vector<std::size_t>> made(2);
        dp::test::run_ranks(2, [&](int rank, Communicator& group) {
            dp::strategies::MeshDegrees two_replicas;
            two_replicas.dp = 2;
            const ParallelContext parallel(group, dp::strategies::Mesh(2, two_replicas));
            PromptQueue queue(job, model, parallel, group, job.job_id);
            REQUIRE(queue.dynamic());
            for (int round = 0; round < 6; ++round) {
                if (const std::vector<std::size_t>* unit = queue.next())
                    for (const std::size_t k : *unit) made[static_cast<std::size_t>(rank)].push_back(k);
                group.barrier();
            }
        });
        const auto is_a = [&](std::size_t k) {
            return job.requests[k].arguments.adapters("lora").front().path == "a.safetensors";
        };
        std::vector<std::size_t> all;
        for (const auto& m : made) all.insert(all.end(), m.begin(), m.end());
        std::sort(all.begin(), all.end());
        CHECK(all == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7});  // every prompt once
        // Replica 0 starts on A (the first set), replica 1 on B, each keeps to its set while it
        // lasts; with 6 and 2, replica 1 then helps with A.
        REQUIRE(made[0].size() == 4);
        REQUIRE(made[1].size() == 4);
        for (std::size_t i = 0; i < 4; ++i) {
            CAPTURE(i);
            CHECK(is_a(made[0][i]));
            CHECK(is_a(made[1][i]) == (!even && i >= 2));
        }
    }
}
