#pragma once
// Note [single files]: the checkpoints our users download are often one file per component, or
// one file for the whole model, in the layout of the model's authors rather than diffusers':
// Black Forest Labs' `flux1-dev.safetensors` (`double_blocks.N.img_attn.qkv`, fused q, k, v rows;
// `single_blocks.N.linear1`, fused q, k, v and the MLP's input; `final_layer.adaLN_modulation.1`,
// whose shift and scale halves come in the other order), often under ComfyUI's
// `model.diffusion_model.` prefix, in bf16, fp8 (`F8_E4M3`) or ComfyUI's "scaled fp8" (a
// `scaled_fp8` marker and a scalar `X.scale_weight` beside each fp8 `X.weight`, the weight being
// the fp8 value times it). A family's single-file layout maps each of the component's tensors, by
// its diffusers name, to where the file keeps it: a tensor, the rows of it (a fused projection's
// part, or halves in another order), and its scale. The widths come from the file's own shapes, so
// a small model converts as the real one does. Everything here reads headers only (no LibTorch):
// the launcher checks a file against the model's config before any rank starts, `plan` reports
// it, and the worker reads the tensors through the same map (runtime/io/weights.h).

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strategies/parallel_spec.h"
#include "strategies/safetensors.h"

namespace dp::strategies {

// Where a single file keeps one of the component's tensors.
struct StoredTensor {
    std::string tensor;  // the file's tensor
    // The rows of it, as (first, count) ranges taken in order; empty: the whole tensor.
    std::vector<std::pair<int64_t, int64_t>> rows;
    std::string scale;  // a scalar the stored values are multiplied by (scaled fp8); empty: none
    // A 1x1 convolution's weight ([out, in, 1, 1], or [out, in, 1]) standing for a linear layer's
    // ([out, in]): the original VAE layout's attention projections.
    bool squeeze = false;
    // Not in the file: the identity matrix (`tensor` empty). SD3's CLIP-L in Stability's files,
    // whose pooled output SD3 takes unprojected (Note [bundled files]).
    bool identity = false;
};

struct SingleFileLayout {
    std::string path;
    std::string
        layout;  // "diffusers", "Black Forest Labs' original (FLUX.1)", "Stability AI's original (SD3)"
    std::string prefix;  // the prefix the component's keys carry ("model.diffusion_model."), or empty
    std::string format;  // the stored weights' dtype: "bf16", "fp16", "fp32", "fp8 (e4m3)", "scaled fp8
                         // (e4m3)", "GGUF Q4_K (and F32, Q8_0)"
    bool gguf = false;   // a GGUF file (strategies/gguf.h), else safetensors
    std::size_t quantized_bytes = 0;  // GGUF: bytes of the component's tensors in a quantized type
    std::map<std::string, StoredTensor> tensors;         // diffusers name -> where the file keeps it
    std::map<std::string, std::vector<int64_t>> shapes;  // diffusers name -> its shape
};

// The layout of `file` as component `component` ("transformer", "text_encoder", ...) of a model of
// `spec`'s family: FLUX.1's original names for its transformer, else diffusers' / transformers'
// own names, under a prefix all of the file's keys share. Throws protocol::ModelError (65) naming
// the file when its names look made for another family (naming it), are a layout not read yet, or
// a fused tensor's rows or a scale are inconsistent.
SingleFileLayout read_single_file_layout(const SafetensorsFile& file, const ParallelSpec& spec,
                                         const std::string& component);
// The same for a GGUF file (Note [gguf]).
class GgufFile;
SingleFileLayout read_single_file_layout(const GgufFile& file, const ParallelSpec& spec,
                                         const std::string& component);
// The file at `path`, a GGUF file when it starts with GGUF's magic, else a safetensors file.
SingleFileLayout read_single_file_layout(const std::string& path, const ParallelSpec& spec,
                                         const std::string& component);

// Note [bundled files]: one file can hold a whole pipeline, each component under its own prefix,
// as Stability AI's SD3 files do: the transformer under `model.diffusion_model.`, the text
// encoders under `text_encoders.clip_l.transformer.`, `text_encoders.clip_g.transformer.` and
// `text_encoders.t5xxl.transformer.` (transformers' own names after it), the VAE under
// `first_stage_model.` (or `vae.`) in the original latent-diffusion layout (`encoder.down.I.block.J`,
// `decoder.up.K`, numbered from the bottom, `mid.attn_1.q` as 1x1 convolutions). Each component is
// read from its prefix's tensors alone. SD3 takes CLIP-L's pooled output unprojected, so, as
// diffusers does, CLIP-L's text projection from such a file is the identity whatever the file holds;
// a T5's `encoder.embed_tokens.weight` beside `shared.weight` is the same tensor, and CLIP's
// `position_ids` are not weights: both are passed over. The components of `spec`'s model that the
// file at `path` holds, in the spec's order; empty when it is no bundle (one component's file).
std::vector<std::string> bundled_components(const std::string& path, const ParallelSpec& spec);

// What a checkpoint says of each tensor: its shape (torch's order), its stored dtype ("BF16",
// "F8_E4M3", GGUF's "Q4_K") and bytes; the layouts are read from this alone.
struct CheckpointTensor {
    std::vector<int64_t> shape;
    std::string dtype;
    std::size_t nbytes = 0;
};
using CheckpointTensors = std::map<std::string, CheckpointTensor>;
// The tensors of the GGUF or safetensors file at `path` (headers only). Throws protocol::ModelError
// naming the file when it is neither, or corrupt.
CheckpointTensors read_checkpoint_tensors(const std::string& path);

// Note [a model from one file]: `--model FILE` is a checkpoint of one model; its family and variant
// are told by its tensor names (FLUX.1's `double_blocks`, dev's `guidance_in`; Qwen-Image's
// `txt_norm`), and the configs come from `--config FOLDER` or the shipped config-only folder of
// that model. The shipped folder's name for the checkpoint at `path` ("flux.1-dev"), or a
// protocol::ModelError naming the file and what its names look like.
std::string shipped_config_for(const std::string& path);
SingleFileLayout read_single_file_layout(const std::string& path, const CheckpointTensors& tensors,
                                         const ParallelSpec& spec, const std::string& component, bool gguf);

// What keeps `layout` from standing in for a component whose tensors are `expected` (diffusers
// name -> shape, from the model's config folder: strategies::tensor_shapes): the first tensors
// missing (in the file's own names where it has a layout of its own, and the blocks it has), those
// whose shapes differ, and tensors the component has no place for. Empty when it fits.
std::string single_file_problem(const SingleFileLayout& layout,
                                const std::map<std::string, std::vector<int64_t>>& expected);

}  // namespace dp::strategies
