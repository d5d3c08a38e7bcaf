/* AVX2 + FMA + F16C paths, compiled for those instructions by function attribute only (the library is
 * built without -march), installed when the CPU reports them.
 *
 * Every kernel keeps a block's integer sums exact in int32 lanes (maddubs pairs never saturate: weights
 * are at most 63 unsigned, or |w| <= 128 by the sign trick, activations at most 127), and floats enter
 * once per block as (weight scale * activation scale) * lanes. Each kernel is written for R activation
 * rows at once (R a constant 1..4): a weight block is unpacked once and dotted with all R rows. */
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define RMAX 4

AVX2_INLINE float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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

AVX2 static void quant32_avx2(const float *x, void *xq, int64_t k) {
    act32 *a = (act32 *)xq;
    for (int64_t b = 0; b < k / QK; b++, x += QK, a++) {
        float inv;
        a->d = scale_of(hmax_ps(absmax8(x, QK)), &inv);
        a->sum = quant32_block(x, inv, a->qs);
    }
}

AVX2 static void quant256_avx2(const float *x, void *xq, int64_t k) {
    act256 *a = (act256 *)xq;
    for (int64_t b = 0; b < k / QKK; b++, x += QKK, a++) {
        float inv;
        a->d = scale_of(hmax_ps(absmax8(x, QKK)), &inv);
        for (int j = 0; j < 8; j++) {
            quant32_block(x + 32 * j, inv, a->qs + 32 * j);
            __m256i v = _mm256_loadu_si256((const __m256i *)(a->qs + 32 * j));
            /* sums of each 16: maddubs with ones gives pairs, madd pairs of pairs, then hadd */
            __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
            __m128i s = _mm_hadd_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            s = _mm_hadd_epi32(s, s);
            a->bsums[2 * j] = (int16_t)_mm_extract_epi32(s, 0);
            a->bsums[2 * j + 1] = (int16_t)_mm_extract_epi32(s, 1);
        }
    }
}

/* ---------------- the 32-families ---------------- */

/* One template per family: decode a weight block to 32 bytes once, then R activation rows.
 * kind 0: Q4_0 (signed q-8), 1: Q4_1 (unsigned + min), 2: Q5_0 (signed q-16), 3: Q5_1, 4: Q8_0 */
/* One block against R activation rows, into one of two sets of accumulators: consecutive blocks
 * alternate sets so that the fmadd chains of two blocks overlap (one chain would wait its latency). */
AVX2_INLINE void block32(int kind, const uint8_t *w, const uint8_t *a, size_t astride, int R, int64_t i,
                         __m256 *acc, float *accm) {
    const int unsig = kind == 1 || kind == 3;
    __m256i q;
    float d = f16(*(const uint16_t *)w), m = 0.0f;
    switch (kind) {
    case 0: q = _mm256_sub_epi8(nibbles32(w + 2), _mm256_set1_epi8(8)); break;
    case 1: q = nibbles32(w + 4); m = f16(*(const uint16_t *)(w + 2)); break;
    case 2: q = _mm256_sub_epi8(_mm256_or_si256(nibbles32(w + 6), fifth_bits(w + 2)), _mm256_set1_epi8(16)); break;
    case 3: q = _mm256_or_si256(nibbles32(w + 8), fifth_bits(w + 4)); m = f16(*(const uint16_t *)(w + 2)); break;
    default: q = _mm256_loadu_si256((const __m256i *)(w + 2)); break;
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        const act32 *y = (const act32 *)(a + r * astride) + i;
        __m256i av = _mm256_loadu_si256((const __m256i *)y->qs);
        __m256i s = unsig ? dot_unsigned(q, av) : dot_signed(q, av);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(s), acc[r]);
        if (unsig) accm[r] += (m * y->d) * (float)y->sum;
    }
}

