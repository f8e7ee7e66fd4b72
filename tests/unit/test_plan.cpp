#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/plan_command.h"
#include "launcher/job.h"
#include "strategies/model_sizes.h"
#include "strategies/step_traffic.h"
#include "unit/test_support.h"

namespace {

std::string plan(int world, std::vector<std::string> flags, bool json = false) {
    dp::launcher::LaunchSpec launch;
    launch.num_processes = world;
    dp::launcher::JobOptions job;
    job.model = dp::launcher::resolve_model("tiny-random-sd3", "--model");
    job.dtype = "fp32";  // the figures below are fp32's; auto would depend on this machine's GPUs
    job.width = 10;
    job.height = 9;
    for (std::size_t i = 0; i < flags.size(); ++i) {
        if (flags[i] == "--cfg-parallel") job.cfg_parallel = true;
        if (flags[i] == "--tp") job.tp = std::stoi(flags[++i]);
        if (flags[i] == "--ulysses") job.ulysses = std::stoi(flags[++i]);
        if (flags[i] == "--ring") job.ring = std::stoi(flags[++i]);
        if (flags[i] == "--strategy") job.strategy = flags[++i];
    }
    return dp::cli::describe_plan(launch, job, json);
}

nlohmann::json plan_json(int world, std::vector<std::string> flags) {
    return nlohmann::json::parse(plan(world, std::move(flags), /*json=*/true));
}

using dp::test::has;

}  // namespace

TEST_CASE("plan: the mesh, each rank's role and the sub-groups") {
    const std::string p = plan(4, {"--ulysses", "2", "--tp", "2"});
    CHECK(has(p, "world: 4 rank(s) on 1 node(s); mesh dp=1 cfg=1 ring=1 ulysses=2 tp=2\n"));
    CHECK(has(p, "  rank 0: dp 0, cfg 0, ring 0, ulysses 0, tp 0 -- all prompts, writes the images\n"));
    CHECK(has(p, "  rank 3: dp 0, cfg 0, ring 0, ulysses 1, tp 1 -- all prompts\n"));
    CHECK(has(p, "  ulysses: [0,2] [1,3]\n"));
    CHECK(has(p, "  tp: [0,1] [2,3]\n"));
    CHECK(
        has(p, "transformer: 2 blocks, width 32, 4 heads of 8; 10x9 px -> 90 image tokens, 78 text tokens"));
    // dp 2 x cfg 2: the first rank of each pair writes; the shares are the dp coordinate.
    const std::string cfg = plan(4, {"--cfg-parallel"});
    CHECK(has(cfg,
              "  rank 0: dp 0, cfg 0, ring 0, ulysses 0, tp 0 -- prompt share 0 of 2, negative branch, "
              "writes the images\n"));
    CHECK(
        has(cfg, "  rank 1: dp 0, cfg 1, ring 0, ulysses 0, tp 0 -- prompt share 0 of 2, positive branch\n"));
    CHECK(has(cfg,
              "  rank 2: dp 1, cfg 0, ring 0, ulysses 0, tp 0 -- prompt share 1 of 2, negative branch, "
              "writes the images\n"));
    CHECK(has(plan(2, {}), "  none (data parallelism only)\n"));

    // plan --json: the same mesh as data.
    const nlohmann::json j = plan_json(4, {"--ulysses", "2", "--tp", "2"});
    CHECK(j["world"]["ranks"] == 4);
    CHECK(j["world"]["mesh"] ==
          nlohmann::json{{"dp", 1}, {"cfg", 1}, {"ring", 1}, {"ulysses", 2}, {"tp", 2}});
    REQUIRE(j["ranks"].size() == 4);
    CHECK(j["ranks"][3] == nlohmann::json{{"rank", 3},
                                          {"dp", 0},
                                          {"cfg", 0},
                                          {"ring", 0},
                                          {"ulysses", 1},
                                          {"tp", 1},
                                          {"prompt_share", nullptr},
                                          {"branch", nullptr},
                                          {"writes_images", false}});
    CHECK(j["ranks"][0]["writes_images"] == true);
    CHECK(j["sub_groups"] == nlohmann::json{{"ulysses", {{0, 2}, {1, 3}}}, {"tp", {{0, 1}, {2, 3}}}});
    CHECK(j["prompt"]["image_tokens"] == 90);
    CHECK(j["prompt"]["text_tokens"] == 78);
    CHECK(j["model"]["transformer"]["heads"] == 4);
    const nlohmann::json c = plan_json(4, {"--cfg-parallel"});
    CHECK(c["ranks"][1]["branch"] == "positive");
    CHECK(c["ranks"][2]["prompt_share"] == 1);
    CHECK(plan_json(2, {})["sub_groups"].empty());
    CHECK(has(plan(3, {"--strategy", "context"}), "mesh dp=1 cfg=1 ring=3 ulysses=1 tp=1"));
}

