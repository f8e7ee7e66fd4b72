#pragma once
// Reading the files of a model folder safely: a path the user supplied may name a FIFO, a device
// or a folder, whose open() or read() would block every rank forever or never end. Every model
// file (configs, tokenizers, indexes, safetensors) is opened through here: without blocking,
// checked to be a regular file (a symlink to one counts, as in a Hugging Face cache snapshot),
// and read up to a size limit. Which safetensors files hold a component's weights, for a weight
// variant, is decided here too, for the launcher, `plan` and the worker alike. std and POSIX
// (nlohmann/json inside).

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace dp::strategies {

// An open file descriptor of the regular file `path` (O_CLOEXEC, blocking mode restored), the
// caller's to close. Throws protocol::ModelError naming the path when it cannot be opened or is
// not a regular file (a FIFO, a device, a folder, a symlink whose target is missing).
int open_model_file(const std::string& path);

// The whole regular file `path`. Throws protocol::ModelError as open_model_file does, and when the
// file is larger than `max_bytes` or cannot be read.
std::string read_model_file(const std::string& path, std::size_t max_bytes = std::size_t{64} << 20);

// The regular file `path` mapped read-only (MAP_PRIVATE), the caller's to unmap_model_file.
// Throws protocol::ModelError as open_model_file does, when it cannot be mapped, and when it has
// fewer than `min_size` bytes: "PATH: TOO_SMALL (N bytes, less than HEADER)". The mapping is
// registered with its path (Note [files that change under a job], strategies/mapped_files.h).
struct MappedModelFile {
    void* data = nullptr;
    std::size_t size = 0;
};
MappedModelFile map_model_file(const std::string& path, std::size_t min_size, const std::string& too_small,
                               const std::string& header);
// Unmaps what map_model_file mapped (nothing for an empty one).
void unmap_model_file(const MappedModelFile& mapped);

// Whether `path` exists at all (any kind of file), without opening it.
bool model_file_exists(const std::string& path);

// How messages name a path that loops (ELOOP): a symlink, or a folder on the way, that leads back
// to a link already followed. Such a path names no file, but it is not missing either.
inline constexpr const char* kSymlinkLoop =
    "a symlink loop (following its links leads back to a link already followed; ELOOP)";
// For a path that names no file (model_file_exists is false): kSymlinkLoop when it loops, else
// `otherwise` ("no such file").
std::string missing_file_text(const std::string& path, const std::string& otherwise);
// Whether `path` is a directory (or a symlink to one).
bool is_directory(const std::string& path);

// Throws protocol::ModelError, as open_model_file does, unless `path` is a regular file (or a
// symlink to one). Never blocks, never reads.
void check_model_file(const std::string& path);

// Note [weight variants]: diffusers' `variant` names a second set of weight files in a component
// folder: `NAME.VARIANT.safetensors`, or sharded, `NAME.safetensors.index.VARIANT.json` whose
// weight_map names the shards (`NAME.VARIANT-00001-of-00002.safetensors`). Plain files have no
// variant: `NAME.safetensors`, `NAME.safetensors.index.json`, `NAME-00001-of-00002.safetensors`.

// The variant of a weight file's name ("" for a plain one), or nullopt when it is no weight file.
std::optional<std::string> weight_file_variant(const std::string& file_name);

// The variants the weight files of folder `dir` have ("" for plain files); empty when it has none.
std::set<std::string> weight_variants(const std::string& dir);

// Where a component's weights are: a sharded index, or one file (paths inside its folder).
struct ComponentWeights {
    std::string index;  // DIR/NAME.safetensors.index[.VARIANT].json when sharded, else empty
    std::string file;   // DIR/NAME[.VARIANT].safetensors when not sharded, else empty
};

// The weights of component folder `dir` for `variant` ("": the plain files). Throws
// protocol::ModelError naming the folder when there are none, several candidates and no index, or
// only other variants' (naming them and --variant).
ComponentWeights find_component_weights(const std::string& dir, const std::string& variant);

// The weight_map of the sharded index `index_path`: tensor name -> shard file name, a plain name
// inside the index's folder. Throws protocol::ModelError naming the file.
std::map<std::string, std::string> read_weight_index(const std::string& index_path);

}  // namespace dp::strategies
