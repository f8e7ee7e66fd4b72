// dp-train-shapes: trains the built-in "shapes" model from nothing, on this machine's CPUs.
//
// The model is the SD3 architecture at tiny size (two CLIP text encoders, an MMDiT, the flow-match
// Euler scheduler) in pixel space, loaded through Sd3Pipeline with trainable weights, so the
// forward pass trained here is the one inference runs. Rectified flow as SD3 trains it:
// x_t = (1 - s) x_0 + s e with s from a logit-normal, the transformer predicts e - x_0 at timestep
// 1000 s, mean squared error. 10 % of the prompts are dropped to "" (the negative prompt) for
// classifier-free guidance; AdamW; an EMA of the weights is what gets evaluated and saved (fp16).
// The tokenizer's vocabulary is built from the shapes grammar in CLIP's vocab.json/merges.txt form.
#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>

#include "runtime/io/errors.h"
#include "runtime/io/tensor_io.h"
#include "runtime/models/common/clip_tokenizer.h"
#include "runtime/models/sd3/sd3_pipeline.h"
#include "runtime/models/sd3/sd3_transformer.h"
#include "shapes/adherence.h"
#include "shapes/shapes_world.h"

namespace fs = std::filesystem;
using dp::runtime::Sd3Pipeline;

namespace {

struct Dims {
    int image = 32, patch = 2, layers = 4, heads = 4, head_dim = 24;
    int text_hidden = 64, text_layers = 2, text_length = 32;
};

void write_json(const fs::path& path, const nlohmann::json& j) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << j.dump(2) << "\n";
}

// CLIP's vocabulary from the grammar: the 256 byte symbols, the same with "</w>", one merge per
// step of spelling each grammar word left to right, then the two special tokens. BPE applies the
// lowest-ranked merge first, so one word's merges can break another word apart ("r e" from "red"
// inside "green"); words that do not come out as one token are moved to the front until all do.
int64_t write_tokenizer(const fs::path& dir, int max_length) {
    std::vector<std::string> order = dp::shapes::grammar_words();
    nlohmann::ordered_json vocab;
    std::string merges;
    for (int attempt = 0;; ++attempt) {
        vocab = nlohmann::ordered_json::object();
        merges = "#version: 0.2\n";
        int64_t next = 0;
        for (int b = 0; b < 256; ++b)
            vocab[dp::runtime::clip_byte_symbol(static_cast<unsigned char>(b))] = next++;
        for (int b = 0; b < 256; ++b)
            vocab[dp::runtime::clip_byte_symbol(static_cast<unsigned char>(b)) + "</w>"] = next++;
        for (const std::string& word : order) {
            if (word.size() < 2) continue;
            std::string left(1, word[0]);
            for (std::size_t i = 1; i < word.size(); ++i) {
                const std::string right = std::string(1, word[i]) + (i + 1 == word.size() ? "</w>" : "");
                const std::string merged = left + right;
                if (!vocab.contains(merged)) {
                    merges += left + " " + right + "\n";
                    vocab[merged] = next++;
                }
                left = merged;
            }
        }
        vocab["<|startoftext|>"] = next++;
        vocab["<|endoftext|>"] = next++;
        const auto tok = dp::runtime::ClipTokenizer::from_strings(vocab.dump(), merges, "", dir.string());
        std::vector<std::string> split;
        for (const std::string& word : order)
            if (tok.tokenize(word).size() != 1) split.push_back(word);
        if (split.empty()) break;
        if (attempt == 50) throw std::runtime_error("cannot make every grammar word a single token");
        for (const std::string& word : split) order.erase(std::find(order.begin(), order.end(), word));
        order.insert(order.begin(), split.begin(), split.end());
    }
    fs::create_directories(dir);
    std::ofstream(dir / "vocab.json") << vocab.dump() << "\n";
    std::ofstream(dir / "merges.txt") << merges;
    write_json(dir / "tokenizer_config.json", {{"bos_token", "<|startoftext|>"},
                                               {"eos_token", "<|endoftext|>"},
                                               {"pad_token", "<|endoftext|>"},
                                               {"unk_token", "<|endoftext|>"},
                                               {"model_max_length", max_length},
                                               {"tokenizer_class", "CLIPTokenizer"}});
    return static_cast<int64_t>(vocab.size());
}

