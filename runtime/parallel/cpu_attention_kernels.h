#pragma once
// The AVX-512 kernels behind cpu_attention() (Note [attention on the CPU] in cpu_attention.h).
// They live in the one file built with AVX-512 enabled, and that file includes no library header:
// no inline function compiled there for AVX-512 can stand in for the copy other files use on a
// CPU without it. Counts and strides are in elements.

#include <cstdint>

namespace dp::runtime::cpu_attention_kernels {

inline constexpr int64_t kQueryBlock = 32;  // queries per task
inline constexpr int64_t kKeyAlign = 32;    // keys_padded is a multiple of this
inline constexpr int64_t kMaxHeadDim = 256;

// One attention, its keys and values packed by cpu_attention(). head_dim is a multiple of 32, at
// most kMaxHeadDim.
struct Operands {
    const void* q = nullptr;  // [B, H, queries, head_dim] at q_stride; head_dim contiguous
    int64_t q_stride[3] = {};
    // fp32: [B, H, head_dim, keys_padded]; bf16: [B, H, head_dim / 2, keys_padded, 2].
    const void* kt = nullptr;
    // fp32: [B, H, keys_padded, head_dim]; bf16: [B, H, keys_padded / 2, head_dim, 2].
    const void* v = nullptr;
    // [1 or B, keys_padded], added to the scaled logits; -inf masks a key (and every padded one).
    const float* bias = nullptr;
    int64_t bias_batch_stride = 0;  // 0: one row for every batch
    void* out = nullptr;            // like q, at out_stride
    int64_t out_stride[3] = {};
    int64_t batch = 0, heads = 0, queries = 0, keys_padded = 0, head_dim = 0;
    float scale = 1;
};

// The keys and values as attention takes them: [B, H, keys, head_dim] at their strides (head_dim
// contiguous), of Operands' element type.
struct Source {
    const void* k = nullptr;
    const void* v = nullptr;
    int64_t k_stride[3] = {}, v_stride[3] = {};
    int64_t keys = 0;
};

// Packs heads [first, end) of batch * heads (one (batch, head) pair each) from `s` into o.kt and
// o.v, in Operands' layouts, with zeros for the padded keys.
void pack_f32(const Source& s, const Operands& o, int64_t first, int64_t end);
void pack_bf16(const Source& s, const Operands& o, int64_t first, int64_t end);

// Whether this build has the kernels (built for x86-64 with AVX-512 and AVX512-BF16 enabled); the
// functions below do nothing where it has not.
bool built();

// batch * heads * ceil(queries / kQueryBlock): the tasks run_* splits the work into.
int64_t task_count(const Operands& o);

// Computes tasks [first, end): each writes its own block of query rows, so the result does not
// depend on how the tasks are shared among threads. fp32 or bf16 operands (bf16: the logits and
// the softmax in fp32, its probabilities rounded to bf16 for the product with the values, as
// ATen's CPU kernel does).
void run_f32(const Operands& o, int64_t first, int64_t end);
void run_bf16(const Operands& o, int64_t first, int64_t end);

}  // namespace dp::runtime::cpu_attention_kernels
