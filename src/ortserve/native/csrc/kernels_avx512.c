/* AVX-512 VNNI paths (vpdpbusd, vpdpwssd), installed when the CPU has AVX-512 F/BW/VL/VNNI.
 *
 * The 32-families take one block per 256-bit vpdpbusd (u8 x s8 in groups of four, straight into int32:
 * the int16 step of AVX2 goes). The K-quants take 64 weights per 512-bit step: a 32-byte slice of
 * nibbles is broadcast to both halves and shifted by 0 in one half and 4 in the other, which puts two
 * consecutive sub-blocks side by side as the activations lie; vpmaddubsw pairs them, and vpdpwssd
 * multiplies the pairs by each sub-block's scale and adds them into int32 lanes. As on AVX2, a block's
 * integers stay exact and floats enter once per block; R activation rows share each unpacked block. */
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define V512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define RMAX 4

V512_INLINE float f16(uint16_t h) { return _cvtsh_ss(h); }

V512_INLINE float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

V512_INLINE __m256i nibbles32(const uint8_t *qs) {
    /* the 16 bytes in both halves; the high half shifted right by 4 (64-bit lanes: the bits that cross
     * into a byte from its neighbour are masked off) */
    __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, 0x10 where bit j is set (a mask register makes this one instruction) */
V512_INLINE __m256i fifth_bits(const uint8_t *qh4) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    return _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(0x10));
}

/* ---------------- the 32-families: kind 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0 ---------------- */

/* One block against R activation rows, into one of two sets of accumulators: consecutive blocks
 * alternate sets so that the fmadd chains of two blocks overlap (one chain would wait its latency). */
V512_INLINE void block32(int kind, const uint8_t *w, const uint8_t *a, size_t astride, int R, int64_t i,
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
    /* signed weights: |w| against a with w's sign (|-128| = 128 is a valid u8) */
    __m256i qu = unsig ? q : _mm256_abs_epi8(q);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        const act32 *y = (const act32 *)(a + r * astride) + i;
        __m256i av = _mm256_loadu_si256((const __m256i *)y->qs);
        if (!unsig) av = _mm256_sign_epi8(av, q);
        __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qu, av);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(s), acc[r]);
        if (unsig) accm[r] += (m * y->d) * (float)y->sum;
    }
}

V512_INLINE void rows32(int kind, int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
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
        out[r * ostride] = hsum256(_mm256_add_ps(acc0[r], acc1[r])) + (accm0[r] + accm1[r]);
}

/* ---------------- K-quants ---------------- */

/* lanes 0-15 of the result take int16 lane lo of v, lanes 16-31 lane hi */
V512_INLINE __m512i halves_idx(int lo, int hi) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)lo), _mm256_set1_epi16((short)hi), 1);
}

V512_INLINE void rows_q45k(int five, int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                           float *out, int64_t ostride) {
    const __m512i low = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    const __m512i nib_shift = halves_idx(0, 4);
    __m512 acc[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const int bb = five ? 176 : 144;
    for (int64_t i = 0; i < nb; i++, w += bb) {
        const blk_q4_k *b4 = (const blk_q4_k *)w;
        const uint8_t *qs = five ? ((const blk_q5_k *)w)->qs : b4->qs;
        uint32_t v[4];
        osg_scales_mins_k4(b4->scales, v);
        const __m128i scm = _mm_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3]);
        __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(scm));
        __m512i qh = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const blk_q5_k *)w)->qh))
                          : _mm512_setzero_si512();
        __m512i sumi[RMAX];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sumi[r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int j2 = 0; j2 < 4; j2++) {
            /* sub-block 2*j2 in the low half (low nibbles), 2*j2+1 in the high half (high nibbles) */
            __m512i qq = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * j2)));
            __m512i q = _mm512_and_si512(_mm512_srlv_epi16(qq, nib_shift), low);
            if (five) {
                __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, halves_idx(2 * j2, 2 * j2 + 1)), one);
                q = _mm512_or_si512(q, _mm512_slli_epi16(hb, 4));
            }
            __m512i s = _mm512_permutexvar_epi16(halves_idx(2 * j2, 2 * j2 + 1), sc16);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const int8_t *av = ((const act256 *)(a + r * astride) + i)->qs + 64 * j2;
                __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *)av));
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], p, s);
            }
        }
        float d = f16(b4->d), dmin = f16(b4->dmin);
        __m128i m8 = _mm_unpackhi_epi64(scm, scm);
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            __m256i summ = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), m16);
            __m512 fm = _mm512_cvtepi32_ps(_mm512_inserti64x4(_mm512_setzero_si512(), summ, 0));
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * y->d), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_set1_ps(dmin * y->d), fm, acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = _mm512_reduce_add_ps(acc[r]);
}

