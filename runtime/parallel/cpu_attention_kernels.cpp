// Built with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512bf16 (runtime/CMakeLists.txt);
// called only where the CPU has them (cpu_attention_fits). See cpu_attention_kernels.h for why
// this file includes nothing but intrinsics.
#include "runtime/parallel/cpu_attention_kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

namespace dp::runtime::cpu_attention_kernels {
namespace {

constexpr int64_t kKeyBlock = 128;  // keys per block of the online softmax
constexpr int kTileRows = 4;        // query rows per register tile

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// e^x in 16 lanes, within 2 ulp where e^x is a normal float; exactly 0 below e^-87 (and at -inf).
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2; e^r from its degree-7 minimax polynomial:
// the constants of fused_ops.cpp's exp_for_gelu, written again here in intrinsics because this file
// shares no inline code with the rest (cpu_attention_kernels.h).
inline __m512 exp16(__m512 x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.5f)), _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, n));
}

// Horizontal maximum and sum of 16 lanes (GCC 12's _mm512_reduce_* warn of an uninitialized
// operand inside them).
inline float max16(__m512 x) {
    const __m256 a = _mm256_max_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
    __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_max_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_max_ss(b, _mm_shuffle_ps(b, b, 1)));
}
inline float sum16(__m512 x) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_shuffle_ps(b, b, 1)));
}

float exp1(float x) { return _mm512_cvtss_f32(exp16(_mm512_set1_ps(x))); }

inline __m512 bcast_pair(const uint16_t* p) {  // two bf16 as one 32-bit lane, in every lane
    int32_t pair;
    __builtin_memcpy(&pair, p, sizeof pair);
    return _mm512_castsi512_ps(_mm512_set1_epi32(pair));
}

inline __m512bh as_bh(__m512 x) { return (__m512bh)x; }  // NOLINT: a vector's bits, retyped

// The element types: fp32 multiplies one head_dim entry (or key) per lane and step; bf16 two, as
// a pair in each 32-bit lane (vdpbf16ps), its keys and values packed in pairs to match.
struct F32 {
    using Elem = float;
    static constexpr int64_t kPack = 1;
    static __m512 bcast(const float* x) { return _mm512_set1_ps(*x); }
    static __m512 madd(__m512 acc, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, acc); }
    static void store(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
};

struct Bf16 {
    using Elem = uint16_t;
    static constexpr int64_t kPack = 2;
    static __m512 bcast(const uint16_t* x) { return bcast_pair(x); }
    static __m512 madd(__m512 acc, __m512 a, __m512 b) { return _mm512_dpbf16_ps(acc, as_bh(a), as_bh(b)); }
    static void store(uint16_t* p, __m512 x) {  // rounded to nearest even
        const __m256bh y = _mm512_cvtneps_pbh(x);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)y);  // NOLINT: the same bits
    }
};

// A register tile of R rows and NC * 16 columns: acc[r][c] += sum over `steps` of a_r b_c, with
// a_r broadcast from row r of `a` and b_c loaded from `b` (a step's row at b_step).
template <typename K, int R, int NC>
void tile_product(const typename K::Elem* const* a, const typename K::Elem* b, int64_t b_step, int64_t steps,
                  __m512 (&acc)[R][NC]) {
    for (int64_t p = 0; p < steps; ++p) {
        __m512 bv[NC];
#pragma GCC unroll 4
        for (int c = 0; c < NC; ++c) bv[c] = _mm512_loadu_ps(b + p * b_step + 16 * K::kPack * c);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m512 av = K::bcast(a[r] + K::kPack * p);
#pragma GCC unroll 4
            for (int c = 0; c < NC; ++c) acc[r][c] = K::madd(acc[r][c], av, bv[c]);
        }
    }
}

// Logits of R query rows against NC * 16 keys (kt: a head_dim step's keys at kt_step), into s.
template <typename K, int R, int NC>
void scores(const typename K::Elem* const* q, const typename K::Elem* kt, int64_t kt_step, int64_t d,
            float* s) {
    __m512 acc[R][NC];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
    tile_product<K, R, NC>(q, kt, kt_step, d / K::kPack, acc);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int c = 0; c < NC; ++c) _mm512_storeu_ps(s + r * kKeyBlock + 16 * c, acc[r][c]);
}

// o[r] += the R rows of probabilities p (kKeyBlock apart) times nk keys' values, for NC * 16 of
// head_dim's columns (v: a key's, or a key pair's, values at K::kPack * d).
template <typename K, int R, int NC>
void accumulate(const typename K::Elem* p, const typename K::Elem* v, int64_t d, int64_t nk, float* o) {
    const typename K::Elem* rows[R];
    __m512 acc[R][NC];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        rows[r] = p + r * kKeyBlock;
#pragma GCC unroll 4
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_loadu_ps(o + r * d + 16 * c);
    }
    tile_product<K, R, NC>(rows, v, K::kPack * d, nk / K::kPack, acc);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + r * d + 16 * c, acc[r][c]);
}

