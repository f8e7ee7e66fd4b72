#pragma once
// Note [img2img in the one loop]: an edit line (its `image`, protocol::InputImage) runs the same
// denoising loop as a text-to-image one, as diffusers' *Img2ImgPipeline classes do: the input's
// pixels are resized and normalised as VaeImageProcessor.preprocess does, the family's VAE encoder
// gives their latent distribution, the loop draws its sample and then the starting noise from
// the prompt's own generator (diffusers' retrieve_latents in "sample" mode, then randn_tensor),
// mixes them at the sigma `strength` selects (FlowMatchEulerDiscreteScheduler.scale_noise) and
// runs the steps from there (get_timesteps).

#include <ATen/core/Tensor.h>

#include <optional>

#include "images/input_image.h"
#include "images/vae_image_processor.h"
#include "protocol/call_arguments.h"

namespace dp::runtime {

// The first step an edit at `strength` runs, of `steps`: diffusers' get_timesteps,
// int(steps - min(steps * strength, steps)). Throws ModelError when no step would be left.
int img2img_first_step(int steps, double strength);

// The image's pixels as the VAE encoder takes them: decoded (PIL's pixels), resized to width x
// height with PIL's Lanczos where its size differs, in [-1, 1] as VaeImageProcessor makes them
// ([1, 3, height, width], float32 on the CPU). With `crop` (an inpainting's padding_mask_crop),
// that region of it, resized to fill width x height (resize_mode "fill"). Throws InputDataError
// when the file is not the one the launcher read (its SHA-256), or no longer decodes.
at::Tensor input_pixels(const protocol::InputImage& image, int width, int height,
                        const std::optional<images::Box>& crop = std::nullopt);

// The image's pixels resized to width x height where its size differs (PIL's Lanczos), then `box`
// of them cut out without resizing (Flux2ImageProcessor's centre crop), in [-1, 1]: [1, 3, box
// height, box width] float32 on the CPU. Throws as input_pixels does.
at::Tensor input_pixels_cut(const protocol::InputImage& image, int width, int height, const images::Box& box);

// The same pixels as 8-bit RGB (PIL's image after VaeImageProcessor.resize), before any
// normalisation: what a pipeline gives its processor (QwenImageEditPipeline's vision encoder).
images::RgbImage input_rgb(const protocol::InputImage& image, int width, int height);

// An inpainting mask as the mask processor makes it: decoded, resized to width x height as the
// image is (`crop` too), made grey (PIL's convert("L")), over 255 and binarized (0.5 and above: 1,
// repainted), [1, 1, height, width] float32 on the CPU. Throws as input_pixels does.
at::Tensor input_mask(const protocol::InputImage& mask, int width, int height,
                      const std::optional<images::Box>& crop = std::nullopt);

// Note [padding_mask_crop]: an inpainting line with padding_mask_crop works on the region of the
// image its mask's white part (grown by that many pixels, then to the output's ratio) covers, as
// diffusers' *InpaintPipeline classes do: the image and the mask are cropped to it and resized
// to fill the output size, the steps run on that, and the result is resized back into the region
// and composited over the original through the mask, so the image made is the original's size
// with only the masked part new. The region, from the decoded mask (its size the image's, which
// the launcher checks): nullopt for a line without padding_mask_crop or without a mask. Throws
// ModelError for a mask with no white pixel (diffusers divides by zero there).
std::optional<images::Box> inpaint_crop(const protocol::CallValues& arguments, int width, int height);
// The made images [n, height, width, 3] uint8 (the crop's output size), each pasted back into the
// original as apply_overlay does: [n, original height, original width, 3] uint8.
at::Tensor overlay_inpainting(const at::Tensor& made, const protocol::CallValues& arguments,
                              const images::Box& crop);

// FlowMatchEulerDiscreteScheduler.scale_noise: sigma * noise + (1 - sigma) * sample, with sigma
// in the sample's dtype.
at::Tensor scale_noise(const at::Tensor& sample, const at::Tensor& noise, float sigma);

}  // namespace dp::runtime
