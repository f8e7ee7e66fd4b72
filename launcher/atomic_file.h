#pragma once
// A file written in pieces and replaced whole: the text goes to PATH.tmp.PID, which commit()
// renames over PATH, so PATH is the old file or the new one, never torn, however large the new
// one is. The memory held is one buffer of kBufferBytes, whatever is written.

#include <string>
#include <string_view>

#include "launcher/unique_fd.h"

namespace dp::launcher {

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
    // Flushes, closes and renames over PATH. Throws IoError; the temporary file is removed then.
    void commit();

    const std::string& path() const { return path_; }

  private:
    void flush();
    [[noreturn]] void fail(const std::string& what);

    std::string path_, tmp_;
    UniqueFd fd_;
    std::string buffer_;
};

}  // namespace dp::launcher
