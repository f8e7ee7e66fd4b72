#include "strategies/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "protocol/errors.h"
#include "strategies/model_files.h"

namespace dp::strategies {
namespace {

using protocol::ModelError;

constexpr GgmlType kTypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},       {30, "BF16", 1, 2},     {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},
    {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},
};

// ggml's names of the types we do not read, for the message that refuses them.
const char* other_type_name(uint32_t id) {
    switch (id) {
        case 9:
            return "Q8_1";
        case 15:
            return "Q8_K";
        case 16:
            return "IQ2_XXS";
        case 17:
            return "IQ2_XS";
        case 18:
            return "IQ3_XXS";
        case 19:
            return "IQ1_S";
        case 20:
            return "IQ4_NL";
        case 21:
            return "IQ3_S";
        case 22:
            return "IQ2_S";
        case 23:
            return "IQ4_XS";
        case 24:
            return "I8";
        case 25:
            return "I16";
        case 26:
            return "I32";
        case 27:
            return "I64";
        case 28:
            return "F64";
        case 29:
            return "IQ1_M";
        case 34:
            return "TQ1_0";
        case 35:
            return "TQ2_0";
        default:
            return nullptr;
    }
}

constexpr uint64_t kMaxStringBytes = 1 << 20;  // a key, a name or a metadata string
constexpr int kMaxDims = 4;                    // GGML_MAX_DIMS

// Reads the header through bounds-checked steps; every failure names the file and what was read.
class Cursor {
  public:
    Cursor(const std::byte* p, std::size_t size, const std::string& path) : p_(p), size_(size), path_(path) {}
    std::size_t offset() const { return at_; }
    const std::byte* need(std::size_t n, const char* what) {
        if (n > size_ - at_)
            throw ModelError(path_ + ": truncated or corrupt GGUF file (" + what + " at byte " +
                             std::to_string(at_) + " runs past its " + std::to_string(size_) + " bytes)");
        const std::byte* q = p_ + at_;
        at_ += n;
        return q;
    }
    template <class T>
    T number(const char* what) {
        T v;
        std::memcpy(&v, need(sizeof(T), what), sizeof(T));  // little-endian hosts only (x86-64, arm64)
        return v;
    }
    std::string string(const char* what) {
        const uint64_t n = number<uint64_t>(what);
        if (n > kMaxStringBytes)
            throw ModelError(path_ + ": corrupt GGUF file (a " + what + " of " + std::to_string(n) +
                             " bytes)");
        const std::byte* q = need(static_cast<std::size_t>(n), what);
        return std::string(reinterpret_cast<const char*>(q), static_cast<std::size_t>(n));
    }
    // Skips one metadata value of `type` (nested arrays included, to a bounded depth); returns
    // its text when it is a string.
    std::string value(uint32_t type, const std::string& key, int depth = 0) {
        static const std::size_t kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        if (type == 8) return string("metadata string");
        if (type == 9) {
            if (depth > 2)
                throw ModelError(path_ + ": corrupt GGUF file (arrays nested too deep at '" + key + "')");
            const uint32_t element = number<uint32_t>("array type");
            const uint64_t n = number<uint64_t>("array length");
            if (element < 13 && element != 8 && element != 9) {
                if (n > (size_ - at_) / kSize[element])
                    throw ModelError(path_ + ": truncated or corrupt GGUF file (metadata '" + key +
                                     "' is an array of " + std::to_string(n) +
                                     " values, more than the file holds)");
                need(static_cast<std::size_t>(n) * kSize[element], "metadata array");
                return {};
            }
            if (n > size_ - at_)  // every string or array takes at least one byte
                throw ModelError(path_ + ": truncated or corrupt GGUF file (metadata '" + key + "' has " +
                                 std::to_string(n) + " elements)");
            for (uint64_t i = 0; i < n; ++i) value(element, key, depth + 1);
            return {};
        }
        if (type >= 13)
            throw ModelError(path_ + ": corrupt GGUF file (metadata '" + key + "' has value type " +
                             std::to_string(type) + ", not one of GGUF's 0 to 12)");
        need(kSize[type], "metadata value");
        return {};
    }

  private:
    const std::byte* p_;
    std::size_t size_;
    std::size_t at_ = 0;
    const std::string& path_;
};

// A tensor's entry of the header, before the data section's start is known.
struct PendingTensor {
    std::string name;
    GgufTensorInfo info;
    uint64_t offset;
};

