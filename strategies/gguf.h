#pragma once
// Note [gguf]: GGUF is ggml's container, in which people share quantized transformers (city96's
// FLUX.1, SD3.5 and Qwen-Image files). Layout (little-endian): the magic "GGUF", a uint32 version
// (2 or 3), a uint64 tensor count and a uint64 metadata count; the metadata, each a string key
// (uint64 length, bytes), a uint32 value type and its value (integers, floats, bool, string, or an
// array: uint32 element type, uint64 count, elements); the tensor infos, each a string name, a
// uint32 dimension count, that many uint64 sizes (ggml's order: the row length first, so the
// torch shape is their reverse), a uint32 ggml type and a uint64 offset into the data section;
// then, at the next multiple of `general.alignment` (32 when absent), the data section, each
// tensor at its offset (itself a multiple of the alignment). A quantized type stores blocks of a
// fixed number of elements along a row, each a fixed number of bytes, so a row is whole blocks.
// Everything a file says is checked against the file before any byte is handed out: a truncated,
// corrupt or hostile file gives a ModelError naming the file (and the tensor, or the key), never a
// read out of bounds, an allocation sized by the file, or a loop it makes endless. No LibTorch: the
// launcher checks GGUF files before any rank starts, the worker maps and dequantizes through it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dp::strategies {

// A ggml tensor type: its id, name, and elements and bytes per block (1 and the element size for
// the plain types).
struct GgmlType {
    uint32_t id;
    const char* name;
    int64_t block_elements;
    int64_t block_bytes;
};
// The types dp-launch reads: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K ... Q6_K; nullptr
// for any other id.
const GgmlType* ggml_type(uint32_t id);

struct GgufTensorInfo {
    const GgmlType* type = nullptr;
    std::vector<int64_t> shape;  // torch's order: the row length last
    std::size_t begin = 0;       // offset from the start of the data section
    std::size_t nbytes = 0;
    int64_t row_bytes = 0;  // bytes of one row (the last dimension)
};

class GgufFile {
  public:
    // Maps `path` read-only and validates its header. Throws protocol::ModelError naming the file
    // (an unknown tensor type names the tensor and the type id).
    static std::shared_ptr<GgufFile> open(const std::string& path);
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    const std::string& path() const { return path_; }
    const std::map<std::string, GgufTensorInfo>& tensors() const { return tensors_; }
    bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
    // Throws ModelError naming the file when the tensor is absent.
    const GgufTensorInfo& info(const std::string& name) const;
    // The tensor's bytes, inside the mapping (valid while this object lives).
    const std::byte* data(const std::string& name) const;
    // The string metadata (general.architecture, ...); other value types are checked and skipped.
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

  private:
    GgufFile() = default;
    std::string path_;
    void* map_ = nullptr;
    std::size_t map_size_ = 0;
    const std::byte* data_ = nullptr;
    std::map<std::string, GgufTensorInfo> tensors_;
    std::map<std::string, std::string> metadata_;
};

// Whether `path` starts with GGUF's magic (a file that cannot be read: false).
bool is_gguf_file(const std::string& path);

}  // namespace dp::strategies
