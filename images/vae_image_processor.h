#pragma once
// VaeImageProcessor's PIL paths beyond a plain resize (diffusers 0.42.1, image_processor.py), byte
// for byte as Pillow 13 computes them, for an inpainting's padding_mask_crop: the region of the
// mask to work on (get_crop_region), the resize modes "fill" (the image fitted inside, the bands
// left filled from its edges) and "crop" (the image covering, its excess cut), and the result
// pasted back over the original through the mask (apply_overlay). No LibTorch.

#include "images/input_image.h"

namespace dp::images {

// A rectangle of whole pixels, [x0, x1) x [y0, y1).
struct Box {
    int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
    int width() const { return x1 - x0; }
    int height() const { return y1 - y0; }
    bool operator==(const Box& o) const { return x0 == o.x0 && y0 == o.y0 && x1 == o.x1 && y1 == o.y1; }
};

// image.crop(box) of a box within the image. Throws std::invalid_argument for one that is not.
RgbImage crop(const RgbImage& image, const Box& box);

// VaeImageProcessor.resize(image, height, width, resize_mode="fill"): resized with `mode` to fit
// within width x height at its ratio, centred, the bands on either side filled by resizing the
// pixels about its first and last row (or column) to them (bicubic: Image.resize's default).
RgbImage resize_fill(const RgbImage& image, int width, int height, Resample mode = Resample::kLanczos);
// ... resize_mode="crop": resized to cover width x height at its ratio, centred, the excess cut.
RgbImage resize_crop(const RgbImage& image, int width, int height, Resample mode = Resample::kLanczos);

// VaeImageProcessor.get_crop_region(mask, width, height, pad): the smallest box holding every
// pixel of the mask that is not 0, grown by `pad` on each side (within the mask), then grown
// along one side to width:height's ratio, shifted back within the mask. Throws
// std::invalid_argument for a mask with no pixel above 0 (diffusers divides by zero).
Box crop_region(const GreyImage& mask, int width, int height, int pad);

// VaeImageProcessor.apply_overlay(mask, original, generated, crop): `generated` resized ("crop")
// into `crop` of a black canvas of the original's size, then the original composited over it
// through the inverted mask (Pillow's premultiplied paste and alpha_composite), so that only the
// mask's white part is new. `mask` is the original's size. Throws std::invalid_argument when the
// sizes do not fit (Pillow's "images do not match").
RgbImage apply_overlay(const GreyImage& mask, const RgbImage& original, const RgbImage& generated,
                       const Box& crop);

}  // namespace dp::images
