/* AVX2 GEMM for many activation rows (prefill, batched decode): osg_matmul_rows takes it when
 * m_rows > OSG_GEMM_MIN_M and the level is avx2. The AVX-512 gemm's scheme (kernels_gemm512.c) with
 * AVX2's instructions: 16 weight rows' blocks are unpacked per call into this thread's panel (the
 * same layout, kernels_pack_avx2.c), and every activation row of the call passes over it.
 *
 * A panel line is 16 rows x 4 bytes; a tile takes its half (8 weight rows, one 256-bit register) by up
 * to 4 activation rows. vpmaddubsw multiplies the 8 rows' 4 unsigned weights by the activation row's
 * 4 bytes (broadcast) into int16 pairs; pairs never saturate (weights <= 63: 2 x 63 x 127 < 32767;
 * Q8_0 and IQ4_NL by the sign trick, |w| <= 128 times sign(a, w), |a| <= 127) and, while the bound
 * allows (Q4: 8 lines, Q5: 4, Q6_K: 2), consecutive lines' pairs are added as int16 before one
 * vpmaddwd by the sub-block scale (K-quants) or by ones turns them into int32. The integers are then
 * the other paths' (kernels_scalar.c is the definition); floats enter once per block. */
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__) && !defined(OSG_NO_SIMD)
#include <immintrin.h>

#define A2 __attribute__((target("avx2,fma,f16c")))
#define A2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define MR 4 /* activation rows per tile */

A2_INLINE __m256i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

A2_INLINE __m256i line(const void *q, int h) { return _mm256_load_si256((const __m256i *)((const uint8_t *)q + 32 * h)); }

A2_INLINE void store_rows(const __m256 *acc, int R, float *y, int64_t ldy, int nc) {
    if (nc >= 8) {
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ldy, acc[r]);
        return;
    }
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _mm256_maskstore_ps(y + r * ldy, mask, acc[r]);
}

/* K-quants, weight rows 8h..8h+7 of the panel: nsub sub-blocks, grp lines added as int16 before the
 * vpmaddwd by the scale; q6: Q6_K (the -32 offset: isum -= 32 x sum of scale x sums of 16), else
 * Q4_K/Q5_K (the minimums' term in float, by dmin) */
A2_INLINE void tile256(int nsub, int grp, int q6, const osg_pk256 *P, int64_t nb, int h, const uint8_t *a,
                       size_t as, int R, float *y, int64_t ldy, int nc) {
    const int per = 64 / nsub; /* lines per sub-block */
    __m256 acc[MR];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const osg_pk256 *p = P + i;
        const act256 *ya[MR];
        __m256i isum[MR];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            ya[r] = (const act256 *)(a + r * as) + i;
            isum[r] = _mm256_setzero_si256();
        }
        for (int s = 0; s < nsub; s++) {
            __m256i sc = line(p->sc[s], h);
            sc = _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(sc, 16));
            for (int g0 = 0; g0 < per; g0 += grp) {
                __m256i s16[MR];
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) s16[r] = _mm256_setzero_si256();
                _Pragma("GCC unroll 8") for (int g = g0; g < g0 + grp; g++) {
                    __m256i wv = line(p->q[s * per + g], h);
                    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                        s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(wv, bcast4(ya[r]->qs + 4 * (s * per + g))));
                }
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s16[r], sc));
            }
        }
        __m256 d = _mm256_load_ps(p->d + 8 * h);
        if (q6) {
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
                __m256i cp = line(p->cp[j], h);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                    isum[r] = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(_mm256_madd_epi16(cp, bcast4(ya[r]->bsums + 2 * j)), 5));
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(ya[r]->d)), _mm256_cvtepi32_ps(isum[r]), acc[r]);
        } else {
            __m256 dm = _mm256_load_ps(p->dm + 8 * h);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(ya[r]->d)), _mm256_cvtepi32_ps(isum[r]), acc[r]);
                isum[r] = _mm256_setzero_si256();
            }
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
                __m256i cp = line(p->cp[j], h);
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(cp, bcast4(ya[r]->bsums + 2 * j)));
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dm, _mm256_set1_ps(ya[r]->d)), _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    store_rows(acc, R, y, ldy, nc);
}

/* 32-families, weight rows 8h..8h+7: grp lines added as int16 (8: Q4, 4: Q5, 1: the signed types,
 * sgn, taken by the sign trick) before one vpmaddwd by ones */
