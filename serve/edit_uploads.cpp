#include "serve/edit_uploads.h"

#include <openssl/rand.h>
#include <png.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace dp::serve {

// Note [edits over HTTP]: an edit request uploads its image (and mask) as OpenAI's does, multipart.
// The files are written, as uploaded, into a folder of their own under ROOT/.uploads, and the
// job's one line names them by absolute path as "image" and "mask_image"; that line is checked as
// any other (the same call-argument table, the same input-image checks), the only files a request
// may name being its own uploads (Note [no server files in a request]). So an edit job is a batch
// job too: its images are dp-launch's on that line. OpenAI's mask marks the area to edit by
// transparency, diffusers' mask_image by white: a PNG mask with an alpha channel is turned into
// diffusers' form, and without a mask an image's own transparent pixels are the mask, as OpenAI
// reads them. A refused request leaves no folder.

std::string make_upload_folder(const std::string& root) {
    const std::string uploads = root + "/.uploads";
    if (::mkdir(uploads.c_str(), 0700) != 0 && errno != EEXIST)
        throw std::runtime_error("cannot make " + uploads + ": " + std::strerror(errno));
    unsigned char bytes[12];
    if (RAND_bytes(bytes, sizeof(bytes)) != 1)
        throw std::runtime_error("no random bytes for an upload folder");
    std::string name;
    for (unsigned char b : bytes) {
        static const char kHex[] = "0123456789abcdef";
        name += kHex[b >> 4];
        name += kHex[b & 15];
    }
    const std::string folder = uploads + "/" + name;
    if (::mkdir(folder.c_str(), 0700) != 0)
        throw std::runtime_error("cannot make " + folder + ": " + std::strerror(errno));
    return folder;
}

std::optional<std::string> mask_from_alpha(const std::string& png, bool needs_transparent) {
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&image, png.data(), png.size())) return std::nullopt;
    // Past 64 MP the job's own input check refuses it, with what is accepted.
    if ((image.format & PNG_FORMAT_FLAG_ALPHA) == 0 ||
        static_cast<uint64_t>(image.width) * image.height > 8192ull * 8192ull) {
        png_image_free(&image);
        return std::nullopt;
    }
    image.format = PNG_FORMAT_RGBA;
    std::vector<unsigned char> rgba(PNG_IMAGE_SIZE(image));
    if (!png_image_finish_read(&image, nullptr, rgba.data(), 0, nullptr)) return std::nullopt;
    std::vector<unsigned char> grey(static_cast<std::size_t>(image.width) * image.height);
    bool transparent = false;
    for (std::size_t i = 0; i < grey.size(); ++i) {
        grey[i] = rgba[4 * i + 3] == 0 ? 255 : 0;
        transparent = transparent || grey[i] != 0;
    }
    if (needs_transparent && !transparent) return std::nullopt;
    png_image out{};
    out.version = PNG_IMAGE_VERSION;
    out.width = image.width;
    out.height = image.height;
    out.format = PNG_FORMAT_GRAY;
    png_alloc_size_t size = 0;
    if (!png_image_write_to_memory(&out, nullptr, &size, 0, grey.data(), 0, nullptr)) return std::nullopt;
    std::string bytes(size, '\0');
    if (!png_image_write_to_memory(&out, bytes.data(), &size, 0, grey.data(), 0, nullptr))
        return std::nullopt;
    bytes.resize(size);
    return bytes;
}

}  // namespace dp::serve
