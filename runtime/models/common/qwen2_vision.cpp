#include "runtime/models/common/qwen2_vision.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "runtime/io/config_json.h"
#include "runtime/io/errors.h"
#include "strategies/parallel_spec.h"

namespace dp::runtime {
namespace {

constexpr double kVisionEps = 1e-6;  // every RMS norm of the tower

// Python's round(): half to even (the default rounding mode).
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

std::array<float, 3> three_floats(const ConfigJson& c, const char* key,
                                  const std::array<float, 3>& fallback) {
    if (!c.has(key)) return fallback;
    const nlohmann::json& v = c.raw()[key];
    if (!v.is_array() || v.size() != 3) c.fail(key, "must list 3 numbers (red, green, blue)");
    std::array<float, 3> out{};
    for (std::size_t i = 0; i < 3; ++i) {
        if (!v[i].is_number() || !std::isfinite(v[i].get<double>()))
            c.fail(key, "must list 3 finite numbers (red, green, blue)");
        out[i] = static_cast<float>(v[i].get<double>());
    }
    if (std::string(key) == "image_std" && (out[0] <= 0 || out[1] <= 0 || out[2] <= 0))
        c.fail(key, "must be positive");
    return out;
}

// Each image's merged tokens in window order (transformers' get_vision_window_index): the
// windows of vws x vws merged tokens in raster order (the grid padded at its bottom and right to
// whole windows), the tokens of a window in raster order. `order` gets the tokens' indices (offset
// by the images before), `windows` each non-empty window's length in patches.
void window_order(int64_t rows, int64_t cols, int64_t vws, int64_t unit, int64_t offset,
                  std::vector<int64_t>& order, std::vector<int64_t>& windows) {
    const int64_t n_rows = (rows + vws - rows % vws) / vws, n_cols = (cols + vws - cols % vws) / vws;
    for (int64_t wr = 0; wr < n_rows; ++wr)
        for (int64_t wc = 0; wc < n_cols; ++wc) {
            int64_t count = 0;
            for (int64_t r = wr * vws; r < std::min(rows, (wr + 1) * vws); ++r)
                for (int64_t c = wc * vws; c < std::min(cols, (wc + 1) * vws); ++c, ++count)
                    order.push_back(offset + r * cols + c);
            if (count > 0) windows.push_back(count * unit);
        }
}

}  // namespace

// --- the processor ---

Qwen2VLProcessorConfig Qwen2VLProcessorConfig::from_json_text(const std::string& text,
                                                              const std::string& path) {
    const ConfigJson c(text, path);
    Qwen2VLProcessorConfig cfg;
    cfg.patch_size = c.integer("patch_size", cfg.patch_size, 1, 1024);
    cfg.merge_size = c.integer("merge_size", cfg.merge_size, 1, 64);
    cfg.temporal_patch_size = c.integer("temporal_patch_size", cfg.temporal_patch_size, 1, 64);
    if (c.has("size")) {
        if (!c.raw()["size"].is_object()) c.fail("size", "must be an object");
        const ConfigJson size(c.raw()["size"].dump(), path + ": size");
        cfg.min_pixels = size.integer("shortest_edge", cfg.min_pixels, 1, int64_t{1} << 40);
        cfg.max_pixels = size.integer("longest_edge", cfg.max_pixels, 1, int64_t{1} << 40);
    }
    cfg.min_pixels = c.integer("min_pixels", cfg.min_pixels, 1, int64_t{1} << 40);
    cfg.max_pixels = c.integer("max_pixels", cfg.max_pixels, cfg.min_pixels, int64_t{1} << 40);
    cfg.image_mean = three_floats(c, "image_mean", cfg.image_mean);
    cfg.image_std = three_floats(c, "image_std", cfg.image_std);
    if (c.integer("resample", 3, 0, 5) != 3)
        c.fail("resample", "is not 3; only bicubic (Qwen2VLImageProcessor's) is supported");
    for (const char* key : {"do_resize", "do_rescale", "do_normalize", "do_convert_rgb"})
        if (!c.boolean(key, true)) c.fail(key, "is false; only the processor's default (true) is supported");
    if (std::abs(c.number("rescale_factor", 1.0 / 255, 0, 1) - 1.0 / 255) > 1e-12)
        c.fail("rescale_factor", "is not 1/255; only that is supported");
    return cfg;
}

std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels) {
    const double h = static_cast<double>(height), w = static_cast<double>(width),
                 f = static_cast<double>(factor);
    if (std::max(h, w) / std::min(h, w) > 200)
        throw ModelError("an image of " + std::to_string(width) + " x " + std::to_string(height) +
                         " pixels: the vision encoder takes a ratio of sides of at most 200");
    int64_t h_bar = round_half_even(h / f) * factor, w_bar = round_half_even(w / f) * factor;
    if (h_bar * w_bar > max_pixels) {
        const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
        h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
        w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
    } else if (h_bar * w_bar < min_pixels) {
        const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
        h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
        w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
    }
    return {h_bar, w_bar};
}