A2_INLINE void tile32(int grp, int sgn, const osg_pk32 *P, int64_t nb, int h, const uint8_t *a, size_t as, int R,
                      float *y, int64_t ldy, int nc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MR];
    act32_row ya[MR];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
        ya[r] = osg_act32(a + r * as, nb);
    }
    for (int64_t i = 0; i < nb; i++) {
        const osg_pk32 *p = P + i;
        __m256i sub[MR];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sub[r] = _mm256_setzero_si256();
        for (int g0 = 0; g0 < 8; g0 += grp) {
            __m256i s16[MR];
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) s16[r] = _mm256_setzero_si256();
            _Pragma("GCC unroll 8") for (int g = g0; g < g0 + grp; g++) {
                __m256i wv = line(p->q[g], h);
                __m256i aw = sgn ? _mm256_abs_epi8(wv) : wv;
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    __m256i av = bcast4(ya[r].qs + 32 * i + 4 * g);
                    if (sgn) av = _mm256_sign_epi8(av, wv);
                    s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(aw, av));
                }
            }
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                sub[r] = _mm256_add_epi32(sub[r], _mm256_madd_epi16(s16[r], ones));
        }
        __m256 d = _mm256_load_ps(p->d + 8 * h);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(ya[r].d[i])), _mm256_cvtepi32_ps(sub[r]), acc[r]);
        if (!sgn) {
            __m256 m = _mm256_load_ps(p->m + 8 * h);
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(ya[r].s[i]), acc[r]);
        }
    }
    store_rows(acc, R, y, ldy, nc);
}

#define TILE_R(call)         \
    switch (R) {             \
    case 4: call(4); break;  \
    case 3: call(3); break;  \
    case 2: call(2); break;  \
    default: call(1); break; \
    }

typedef void (*tile_fn)(const void *P, int64_t nb, int h, const uint8_t *a, size_t as, int R, float *y, int64_t ldy,
                        int nc);

#define TILE_FN(name, body)                                                                                       \
    A2 static void name(const void *P, int64_t nb, int h, const uint8_t *a, size_t as, int R, float *y, int64_t ldy, \
                        int nc) {                                                                                  \
        TILE_R(body)                                                                                               \
    }
#define T_Q4K(r) tile256(8, 8, 0, (const osg_pk256 *)P, nb, h, a, as, r, y, ldy, nc)
#define T_Q5K(r) tile256(8, 4, 0, (const osg_pk256 *)P, nb, h, a, as, r, y, ldy, nc)
#define T_Q6K(r) tile256(16, 2, 1, (const osg_pk256 *)P, nb, h, a, as, r, y, ldy, nc)
#define T_Q4(r) tile32(8, 0, (const osg_pk32 *)P, nb, h, a, as, r, y, ldy, nc)
#define T_Q5(r) tile32(4, 0, (const osg_pk32 *)P, nb, h, a, as, r, y, ldy, nc)
#define T_S8(r) tile32(1, 1, (const osg_pk32 *)P, nb, h, a, as, r, y, ldy, nc)
TILE_FN(tile_q4k, T_Q4K)
TILE_FN(tile_q5k, T_Q5K)
TILE_FN(tile_q6k, T_Q6K)
TILE_FN(tile_q4, T_Q4)
TILE_FN(tile_q5, T_Q5)
TILE_FN(tile_s8, T_S8)

/* Y[m*ldy + n] for n in [n0, n1), m in [0, m_rows); returns 0 when it could not (no memory): the caller
 * then takes the row path. */
static int gemm(int t, int64_t nb, const void *w, size_t rb, const void *xq, size_t ab, int64_t m_rows, float *y,
                int64_t ldy, int64_t n0, int64_t n1) {
    /* Q6_K's panel costs more to make: at M = 9 the row path is faster (one thread, K = 2048,
     * N = 4096: 81 against 100 GFLOP/s), at 16 they are even, at 32 the gemm is (131 against 107) */
    if (t == OSG_Q6_K && m_rows <= 16) return 0;
    int k256 = t == OSG_Q4_K || t == OSG_Q5_K || t == OSG_Q6_K;
    void *panel = osg_panel((size_t)nb * (k256 ? sizeof(osg_pk256) : sizeof(osg_pk32)));
    if (panel == NULL) return 0;
    tile_fn tile;
    switch (t) {
    case OSG_Q4_K: tile = tile_q4k; break;
    case OSG_Q5_K: tile = tile_q5k; break;
    case OSG_Q6_K: tile = tile_q6k; break;
    case OSG_Q4_0: case OSG_Q4_1: tile = tile_q4; break;
    case OSG_Q5_0: case OSG_Q5_1: tile = tile_q5; break;
    default: tile = tile_s8; break; /* Q8_0, IQ4_NL */
    }
    for (int64_t c0 = n0; c0 < n1; c0 += OSG_NR) {
        int nc = n1 - c0 < OSG_NR ? (int)(n1 - c0) : OSG_NR;
        osg_pack_avx2(t, (const uint8_t *)w + (size_t)c0 * rb, rb, nb, nc, panel);
        for (int h = 0; h < 2 && 8 * h < nc; h++)
            for (int64_t m0 = 0; m0 < m_rows; m0 += MR) {
                int R = m_rows - m0 < MR ? (int)(m_rows - m0) : MR;
                tile(panel, nb, h, (const uint8_t *)xq + (size_t)m0 * ab, ab, R, y + m0 * ldy + c0 + 8 * h, ldy,
                     nc - 8 * h);
            }
    }
    return 1;
}

int osg_fill_gemm_avx2(osg_kernels *k) {
    osg_set_gemm(k, gemm);
    return 1;
}
#else
int osg_fill_gemm_avx2(osg_kernels *k) { (void)k; return 0; }
#endif
