#pragma once
// Dequantization of GGUF tensor data (Note [gguf], strategies/gguf.h) to fp32, block by block, as
// ggml's dequantize_row_* functions define each type: the plain F32, F16 and BF16, the 32-element
// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 blocks, and the 256-element K-quant super-blocks Q2_K to Q6_K
// (Note [k-quants] in the .cpp). No LibTorch in the interface: the store makes tensors of the rows.

#include <cstddef>
#include <cstdint>

#include "strategies/gguf.h"

namespace dp::runtime {

// `rows` rows of `row_elements` elements of type `type` from `data` (rows * row_elements /
// block_elements blocks, one after the other) into `out` (rows * row_elements floats).
// `row_elements` must be whole blocks (strategies::GgufFile checks every tensor so).
void dequantize_rows(const strategies::GgmlType& type, const std::byte* data, int64_t rows,
                     int64_t row_elements, float* out);

}  // namespace dp::runtime
