/* AVX2 + FMA + F16C paths, compiled for those instructions by function attribute only (the library is
 * built without -march), installed when the CPU reports them.
 *
 * Every kernel keeps a block's integer sums exact in int32 lanes (maddubs pairs never saturate: weights
 * are at most 63 unsigned, or |w| <= 128 by the sign trick, activations at most 127), and floats enter
 * once per block as (weight scale * activation scale) * lanes. Each kernel is written for R activation
 * rows at once (R a constant 1..4): a weight block is unpacked once and dotted with all R rows. */
#include <math.h>
#include <string.h>

#include "kernels_internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(OSG_NO_SIMD)
#include "kernels_avx2.h"

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

AVX2 static void swiglu_avx2(const float *x, float *h, int64_t k) {
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        __m256 g = _mm256_loadu_ps(x + j);
        __m256 gu = _mm256_mul_ps(g, _mm256_loadu_ps(x + k + j));
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(h + j, _mm256_div_ps(gu, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
    for (; j < k; j++) h[j] = x[j] * x[k + j] / (1.0f + expf(-x[j]));
}

AVX2 static void rmsnorm_avx2(const float *x, const float *skip, const float *gamma, float *out, float *sum,
                              int64_t h, float eps) {
    __m256 sq = _mm256_setzero_ps();
    int64_t n8 = h / 8 * 8;
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(skip + i));
        _mm256_storeu_ps(sum + i, v);
        sq = _mm256_fmadd_ps(v, v, sq);
    }
    float total = hsum_ps(sq);
    for (int64_t i = n8; i < h; i++) {
        sum[i] = x[i] + skip[i];
        total += sum[i] * sum[i];
    }
    float inv = 1.0f / sqrtf(total / (float)h + eps);
    __m256 iv = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < n8; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(sum + i), iv), _mm256_loadu_ps(gamma + i)));
    for (int64_t i = n8; i < h; i++) out[i] = sum[i] * inv * gamma[i];
}

OSG_ROW_FAMILY(AVX2, q4_0, rows32, 0)
OSG_ROW_FAMILY(AVX2, q4_1, rows32, 1)
OSG_ROW_FAMILY(AVX2, q5_0, rows32, 2)
OSG_ROW_FAMILY(AVX2, q5_1, rows32, 3)
OSG_ROW_FAMILY(AVX2, q8_0, rows32, 4)
OSG_ROW_FAMILY(AVX2, iq4_nl, rows32, 5)

int osg_fill_avx2(osg_kernels *k) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
        return 0;
    k->quant32 = quant32_avx2;
    k->quant256 = quant256_avx2;
    k->swiglu = swiglu_avx2;
    k->rmsnorm = rmsnorm_avx2;
    k->dot[OSG_Q4_0] = dot_q4_0; k->multi[OSG_Q4_0] = multi_q4_0;
    k->dot[OSG_Q4_1] = dot_q4_1; k->multi[OSG_Q4_1] = multi_q4_1;
    k->dot[OSG_Q5_0] = dot_q5_0; k->multi[OSG_Q5_0] = multi_q5_0;
    k->dot[OSG_Q5_1] = dot_q5_1; k->multi[OSG_Q5_1] = multi_q5_1;
    k->dot[OSG_Q8_0] = dot_q8_0; k->multi[OSG_Q8_0] = multi_q8_0;
    k->dot[OSG_IQ4_NL] = dot_iq4_nl; k->multi[OSG_IQ4_NL] = multi_iq4_nl;
    osg_fill_avx2_k(k);   /* Q4_K, Q5_K, Q6_K, IQ4_XS: kernels_avx2_k.c */
    return 1;
}
#else
int osg_fill_avx2(osg_kernels *k) { (void)k; return 0; }
#endif
