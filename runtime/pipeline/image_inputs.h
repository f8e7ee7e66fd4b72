#pragma once
// Note [img2img in the one loop]: an edit line (its `image`, protocol::InputImage) runs the same
// denoising loop as a text-to-image one, as diffusers' *Img2ImgPipeline classes do: the input's
// pixels are resized and normalised as VaeImageProcessor.preprocess does, the family's VAE encoder
// gives their latent distribution, the loop draws its sample and then the starting noise from
// the prompt's own generator (diffusers' retrieve_latents in "sample" mode, then randn_tensor),
// mixes them at the sigma `strength` selects (FlowMatchEulerDiscreteScheduler.scale_noise) and
// runs the steps from there (get_timesteps).

#include <ATen/core/Tensor.h>

#include "protocol/call_arguments.h"

namespace dp::runtime {

// The first step an edit at `strength` runs, of `steps`: diffusers' get_timesteps,
// int(steps - min(steps * strength, steps)). Throws ModelError when no step would be left.
int img2img_first_step(int steps, double strength);

// The image's pixels as the VAE encoder takes them: decoded (PIL's pixels), resized to width x
// height with PIL's Lanczos where its size differs, in [-1, 1] as VaeImageProcessor makes them
// ([1, 3, height, width], float32 on the CPU). Throws InputDataError when the file is not the
// one the launcher read (its SHA-256), or no longer decodes.
at::Tensor input_pixels(const protocol::InputImage& image, int width, int height);

// An inpainting mask as the mask processor makes it: decoded, resized to width x height as the
// image is, made grey (PIL's convert("L")), over 255 and binarized (0.5 and above: 1, repainted),
// [1, 1, height, width] float32 on the CPU. Throws as input_pixels does.
at::Tensor input_mask(const protocol::InputImage& mask, int width, int height);

// FlowMatchEulerDiscreteScheduler.scale_noise: sigma * noise + (1 - sigma) * sample, with sigma
// in the sample's dtype.
at::Tensor scale_noise(const at::Tensor& sample, const at::Tensor& noise, float sigma);

}  // namespace dp::runtime
