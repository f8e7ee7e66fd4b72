// WebP through libwebp: still images only (Note [input images]), the EXIF and XMP chunks through
// its demuxer, as PIL's WebPAnimDecoder finds them.

#include <webp/decode.h>
#include <webp/demux.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "images/decoders.h"
#include "protocol/errors.h"

namespace dp::images::detail {

namespace {

using protocol::InputDataError;

const char* status_text(VP8StatusCode status) {
    switch (status) {
        case VP8_STATUS_OUT_OF_MEMORY:
            return "out of memory";
        case VP8_STATUS_INVALID_PARAM:
            return "invalid parameter";
        case VP8_STATUS_BITSTREAM_ERROR:
            return "bitstream error";
        case VP8_STATUS_UNSUPPORTED_FEATURE:
            return "unsupported feature";
        case VP8_STATUS_NOT_ENOUGH_DATA:
            return "the file ends early";
        default:
            return "decoding failed";
    }
}

struct DemuxDeleter {
    void operator()(WebPDemuxer* demux) const { WebPDemuxDelete(demux); }
};

class WebpDecoder final : public Decoder {
  public:
    explicit WebpDecoder(const std::string& shown) : shown_(shown) {}

    // Reads as much of `file` as libwebp needs for its header; throws InputDataError naming it.
    void open(std::FILE* file);
    int width() const override { return features_.width; }
    int height() const override { return features_.height; }
    RgbImage decode() override;
    OrientationTags orientation_tags() const override { return tags_; }

  private:
    bool read_up_to(std::size_t size);
    void read_tags();

    std::string shown_;
    std::FILE* file_ = nullptr;
    std::vector<uint8_t> data_;
    std::size_t limit_ = 0;  // the bytes the RIFF header declares (libwebp ignores any beyond)
    WebPBitstreamFeatures features_{};
    OrientationTags tags_;
};

// Reads the file on until `data_` holds min(size, limit_) bytes; false at its end or a read error.
bool WebpDecoder::read_up_to(std::size_t size) {
    size = std::min(size, limit_);
    while (data_.size() < size) {
        const std::size_t have = data_.size();
        data_.resize(size);
        const std::size_t n = std::fread(data_.data() + have, 1, size - have, file_);
        data_.resize(have + n);
        if (n == 0) {
            if (std::ferror(file_))
                throw InputDataError(shown_ + ": cannot read (" + std::strerror(errno) + ")");
            return false;
        }
    }
    return data_.size() == size;
}

void WebpDecoder::open(std::FILE* file) {
    file_ = file;
    limit_ = 12;
    read_up_to(12);  // RIFF, its size, WEBP (the caller has seen them)
    limit_ = 8 + (uint64_t{data_[4]} | uint64_t{data_[5]} << 8 | uint64_t{data_[6]} << 16 |
                  uint64_t{data_[7]} << 24);
    VP8StatusCode status = VP8_STATUS_NOT_ENOUGH_DATA;
    // The header is at the start, after any chunks a VP8X file puts before the image.
    for (std::size_t want = 64;; want *= 2) {
        const bool more = read_up_to(want) && data_.size() < limit_;
        status = WebPGetFeatures(data_.data(), data_.size(), &features_);
        if (status != VP8_STATUS_NOT_ENOUGH_DATA || !more) break;
    }
    if (status != VP8_STATUS_OK)
        throw InputDataError(shown_ + ": not a WebP file libwebp reads (" + status_text(status) +
                             "); an input image must be a PNG, JPEG or WebP file");
    if (features_.has_animation)
        throw InputDataError(shown_ +
                             ": an animated WebP; an input image must be a still image (save the frame "
                             "you want as a PNG, JPEG or still WebP)");
}

RgbImage WebpDecoder::decode() {
    if (!read_up_to(limit_))
        throw InputDataError(shown_ + ": a truncated WebP file (" + std::to_string(data_.size()) +
                             " of the " + std::to_string(limit_) + " bytes its header declares)");
    const std::size_t w = static_cast<std::size_t>(features_.width),
                      h = static_cast<std::size_t>(features_.height);
    RgbImage out{features_.width, features_.height, std::vector<uint8_t>(w * h * 3)};
    WebPDecoderConfig config;
    if (!WebPInitDecoderConfig(&config)) throw InputDataError(shown_ + ": libwebp's version does not match");
    config.output.colorspace = MODE_RGB;
    config.output.is_external_memory = 1;
    config.output.u.RGBA.rgba = out.rgb.data();
    config.output.u.RGBA.stride = static_cast<int>(w * 3);
    config.output.u.RGBA.size = out.rgb.size();
    const VP8StatusCode status = WebPDecode(data_.data(), data_.size(), &config);
    WebPFreeDecBuffer(&config.output);
    if (status != VP8_STATUS_OK)
        throw InputDataError(shown_ + ": a damaged WebP file (" + status_text(status) + ")");
    read_tags();
    return out;
}

// PIL reads the first EXIF and XMP chunks through WebPDemux, and refuses a file it cannot parse.
void WebpDecoder::read_tags() {
    const WebPData whole{data_.data(), data_.size()};
    const std::unique_ptr<WebPDemuxer, DemuxDeleter> demux(WebPDemux(&whole));
    if (!demux) throw InputDataError(shown_ + ": a damaged WebP file (its chunks do not parse)");
    for (const char* name : {"EXIF", "XMP "}) {
        WebPChunkIterator chunk;
        if (!WebPDemuxGetChunk(demux.get(), name, 1, &chunk)) continue;
        std::string bytes(reinterpret_cast<const char*>(chunk.chunk.bytes), chunk.chunk.size);
        WebPDemuxReleaseChunkIterator(&chunk);
        (name[0] == 'E' ? tags_.exif : tags_.xmp) = std::move(bytes);
    }
}

}  // namespace

std::unique_ptr<Decoder> open_webp(std::FILE* file, const std::string& shown) {
    return opened<WebpDecoder>(file, shown);
}

}  // namespace dp::images::detail
