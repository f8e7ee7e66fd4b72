// A model folder whose files are not plain files (a FIFO where a config or the weights should be)
// ends the job at once with the path named, in the launcher or in the ranks, instead of blocking
// every rank in open() forever.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "integration/launch_harness.h"

using namespace dp::test;

namespace {
// A copy of the tiny model with `file` replaced by a FIFO.
std::string model_with_fifo(const std::string& dir, const std::string& file) {
    const std::string model = dir + "/model";
    REQUIRE(std::system(("cp -r '" + std::string(DP_TINY_MODEL) + "' '" + model + "'").c_str()) == 0);
    const std::string path = model + "/" + file;
    REQUIRE(unlink(path.c_str()) == 0);
    REQUIRE(mkfifo(path.c_str(), 0600) == 0);
    return model;
}
}  // namespace

TEST_CASE("a FIFO in the model folder is refused at once, naming it, never waited on") {
    for (const std::string file : {"transformer/config.json", "transformer/diffusion_pytorch_model.safetensors",
                                   "tokenizer/tokenizer.json"}) {
        CAPTURE(file);
        const std::string dir = make_temp_dir();
        const std::string model = model_with_fifo(dir, file);
        const std::string prompts = dir + "/p.txt";
        REQUIRE(std::system(("echo 'a prompt' > '" + prompts + "'").c_str()) == 0);
        const LaunchResult r =
            run_launch({"-n", "2", "--model", model, "--steps", "1", "--width", "16", "--height", "16",
                        "--device", "cpu", "-o", dir + "/out", prompts},
                       {}, 60);
        CHECK(r.exit_code != 0);
        CHECK(r.exit_code != -1);  // it ended by itself
        CHECK(r.seconds < 30);
        CHECK_MESSAGE(r.err.find(file + ": not a regular file") != std::string::npos, r.err);
    }
}
