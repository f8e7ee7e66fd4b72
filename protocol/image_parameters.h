#pragma once
// The text an image carries about how it was made, in the format that galleries, ComfyUI and
// AUTOMATIC1111's "PNG Info" read (its "parameters" chunk; stable-diffusion.cpp writes the same):
//
//   a red circle on a white background
//   Negative prompt: blurry
//   Steps: 28, Sampler: Euler, CFG scale: 7.0, Seed: 42, Size: 512x512, Model: sd3-medium,
//   max_sequence_length: 256, Version: dp-launch 0.1.0
//
// (the last line is one line). A value holding ',', ':' or '"' is written as a JSON string, as
// AUTOMATIC1111 does. std and nlohmann/json only.

#include <string>

#include "protocol/job_file.h"

namespace dp::protocol {

struct ImageProvenance {
    std::string model;     // the model's name (its folder's name)
    std::string cfg_name;  // the family's classifier-free guidance row ("guidance_scale"); empty: none
};

// "dp-launch 0.1.0": the project's version, without the commit, so that a rebuild of another commit
// that makes the same pixels writes the same bytes.
std::string made_by_version();

std::string image_parameters(const Generation& g, const ImageProvenance& made_by);

// The manifest record of an image as JSON text, as its file carries it (the "dp-launch" chunk):
// the request (to_json(JobRequest)) and the model's name, without the image's own hash; ASCII
// (other characters as \u escapes), so that EXIF can hold it.
std::string image_record_text(const JobRequest& r, const ImageProvenance& made_by);

}  // namespace dp::protocol