TEST_CASE("plan: the transformer parameters tensor parallelism splits, in closed form") {
    // The tiny model (D = 32, MLP 4D, 2 blocks, the last one context-pre-only: no text output or
    // text MLP). Column-parallel: q, k, v and their text twins (weight D x D and bias D each), the
    // MLPs' first layers (4D x D and 4D), and AdaLN's modulations, gathered (6D x D and 6D per
    // stream, 2D x D and 2D for the last block's text); row-parallel: the weights of the attention
    // outputs (D x D) and of the MLPs' second layers (D x 4D). Everything else (516368 bytes in
    // all at fp32) stays whole.
    const long long D = 32, qkv = 6 * (D * D + D), up = 4 * D * D + 4 * D, out = D * D, down = 4 * D * D;
    const long long ada = 6 * D * D + 6 * D, ada_last = 2 * D * D + 2 * D;
    const long long split =
        (qkv + 2 * up + 2 * out + 2 * down + 2 * ada) + (qkv + up + out + down + ada + ada_last);
    const long long all = 516368 / 4;
    for (int tp : {1, 2, 4}) {
        CAPTURE(tp);
        const long long per_rank = (all - split + split / tp) * 4;
        const std::string p = plan(tp, {"--tp", std::to_string(tp)});
        CHECK(has(p, "(" + std::to_string(per_rank) + ") = "));
        CHECK(has(p, "(" + std::to_string((all - split) * 4) + ") replicated + "));
        CHECK(has(p, "(" + std::to_string(split * 4) + ") / tp " + std::to_string(tp) + "\n"));
        // plan --json gives the same figures as integers, and a rank's weights add up.
        const nlohmann::json j = plan_json(tp, {"--tp", std::to_string(tp)});
        CHECK(j["transformer_parameters"]["bytes_per_rank"] == per_rank);
        CHECK(j["transformer_parameters"]["replicated_bytes"] == (all - split) * 4);
        CHECK(j["transformer_parameters"]["tp_split_bytes"] == split * 4);
        long long sum = 0;
        for (const auto& w : j["weights_per_rank"]["components"]) {
            sum += w["bytes"].get<long long>();
            if (w["component"] == "transformer") CHECK(w["bytes"] == per_rank);
            CHECK(w["tp_share"] == (tp > 1 && w["component"] == "transformer"));
        }
        CHECK(j["weights_per_rank"]["bytes"] == sum);
    }
    CHECK(has(plan(2, {"--tp", "2"}), "(" + std::to_string((all - split + split / 2) * 4) + ") = "));
}

// --- the shipped config-only folders of real models, at real size ---------------------------------

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "launcher/job.h"
#include "protocol/errors.h"
#include "strategies/family.h"
#include "strategies/model_files.h"
#include "strategies/model_sizes.h"
#include "support/test_paths.h"