AVX2_INLINE void rows32(int kind, int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                        float *out, int64_t ostride) {
    static const int bytes[5] = {18, 20, 22, 24, 34};
    const int bb = bytes[kind];
    __m256 acc0[RMAX], acc1[RMAX];
    float accm0[RMAX], accm1[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        acc0[r] = acc1[r] = _mm256_setzero_ps();
        accm0[r] = accm1[r] = 0.0f;
    }
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, w += 2 * bb) {
        block32(kind, w, a, astride, R, i, acc0, accm0);
        block32(kind, w + bb, a, astride, R, i + 1, acc1, accm1);
    }
    if (i < nb) block32(kind, w, a, astride, R, i, acc0, accm0);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
        out[r * ostride] = hsum_ps(_mm256_add_ps(acc0[r], acc1[r])) + (accm0[r] + accm1[r]);
}

#define FAMILY32(name, kind)                                                                          \
    AVX2 static float dot_##name(int64_t nb, const void *w, const void *a) {                          \
        float o;                                                                                      \
        rows32(kind, nb, (const uint8_t *)w, (const uint8_t *)a, 0, 1, &o, 0);                        \
        return o;                                                                                     \
    }                                                                                                 \
    AVX2 static void multi_##name(int64_t nb, const void *w, const void *a, size_t as, int64_t m,      \
                                  float *out, int64_t os) {                                           \
        const uint8_t *ap = (const uint8_t *)a;                                                       \
        int64_t r = 0;                                                                                \
        for (; r + RMAX <= m; r += RMAX)                                                              \
            rows32(kind, nb, (const uint8_t *)w, ap + r * as, as, RMAX, out + r * os, os);            \
        switch (m - r) {                                                                           \
        case 3: rows32(kind, nb, (const uint8_t *)w, ap + r * as, as, 3, out + r * os, os); break;        \
        case 2: rows32(kind, nb, (const uint8_t *)w, ap + r * as, as, 2, out + r * os, os); break;        \
        case 1: rows32(kind, nb, (const uint8_t *)w, ap + r * as, as, 1, out + r * os, os); break;        \
        } \
    }

FAMILY32(q4_0, 0)
FAMILY32(q4_1, 1)
FAMILY32(q5_0, 2)
FAMILY32(q5_1, 3)
FAMILY32(q8_0, 4)

/* ---------------- K-quants ---------------- */

/* Q4_K (five = 0) and Q5_K (five = 1), R activation rows */
AVX2_INLINE void rows_q45k(int five, int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                           float *out, int64_t ostride) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const int bb = five ? 176 : 144;
    for (int64_t i = 0; i < nb; i++, w += bb) {
        const blk_q4_k *b4 = (const blk_q4_k *)w;
        const uint8_t *qs = five ? ((const blk_q5_k *)w)->qs : b4->qs;
        uint32_t v[4];
        osg_scales_mins_k4(b4->scales, v);
        const __m128i scm = _mm_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3]);
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)((const blk_q5_k *)w)->qh) : _mm256_setzero_si256();
        __m256i sumi[RMAX];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int j2 = 0; j2 < 4; j2++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j2));
            __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            if (five) {
                __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2 + 1), one), 4));
            }
            __m256i slo = _mm256_set1_epi16((short)_mm_extract_epi8(scm, 2 * j2));
            __m256i shi = _mm256_set1_epi16((short)_mm_extract_epi8(scm, 2 * j2 + 1));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const int8_t *av = ((const act256 *)(a + r * astride) + i)->qs + 64 * j2;
                __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)av));
                __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(av + 32)));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(_mm256_madd_epi16(plo, slo), _mm256_madd_epi16(phi, shi)));
            }
        }
        float d = f16(b4->d), dmin = f16(b4->dmin);
        /* minimums against the sums of 16: each minimum twice, as 16 int16 */
        __m128i m8 = _mm_unpackhi_epi64(scm, scm);
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            __m256i summ = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), m16);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * y->d), _mm256_cvtepi32_ps(summ), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = hsum_ps(acc[r]);
}