VisionPatches qwen2vl_patches(const images::RgbImage& image, const Qwen2VLProcessorConfig& c) {
    const auto [h, w] = smart_resize(image.height, image.width, c.factor(), c.min_pixels, c.max_pixels);
    images::RgbImage rgb = image;
    if (rgb.width != w || rgb.height != h)
        rgb = images::resize(image, static_cast<int>(w), static_cast<int>(h), images::Resample::kBicubic);
    // x * (1 / 255) in float64, then float32; (x - mean) / std in float32.
    const at::Tensor bytes = at::from_blob(rgb.rgb.data(), {h, w, 3}, at::TensorOptions().dtype(at::kByte));
    const at::Tensor unit = (bytes.to(at::kDouble) * (1.0 / 255.0)).to(at::kFloat);
    const at::Tensor mean = at::tensor(std::vector<float>(c.image_mean.begin(), c.image_mean.end()));
    const at::Tensor std = at::tensor(std::vector<float>(c.image_std.begin(), c.image_std.end()));
    const at::Tensor chw = ((unit - mean) / std).permute({2, 0, 1});  // [3, H, W]
    // [C, gh/m, m, P, gw/m, m, P] -> (gh/m, gw/m, m, m, C, P, P), each patch copied temporal times.
    const int64_t p = c.patch_size, m = c.merge_size, t = c.temporal_patch_size;
    const int64_t gh = h / p, gw = w / p;
    const at::Tensor blocks = chw.reshape({3, gh / m, m, p, gw / m, m, p}).permute({1, 4, 2, 5, 0, 3, 6});
    const at::Tensor copies = blocks.unsqueeze(5).expand({gh / m, gw / m, m, m, 3, t, p, p});
    VisionPatches out;
    out.values = copies.reshape({gh * gw, 3 * t * p * p}).contiguous();
    out.grid_h = gh;
    out.grid_w = gw;
    return out;
}

// --- the tower ---

Qwen2VisionConfig Qwen2VisionConfig::from_json_text(const std::string& text, const std::string& path) {
    const ConfigJson top(text, path);
    Qwen2VisionConfig cfg;
    cfg.image_token_id = top.integer("image_token_id", cfg.image_token_id, 0, int64_t{1} << 31);
    if (!top.has("vision_config") || !top.raw()["vision_config"].is_object())
        top.fail("vision_config", "is missing; an edit pipeline's text encoder needs its vision tower");
    const ConfigJson c(top.raw()["vision_config"].dump(), path + ": vision_config");
    cfg.depth = c.integer("depth", cfg.depth, 1, 1024);
    cfg.hidden_size = c.integer("hidden_size", cfg.hidden_size, 1, 1 << 16);
    cfg.num_heads = c.integer("num_heads", cfg.num_heads, 1, 1024);
    cfg.intermediate_size = c.integer("intermediate_size", cfg.intermediate_size, 1, 1 << 18);
    cfg.patch_size = c.integer("patch_size", cfg.patch_size, 1, 1024);
    cfg.temporal_patch_size = c.integer("temporal_patch_size", cfg.temporal_patch_size, 1, 64);
    cfg.spatial_merge_size = c.integer("spatial_merge_size", cfg.spatial_merge_size, 1, 64);
    cfg.window_size = c.integer("window_size", cfg.window_size, 1, 1 << 16);
    cfg.out_hidden_size = c.integer("out_hidden_size", cfg.out_hidden_size, 1, 1 << 17);
    cfg.in_channels = c.integer("in_channels", cfg.in_channels, 1, 16);
    if (c.string("hidden_act", "silu") != "silu")
        c.fail("hidden_act", "is '" + c.string("hidden_act", "") + "'; supported: silu");
    if (cfg.hidden_size % cfg.num_heads != 0 || cfg.head_dim() % 4 != 0)
        c.fail("num_heads", "must divide hidden_size " + std::to_string(cfg.hidden_size) +
                                " into heads of a multiple of 4 (two rotary axes)");
    if (cfg.in_channels != 3) c.fail("in_channels", "is not 3; the processor gives RGB patches");
    const int64_t merged = cfg.spatial_merge_size * cfg.patch_size;
    if (cfg.window_size % merged != 0 || cfg.window_size < merged)
        c.fail("window_size",
               "must be a multiple of patch_size x spatial_merge_size (" + std::to_string(merged) + ")");
    if (c.has("fullatt_block_indexes")) {
        cfg.fullatt_block_indexes.clear();
        for (const nlohmann::json& v : c.raw()["fullatt_block_indexes"]) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= cfg.depth)
                c.fail("fullatt_block_indexes",
                       "must list block indices below depth " + std::to_string(cfg.depth));
            cfg.fullatt_block_indexes.push_back(v.get<int64_t>());
        }
    }
    if (c.has("rope_parameters") && c.raw()["rope_parameters"].is_object()) {
        const ConfigJson rope(c.raw()["rope_parameters"].dump(), c.path() + ": rope_parameters");
        cfg.rope_theta = rope.number("rope_theta", cfg.rope_theta, 1, 1e12);
    }
    return cfg;
}

