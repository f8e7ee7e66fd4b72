#pragma once
// Note [adapters]: a LoRA adapter changes some linear weights of a model,
//     W' = W + scale * (alpha / rank) * up @ down,        up [out, rank], down [rank, in],
// summed over the adapters of a set (diffusers' load_lora_weights + set_adapters, merged as
// peft's merge does). An adapter file says which weights it changes in one of the layouts our
// users download:
//   - diffusers / PEFT (save_lora_weights): `transformer.<module>.lora_A.weight` (down) and
//     `.lora_B.weight` (up), `text_encoder.*`, `text_encoder_2.*`, with the adapter's `r`,
//     `lora_alpha` and per-module rank and alpha patterns in the header's metadata; older files
//     without a prefix or with `.lora.down.weight` / `.lora.up.weight`;
//   - kohya / sd-scripts: `lora_unet_<module with '_' for '.'>`, `lora_te1_*`, `lora_te2_*`,
//     `lora_te3_*` with `.lora_down.weight`, `.lora_up.weight` and a scalar `.alpha`; FLUX's in
//     Black Forest Labs' block names (`lora_unet_double_blocks_0_img_attn_qkv`), whose fused
//     projections (qkv; linear1 = q, k, v and the MLP's input) take row ranges of one `up` and
//     share its `down`;
//   - the original layouts under `diffusion_model.` (FLUX's block names, Qwen-Image's own names,
//     with lora_A/lora_B or lora_down/lora_up and alpha).
// Formats that are not plain LoRA (DoRA, LoKr, LoHa, LoCon's mid weights, full `diff` weights,
// LoRA biases) are refused by name, as are a layer with pairs in two styles, metadata switches
// that are not true or false, and a header with a key given twice. read_lora_layout reads the
// header (and kohya's alpha scalars) only: the launcher checks an adapter before any rank starts,
// the worker reads the same layout and then its tensors (runtime/io/lora.h). The launcher also
// reads every value once (check_lora_values). No LibTorch.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strategies/parallel_spec.h"

namespace dp::strategies {

class SafetensorsFile;

// Component -> tensor name -> shape: the weights an adapter may change.
using ModelTensors = std::map<std::string, std::map<std::string, std::vector<int64_t>>>;

// The tensors of the components of `spec` an adapter can change (the transformer and the text
// encoders, not the VAE) in `model_dir`'s `variant` files, or its config-only tensors.json.
// Throws protocol::ModelError naming an unreadable header.
ModelTensors adapter_targets(const std::string& model_dir, const ParallelSpec& spec,
                             const std::string& variant);

// One change of one base weight by an adapter file.
struct LoraTerm {
    std::string component;  // "transformer", "text_encoder", "text_encoder_2", "text_encoder_3"
    std::string weight;     // the base tensor: "transformer_blocks.0.attn.to_q.weight"
    std::string down, up;   // the file's tensors: down [rank, in], up [rows, rank]
    // The rows of `up` this weight's change takes, as (first, count) ranges in order (a fused
    // projection's part, or halves swapped); empty: all of them.
    std::vector<std::pair<int64_t, int64_t>> up_rows;
    int64_t rank = 0;
    double alpha_scale = 1;  // alpha / rank (use_rslora: alpha / sqrt(rank))
};

struct LoraLayout {
    std::string path;
    std::string format;  // "diffusers/PEFT", "kohya", "kohya (FLUX.1 original names)", ...
    std::vector<LoraTerm> terms;
};

// What adapter file `path` changes in the model of `spec` whose weights are `model`. Throws
// protocol::Error with exit 66 when the file does not exist, and protocol::ModelError (65) naming
// the file when it is no valid safetensors file (truncation included), a format we do not run
// (named), keys that map to no weight of this model (the first few, and which model family the
// adapter looks made for), a shape that does not fit its weight, or an alpha that is not finite.
LoraLayout read_lora_layout(const std::string& path, const ParallelSpec& spec, const ModelTensors& model);
// The same of a file already open (the worker's copy of an adapter's bytes, runtime/io/lora.h).
LoraLayout read_lora_layout(const SafetensorsFile& file, const ParallelSpec& spec, const ModelTensors& model);

// Throws protocol::ModelError naming the file, the tensor and the element when a LoRA tensor of
// `layout` holds NaN or an infinity (F64, F32, F16, BF16 and fp8 tensors; integers hold none):
// its every image would be NaN. Reads each pair's values once, about as long as the file's SHA-256.
void check_lora_values(const LoraLayout& layout);

// The model family an adapter's tensor names look made for ("FLUX.1", "SD3", "Qwen-Image", "a
// UNet model (SD 1.x / SDXL)"), or empty when they do not say.
std::string adapter_family_guess(const std::vector<std::string>& tensor_names);

}  // namespace dp::strategies
