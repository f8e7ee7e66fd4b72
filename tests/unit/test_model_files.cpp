// Model files are opened without blocking and must be regular files: a FIFO, a device or a folder
// is refused at once with the path named, never waited on.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "protocol/errors.h"
#include "strategies/model_files.h"

using namespace dp::strategies;

namespace {
std::string scratch_dir() {
    std::string dir = "/tmp/dp_model_files_" + std::to_string(getpid());
    mkdir(dir.c_str(), 0777);
    return dir;
}
}  // namespace

TEST_CASE("a FIFO, a folder or a device is refused at once, naming the path") {
    const std::string dir = scratch_dir();
    const std::string fifo = dir + "/config.json";
    unlink(fifo.c_str());
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& path : {fifo, dir, std::string("/dev/zero")}) {
        CAPTURE(path);
        CHECK_THROWS_WITH_AS(read_model_file(path), doctest::Contains((path + ": not a regular file").c_str()),
                             dp::protocol::ModelError);
        CHECK_THROWS_AS(open_model_file(path), dp::protocol::ModelError);
        CHECK(model_file_exists(path));
    }
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
    unlink(fifo.c_str());
    rmdir(dir.c_str());
}

TEST_CASE("a regular model file is read whole, within its size limit") {
    const std::string dir = scratch_dir();
    const std::string path = dir + "/model_index.json";
    std::ofstream(path) << "{\"_class_name\": \"StableDiffusion3Pipeline\"}";
    CHECK(read_model_file(path) == "{\"_class_name\": \"StableDiffusion3Pipeline\"}");
    CHECK_THROWS_WITH_AS(read_model_file(path, 10), doctest::Contains("larger than"), dp::protocol::ModelError);
    CHECK_THROWS_WITH_AS(read_model_file(dir + "/missing.json"), doctest::Contains("cannot open"),
                         dp::protocol::ModelError);
    CHECK_FALSE(model_file_exists(dir + "/missing.json"));
    const int fd = open_model_file(path);
    CHECK(fd >= 0);
    char c = 0;
    CHECK(read(fd, &c, 1) == 1);  // blocking mode restored: an ordinary read
    CHECK(c == '{');
    close(fd);
    unlink(path.c_str());
    rmdir(dir.c_str());
}
