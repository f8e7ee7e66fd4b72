#include "runtime/pipeline/image_inputs.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

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

// The file the launcher read, decoded.
images::RgbImage decoded(const protocol::InputImage& image) {
    if (!image.sha256.empty() && strategies::file_sha256(image.path) != image.sha256)
        throw protocol::InputDataError(image.path +
                                       ": the image changed since the job started (its SHA-256 is not " +
                                       image.sha256 + ")");
    return images::decode_image(image.path);
}

// ... resized to width x height (PIL's Lanczos), or its `crop` resized to fill it.
images::RgbImage read_input(const protocol::InputImage& image, int width, int height,
                            const std::optional<images::Box>& crop) {
    images::RgbImage rgb = decoded(image);
    if (crop) return images::resize_fill(images::crop(rgb, *crop), width, height);
    if (rgb.width != width || rgb.height != height) rgb = images::resize(rgb, width, height);
    return rgb;
}

at::Tensor as_tensor(images::RgbImage& rgb) {
    return at::from_blob(rgb.rgb.data(), {rgb.height, rgb.width, 3}, at::TensorOptions().dtype(at::kByte));
}

// np.array(image).astype(np.float32) / 255.0, then 2 x - 1: float32 at each step, [1, 3, H, W].
at::Tensor normalized(images::RgbImage& rgb) {
    const at::Tensor bytes =
        at::from_blob(rgb.rgb.data(), {1, rgb.height, rgb.width, 3}, at::TensorOptions().dtype(at::kByte));
    const at::Tensor unit = bytes.to(at::kFloat).div_(255.0f).permute({0, 3, 1, 2}).contiguous();
    return unit.mul(2.0).sub_(1.0);
}

}  // namespace

std::optional<images::Box> inpaint_crop(const protocol::CallValues& arguments, int width, int height) {
    if (!arguments.has("padding_mask_crop") || !arguments.has("mask_image") ||
        arguments.image("mask_image").empty())
        return std::nullopt;
    const images::GreyImage mask = images::to_grey(decoded(arguments.image("mask_image")));
    try {
        return images::crop_region(mask, width, height,
                                   static_cast<int>(arguments.whole("padding_mask_crop")));
    } catch (const std::invalid_argument& e) {
        throw ModelError(arguments.image("mask_image").path + ": padding_mask_crop: " + e.what());
    }
}

at::Tensor overlay_inpainting(const at::Tensor& made, const protocol::CallValues& arguments,
                              const images::Box& crop) {
    images::RgbImage original = decoded(arguments.image("image"));
    const images::GreyImage mask = images::to_grey(decoded(arguments.image("mask_image")));
    if (mask.width != original.width || mask.height != original.height)
        throw ModelError("padding_mask_crop: the mask is " + std::to_string(mask.width) + "x" +
                         std::to_string(mask.height) + " and the image " + std::to_string(original.width) +
                         "x" + std::to_string(original.height) +
                         "; the result is pasted back through the mask, which "
                         "must be the image's size");
    std::vector<at::Tensor> out;
    for (int64_t i = 0; i < made.size(0); ++i) {
        const at::Tensor one = made[i].contiguous();
        images::RgbImage generated{
            static_cast<int>(one.size(1)), static_cast<int>(one.size(0)),
            std::vector<uint8_t>(one.data_ptr<uint8_t>(), one.data_ptr<uint8_t>() + one.numel())};
        images::RgbImage pasted = images::apply_overlay(mask, original, generated, crop);
        out.push_back(as_tensor(pasted).clone());
    }
    return at::stack(out, 0);
}

at::Tensor input_mask(const protocol::InputImage& mask, int width, int height,
                      const std::optional<images::Box>& crop) {
    images::GreyImage grey = images::to_grey(read_input(mask, width, height, crop));
    const at::Tensor bytes =
        at::from_blob(grey.grey.data(), {1, 1, height, width}, at::TensorOptions().dtype(at::kByte));
    return bytes.to(at::kFloat).div_(255.0f).ge(0.5).to(at::kFloat);
}

at::Tensor input_pixels(const protocol::InputImage& image, int width, int height,
                        const std::optional<images::Box>& crop) {
    images::RgbImage rgb = read_input(image, width, height, crop);
    return normalized(rgb);
}

at::Tensor input_pixels_cut(const protocol::InputImage& image, int width, int height,
                            const images::Box& box) {
    images::RgbImage rgb = images::crop(read_input(image, width, height, std::nullopt), box);
    return normalized(rgb);
}

images::RgbImage input_rgb(const protocol::InputImage& image, int width, int height) {
    return read_input(image, width, height, std::nullopt);
}

at::Tensor scale_noise(const at::Tensor& sample, const at::Tensor& noise, float sigma) {
    const at::Tensor s = at::scalar_tensor(sigma, sample.options().device(at::kCPU)).to(sample.device());
    return s * noise + (1.0 - s) * sample;
}

}  // namespace dp::runtime