/* Q6_K: q in 0..63 (unsigned) times a, minus 32 * (sum of a) per group of 16, times the group's scale */
AVX2_INLINE void rows_q6k(int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                          float *out, int64_t ostride) {
    const __m256i low = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    __m256 acc[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, w += 210) {
        const blk_q6_k *b = (const blk_q6_k *)w;
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        __m256i sumi[RMAX];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), sc16);
            sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        }
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low), _mm256_slli_epi16(_mm256_and_si256(qh, three), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), three), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), three), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), three), 4));
            for (int c = 0; c < 4; c++) {
                int g = 8 * h + 2 * c;
                __m256i s = _mm256_set_m128i(_mm_set1_epi16(b->scales[g + 1]), _mm_set1_epi16(b->scales[g]));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    const int8_t *av = ((const act256 *)(a + r * astride) + i)->qs + 128 * h + 32 * c;
                    __m256i p = _mm256_maddubs_epi16(q[c], _mm256_loadu_si256((const __m256i *)av));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, s));
                }
            }
        }
        float d = f16(b->d);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = hsum_ps(acc[r]);
}

AVX2_INLINE void rows_k(int t, int64_t nb, const uint8_t *w, const uint8_t *a, size_t as, int R, float *out, int64_t os) {
    if (t == OSG_Q6_K) rows_q6k(nb, w, a, as, R, out, os);
    else rows_q45k(t == OSG_Q5_K, nb, w, a, as, R, out, os);
}

#define FAMILYK(name, t)                                                                              \
    AVX2 static float dot_##name(int64_t nb, const void *w, const void *a) {                          \
        float o;                                                                                      \
        rows_k(t, nb, (const uint8_t *)w, (const uint8_t *)a, 0, 1, &o, 0);                           \
        return o;                                                                                     \
    }                                                                                                 \
    AVX2 static void multi_##name(int64_t nb, const void *w, const void *a, size_t as, int64_t m,      \
                                  float *out, int64_t os) {                                           \
        const uint8_t *ap = (const uint8_t *)a;                                                       \
        int64_t r = 0;                                                                                \
        for (; r + RMAX <= m; r += RMAX)                                                              \
            rows_k(t, nb, (const uint8_t *)w, ap + r * as, as, RMAX, out + r * os, os);               \
        switch (m - r) {                                                                           \
        case 3: rows_k(t, nb, (const uint8_t *)w, ap + r * as, as, 3, out + r * os, os); break;        \
        case 2: rows_k(t, nb, (const uint8_t *)w, ap + r * as, as, 2, out + r * os, os); break;        \
        case 1: rows_k(t, nb, (const uint8_t *)w, ap + r * as, as, 1, out + r * os, os); break;        \
        }   \
    }

FAMILYK(q4_k, OSG_Q4_K)
FAMILYK(q5_k, OSG_Q5_K)
FAMILYK(q6_k, OSG_Q6_K)

int osg_fill_avx2(osg_kernels *k) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
        return 0;
    k->quant32 = quant32_avx2;
    k->quant256 = quant256_avx2;
    k->dot[OSG_Q4_0] = dot_q4_0; k->multi[OSG_Q4_0] = multi_q4_0;
    k->dot[OSG_Q4_1] = dot_q4_1; k->multi[OSG_Q4_1] = multi_q4_1;
    k->dot[OSG_Q5_0] = dot_q5_0; k->multi[OSG_Q5_0] = multi_q5_0;
    k->dot[OSG_Q5_1] = dot_q5_1; k->multi[OSG_Q5_1] = multi_q5_1;
    k->dot[OSG_Q8_0] = dot_q8_0; k->multi[OSG_Q8_0] = multi_q8_0;
    k->dot[OSG_Q4_K] = dot_q4_k; k->multi[OSG_Q4_K] = multi_q4_k;
    k->dot[OSG_Q5_K] = dot_q5_k; k->multi[OSG_Q5_K] = multi_q5_k;
    k->dot[OSG_Q6_K] = dot_q6_k; k->multi[OSG_Q6_K] = multi_q6_k;
    return 1;
}
#else
int osg_fill_avx2(osg_kernels *k) { (void)k; return 0; }
#endif
