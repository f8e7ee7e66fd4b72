#include "strategies/model_files.h"
#include "strategies/text.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "protocol/errors.h"
#include "strategies/mapped_files.h"

namespace dp::strategies {
namespace {

// Why `path` could not be opened: a symlink whose target is gone (a Hugging Face snapshot whose
// blob was never downloaded or was deleted) is named as such.
std::string open_failure(const std::string& path, int err) {
    struct stat st {};
    if (err == ENOENT && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
        char target[4096];
        const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
        return path + ": a symlink to " + (n > 0 ? std::string(target, static_cast<std::size_t>(n)) : "?") +
               ", which is missing (an incomplete download? fetch the model again)";
    }
    if (err == ELOOP) return path + ": " + kSymlinkLoop;
    return path + ": cannot open (" + std::strerror(err) + ")";
}

// "-00001-of-00002" at the end of `stem`, as sharded weight files are numbered, is removed.
void strip_shard_number(std::string& stem) {
    const std::size_t of = stem.rfind("-of-");
    if (of == std::string::npos || of + 4 >= stem.size()) return;
    const auto digits = [&](std::size_t from, std::size_t to) {
        return to > from && std::all_of(stem.begin() + static_cast<std::ptrdiff_t>(from),
                                        stem.begin() + static_cast<std::ptrdiff_t>(to),
                                        [](char c) { return c >= '0' && c <= '9'; });
    };
    const std::size_t dash = stem.rfind('-', of - 1);
    if (of == 0 || dash == std::string::npos || !digits(of + 4, stem.size()) || !digits(dash + 1, of)) return;
    stem.resize(dash);
}

std::vector<std::string> folder_entries(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (!d)
        throw protocol::ModelError(dir + ": cannot open the component folder (" + std::strerror(errno) + ")");
    while (dirent* e = readdir(d)) names.emplace_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

std::string joined(const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
    return out;
}

}  // namespace

int open_model_file(const std::string& path) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw protocol::ModelError(open_failure(path, errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const bool dir = S_ISDIR(st.st_mode);
        ::close(fd);
        throw protocol::ModelError(path + ": not a regular file (" +
                                   (dir ? std::string("a folder") : std::string("a FIFO, socket or device")) +
                                   "); a model folder holds plain files");
    }
    const int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

std::string read_model_file(const std::string& path, std::size_t max_bytes) {
    const int fd = open_model_file(path);
    std::string out;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::close(fd);
            throw protocol::ModelError(path + ": cannot read (" + std::strerror(err) + ")");
        }
        if (n == 0) break;
        out.append(buf, static_cast<std::size_t>(n));
        if (out.size() > max_bytes) {
            ::close(fd);
            throw protocol::ModelError(path + ": larger than " + std::to_string(max_bytes >> 20) +
                                       " MiB; is it the right file?");
        }
    }
    ::close(fd);
    return out;
}

bool is_directory(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool model_file_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

std::string missing_file_text(const std::string& path, const std::string& otherwise) {
    struct stat st {};
    return ::stat(path.c_str(), &st) != 0 && errno == ELOOP ? kSymlinkLoop : otherwise;
}

void check_model_file(const std::string& path) { ::close(open_model_file(path)); }

std::optional<std::string> weight_file_variant(const std::string& name) {
    static const std::string kWeights = ".safetensors", kIndex = ".safetensors.index.", kJson = ".json";
    if (name.empty() || name[0] == '.') return std::nullopt;
    if (ends_with(name, kWeights) && name.size() > kWeights.size()) {
        std::string stem = name.substr(0, name.size() - kWeights.size());
        strip_shard_number(stem);  // NAME.VARIANT-00001-of-00002 -> NAME.VARIANT
        const std::size_t dot = stem.rfind('.');
        if (dot == std::string::npos) return std::string();
        if (dot == 0 || dot + 1 == stem.size()) return std::nullopt;
        std::string variant = stem.substr(dot + 1);
        strip_shard_number(variant);  // an older layout: NAME-00001-of-00002.VARIANT
        return variant;
    }
    const std::size_t at = name.find(kIndex);
    if (at == std::string::npos || at == 0 || !ends_with(name, kJson)) return std::nullopt;
    const std::size_t from = at + kIndex.size();
    if (name.size() == from + kJson.size() - 1) return std::string();  // NAME.safetensors.index.json
    if (name.size() <= from + kJson.size()) return std::nullopt;
    return name.substr(from, name.size() - kJson.size() - from);
}

std::set<std::string> weight_variants(const std::string& dir) {
    std::set<std::string> out;
    DIR* d = opendir(dir.c_str());
    if (!d) return out;
    while (dirent* e = readdir(d))
        if (const auto v = weight_file_variant(e->d_name)) out.insert(*v);
    closedir(d);
    return out;
}

ComponentWeights find_component_weights(const std::string& dir, const std::string& variant) {
    std::vector<std::string> indexes, files;
    std::set<std::string> others;  // the variants there are besides the one asked for
    for (const std::string& name : folder_entries(dir)) {
        const std::optional<std::string> v = weight_file_variant(name);
        if (!v) continue;
        if (*v != variant) {
            others.insert(*v);
            continue;
        }
        (ends_with(name, ".json") ? indexes : files).push_back(name);
    }
    const std::string dotted = variant.empty() ? "" : "." + variant;
    if (indexes.size() > 1)
        throw protocol::ModelError(dir + ": several *.safetensors.index" + dotted + ".json files (" +
                                   joined(indexes) + "); keep one");
    if (indexes.size() == 1) return {dir + "/" + indexes[0], ""};
    if (files.size() == 1) return {"", dir + "/" + files[0]};
    if (files.size() > 1)
        throw protocol::ModelError(dir + ": several *" + dotted + ".safetensors files (" + joined(files) +
                                   ") but no *.safetensors.index" + dotted + ".json naming which holds what");
    const bool plain = others.erase("") > 0;
    std::vector<std::string> variants(others.begin(), others.end());
    if (variant.empty()) {
        if (variants.empty())
            throw protocol::ModelError(dir + ": no *.safetensors weights (only safetensors is supported)");
        throw protocol::ModelError(dir + ": only variant weights (" + joined(variants) + ", e.g. NAME." +
                                   variants.front() + ".safetensors), no plain ones; pass --variant " +
                                   variants.front() + " to use them");
    }
    std::string has = plain ? "plain weights (drop --variant to use them)" : "";
    if (!variants.empty())
        has += (has.empty() ? "the variant(s) " : " and the variant(s) ") + joined(variants);
    throw protocol::ModelError(
        "--variant " + variant + ": " + dir + " has no " + variant + " weights (NAME." + variant +
        ".safetensors or NAME.safetensors.index." + variant + ".json)" +
        (has.empty() ? "; it has no *.safetensors weights at all" : "; it has " + has));
}

std::map<std::string, std::string> read_weight_index(const std::string& index_path) {
    const std::string text = read_model_file(index_path);
    nlohmann::json index;
    try {
        index = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw protocol::ModelError(index_path + ": not valid JSON (" + std::string(e.what()).substr(0, 160) +
                                   ")");
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
        throw protocol::ModelError(index_path +
                                   ": expected an object with a \"weight_map\" of tensor -> file");
    std::map<std::string, std::string> out;
    for (const auto& [name, file] : index["weight_map"].items()) {
        if (!file.is_string() || file.get<std::string>().empty() ||
            file.get<std::string>().find('/') != std::string::npos || file.get<std::string>()[0] == '.')
            throw protocol::ModelError(index_path + ": tensor '" + name +
                                       "' maps to a bad file name (expected a file in the same folder)");
        out[name] = file.get<std::string>();
    }
    return out;
}

MappedModelFile map_model_file(const std::string& path, std::size_t min_size, const std::string& too_small,
                               const std::string& header) {
    const int fd = open_model_file(path);  // a regular file, or ModelError
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw protocol::ModelError(path + ": cannot stat (" + std::strerror(err) + ")");
    }
    const auto size = static_cast<std::size_t>(st.st_size);
    if (size < min_size) {
        ::close(fd);
        throw protocol::ModelError(path + ": " + too_small + " (" + std::to_string(size) +
                                   " bytes, less than " + header + ")");
    }
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (map == MAP_FAILED) throw protocol::ModelError(path + ": cannot map (" + std::strerror(err) + ")");
    try {
        register_mapping(map, size, path, st);  // Note [files that change under a job]
    } catch (...) {
        munmap(map, size);
        throw;
    }
    return {map, size};
}

void unmap_model_file(const MappedModelFile& mapped) {
    if (!mapped.data) return;
    unregister_mapping(mapped.data);
    munmap(mapped.data, mapped.size);
}

}  // namespace dp::strategies
