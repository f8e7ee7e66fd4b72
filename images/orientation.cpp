// The orientation PIL.ImageOps.exif_transpose applies (Note [input images]): the EXIF
// Orientation tag as Pillow's Exif.load and ImageFileDirectory_v2.load read IFD0, else the XMP
// packet's tiff:Orientation, and the transposition it stands for.

#include <cmath>
#include <cstring>
#include <set>
#include <string_view>

#include "images/decoders.h"
#include "protocol/errors.h"

namespace dp::images::detail {

namespace {

constexpr uint16_t kOrientationTag = 274;

// Bytes of a TIFF structure in its byte order; reads past the end are refused by the callers.
struct TiffBytes {
    std::string_view data;
    bool big_endian = false;

    bool has(uint64_t at, uint64_t n) const { return at <= data.size() && n <= data.size() - at; }
    uint64_t number(uint64_t at, int bytes) const {
        uint64_t v = 0;
        for (int i = 0; i < bytes; ++i) {
            const auto byte = static_cast<uint8_t>(data[at + (big_endian ? i : bytes - 1 - i)]);
            v = v << 8 | byte;
        }
        return v;
    }
};

// The size of one value of TIFF type `type` among those Pillow loads; 0 for a type it skips.
// BYTE, ASCII, SBYTE and UNDEFINED 1; SHORT and SSHORT 2; LONG, SLONG, FLOAT and IFD 4;
// RATIONAL, SRATIONAL, DOUBLE and LONG8 8.
int unit_size(uint16_t type) {
    static const int kSizes[17] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8, 4, 0, 0, 8};
    return type < 17 ? kSizes[type] : 0;
}

// The first value of a tag, as the number Pillow's dict lookup in exif_transpose would match:
// integers and rationals or floats of an integral value; 0 for text and bytes (which match none).
int first_value(const TiffBytes& tiff, uint64_t at, uint16_t type) {
    double v = 0;
    const auto sign = [](uint64_t x, int bits) {
        return static_cast<double>(static_cast<int64_t>(x << (64 - bits)) >> (64 - bits));
    };
    switch (type) {
        case 3:
        case 4:
        case 13:
        case 16:
            v = static_cast<double>(tiff.number(at, unit_size(type)));
            break;
        case 6:
        case 8:
        case 9:
            v = sign(tiff.number(at, unit_size(type)), 8 * unit_size(type));
            break;
        case 5:
            v = static_cast<double>(tiff.number(at, 4)) / static_cast<double>(tiff.number(at + 4, 4));
            break;
        case 10:
            v = sign(tiff.number(at, 4), 32) / sign(tiff.number(at + 4, 4), 32);
            break;
        case 11: {
            const auto bits = static_cast<uint32_t>(tiff.number(at, 4));
            float f;
            std::memcpy(&f, &bits, 4);
            v = f;
            break;
        }
        case 12: {
            const uint64_t bits = tiff.number(at, 8);
            std::memcpy(&v, &bits, 8);
            break;
        }
        default:
            return 0;
    }
    return v >= 1 && v <= 8 && v == std::floor(v) ? static_cast<int>(v) : 0;
}

// IFD0's Orientation, as ImageFileDirectory_v2.load reads it: the first entry of the tag whose
// type Pillow knows and whose data is there; nullopt when there is none (then the XMP is asked).
// A truncated directory keeps the entries before the cut (Pillow warns and stops).
std::optional<int> ifd0_orientation(const TiffBytes& tiff) {
    const uint64_t ifd = tiff.number(4, 4);
    if (!tiff.has(ifd, 2)) return std::nullopt;
    const uint64_t count = tiff.number(ifd, 2);
    std::set<uint16_t> seen;
    uint64_t out_of_line = 0;  // Pillow skips a tag once the data of those before it passes the size
    for (uint64_t i = 0, at = ifd + 2; i < count && tiff.has(at, 12); ++i, at += 12) {
        const auto tag = static_cast<uint16_t>(tiff.number(at, 2));
        const auto type = static_cast<uint16_t>(tiff.number(at + 2, 2));
        const uint64_t size = tiff.number(at + 4, 4) * static_cast<uint64_t>(unit_size(type));
        if (seen.count(tag) != 0 || unit_size(type) == 0) continue;
        uint64_t data = at + 8;
        if (size > 4) {
            out_of_line += size;
            data = tiff.number(at + 8, 4);
            if (out_of_line > tiff.data.size() || !tiff.has(data, size)) continue;
        }
        if (size == 0) continue;
        seen.insert(tag);
        if (tag == kOrientationTag) return first_value(tiff, data, type);
    }
    return std::nullopt;
}

// Exif.load: up to two "Exif\0\0" prefixes dropped, then an 8-byte TIFF header whose first four
// bytes Pillow accepts (II*\0 or MM\0*, or their byte-swapped forms); anything else raises there.
// `tiff` is set when there is a TIFF structure.
bool exif_structure(std::string_view exif, TiffBytes& tiff) {
    constexpr std::string_view kPrefix("Exif\0\0", 6);
    for (int i = 0; i < 2 && exif.substr(0, 6) == kPrefix; ++i) exif.remove_prefix(6);
    if (exif.empty()) return true;
    const std::string_view head = exif.substr(0, 4);
    const bool big = head == std::string_view("MM\0*", 4) || head == std::string_view("MM*\0", 4);
    const bool little = head == std::string_view("II*\0", 4) || head == std::string_view("II\0*", 4);
    if (exif.size() < 8 || (!big && !little)) return false;
    tiff = TiffBytes{exif, big};
    return true;
}

// Image.getexif's fallback: the first `tiff:Orientation` followed by `="` or `>` and a digit.
std::optional<int> xmp_orientation(std::string_view xmp) {
    constexpr std::string_view kName = "tiff:Orientation";
    for (std::size_t at = xmp.find(kName); at != std::string_view::npos; at = xmp.find(kName, at + 1)) {
        std::string_view rest = xmp.substr(at + kName.size());
        if (rest.substr(0, 2) == "=\"")
            rest.remove_prefix(2);
        else if (rest.substr(0, 1) == ">")
            rest.remove_prefix(1);
        else
            continue;
        if (!rest.empty() && rest[0] >= '0' && rest[0] <= '9') return rest[0] - '0';
    }
    return std::nullopt;
}

}  // namespace