void write_configs(const fs::path& dir, const Dims& d) {
    const int64_t vocab = write_tokenizer(dir / "tokenizer", d.text_length);
    write_tokenizer(dir / "tokenizer_2", d.text_length);
    write_json(dir / "model_index.json", {{"_class_name", "StableDiffusion3Pipeline"},
                                          {"_diffusers_version", "0.42.1"},
                                          {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                                          {"text_encoder", {"transformers", "CLIPTextModelWithProjection"}},
                                          {"text_encoder_2", {"transformers", "CLIPTextModelWithProjection"}},
                                          {"text_encoder_3", {nullptr, nullptr}},
                                          {"tokenizer", {"transformers", "CLIPTokenizer"}},
                                          {"tokenizer_2", {"transformers", "CLIPTokenizer"}},
                                          {"tokenizer_3", {nullptr, nullptr}},
                                          {"transformer", {"diffusers", "SD3Transformer2DModel"}},
                                          {"vae", {nullptr, nullptr}}});
    write_json(dir / "scheduler/scheduler_config.json", {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                                                         {"_diffusers_version", "0.42.1"},
                                                         {"num_train_timesteps", 1000},
                                                         {"shift", 1.0},
                                                         {"use_dynamic_shifting", false}});
    for (const char* te : {"text_encoder", "text_encoder_2"})
        write_json(dir / te / "config.json", {{"architectures", {"CLIPTextModelWithProjection"}},
                                              {"model_type", "clip_text_model"},
                                              {"vocab_size", vocab},
                                              {"hidden_size", d.text_hidden},
                                              {"intermediate_size", 2 * d.text_hidden},
                                              {"num_hidden_layers", d.text_layers},
                                              {"num_attention_heads", 2},
                                              {"max_position_embeddings", d.text_length},
                                              {"projection_dim", d.text_hidden / 2},
                                              {"hidden_act", "gelu"},
                                              {"layer_norm_eps", 1e-5},
                                              {"bos_token_id", vocab - 2},
                                              {"eos_token_id", vocab - 1},
                                              {"pad_token_id", vocab - 1},
                                              {"torch_dtype", "float16"}});
    const int inner = d.heads * d.head_dim;
    write_json(dir / "transformer/config.json", {{"_class_name", "SD3Transformer2DModel"},
                                                 {"_diffusers_version", "0.42.1"},
                                                 {"sample_size", d.image},
                                                 {"patch_size", d.patch},
                                                 {"in_channels", 3},
                                                 {"out_channels", 3},
                                                 {"num_layers", d.layers},
                                                 {"attention_head_dim", d.head_dim},
                                                 {"num_attention_heads", d.heads},
                                                 {"joint_attention_dim", 2 * d.text_hidden},
                                                 {"caption_projection_dim", inner},
                                                 {"pooled_projection_dim", d.text_hidden},
                                                 {"pos_embed_max_size", d.image / d.patch},
                                                 {"qk_norm", "rms_norm"},
                                                 {"dual_attention_layers", nlohmann::json::array()}});
}

// Note [prompt noise]: the grammar writes each scene's words in few ways, so a model trained on
// it alone learns where its words sit rather than what they say, and a word it never saw (a
// connective of another phrasing) lands on a random embedding it has not learnt to pass over.
// Two augmentations of the training prompts, neither using any word outside the grammar's:
//  - word dropout: each function word ("a", "on", "with", "the", ...) is left out with
//    probability `dropout`, so a colour is bound by what it is next to (a kind, or nothing) and
//    not by its place in a template. Never "background" (without it nothing tells which colour
//    is the background's), nor in a two-shape prompt the "and" and commas that part its shapes:
//    a full-length run that dropped those lost two-shape scenes (30 % of them right -> 7 %);
//  - fillers: with probability `filler`, one to three made-up words (letters the grammar's words
//    never tokenize to) are put between the words. Every token the grammar never writes keeps its
//    initial, random embedding (its rows of the embedding get no gradient), so a filler looks
//    like any unseen word does, and the model learns to pass over such words.
struct PromptNoise {
    double dropout = 0, filler = 0;
};

const std::vector<std::string>& function_words() {
    static const std::vector<std::string> words = {"a", "an", "on", "the", "at", "in", "with", "and", ","};
    return words;
}

std::string filler_word(std::mt19937_64& rng) {
    static const std::string letters = "bcdfghjkmpqvwxz";  // no vowel, so no grammar word inside
    std::string w;
    const int n = 2 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) w += letters[rng() % letters.size()];
    return w;
}