namespace {

nlohmann::json config_of(const std::string& model, const std::string& file) {
    return nlohmann::json::parse(dp::strategies::read_model_file(model + "/" + file));
}

long long linear(long long in, long long out, bool bias = true) { return in * out + (bias ? out : 0); }

// SD3Transformer2DModel's parameters from its config alone, by diffusers' layer list: the whole
// count, the part tensor parallelism splits (q, k, v of both streams and of attn2, the MLPs' first
// layers, weight and bias; the attention outputs' and MLPs' second layers' weights), and each
// block's count.
struct TransformerCounts {
    long long total = 0, split = 0;
    std::vector<long long> blocks;
};

TransformerCounts sd3_transformer_counts(const nlohmann::json& c) {
    const long long heads = c["num_attention_heads"], hd = c["attention_head_dim"], d = heads * hd;
    const long long layers = c["num_layers"], p = c["patch_size"], in = c["in_channels"];
    const long long out = c["out_channels"], max = c["pos_embed_max_size"];
    const bool qk = c["qk_norm"] == "rms_norm";
    std::set<long long> dual;
    for (const auto& i : c["dual_attention_layers"]) dual.insert(i.get<long long>());
    TransformerCounts t;
    t.total = max * max * d + linear(in * p * p, d) + linear(256, d) + linear(d, d) +
              linear(c["pooled_projection_dim"].get<long long>(), d) + linear(d, d) +
              linear(c["joint_attention_dim"].get<long long>(), d) + linear(d, 2 * d) +
              linear(d, p * p * out);
    for (long long i = 0; i < layers; ++i) {
        const bool last = i == layers - 1, two = dual.count(i) > 0;
        // AdaLN: 6 modulations (9 with attn2), the text's 6, or 2 in the last block (context pre-only).
        long long b = linear(d, (two ? 9 : 6) * d) + linear(d, (last ? 2 : 6) * d);
        long long s = b;  // split by output features and gathered
        b += 7 * linear(d, d) + (last ? 0 : linear(d, d)) + (qk ? 4 * hd : 0);  // q k v, add_q k v, outs
        s += 6 * linear(d, d) + d * d + (last ? 0 : d * d);
        if (two) {
            b += 4 * linear(d, d) + (qk ? 2 * hd : 0);
            s += 3 * linear(d, d) + d * d;
        }
        const long long mlp = linear(d, 4 * d) + linear(4 * d, d), mlp_split = linear(d, 4 * d) + 4 * d * d;
        b += (last ? 1 : 2) * mlp;
        s += (last ? 1 : 2) * mlp_split;
        t.blocks.push_back(b);
        t.total += b;
        t.split += s;
    }
    return t;
}

// CLIPTextModelWithProjection: embeddings, pre-LN layers, the final norm and a bias-free projection.
long long clip_counts(const nlohmann::json& c) {
    const long long h = c["hidden_size"], mlp = c["intermediate_size"];
    const long long layer = 4 * linear(h, h) + linear(h, mlp) + linear(mlp, h) + 2 * 2 * h;
    return c["vocab_size"].get<long long>() * h + c["max_position_embeddings"].get<long long>() * h +
           c["num_hidden_layers"].get<long long>() * layer + 2 * h + linear(h, c["projection_dim"], false);
}

// T5EncoderModel (gated-gelu, bias-free, RMS norms with a weight only; the relative position
// bias in the first layer alone; the token embedding once, tied): {total, the part tensor
// parallelism splits: every attention and feed-forward matrix}.
std::pair<long long, long long> t5_encoder_counts(const nlohmann::json& c) {
    const long long d = c["d_model"], inner = c["num_heads"].get<long long>() * c["d_kv"].get<long long>();
    const long long ff = c["d_ff"], layers = c["num_layers"];
    const long long matrices = 4 * d * inner + 3 * d * ff;
    const long long total =
        c["vocab_size"].get<long long>() * d + layers * (matrices + 2 * d) +
        c["relative_attention_num_buckets"].get<long long>() * c["num_heads"].get<long long>() + d;
    return {total, layers * matrices};
}

// AutoencoderKL: {decoder, encoder} (no quant convs: use_quant_conv and use_post_quant_conv off).
std::pair<long long, long long> vae_counts(const nlohmann::json& c) {
    std::vector<long long> ch;
    for (const auto& x : c["block_out_channels"]) ch.push_back(x.get<long long>());
    const long long per = c["layers_per_block"], latent = c["latent_channels"];
    const long long rgb_in = c["in_channels"], rgb_out = c["out_channels"];
    const auto conv = [](long long i, long long o, long long k) { return i * o * k * k + o; };
    const auto resnet = [&](long long i, long long o) {
        return 2 * i + conv(i, o, 3) + 2 * o + conv(o, o, 3) + (i != o ? conv(i, o, 1) : 0);
    };
    const long long top = ch.back();
    const long long mid = 2 * resnet(top, top) + 2 * top + 4 * linear(top, top);
    long long decoder = conv(latent, top, 3) + mid + 2 * ch.front() + conv(ch.front(), rgb_out, 3);
    long long prev = top;
    for (std::size_t i = 0; i < ch.size(); ++i) {
        const long long o = ch[ch.size() - 1 - i];
        for (long long r = 0; r <= per; ++r) decoder += resnet(r == 0 ? prev : o, o);
        if (i + 1 < ch.size()) decoder += conv(o, o, 3);
        prev = o;
    }
    long long encoder = conv(rgb_in, ch.front(), 3) + mid + 2 * top + conv(top, 2 * latent, 3);
    prev = ch.front();
    for (std::size_t i = 0; i < ch.size(); ++i) {
        for (long long r = 0; r < per; ++r) encoder += resnet(r == 0 ? prev : ch[i], ch[i]);
        if (i + 1 < ch.size()) encoder += conv(ch[i], ch[i], 3);
        prev = ch[i];
    }
    return {decoder, encoder};
}

long long sum_counts(const std::map<std::string, int64_t>& counts, const std::string& prefix = "") {
    long long n = 0;
    for (const auto& [name, count] : counts)
        if (name.rfind(prefix, 0) == 0) n += count;
    return n;
}

const char* const kConfigOnly[] = {"sd3-medium", "sd3.5-medium", "sd3.5-large"};

std::string plan_of(const std::string& model, int tp, const std::vector<std::string>& flags = {}) {
    dp::launcher::LaunchSpec launch;
    launch.num_processes = tp;
    dp::launcher::JobOptions job;
    job.model = model;
    job.dtype = "bf16";
    job.tp = tp;
    for (std::size_t i = 0; i < flags.size(); ++i) {
        if (flags[i] == "--no-t5") job.no_t5 = true;
        if (flags[i] == "--max-sequence-length")
            job.arguments.set("max_sequence_length", int64_t{std::stoi(flags[++i])});
    }
    return dp::cli::describe_plan(launch, job);
}

std::string bytes_in(long long n) { return "(" + std::to_string(n) + ")"; }

// `check` on each config-only folder, with its transformer's config and closed-form counts.
template <class Check>
void for_config_only(Check check) {
    for (const char* name : kConfigOnly) {
        CAPTURE(name);
        const std::string model = dp::launcher::resolve_model(name, "--model");
        const nlohmann::json tc = config_of(model, "transformer/config.json");
        check(model, tc, sd3_transformer_counts(tc));
    }
}

}  // namespace

TEST_CASE("config-only folders: every tensor manifest agrees with its config, in closed form") {
    // A manifest left behind when a config changes (scripts/models/make_config_folders.py writes
    // both) disagrees here: with the total, a block's count, or the tensors a setting adds.
    for_config_only([](const std::string& model, const nlohmann::json& tc, const TransformerCounts& t) {
        const auto transformer = dp::strategies::tensor_element_counts(model + "/transformer");
        CHECK(sum_counts(transformer) == t.total);
        for (std::size_t i = 0; i < t.blocks.size(); ++i) {
            CAPTURE(i);
            CHECK(sum_counts(transformer, "transformer_blocks." + std::to_string(i) + ".") == t.blocks[i]);
        }
        CHECK(transformer.count("transformer_blocks.0.attn.norm_q.weight") == (tc["qk_norm"] == "rms_norm"));
        CHECK(transformer.count("transformer_blocks.0.attn2.to_q.weight") ==
              !tc["dual_attention_layers"].empty());
        CHECK(transformer.at("pos_embed.pos_embed") ==
              tc["pos_embed_max_size"].get<long long>() * tc["pos_embed_max_size"].get<long long>() *
                  tc["num_attention_heads"].get<long long>() * tc["attention_head_dim"].get<long long>());
        for (const char* clip : {"text_encoder", "text_encoder_2"})
            CHECK(sum_counts(dp::strategies::tensor_element_counts(model + "/" + clip)) ==
                  clip_counts(config_of(model, std::string(clip) + "/config.json")));
        CHECK(sum_counts(dp::strategies::tensor_element_counts(model + "/text_encoder_3")) ==
              t5_encoder_counts(config_of(model, "text_encoder_3/config.json")).first);
        const auto [decoder, encoder] = vae_counts(config_of(model, "vae/config.json"));
        const auto vae = dp::strategies::tensor_element_counts(model + "/vae");
        CHECK(sum_counts(vae, "decoder.") == decoder);
        CHECK(sum_counts(vae, "encoder.") == encoder);
        CHECK(sum_counts(vae) == decoder + encoder);
    });
    // The published sizes, as a reader knows them: SD3.5 large's MMDiT is 8.1 B parameters, T5-XXL's
    // encoder 4.76 B, CLIP-G 695 M, CLIP-L 124 M.
    const std::string large = dp::launcher::resolve_model("sd3.5-large", "--model");
    CHECK(sd3_transformer_counts(config_of(large, "transformer/config.json")).total == 8146280768);
    CHECK(t5_encoder_counts(config_of(large, "text_encoder_3/config.json")).first == 4762310656);
}

