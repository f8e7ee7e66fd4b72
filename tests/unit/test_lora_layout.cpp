// Adapter files as the launcher reads them (strategies/lora.h): which weights each format's keys
// change, with which rows and alpha, and every way a file can be wrong, refused before a rank
// starts. The files are written here byte by byte (a safetensors header and zeros, the alphas'
// bytes), and the model is a map of weight shapes, so each expectation is stated independently of
// the reader.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "protocol/call_arguments.h"
#include "protocol/errors.h"
#include "protocol/job_file.h"
#include "strategies/cost_model.h"
#include "strategies/family.h"
#include "strategies/lora.h"
#include "strategies/parallel_spec.h"
#include "unit/st_writer.h"

using namespace dp::strategies;

namespace {

std::string scratch_file(const std::string& name) { return dp::test::scratch_path("lora_layout", name); }

using T = dp::test::StTensor;

// A safetensors file of `tensors` (their elements all `value`), with `metadata`.
std::string write_file(const std::string& name, const std::vector<T>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, std::size_t cut = 0) {
    return dp::test::write_st_file(scratch_file(name), tensors, metadata, cut);
}

// A FLUX.1-like model: width 8, two double blocks and two single blocks, an MLP of 32.
ModelTensors flux_model() {
    ModelTensors m;
    auto& t = m["transformer"];
    for (int b : {0, 1}) {
        const std::string p = "transformer_blocks." + std::to_string(b) + ".";
        for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                              "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"})
            t[p + n + ".weight"] = {8, 8};
        t[p + "ff.net.0.proj.weight"] = {32, 8};
        t[p + "ff.net.2.weight"] = {8, 32};
        t[p + "norm1.linear.weight"] = {48, 8};
        const std::string s = "single_transformer_blocks." + std::to_string(b) + ".";
        for (const char* n : {"attn.to_q", "attn.to_k", "attn.to_v"}) t[s + n + ".weight"] = {8, 8};
        t[s + "proj_mlp.weight"] = {32, 8};
        t[s + "proj_out.weight"] = {8, 40};
        t[s + "norm.linear.weight"] = {24, 8};
    }
    t["norm_out.linear.weight"] = {16, 8};
    m["text_encoder"]["text_model.encoder.layers.0.self_attn.q_proj.weight"] = {4, 4};
    return m;
}

const LoraTerm& term(const LoraLayout& l, const std::string& weight) {
    for (const LoraTerm& t : l.terms)
        if (t.weight == weight) return t;
    FAIL("no term changes " << weight);
    return l.terms.front();
}

