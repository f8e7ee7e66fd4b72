#include "strategies/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "protocol/errors.h"
#include "protocol/strict_json.h"
#include "strategies/model_files.h"

namespace dp::strategies {
using protocol::ModelError;
namespace {

constexpr std::size_t kMaxHeaderBytes = 100 << 20;  // the format's own limit
constexpr std::size_t kMaxRank = 8;

struct DTypeRow {
    StDType dtype;
    const char* name;
    std::size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::kF64, "F64", 8},   {StDType::kF32, "F32", 4},        {StDType::kF16, "F16", 2},
    {StDType::kBF16, "BF16", 2}, {StDType::kI64, "I64", 8},        {StDType::kI32, "I32", 4},
    {StDType::kI16, "I16", 2},   {StDType::kI8, "I8", 1},          {StDType::kU8, "U8", 1},
    {StDType::kBool, "BOOL", 1}, {StDType::kF8E4M3, "F8_E4M3", 1}, {StDType::kF8E5M2, "F8_E5M2", 1},
};

const DTypeRow& row(StDType dtype) {
    for (const DTypeRow& r : kDTypes)
        if (r.dtype == dtype) return r;
    return kDTypes[1];
}

std::string accepted_dtypes() {
    std::string out;
    for (const DTypeRow& r : kDTypes) out += (out.empty() ? "" : ", ") + std::string(r.name);
    return out;
}

}  // namespace

StDType parse_st_dtype(const std::string& name, const std::string& where) {
    for (const DTypeRow& r : kDTypes)
        if (name == r.name) return r.dtype;
    throw ModelError(where + ": unsupported dtype '" + name.substr(0, 32) +
                     "' (supported: " + accepted_dtypes() + ")");
}

const char* st_dtype_name(StDType dtype) { return row(dtype).name; }
std::size_t st_dtype_size(StDType dtype) { return row(dtype).size; }

std::map<std::string, StTensorInfo> parse_safetensors_header(const std::string& json_text,
                                                             std::size_t data_size, const std::string& path,
                                                             std::map<std::string, std::string>* metadata) {
    // Strictly: a key given twice (a tensor, or dtype in one) is refused, as the safetensors
    // library refuses it, rather than the last one taken.
    nlohmann::json header;
    if (const std::string why = protocol::parse_strict_json(json_text, header); !why.empty())
        throw ModelError(path + ": corrupt safetensors header (" + why + ")");
    if (!header.is_object()) throw ModelError(path + ": corrupt safetensors header (expected a JSON object)");

    std::map<std::string, StTensorInfo> tensors;
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    for (const auto& [name, entry] : header.items()) {
        const std::string where = path + ": tensor '" + name.substr(0, 200) + "'";
        if (name == "__metadata__") {
            if (!entry.is_object()) throw ModelError(path + ": __metadata__ must be an object of strings");
            for (const auto& [k, v] : entry.items()) {
                if (!v.is_string()) throw ModelError(path + ": __metadata__ '" + k + "' must be a string");
                if (metadata) (*metadata)[k] = v.get<std::string>();
            }
            continue;
        }
        if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
            !entry.contains("data_offsets"))
            throw ModelError(where + ": expected {\"dtype\", \"shape\", \"data_offsets\"}");
        const auto& dtype = entry["dtype"];
        const auto& shape = entry["shape"];
        const auto& offsets = entry["data_offsets"];
        if (!dtype.is_string()) throw ModelError(where + ": dtype must be a string");
        StTensorInfo info;
        info.dtype = parse_st_dtype(dtype.get<std::string>(), where);
        if (!shape.is_array() || shape.size() > kMaxRank)
            throw ModelError(where + ": shape must be a list of at most 8 sizes");
        std::size_t elements = 1;
        for (const auto& dim : shape) {
            if (!dim.is_number_unsigned())
                throw ModelError(where + ": shape entries must be non-negative integers");
            const auto d = dim.get<std::uint64_t>();
            if (d > static_cast<std::uint64_t>(std::numeric_limits<int64_t>::max()) ||
                (d != 0 && elements > std::numeric_limits<std::size_t>::max() / d))
                throw ModelError(where + ": shape is too large");
            elements *= static_cast<std::size_t>(d);
            info.shape.push_back(static_cast<int64_t>(d));
        }
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
            !offsets[1].is_number_unsigned())
            throw ModelError(where + ": data_offsets must be [begin, end]");
        const auto begin = offsets[0].get<std::uint64_t>();
        const auto end = offsets[1].get<std::uint64_t>();
        if (begin > end || end > data_size)
            throw ModelError(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                             "] fall outside the file's " + std::to_string(data_size) +
                             " data bytes (truncated file?)");
        const std::size_t elem = st_dtype_size(info.dtype);
        if (elements > std::numeric_limits<std::size_t>::max() / elem || elements * elem != end - begin)
            throw ModelError(where + ": holds " + std::to_string(end - begin) +
                             " bytes but its shape and dtype need " + std::to_string(elements) + " x " +
                             std::to_string(elem));
        info.begin = static_cast<std::size_t>(begin);
        info.nbytes = static_cast<std::size_t>(end - begin);
        ranges.emplace_back(info.begin, info.begin + info.nbytes);
        tensors.emplace(name, std::move(info));
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i)
        if (ranges[i].first < ranges[i - 1].second)
            throw ModelError(path + ": corrupt safetensors header (tensors overlap)");
    return tensors;
}

