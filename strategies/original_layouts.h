#pragma once
// The original layouts of the files our users download (Note [single files], Note [bundled
// files]): the tools a family's original transformer layout is mapped to diffusers' names with
// (its tables live in its facts file, strategies/families/), and the original latent-diffusion
// VAE, which several families share. Each fills `out.tensors`/`out.shapes` from the component's
// tensors under `out.prefix` and names what it does not place as "(unplaced) NAME" for
// single_file_problem. Headers only, no LibTorch.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "strategies/family.h"
#include "strategies/single_file.h"

namespace dp::strategies {

// A module (or tensor) of an original layout and where it goes in diffusers' names: `to` ends in
// '.' for a module (".weight" and ".bias" follow) or names a tensor whole; a fused module lists its
// parts, which share its rows in order.
struct ModuleRename {
    const char* from;
    std::vector<const char*> to;
};

// Places a file's tensors under diffusers' names, remembering which it used.
struct LayoutMapper {
    const CheckpointTensors& file;
    SingleFileLayout& out;
    std::set<std::string> used;  // the file's tensors placed

    // The file's tensor `name` under the component's prefix, or nullptr.
    const CheckpointTensor* find(const std::string& name) const;
    // `from` (a module ending in '.', or a tensor) to `to`, its fused parts each `width` rows but
    // the last (width 0: equal parts); `swap_halves`: the two halves of its rows in the other order.
    // Throws protocol::ModelError when the rows do not split so.
    void place(const std::string& from, const std::vector<std::string>& to, int64_t width,
               bool swap_halves = false);
    void place(const ModuleRename& module, int64_t width, bool swap_halves = false);
};

// Each block `from`N. of the file, its modules renamed under `to`N.; `halved`: one more module
// whose two halves of rows come in the other order in the last block only (SD3's last joint block).
void place_blocks(LayoutMapper& m, int64_t width, const std::string& from, const std::string& to,
                  const std::vector<ModuleRename>& modules, const ModuleRename* halved = nullptr);
// What the file holds under the component's prefix beyond what `m` placed, named for
// single_file_problem.
void mark_unplaced(const LayoutMapper& m);

// An adapter's module of an original layout that fuses `modules` (diffusers' names, in the order
// their rows are stacked: a fused qkv): each part the rows of its own weight in `weights` (diffusers'
// name with ".weight" -> shape); empty when one is missing or not 2-D.
std::vector<LoraPart> stacked_parts(const std::vector<std::string>& modules,
                                    const std::map<std::string, std::vector<int64_t>>& weights);

// The original latent-diffusion VAE (`encoder.down.I.block.J`, `decoder.up.K` numbered from the
// bottom, `mid.attn_1.q` as 1x1 convolutions) in diffusers' AutoencoderKL names.
void map_ldm_vae(const CheckpointTensors& file, SingleFileLayout& out);

}  // namespace dp::strategies