template <int N>
struct Int {
    static constexpr int value = N;
};

// Calls f(Int<R>, Int<NC>) for a tile of `rows` (1..4) rows and `cols` (32, or 64 and more)
// columns: NC 16-lane registers across.
template <typename F>
void tile(int64_t rows, int64_t cols, const F& f) {
    const bool wide = cols >= 64;
    switch (rows) {
        case 1:
            return wide ? f(Int<1>(), Int<4>()) : f(Int<1>(), Int<2>());
        case 2:
            return wide ? f(Int<2>(), Int<4>()) : f(Int<2>(), Int<2>());
        case 3:
            return wide ? f(Int<3>(), Int<4>()) : f(Int<3>(), Int<2>());
        default:
            return wide ? f(Int<4>(), Int<4>()) : f(Int<4>(), Int<2>());
    }
}

// One task's state: kQueryBlock query rows, their running maxima, sums and unnormalized outputs.
template <typename K>
struct Block {
    using E = typename K::Elem;
    alignas(64) float s[kQueryBlock * kKeyBlock];  // logits, then fp32 probabilities
    alignas(64) E p[kQueryBlock * kKeyBlock];      // probabilities as the values' product takes them
    alignas(64) float o[kQueryBlock * kMaxHeadDim];
    float m[kQueryBlock], l[kQueryBlock];
    const E* q[kQueryBlock];
};

// Online softmax over one block of nk logits of row r (Note [attention on the CPU]).
template <typename K>
void softmax_row(Block<K>& blk, int64_t r, int64_t nk, const float* bias, float scale, int64_t d) {
    float* s = blk.s + r * kKeyBlock;
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 mx = _mm512_set1_ps(-__builtin_inff());
    for (int64_t c = 0; c < nk; c += 16) {
        const __m512 x =
            _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(s + c), vscale), _mm512_loadu_ps(bias + c));
        _mm512_storeu_ps(s + c, x);
        mx = _mm512_max_ps(mx, x);
    }
    const float m_blk = max16(mx), m_new = blk.m[r] > m_blk ? blk.m[r] : m_blk;
    typename K::Elem* p = blk.p + r * kKeyBlock;
    if (m_new == -__builtin_inff()) {  // every key so far masked: nothing to add
        for (int64_t c = 0; c < nk; c += 16) K::store(p + c, _mm512_setzero_ps());
        return;
    }
    const __m512 vm = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < nk; c += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + c), vm));
        sum = _mm512_add_ps(sum, e);
        K::store(p + c, e);
    }
    const float alpha = blk.m[r] == -__builtin_inff() ? 0.0f : exp1(blk.m[r] - m_new);
    if (alpha != 1.0f) {
        float* o = blk.o + r * d;
        for (int64_t c = 0; c < d; c += 16)
            _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), _mm512_set1_ps(alpha)));
    }
    blk.l[r] = blk.l[r] * alpha + sum16(sum);
    blk.m[r] = m_new;
}

template <typename K>
void run_task(const Operands& o, int64_t task, Block<K>& blk) {
    using E = typename K::Elem;
    const int64_t qblocks = (o.queries + kQueryBlock - 1) / kQueryBlock;
    const int64_t b = task / (o.heads * qblocks), h = task / qblocks % o.heads,
                  q0 = task % qblocks * kQueryBlock;
    const int64_t nq = min64(kQueryBlock, o.queries - q0), d = o.head_dim, kp = o.keys_padded;
    const E* q = static_cast<const E*>(o.q) + b * o.q_stride[0] + h * o.q_stride[1];
    for (int64_t r = 0; r < nq; ++r) {
        blk.q[r] = q + (q0 + r) * o.q_stride[2];
        blk.m[r] = -__builtin_inff();
        blk.l[r] = 0;
    }
    for (int64_t i = 0; i < nq * d; ++i) blk.o[i] = 0;
    const E* kt = static_cast<const E*>(o.kt) + (b * o.heads + h) * d * kp;
    const E* v = static_cast<const E*>(o.v) + (b * o.heads + h) * d * kp;
    const float* bias = o.bias + b * o.bias_batch_stride;
    constexpr int64_t pair = K::kPack;  // bf16 keys and values come in pairs
    for (int64_t k0 = 0; k0 < kp; k0 += kKeyBlock) {
        const int64_t nk = min64(kKeyBlock, kp - k0);
        for (int64_t r = 0; r < nq; r += kTileRows)
            for (int64_t c = 0; c < nk; c += 64)
                tile(min64(kTileRows, nq - r), nk - c, [&](auto rows, auto regs) {
                    scores<K, rows.value, regs.value>(blk.q + r, kt + (k0 + c) * pair, kp * pair, d,
                                                      blk.s + r * kKeyBlock + c);
                });
        for (int64_t r = 0; r < nq; ++r) softmax_row<K>(blk, r, nk, bias + k0, o.scale, d);
        for (int64_t r = 0; r < nq; r += kTileRows)
            for (int64_t c = 0; c < d; c += 64)
                tile(min64(kTileRows, nq - r), d - c, [&](auto rows, auto regs) {
                    accumulate<K, rows.value, regs.value>(blk.p + r * kKeyBlock, v + k0 * d + c * pair, d, nk,
                                                          blk.o + r * d + c);
                });
    }
    E* out = static_cast<E*>(o.out) + b * o.out_stride[0] + h * o.out_stride[1];
    for (int64_t r = 0; r < nq; ++r) {
        const __m512 inv = _mm512_set1_ps(blk.l[r] > 0 ? 1.0f / blk.l[r] : 0.0f);
        for (int64_t c = 0; c < d; c += 16)
            K::store(out + (q0 + r) * o.out_stride[2] + c,
                     _mm512_mul_ps(_mm512_loadu_ps(blk.o + r * d + c), inv));
    }
}