std::map<std::string, StTensorInfo> read_safetensors_header(const std::string& path) {
    const int fd = open_model_file(path);  // a regular file: a FIFO would block here
    unsigned char len_bytes[8] = {};
    uint64_t len = 0;
    std::string header;
    bool whole = ::pread(fd, len_bytes, 8, 0) == 8;
    for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
    if (whole && len <= kMaxHeaderBytes) {
        header.assign(len, '\0');
        whole = ::pread(fd, header.data(), len, 8) == static_cast<ssize_t>(len);
    }
    ::close(fd);
    if (!whole || len > kMaxHeaderBytes)
        throw ModelError(path + ": corrupt or truncated safetensors file (its header cannot be read)");
    return parse_safetensors_header(header, std::numeric_limits<std::size_t>::max(), path, nullptr);
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
    std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
    file->path_ = path;
    const MappedModelFile mapped =
        map_model_file(path, 8, "truncated safetensors file", "its 8-byte header length");
    file->map_ = mapped.data;
    file->map_size_ = mapped.size;
    file->parse(static_cast<const std::byte*>(mapped.data), mapped.size);
    return file;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::read(const std::string& path) {
    std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
    file->path_ = path;
    file->owned_ = read_model_file(path, std::numeric_limits<std::size_t>::max());
    const std::string& bytes = file->owned_;
    if (bytes.size() < 8)
        throw ModelError(path + ": truncated safetensors file (" + std::to_string(bytes.size()) +
                         " bytes, less than its 8-byte header length)");
    file->parse(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
    return file;
}

void SafetensorsFile::parse(const std::byte* bytes, std::size_t size) {
    std::uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<std::uint8_t>(bytes[i]);
    if (header_len > kMaxHeaderBytes || header_len > size - 8)
        throw ModelError(path_ + ": corrupt or truncated safetensors file (header length " +
                         std::to_string(header_len) + " but the file has " + std::to_string(size) +
                         " bytes)");
    const std::string json_text(reinterpret_cast<const char*>(bytes + 8),
                                static_cast<std::size_t>(header_len));
    data_ = bytes + 8 + header_len;
    tensors_ = parse_safetensors_header(json_text, size - 8 - static_cast<std::size_t>(header_len), path_,
                                        &metadata_);
}

SafetensorsFile::~SafetensorsFile() { unmap_model_file({map_, map_size_}); }

const StTensorInfo& SafetensorsFile::info(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw ModelError(path_ + ": has no tensor '" + name + "'");
    return it->second;
}

const std::byte* SafetensorsFile::data(const std::string& name) const { return data_ + info(name).begin; }

}  // namespace dp::strategies
