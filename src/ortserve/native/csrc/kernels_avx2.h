/* AVX2 + FMA + F16C helpers shared by kernels_avx2.c (the 32-weight block types, the activation
 * quantizers, SwiGLU and the RMS norm) and kernels_avx2_k.c (the K-quants and IQ4_XS): static inline, compiled for those
 * instructions by function attribute only. Included only inside an x86, SIMD-enabled build. */
#ifndef OSG_KERNELS_AVX2_H
#define OSG_KERNELS_AVX2_H

#include <immintrin.h>

#include "kernels_internal.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define RMAX 4

AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp(x), x clamped to [-88, 89] (past 88.7 n is 128 and 2^n is +inf, as expf overflows): 2^n * e^r with n = round(x / ln 2) and |r| <= ln 2 / 2,
 * e^r by Cephes' degree-6 polynomial (ln 2 split in two for an exact r), 2^n built in the exponent
 * bits; within 2 ulp of expf. */
AVX2_INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(89.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AVX2_INLINE int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

AVX2_INLINE float f16(uint16_t h) { return _cvtsh_ss(h); }

/* 16 packed bytes -> 32 nibbles: low nibbles are elements 0..15, high nibbles 16..31 */
AVX2_INLINE __m256i nibbles32(const uint8_t *qs) {
    /* the 16 bytes in both halves; the high half shifted right by 4 (64-bit lanes: the bits that cross
     * into a byte from its neighbour are masked off) */
    __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, 0x10 where bit j is set (the fifth bit of Q5 element j) */
AVX2_INLINE __m256i fifth_bits(const uint8_t *qh4) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
        _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* signed weights w (-128..127) times activations: |w| * (a with w's sign), pairs to int16, to int32 */
AVX2_INLINE __m256i dot_signed(__m256i w, __m256i a) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

AVX2_INLINE __m256i dot_unsigned(__m256i w, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

/* ---------------- activation quantization ---------------- */

AVX2_INLINE __m256 absmax8(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    return mx;
}

AVX2_INLINE float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 floats * inv, rounded half to even (cvtps2dq), to 32 int8 in order; returns their sum */
AVX2_INLINE int quant32_block(const float *x, float inv, int8_t *q) {
    __m256 s = _mm256_set1_ps(inv);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), s));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), s));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), s));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), s));
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    /* packs work per 128-bit lane: restore the element order */
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return hsum_epi32(sum);
}

AVX2_INLINE float scale_of(float amax, float *inv) {
    float d = amax / 127.0f;
    *inv = d != 0.0f ? 1.0f / d : 0.0f;
    return d;
}

/* eight vectors of 8 int32 -> one vector of their eight sums */
AVX2_INLINE __m256i sums8(const __m256i *s) {
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* pairwise maxima of a and b, laid out as _mm256_hadd_ps would lay out the sums */
AVX2_INLINE __m256 hmax_pairs(__m256 a, __m256 b) {
    return _mm256_max_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
}

/* eight vectors -> one vector of their eight maxima (lane j: the maximum of m[j]) */
AVX2_INLINE __m256 max8(const __m256 *m) {
    __m256 a = hmax_pairs(hmax_pairs(m[0], m[1]), hmax_pairs(m[2], m[3]));
    __m256 b = hmax_pairs(hmax_pairs(m[4], m[5]), hmax_pairs(m[6], m[7]));
    return _mm256_max_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* 32 floats * inv to int8 (as quant32_block), returning the eight int32 partial sums */
AVX2_INLINE __m256i quant32_lanes(const float *x, __m256 s, int8_t *q) {
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), s));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), s));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), s));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), s));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
}


/* kernels_avx2_k.c: installs the K-quant and IQ4_XS kernels (called by osg_fill_avx2) */
void osg_fill_avx2_k(osg_kernels *k);

#endif
