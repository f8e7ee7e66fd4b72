#pragma once
// POST /v1/images/edits: the uploaded image and mask, kept in a folder of the server's own that the
// job's line names (Note [edits over HTTP] in edit_uploads.cpp).
#include <optional>
#include <string>

namespace dp::serve {

// A fresh folder for one request's uploads under `root` (ROOT/.uploads/HEX). Throws
// std::runtime_error naming it when it cannot be made.
std::string make_upload_folder(const std::string& root);

// OpenAI's mask as diffusers' mask_image: where the PNG `png` is fully transparent (alpha 0) the
// image is edited (white), elsewhere kept (black), as an 8-bit grey PNG. nullopt when `png` is no
// PNG with an alpha channel, or has no transparent pixel and `needs_transparent` is set.
std::optional<std::string> mask_from_alpha(const std::string& png, bool needs_transparent);

}  // namespace dp::serve
