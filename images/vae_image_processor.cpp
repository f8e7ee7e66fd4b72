// Pillow 13's crop, paste, RGBA and RGBa conversions and alpha_composite as libImaging computes
// them (Paste.c, Convert.c, AlphaComposite.c: the same integer formulas), and diffusers 0.42.1's
// VaeImageProcessor code that calls them.

#include "images/vae_image_processor.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace dp::images {

namespace {

// Pillow's SHIFTFORDIV255 and MULDIV255 / DIV255: a / 255 rounded, in integers.
uint32_t shift_div255(uint32_t a) { return ((a >> 8) + a) >> 8; }
uint32_t div255(uint32_t a) { return shift_div255(a + 128); }

// Image.paste(src, (x, y)) without a mask: the part of `src` that falls within `dst`.
void paste(RgbImage& dst, const RgbImage& src, int x, int y) {
    const int sx = std::max(0, -x), sy = std::max(0, -y);
    const int dx = std::max(0, x), dy = std::max(0, y);
    const int w = std::min(src.width - sx, dst.width - dx), h = std::min(src.height - sy, dst.height - dy);
    if (w <= 0 || h <= 0) return;
    for (int row = 0; row < h; ++row)
        std::memcpy(&dst.rgb[(static_cast<std::size_t>(dy + row) * dst.width + dx) * 3],
                    &src.rgb[(static_cast<std::size_t>(sy + row) * src.width + sx) * 3],
                    static_cast<std::size_t>(w) * 3);
}

RgbImage black(int width, int height) {
    return {width, height, std::vector<uint8_t>(static_cast<std::size_t>(width) * height * 3, 0)};
}

}  // namespace

RgbImage crop(const RgbImage& image, const Box& box) {
    if (box.x0 < 0 || box.y0 < 0 || box.x1 > image.width || box.y1 > image.height || box.width() < 1 ||
        box.height() < 1)
        throw std::invalid_argument("crop: the box must lie within the image");
    RgbImage out = black(box.width(), box.height());
    paste(out, image, -box.x0, -box.y0);
    return out;
}

RgbImage resize_fill(const RgbImage& image, int width, int height, Resample mode) {
    const double ratio = static_cast<double>(width) / height;
    const double src_ratio = static_cast<double>(image.width) / image.height;
    const int src_w = ratio < src_ratio ? width : image.width * height / image.height;
    const int src_h = ratio >= src_ratio ? height : image.height * width / image.width;
    const RgbImage resized = resize(image, src_w, src_h, mode);
    RgbImage out = black(width, height);
    paste(out, resized, width / 2 - src_w / 2, height / 2 - src_h / 2);
    // The bands: Image.resize without a filter, Pillow's default (bicubic), whatever `mode` is.
    const auto edge = [&](int w, int h, ResizeBox box) {
        return resize(resized, w, h, Resample::kBicubic, box);
    };
    const float rw = static_cast<float>(resized.width), rh = static_cast<float>(resized.height);
    if (ratio < src_ratio) {
        const int fill = height / 2 - src_h / 2;
        if (fill > 0) {
            paste(out, edge(width, fill, {0, 0, static_cast<float>(width), 0}), 0, 0);
            paste(out, edge(width, fill, {0, rh, static_cast<float>(width), rh}), 0, fill + src_h);
        }
    } else if (ratio > src_ratio) {
        const int fill = width / 2 - src_w / 2;
        if (fill > 0) {
            paste(out, edge(fill, height, {0, 0, 0, static_cast<float>(height)}), 0, 0);
            paste(out, edge(fill, height, {rw, 0, rw, static_cast<float>(height)}), fill + src_w, 0);
        }
    }
    return out;
}

RgbImage resize_crop(const RgbImage& image, int width, int height, Resample mode) {
    const double ratio = static_cast<double>(width) / height;
    const double src_ratio = static_cast<double>(image.width) / image.height;
    const int src_w = ratio > src_ratio ? width : image.width * height / image.height;
    const int src_h = ratio <= src_ratio ? height : image.height * width / image.width;
    const RgbImage resized = resize(image, src_w, src_h, mode);
    RgbImage out = black(width, height);
    // Python's floor division of the (possibly negative) offsets.
    const auto half = [](int a, int b) { return a / 2 - b / 2; };
    paste(out, resized, half(width, src_w), half(height, src_h));
    return out;
}

