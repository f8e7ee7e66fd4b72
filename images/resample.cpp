// Pillow 13's resize and convert("L") for 8-bit RGB, computed as its C code computes them
// (libImaging/Resample.c, Geometry.c, Convert.c): the same doubles, in the same order, then the
// same fixed point, so that every byte agrees (Note [input images]).

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "images/input_image.h"

namespace dp::images {

namespace {

// Pillow's fixed point for 8-bit samples: 22 fractional bits leave room for 8 bits of sample
// and 2 of overshoot in a 32-bit sum.
constexpr int kPrecisionBits = 32 - 8 - 2;

double sinc(double x) {
    if (x == 0.0) return 1.0;
    x = x * M_PI;
    return std::sin(x) / x;
}

double lanczos_filter(double x) {
    if (-3.0 <= x && x < 3.0) return sinc(x) * sinc(x / 3);  // truncated sinc
    return 0.0;
}

double bilinear_filter(double x) {
    if (x < 0.0) x = -x;
    if (x < 1.0) return 1.0 - x;
    return 0.0;
}

double bicubic_filter(double x) {
    constexpr double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

struct Filter {
    double (*weight)(double);
    double support;
};

// One pass's coefficients: for each output index, the first input index, how many follow, and
// their fixed-point weights (ksize a row).
struct Coefficients {
    int ksize = 0;
    std::vector<int> first, count;
    std::vector<int32_t> weights;
};

// Pillow's precompute_coeffs and normalize_coeffs_8bpc for the box [in0, in1) of an input of
// in_size onto out_size.
Coefficients coefficients(int in_size, float in0, float in1, int out_size, const Filter& filter) {
    const double scale = static_cast<double>(in1 - in0) / out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = filter.support * filterscale;
    Coefficients c;
    c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
    c.first.resize(out_size);
    c.count.resize(out_size);
    c.weights.assign(static_cast<std::size_t>(out_size) * c.ksize, 0);
    std::vector<double> k(c.ksize);
    for (int xx = 0; xx < out_size; ++xx) {
        const double center = in0 + (xx + 0.5) * scale;
        const double ss = 1.0 / filterscale;
        int xmin = static_cast<int>(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = static_cast<int>(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double ww = 0.0;
        for (int x = 0; x < xmax; ++x) {
            const double w = filter.weight((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        int32_t* out = &c.weights[static_cast<std::size_t>(xx) * c.ksize];
        for (int x = 0; x < xmax; ++x) {
            const double v = ww != 0.0 ? k[x] / ww : k[x];
            out[x] = static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits)
                                                : 0.5 + v * (1 << kPrecisionBits));
        }
        c.first[xx] = xmin;
        c.count[xx] = xmax;
    }
    return c;
}

// Pillow's clip8: the sum's integer part, clamped to a byte.
uint8_t clip8(int64_t sum) {
    const int64_t v = sum >> kPrecisionBits;
    return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// One weighted sum per channel, rounded (half added first) and clipped. `stride`: bytes between
// the taps.
void weigh(const uint8_t* in, std::size_t stride, const int32_t* k, int taps, uint8_t* out) {
    for (int ch = 0; ch < 3; ++ch) {
        int64_t sum = 1 << (kPrecisionBits - 1);
        for (int i = 0; i < taps; ++i) sum += static_cast<int64_t>(in[i * stride + ch]) * k[i];
        out[ch] = clip8(sum);
    }
}

// ImagingResampleHorizontal_8bpc: rows [offset, offset + rows) of `in` onto `c`'s width.
RgbImage horizontal(const RgbImage& in, int offset, int rows, int width, const Coefficients& c) {
    RgbImage out{width, rows, std::vector<uint8_t>(static_cast<std::size_t>(width) * rows * 3)};
    for (int y = 0; y < rows; ++y) {
        const uint8_t* row = &in.rgb[static_cast<std::size_t>(y + offset) * in.width * 3];
        for (int x = 0; x < width; ++x)
            weigh(row + static_cast<std::size_t>(c.first[x]) * 3, 3,
                  &c.weights[static_cast<std::size_t>(x) * c.ksize], c.count[x],
                  &out.rgb[(static_cast<std::size_t>(y) * width + x) * 3]);
    }
    return out;
}

// ImagingResampleVertical_8bpc: `in` onto `c`'s height, `first` shifted by -`shift`.
RgbImage vertical(const RgbImage& in, int height, const Coefficients& c, int shift) {
    RgbImage out{in.width, height, std::vector<uint8_t>(static_cast<std::size_t>(in.width) * height * 3)};
    const std::size_t stride = static_cast<std::size_t>(in.width) * 3;
    for (int y = 0; y < height; ++y) {
        const int32_t* k = &c.weights[static_cast<std::size_t>(y) * c.ksize];
        const uint8_t* column = &in.rgb[static_cast<std::size_t>(c.first[y] - shift) * stride];
        for (int x = 0; x < in.width; ++x)
            weigh(column + static_cast<std::size_t>(x) * 3, stride, k, c.count[y],
                  &out.rgb[(static_cast<std::size_t>(y) * in.width + x) * 3]);
    }
    return out;
}

// ImagingResampleInner: horizontal pass over the rows the vertical pass reads, then vertical.
RgbImage resample(const RgbImage& in, int width, int height, const Filter& filter, const ResizeBox& box) {
    const Coefficients cx = coefficients(in.width, box.x0, box.x1, width, filter);
    const Coefficients cy = coefficients(in.height, box.y0, box.y1, height, filter);
    const int first_row = cy.first[0];
    const int last_row = cy.first[height - 1] + cy.count[height - 1];
    RgbImage out;
    const bool need_horizontal = width != in.width || box.x0 != 0 || box.x1 != static_cast<float>(width);
    const bool need_vertical = height != in.height || box.y0 != 0 || box.y1 != static_cast<float>(height);
    if (need_horizontal) out = horizontal(in, first_row, last_row - first_row, width, cx);
    if (need_vertical)
        out = vertical(need_horizontal ? out : in, height, cy, need_horizontal ? first_row : 0);
    if (!need_horizontal && !need_vertical) out = in;
    return out;
}

// ImagingCrop of a box within the image.
RgbImage crop_rows(const RgbImage& in, int x0, int y0, int x1, int y1) {
    RgbImage out{x1 - x0, y1 - y0, std::vector<uint8_t>(static_cast<std::size_t>(x1 - x0) * (y1 - y0) * 3)};
    for (int y = y0; y < y1; ++y)
        std::memcpy(&out.rgb[static_cast<std::size_t>(y - y0) * out.width * 3],
                    &in.rgb[(static_cast<std::size_t>(y) * in.width + x0) * 3],
                    static_cast<std::size_t>(out.width) * 3);
    return out;
}

// ImagingScaleAffine (Image.resize's NEAREST): source positions stepped in doubles from half a
// step in, truncated; as Pillow accumulates them, not multiplied.
RgbImage nearest(const RgbImage& in, int width, int height) {
    const double ax = static_cast<double>(static_cast<float>(in.width)) / width;
    const double ay = static_cast<double>(static_cast<float>(in.height)) / height;
    const auto coord = [](double v) { return v < 0.0 ? -1 : static_cast<int>(v); };
    std::vector<int> xin(width, -1);
    double xo = 0 + ax * 0.5;
    for (int x = 0; x < width; ++x, xo += ax) {
        const int v = coord(xo);
        if (v >= 0 && v < in.width) xin[x] = v;
    }
    RgbImage out{width, height, std::vector<uint8_t>(static_cast<std::size_t>(width) * height * 3, 0)};
    double yo = 0 + ay * 0.5;
    for (int y = 0; y < height; ++y, yo += ay) {
        const int yi = coord(yo);
        if (yi < 0 || yi >= in.height) continue;
        for (int x = 0; x < width; ++x)
            if (xin[x] >= 0)
                std::memcpy(&out.rgb[(static_cast<std::size_t>(y) * width + x) * 3],
                            &in.rgb[(static_cast<std::size_t>(yi) * in.width + xin[x]) * 3], 3);
    }
    return out;
}

}  // namespace

std::optional<Resample> resample_by_name(const std::string& name) {
    if (name == "nearest") return Resample::kNearest;
    if (name == "linear" || name == "bilinear") return Resample::kBilinear;
    if (name == "bicubic") return Resample::kBicubic;
    if (name == "lanczos") return Resample::kLanczos;
    return std::nullopt;
}

RgbImage resize(const RgbImage& image, int width, int height, Resample mode) {
    return resize(image, width, height, mode,
                  {0, 0, static_cast<float>(image.width), static_cast<float>(image.height)});
}

RgbImage resize(const RgbImage& image, int width, int height, Resample mode, const ResizeBox& box) {
    if (width < 1 || height < 1) throw std::invalid_argument("resize: the size must be at least 1x1");
    if (image.width < 1 || image.height < 1 ||
        image.rgb.size() != static_cast<std::size_t>(image.width) * image.height * 3)
        throw std::invalid_argument("resize: an empty or inconsistent image");
    // Image.resize's checks and shortcuts (_imaging.c's _resize): the whole image at its size is a
    // copy, a box of whole pixels at the asked size a crop.
    if (box.x0 < 0 || box.y0 < 0 || box.x1 > static_cast<float>(image.width) ||
        box.y1 > static_cast<float>(image.height) || box.x1 - box.x0 < 0 || box.y1 - box.y0 < 0)
        throw std::invalid_argument("resize: the box must lie within the image and not be negative");
    if (box.x0 - static_cast<float>(static_cast<int>(box.x0)) == 0 &&
        box.x1 - box.x0 == static_cast<float>(width) &&
        box.y0 - static_cast<float>(static_cast<int>(box.y0)) == 0 &&
        box.y1 - box.y0 == static_cast<float>(height))
        return crop_rows(image, static_cast<int>(box.x0), static_cast<int>(box.y0),
                         static_cast<int>(box.x0) + width, static_cast<int>(box.y0) + height);
    switch (mode) {
        case Resample::kNearest:
            if (box.x0 != 0 || box.y0 != 0 || box.x1 != static_cast<float>(image.width) ||
                box.y1 != static_cast<float>(image.height))
                throw std::invalid_argument("resize: nearest-neighbour scaling takes the whole image");
            return nearest(image, width, height);
        case Resample::kBilinear:
            return resample(image, width, height, {bilinear_filter, 1.0}, box);
        case Resample::kBicubic:
            return resample(image, width, height, {bicubic_filter, 2.0}, box);
        case Resample::kLanczos:
            break;
    }
    return resample(image, width, height, {lanczos_filter, 3.0}, box);
}

GreyImage to_grey(const RgbImage& image) {
    GreyImage out{image.width, image.height, std::vector<uint8_t>(image.rgb.size() / 3)};
    for (std::size_t i = 0; i < out.grey.size(); ++i) {
        const uint8_t* p = &image.rgb[3 * i];
        out.grey[i] = static_cast<uint8_t>((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
    }
    return out;
}

}  // namespace dp::images
