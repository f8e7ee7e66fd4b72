#pragma once
// Reading the files of a model folder safely: a path the user supplied may name a FIFO, a device
// or a folder, whose open() or read() would block every rank forever or never end. Every model
// file (configs, tokenizers, indexes, safetensors) is opened through here: without blocking,
// checked to be a regular file, and read up to a size limit. std and POSIX only.

#include <cstddef>
#include <string>

namespace dp::strategies {

// An open file descriptor of the regular file `path` (O_CLOEXEC, blocking mode restored), the
// caller's to close. Throws protocol::ModelError naming the path when it cannot be opened or is
// not a regular file (a FIFO, a device, a folder).
int open_model_file(const std::string& path);

// The whole regular file `path`. Throws protocol::ModelError as open_model_file does, and when the
// file is larger than `max_bytes` or cannot be read.
std::string read_model_file(const std::string& path, std::size_t max_bytes = std::size_t{64} << 20);

// Whether `path` exists at all (any kind of file), without opening it.
bool model_file_exists(const std::string& path);

}  // namespace dp::strategies