// The next tensor entry at `c`, checked: its dimensions, a type dp-launch reads, whole blocks per
// row and an offset on the file's alignment. Throws ModelError naming `path` and the tensor.
PendingTensor read_tensor_info(Cursor& c, const std::string& path, uint64_t alignment) {
    PendingTensor p;
    p.name = c.string("tensor name");
    const uint32_t dims = c.number<uint32_t>("dimension count");
    if (dims < 1 || dims > kMaxDims)
        throw ModelError(path + ": tensor '" + p.name + "' has " + std::to_string(dims) +
                         " dimensions; GGUF allows 1 to 4");
    std::vector<int64_t> ne;
    uint64_t elements = 1;
    for (uint32_t d = 0; d < dims; ++d) {
        const uint64_t n = c.number<uint64_t>("dimension");
        if (n == 0 || n > (uint64_t{1} << 40) || elements > (uint64_t{1} << 50) / n)
            throw ModelError(path + ": tensor '" + p.name + "' has an impossible dimension " +
                             std::to_string(n));
        elements *= n;
        ne.push_back(static_cast<int64_t>(n));
    }
    const uint32_t type_id = c.number<uint32_t>("tensor type");
    p.offset = c.number<uint64_t>("tensor offset");
    p.info.type = ggml_type(type_id);
    if (!p.info.type) {
        const char* known = other_type_name(type_id);
        throw ModelError(path + ": tensor '" + p.name + "' has ggml type " + std::to_string(type_id) +
                         (known ? std::string(" (") + known + ")" : std::string(" (unknown)")) +
                         ", which dp-launch does not read (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                         "Q8_0 and Q2_K to Q6_K)");
    }
    if (ne[0] % p.info.type->block_elements != 0)
        throw ModelError(path + ": tensor '" + p.name + "' has rows of " + std::to_string(ne[0]) +
                         " elements, not whole " + p.info.type->name + " blocks of " +
                         std::to_string(p.info.type->block_elements));
    p.info.row_bytes = ne[0] / p.info.type->block_elements * p.info.type->block_bytes;
    p.info.nbytes = static_cast<std::size_t>(elements / static_cast<uint64_t>(ne[0])) *
                    static_cast<std::size_t>(p.info.row_bytes);
    p.info.shape.assign(ne.rbegin(), ne.rend());
    if (p.offset % alignment != 0)
        throw ModelError(path + ": tensor '" + p.name + "' starts at offset " + std::to_string(p.offset) +
                         ", not a multiple of the file's alignment " + std::to_string(alignment));
    return p;
}

}  // namespace

const GgmlType* ggml_type(uint32_t id) {
    for (const GgmlType& t : kTypes)
        if (t.id == id) return &t;
    return nullptr;
}

bool is_gguf_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    struct stat st {};
    char magic[4] = {};
    const bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::read(fd, magic, 4) == 4;
    ::close(fd);
    return ok && std::memcmp(magic, "GGUF", 4) == 0;
}

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
    std::shared_ptr<GgufFile> file(new GgufFile());
    file->path_ = path;
    const MappedModelFile mapped = map_model_file(path, 24, "truncated GGUF file", "its header");
    void* map = mapped.data;
    const std::size_t size = mapped.size;
    file->map_ = map;
    file->map_size_ = size;

    Cursor c(static_cast<const std::byte*>(map), size, file->path_);
    if (std::memcmp(c.need(4, "magic"), "GGUF", 4) != 0)
        throw ModelError(path + ": not a GGUF file (no GGUF magic)");
    const uint32_t version = c.number<uint32_t>("version");
    if (version != 2 && version != 3)
        throw ModelError(path + ": GGUF version " + std::to_string(version) +
                         "; dp-launch reads versions 2 and 3");
    const uint64_t tensor_count = c.number<uint64_t>("tensor count");
    const uint64_t kv_count = c.number<uint64_t>("metadata count");
    // Each entry takes at least 8 bytes: counts beyond the file are corrupt, not a reason to loop.
    if (tensor_count > size / 8 || kv_count > size / 8)
        throw ModelError(path + ": corrupt GGUF file (" + std::to_string(tensor_count) + " tensors and " +
                         std::to_string(kv_count) + " metadata entries in " + std::to_string(size) +
                         " bytes)");
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < kv_count; ++i) {
        const std::string key = c.string("metadata key");
        const uint32_t type = c.number<uint32_t>("metadata type");
        if (key == "general.alignment") {
            if (type != 4) throw ModelError(path + ": general.alignment must be a uint32");
            alignment = c.number<uint32_t>("general.alignment");
            if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 16))
                throw ModelError(path + ": general.alignment " + std::to_string(alignment) +
                                 " is not a power of two up to 65536");
            continue;
        }
        std::string text = c.value(type, key);
        if (type == 8) file->metadata_[key] = std::move(text);
    }
    std::vector<PendingTensor> pending;
    for (uint64_t i = 0; i < tensor_count; ++i) pending.push_back(read_tensor_info(c, path, alignment));
    const std::size_t data_start = (c.offset() + alignment - 1) / alignment * alignment;
    if (data_start > size)
        throw ModelError(path + ": truncated GGUF file (its data would start at byte " +
                         std::to_string(data_start) + " of " + std::to_string(size) + ")");
    const std::size_t data_size = size - data_start;
    for (PendingTensor& p : pending) {
        if (p.offset > data_size || p.info.nbytes > data_size - p.offset)
            throw ModelError(path + ": truncated or corrupt GGUF file (tensor '" + p.name + "' needs bytes " +
                             std::to_string(p.offset) + " to " + std::to_string(p.offset + p.info.nbytes) +
                             " of a data section of " + std::to_string(data_size) + ")");
        p.info.begin = static_cast<std::size_t>(p.offset);
        if (!file->tensors_.emplace(p.name, p.info).second)
            throw ModelError(path + ": tensor '" + p.name + "' is named twice");
    }
    file->data_ = static_cast<const std::byte*>(map) + data_start;
    return file;
}

GgufFile::~GgufFile() { unmap_model_file({map_, map_size_}); }

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) throw ModelError(path_ + ": has no tensor '" + name + "'");
    return it->second;
}

const std::byte* GgufFile::data(const std::string& name) const { return data_ + info(name).begin; }

}  // namespace dp::strategies
