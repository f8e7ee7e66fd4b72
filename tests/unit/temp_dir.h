#pragma once
// A fresh folder for one test, /tmp/dp_WHAT_XXXXXX, removed with its files when it goes out of
// scope: files written into it, copied in, and read back. Standard C++ and POSIX only, for the
// launcher's tests and the LibTorch ones alike.

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace dp::test {

class TempDir {
  public:
    explicit TempDir(const std::string& what = "test") {
        std::string name = "/tmp/dp_" + what + "_XXXXXX";
        if (mkdtemp(name.data()) == nullptr) throw std::runtime_error("mkdtemp " + name + " failed");
        path = name;
    }
    ~TempDir() { (void)std::system(("rm -rf '" + path + "'").c_str()); }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    // `bytes` as the file `name`.
    void write(const std::string& name, const std::string& bytes) const {
        std::ofstream out(path + "/" + name, std::ios::binary | std::ios::trunc);
        out << bytes;
        if (!out) throw std::runtime_error("cannot write " + path + "/" + name);
    }
    // The file `from` copied in as `name`.
    void copy(const std::string& from, const std::string& name) const {
        std::ifstream in(from, std::ios::binary);
        if (!in) throw std::runtime_error("cannot read " + from);
        std::ostringstream bytes;
        bytes << in.rdbuf();
        write(name, bytes.str());
    }
    bool has(const std::string& name) const {
        struct stat st {};
        return stat((path + "/" + name).c_str(), &st) == 0;
    }
    std::string read(const std::string& name) const {
        std::ifstream in(path + "/" + name, std::ios::binary);
        std::ostringstream text;
        text << in.rdbuf();
        return text.str();
    }

    std::string path;
};

}  // namespace dp::test