template <typename K>
void run(const Operands& o, int64_t first, int64_t end) {
    Block<K> blk;
    for (int64_t t = first; t < end; ++t) run_task<K>(o, t, blk);
}

// Packs one (batch, head): keys transposed so that a head_dim step's keys (fp32), or pair of steps'
// (bf16, as 32-bit lanes), lie together; values as they are (fp32) or with each pair of keys'
// entries side by side (bf16). Either way a 32-bit word moves whole: E elements per word.
template <typename E>
void pack_head(const Source& s, const Operands& o, int64_t head) {
    constexpr int64_t per = 4 / sizeof(E);  // elements per 32-bit word
    const int64_t b = head / o.heads, h = head % o.heads, d = o.head_dim, kp = o.keys_padded, words = d / per;
    const E* k = static_cast<const E*>(s.k) + b * s.k_stride[0] + h * s.k_stride[1];
    const E* v = static_cast<const E*>(s.v) + b * s.v_stride[0] + h * s.v_stride[1];
    uint32_t* kt = static_cast<uint32_t*>(const_cast<void*>(o.kt)) + head * words * kp;
    E* vp = static_cast<E*>(const_cast<void*>(o.v)) + head * d * kp;
    for (int64_t j = 0; j < kp; ++j) {
        const E* row = j < s.keys ? k + j * s.k_stride[2] : nullptr;
        for (int64_t w = 0; w < words; ++w) {
            uint32_t word = 0;
            if (row) __builtin_memcpy(&word, row + w * per, sizeof word);
            kt[w * kp + j] = word;
        }
    }
    for (int64_t j = 0; j < kp; ++j) {  // value j, entry e: at (j / per) * per * d + e * per + j % per
        const E* row = j < s.keys ? v + j * s.v_stride[2] : nullptr;
        E* out = vp + j / per * per * d + j % per;
        for (int64_t e = 0; e < d; ++e) out[e * per] = row ? row[e] : E(0);
    }
}

}  // namespace

void pack_f32(const Source& s, const Operands& o, int64_t first, int64_t end) {
    for (int64_t head = first; head < end; ++head) pack_head<float>(s, o, head);
}
void pack_bf16(const Source& s, const Operands& o, int64_t first, int64_t end) {
    for (int64_t head = first; head < end; ++head) pack_head<uint16_t>(s, o, head);
}

bool built() { return true; }

int64_t task_count(const Operands& o) {
    return o.batch * o.heads * ((o.queries + kQueryBlock - 1) / kQueryBlock);
}
void run_f32(const Operands& o, int64_t first, int64_t end) { run<F32>(o, first, end); }
void run_bf16(const Operands& o, int64_t first, int64_t end) { run<Bf16>(o, first, end); }

}  // namespace dp::runtime::cpu_attention_kernels

#else  // not built for AVX-512: cpu_attention_fits() never lets a call reach these

namespace dp::runtime::cpu_attention_kernels {
bool built() { return false; }
void pack_f32(const Source&, const Operands&, int64_t, int64_t) {}
void pack_bf16(const Source&, const Operands&, int64_t, int64_t) {}
int64_t task_count(const Operands&) { return 0; }
void run_f32(const Operands&, int64_t, int64_t) {}
void run_bf16(const Operands&, int64_t, int64_t) {}
}  // namespace dp::runtime::cpu_attention_kernels

#endif
