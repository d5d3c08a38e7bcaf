/* AVX2 + FMA + F16C paths, compiled for those instructions by function attribute only (the library is
 * built without -march), installed when the CPU reports them.
 *
 * Every kernel keeps a block's integer sums exact in int32 lanes (maddubs pairs never saturate: weights
 * are at most 63 unsigned, or |w| <= 128 by the sign trick, activations at most 127), and floats enter
 * once per block as (weight scale * activation scale) * lanes. Each kernel is written for R activation
 * rows at once (R a constant 1..4): a weight block is unpacked once and dotted with all R rows. */
#include <string.h>

#include "kernels_internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(OSG_NO_SIMD)
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

/* Eight blocks at a time: their maxima in one vector, the scales and inverses by one vdivps each
 * (the same IEEE operations as the scalar code, so the same bytes), the sums by one hadd tree. */
AVX2 static void quant32_avx2(const float *x, void *xq, int64_t k) {
    int64_t nb = k / QK, b = 0;
    float *d = (float *)xq, *sd = d + nb;
    int8_t *q = (int8_t *)xq + 8 * nb;
    for (; b + 8 <= nb; b += 8, x += 8 * QK, q += 8 * QK) {
        __m256 mx[8];
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) mx[j] = absmax8(x + QK * j, QK);
        __m256 dv = _mm256_div_ps(max8(mx), _mm256_set1_ps(127.0f));
        __m256 iv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), dv),
                                  _mm256_cmp_ps(dv, _mm256_setzero_ps(), _CMP_NEQ_UQ));
        float inv[8];
        _mm256_storeu_ps(d + b, dv);
        _mm256_storeu_ps(inv, iv);
        __m256i sums[8];
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
            sums[j] = quant32_lanes(x + QK * j, _mm256_set1_ps(inv[j]), q + QK * j);
        _mm256_storeu_ps(sd + b, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(sums8(sums))));
    }
    for (; b < nb; b++, x += QK, q += QK) {
        float inv;
        d[b] = scale_of(hmax_ps(absmax8(x, QK)), &inv);
        sd[b] = d[b] * (float)quant32_block(x, inv, q);
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
/* ---- the 32-families, eight blocks at a time ----
 * Eight blocks are unpacked once (to a buffer in L1) for all R activation rows; per row, their eight
 * int32 lane vectors fold into one vector of eight block sums (hadd tree), which meets the eight weight
 * scales (one gather) times the row's eight activation scales (one load: the row keeps its scales as an
 * array) in one fmadd, and the minimum term m * s in one more. A last group of under eight blocks goes
 * one block at a time. kind 0 Q4_0 (signed q-8), 1 Q4_1, 2 Q5_0 (signed q-16), 3 Q5_1, 4 Q8_0,
 * 5 IQ4_NL (signed: the sixteen values). */

/* block j's 32 weights, in element order (signed for kinds 0, 2, 4) */
AVX2_INLINE __m256i weights32(int kind, const uint8_t *w) {
    switch (kind) {
    case 0: return _mm256_sub_epi8(nibbles32(w + 2), _mm256_set1_epi8(8));
    case 1: return nibbles32(w + 4);
    case 2: return _mm256_sub_epi8(_mm256_or_si256(nibbles32(w + 6), fifth_bits(w + 2)), _mm256_set1_epi8(16));
    case 3: return _mm256_or_si256(nibbles32(w + 8), fifth_bits(w + 4));
    case 4: return _mm256_loadu_si256((const __m256i *)(w + 2));
    default:   /* IQ4_NL: the nibbles index the sixteen values */
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)osg_kvalues_iq4)),
                                   nibbles32(w + 2));
    }
}

/* eight blocks' fp16 scale (and, with_m, the fp16 after it: the minimum of Q4_1/Q5_1) as floats */
AVX2_INLINE void scales8(const uint8_t *w, int bb, int with_m, __m256 *d, __m256 *m) {
#define H(j, o) (short)*(const uint16_t *)(w + (j) * bb + (o))
    *d = _mm256_cvtph_ps(_mm_setr_epi16(H(0, 0), H(1, 0), H(2, 0), H(3, 0), H(4, 0), H(5, 0), H(6, 0), H(7, 0)));
    if (with_m)
        *m = _mm256_cvtph_ps(_mm_setr_epi16(H(0, 2), H(1, 2), H(2, 2), H(3, 2), H(4, 2), H(5, 2), H(6, 2), H(7, 2)));
#undef H
}


/* the same weights offset to be unsigned (q + off), for the group path: Q4_0 +8, Q5_0 +16, Q8_0 and
 * IQ4_NL +128 */
AVX2_INLINE __m256i weights32u(int kind, const uint8_t *w) {
    switch (kind) {
    case 0: return nibbles32(w + 2);
    case 2: return _mm256_or_si256(nibbles32(w + 6), fifth_bits(w + 2));
    case 4: return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 2)), _mm256_set1_epi8((char)0x80));
    case 5: return _mm256_xor_si256(weights32(kind, w), _mm256_set1_epi8((char)0x80));
    default: return weights32(kind, w);
    }
}

