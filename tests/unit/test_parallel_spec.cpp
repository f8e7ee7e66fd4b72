#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/job.h"
#include "protocol/errors.h"
#include "strategies/family.h"
#include "strategies/model_config.h"
#include "strategies/parallel_spec.h"

using namespace dp::strategies;

namespace {

// The folder the model folders below are made in, removed when the tests end.
struct TempRoot {
    const std::string path = "/tmp/dp_spec_test_" + std::to_string(getpid());
    TempRoot() { mkdir(path.c_str(), 0755); }
    ~TempRoot() { (void)std::system(("rm -rf '" + path + "'").c_str()); }
};

// A fresh model folder with these files (path relative to it -> contents).
std::string model_folder(const std::string& name,
                         const std::vector<std::pair<std::string, std::string>>& files) {
    static const TempRoot root;
    const std::string dir = root.path + "/" + name;
    mkdir(dir.c_str(), 0755);
    for (const auto& [path, text] : files) {
        const std::size_t slash = path.rfind('/');
        if (slash != std::string::npos) mkdir((dir + "/" + path.substr(0, slash)).c_str(), 0755);
        std::ofstream(dir + "/" + path) << text;
    }
    return dir;
}

// heads, head_dim, layers, patch_size, in_channels, sample_size
std::vector<int64_t> facts(const TransformerShape& s) {
    return {s.heads, s.head_dim, s.layers, s.patch_size, s.in_channels, s.sample_size};
}

}  // namespace

TEST_CASE("SD3's tensor parallelism: column weights and biases split, row weights split, the rest whole") {
    const ParallelSpec& sd3 = family_spec("sd3");
    for (const char* layer : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                              "attn.add_v_proj", "ff.net.0.proj", "ff_context.net.0.proj"}) {
        CAPTURE(layer);
        const std::string name = "transformer_blocks.7." + std::string(layer);
        CHECK(tp_rule_for_layer(sd3, name).split == TpSplit::kColumn);
        CHECK(tp_splits_tensor(sd3, name + ".weight"));
        CHECK(tp_splits_tensor(sd3, name + ".bias"));
    }
    for (const char* layer : {"attn.to_out.0", "attn.to_add_out", "ff.net.2", "ff_context.net.2"}) {
        CAPTURE(layer);
        const std::string name = "transformer_blocks.0." + std::string(layer);
        CHECK(tp_rule_for_layer(sd3, name).split == TpSplit::kRow);
        CHECK(tp_splits_tensor(sd3, name + ".weight"));
        CHECK_FALSE(tp_splits_tensor(sd3, name + ".bias"));  // added once, after the sum
    }
    // AdaLN's modulations: split by output features, then gathered (weight and bias).
    for (const char* layer : {"norm1.linear", "norm1_context.linear"}) {
        CAPTURE(layer);
        const std::string name = "transformer_blocks.0." + std::string(layer);
        CHECK(tp_rule_for_layer(sd3, name).split == TpSplit::kColumnGathered);
        CHECK(tp_splits_tensor(sd3, name + ".weight"));
        CHECK(tp_splits_tensor(sd3, name + ".bias"));
    }
    for (const char* whole :
         {"transformer_blocks.0.attn.norm_q.weight", "transformer_blocks.0.attn.norm_added_k.weight",
          "pos_embed.proj.weight", "pos_embed.pos_embed", "time_text_embed.timestep_embedder.linear_1.weight",
          "time_text_embed.text_embedder.linear_2.bias", "context_embedder.weight", "norm_out.linear.weight",
          "proj_out.weight", "proj_out.bias",
          // Not a tensor of a split layer: another layer whose name only starts alike, or no suffix.
          "transformer_blocks.0.attn.to_qk.weight", "transformer_blocks.0.attn.to_q",
          "transformer_blocks.0.ff.net.2.weight_scale"}) {
        CAPTURE(whole);
        CHECK_FALSE(tp_splits_tensor(sd3, whole));
    }
    CHECK(tp_rule_for_layer(sd3, "transformer_blocks.0.norm_out.linear").split == TpSplit::kWhole);
}

