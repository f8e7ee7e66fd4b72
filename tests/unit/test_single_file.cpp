// Single files as the launcher reads them (strategies/single_file.h): which file tensor, rows and
// scale each of the component's tensors comes from in FLUX.1's original layout (fused q, k, v
// rows; linear1's q, k, v and MLP rows; the final modulation's halves in the other order), fp8 and
// scaled fp8, and every way a file can be wrong for the model. The files are written byte by byte
// (unit/st_writer.h) and the expected rows are stated from the layout's definition, not the reader.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "protocol/errors.h"
#include "strategies/family.h"
#include "strategies/parallel_spec.h"
#include "strategies/safetensors.h"
#include "strategies/single_file.h"
#include "support/test_paths.h"
#include "unit/st_writer.h"

using namespace dp::strategies;
using dp::test::StTensor;

namespace {

// A FLUX.1-like transformer in Black Forest Labs' names: width 8, an MLP of 32, `doubles` double
// and `singles` single blocks, under `prefix`, its weights in `dtype` (scaled: a scale_weight each).
std::vector<StTensor> bfl_flux(const std::string& prefix, int doubles, int singles,
                               const std::string& dtype = "BF16", bool scaled = false) {
    std::vector<StTensor> t;
    const auto linear = [&](const std::string& name, int64_t out, int64_t in) {
        t.push_back({prefix + name + ".weight", {out, in}, dtype, 0});
        t.push_back({prefix + name + ".bias", {out}, "BF16", 0});
        if (scaled) t.push_back({prefix + name + ".scale_weight", {}, "F32", 0.5f});
    };
    linear("img_in", 8, 64);
    linear("txt_in", 8, 16);
    for (const char* m : {"time_in", "vector_in", "guidance_in"}) {
        linear(std::string(m) + ".in_layer", 8, 4);
        linear(std::string(m) + ".out_layer", 8, 8);
    }
    for (int b = 0; b < doubles; ++b) {
        const std::string p = "double_blocks." + std::to_string(b) + ".";
        for (const char* s : {"img", "txt"}) {
            linear(p + s + "_mod.lin", 48, 8);
            linear(p + s + "_attn.qkv", 24, 8);
            linear(p + s + "_attn.proj", 8, 8);
            linear(p + s + "_mlp.0", 32, 8);
            linear(p + s + "_mlp.2", 8, 32);
            t.push_back({prefix + p + s + "_attn.norm.query_norm.scale", {4}, "BF16", 1});
            t.push_back({prefix + p + s + "_attn.norm.key_norm.scale", {4}, "BF16", 1});
        }
    }
    for (int b = 0; b < singles; ++b) {
        const std::string p = "single_blocks." + std::to_string(b) + ".";
        linear(p + "modulation.lin", 24, 8);
        linear(p + "linear1", 24 + 32, 8);
        linear(p + "linear2", 8, 8 + 32);
        t.push_back({prefix + p + "norm.query_norm.scale", {4}, "BF16", 1});
        t.push_back({prefix + p + "norm.key_norm.scale", {4}, "BF16", 1});
    }
    linear("final_layer.linear", 64, 8);
    linear("final_layer.adaLN_modulation.1", 16, 8);
    return t;
}

// The same transformer's tensors in diffusers' names, as its config implies them.
std::map<std::string, std::vector<int64_t>> diffusers_flux(int doubles, int singles) {
    std::map<std::string, std::vector<int64_t>> m;
    const auto linear = [&](const std::string& name, int64_t out, int64_t in) {
        m[name + ".weight"] = {out, in};
        m[name + ".bias"] = {out};
    };
    linear("x_embedder", 8, 64);
    linear("context_embedder", 8, 16);
    for (const char* e : {"timestep_embedder", "text_embedder", "guidance_embedder"}) {
        linear(std::string("time_text_embed.") + e + ".linear_1", 8, 4);
        linear(std::string("time_text_embed.") + e + ".linear_2", 8, 8);
    }
    for (int b = 0; b < doubles; ++b) {
        const std::string p = "transformer_blocks." + std::to_string(b) + ".";
        linear(p + "norm1.linear", 48, 8);
        linear(p + "norm1_context.linear", 48, 8);
        for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                              "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"})
            linear(p + n, 8, 8);
        linear(p + "ff.net.0.proj", 32, 8);
        linear(p + "ff.net.2", 8, 32);
        linear(p + "ff_context.net.0.proj", 32, 8);
        linear(p + "ff_context.net.2", 8, 32);
        for (const char* n : {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"})
            m[p + n + ".weight"] = {4};
    }
    for (int b = 0; b < singles; ++b) {
        const std::string p = "single_transformer_blocks." + std::to_string(b) + ".";
        linear(p + "norm.linear", 24, 8);
        for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v"}) linear(p + n, 8, 8);
        linear(p + "proj_mlp", 32, 8);
        linear(p + "proj_out", 8, 40);
        for (const char* n : {"attn.norm_q", "attn.norm_k"}) m[p + n + ".weight"] = {4};
    }
    linear("proj_out", 64, 8);
    linear("norm_out.linear", 16, 8);
    return m;
}

SingleFileLayout layout_of(const std::string& path, const std::string& component = "transformer") {
    return read_single_file_layout(*SafetensorsFile::open(path), family_spec("flux"), component);
}

std::string path_of(const std::string& name) { return dp::test::scratch_path("single_file", name); }

using Rows = std::vector<std::pair<int64_t, int64_t>>;

}  // namespace

