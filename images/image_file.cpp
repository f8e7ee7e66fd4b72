#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "images/decoders.h"
#include "images/input_image.h"
#include "protocol/errors.h"

namespace dp::images {

using protocol::InputDataError;

namespace {

constexpr const char* kAccepted = "an input image must be a PNG, JPEG or WebP file";

struct FileCloser {
    void operator()(std::FILE* file) const { std::fclose(file); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// `path` open for reading: a regular file, a FIFO not waited on (O_NONBLOCK) but refused.
FilePtr open_regular(const std::string& path, const OpenRules& rules, const std::string& shown) {
    const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (rules.follow_links ? 0 : O_NOFOLLOW);
    const int fd = ::open(path.c_str(), flags);
    if (fd < 0) {
        const int error = errno;
        if (error == ELOOP && !rules.follow_links)
            throw InputDataError(shown + ": a symbolic link; " + kAccepted);
        throw InputDataError(shown + ": cannot open (" + std::strerror(error) + "); " + kAccepted);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw InputDataError(shown + ": not a regular file (a folder, FIFO, socket or device); " + kAccepted);
    }
    ::fcntl(fd, F_SETFL, 0);  // blocking reads again (a regular file's never wait anyway)
    std::FILE* file = ::fdopen(fd, "rb");
    if (file == nullptr) {
        const int error = errno;
        ::close(fd);
        throw InputDataError(shown + ": cannot open (" + std::strerror(error) + ")");
    }
    return FilePtr(file);
}

// The decoder for the format `file`'s first bytes name (its magic number), the file rewound.
std::unique_ptr<detail::Decoder> open_decoder(std::FILE* file, const std::string& shown,
                                              std::string& format) {
    unsigned char head[12] = {};
    const std::size_t n = std::fread(head, 1, sizeof head, file);
    if (std::ferror(file)) throw InputDataError(shown + ": cannot read (" + std::strerror(errno) + ")");
    if (n == 0) throw InputDataError(shown + ": an empty file; " + kAccepted);
    std::rewind(file);
    static const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 8 && std::memcmp(head, png, 8) == 0) {
        format = "png";
        return detail::open_png(file, shown);
    }
    if (n >= 3 && head[0] == 0xff && head[1] == 0xd8 && head[2] == 0xff) {
        format = "jpeg";
        return detail::open_jpeg(file, shown);
    }
    if (n >= 12 && std::memcmp(head, "RIFF", 4) == 0 && std::memcmp(head + 8, "WEBP", 4) == 0) {
        format = "webp";
        return detail::open_webp(file, shown);
    }
    throw InputDataError(shown + ": not a PNG, JPEG or WebP image (by its contents, whatever its name); " +
                         kAccepted);
}

// Throws InputDataError naming `shown` when an image of `info`'s size has no pixels or more than
// `max_pixels`.
void check_pixel_count(const ImageInfo& info, uint64_t max_pixels, const std::string& shown) {
    const std::string format = info.format == "png" ? "PNG" : info.format == "jpeg" ? "JPEG" : "WebP";
    const std::string size = std::to_string(info.width) + "x" + std::to_string(info.height);
    if (info.width <= 0 || info.height <= 0)
        throw InputDataError(shown + ": a " + format + " image of " + size + " pixels");
    const uint64_t pixels = static_cast<uint64_t>(info.width) * static_cast<uint64_t>(info.height);
    if (pixels > max_pixels)
        throw InputDataError(shown + ": a " + size + " " + format + " image (" + std::to_string(pixels) +
                             " pixels): input images may have at most " + std::to_string(max_pixels) +
                             " pixels" + (max_pixels == kMaxInputPixels ? " (8192x8192)" : ""));
}

}  // namespace

struct ImageFile::State {
    FilePtr file;
    std::unique_ptr<detail::Decoder> decoder;  // after `file`: destroyed before it is closed
    std::string shown;
    bool exif_transpose = true;
    bool decoded = false;
};

ImageFile::ImageFile(const std::string& path, const OpenRules& rules) : state_(std::make_unique<State>()) {
    state_->shown = rules.shown.empty() ? path : rules.shown;
    state_->exif_transpose = rules.exif_transpose;
    state_->file = open_regular(path, rules, state_->shown);
    state_->decoder = open_decoder(state_->file.get(), state_->shown, info_.format);
    info_.width = state_->decoder->width();
    info_.height = state_->decoder->height();
    check_pixel_count(info_, rules.max_pixels, state_->shown);
}

ImageFile::~ImageFile() = default;

RgbImage ImageFile::decode() {
    if (state_->decoded) throw std::logic_error("ImageFile::decode called twice");
    state_->decoded = true;
    RgbImage image = state_->decoder->decode();
    if (!state_->exif_transpose) return image;
    const int orientation = detail::orientation_of(state_->decoder->orientation_tags(), state_->shown);
    if (orientation == 1) return image;
    return detail::oriented(image, orientation);
}

ImageInfo read_image_info(const std::string& path) { return ImageFile(path).info(); }

RgbImage decode_image(const std::string& path) { return ImageFile(path).decode(); }

}  // namespace dp::images