TEST_CASE("plan: the shipped config-only folders at real size, per rank and per step") {
    for_config_only([](const std::string& model, const nlohmann::json& tc, const TransformerCounts& t) {
        const long long whole = t.total - t.split;
        const long long others = clip_counts(config_of(model, "text_encoder/config.json")) +
                                 clip_counts(config_of(model, "text_encoder_2/config.json")) +
                                 vae_counts(config_of(model, "vae/config.json")).first;  // the decoder
        const auto [t5_total, t5_split] = t5_encoder_counts(config_of(model, "text_encoder_3/config.json"));
        for (int tp : {1, 2}) {
            CAPTURE(tp);
            const std::string p = plan_of(model, tp);
            // bf16: 2 bytes a parameter; tp 2 halves the split parts (T5's too) and nothing else.
            CHECK(has(p, "transformer parameters per rank (bf16): "));
            CHECK(has(p, bytes_in((whole + t.split / tp) * 2) + " = "));
            CHECK(has(p, bytes_in(whole * 2) + " replicated + "));
            CHECK(has(p, bytes_in(t.split * 2) + " / tp " + std::to_string(tp) + "\n"));
            CHECK(has(p, "  text_encoder_3: "));
            CHECK(has(p, bytes_in((t5_total - t5_split + t5_split / tp) * 2)));
            const long long t5_rank = t5_total - t5_split + t5_split / tp;
            CHECK(has(p, "weights per rank (bf16): "));
            CHECK(has(p, bytes_in((whole + t.split / tp + others + t5_rank) * 2) + "\n"));
            // --no-t5: T5 neither loaded nor counted.
            const std::string no_t5 = plan_of(model, tp, {"--no-t5"});
            CHECK(has(no_t5, bytes_in((whole + t.split / tp + others) * 2) + "\n"));
            CHECK_FALSE(has(no_t5, "text_encoder_3"));
        }
        // At the default 1024x1024: 4096 image tokens, 333 text tokens (CLIP's 77 and T5's 256, the
        // default max_sequence_length); tp 2's all-reduces: two per block on the image, two on the text
        // but in the last block, for both guidance branches, of width D at 2 bytes.
        const long long d =
            tc["num_attention_heads"].get<long long>() * tc["attention_head_dim"].get<long long>();
        const long long layers = tc["num_layers"];
        const std::string p = plan_of(model, 2);
        CHECK(has(p, " px -> 4096 image tokens, 333 text tokens\n"));
        CHECK(has(p, "  all_reduce: "));
        CHECK(has(p, bytes_in(2 * d * (2 * 4096 * layers + 2 * 333 * (layers - 1)) * 2) + "\n"));
        // Without T5 its positions are one constant token (Note [constant text tail]): 78.
        CHECK(has(plan_of(model, 2, {"--no-t5"}), " px -> 4096 image tokens, 78 text tokens\n"));
        CHECK(has(plan_of(model, 2, {"--max-sequence-length", "77"}),
                  " px -> 4096 image tokens, 154 text tokens\n"));
    });
    // SD3.5 large at bf16 under tp 2: 7.7 GiB of the transformer a rank (AdaLN split too), 13.9
    // GiB with T5's half, 9.3 GiB without T5.
    const std::string large = dp::launcher::resolve_model("sd3.5-large", "--model");
    CHECK(has(plan_of(large, 2), "weights per rank (bf16): 13.88 GiB"));
    CHECK(has(plan_of(large, 2, {"--no-t5"}), "weights per rank (bf16): 9.32 GiB"));
}

TEST_CASE("a config-only folder runs only with --random-weights") {
    dp::launcher::LaunchSpec launch;
    dp::launcher::JobOptions job;
    job.model = dp::launcher::resolve_model("sd3.5-large", "--model");
    job.prompts = "/nonexistent/prompts.txt";
    job.output_dir = "/nonexistent/outputs";
    try {
        dp::launcher::run_job(launch, job);
        FAIL("expected a refusal");
    } catch (const dp::protocol::UsageError& e) {
        const std::string what = e.what();
        CHECK(has(what, "the folder has configs only"));
        CHECK(has(what, "pass --random-weights SEED"));
        CHECK(has(what, "point --model at a folder with the real weights"));
    }
    // With random weights the check passes; the job then stops at what follows, not the weights:
    // the memory guard on a machine without SD3.5 large's 52 GiB in fp32, else the prompt file.
    job.random_weights = 1;
    try {
        dp::launcher::run_job(launch, job);
        FAIL("expected the missing prompt file to stop it");
    } catch (const std::exception& e) {
        CHECK_FALSE(has(e.what(), "configs only"));
    }
    CHECK(dp::strategies::components_without_weights(
              dp::launcher::resolve_model("tiny-random-sd3", "--model"), dp::strategies::family_spec("sd3"))
              .empty());
}