Box crop_region(const GreyImage& mask, int width, int height, int pad) {
    const int w = mask.width, h = mask.height;
    const auto column_empty = [&](int x) {
        for (int y = 0; y < h; ++y)
            if (mask.grey[static_cast<std::size_t>(y) * w + x] != 0) return false;
        return true;
    };
    const auto row_empty = [&](int y) {
        for (int x = 0; x < w; ++x)
            if (mask.grey[static_cast<std::size_t>(y) * w + x] != 0) return false;
        return true;
    };
    int left = 0, right = 0, top = 0, bottom = 0;
    while (left < w && column_empty(left)) ++left;
    while (right < w && column_empty(w - 1 - right)) ++right;
    while (top < h && row_empty(top)) ++top;
    while (bottom < h && row_empty(h - 1 - bottom)) ++bottom;
    if (left == w) throw std::invalid_argument("the mask has no white pixel to crop around");
    int x1 = std::max(left - pad, 0), y1 = std::max(top - pad, 0);
    int x2 = std::min(w - right + pad, w), y2 = std::min(h - bottom + pad, h);
    // Grown along one side to the processing ratio (Python: int() truncates, // floors).
    const double region = static_cast<double>(x2 - x1) / (y2 - y1);
    const double processing = static_cast<double>(width) / height;
    const auto floor_half = [](int a) { return a >= 0 ? a / 2 : -((-a + 1) / 2); };
    if (region > processing) {
        const int diff = static_cast<int>((x2 - x1) / processing - (y2 - y1));
        y1 -= floor_half(diff);
        y2 += diff - floor_half(diff);
        if (y2 >= h) y1 -= y2 - h, y2 = h;
        if (y1 < 0) y2 -= y1, y1 = 0;
        if (y2 >= h) y2 = h;
    } else {
        const int diff = static_cast<int>((y2 - y1) * processing - (x2 - x1));
        x1 -= floor_half(diff);
        x2 += diff - floor_half(diff);
        if (x2 >= w) x1 -= x2 - w, x2 = w;
        if (x1 < 0) x2 -= x1, x1 = 0;
        if (x2 >= w) x2 = w;
    }
    return {x1, y1, x2, y2};
}

RgbImage apply_overlay(const GreyImage& mask, const RgbImage& original, const RgbImage& generated,
                       const Box& crop) {
    const int width = original.width, height = original.height;
    if (mask.width != width || mask.height != height)
        throw std::invalid_argument("apply_overlay: the mask is " + std::to_string(mask.width) + "x" +
                                    std::to_string(mask.height) + ", the image " + std::to_string(width) +
                                    "x" + std::to_string(height) + " (Pillow: images do not match)");
    // The generated image resized into the crop of a black canvas (RGBA, converted back to RGB).
    RgbImage base = black(width, height);
    paste(base, resize_crop(generated, crop.width(), crop.height()), crop.x0, crop.y0);
    RgbImage out = base;
    for (std::size_t i = 0; i < static_cast<std::size_t>(width) * height; ++i) {
        // The original, RGBA then premultiplied (alpha 255: unchanged), pasted on a transparent
        // RGBa canvas through ImageOps.invert(mask): BLEND(m, 0, c) = DIV255(c m) per band.
        const uint32_t m = 255u - mask.grey[i];
        const uint32_t a = div255(255u * m);
        uint32_t src[3];
        for (int c = 0; c < 3; ++c) {
            const uint32_t premultiplied = div255(original.rgb[3 * i + c] * m);
            // RGBa -> RGBA: divided again unless alpha is 0 or 255.
            src[c] = a == 0 || a == 255 ? premultiplied : std::min<uint32_t>(255u, 255u * premultiplied / a);
        }
        if (a == 0) continue;  // alpha_composite keeps the destination
        // alpha_composite over an opaque destination (7 bits of precision).
        const uint32_t blend = 255u * (255u - a);
        const uint32_t outa255 = a * 255u + blend;
        const uint32_t coef1 = a * 255u * 255u * (1u << 7) / outa255;
        const uint32_t coef2 = 255u * (1u << 7) - coef1;
        for (int c = 0; c < 3; ++c) {
            const uint32_t t = src[c] * coef1 + base.rgb[3 * i + c] * coef2;
            out.rgb[3 * i + c] = static_cast<uint8_t>(shift_div255(t + (0x80u << 7)) >> 7);
        }
    }
    return out;
}

}  // namespace dp::images