std::string error_of(const std::string& path, const ParallelSpec& spec, const ModelTensors& model,
                     int* code = nullptr) {
    try {
        read_lora_layout(path, spec, model);
    } catch (const dp::protocol::Error& e) {
        if (code) *code = e.exit_code();
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("a diffusers/PEFT adapter: each pair changes its weight, alpha / r from the header's metadata") {
    const nlohmann::json meta = {{"transformer.r", 4},
                                 {"transformer.lora_alpha", 8},
                                 {"transformer.alpha_pattern", {{"^transformer_blocks.1.attn.to_q", 2}}},
                                 {"text_encoder.r", 2},
                                 {"text_encoder.lora_alpha", 1}};
    const std::string path =
        write_file("peft.safetensors",
                   {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", {4, 8}},
                    {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", {8, 4}},
                    {"transformer.transformer_blocks.1.attn.to_q.lora_A.weight", {4, 8}},
                    {"transformer.transformer_blocks.1.attn.to_q.lora_B.weight", {8, 4}},
                    // transformers 5's bare CLIPTextModel names (no text_model.), files with them
                    {"text_encoder.encoder.layers.0.self_attn.q_proj.lora_A.weight", {2, 4}},
                    {"text_encoder.encoder.layers.0.self_attn.q_proj.lora_B.weight", {4, 2}}},
                   {{"format", "pt"}, {"lora_adapter_metadata", meta.dump()}});
    const LoraLayout l = read_lora_layout(path, family_spec("flux"), flux_model());
    CHECK(l.format == "diffusers/PEFT");
    REQUIRE(l.terms.size() == 3);
    const LoraTerm& q0 = term(l, "transformer_blocks.0.attn.to_q.weight");
    CHECK(q0.component == "transformer");
    CHECK(q0.down == "transformer.transformer_blocks.0.attn.to_q.lora_A.weight");
    CHECK(q0.up == "transformer.transformer_blocks.0.attn.to_q.lora_B.weight");
    CHECK(q0.rank == 4);
    CHECK(q0.alpha_scale == doctest::Approx(2.0));  // 8 / 4
    CHECK(q0.up_rows.empty());
    CHECK(term(l, "transformer_blocks.1.attn.to_q.weight").alpha_scale ==
          doctest::Approx(0.5));  // pattern: 2 / 4
    const LoraTerm& clip = term(l, "text_model.encoder.layers.0.self_attn.q_proj.weight");
    CHECK(clip.component == "text_encoder");
    CHECK(clip.alpha_scale == doctest::Approx(0.5));  // 1 / 2
}

TEST_CASE("without metadata an adapter's alpha is its rank, as diffusers loads it") {
    const std::string path =
        write_file("bare.safetensors", {{"transformer.transformer_blocks.0.ff.net.2.lora_A.weight", {3, 32}},
                                        {"transformer.transformer_blocks.0.ff.net.2.lora_B.weight", {8, 3}}});
    const LoraLayout l = read_lora_layout(path, family_spec("flux"), flux_model());
    REQUIRE(l.terms.size() == 1);
    CHECK(l.terms[0].alpha_scale == 1.0);
    CHECK(l.terms[0].rank == 3);
}

TEST_CASE("a kohya FLUX.1 adapter in Black Forest Labs' names: fused projections take row ranges of one up") {
    const std::string path =
        write_file("kohya.safetensors",
                   {{"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", {4, 8}},
                    {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", {24, 4}},
                    {"lora_unet_double_blocks_0_img_attn_qkv.alpha", {}, "F32", 2.0f},
                    {"lora_unet_double_blocks_1_txt_attn_qkv.lora_down.weight", {2, 8}},
                    {"lora_unet_double_blocks_1_txt_attn_qkv.lora_up.weight", {24, 2}},
                    {"lora_unet_double_blocks_1_txt_attn_qkv.alpha", {}, "BF16", 3.0f},
                    {"lora_unet_single_blocks_1_linear1.lora_down.weight", {4, 8}},
                    {"lora_unet_single_blocks_1_linear1.lora_up.weight", {56, 4}},
                    {"lora_unet_single_blocks_0_linear2.lora_down.weight", {4, 40}},
                    {"lora_unet_single_blocks_0_linear2.lora_up.weight", {8, 4}},
                    {"lora_unet_double_blocks_0_img_mlp_0.lora_down.weight", {4, 8}},
                    {"lora_unet_double_blocks_0_img_mlp_0.lora_up.weight", {32, 4}},
                    {"lora_unet_final_layer_adaLN_modulation_1.lora_down.weight", {4, 8}},
                    {"lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", {16, 4}},
                    {"lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", {2, 4}},
                    {"lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight", {4, 2}}});
    const LoraLayout l = read_lora_layout(path, family_spec("flux"), flux_model());
    CHECK(l.format == "kohya (FLUX.1)");
    CHECK(l.terms.size() == 3 + 3 + 4 + 1 + 1 + 1 + 1);
    using Rows = std::vector<std::pair<int64_t, int64_t>>;
    CHECK(term(l, "transformer_blocks.0.attn.to_q.weight").up_rows == Rows{{0, 8}});
    CHECK(term(l, "transformer_blocks.0.attn.to_k.weight").up_rows == Rows{{8, 8}});
    CHECK(term(l, "transformer_blocks.0.attn.to_v.weight").up_rows == Rows{{16, 8}});
    CHECK(term(l, "transformer_blocks.0.attn.to_v.weight").down ==
          "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight");
    CHECK(term(l, "transformer_blocks.0.attn.to_q.weight").alpha_scale == doctest::Approx(0.5));  // 2 / 4
    CHECK(term(l, "transformer_blocks.1.attn.add_k_proj.weight").up_rows == Rows{{8, 8}});
    CHECK(term(l, "transformer_blocks.1.attn.add_k_proj.weight").alpha_scale ==
          doctest::Approx(1.5));  // 3 / 2
    CHECK(term(l, "single_transformer_blocks.1.proj_mlp.weight").up_rows == Rows{{24, 32}});
    CHECK(term(l, "single_transformer_blocks.0.proj_out.weight").up_rows.empty());
    CHECK(term(l, "transformer_blocks.0.ff.net.0.proj.weight").alpha_scale == 1.0);  // no alpha: its rank
    // (shift, scale) in the original layout, (scale, shift) in diffusers': the up halves swap.
    CHECK(term(l, "norm_out.linear.weight").up_rows == Rows{{8, 8}, {0, 8}});
    CHECK(term(l, "text_model.encoder.layers.0.self_attn.q_proj.weight").component == "text_encoder");
}

TEST_CASE("an adapter file that cannot run is refused naming the file and what is wrong") {
    const ParallelSpec& flux = family_spec("flux");
    const ModelTensors model = flux_model();
    int code = 0;
    SUBCASE("missing: 66") {
        const std::string why = error_of(scratch_file("nowhere.safetensors"), flux, model, &code);
        CHECK(code == 66);
        CHECK(why.find("nowhere.safetensors") != std::string::npos);
    }
    SUBCASE("truncated: 65") {
        const std::string path =
            write_file("cut.safetensors",
                       {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", {4, 8}},
                        {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", {8, 4}}},
                       {}, 10);
        const std::string why = error_of(path, flux, model, &code);
        CHECK(code == 65);
        CHECK(why.find("cut.safetensors") != std::string::npos);
    }
    SUBCASE("not safetensors at all") {
        const std::string path = scratch_file("text.safetensors");
        std::ofstream(path) << "this is not an adapter";
        CHECK(!error_of(path, flux, model, &code).empty());
        CHECK(code == 65);
    }
    SUBCASE("DoRA, LoKr and LoHa by name") {
        for (const auto& [key, format] : std::vector<std::pair<std::string, std::string>>{
                 {"lora_unet_double_blocks_0_img_attn_qkv.dora_scale", "DoRA"},
                 {"lora_unet_double_blocks_0_img_attn_qkv.lokr_w1", "LoKr"},
                 {"lora_unet_double_blocks_0_img_attn_qkv.hada_w1_a", "LoHa"}}) {
            const std::string path = write_file("other.safetensors", {{key, {4, 8}}});
            const std::string why = error_of(path, flux, model, &code);
            CHECK_MESSAGE(why.find(format) != std::string::npos, why);
            CHECK(code == 65);
        }
    }
    SUBCASE("keys of another family: the first are named, and the family it looks made for") {
        const std::string path =
            write_file("qwen.safetensors",
                       {{"transformer.transformer_blocks.0.img_mlp.net.0.proj.lora_A.weight", {4, 8}},
                        {"transformer.transformer_blocks.0.img_mlp.net.0.proj.lora_B.weight", {32, 4}}});
        const std::string why = error_of(path, flux, model, &code);
        CHECK(code == 65);
        CHECK(why.find("img_mlp.net.0.proj") != std::string::npos);
        CHECK(why.find("looks made for Qwen-Image") != std::string::npos);
    }
    SUBCASE("a shape that does not fit its weight (another size of the model)") {
        const std::string path = write_file(
            "wide.safetensors", {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", {4, 16}},
                                 {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", {16, 4}}});
        const std::string why = error_of(path, flux, model, &code);
        CHECK(code == 65);
        CHECK(why.find("[8, 8]") != std::string::npos);
    }
    SUBCASE("a pair whose ranks disagree, and a lone half") {
        const std::string path = write_file(
            "odd.safetensors", {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", {4, 8}},
                                {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", {8, 3}}});
        CHECK(error_of(path, flux, model).find("no LoRA pair") != std::string::npos);
        const std::string lone = write_file(
            "lone.safetensors", {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", {4, 8}}});
        CHECK(error_of(lone, flux, model).find("lora_A") != std::string::npos);
    }
    SUBCASE("an alpha that is not finite") {
        const std::string path =
            write_file("nan.safetensors", {{"lora_unet_double_blocks_0_img_mlp_0.lora_down.weight", {4, 8}},
                                           {"lora_unet_double_blocks_0_img_mlp_0.lora_up.weight", {32, 4}},
                                           {"lora_unet_double_blocks_0_img_mlp_0.alpha", {}, "F32", NAN}});
        CHECK(error_of(path, flux, model).find("not a finite number") != std::string::npos);
    }
}

TEST_CASE("the flag's PATH:SCALE and a prompt line's lora key read as the call-argument table says") {
    using namespace dp::protocol;
    Adapter a;
    CHECK(parse_adapter_text("style.safetensors", a).empty());
    CHECK(a.path == "style.safetensors");
    CHECK(a.scale == 1.0);
    CHECK(parse_adapter_text("/x/y.safetensors:0.75", a).empty());
    CHECK(a.path == "/x/y.safetensors");
    CHECK(a.scale == 0.75);
    CHECK(parse_adapter_text("dir:with:colons/a.safetensors", a).empty());  // no number after the last ':'
    CHECK(a.path == "dir:with:colons/a.safetensors");
    CHECK(a.scale == 1.0);
    CHECK(parse_adapter_text("a.safetensors:-0.5", a).empty());
    CHECK(a.scale == -0.5);
    CHECK(!parse_adapter_text(":0.5", a).empty());

    const CallArgument& row = *find_call_argument("lora");
    CallValue v;
    CHECK(read_call_value(row, nlohmann::json("a.safetensors"), v).empty());
    CHECK(std::get<Adapters>(v) == Adapters{{"a.safetensors", 1.0, ""}});
    CHECK(read_call_value(
              row, nlohmann::json::parse(R"([{"path": "a.safetensors", "scale": 0.5}, "b.safetensors"])"), v)
              .empty());
    CHECK(std::get<Adapters>(v) == Adapters{{"a.safetensors", 0.5, ""}, {"b.safetensors", 1.0, ""}});
    CHECK(read_call_value(row, nlohmann::json::array(), v).empty());
    CHECK(std::get<Adapters>(v).empty());
    for (const char* bad :
         {R"(3)", R"({"scale": 1})", R"({"path": "a", "weight": 1})", R"({"path": "a", "scale": "x"})",
          R"({"path": ""})", R"([["a"]])", R"({"path": "a", "sha256": "XYZ"})"})
        CHECK_MESSAGE(!read_call_value(row, nlohmann::json::parse(bad), v).empty(), bad);
    // JSON out and back: the job file's and the manifest's form
    const Adapters with_hash{{"/m/a.safetensors", 0.5, std::string(64, 'a')}};
    const nlohmann::json j = call_value_json(with_hash);
    CHECK(j[0]["sha256"] == std::string(64, 'a'));
    CHECK(read_call_value(row, j, v).empty());
    CHECK(std::get<Adapters>(v) == with_hash);
}

TEST_CASE("the queue keeps each adapter set's prompts together, so a replica switches once per set") {
    using namespace dp::protocol;
    std::vector<JobRequest> requests(6);
    const Adapters a{{"a.safetensors", 1.0, ""}}, b{{"b.safetensors", 1.0, ""}};
    for (std::size_t i = 0; i < requests.size(); ++i) {
        requests[i].index = static_cast<int64_t>(i);
        requests[i].arguments.set("lora", i % 2 ? b : a);
    }
    const std::vector<std::size_t> order{0, 1, 2, 3, 4, 5};
    CHECK(grouped_by_adapters(requests, order) == std::vector<std::size_t>{0, 2, 4, 1, 3, 5});
    CHECK(grouped_by_adapters(requests, {5, 4, 3, 2, 1, 0}) == std::vector<std::size_t>{5, 3, 1, 4, 2, 0});
    const auto units = work_units(requests, grouped_by_adapters(requests, order), 8);
    REQUIRE(units.size() == 2);  // a batch never mixes two sets
    CHECK(units[0] == std::vector<std::size_t>{0, 2, 4});
    for (JobRequest& r : requests) r.arguments.set("lora", a);
    CHECK(grouped_by_adapters(requests, order) == order);
}

namespace {

// A safetensors file whose header is `header` as written (a key may be given twice), with
// `data_bytes` zero bytes after it.
std::string write_raw_file(const std::string& name, const std::string& header, std::size_t data_bytes) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
        bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    std::ofstream(scratch_file(name), std::ios::binary) << bytes << header << std::string(data_bytes, '\0');
    return scratch_file(name);
}

const std::string kQ = "transformer.transformer_blocks.0.attn.to_q";

}  // namespace

TEST_CASE("a header with a key given twice is refused, naming the key and the file, as safetensors does") {
    const std::string entry = R"({"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 128]})";
    const std::string up = R"({"dtype": "F32", "shape": [8, 4], "data_offsets": [128, 256]})";
    struct Row {
        const char* name;
        std::string header;
        std::string key;
    };
    const std::vector<Row> rows = {
        {"tensor_twice",
         "{\"" + kQ + ".lora_A.weight\": " + entry + ", \"" + kQ + ".lora_B.weight\": " + up + ", \"" + kQ +
             ".lora_A.weight\": " + entry + "}",
         kQ + ".lora_A.weight"},
        {"dtype_twice",
         "{\"" + kQ +
             R"(.lora_A.weight": {"dtype": "F32", "dtype": "F16", "shape": [4, 8], "data_offsets": [0, 128]}, ")" +
             kQ + ".lora_B.weight\": " + up + "}",
         "dtype"},
        {"metadata_twice",
         "{\"__metadata__\": {\"format\": \"pt\", \"format\": \"tf\"}, \"" + kQ +
             ".lora_A.weight\": " + entry + ", \"" + kQ + ".lora_B.weight\": " + up + "}",
         "format"},
    };
    for (const Row& row : rows) {
        CAPTURE(row.name);
        const std::string path = write_raw_file(std::string(row.name) + ".safetensors", row.header, 256);
        int code = 0;
        const std::string why = error_of(path, family_spec("flux"), flux_model(), &code);
        CHECK(code == 65);
        CHECK_MESSAGE(why.find(path) != std::string::npos, why);
        CHECK_MESSAGE(why.find("key '" + row.key + "' is given twice") != std::string::npos, why);
    }
    // The same header with each key once is read.
    const std::string once = write_raw_file(
        "once.safetensors",
        "{\"" + kQ + ".lora_A.weight\": " + entry + ", \"" + kQ + ".lora_B.weight\": " + up + "}", 256);
    CHECK(error_of(once, family_spec("flux"), flux_model()).empty());
}

TEST_CASE("an adapter the reader would have misread is refused, naming the file and what is ambiguous") {
    const ParallelSpec& flux = family_spec("flux");
    const ModelTensors model = flux_model();
    const std::vector<T> pair = {{kQ + ".lora_A.weight", {4, 8}}, {kQ + ".lora_B.weight", {8, 4}}};
    const auto with = [&](std::vector<T> more) {
        more.insert(more.begin(), pair.begin(), pair.end());
        return more;
    };
    const auto peft = [](const nlohmann::json& meta) {
        return std::map<std::string, std::string>{{"lora_adapter_metadata", meta.dump()}};
    };
    struct Row {
        const char* name;
        std::vector<T> tensors;
        std::map<std::string, std::string> metadata;
        std::vector<std::string> says;  // empty: it is read
    };
    const std::vector<Row> rows = {
        {"two_styles",
         with({{kQ + ".lora_down.weight", {4, 8}}, {kQ + ".lora_up.weight", {8, 4}}}),
         {},
         {"layer '" + kQ + "'", "lora_A/lora_B", "lora_down/lora_up"}},
        {"mixed_halves",
         {{kQ + ".lora_A.weight", {4, 8}}, {kQ + ".lora_up.weight", {8, 4}}},
         {},
         {"layer '" + kQ + "'", "lora_A/lora_B", "lora_down/lora_up"}},
        {"older_and_peft",
         with({{kQ + ".lora.down.weight", {4, 8}}, {kQ + ".lora.up.weight", {8, 4}}}),
         {},
         {"lora.down/lora.up", "lora_A/lora_B"}},
        {"rslora_yes",
         pair,
         peft({{"transformer.use_rslora", "yes"}}),
         {"'transformer.use_rslora' is \"yes\"", "expected true or false"}},
        {"rslora_number", pair, peft({{"transformer.use_rslora", 1}}), {"'transformer.use_rslora' is 1"}},
        {"rslora_null", pair, peft({{"transformer.use_rslora", nullptr}}), {"is null"}},
        {"dora_yes", pair, peft({{"transformer.use_dora", "yes"}}), {"'transformer.use_dora' is \"yes\""}},
        {"rslora_text_false", pair, peft({{"transformer.use_rslora", "false"}}), {}},
        {"rslora_python_false", pair, peft({{"transformer.use_rslora", "False"}}), {}},
    };
    for (const Row& row : rows) {
        CAPTURE(row.name);
        const std::string path =
            write_file(std::string(row.name) + ".safetensors", row.tensors, row.metadata);
        int code = 0;
        const std::string why = error_of(path, flux, model, &code);
        if (row.says.empty()) {
            CHECK_MESSAGE(why.empty(), why);
            continue;
        }
        CHECK(code == 65);
        CHECK_MESSAGE(why.find(path) != std::string::npos, why);
        for (const std::string& s : row.says) CHECK_MESSAGE(why.find(s) != std::string::npos, why);
    }
}

TEST_CASE("use_rslora as true, \"true\" or \"True\" scales by alpha / sqrt(rank), as peft does") {
    for (const nlohmann::json& on : {nlohmann::json(true), nlohmann::json("true"), nlohmann::json("True")}) {
        CAPTURE(on.dump());
        const std::string path = write_file(
            "rslora.safetensors", {{kQ + ".lora_A.weight", {4, 8}}, {kQ + ".lora_B.weight", {8, 4}}},
            {{"lora_adapter_metadata",
              nlohmann::json{
                  {"transformer.r", 4}, {"transformer.lora_alpha", 8}, {"transformer.use_rslora", on}}
                  .dump()}});
        const LoraLayout l = read_lora_layout(path, family_spec("flux"), flux_model());
        REQUIRE(l.terms.size() == 1);
        CHECK(l.terms[0].alpha_scale == doctest::Approx(4.0));  // 8 / sqrt(4)
    }
}

TEST_CASE("an adapter holding NaN or an infinity is refused, naming the file, the tensor and the element") {
    struct Row {
        const char* dtype;
        float value;
        const char* says;  // nullptr: every value finite
    };
    const std::vector<Row> rows = {
        {"F32", NAN, "NaN"},
        {"F32", INFINITY, "an infinite value"},
        {"F32", -INFINITY, "an infinite value"},
        {"F16", NAN, "NaN"},
        {"F16", INFINITY, "an infinite value"},
        {"BF16", NAN, "NaN"},
        {"BF16", -INFINITY, "an infinite value"},
        {"F32", 65504.0f, nullptr},
        {"F16", 0.5f, nullptr},
        {"BF16", 1e30f, nullptr},
    };
    for (const Row& row : rows) {
        CAPTURE(row.dtype);
        CAPTURE(row.value);
        // The bad values in the up half only: each tensor of each pair is read.
        const std::string path =
            write_file("values.safetensors", {{kQ + ".lora_A.weight", {4, 8}, row.dtype, 0.25f},
                                              {kQ + ".lora_B.weight", {8, 4}, row.dtype, row.value}});
        const LoraLayout layout =
            read_lora_layout(path, family_spec("flux"), flux_model());  // the header is fine
        if (!row.says) {
            CHECK_NOTHROW(check_lora_values(layout));
            continue;
        }
        try {
            check_lora_values(layout);
            FAIL("accepted");
        } catch (const dp::protocol::ModelError& e) {
            const std::string why = e.what();
            CHECK_MESSAGE(why.find(path + ": tensor '" + kQ + ".lora_B.weight' holds " + row.says +
                                   " at element 0 of 32") != std::string::npos,
                          why);
            CHECK(e.exit_code() == 65);
        }
    }
    // One bad element past the first 4096 of a tensor otherwise finite: found, and named by its index.
    const std::string ff = "transformer.transformer_blocks.0.ff.net.2";
    dp::test::StBytes bytes = dp::test::st_bytes(
        {{ff + ".lora_A.weight", {200, 32}, "F32", 0.5f}, {ff + ".lora_B.weight", {8, 200}}}, {});
    const float nan = NAN;
    std::memcpy(&bytes.data[5000 * 4], &nan, 4);
    const std::string path = scratch_file("late.safetensors");
    std::ofstream(path, std::ios::binary) << bytes.header << bytes.data;
    CHECK_THROWS_WITH_AS(
        check_lora_values(read_lora_layout(path, family_spec("flux"), flux_model())),
        doctest::Contains(("'" + ff + ".lora_A.weight' holds NaN at element 5000 of 6400").c_str()),
        dp::protocol::ModelError);
}