int orientation_of(const OrientationTags& tags, const std::string& shown) {
    std::optional<int> orientation;
    TiffBytes tiff;
    if (tags.exif && !exif_structure(*tags.exif, tiff)) {
        if (tags.bad_exif_ignored) return 1;
        throw protocol::InputDataError(shown +
                                       ": its EXIF data is no TIFF structure (PIL refuses such a file too)");
    }
    if (!tiff.data.empty()) orientation = ifd0_orientation(tiff);
    if (!orientation && tags.xmp) orientation = xmp_orientation(*tags.xmp);
    const int value = orientation.value_or(1);
    return value >= 2 && value <= 8 ? value : 1;
}

// exif_transpose's methods: 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE,
// 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90: whether each swaps the axes, then mirrors the input's
// columns and rows. Output pixel (x, y) comes from input pixel (sx, sy).
RgbImage oriented(const RgbImage& image, int orientation) {
    struct Transposition {
        bool swap, flip_x, flip_y;
    };
    static const Transposition kTranspositions[9] = {
        {false, false, false}, {false, false, false}, {false, true, false},
        {false, true, true},   {false, false, true},  {true, false, false},
        {true, false, true},   {true, true, true},    {true, true, false}};
    const Transposition t = kTranspositions[orientation >= 1 && orientation <= 8 ? orientation : 1];
    const int w = image.width, h = image.height;
    RgbImage out{t.swap ? h : w, t.swap ? w : h, std::vector<uint8_t>(image.rgb.size())};
    for (int y = 0; y < out.height; ++y) {
        for (int x = 0; x < out.width; ++x) {
            const int u = t.swap ? y : x, v = t.swap ? x : y;
            const int sx = t.flip_x ? w - 1 - u : u, sy = t.flip_y ? h - 1 - v : v;
            const std::size_t from = (static_cast<std::size_t>(sy) * w + sx) * 3;
            const std::size_t to = (static_cast<std::size_t>(y) * out.width + x) * 3;
            std::memcpy(&out.rgb[to], &image.rgb[from], 3);
        }
    }
    return out;
}

}  // namespace dp::images::detail
