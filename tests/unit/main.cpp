// The test executables' main: doctest's, after pinning the CPU code paths.
//
// Note [Tests pin the CPU code paths]
// LibTorch, MKL and oneDNN each pick their kernels by the CPU they run on (AVX2, AVX-512,
// AVX512-BF16/FP16, AMX), and the kernels of two instruction sets sum in other orders: measured,
// transformers' own fp32 T5 output moves by 1e-6 between an AVX-512 and an AVX2 machine, its fp16
// output by two units in the last place. The golden tensors are written once, on one machine, and
// the tests compare half-precision outputs within one or two of those units; so every test process
// (and every rank it starts, which inherits the environment) takes the AVX2 paths, the ones every
// x86-64 machine of ours has, and scripts/golden/make_golden.sh writes the golden tensors under the
// same three settings. A variable already set is kept, so a run can ask for another path.
//
// MKL's AVX2 path alone is not enough on a machine with AVX-512 and AMX (an Intel Sapphire
// Rapids): its sgemm there still summed in an order that depends on the matrix's rows, so one
// prompt's rows gave other bits alone (cfg2: each branch on its rank) than batched beside the other
// branch, and images moved between 1, 2 and 3 processes. MKL's strict mode ("AVX2,STRICT") makes
// each row's result independent of the rest of the call; on an AVX2-only EPYC both modes agree.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>

int main(int argc, char** argv) {
    setenv("ATEN_CPU_CAPABILITY", "avx2", /*overwrite=*/0);  // LibTorch's own vectorised kernels
    setenv("MKL_CBWR", "AVX2,STRICT", 0);     // MKL's conditional numerical reproducibility, row by row
    setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 0);  // oneDNN (LibTorch's bf16/fp16 matmuls)
    return doctest::Context(argc, argv).run();
}
