#pragma once
// The original layouts of the files our users download (Note [single files], Note [bundled
// files]), each mapped to diffusers' names in one place: Black Forest Labs' FLUX.1 transformer,
// Stability AI's SD3 transformer (joint_blocks), and the original latent-diffusion VAE. Each fills
// `out.tensors`/`out.shapes` from the component's tensors under `out.prefix` and names what it
// does not place as "(unplaced) NAME" for single_file_problem. Headers only, no LibTorch.

#include "strategies/single_file.h"

namespace dp::strategies {

void map_flux_original(const CheckpointTensors& file, SingleFileLayout& out);
void map_sd3_original(const CheckpointTensors& file, SingleFileLayout& out);
void map_ldm_vae(const CheckpointTensors& file, SingleFileLayout& out);

}  // namespace dp::strategies