TEST_CASE("a family's spec is found by its pipeline class, and its lists name its own components") {
    CHECK(find_parallel_spec("StableDiffusion3Pipeline") == &family_spec("sd3"));
    CHECK(find_parallel_spec("FluxPipeline") == &family_spec("flux"));
    CHECK(find_parallel_spec("FluxImg2ImgPipeline") == nullptr);
    CHECK(find_parallel_spec("") == nullptr);
    for (const ParallelSpec* spec : parallel_specs()) {
        CAPTURE(spec->family);
        CHECK(find_parallel_spec(spec->pipeline_class) == spec);
        const auto& c = spec->components;
        auto named = [&](const std::string& name) { return std::find(c.begin(), c.end(), name) != c.end(); };
        CHECK(named(spec->transformer));
        for (const std::string& o : spec->optional_components) CHECK(named(o));
        for (const auto& u : spec->unloaded_tensors) CHECK(named(u.first));
        CHECK(!spec->block_prefixes.empty());
    }
}

TEST_CASE("a model folder's family comes from model_index.json's _class_name, or a clear error") {
    const std::string sd3 =
        model_folder("sd3", {{"model_index.json", R"({"_class_name": "StableDiffusion3Pipeline"})"}});
    CHECK(&parallel_spec_for_model(sd3) == &family_spec("sd3"));
    const std::string qwen =
        model_folder("qwen", {{"model_index.json", R"({"_class_name": "QwenImagePipeline"})"}});
    CHECK(&parallel_spec_for_model(qwen) == &family_spec("qwen-image"));
    CHECK(&parallel_spec_for_model(dp::launcher::resolve_model("tiny-random-sd3", "--model")) ==
          &family_spec("sd3"));
    const std::string flux =
        model_folder("flux", {{"model_index.json", R"({"_class_name": "FluxPipeline"})"}});
    CHECK(&parallel_spec_for_model(flux) == &family_spec("flux"));
    // FLUX.1's pipelines of their own weights, each its family.
    const std::string fill =
        model_folder("fill", {{"model_index.json", R"({"_class_name": "FluxFillPipeline"})"}});
    CHECK(&parallel_spec_for_model(fill) == &family_spec("flux-fill"));
    const std::string kontext =
        model_folder("kontext", {{"model_index.json", R"({"_class_name": "FluxKontextPipeline"})"}});
    CHECK(&parallel_spec_for_model(kontext) == &family_spec("flux-kontext"));
    for (const auto& [edit, family] :
         {std::pair{"QwenImageEditPipeline", "qwen-image-edit"},
          std::pair{"QwenImageEditPlusPipeline", "qwen-image-edit-plus"},
          std::pair{"ZImagePipeline", "z-image"}, std::pair{"Flux2KleinPipeline", "flux2-klein"},
          std::pair{"Flux2Pipeline", "flux2-dev"}}) {
        const std::string folder =
            model_folder(family, {{"model_index.json", std::string(R"({"_class_name": ")") + edit + "\"}"}});
        CHECK(&parallel_spec_for_model(folder) == &family_spec(family));
    }
    const std::string control =
        model_folder("control", {{"model_index.json", R"({"_class_name": "FluxControlPipeline"})"}});
    // Every registered class named, in the registry's order (the first seven as they were added).
    std::string supported;
    for (const dp::strategies::FamilyFacts* f : dp::strategies::families())
        supported += (supported.empty() ? "" : ", ") + f->spec.pipeline_class;
    CHECK(supported.rfind(
              "StableDiffusion3Pipeline, QwenImagePipeline, FluxPipeline, FluxFillPipeline, "
              "FluxKontextPipeline, QwenImageEditPipeline, QwenImageEditPlusPipeline, ZImagePipeline",
              0) == 0);
    CHECK_THROWS_WITH_AS(
        parallel_spec_for_model(control),
        (control +
         "/model_index.json: _class_name FluxControlPipeline is not supported (supported: " + supported + ")")
            .c_str(),
        dp::protocol::ModelError);
    for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
             {"{", "model_index.json: not valid JSON"},
             {"[1]", "model_index.json: expected a JSON object"},
             {R"({"_class_name": 3})", "model_index.json: no \"_class_name\" naming the pipeline"},
             {"{}", "model_index.json: no \"_class_name\" naming the pipeline"}}) {
        CAPTURE(text);
        const std::string dir = model_folder("bad", {{"model_index.json", text}});
        CHECK_THROWS_WITH_AS(parallel_spec_for_model(dir), doctest::Contains((dir + "/" + message).c_str()),
                             dp::protocol::ModelError);
    }
    CHECK_THROWS_WITH_AS(parallel_spec_for_model("/nonexistent/model"),
                         "/nonexistent/model/model_index.json: cannot read", dp::protocol::ModelError);
    try {
        parallel_spec_for_model(flux);
    } catch (const dp::protocol::Error& e) {
        CHECK(e.exit_code() == dp::protocol::kExitInputData);
    }
}