TEST_CASE("plan says what --dtype auto means and warns about what the job would refuse") {
    dp::launcher::LaunchSpec launch;
    dp::launcher::JobOptions job;
    job.model = dp::launcher::resolve_model("tiny-random-sd3", "--model");
    job.device = "cpu";
    std::string p = dp::cli::describe_plan(launch, job);
    CHECK(has(p,
              "  precision: auto: bf16 on a GPU, and on a CPU with bf16 instructions for a model 512 or more "
              "wide; else fp32; fp32 here (--device cpu; "));
    CHECK(has(p, "transformer parameters per rank (fp32): 504.3 KiB (516368)"));
    CHECK_FALSE(has(p, "warning"));
    job.device = "cuda";
    p = dp::cli::describe_plan(launch, job);
    CHECK(has(p, "else fp32; bf16 here (--device cuda)\n"));
    CHECK(has(p, "transformer parameters per rank (bf16): 252.1 KiB (258184)"));

    // The plan is still made; each refusal is a warning.
    job.variant = "fp16";
    job.arguments.set("skip_guidance_layers", std::vector<int>{2});
    job.width = 4000;
    p = dp::cli::describe_plan(launch, job);
    CHECK(has(p,
              "transformer parameters per rank (bf16): 252.1 KiB (258184)"));  // counted from the plain files
    CHECK(has(p, "warning: the job would refuse this: --variant fp16: " + job.model +
                     "/transformer has no fp16 weights"));
    CHECK(has(
        p, "warning: the job would refuse this: --width 4000: this model makes sizes that are multiples of"));
    CHECK(has(p,
              "warning: the job would refuse this: --skip-guidance-layers 2: block 2 is not one of the "
              "transformer's 2 blocks (0 to 1)\n"));
    // plan --json lists the same refusals, one string each.
    const nlohmann::json j = nlohmann::json::parse(dp::cli::describe_plan(launch, job, /*json=*/true));
    REQUIRE(j["refusals"].size() == 6);  // the four components without fp16 weights, the width, the block
    CHECK(j["refusals"][0].get<std::string>().rfind("--variant fp16: ", 0) == 0);
    CHECK(j["refusals"][5] ==
          "--skip-guidance-layers 2: block 2 is not one of the transformer's 2 blocks (0 to 1)");
    CHECK(j["model"]["dtype"] == "bf16");
    CHECK(j["transformer_parameters"]["bytes_per_rank"] == 258184);
}

TEST_CASE(
    "plan: Qwen-Image at real size, with the modulations and the text encoder split by tp, in closed form") {
    // QwenImageTransformer2DModel's parameters from its config, by diffusers' layer list: what tp
    // splits (q, k, v of both streams and the MLPs' inputs by columns with their biases, both
    // modulations too; the attention outputs and MLP outputs by rows, their biases whole) and what
    // stays whole (embeddings, norms, the output head).
    const std::string model = dp::launcher::resolve_model("qwen-image", "--model");
    const nlohmann::json tc = config_of(model, "transformer/config.json");
    const long long d =
        tc["num_attention_heads"].get<long long>() * tc["attention_head_dim"].get<long long>();
    const long long joint = tc["joint_attention_dim"], layers = tc["num_layers"],
                    hd = tc["attention_head_dim"];
    const long long out = tc["patch_size"].get<long long>() * tc["patch_size"].get<long long>() *
                          tc["out_channels"].get<long long>();
    const long long whole_top = linear(tc["in_channels"], d) + joint + linear(joint, d) + linear(256, d) +
                                linear(d, d) + linear(d, 2 * d) + linear(d, out);
    const long long split_block =
        2 * linear(d, 6 * d) + 6 * linear(d, d) + 2 * linear(d, 4 * d) + 2 * d * d + 2 * 4 * d * d;
    const long long whole_block = 2 * d + 2 * d + 4 * hd;  // the row-parallel biases, the four qk-norms
    const long long whole = whole_top + layers * whole_block, split = layers * split_block;
    CHECK(sum_counts(dp::strategies::tensor_element_counts(model + "/transformer")) == whole + split);
    CHECK(whole + split == 20430401088);  // Qwen-Image's published 20.4 B
    // Qwen2.5-VL's language model: q, k, v (with biases) and gate/up split by columns, o and down
    // by rows; embeddings and norms whole. The vision tower and lm_head are never loaded.
    const nlohmann::json text = config_of(model, "text_encoder/config.json")["text_config"];
    const long long h = text["hidden_size"], inter = text["intermediate_size"], vocab = text["vocab_size"];
    const long long kv =
        text["num_key_value_heads"].get<long long>() * (h / text["num_attention_heads"].get<long long>());
    const long long text_split = text["num_hidden_layers"].get<long long>() *
                                 (linear(h, h) + 2 * linear(h, kv) + h * h + 3 * h * inter);
    const long long text_whole = vocab * h + text["num_hidden_layers"].get<long long>() * 2 * h + h;
    for (int tp : {1, 2, 4}) {
        CAPTURE(tp);
        const std::string p = plan_of(model, tp);
        CHECK(has(p, bytes_in((whole + split / tp) * 2) + " = " + ""));
        CHECK(has(p, bytes_in(whole * 2) + " replicated + " + ""));
        CHECK(has(p, bytes_in(split * 2) + " / tp " + std::to_string(tp) + "\n"));
        CHECK(has(p, "  text_encoder: "));
        CHECK(has(p, bytes_in((text_whole + text_split / tp) * 2)));
    }
    // The modulations split too: what a rank keeps whole is 0.4 % of the transformer.
    CHECK(static_cast<double>(whole) / (whole + split) < 0.005);
    CHECK(has(plan_of(model, 1), " px -> 4096 image tokens, up to 512 text tokens\n"));
}

