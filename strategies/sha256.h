#pragma once
// SHA-256 in lowercase hex (OpenSSL's libcrypto), the one implementation of both sides: of an
// image's bytes for the manifest, of an image file --resume keeps, of an adapter or component file
// for its records. No LibTorch.

#include <cstddef>
#include <string>
#include <vector>

namespace dp::strategies {

// Of `size` bytes at `data`. Throws protocol::Error (74) when the digest fails.
std::string sha256_hex(const void* data, std::size_t size);
// Of the regular file at `path`, read in pieces. Throws protocol::ModelError when it is no regular
// file, protocol::Error (74) when it cannot be read.
std::string file_sha256(const std::string& path);

// Note [weights fingerprint]: what --resume compares to see weights changed in place at the same
// path. Over each file (sorted): its name, size, modification time (ns), and the SHA-256 of its
// first, middle and last MiB (the header, where a conversion writes, and samples of the data), in
// one SHA-256 hex: a second a terabyte to compute, and any rewrite of a file changes its time.
// Throws as file_sha256 does.
std::string weights_fingerprint(const std::vector<std::string>& files);

}  // namespace dp::strategies