TEST_CASE("the transformer's shape through the spec's keys, with the family's defaults for absent keys") {
    const ParallelSpec& sd3 = family_spec("sd3");
    const TransformerShape tiny =
        read_transformer_shape(dp::launcher::resolve_model("tiny-random-sd3", "--model"), sd3);
    CHECK(facts(tiny) == std::vector<int64_t>{4, 8, 2, 1, 4, 32});
    CHECK(tiny.width() == 32);
    // SD3Transformer2DModel's defaults (SD3 medium's shape).
    const TransformerShape d =
        read_transformer_shape(model_folder("empty", {{"transformer/config.json", "{}"}}), sd3);
    CHECK(facts(d) == std::vector<int64_t>{18, 64, 18, 2, 16, 128});
    // Another family's keys.
    ParallelSpec other = sd3;
    other.transformer = "dit";
    other.heads_key = "n_heads";
    other.layers_key = "depth";
    other.transformer_defaults.layers = 0;  // required
    const std::string dir = model_folder("other", {{"dit/config.json", R"({"n_heads": 6, "depth": 3})"}});
    const TransformerShape o = read_transformer_shape(dir, other);
    CHECK(o.heads == 6);
    CHECK(o.layers == 3);
    CHECK(o.head_dim == 64);
    const std::string no_depth = model_folder("nodepth", {{"dit/config.json", R"({"n_heads": 6})"}});
    CHECK_THROWS_WITH_AS(read_transformer_shape(no_depth, other),
                         (no_depth + "/dit/config.json: no \"depth\"").c_str(), dp::protocol::ModelError);
    for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
             {R"({"num_attention_heads": "four"})",
              "\"num_attention_heads\" is \"four\"; expected a positive integer"},
             {R"({"num_layers": 0})", "\"num_layers\" is 0; expected a positive integer"},
             {R"({"attention_head_dim": 1.5})", "\"attention_head_dim\" is 1.5; expected a positive integer"},
             {"[]", "expected a JSON object"},
             {"nope", "not valid JSON"}}) {
        CAPTURE(text);
        const std::string bad = model_folder("badshape", {{"transformer/config.json", text}});
        CHECK_THROWS_WITH_AS(read_transformer_shape(bad, sd3),
                             doctest::Contains((bad + "/transformer/config.json: " + message).c_str()),
                             dp::protocol::ModelError);
    }
    CHECK_THROWS_WITH_AS(read_transformer_shape("/nonexistent/model", sd3),
                         "/nonexistent/model/transformer/config.json: cannot read", dp::protocol::ModelError);
}
