#pragma once
// Note [files that change under a job]: a rank maps its weight files (safetensors, GGUF) and reads
// their pages while it runs: a weight aliases its file's mapping, and a kept-quantized GGUF weight
// is read from it at every use. A file truncated under the job turns the next read past its new
// end into SIGBUS, and a file rewritten in place gives the rank other bytes than those the job
// recorded, in the middle of an image. So every mapping is registered here with its path and the
// file's identity when it was mapped (device, inode, size, modification time), and, once the
// worker turns the guard on:
// - a SIGBUS at an address inside a registered mapping writes "PATH changed or was truncated
//   while the job ran (mapped at A-B, fault at F)" to stderr, with write(2) only, and ends the
//   process with kExitFileChanged (74, EX_IOERR), never a bare SIGBUS; elsewhere the signal keeps
//   its default action;
// - changed_mapped_file() says which mapped file's path no longer names the file as it was mapped
//   (other size, modification time or inode, or gone); the worker asks before each batch and
//   before its images are written, so an in-place rewrite of the same size is caught too;
// - a path mapped again later must still be the same file (a component built again from its
//   files), or map_model_file throws IoError naming it.
// std and POSIX only: the launcher links it too (it never turns the guard on).

#include <sys/stat.h>

#include <cstddef>
#include <string>

#include "protocol/errors.h"

namespace dp::strategies {

// What a rank exits with when a file the job reads changed while it ran (docs/launcher.md).
inline constexpr int kExitFileChanged = protocol::kExitIo;

// Registers [data, data + size) as the mapping of `path`, the file `st` describes. Throws
// protocol::IoError naming the path when the guard is on and `path` was mapped before as another
// file. A full table (far more mappings than any model has) registers nothing.
void register_mapping(const void* data, std::size_t size, const std::string& path, const struct stat& st);
// Forgets the mapping at `data` (before it is unmapped).
void unregister_mapping(const void* data);

// The message for the first mapped file whose path no longer names the file as it was mapped, or
// empty when none changed.
std::string changed_mapped_file();

// Turns the guard on for this process: the SIGBUS handler (its message starts with `prefix`,
// e.g. "dp-worker: ") and the check that a path mapped again is the same file.
void guard_mapped_files(const char* prefix);

}  // namespace dp::strategies
