// The same images whatever the number of processes: each rank gets another intra-op thread count
// (OMP_NUM_THREADS is split between the ranks), and no kernel of the pipeline may depend on it
// (Note [patch embedding as a matmul]). 60 images on the tiny model, with its VAE and with
// guidance, at 1, 2 and 3 processes.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "integration/launch_harness.h"
#include "support/test_paths.h"

// Images and records only: ctest may run these beside other tests (tests/CMakeLists.txt).
TEST_SUITE_BEGIN("parallel_safe");

using namespace dp::test;

TEST_CASE("60 images are byte-identical at 1, 2 and 3 processes, whatever each rank's thread count") {
    const std::string dir = make_temp_dir();
    const char* colours[] = {"red", "green", "blue", "yellow", "orange", "purple"};
    const char* shapes[] = {"circle", "square", "triangle", "star", "ring"};
    const char* sizes[] = {"small", "large"};
    {
        std::ofstream p(dir + "/p.txt");
        for (const char* c : colours)
            for (const char* s : shapes)
                for (const char* z : sizes)
                    p << "a " << z << " " << c << " " << s << " on a plain background\n";
    }
    std::map<int, std::map<int64_t, std::string>> sha;  // processes -> prompt index -> sha256
    for (int n : {1, 2, 3}) {
        CAPTURE(n);
        const std::string out = dir + "/out" + std::to_string(n);
        // Two intra-op threads for one process, one for each of several (as the launcher splits
        // two cores), set here so that the thread counts differ on any machine.
        const LaunchResult r = run_launch(
            {"-n", std::to_string(n), "--model", DP_TINY_MODEL, "--steps", "4", "--width", "32", "--height",
             "32", "--guidance-scale", "5", "--device", "cpu", "-o", out, dir + "/p.txt"},
            {{"OMP_NUM_THREADS", n == 1 ? "2" : "1"}}, 300);
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        std::istringstream manifest(read_file(out + "/manifest.jsonl"));
        for (std::string line; std::getline(manifest, line);) {
            const nlohmann::json rec = nlohmann::json::parse(line);
            sha[n][rec.at("index").get<int64_t>()] = rec.at("sha256").get<std::string>();
        }
        REQUIRE(sha[n].size() == 60);
    }
    int differ = 0;
    for (int n : {2, 3})
        for (const auto& [index, hash] : sha[1])
            if (sha[n][index] != hash) ++differ;
    CHECK_MESSAGE(differ == 0, differ << " image(s) differ from one process's");
}

TEST_SUITE_END();
