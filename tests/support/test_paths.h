#pragma once
// Where the tests find the source tree's data and the programs they run. The values are compiled
// once, in the build's generated test_paths.cpp (tests/CMakeLists.txt), and no test source holds a
// path of its checkout: every test file compiles alike in any clone, so ccache serves a fresh
// clone what an earlier one compiled (docs/testing.md, "Where the time goes").

namespace dp::test::paths {

extern const char* const kSourceDir;      // the checkout's root
extern const char* const kGoldenDir;      // tests/data/golden
extern const char* const kModelsDir;      // models/
extern const char* const kTinyModel;      // tests/data/golden/sd3_tiny
extern const char* const kLaunchBin;      // the built dp-launch
extern const char* const kTestWorkerBin;  // the built dp-test-worker
extern const char* const kWorkerBin;      // the built dp-worker; empty in a build without LibTorch
extern const char* const kCudaPlugin;     // the built libdp_cuda.so; empty without the CUDA toolkit

}  // namespace dp::test::paths

#define DP_GOLDEN_DIR (::dp::test::paths::kGoldenDir)
#define DP_MODELS_DIR (::dp::test::paths::kModelsDir)
#define DP_TINY_MODEL (::dp::test::paths::kTinyModel)
#define DP_LAUNCH_BIN (::dp::test::paths::kLaunchBin)
#define DP_TEST_WORKER_BIN (::dp::test::paths::kTestWorkerBin)
#define DP_WORKER_BIN (::dp::test::paths::kWorkerBin)