TEST_CASE("FLUX.1's original layout: fused rows split at the file's own width, the final halves swapped") {
    const std::string path =
        dp::test::write_st_file(path_of("bfl.safetensors"), bfl_flux("model.diffusion_model.", 2, 2));
    const SingleFileLayout l = layout_of(path);
    CHECK(l.layout == "Black Forest Labs' original (FLUX.1)");
    CHECK(l.prefix == "model.diffusion_model.");
    CHECK(l.format == "bf16");
    const std::string p = "model.diffusion_model.";
    CHECK(l.tensors.at("transformer_blocks.1.attn.to_q.weight").tensor ==
          p + "double_blocks.1.img_attn.qkv.weight");
    CHECK(l.tensors.at("transformer_blocks.1.attn.to_q.weight").rows == Rows{{0, 8}});
    CHECK(l.tensors.at("transformer_blocks.1.attn.to_k.bias").rows == Rows{{8, 8}});
    CHECK(l.tensors.at("transformer_blocks.1.attn.add_v_proj.weight").rows == Rows{{16, 8}});
    CHECK(l.tensors.at("transformer_blocks.1.attn.add_v_proj.weight").tensor ==
          p + "double_blocks.1.txt_attn.qkv.weight");
    CHECK(l.tensors.at("single_transformer_blocks.0.attn.to_v.weight").rows == Rows{{16, 8}});
    CHECK(l.tensors.at("single_transformer_blocks.0.proj_mlp.weight").rows == Rows{{24, 32}});
    CHECK(l.shapes.at("single_transformer_blocks.0.proj_mlp.weight") == std::vector<int64_t>{32, 8});
    CHECK(l.tensors.at("norm_out.linear.weight").rows == Rows{{8, 8}, {0, 8}});
    CHECK(l.tensors.at("transformer_blocks.0.attn.norm_added_k.weight").tensor ==
          p + "double_blocks.0.txt_attn.norm.key_norm.scale");
    CHECK(l.tensors.at("time_text_embed.guidance_embedder.linear_2.weight").tensor ==
          p + "guidance_in.out_layer.weight");
    CHECK(l.tensors.at("x_embedder.weight").rows.empty());
    // Every tensor of the model is placed, with its shape.
    CHECK(single_file_problem(l, diffusers_flux(2, 2)).empty());
    // Without a prefix, the same.
    const std::string plain = dp::test::write_st_file(path_of("plain.safetensors"), bfl_flux("", 2, 2));
    CHECK(layout_of(plain).prefix.empty());
    CHECK(single_file_problem(layout_of(plain), diffusers_flux(2, 2)).empty());
}

