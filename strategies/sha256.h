#pragma once
// SHA-256 in lowercase hex (OpenSSL's libcrypto): of an image's bytes for the manifest, of an
// adapter file for its records. No LibTorch.

#include <cstddef>
#include <string>

namespace dp::strategies {

// Of `size` bytes at `data`. Throws protocol::Error (74) when the digest fails.
std::string sha256_hex(const void* data, std::size_t size);
// Of the regular file at `path`, read in pieces. Throws protocol::ModelError when it is no regular
// file, protocol::Error (74) when it cannot be read.
std::string file_sha256(const std::string& path);

}  // namespace dp::strategies