namespace {

// A Llama-layout decoder's parameters (Qwen3's, Mistral's): q, k, v, gate and up split by
// columns, o and down by rows (no biases); the embeddings, the norms (and Qwen3's per-head
// qk-norms) whole.
struct DecoderCounts {
    long long whole = 0, split = 0;
};
DecoderCounts decoder_counts(const nlohmann::json& text, bool qk_norm) {
    const long long h = text["hidden_size"], inter = text["intermediate_size"], th = text["head_dim"];
    const long long q = text["num_attention_heads"].get<long long>() * th;
    const long long kv = text["num_key_value_heads"].get<long long>() * th;
    const long long layers = text["num_hidden_layers"];
    return {text["vocab_size"].get<long long>() * h + layers * (2 * h + (qk_norm ? 2 * th : 0)) + h,
            layers * (2 * h * q + 2 * h * kv + 3 * h * inter)};
}

// plan at each of `tps` counts the transformer's `whole` and `split` and the text encoder's `text`.
void check_tp_plans(const std::string& model, const std::vector<int>& tps, long long whole, long long split,
                    const DecoderCounts& text) {
    for (int tp : tps) {
        CAPTURE(tp);
        const std::string p = plan_of(model, tp);
        CHECK(has(p, bytes_in(whole * 2) + " replicated + "));
        CHECK(has(p, bytes_in(split * 2) + " / tp " + std::to_string(tp) + "\n"));
        CHECK(has(p, "  text_encoder: "));
        CHECK(has(p, bytes_in((text.whole + text.split / tp) * 2)));
    }
}

}  // namespace

TEST_CASE(
    "plan: Z-Image-Turbo at real size, every block (refiners too) and Qwen3 split by tp, in closed form") {
    // ZImageTransformer2DModel's parameters from its config, by diffusers' layer list. Split: q, k,
    // v, the output and the SwiGLU MLP of every block (main, noise- and context-refiner; no biases),
    // and the modulations of the main and noise-refiner blocks. Whole: the patch and caption
    // embedders, the timestep MLP, the pad tokens, every norm, the head.
    const std::string model = dp::launcher::resolve_model("z-image-turbo", "--model");
    const nlohmann::json tc = config_of(model, "transformer/config.json");
    const long long d = tc["dim"], hd = d / tc["n_heads"].get<long long>(), t = std::min(d, 256LL);
    const long long ff = d / 3 * 8, cap = tc["cap_feat_dim"], patch = 4 * tc["in_channels"].get<long long>();
    const long long main = tc["n_layers"], refiners = tc["n_refiner_layers"];
    const long long blocks = main + 2 * refiners, modulated = main + refiners;
    const long long whole = linear(patch, d) + linear(256, 1024) + linear(1024, t) + cap + linear(cap, d) +
                            2 * d + linear(t, d) + linear(d, patch) + blocks * (4 * d + 2 * hd);
    const long long split = blocks * (4 * d * d + 3 * d * ff) + modulated * linear(t, 4 * d);
    CHECK(sum_counts(dp::strategies::tensor_element_counts(model + "/transformer")) == whole + split);
    CHECK(whole + split == 6154908736);  // Z-Image's published 6 B
    // Qwen3-4B, its per-head qk-norms whole.
    const DecoderCounts text = decoder_counts(config_of(model, "text_encoder/config.json"), true);
    CHECK(sum_counts(dp::strategies::tensor_element_counts(model + "/text_encoder")) ==
          text.whole + text.split);
    check_tp_plans(model, {1, 2}, whole, split, text);
    // 30 heads over 4 ranks: the ranks with 8 heads hold the most.
    CHECK(has(plan_of(model, 4), bytes_in(split * 2) + " x at most 8/30 on the ranks with 8 heads (tp 4)"));
    CHECK(
        has(plan_of(model, 1), "30 blocks, width 3840, 30 heads of 128; 1024x1024 px -> 4096 image tokens"));
    CHECK(static_cast<double>(whole) / (whole + split) < 0.005);
}

TEST_CASE(
    "plan: FLUX.1 at real size, double and single blocks split by tp (the single blocks' output by "
    "segments)") {
    // FluxTransformer2DModel's parameters from its config, by diffusers' layer list. Split: both
    // streams' q, k, v and MLP inputs, the single blocks' q, k, v and proj_mlp (by columns, with
    // their biases), every modulation (norm1, norm1_context, norm: gathered), the attention and MLP
    // outputs and the single blocks' proj_out (by rows, biases whole). Whole: embeddings, the
    // conditioning, the qk-norms, the output head.
    for (const char* name : {"flux.1-dev", "flux.1-schnell"}) {
        CAPTURE(name);
        const std::string model = dp::launcher::resolve_model(name, "--model");
        const nlohmann::json tc = config_of(model, "transformer/config.json");
        const long long hd = tc["attention_head_dim"], d = tc["num_attention_heads"].get<long long>() * hd;
        const long long doubles = tc["num_layers"], singles = tc["num_single_layers"];
        const bool guidance = tc["guidance_embeds"];
        const long long whole_top = linear(tc["in_channels"], d) + linear(tc["joint_attention_dim"], d) +
                                    (guidance ? 2 : 1) * (linear(256, d) + linear(d, d)) +
                                    linear(tc["pooled_projection_dim"], d) + linear(d, d) + linear(d, 2 * d) +
                                    linear(d, tc["in_channels"]);
        const long long split_double =
            2 * linear(d, 6 * d) + 6 * linear(d, d) + 2 * linear(d, 4 * d) + 2 * d * d + 2 * 4 * d * d;
        const long long whole_double = 4 * d + 4 * hd;
        const long long split_single = linear(d, 3 * d) + 3 * linear(d, d) + linear(d, 4 * d) + 5 * d * d;
        const long long whole_single = d + 2 * hd;
        const long long whole = whole_top + doubles * whole_double + singles * whole_single;
        const long long split = doubles * split_double + singles * split_single;
        CHECK(sum_counts(dp::strategies::tensor_element_counts(model + "/transformer")) == whole + split);
        // FLUX.1-dev's published 11.9 B; schnell lacks the guidance embedder.
        CHECK(whole + split == (guidance ? 11901408320LL : 11901408320LL - linear(256, d) - linear(d, d)));
        for (int tp : {1, 2, 4}) {
            CAPTURE(tp);
            const std::string p = plan_of(model, tp);
            CHECK(has(p, bytes_in(whole * 2) + " replicated + "));
            CHECK(has(p, bytes_in(split * 2) + " / tp " + std::to_string(tp) + "\n"));
            CHECK(has(p, "  text_encoder_2: "));
            CHECK(has(p, "57 blocks, width 3072, 24 heads of 128; 1024x1024 px -> 4096 image tokens"));
        }
        CHECK(static_cast<double>(whole) / (whole + split) < 0.01);
    }
}