TEST_CASE("fp8 and ComfyUI's scaled fp8: the format, and each weight's scale") {
    const std::string fp8 =
        dp::test::write_st_file(path_of("fp8.safetensors"), bfl_flux("", 1, 1, "F8_E4M3"));
    const SingleFileLayout a = layout_of(fp8);
    CHECK(a.format == "fp8 (e4m3)");
    CHECK(a.tensors.at("transformer_blocks.0.attn.to_q.weight").scale.empty());
    std::vector<StTensor> tensors = bfl_flux("", 1, 1, "F8_E4M3", /*scaled=*/true);
    tensors.push_back({"scaled_fp8", {0}, "F8_E4M3", 0});
    const SingleFileLayout b = layout_of(dp::test::write_st_file(path_of("scaled.safetensors"), tensors));
    CHECK(b.format == "scaled fp8 (e4m3)");
    CHECK(b.tensors.at("transformer_blocks.0.attn.to_k.weight").scale ==
          "double_blocks.0.img_attn.qkv.scale_weight");
    CHECK(b.tensors.at("transformer_blocks.0.attn.to_k.bias").scale.empty());
    CHECK(single_file_problem(b, diffusers_flux(1, 1)).empty());
    // A scale that is not a finite number is refused, naming it (F32 and BF16 alike).
    for (const char* dtype : {"F32", "BF16"}) {
        std::vector<StTensor> infinite = tensors;
        for (StTensor& t : infinite)
            if (t.name == "double_blocks.0.img_attn.qkv.scale_weight") t = {t.name, {}, dtype, INFINITY};
        CHECK_THROWS_WITH_AS(layout_of(dp::test::write_st_file(path_of("inf_scale.safetensors"), infinite)),
                             doctest::Contains("'double_blocks.0.img_attn.qkv.scale_weight', the scale of"),
                             dp::protocol::ModelError);
    }
    // A scale that is not one number is refused, naming it.
    tensors.push_back({"img_in.scale_weight", {2}, "F32", 1});
    for (auto& t : tensors)
        if (t.name == "img_in.scale_weight" && t.shape.empty()) t.name = "unused.scale_weight";
    const std::string bad = dp::test::write_st_file(path_of("bad_scale.safetensors"), tensors);
    CHECK_THROWS_WITH_AS(layout_of(bad), doctest::Contains("'img_in.scale_weight' must be one number"),
                         dp::protocol::ModelError);
}

TEST_CASE("a file that does not fit the model is named with what is wrong") {
    // A block missing: named in the file's own names.
    std::vector<StTensor> tensors = bfl_flux("", 2, 2);
    std::vector<StTensor> without;
    for (const StTensor& t : tensors)
        if (t.name.rfind("double_blocks.1.", 0) != 0) without.push_back(t);
    const std::string path = dp::test::write_st_file(path_of("missing.safetensors"), without);
    const std::string missing = single_file_problem(layout_of(path), diffusers_flux(2, 2));
    CHECK(missing.find(path) == 0);
    CHECK(missing.find("double_blocks.1") != std::string::npos);
    // A model with fewer blocks than the file: the extra ones are named.
    const std::string extra = single_file_problem(
        layout_of(dp::test::write_st_file(path_of("more.safetensors"), tensors)), diffusers_flux(1, 2));
    CHECK(extra.find("double_blocks.1.") != std::string::npos);
    CHECK(extra.find("no place") != std::string::npos);
    // Another width: the shape is named with the config's.
    std::map<std::string, std::vector<int64_t>> wider = diffusers_flux(2, 2);
    wider["x_embedder.weight"] = {16, 64};
    const std::string shape =
        single_file_problem(layout_of(dp::test::write_st_file(path_of("w.safetensors"), tensors)), wider);
    CHECK(shape.find("'img_in.weight'") != std::string::npos);
    CHECK(shape.find("[16, 64]") != std::string::npos);
    // An SD3 checkpoint for a FLUX.1 model: the family its names look made for.
    const std::string sd3 =
        dp::test::write_st_file(path_of("sd3.safetensors"),
                                {{"model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight", {24, 8}}});
    CHECK_THROWS_WITH_AS(layout_of(sd3), doctest::Contains("look made for SD3"), dp::protocol::ModelError);
    // A truncated file is no valid safetensors file (65, naming it).
    const std::string cut = dp::test::write_st_file(path_of("cut.safetensors"), tensors, {}, 100);
    CHECK_THROWS_WITH_AS(layout_of(cut), doctest::Contains(cut.c_str()), dp::protocol::ModelError);
    // A fused tensor too short for its parts.
    std::vector<StTensor> short_qkv = bfl_flux("", 1, 1);
    for (StTensor& t : short_qkv)
        if (t.name == "double_blocks.0.img_attn.qkv.weight") t.shape = {12, 8};
    CHECK_THROWS_WITH_AS(layout_of(dp::test::write_st_file(path_of("short.safetensors"), short_qkv)),
                         doctest::Contains("too few"), dp::protocol::ModelError);
}

