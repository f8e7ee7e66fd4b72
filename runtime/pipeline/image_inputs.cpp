#include "runtime/pipeline/image_inputs.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "images/input_image.h"
#include "runtime/io/errors.h"
#include "strategies/sha256.h"

namespace dp::runtime {

int img2img_first_step(int steps, double strength) {
    const int first = protocol::edit_first_step(steps, strength);
    if (first >= steps)
        throw ModelError("strength " + std::to_string(strength) + " over " + std::to_string(steps) +
                         " steps leaves no step to run (give a larger strength or more steps)");
    return first;
}

namespace {

// The file the launcher read, decoded and resized to width x height (PIL's Lanczos).
images::RgbImage read_input(const protocol::InputImage& image, int width, int height) {
    if (!image.sha256.empty() && strategies::file_sha256(image.path) != image.sha256)
        throw protocol::InputDataError(image.path +
                                       ": the image changed since the job started (its SHA-256 is not " +
                                       image.sha256 + ")");
    images::RgbImage rgb = images::decode_image(image.path);
    if (rgb.width != width || rgb.height != height) rgb = images::resize(rgb, width, height);
    return rgb;
}

}  // namespace

at::Tensor input_mask(const protocol::InputImage& mask, int width, int height) {
    images::GreyImage grey = images::to_grey(read_input(mask, width, height));
    const at::Tensor bytes =
        at::from_blob(grey.grey.data(), {1, 1, height, width}, at::TensorOptions().dtype(at::kByte));
    return bytes.to(at::kFloat).div_(255.0f).ge(0.5).to(at::kFloat);
}

at::Tensor input_pixels(const protocol::InputImage& image, int width, int height) {
    images::RgbImage rgb = read_input(image, width, height);
    // np.array(image).astype(np.float32) / 255.0, then 2 x - 1: float32 at each step.
    const at::Tensor bytes =
        at::from_blob(rgb.rgb.data(), {1, height, width, 3}, at::TensorOptions().dtype(at::kByte));
    const at::Tensor unit = bytes.to(at::kFloat).div_(255.0f).permute({0, 3, 1, 2}).contiguous();
    return unit.mul(2.0).sub_(1.0);
}

at::Tensor scale_noise(const at::Tensor& sample, const at::Tensor& noise, float sigma) {
    const at::Tensor s = at::scalar_tensor(sigma, sample.options().device(at::kCPU)).to(sample.device());
    return s * noise + (1.0 - s) * sample;
}

}  // namespace dp::runtime
