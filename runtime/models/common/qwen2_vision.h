#pragma once
// The vision side of transformers' Qwen2_5_VLForConditionalGeneration, as diffusers'
// QwenImageEditPipeline and QwenImageEditPlusPipeline run it (transformers 5.24, PIL backend):
//   - the processor's image path (Qwen2VLImageProcessor): smart_resize to multiples of
//     patch_size x merge_size within min_pixels and max_pixels, Pillow's bicubic resize of the
//     uint8 image, the OpenAI CLIP normalisation, and the patches in the processor's order (2 x 2
//     merge groups in raster order, each patch's values as (channel, temporal copy, row, column));
//   - the vision tower (its `visual` module): the patch embedding (a Conv3d over temporal patches),
//     blocks of pre-norm attention, windowed except in fullatt_block_indexes, with a 2-D rotary
//     position per patch, and the patch merger (RMS norm, 4 patches into one token, a GELU MLP to
//     the language model's width);
//   - the language model's rotary positions for text with images (get_rope_index: three sections,
//     an image's tokens at (t, row, column) offsets from the text before it).
//
// Note [Qwen2.5-VL positions with images]: transformers 5 computes the three-section positions
// only when it is given the processor's mm_token_type_ids, which diffusers 0.42.1 does not pass
// (diffusers issue #14194, PR #14189): its text encoder then gives every token, image tokens
// included, the sequential position of a text-only prompt. We give the model the positions it was
// trained with (the processor's, as transformers 4 computed them) by default, and diffusers'
// shipped ones with the call argument `sequential_positions` 1, so that either image can be had.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "images/input_image.h"
#include "runtime/io/config_file.h"
#include "runtime/io/weights.h"
#include "runtime/models/common/layers.h"
#include "runtime/parallel/parallel_context.h"
#include "runtime/parallel/parallel_linear.h"

namespace dp::runtime {

// processor/preprocessor_config.json (Qwen2VLImageProcessor). Absent keys take the class's
// defaults; min_pixels and max_pixels win over size's shortest_edge and longest_edge, as the class
// reads them.
struct Qwen2VLProcessorConfig : ConfigFile<Qwen2VLProcessorConfig> {
    int64_t patch_size = 14, merge_size = 2, temporal_patch_size = 2;
    int64_t min_pixels = 56 * 56, max_pixels = 28 * 28 * 1280;
    std::array<float, 3> image_mean{0.48145466f, 0.4578275f, 0.40821073f};
    std::array<float, 3> image_std{0.26862954f, 0.26130258f, 0.27577711f};

    // The side of a merged token in pixels: patch_size x merge_size.
    int64_t factor() const { return patch_size * merge_size; }
    // Throws ModelError naming the file and key for a missing, mistyped or unsupported value
    // (a resample other than bicubic, rescaling or normalising turned off).
    static Qwen2VLProcessorConfig from_json_text(const std::string& text, const std::string& path);
};

// transformers' smart_resize: height and width rounded (half to even) to multiples of `factor`,
// scaled down or up to stay within [min_pixels, max_pixels]. {height, width}. Throws ModelError
// for a ratio over 200, as transformers does.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                         int64_t max_pixels);

// One image through the processor: its patches [grid_h * grid_w, 3 * temporal * patch * patch]
// float32 on the CPU, and its grid (temporal 1, grid_h, grid_w in patches).
struct VisionPatches {
    at::Tensor values;
    int64_t grid_h = 0, grid_w = 0;
    // The language model's tokens the image makes: grid_h x grid_w over merge_size squared.
    int64_t tokens(int64_t merge_size) const { return grid_h * grid_w / (merge_size * merge_size); }
};
VisionPatches qwen2vl_patches(const images::RgbImage& image, const Qwen2VLProcessorConfig& config);

// The `vision_config` of a Qwen2.5-VL config.json.
struct Qwen2VisionConfig : ConfigFile<Qwen2VisionConfig> {
    int64_t depth = 32, hidden_size = 1280, num_heads = 16, intermediate_size = 3420;
    int64_t patch_size = 14, temporal_patch_size = 2, spatial_merge_size = 2, window_size = 112;
    int64_t out_hidden_size = 3584, in_channels = 3;
    std::vector<int64_t> fullatt_block_indexes{7, 15, 23, 31};
    double rope_theta = 10000.0;
    int64_t image_token_id = 151655;  // the top level's: the <|image_pad|> tokens' id

    int64_t head_dim() const { return hidden_size / num_heads; }
    // Values per patch: channels x temporal x patch x patch.
    int64_t patch_values() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
    // Reads text_encoder/config.json's vision_config and image_token_id. Throws ModelError naming
    // the key for a missing, mistyped or unsupported value (an activation other than silu, heads
    // that do not divide the width into even heads, a window not a multiple of the merged patch).
    static Qwen2VisionConfig from_json_text(const std::string& text, const std::string& path);
};

class Qwen2VisionTower {
  public:
    // Tensors under visual.* (original checkpoints, transformers 4) or model.visual.*
    // (transformers 5's module names), whichever the store holds. With a tensor group of more
    // ranks than one, strategies::qwen2_vision_spec's rules split it: each rank its share of the
    // heads (of q, k and v alike; unevenly where the ranks do not divide them) and of the MLP's
    // features, the patch embedding, norms and merger whole. With more ranks than heads it is
    // whole on every rank. Every rank of the group then calls forward with the same inputs.
    Qwen2VisionTower(const Qwen2VisionConfig& config, WeightStore& weights, const TensorGroup& tp = {});

    // The images' merged tokens, [sum of tokens, out_hidden_size] in the weights' dtype on their
    // device: each image's in raster order of its merged grid, the images one after another.
    at::Tensor forward(const std::vector<VisionPatches>& images) const;

    const Qwen2VisionConfig& config() const { return config_; }

  private:
    struct Block {
        RMSNorm norm1, norm2;
        ParallelLinear qkv, proj, gate, up, down;
        bool full = false;  // attends within each image, else within each window
    };
    Qwen2VisionConfig config_;
    int64_t local_heads_ = 0;  // this rank's share of the heads
    at::Tensor patch_w_;       // [hidden, in_channels, temporal, patch, patch]
    std::vector<Block> blocks_;
    RMSNorm merger_norm_;
    at::Tensor merger_w1_, merger_b1_, merger_w2_, merger_b2_;
};

// get_rope_index for one row of `ids` (its `valid` first tokens real, the rest padding): the
// three position streams [3, ids.size()] int64. A run of `image_token` ids takes the next image of
// `images` (in order): its token (r, c) of the merged grid gets (p, p + r, p + c) with p the
// position after the text before it, and the text after it continues from p + max(rows, columns).
// Text gets the same position on all three; padding 0. Throws ModelError when the image tokens do
// not match the images' counts.
at::Tensor qwen2vl_positions(const std::vector<int64_t>& ids, int64_t valid, int64_t image_token,
                             const std::vector<VisionPatches>& images, int64_t merge_size);

}  // namespace dp::runtime