TEST_CASE("a component file in diffusers' or transformers' own names maps name for name") {
    const std::string path = dp::test::write_st_file(
        path_of("clip.safetensors"), {{"text_model.embeddings.token_embedding.weight", {10, 4}, "F32", 0},
                                      {"text_model.final_layer_norm.weight", {4}, "F32", 0}});
    const SingleFileLayout l = layout_of(path, "text_encoder");
    CHECK(l.layout == "diffusers");
    CHECK(l.format == "fp32");
    CHECK(l.tensors.at("text_model.final_layer_norm.weight").tensor == "text_model.final_layer_norm.weight");
    std::map<std::string, std::vector<int64_t>> expected = {
        {"text_model.embeddings.token_embedding.weight", {10, 4}},
        {"text_model.final_layer_norm.weight", {4}}};
    CHECK(single_file_problem(l, expected).empty());
    expected["text_model.final_layer_norm.bias"] = {4};
    CHECK(single_file_problem(l, expected).find("text_model.final_layer_norm.bias") != std::string::npos);
}

namespace {

// An SD3-like transformer in Stability AI's names (as sd3.5_medium.safetensors): width 8, two joint
// blocks, the first with the second attention (MMDiT-X), the last one's context stream ending
// there (no context projection out, no context MLP; its modulation two chunks), q/k norms.
std::vector<StTensor> stability_sd3(const std::string& prefix) {
    std::vector<StTensor> t;
    const auto linear = [&](const std::string& name, int64_t out, int64_t in) {
        t.push_back({prefix + name + ".weight", {out, in}, "BF16", 0});
        t.push_back({prefix + name + ".bias", {out}, "BF16", 0});
    };
    t.push_back({prefix + "pos_embed", {1, 16, 8}, "BF16", 0});
    t.push_back({prefix + "x_embedder.proj.weight", {8, 4, 2, 2}, "BF16", 0});
    t.push_back({prefix + "x_embedder.proj.bias", {8}, "BF16", 0});
    linear("context_embedder", 8, 12);
    linear("t_embedder.mlp.0", 8, 256);
    linear("t_embedder.mlp.2", 8, 8);
    linear("y_embedder.mlp.0", 8, 16);
    linear("y_embedder.mlp.2", 8, 8);
    for (int b = 0; b < 2; ++b) {
        const std::string p = "joint_blocks." + std::to_string(b) + ".";
        const bool last = b == 1;
        linear(p + "x_block.attn.qkv", 24, 8);
        linear(p + "x_block.attn.proj", 8, 8);
        linear(p + "x_block.adaLN_modulation.1", b == 0 ? 72 : 48, 8);
        linear(p + "x_block.mlp.fc1", 32, 8);
        linear(p + "x_block.mlp.fc2", 8, 32);
        linear(p + "context_block.attn.qkv", 24, 8);
        linear(p + "context_block.adaLN_modulation.1", last ? 16 : 48, 8);
        if (!last) {
            linear(p + "context_block.attn.proj", 8, 8);
            linear(p + "context_block.mlp.fc1", 32, 8);
            linear(p + "context_block.mlp.fc2", 8, 32);
        }
        for (const char* n :
             {"x_block.attn.ln_q", "x_block.attn.ln_k", "context_block.attn.ln_q", "context_block.attn.ln_k"})
            t.push_back({prefix + p + n + ".weight", {4}, "BF16", 1});
        if (b == 0) {
            linear(p + "x_block.attn2.qkv", 24, 8);
            linear(p + "x_block.attn2.proj", 8, 8);
            t.push_back({prefix + p + "x_block.attn2.ln_q.weight", {4}, "BF16", 1});
            t.push_back({prefix + p + "x_block.attn2.ln_k.weight", {4}, "BF16", 1});
        }
    }
    linear("final_layer.linear", 16, 8);
    linear("final_layer.adaLN_modulation.1", 16, 8);
    return t;
}

// The same transformer in diffusers' names, as SD3Transformer2DModel's config implies them.
std::map<std::string, std::vector<int64_t>> diffusers_sd3() {
    std::map<std::string, std::vector<int64_t>> m;
    const auto linear = [&](const std::string& name, int64_t out, int64_t in) {
        m[name + ".weight"] = {out, in};
        m[name + ".bias"] = {out};
    };
    m["pos_embed.pos_embed"] = {1, 16, 8};
    m["pos_embed.proj.weight"] = {8, 4, 2, 2};
    m["pos_embed.proj.bias"] = {8};
    linear("context_embedder", 8, 12);
    linear("time_text_embed.timestep_embedder.linear_1", 8, 256);
    linear("time_text_embed.timestep_embedder.linear_2", 8, 8);
    linear("time_text_embed.text_embedder.linear_1", 8, 16);
    linear("time_text_embed.text_embedder.linear_2", 8, 8);
    for (int b = 0; b < 2; ++b) {
        const std::string p = "transformer_blocks." + std::to_string(b) + ".";
        const bool last = b == 1;
        for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                              "attn.add_v_proj", "attn.to_out.0"})
            linear(p + n, 8, 8);
        linear(p + "norm1.linear", b == 0 ? 72 : 48, 8);
        linear(p + "norm1_context.linear", last ? 16 : 48, 8);
        linear(p + "ff.net.0.proj", 32, 8);
        linear(p + "ff.net.2", 8, 32);
        if (!last) {
            linear(p + "attn.to_add_out", 8, 8);
            linear(p + "ff_context.net.0.proj", 32, 8);
            linear(p + "ff_context.net.2", 8, 32);
        }
        for (const char* n : {"attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"})
            m[p + n + ".weight"] = {4};
        if (b == 0) {
            for (const char* n : {"attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"})
                linear(p + n, 8, 8);
            m[p + "attn2.norm_q.weight"] = {4};
            m[p + "attn2.norm_k.weight"] = {4};
        }
    }
    linear("proj_out", 16, 8);
    linear("norm_out.linear", 16, 8);
    return m;
}