/* Q6_K: per half of 128, elements 0-63 are the low nibbles of ql (64 bytes) with qh bits 0-1 / 2-3,
 * elements 64-127 the high nibbles with qh bits 4-5 / 6-7; q in 0..63, minus 32 * (sum of a) per 16 */
V512_INLINE void rows_q6k(int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                          float *out, int64_t ostride) {
    const __m512i low = _mm512_set1_epi8(0x0F), three = _mm512_set1_epi8(3);
    const __m512i sh_a = halves_idx(0, 2), sh_b = halves_idx(4, 6);
    __m512 acc[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, w += 210) {
        const blk_q6_k *b = (const blk_q6_k *)w;
        __m256i sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        __m512i sc16 = _mm512_castsi256_si512(sc16y);
        __m512i sumi[RMAX];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), sc16y);
            sumi[r] = _mm512_inserti64x4(_mm512_setzero_si512(),
                                         _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5)), 0);
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            __m512i ql = _mm512_loadu_si512((const void *)(b->ql + 64 * h));
            __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
            __m512i qa = _mm512_or_si512(_mm512_and_si512(ql, low),
                                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_a), three), 4));
            __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
                                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_b), three), 4));
            /* int16 lane l of a 64-element step covers elements 2l, 2l+1: group base + l/8 */
            __m512i idx = _mm512_add_epi16(_mm512_srli_epi16(_mm512_set_epi16(
                31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3), _mm512_set1_epi16((short)(8 * h)));
            __m512i sa = _mm512_permutexvar_epi16(idx, sc16);
            __m512i sb = _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16(4)), sc16);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const int8_t *av = ((const act256 *)(a + r * astride) + i)->qs + 128 * h;
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(qa, _mm512_loadu_si512((const void *)av)), sa);
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(qb, _mm512_loadu_si512((const void *)(av + 64))), sb);
            }
        }
        float d = f16(b->d);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * y->d), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = _mm512_reduce_add_ps(acc[r]);
}

V512_INLINE void rows_any(int t, int64_t nb, const uint8_t *w, const uint8_t *a, size_t as, int R, float *out,
                          int64_t os) {
    switch (t) {
    case OSG_Q4_0: rows32(0, nb, w, a, as, R, out, os); break;
    case OSG_Q4_1: rows32(1, nb, w, a, as, R, out, os); break;
    case OSG_Q5_0: rows32(2, nb, w, a, as, R, out, os); break;
    case OSG_Q5_1: rows32(3, nb, w, a, as, R, out, os); break;
    case OSG_Q8_0: rows32(4, nb, w, a, as, R, out, os); break;
    case OSG_Q4_K: rows_q45k(0, nb, w, a, as, R, out, os); break;
    case OSG_Q5_K: rows_q45k(1, nb, w, a, as, R, out, os); break;
    default: rows_q6k(nb, w, a, as, R, out, os); break;
    }
}

#define FAMILY(name, t)                                                                               \
    V512 static float dot_##name(int64_t nb, const void *w, const void *a) {                          \
        float o;                                                                                      \
        rows_any(t, nb, (const uint8_t *)w, (const uint8_t *)a, 0, 1, &o, 0);                         \
        return o;                                                                                     \
    }                                                                                                 \
    V512 static void multi_##name(int64_t nb, const void *w, const void *a, size_t as, int64_t m,      \
                                  float *out, int64_t os) {                                           \
        const uint8_t *ap = (const uint8_t *)a, *wp = (const uint8_t *)w;                             \
        int64_t r = 0;                                                                                \
        for (; r + RMAX <= m; r += RMAX) rows_any(t, nb, wp, ap + r * as, as, RMAX, out + r * os, os); \
        switch (m - r) {                                                                              \
        case 3: rows_any(t, nb, wp, ap + r * as, as, 3, out + r * os, os); break;                     \
        case 2: rows_any(t, nb, wp, ap + r * as, as, 2, out + r * os, os); break;                     \
        case 1: rows_any(t, nb, wp, ap + r * as, as, 1, out + r * os, os); break;                     \
        }                                                                                             \
    }

FAMILY(q4_0, OSG_Q4_0)
FAMILY(q4_1, OSG_Q4_1)
FAMILY(q5_0, OSG_Q5_0)
FAMILY(q5_1, OSG_Q5_1)
FAMILY(q8_0, OSG_Q8_0)
FAMILY(q4_k, OSG_Q4_K)
FAMILY(q5_k, OSG_Q5_K)
FAMILY(q6_k, OSG_Q6_K)

int osg_fill_avx512(osg_kernels *k) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")))
        return 0;
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
int osg_fill_avx512(osg_kernels *k) { (void)k; return 0; }
#endif
