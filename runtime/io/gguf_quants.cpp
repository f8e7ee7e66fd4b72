#include "runtime/io/gguf_quants.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>
#include <stdexcept>

namespace dp::runtime {
namespace {

using Byte = uint8_t;

float half(const Byte* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// 32-element blocks.
void q4_0(const Byte* b, float* y) {
    const float d = half(b);
    const Byte* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
}

void q4_1(const Byte* b, float* y) {
    const float d = half(b), m = half(b + 2);
    const Byte* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
        y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
}

// Q5: the fifth bit of element j is bit j of the 32-bit qh (elements 0-15 the low nibbles, 16-31
// the high ones).
void q5_0(const Byte* b, float* y) {
    const float d = half(b);
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const Byte* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
        const int x0 = ((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
        const int x1 = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        y[j] = static_cast<float>(x0) * d;
        y[j + 16] = static_cast<float>(x1) * d;
    }
}

void q5_1(const Byte* b, float* y) {
    const float d = half(b), m = half(b + 2);
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const Byte* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
        const int x0 = (qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10);
        const int x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        y[j] = static_cast<float>(x0) * d + m;
        y[j + 16] = static_cast<float>(x1) * d + m;
    }
}

void q8_0(const Byte* b, float* y) {
    const float d = half(b);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Note [k-quants]: a 256-element super-block of 16 or 8 sub-blocks, each with its own scale (and
// minimum) quantized against the super-block's fp16 d (and dmin). The bit layouts are ggml's.

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64] (2 bits each), d, dmin.
void q2_k(const Byte* b, float* y) {
    const Byte* scales = b;
    const Byte* q = b + 16;
    const float d = half(b + 80), dmin = half(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
            for (int half_ = 0; half_ < 2; ++half_) {
                const Byte sc = scales[is++];
                const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
                for (int l = 0; l < 16; ++l)
                    *y++ = dl * static_cast<float>((q[l + 16 * half_] >> shift) & 3) - ml;
            }
            shift += 2;
        }
        q += 32;
    }
}

// Q3_K: hmask[32] (the third bit), qs[64] (the low two bits), scales[12] (16 6-bit scales, offset
// by 32), d.
void q3_k(const Byte* b, float* y) {
    const Byte* hm = b;
    const Byte* q = b + 32;
    const float d_all = half(b + 108);
    uint32_t aux[4];
    std::memcpy(aux, b + 96, 12);
    constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    std::memcpy(scales, aux, 16);
    int is = 0;
    Byte m = 1;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
            for (int half_ = 0; half_ < 2; ++half_) {
                const float dl = d_all * static_cast<float>(scales[is++] - 32);
                for (int l = 0; l < 16; ++l) {
                    const int k = l + 16 * half_;
                    *y++ = dl * static_cast<float>(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                }
            }
            shift += 2;
            m = static_cast<Byte>(m << 1);
        }
        q += 32;
    }
}

// The 6-bit scale and minimum of sub-block j of Q4_K and Q5_K, packed in 12 bytes.
void scale_min_k4(int j, const Byte* q, Byte& sc, Byte& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = static_cast<Byte>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        m = static_cast<Byte>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Q4_K: d, dmin, scales[12], qs[128] (low nibbles the first 32 of each 64, high nibbles the next).
// Q5_K: the same with qh[32] before qs, the fifth bits, two per pair of sub-blocks.
template <bool kFifthBit>
void q45_k(const Byte* b, float* y) {
    const float d = half(b), dmin = half(b + 2);
    const Byte* scales = b + 4;
    const Byte* qh = b + 16;
    const Byte* q = b + (kFifthBit ? 48 : 16);
    Byte u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        Byte sc, m;
        scale_min_k4(is, scales, sc, m);
        const float d1 = d * sc, m1 = dmin * m;
        scale_min_k4(is + 1, scales, sc, m);
        const float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; ++l)
            *y++ = d1 * static_cast<float>((q[l] & 0x0F) + (kFifthBit && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l)
            *y++ = d2 * static_cast<float>((q[l] >> 4) + (kFifthBit && (qh[l] & u2) ? 16 : 0)) - m2;
        u1 = static_cast<Byte>(u1 << 2);
        u2 = static_cast<Byte>(u2 << 2);
    }
}

// Q6_K: ql[128] (low four bits), qh[64] (high two bits), scales[16] (int8), d.
void q6_k(const Byte* b, float* y) {
    const Byte* ql = b;
    const Byte* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half(b + 208);
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
            y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
            y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
            y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
        }
    }
}

}  // namespace

void dequantize_rows(const strategies::GgmlType& type, const std::byte* data, int64_t rows,
                     int64_t row_elements, float* out) {
    const int64_t n = rows * row_elements;
    const auto* p = reinterpret_cast<const Byte*>(data);
    switch (type.id) {
        case 0:
            std::memcpy(out, p, static_cast<std::size_t>(n) * 4);
            return;
        case 1:
            for (int64_t i = 0; i < n; ++i) out[i] = half(p + 2 * i);
            return;
        case 30:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t bits;
                std::memcpy(&bits, p + 2 * i, 2);
                out[i] = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
            }
            return;
        default:
            break;
    }
    void (*block)(const Byte*, float*) = nullptr;
    switch (type.id) {
        case 2:
            block = q4_0;
            break;
        case 3:
            block = q4_1;
            break;
        case 6:
            block = q5_0;
            break;
        case 7:
            block = q5_1;
            break;
        case 8:
            block = q8_0;
            break;
        case 10:
            block = q2_k;
            break;
        case 11:
            block = q3_k;
            break;
        case 12:
            block = q45_k<false>;
            break;
        case 13:
            block = q45_k<true>;
            break;
        case 14:
            block = q6_k;
            break;
        default:
            throw std::invalid_argument(std::string("dequantize_rows: ggml type ") + type.name +
                                        " has no kernel");
    }
    const int64_t blocks = n / type.block_elements;
    for (int64_t k = 0; k < blocks; ++k) block(p + k * type.block_bytes, out + k * type.block_elements);
}

}  // namespace dp::runtime