AVX2_INLINE void rows32(int kind, int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                        float *out, int64_t ostride) {
    static const int bytes[6] = {18, 20, 22, 24, 34, 18};
    const int bb = bytes[kind], unsig = kind == 1 || kind == 3;
    __m256 acc[RMAX];
    float tail[RMAX];
    act32_row y[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
        tail[r] = 0.0f;
        y[r] = osg_act32(a + r * astride, nb);
    }
    /* signed weights go unsigned with their offset taken out as off * dw * s (s = da * sum of a);
     * Q8_0 and IQ4_NL keep |w| against a with w's sign: q + 128 would saturate vpmaddubsw */
    static const float offs[6] = {8.0f, 0.0f, 16.0f, 0.0f, 0.0f, 0.0f};
    const int signtrick = kind >= 4;
    __m256i qu[8], qs[8];
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8, w += 8 * bb) {
        __m256 dw, mw = _mm256_setzero_ps();
        scales8(w, bb, unsig, &dw, &mw);
        if (!unsig && !signtrick) mw = _mm256_mul_ps(dw, _mm256_set1_ps(-offs[kind]));
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            if (signtrick) {
                qs[j] = weights32(kind, w + j * bb);
                qu[j] = _mm256_abs_epi8(qs[j]);
            } else {
                qu[j] = weights32u(kind, w + j * bb);
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            __m256i s[8];
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
                __m256i av = _mm256_loadu_si256((const __m256i *)(y[r].qs + 32 * (i + j)));
                if (signtrick) av = _mm256_sign_epi8(av, qs[j]);
                s[j] = dot_unsigned(qu[j], av);
            }
            __m256 ds = _mm256_mul_ps(dw, _mm256_loadu_ps(y[r].d + i));
            acc[r] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(sums8(s)), acc[r]);
            if (!signtrick) acc[r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(y[r].s + i), acc[r]);
        }
    }
    for (; i < nb; i++, w += bb) {
        __m256i q = weights32(kind, w), u = unsig ? q : _mm256_abs_epi8(q);
        float d = f16(*(const uint16_t *)w), m = unsig ? f16(*(const uint16_t *)(w + 2)) : 0.0f;
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            __m256i av = _mm256_loadu_si256((const __m256i *)(y[r].qs + 32 * i));
            if (!unsig) av = _mm256_sign_epi8(av, q);
            tail[r] += (d * y[r].d[i]) * (float)hsum_epi32(dot_unsigned(u, av)) + m * y[r].s[i];
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = hsum_ps(acc[r]) + tail[r];
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
FAMILY32(iq4_nl, 5)

/* ---------------- K-quants ---------------- */

/* The 12 packed bytes of Q4_K/Q5_K scales -> one register: bytes 0-7 the 8 scales, 8-15 the 8
 * minimums (osg_scale_min_k4's values, four 32-bit lanes at once: bytes 0-3 hold scales 0-3 and the
 * top bits of scales 4-7, bytes 4-7 the same for the minimums, bytes 8-11 the low 4 bits of scales
 * 4-7 and minimums 4-7). Reads 16 bytes: the block goes on. */
AVX2_INLINE __m128i scales_mins(const uint8_t *s) {
    __m128i v = _mm_loadu_si128((const __m128i *)s);            /* lanes a, b, c, (next bytes) */
    __m128i x = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));   /* a, c, b, c */
    __m128i y = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));   /* a, a, b, b */
    __m128i lo = _mm_and_si128(_mm_srlv_epi32(x, _mm_setr_epi32(0, 0, 0, 4)),
                               _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi32(y, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

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
        const __m128i scm = scales_mins(b4->scales);
        /* each scale twice in a 32-bit lane (lanes 0-7: scales 0-7): one vpermd broadcasts one */
        const __m256i s16 = _mm256_cvtepu8_epi16(scm);
        const __m256i sdup = _mm256_permute2x128_si256(_mm256_unpacklo_epi16(s16, s16), _mm256_unpackhi_epi16(s16, s16), 0x20);
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
            __m256i slo = _mm256_permutevar8x32_epi32(sdup, _mm256_set1_epi32(2 * j2));
            __m256i shi = _mm256_permutevar8x32_epi32(sdup, _mm256_set1_epi32(2 * j2 + 1));
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
        /* each scale twice in a 32-bit lane, groups 0-7 and 8-15: one vpermd then gives the int16
         * vector of a 32-element step (group g in the low half, g + 1 in the high half) */
        __m256i dlo = _mm256_unpacklo_epi16(sc16, sc16), dhi = _mm256_unpackhi_epi16(sc16, sc16);
        __m256i sdup[2] = {_mm256_permute2x128_si256(dlo, dhi, 0x20), _mm256_permute2x128_si256(dlo, dhi, 0x31)};
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
                __m256i s = _mm256_permutevar8x32_epi32(
                    sdup[h], _mm256_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1));
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

/* IQ4_XS: per sub-block the sixteen values by pshufb (signed), |w| against a with w's sign, pairs
 * times the sub-block's scale (-32..31) into int32 */
AVX2_INLINE void rows_iq4xs(int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                            float *out, int64_t ostride) {
    const __m256i kv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)osg_kvalues_iq4));
    __m256 acc[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, w += 136) {
        const blk_iq4_xs *b = (const blk_iq4_xs *)w;
        __m256i sumi[RMAX];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_shuffle_epi8(kv, nibbles32(b->qs + 16 * j)), qa = _mm256_abs_epi8(q);
            __m256i sc = _mm256_set1_epi16((short)osg_iq4_xs_scale(b, j));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const int8_t *av = ((const act256 *)(a + r * astride) + i)->qs + 32 * j;
                __m256i p = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)av), q));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, sc));
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
    else if (t == OSG_IQ4_XS) rows_iq4xs(nb, w, a, as, R, out, os);
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
FAMILYK(iq4_xs, OSG_IQ4_XS)

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
    k->dot[OSG_IQ4_NL] = dot_iq4_nl; k->multi[OSG_IQ4_NL] = multi_iq4_nl;
    k->dot[OSG_IQ4_XS] = dot_iq4_xs; k->multi[OSG_IQ4_XS] = multi_iq4_xs;
    return 1;
}
#else
int osg_fill_avx2(osg_kernels *k) { (void)k; return 0; }
#endif