SingleFileLayout sd3_layout_of(const std::string& path, const std::string& component = "transformer") {
    return read_single_file_layout(*SafetensorsFile::open(path), family_spec("sd3"), component);
}

}  // namespace

TEST_CASE(
    "SD3 in Stability AI's layout: q, k, v in equal thirds, the last context and final modulations' halves "
    "swapped") {
    const std::string path =
        dp::test::write_st_file(path_of("sd35.safetensors"), stability_sd3("model.diffusion_model."));
    const SingleFileLayout l = sd3_layout_of(path);
    CHECK(l.layout == "Stability AI's original (SD3)");
    CHECK(l.prefix == "model.diffusion_model.");
    const std::string p = "model.diffusion_model.";
    CHECK(l.tensors.at("pos_embed.pos_embed").tensor == p + "pos_embed");
    CHECK(l.tensors.at("pos_embed.proj.weight").tensor == p + "x_embedder.proj.weight");
    CHECK(l.tensors.at("transformer_blocks.0.attn.to_q.weight").rows == Rows{{0, 8}});
    CHECK(l.tensors.at("transformer_blocks.0.attn.to_v.bias").rows == Rows{{16, 8}});
    CHECK(l.tensors.at("transformer_blocks.1.attn.add_k_proj.weight").tensor ==
          p + "joint_blocks.1.context_block.attn.qkv.weight");
    CHECK(l.tensors.at("transformer_blocks.1.attn.add_k_proj.weight").rows == Rows{{8, 8}});
    CHECK(l.tensors.at("transformer_blocks.0.attn2.to_k.weight").tensor ==
          p + "joint_blocks.0.x_block.attn2.qkv.weight");
    CHECK(l.tensors.at("transformer_blocks.0.attn2.norm_q.weight").tensor ==
          p + "joint_blocks.0.x_block.attn2.ln_q.weight");
    CHECK(l.tensors.at("transformer_blocks.0.attn.norm_added_k.weight").tensor ==
          p + "joint_blocks.0.context_block.attn.ln_k.weight");
    // Only the last block's context modulation is stored shift first; the others as diffusers.
    CHECK(l.tensors.at("transformer_blocks.0.norm1_context.linear.weight").rows.empty());
    CHECK(l.tensors.at("transformer_blocks.1.norm1_context.linear.weight").rows == Rows{{8, 8}, {0, 8}});
    CHECK(l.tensors.at("transformer_blocks.1.norm1_context.linear.bias").rows == Rows{{8, 8}, {0, 8}});
    CHECK(l.tensors.at("norm_out.linear.weight").rows == Rows{{8, 8}, {0, 8}});
    CHECK(l.tensors.at("time_text_embed.text_embedder.linear_1.weight").tensor ==
          p + "y_embedder.mlp.0.weight");
    CHECK(single_file_problem(l, diffusers_sd3()).empty());
    // The model it names: 3.5 medium (the second attention).
    CHECK(shipped_config_for(path) == "sd3.5-medium");
    // A block missing is named in the file's own names.
    std::vector<StTensor> without;
    for (const StTensor& t : stability_sd3(p))
        if (t.name.find("joint_blocks.0.") == std::string::npos) without.push_back(t);
    const std::string missing = single_file_problem(
        sd3_layout_of(dp::test::write_st_file(path_of("sd35_missing.safetensors"), without)),
        diffusers_sd3());
    CHECK(missing.find(p + "joint_blocks.0 (transformer_blocks.0.") != std::string::npos);
    // q, k, v rows that are no three equal parts.
    std::vector<StTensor> odd = stability_sd3("");
    for (StTensor& t : odd)
        if (t.name == "joint_blocks.0.x_block.attn.qkv.weight") t.shape = {25, 8};
    CHECK_THROWS_WITH_AS(sd3_layout_of(dp::test::write_st_file(path_of("sd35_odd.safetensors"), odd)),
                         doctest::Contains("not 3 equal fused parts"), dp::protocol::ModelError);
}