TEST_CASE(
    "plan: FLUX.2-dev at real size, double and single blocks and Mistral 3's decoder split by tp, its "
    "vision tower and lm_head not loaded, in closed form") {
    // Flux2Transformer2DModel's parameters from its config, no biases. Split: both streams' q, k, v
    // (by columns) and outputs (by rows), the SwiGLU MLPs' inputs (by segments) and outputs, the
    // single blocks' fused projection and output (by segments), the three shared modulations
    // (gathered). Whole: the embedders, the time and guidance MLPs, the qk-norms, the head.
    const std::string model = dp::launcher::resolve_model("flux2-dev", "--model");
    const nlohmann::json tc = config_of(model, "transformer/config.json");
    const long long hd = tc["attention_head_dim"], d = tc["num_attention_heads"].get<long long>() * hd;
    const long long h = d * 3, ch = tc["in_channels"], f = tc["timestep_guidance_channels"];
    const long long doubles = tc["num_layers"], singles = tc["num_single_layers"];
    const long long whole = ch * d + tc["joint_attention_dim"].get<long long>() * d + 2 * (f * d + d * d) +
                            2 * d * d + d * ch + doubles * 4 * hd + singles * 2 * hd;
    const long long split = 15 * d * d + doubles * (8 * d * d + 2 * (d * 2 * h + h * d)) +
                            singles * (d * (3 * d + 2 * h) + (d + h) * d);
    CHECK(sum_counts(dp::strategies::tensor_element_counts(model + "/transformer")) == whole + split);
    CHECK(whole + split == 32223281152LL);  // FLUX.2-dev's published 32.2 B
    // Mistral-Small-3.1's language model. The Pixtral tower, the projector and lm_head are not
    // counted: the pipeline never loads them.
    const DecoderCounts text =
        decoder_counts(config_of(model, "text_encoder/config.json").at("text_config"), false);
    CHECK(sum_counts(dp::strategies::tensor_element_counts(model + "/text_encoder"),
                     "language_model.model.") == text.whole + text.split);
    check_tp_plans(model, {1, 2, 4, 8}, whole, split, text);
    CHECK(
        has(plan_of(model, 1), "56 blocks, width 6144, 48 heads of 128; 1024x1024 px -> 4096 image tokens"));
    CHECK(static_cast<double>(whole) / (whole + split) < 0.01);
}

namespace {

using Traffic = std::map<std::string, int64_t>;

}  // namespace

TEST_CASE("the bytes a rank sends per step, in closed form from the spec, the shape and the degrees") {
    // The tiny SD3: L blocks of H heads of d features (D = H d), C latent values a token, N image
    // tokens and T text tokens (SD3's text stream is replicated), fp32, both guidance branches in
    // one batch (B = 2) unless cfg splits them. The formulas are the ones the job tests measure
    // (integration/test_main_job.cpp), restated here by hand.
    const dp::strategies::ModelInfo model =
        dp::strategies::read_model_info(std::string(DP_GOLDEN_DIR) + "/sd3_tiny");
    const auto counts = dp::strategies::tensor_element_counts(model.dir + "/" + model.spec->transformer);
    const int64_t L = model.shape.layers, H = model.shape.heads, d = model.shape.head_dim, D = H * d;
    const int64_t C = model.shape.in_channels * model.shape.patch_size * model.shape.patch_size;
    const int64_t N = 64, T = 333, f = 4, B = 2;
    const auto traffic = [&](int cfg, int ulysses, int ring, int tp) {
        dp::strategies::MeshDegrees deg;
        deg.cfg = cfg;
        deg.ulysses = ulysses;
        deg.ring = ring;
        deg.tp = tp;
        const dp::strategies::StepTrafficInput step{N, T, cfg > 1 ? 1 : 2, f};
        return dp::strategies::step_traffic(*model.spec, model.shape, deg, counts, step);
    };
    CHECK(traffic(1, 1, 1, 1).empty());
    // CFG: one all_gather of this rank's noise prediction.
    CHECK(traffic(2, 1, 1, 1) == Traffic{{"all_gather", C * N * f}});
    // Ulysses U: per block 4 all-to-alls of B x H x N/U x d, the text output gathered over heads in
    // every block with a text output, and the final tokens gathered.
    const int64_t U = 2;
    CHECK(traffic(1, 2, 1, 1) ==
          Traffic{{"all_to_all", 4 * L * B * H * (N / U) * d * f},
                  {"all_gather", ((L - 1) * B * (H / U) * T * d + B * (N / U) * C) * f}});
    // Ring R: each block passes keys and values R - 1 times; the final tokens gathered.
    const int64_t R = 2;
    CHECK(traffic(1, 1, 2, 1) ==
          Traffic{{"send", L * 2 * (R - 1) * B * H * (N / R) * d * f}, {"all_gather", B * (N / R) * C * f}});
    // TP P: an all_reduce after each stream's attention and MLP outputs, and AdaLN's modulations
    // gathered (6 D a block and stream, the last block's text 2 D).
    const int64_t P = 2;
    CHECK(traffic(1, 1, 1, 2) == Traffic{{"all_reduce", B * D * (2 * N * L + 2 * T * (L - 1)) * f},
                                         {"all_gather", B * (6 * D * L + 6 * D * (L - 1) + 2 * D) / P * f}});
}