Qwen2VisionTower::Qwen2VisionTower(const Qwen2VisionConfig& config, WeightStore& w, const TensorGroup& tp)
    : config_(config) {
    const std::string base = w.has("model.visual.patch_embed.proj.weight") ? "model.visual." : "visual.";
    const int64_t d = config.hidden_size, ff = config.intermediate_size, p = config.patch_size;
    const int64_t hd = config.head_dim();
    const TensorGroup group = config.num_heads >= tp.size ? tp : TensorGroup{};  // too few heads: whole
    local_heads_ = group.share(config.num_heads);
    const LinearLoader linear(w, strategies::qwen2_vision_spec(), group);
    patch_w_ =
        w.take(base + "patch_embed.proj.weight", {d, config.in_channels, config.temporal_patch_size, p, p});
    for (int64_t i = 0; i < config.depth; ++i) {
        const std::string b = base + "blocks." + std::to_string(i) + ".";
        Block k;
        k.norm1 = RMSNorm::load(w, b + "norm1", d, kVisionEps, true, RmsRounding::kQwen2);
        k.norm2 = RMSNorm::load(w, b + "norm2", d, kVisionEps, true, RmsRounding::kQwen2);
        k.qkv = linear(b + "attn.qkv", d, 3 * d, hd);
        k.proj = linear(b + "attn.proj", d, d, hd);
        k.gate = linear(b + "mlp.gate_proj", d, ff);
        k.up = linear(b + "mlp.up_proj", d, ff);
        k.down = linear(b + "mlp.down_proj", ff, d);
        const auto& full = config.fullatt_block_indexes;
        k.full = std::find(full.begin(), full.end(), i) != full.end();
        blocks_.push_back(std::move(k));
    }
    const int64_t unit = config.spatial_merge_size * config.spatial_merge_size;
    merger_norm_ = RMSNorm::load(w, base + "merger.ln_q", d, kVisionEps, true, RmsRounding::kQwen2);
    merger_w1_ = w.take(base + "merger.mlp.0.weight", {d * unit, d * unit});
    merger_b1_ = w.take(base + "merger.mlp.0.bias", {d * unit});
    merger_w2_ = w.take(base + "merger.mlp.2.weight", {config.out_hidden_size, d * unit});
    merger_b2_ = w.take(base + "merger.mlp.2.bias", {config.out_hidden_size});
}