TEST_CASE("a whole SD3 pipeline in one file: each component from its own prefix") {
    std::vector<StTensor> t = stability_sd3("model.diffusion_model.");
    const std::string l = "text_encoders.clip_l.transformer.", g = "text_encoders.clip_g.transformer.",
                      t5 = "text_encoders.t5xxl.transformer.";
    for (const std::string& clip : {l, g}) {
        t.push_back({clip + "text_model.embeddings.token_embedding.weight", {10, 4}, "BF16", 0});
        t.push_back({clip + "text_model.embeddings.position_ids", {1, 7}, "BF16", 0});
        t.push_back({clip + "text_model.final_layer_norm.weight", {4}, "BF16", 0});
        t.push_back({clip + "text_projection.weight", {4, 4}, "BF16", 2});
    }
    t.push_back({t5 + "shared.weight", {10, 4}, "BF16", 0});
    t.push_back({t5 + "encoder.embed_tokens.weight", {10, 4}, "BF16", 0});
    t.push_back({t5 + "encoder.final_layer_norm.weight", {4}, "BF16", 0});
    t.push_back({"first_stage_model.decoder.mid.attn_1.q.weight", {4, 4, 1, 1}, "BF16", 0});
    t.push_back({"first_stage_model.decoder.mid.attn_1.norm.weight", {4}, "BF16", 0});
    t.push_back({"first_stage_model.decoder.up.0.block.0.nin_shortcut.weight", {4, 8, 1, 1}, "BF16", 0});
    const std::string path = dp::test::write_st_file(path_of("sd35_all.safetensors"), t);
    CHECK(bundled_components(path, family_spec("sd3")) ==
          std::vector<std::string>{"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"});
    // The transformer: its prefix's tensors alone.
    const SingleFileLayout tr = sd3_layout_of(path);
    CHECK(tr.prefix == "model.diffusion_model.");
    CHECK(single_file_problem(tr, diffusers_sd3()).empty());
    // CLIP-L: transformers' names, its projection the identity (not the file's), no position_ids.
    const SingleFileLayout clip_l = sd3_layout_of(path, "text_encoder");
    CHECK(clip_l.prefix == l);
    CHECK(clip_l.tensors.at("text_projection.weight").identity);
    CHECK(clip_l.shapes.at("text_projection.weight") == std::vector<int64_t>{4, 4});
    CHECK(clip_l.tensors.at("text_model.final_layer_norm.weight").tensor ==
          l + "text_model.final_layer_norm.weight");
    CHECK(clip_l.tensors.count("text_model.embeddings.position_ids") == 0);
    CHECK(clip_l.format == "bf16");
    // CLIP-G keeps the file's projection.
    const SingleFileLayout clip_g = sd3_layout_of(path, "text_encoder_2");
    CHECK(clip_g.tensors.at("text_projection.weight").tensor == g + "text_projection.weight");
    // T5: the embedding once.
    const SingleFileLayout t5l = sd3_layout_of(path, "text_encoder_3");
    CHECK(t5l.tensors.at("shared.weight").tensor == t5 + "shared.weight");
    CHECK(t5l.tensors.count("encoder.embed_tokens.weight") == 0);
    // The VAE in the original layout: the attention's 1x1 convolutions as linear weights.
    const SingleFileLayout vae = sd3_layout_of(path, "vae");
    CHECK(vae.layout == "the original latent-diffusion VAE");
    CHECK(vae.tensors.at("decoder.mid_block.attentions.0.to_q.weight").squeeze);
    CHECK(vae.shapes.at("decoder.mid_block.attentions.0.to_q.weight") == std::vector<int64_t>{4, 4});
    CHECK(vae.tensors.at("decoder.mid_block.attentions.0.group_norm.weight").tensor ==
          "first_stage_model.decoder.mid.attn_1.norm.weight");
    CHECK(vae.tensors.at("decoder.up_blocks.0.resnets.0.conv_shortcut.weight").tensor ==
          "first_stage_model.decoder.up.0.block.0.nin_shortcut.weight");
    CHECK(!vae.tensors.at("decoder.up_blocks.0.resnets.0.conv_shortcut.weight").squeeze);
    // A file with the transformer alone gives no other component; a bundle without one names what it holds.
    CHECK(bundled_components(dp::test::write_st_file(path_of("sd35_only.safetensors"),
                                                     stability_sd3("model.diffusion_model.")),
                             family_spec("sd3"))
              .empty());
    std::vector<StTensor> no_t5;
    for (const StTensor& x : t)
        if (x.name.rfind(t5, 0) != 0) no_t5.push_back(x);
    const std::string partial = dp::test::write_st_file(path_of("sd35_no_t5.safetensors"), no_t5);
    CHECK_THROWS_WITH_AS(
        sd3_layout_of(partial, "text_encoder_3"),
        doctest::Contains(
            "holds no text_encoder_3 (it holds text_encoder, text_encoder_2, transformer, vae)"),
        dp::protocol::ModelError);
}