std::string add_noise(const std::string& prompt, std::size_t shapes, const PromptNoise& noise,
                      std::mt19937_64& rng) {
    if (prompt.empty() || (noise.dropout <= 0 && noise.filler <= 0)) return prompt;
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<std::string> words;
    std::string word;
    for (char ch : prompt + " ") {
        if (ch == ' ' || ch == ',') {
            if (!word.empty()) words.push_back(word);
            word.clear();
            if (ch == ',') words.emplace_back(",");
        } else {
            word += ch;
        }
    }
    std::vector<std::string> kept;
    for (const std::string& w : words) {
        const auto& fw = function_words();
        const bool separator = shapes > 1 && (w == "and" || w == ",");
        if (!separator && std::find(fw.begin(), fw.end(), w) != fw.end() && u(rng) < noise.dropout) continue;
        kept.push_back(w);
    }
    if (u(rng) < noise.filler) {
        const int n = 1 + static_cast<int>(rng() % 3);
        for (int i = 0; i < n; ++i)
            kept.insert(kept.begin() + static_cast<std::ptrdiff_t>(rng() % (kept.size() + 1)),
                        filler_word(rng));
    }
    std::string out;
    for (const std::string& w : kept) out += (out.empty() || w == "," ? "" : " ") + w;
    return out.empty() ? prompt : out;
}

// The token ids the training prompts can hold: the grammar's words, the special tokens. Every
// other row of the token embeddings stays as initialised (Note [prompt noise]).
std::vector<int64_t> unseen_token_ids(const fs::path& tokenizer_dir) {
    const auto tok = dp::runtime::ClipTokenizer::from_folder(tokenizer_dir.string());
    const auto& free = dp::shapes::free_connective_words();
    std::vector<bool> seen(static_cast<std::size_t>(tok.vocab_size()), false);
    for (const std::string& w : dp::shapes::grammar_words())
        if (std::find(free.begin(), free.end(), w) == free.end())
            for (int64_t id : tok.tokenize(w)) seen[static_cast<std::size_t>(id)] = true;
    for (const char* special : {"<|startoftext|>", "<|endoftext|>"})
        seen[static_cast<std::size_t>(tok.id_of(special))] = true;
    std::vector<int64_t> unseen;
    for (std::size_t id = 0; id < seen.size(); ++id)
        if (!seen[id]) unseen.push_back(static_cast<int64_t>(id));
    return unseen;
}

// A batch of training scenes as pixels in [-1, 1] and prompts (some dropped to "").
void sample_batch(std::mt19937_64& rng, int n, int size, const PromptNoise& noise, at::Tensor& images,
                  std::vector<std::string>& prompts) {
    images = at::empty({n, 3, size, size}, at::kFloat);
    prompts.clear();
    std::uniform_real_distribution<double> u(0, 1);
    for (int i = 0; i < n; ++i) {
        const dp::shapes::Scene scene = dp::shapes::random_scene(rng, false);
        const std::vector<uint8_t> rgb = dp::shapes::render(scene, size, &rng);
        images[i].copy_(at::from_blob(const_cast<uint8_t*>(rgb.data()), {size, size, 3}, at::kByte)
                            .permute({2, 0, 1})
                            .to(at::kFloat)
                            .div(127.5)
                            .sub(1.0));
        prompts.push_back(u(rng) < 0.1
                              ? std::string()
                              : add_noise(dp::shapes::describe(scene, rng), scene.shapes.size(), noise, rng));
    }
}

struct EvalSet {
    std::vector<dp::shapes::Scene> scenes;
    std::vector<std::string> prompts;
};

EvalSet held_out_set(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    EvalSet e;
    for (int i = 0; i < n; ++i) {
        e.scenes.push_back(dp::shapes::random_scene(rng, true));
        e.prompts.push_back(dp::shapes::describe(e.scenes.back(), rng));
    }
    return e;
}

dp::shapes::AdherenceTotals evaluate(const Sd3Pipeline& pipe, const EvalSet& set, int steps,
                                     double guidance) {
    dp::shapes::AdherenceTotals totals;
    for (std::size_t first = 0; first < set.prompts.size(); first += 16) {
        std::vector<dp::runtime::GenerateRequest> batch;
        for (std::size_t i = first; i < std::min(set.prompts.size(), first + 16); ++i) {
            dp::runtime::GenerateRequest r;
            r.prompt = set.prompts[i];
            r.seed = i;
            r.steps = steps;
            r.arguments.set("guidance_scale", guidance);
            batch.push_back(r);
        }
        const auto results = pipe.generate_batch(batch);
        for (std::size_t k = 0; k < results.size(); ++k) {
            const at::Tensor img = results[k].image.contiguous();
            totals.add(dp::shapes::check_image(img.data_ptr<uint8_t>(), static_cast<int>(img.size(1)),
                                               static_cast<int>(img.size(0)), set.scenes[first + k]));
        }
    }
    return totals;
}