at::Tensor Qwen2VisionTower::forward(const std::vector<VisionPatches>& images) const {
    const Qwen2VisionConfig& c = config_;
    const int64_t m = c.spatial_merge_size, unit = m * m, hd = c.head_dim(), heads = local_heads_;
    const int64_t vws = c.window_size / m / c.patch_size;
    // Each patch's (row, column) in merge-group order, the windows' order, both attention's segments.
    std::vector<at::Tensor> values, rows, cols;
    std::vector<int64_t> order, windows, wholes;
    int64_t merged = 0;
    for (const VisionPatches& image : images) {
        if (image.values.size(1) != c.patch_values() || image.grid_h % m != 0 || image.grid_w % m != 0)
            throw ModelError("the vision encoder takes patches of " + std::to_string(c.patch_values()) +
                             " values on a grid of whole " + std::to_string(m) + " x " + std::to_string(m) +
                             " groups; got " + c10::str(image.values.sizes()));
        values.push_back(image.values);
        const at::Tensor r =
            at::arange(image.grid_h, at::kFloat).unsqueeze(1).expand({image.grid_h, image.grid_w});
        const at::Tensor k =
            at::arange(image.grid_w, at::kFloat).unsqueeze(0).expand({image.grid_h, image.grid_w});
        const auto grouped = [&](const at::Tensor& x) {
            return x.reshape({image.grid_h / m, m, image.grid_w / m, m}).permute({0, 2, 1, 3}).reshape({-1});
        };
        rows.push_back(grouped(r));
        cols.push_back(grouped(k));
        window_order(image.grid_h / m, image.grid_w / m, vws, unit, merged, order, windows);
        merged += image.grid_h * image.grid_w / unit;
        wholes.push_back(image.grid_h * image.grid_w);
    }
    const at::Device device = patch_w_.device();
    const at::ScalarType dtype = patch_w_.scalar_type();
    const int64_t n = merged * unit;
    at::Tensor x = at::cat(values, 0)
                       .to(device, dtype)
                       .view({n, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size});
    x = at::conv3d(x, patch_w_, {}, {c.temporal_patch_size, c.patch_size, c.patch_size})
            .view({n, c.hidden_size});
    // The 2-D rotary angles: [h | w] over half the head, twice.
    const at::Tensor inv = rope_frequencies(hd / 2, c.rope_theta, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor freqs = at::cat({at::outer(at::cat(rows), inv), at::outer(at::cat(cols), inv)}, 1);
    const at::Tensor angles = at::cat({freqs, freqs}, 1);
    // Whole merge groups permuted into window order.
    const at::Tensor index = at::tensor(order, at::kLong);
    const auto windowed = [&](const at::Tensor& t) {
        return t.reshape({merged, unit, -1}).index_select(0, index.to(t.device())).reshape({n, -1});
    };
    x = windowed(x);
    const at::Tensor cos = windowed(angles.cos()).unsqueeze(1).to(device),
                     sin = windowed(angles.sin()).unsqueeze(1).to(device);
    const auto rotated = [&](const at::Tensor& t) {  // in fp32, back in t's dtype
        const at::Tensor f = t.to(at::kFloat);
        return (f * cos + rotate_half(f) * sin).to(t.scalar_type());
    };
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (const Block& b : blocks_) {
        const at::Tensor qkv = b.qkv(b.norm1(x)).reshape({n, 3, heads, hd}).permute({1, 0, 2, 3});
        const at::Tensor q = rotated(qkv[0]).transpose(0, 1).unsqueeze(0);  // [1, heads, n, hd]
        const at::Tensor k = rotated(qkv[1]).transpose(0, 1).unsqueeze(0);
        const at::Tensor v = qkv[2].transpose(0, 1).unsqueeze(0);
        std::vector<at::Tensor> outs;
        int64_t first = 0;
        for (int64_t len : b.full ? wholes : windows) {  // block-diagonal: each segment on its own
            outs.push_back(at::scaled_dot_product_attention(q.narrow(2, first, len), k.narrow(2, first, len),
                                                            v.narrow(2, first, len), {}, 0.0, false, scale));
            first += len;
        }
        const at::Tensor attended = at::cat(outs, 2).squeeze(0).transpose(0, 1).reshape({n, heads * hd});
        x = x + b.proj(attended);
        const at::Tensor h = b.norm2(x);
        x = x + b.down(at::silu(b.gate(h)) * b.up(h));
    }
    const at::Tensor grouped = merger_norm_(x).view({merged, unit * c.hidden_size});
    const at::Tensor out =
        at::linear(at::gelu(at::linear(grouped, merger_w1_, merger_b1_)), merger_w2_, merger_b2_);
    // Back to each image's raster order.
    return out.index_select(0, at::argsort(index).to(device));
}

at::Tensor qwen2vl_positions(const std::vector<int64_t>& ids, int64_t valid, int64_t image_token,
                             const std::vector<VisionPatches>& images, int64_t merge_size) {
    const int64_t length = static_cast<int64_t>(ids.size());
    at::Tensor out = at::zeros({3, length}, at::kLong);
    auto pos = out.accessor<int64_t, 2>();
    int64_t current = 0;
    std::size_t next = 0;
    for (int64_t i = 0; i < valid && i < length;) {
        if (ids[static_cast<std::size_t>(i)] != image_token) {
            for (int a = 0; a < 3; ++a) pos[a][i] = current;
            ++current, ++i;
            continue;
        }
        if (next >= images.size())
            throw ModelError("the prompt has more image tokens than the " + std::to_string(images.size()) +
                             " images' count");
        const VisionPatches& image = images[next++];
        const int64_t rows = image.grid_h / merge_size, cols = image.grid_w / merge_size;
        if (i + rows * cols > valid)
            throw ModelError("the prompt's image tokens are fewer than its images make");
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c, ++i) {
                if (ids[static_cast<std::size_t>(i)] != image_token)
                    throw ModelError("an image's tokens are interrupted in the prompt");
                pos[0][i] = current, pos[1][i] = current + r, pos[2][i] = current + c;
            }
        current += std::max(rows, cols);
    }
    if (next != images.size())
        throw ModelError("the prompt has image tokens for " + std::to_string(next) + " of its " +
                         std::to_string(images.size()) + " images");
    return out;
}

}  // namespace dp::runtime
