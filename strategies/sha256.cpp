#include "strategies/sha256.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "protocol/errors.h"
#include "strategies/model_files.h"

namespace dp::strategies {
namespace {

std::string hex_of(const unsigned char* bytes, unsigned int n) {
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < n; ++i) {
        out += hex[bytes[i] >> 4];
        out += hex[bytes[i] & 15];
    }
    return out;
}

}  // namespace

std::string file_sha256(const std::string& path) {
    const int fd = open_model_file(path);
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
        ::close(fd);
        throw protocol::Error("SHA-256 is not available", protocol::kExitInternal);
    }
    std::vector<unsigned char> buf(std::size_t{1} << 20);
    for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n == 0) break;
        if (n < 0) {
            if (errno == EINTR) continue;
            const std::string why = std::strerror(errno);
            ::close(fd);
            throw protocol::Error(path + ": cannot read (" + why + ")", protocol::kExitIo);
        }
        EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(n));
    }
    ::close(fd);
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx.get(), digest, &len);
    return hex_of(digest, len);
}

std::string weights_fingerprint(const std::vector<std::string>& files) {
    std::vector<std::string> sorted = files;
    std::sort(sorted.begin(), sorted.end());
    std::string summary;
    constexpr off_t kPiece = off_t{1} << 20;
    std::vector<unsigned char> buf(static_cast<std::size_t>(kPiece));
    for (const std::string& path : sorted) {
        const int fd = open_model_file(path);  // a regular file, or ModelError
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            ::close(fd);
            throw protocol::Error(path + ": cannot stat (" + std::strerror(errno) + ")", protocol::kExitIo);
        }
        std::string pieces;
        for (const off_t at : {off_t{0}, std::max<off_t>(0, st.st_size / 2 - kPiece / 2),
                               std::max<off_t>(0, st.st_size - kPiece)}) {
            const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
            if (n < 0) {
                const std::string why = std::strerror(errno);
                ::close(fd);
                throw protocol::Error(path + ": cannot read (" + why + ")", protocol::kExitIo);
            }
            pieces += sha256_hex(buf.data(), static_cast<std::size_t>(n));
        }
        ::close(fd);
        summary +=
            path + "\t" + std::to_string(st.st_size) + "\t" +
            std::to_string(static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec) +
            "\t" + pieces + "\n";
    }
    return sha256_hex(summary.data(), summary.size());
}

std::string sha256_hex(const void* data, std::size_t size) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_Digest(data, size, digest, &len, EVP_sha256(), nullptr) != 1)
        throw protocol::Error("SHA-256 failed", protocol::kExitIo);
    return hex_of(digest, len);
}

}  // namespace dp::strategies
