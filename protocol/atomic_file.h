#pragma once
// Note [atomic file]: a file that readers see whole or not at all. The text goes to PATH.tmp.PID,
// which commit() flushes, fsyncs and renames over PATH, so PATH is the old file or the new one,
// never torn, whatever the new one's size and whenever the writer is killed. The launcher's
// manifest, gallery, job file and node files are written this way (one writer for both sides:
// the worker's images and tensors may use it too). A killed writer's PATH.tmp.PID is what
// launcher/output_folder.h's remove_leftovers clears. std and POSIX only.

#include <cstddef>
#include <string>
#include <string_view>

namespace dp::protocol {

// The temporary file a writer of `path` in this process writes: PATH.tmp.PID.
std::string atomic_temp_path(const std::string& path);

// A file written in pieces and replaced whole. The memory held is one buffer of kBufferBytes,
// whatever is written.
class AtomicFile {
  public:
    static constexpr std::size_t kBufferBytes = 64 * 1024;

    // Creates PATH.tmp.PID. Throws IoError naming it.
    explicit AtomicFile(std::string path);
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    // Without commit(), the temporary file is removed and PATH stays as it was.
    ~AtomicFile();

    // Throws IoError (a full disk); the temporary file is removed then.
    void write(std::string_view text);
    // Flushes, fsyncs, closes and renames over PATH. Throws IoError; the temporary file is removed then.
    void commit();

    const std::string& path() const { return path_; }

  private:
    void flush();
    [[noreturn]] void fail(const std::string& what);

    std::string path_, tmp_;
    int fd_ = -1;
    std::string buffer_;
};

// `contents` as the whole of the file at `path`, through an AtomicFile. Throws IoError naming the path.
void write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace dp::protocol