// --init-from: the weights of a folder this trainer wrote, beside the configs just written for the
// same options. Its tokenizer must be the one written now (else a token id would mean another word);
// a weight of another shape is refused by the loader, naming it.
std::string read_tokenizer_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw std::runtime_error("--init-from: cannot read " + path.string() +
                                 " (a model folder this trainer wrote is expected)");
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void copy_weights(const fs::path& from, const fs::path& staging) {
    for (const char* tokenizer : {"tokenizer", "tokenizer_2"})
        for (const char* file : {"vocab.json", "merges.txt"})
            if (read_tokenizer_file(from / tokenizer / file) !=
                read_tokenizer_file(staging / tokenizer / file))
                throw std::runtime_error("--init-from: " + (from / tokenizer / file).string() +
                                         " is not the tokenizer this trainer writes now; train from scratch");
    for (const auto& [component, file] :
         {std::pair{"transformer", "diffusion_pytorch_model.safetensors"},
          std::pair{"text_encoder", "model.safetensors"}, std::pair{"text_encoder_2", "model.safetensors"}}) {
        const fs::path source = from / component / file;
        if (!fs::is_regular_file(source)) throw std::runtime_error("--init-from: no " + source.string());
        fs::copy_file(source, staging / component / file, fs::copy_options::overwrite_existing);
    }
}