TEST_CASE(
    "the original VAE layout maps as diffusers' converter maps it: reversed up blocks, samplers, 1x1 "
    "attention") {
    // scripts/golden/golden_sd3_single_file.py: a two-block AutoencoderKL in the original layout,
    // each tensor with the diffusers name diffusers' convert_ldm_vae_checkpoint gave it.
    std::ifstream in(std::string(DP_GOLDEN_DIR) + "/sd3_single_file/vae_ldm_2blocks.json");
    const nlohmann::json golden = nlohmann::json::parse(in);
    std::vector<StTensor> tensors;
    for (const auto& [name, t] : golden.at("tensors").items())
        tensors.push_back(
            {"first_stage_model." + name, t.at("shape").get<std::vector<int64_t>>(), "BF16", 0});
    tensors.push_back({"model.diffusion_model.pos_embed", {1, 4, 8}, "BF16", 0});
    const SingleFileLayout l =
        sd3_layout_of(dp::test::write_st_file(path_of("vae2.safetensors"), tensors), "vae");
    int checked = 0, squeezed = 0;
    for (const auto& [name, t] : golden.at("tensors").items()) {
        CAPTURE(name);
        const std::string diffusers = t.at("diffusers").get<std::string>();
        REQUIRE(l.tensors.count(diffusers) == 1);
        CHECK(l.tensors.at(diffusers).tensor == "first_stage_model." + name);
        const std::vector<int64_t> shape = t.at("shape").get<std::vector<int64_t>>();
        const bool conv_as_linear = l.tensors.at(diffusers).squeeze;
        squeezed += conv_as_linear;
        CHECK(l.shapes.at(diffusers) == (conv_as_linear ? std::vector<int64_t>{shape[0], shape[1]} : shape));
        ++checked;
    }
    CHECK(checked == static_cast<int>(golden.at("tensors").size()));
    CHECK(l.tensors.size() == golden.at("tensors").size());
    CHECK(squeezed == 8);  // q, k, v and the projection out of the encoder's and the decoder's attention
}
