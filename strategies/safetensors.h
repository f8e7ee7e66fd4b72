#pragma once
// Reading safetensors files through mmap, validating everything a file can say.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets are relative to the end of the header. Every offset, size and shape is
// checked against the file before any byte of data is handed out: a truncated, corrupt or hostile
// file gives a ModelError naming the file and the tensor, never a read out of bounds.
// No LibTorch: the launcher and `plan` read adapter and weight headers with it, the worker maps
// tensors through it (runtime/io/tensor_io.h turns them into tensors).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dp::strategies {

// F8_E4M3 and F8_E5M2: the fp8 weights of the checkpoints users share (Note [single files]).
enum class StDType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2 };

// "F32" and so on; throws ModelError for an unknown name.
StDType parse_st_dtype(const std::string& name, const std::string& where);
const char* st_dtype_name(StDType dtype);
std::size_t st_dtype_size(StDType dtype);

struct StTensorInfo {
    StDType dtype = StDType::kF32;
    std::vector<int64_t> shape;
    std::size_t begin = 0;  // offset of the first byte, from the start of the data section
    std::size_t nbytes = 0;
};

// Parses and validates a header. `data_size` is the size of the data section. Exposed for tests.
std::map<std::string, StTensorInfo> parse_safetensors_header(const std::string& json_text,
                                                             std::size_t data_size, const std::string& path,
                                                             std::map<std::string, std::string>* metadata);

// The header of the safetensors file at `path` alone, read without mapping the file: each tensor's
// dtype and shape checked as parse_safetensors_header checks them, its offsets not against the
// data (which may be absent: `plan` sizes a model from headers). Throws ModelError naming the file.
std::map<std::string, StTensorInfo> read_safetensors_header(const std::string& path);

class SafetensorsFile {
  public:
    // Maps `path` read-only and validates its header. Throws ModelError.
    static std::shared_ptr<SafetensorsFile> open(const std::string& path);
    // Reads the whole of `path` into memory of its own (a copy that cannot change under it,
    // Note [files that change under a job]) and validates its header. Throws ModelError.
    static std::shared_ptr<SafetensorsFile> read(const std::string& path);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    const std::map<std::string, StTensorInfo>& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
    // Throws ModelError naming the file when the tensor is absent.
    const StTensorInfo& info(const std::string& name) const;
    // The tensor's bytes, inside the mapping or the copy (valid while this object lives).
    const std::byte* data(const std::string& name) const;
    // The whole file's bytes, when it was read (empty when it is mapped).
    const std::string& bytes() const { return owned_; }

  private:
    SafetensorsFile() = default;
    void parse(const std::byte* bytes, std::size_t size);
    std::string path_;
    std::string owned_;  // the file's bytes, when it was read rather than mapped
    void* map_ = nullptr;
    std::size_t map_size_ = 0;
    const std::byte* data_ = nullptr;
    std::map<std::string, StTensorInfo> tensors_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace dp::strategies