void print_totals(const char* what, const dp::shapes::AdherenceTotals& t) {
    std::printf("%s: %d images: background %.1f%%, colour %.1f%%, kind %.1f%%, position %.1f%%\n", what,
                t.images, 100 * t.rate(t.background, t.images), 100 * t.rate(t.colour, t.shapes),
                100 * t.rate(t.kind, t.shapes), 100 * t.rate(t.position, t.shapes));
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app(
        "dp-train-shapes: trains the built-in shapes model (SD3 architecture, pixel space) on the CPU");
    std::string out = "models/shapes-sd3";
    double minutes = 50, lr = 1e-3, ema_decay = 0.998, guidance = 7.0, sigma_mean = 0.0;
    double late_sigma_mean = 0.0, late_fraction = 0.0;
    int batch = 32, eval_every = 1000, eval_prompts = 48, final_prompts = 96, steps = 28, max_steps = 0;
    uint64_t seed = 0;
    Dims d;
    PromptNoise noise;
    std::string init_from;
    app.add_option("-o,--out", out, "the model folder to write (replaced when training ends)");
    app.add_option("--minutes", minutes, "training time budget in minutes (evaluation excluded)");
    app.add_option("--max-steps", max_steps,
                   "stop after this many optimizer steps (0: the time budget decides)");
    app.add_option("--batch", batch, "scenes per step")->check(CLI::Range(1, 1024));
    app.add_option("--lr", lr,
                   "AdamW learning rate (200-step warm-up, then held; decays linearly to a tenth over the "
                   "last 40 % of the budget)");
    app.add_option("--ema", ema_decay, "EMA decay of the weights saved");
    app.add_option("--sigma-mean", sigma_mean,
                   "mean of the logit-normal noise level (0: SD3's; above 0 trains more at high noise, "
                   "where a flat 32x32 scene's layout is decided)");
    app.add_option("--late-fraction", late_fraction,
                   "over this last fraction of the budget, half of each batch's noise levels come from "
                   "--late-sigma-mean instead (more low-noise samples, where fine detail is cleaned up)")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--late-sigma-mean", late_sigma_mean, "the logit-normal mean of the late half-batches");
    app.add_option("--word-dropout", noise.dropout,
                   "leave each function word of a training prompt out with this probability "
                   "(Note [prompt noise])")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--fillers", noise.filler,
                   "put made-up words into this fraction of the training prompts; the tokens the grammar "
                   "never writes keep their initial embeddings (Note [prompt noise])")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option(
           "--init-from", init_from,
           "start from this model folder's weights (one this trainer wrote, with the same architecture "
           "options and tokenizer) instead of random ones: a fine-tune")
        ->check(CLI::ExistingDirectory);
    app.add_option("--seed", seed, "seed of weights, scenes and noise");
    app.add_option("--eval-every", eval_every, "evaluate the EMA weights every N steps");
    app.add_option("--eval-prompts", eval_prompts, "held-out prompts per periodic evaluation");
    app.add_option("--final-prompts", final_prompts, "held-out prompts in the final evaluation");
    app.add_option("--layers", d.layers, "transformer blocks");
    app.add_option("--heads", d.heads, "attention heads");
    app.add_option("--head-dim", d.head_dim, "attention head width");
    app.add_option("--patch", d.patch, "patch size");
    app.add_option("--text-hidden", d.text_hidden, "CLIP width");
    app.add_option("--text-layers", d.text_layers, "CLIP layers");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    try {
        const fs::path staging = out + ".training";
        fs::remove_all(staging);
        write_configs(staging, d);
        if (!init_from.empty()) copy_weights(init_from, staging);
        dp::runtime::PipelineOptions po;
        po.model_dir = staging.string();
        if (init_from.empty()) po.random_weights = seed;
        po.trainable = true;
        const auto pipe = Sd3Pipeline::load(po);

        std::vector<at::Tensor> params;
        int64_t count = 0;
        {
            at::NoGradGuard no_grad;
            for (const auto& [component, named] : pipe->parameters())
                for (const auto& [name, t] : named) {
                    // A fixed sin-cos table, loaded with --init-from's weights: not trained, and saved below.
                    if (name == "pos_embed.pos_embed") continue;
                    // adaLN-Zero: every block starts as the identity and the output head at zero.
                    if (init_from.empty() && component == "transformer" &&
                        (name.find("norm1.linear") != std::string::npos ||
                         name.find("norm1_context.linear") != std::string::npos ||
                         name.rfind("norm_out.linear", 0) == 0 || name.rfind("proj_out", 0) == 0))
                        t.zero_();
                    params.push_back(t);
                    count += t.numel();
                }
        }
        // Rows of the token embeddings that training prompts never hold get no gradient.
        std::vector<at::Tensor> token_embeddings;
        for (const auto& [component, named] : pipe->parameters())
            for (const auto& [name, t] : named)
                if (name.find("token_embedding") != std::string::npos) token_embeddings.push_back(t);
        const at::Tensor unseen_ids = [&] {
            const std::vector<int64_t> ids = unseen_token_ids(staging / "tokenizer");
            return at::tensor(ids, at::kLong);
        }();
        std::vector<at::Tensor> ema;
        for (const at::Tensor& p : params) ema.push_back(p.detach().clone());
        torch::optim::AdamW opt(params, torch::optim::AdamWOptions(lr).betas({0.9, 0.99}).weight_decay(0.01));
        std::printf(
            "dp-train-shapes: %lld parameters; %dx%d px, patch %d, %d blocks of %d, batch %d, %.0f min; "
            "%lld of the tokens are never in a training prompt\n",
            static_cast<long long>(count), d.image, d.image, d.patch, d.layers, d.heads * d.head_dim, batch,
            minutes, static_cast<long long>(unseen_ids.numel()));
        {
            std::mt19937_64 show(seed + 7);
            for (int i = 0; i < 4; ++i) {
                const dp::shapes::Scene scene = dp::shapes::random_scene(show, false);
                std::printf(
                    "  a training prompt: \"%s\"\n",
                    add_noise(dp::shapes::describe(scene, show), scene.shapes.size(), noise, show).c_str());
            }
        }
        std::fflush(stdout);

        const EvalSet eval_set = held_out_set(eval_prompts, 1000 + seed);
        auto with_ema = [&](auto&& fn) {
            std::vector<at::Tensor> saved;
            {
                at::NoGradGuard no_grad;
                for (std::size_t i = 0; i < params.size(); ++i) {
                    saved.push_back(params[i].detach().clone());
                    params[i].copy_(ema[i]);
                }
            }
            fn();
            at::NoGradGuard no_grad;
            for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
        };

        std::mt19937_64 rng(seed);
        at::manual_seed(seed);
        const auto start = std::chrono::steady_clock::now();
        double train_seconds = 0, loss_sum = 0;
        int loss_n = 0;
        for (int step = 1;; ++step) {
            const auto t0 = std::chrono::steady_clock::now();
            at::Tensor x0;
            std::vector<std::string> prompts;
            sample_batch(rng, batch, d.image, noise, x0, prompts);
            const dp::runtime::PromptEmbeddings e = pipe->encode_prompts(prompts);
            const at::Tensor noise = at::randn_like(x0);
            const double done_before =
                max_steps > 0 ? static_cast<double>(step - 1) / max_steps : train_seconds / (minutes * 60);
            at::Tensor mean = at::full({batch}, sigma_mean);
            if (late_fraction > 0 && done_before >= 1 - late_fraction)
                mean.narrow(0, 0, batch / 2).fill_(late_sigma_mean);
            const at::Tensor sigma = at::sigmoid(at::randn({batch}) + mean);
            const at::Tensor s4 = sigma.view({batch, 1, 1, 1});
            const at::Tensor xt = (1 - s4) * x0 + s4 * noise;
            const at::Tensor v =
                pipe->transformer().forward(xt, e.sequence, e.pooled, sigma * 1000, e.tail_repeats);
            const at::Tensor loss = at::mse_loss(v, noise - x0);
            opt.zero_grad();
            loss.backward();
            for (const at::Tensor& t : token_embeddings)
                if (t.grad().defined()) t.grad().index_fill_(0, unseen_ids, 0.0);
            torch::nn::utils::clip_grad_norm_(params, 1.0);
            // Warm up over 200 steps, hold, then decay linearly to a tenth over the last 40 % of
            // the budget (steps, or minutes when the time decides).
            const double warm = std::min(1.0, step / 200.0);
            const double done_fraction =
                max_steps > 0 ? static_cast<double>(step) / max_steps : train_seconds / (minutes * 60);
            const double anneal = 1.0 - 0.9 * std::clamp((done_fraction - 0.6) / 0.4, 0.0, 1.0);
            for (auto& group : opt.param_groups())
                static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr * warm * anneal);
            opt.step();
            {
                at::NoGradGuard no_grad;
                const double decay = std::min(ema_decay, (1.0 + step) / (10.0 + step));
                for (std::size_t i = 0; i < params.size(); ++i)
                    ema[i].mul_(decay).add_(params[i].detach(), 1 - decay);
            }
            loss_sum += loss.item<double>();
            ++loss_n;
            train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const bool done =
                (max_steps > 0 && step >= max_steps) || (max_steps == 0 && train_seconds >= minutes * 60);
            if (step % 50 == 0 || done) {
                std::printf("step %6d  loss %.4f  %.2f steps/s  %.1f min trained\n", step, loss_sum / loss_n,
                            step / train_seconds, train_seconds / 60);
                std::fflush(stdout);
                loss_sum = 0;
                loss_n = 0;
            }
            if (step % eval_every == 0 && !done)
                with_ema([&] {
                    print_totals("  held-out adherence (EMA)", evaluate(*pipe, eval_set, steps, guidance));
                });
            if (done) break;
        }

        // Save the EMA weights in fp16, diffusers' layout, then put the folder in place.
        with_ema([&] {
            for (const auto& [component, named] : pipe->parameters()) {
                std::vector<std::pair<std::string, at::Tensor>> tensors;
                for (const auto& [name, t] : named)
                    if (name != "pos_embed.pos_embed") tensors.emplace_back(name, t.detach().to(at::kHalf));
                const bool diffusers = component == "transformer";
                if (diffusers) {
                    const auto& tc = pipe->transformer().config();
                    tensors.emplace_back("pos_embed.pos_embed", dp::runtime::sincos_pos_embed_2d(
                                                                    tc.inner_dim(), tc.pos_embed_max_size,
                                                                    tc.sample_size / tc.patch_size)
                                                                    .unsqueeze(0)
                                                                    .to(at::kHalf));
                }
                dp::runtime::save_safetensors(
                    (staging / component /
                     (diffusers ? "diffusion_pytorch_model.safetensors" : "model.safetensors"))
                        .string(),
                    tensors, {{"format", "pt"}});
            }
            print_totals("final held-out adherence (EMA)",
                         evaluate(*pipe, held_out_set(final_prompts, 2000 + seed), steps, guidance));
        });
        fs::remove_all(out);
        fs::rename(staging, out);
        std::printf("dp-train-shapes: wrote %s in %.1f min\n", out.c_str(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60);
        return 0;
    } catch (const dp::runtime::Error& e) {
        std::cerr << "dp-train-shapes: " << e.what() << std::endl;
        return e.exit_code();
    } catch (const std::exception& e) {
        std::cerr << "dp-train-shapes: " << e.what() << std::endl;
        return 1;
    }
}
