#pragma once
// Note [compare]: `dp-launch compare RUN_A RUN_B` says what a setting costs in pixels (a step
// cache, a lower precision, another strategy), as a gate a CI can trust (docs/step-cache.md). It
// pairs the images of two output folders by prompt index (each folder's manifest.jsonl; a prompt's
// later record wins) and, for each prompt either run has a record of, prints the pair's PSNR and
// SSIM or why one run has no image; then the mean and worst over the pairs measured ("none" when
// there are none). A prompt fails when
// - a pair falls below --min-psnr or --min-ssim, or is of different sizes (from the images' headers);
// - either run has no image of it (no record, failed, not run, invalid, the file gone);
// - with --strict, the pair's records differ in prompt or seed (reported either way).
// It writes a page of the pairs side by side (--gallery FILE; default RUN_B/compare.html) that
// replaces only an earlier page of its own. A manifest's image must be a regular file inside its
// run's folder (cli/compare_images.h); an image is decoded only up to kMaxComparePixels.
//
// - PSNR: 10 log10(255^2 / MSE) over every channel of every pixel, in dB; identical images +inf.
// - SSIM: Wang et al.'s, as scikit-image's structural_similarity(data_range=255, channel_axis=-1,
//   gaussian_weights=True, sigma=1.5, use_sample_covariance=False) computes it: means, variances and
//   the covariance under an 11-tap Gaussian (sigma 1.5, mirrored edges), K1 0.01, K2 0.03, the
//   SSIM map averaged away from a 5-pixel border, then over the channels. Images smaller than 11
//   pixels a side have none.
// Exit codes: 0, 1 (a prompt fails), 2 (usage: a budget that is no finite number in its range, a
// folder without a manifest, one folder twice, no prompt with an image in both, a --gallery path it
// must not replace), 65 (an image that cannot be read or is too large, an image path outside its
// run or not a regular file), 74 (the page cannot be written). No LibTorch: dp_images reads the
// images, PNG, JPEG or WebP (whatever --format the runs wrote), as input images are read.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "images/input_image.h"

namespace dp::cli {

struct CompareOptions {
    std::string a, b;  // output folders
    std::optional<double> min_psnr, min_ssim;
    std::string gallery;  // empty: RUN_B/compare.html
    bool json = false;    // one JSON object per pair, then the summary's
    bool strict = false;  // a pair whose records differ in prompt or seed fails
};

// An image as compare measures it: 8-bit RGB, row after row.
using RgbImage = images::RgbImage;

// The PNG, JPEG or WebP image at `path` as 8-bit RGB (at most kMaxComparePixels). Throws
// InputDataError naming it when it cannot be read.
RgbImage read_rgb_image(const std::string& path);
// The two images' PSNR in dB (+inf when equal) and SSIM (as above); they must be the same size.
double psnr(const RgbImage& a, const RgbImage& b);
double ssim(const RgbImage& a, const RgbImage& b);

// Runs the comparison, printing to `out`; returns the exit code. Throws UsageError and
// InputDataError (the codes above).
int run_compare(const CompareOptions& options, std::ostream& out);

}  // namespace dp::cli