#include "strategies/config_file.h"
#include "strategies/pass_flops.h"

// Note [FLOPs of a pass]: every family's count from its config against PyTorch's FLOP counter
// over diffusers' transformer (scripts/golden/golden_flops.py): 16 folders (the tiny ones and the
// shipped real configs) at two sizes and two text lengths each.
TEST_CASE("a transformer pass's FLOPs from its config are PyTorch's FLOP counter's over diffusers' model") {
    const nlohmann::json golden =
        dp::strategies::read_config_json(std::string(DP_GOLDEN_DIR) + "/pass_flops.json");
    std::size_t checked = 0;
    std::set<std::string> families;
    for (const nlohmann::json& c : golden.at("cases")) {
        const std::string family = c.at("family"), model = c.at("model");
        const int width = c.at("width"), text = c.at("text_tokens");
        CAPTURE(model);
        CAPTURE(width);
        CAPTURE(text);
        const nlohmann::json index =
            dp::strategies::read_config_json(std::string(DP_MODELS_DIR) + "/" + model + "/model_index.json");
        const dp::strategies::ParallelSpec* spec =
            dp::strategies::find_parallel_spec(index.at("_class_name").get<std::string>());
        REQUIRE(spec != nullptr);
        const dp::strategies::PassFlopsCount count = dp::strategies::facts_of(*spec).pass_flops;
        REQUIRE(static_cast<bool>(count));
        const nlohmann::json config = dp::strategies::read_config_json(std::string(DP_MODELS_DIR) + "/" +
                                                                       model + "/transformer/config.json");
        const dp::strategies::PassFlops f =
            count(config, {c.at("image_tokens").get<int64_t>(), c.at("text_tokens").get<int64_t>()});
        CHECK(f.gemm() == doctest::Approx(c.at("gemm").get<double>()).epsilon(1e-12));
        CHECK(f.attention == doctest::Approx(c.at("attention").get<double>()).epsilon(1e-12));
        families.insert(family);
        ++checked;
    }
    CHECK(checked >= 60);
    CHECK(families.size() == 5);
}

TEST_CASE("a rank's share of a pass's FLOPs under tp and a sequence split, and plan's FLOPs per image") {
    const nlohmann::json config =
        dp::strategies::read_config_json(std::string(DP_MODELS_DIR) + "/flux.1-dev/transformer/config.json");
    const dp::strategies::ParallelSpec* spec = dp::strategies::find_parallel_spec("FluxPipeline");
    REQUIRE(spec != nullptr);
    const auto count = dp::strategies::facts_of(*spec).pass_flops;
    const dp::strategies::PassTokens tokens{4096, 512};
    const dp::strategies::PassFlops whole = count(config, tokens);
    const auto rank = [&](int ulysses, int tp) {
        dp::strategies::MeshDegrees d;
        d.ulysses = ulysses, d.tp = tp;
        return dp::strategies::rank_flops(count, config, tokens, d, true);
    };
    // The one-token products (modulations, embedders of the timestep) are a rank's each under a
    // split: the shares add up to the whole within them.
    CHECK(rank(1, 1).total() == doctest::Approx(whole.total()));
    CHECK(rank(2, 1).total() * 2 == doctest::Approx(whole.total()).epsilon(1e-3));
    CHECK(rank(1, 2).total() * 2 == doctest::Approx(whole.total()).epsilon(1e-9));
    CHECK(rank(2, 2).total() * 4 == doctest::Approx(whole.total()).epsilon(1e-3));
    CHECK(rank(2, 2).attention * 4 == doctest::Approx(whole.attention));
    // Each product's output features over tp in the shapes the rank's GEMM rate is measured at.
    const auto shares = rank(1, 2).gemms;
    REQUIRE(shares.size() == whole.gemms.size());
    for (std::size_t i = 0; i < shares.size(); ++i) CHECK(shares[i].n == (whole.gemms[i].n + 1) / 2);

    // plan: FLOPs per image are the passes x branches x a pass's.
    const nlohmann::json p = plan_json(2, {"--tp", "2"});
    const nlohmann::json& flops = p.at("flops");
    CHECK(flops.at("per_image").get<double>() ==
          doctest::Approx(flops.at("per_pass").get<double>() * flops.at("passes_per_image").get<double>() *
                          flops.at("branches").get<double>()));
    CHECK(flops.at("per_pass").get<double>() ==
          doctest::Approx(flops.at("per_pass_gemm").get<double>() +
                          flops.at("per_pass_attention").get<double>()));
    CHECK(flops.at("per_pass_per_rank").get<double>() < flops.at("per_pass").get<double>());
    CHECK(has(plan(1, {}), "FLOPs per image: "));
    CHECK(dp::strategies::flops_text(2.08e15) == "2.08 PFLOP");
    CHECK(dp::strategies::flops_text(512) == "512 FLOP");
}
