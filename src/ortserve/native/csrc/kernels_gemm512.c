/* AVX-512 VNNI GEMM for many activation rows (prefill, batched decode): osg_matmul_rows takes it when
 * m_rows > OSG_GEMM_MIN_M.
 *
 * The weight's file blocks are read as they lie and unpacked, 16 weight rows at a time, into a
 * panel in this thread's scratch: each block's integers as unsigned bytes laid [group of 4 elements]
 * [16 rows][4 bytes], so one 64-byte load holds four consecutive weights of sixteen rows, next to
 * the block's scales per row. The panel is made once per 16 weight rows and every activation row of
 * the call passes over it: a tile of up to 8 activation rows by the 16 weight rows keeps its 8 x 16
 * sums in registers, and each vpdpbusd multiplies one 64-byte load of weights by four activation
 * bytes broadcast from memory. The panel is scratch, reused by the thread's next panel: no copy of
 * the weight is kept, the file's blocks stay the only one (decode, M = 1, reads them as before).
 *
 * The integers are the ones the other paths compute (kernels_scalar.c is the definition): per block,
 * sum over sub-blocks of scale x (sum of q' a) in int32, the offset or minimum terms as there, and
 * floats once per block. Only the order floats are summed in differs. */
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__) && !defined(OSG_NO_SIMD)
#include <immintrin.h>

#define V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define V512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define MR 8 /* activation rows per tile */

/* ---- the tiles: R activation rows by the panel's 16 weight rows ---- */

V512_INLINE __m512i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

V512_INLINE void store_rows(const __m512 *acc, int R, float *y, int64_t ldy, int nc) {
    __mmask16 mask = (__mmask16)((1u << nc) - 1u);
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}

/* K-quants: nsub sub-blocks of 256 / nsub; shift 0: Q4_K/Q5_K (the minimums' term in float, by dmin),
 * shift 5: Q6_K (the -32 offset: isum -= 32 x sum of scale x sums of 16) */
V512_INLINE void tile256(int nsub, int shift, const osg_pk256 *P, int64_t nb, const uint8_t *a, size_t as, int R,
                         float *y, int64_t ldy, int nc) {
    const int per = 64 / nsub; /* groups of four elements per sub-block */
    __m512 acc[MR];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const osg_pk256 *p = P + i;
        const act256 *ya[MR];
        __m512i isum[MR], corr[MR];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            ya[r] = (const act256 *)(a + r * as) + i;
            isum[r] = _mm512_setzero_si512();
            corr[r] = _mm512_setzero_si512();
        }
        for (int s = 0; s < nsub; s++) {
            __m512i sub[MR];
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sub[r] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8") for (int g = 0; g < per; g++) {
                __m512i wv = _mm512_load_si512((const void *)p->q[s * per + g]);
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
                    sub[r] = _mm512_dpbusd_epi32(sub[r], wv, bcast4(ya[r]->qs + 4 * (s * per + g)));
            }
            __m512i sc = _mm512_load_si512((const void *)p->sc[s]);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
                isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(sub[r], sc));
        }
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
            __m512i cp = _mm512_load_si512((const void *)p->cp[j]);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
                corr[r] = _mm512_dpwssd_epi32(corr[r], cp, bcast4(ya[r]->bsums + 2 * j));
        }
        __m512 d = _mm512_load_ps(p->d), dm = _mm512_load_ps(p->dm);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            __m512 da = _mm512_set1_ps(ya[r]->d);
            if (shift) {
                __m512i v = _mm512_sub_epi32(isum[r], _mm512_slli_epi32(corr[r], shift));
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(v), acc[r]);
            } else {
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(isum[r]), acc[r]);
                acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(dm, da), _mm512_cvtepi32_ps(corr[r]), acc[r]);
            }
        }
    }
    store_rows(acc, R, y, ldy, nc);
}

V512_INLINE void tile32(const osg_pk32 *P, int64_t nb, const uint8_t *a, size_t as, int R, float *y, int64_t ldy,
                        int nc) {
    __m512 acc[MR];
    act32_row ya[MR];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
        acc[r] = _mm512_setzero_ps();
        ya[r] = osg_act32(a + r * as, nb);
    }
    for (int64_t i = 0; i < nb; i++) {
        const osg_pk32 *p = P + i;
        __m512i sub[MR];
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) sub[r] = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {
            __m512i wv = _mm512_load_si512((const void *)p->q[g]);
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
                sub[r] = _mm512_dpbusd_epi32(sub[r], wv, bcast4(ya[r].qs + 32 * i + 4 * g));
        }
        __m512 d = _mm512_load_ps(p->d), m = _mm512_load_ps(p->m);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(ya[r].d[i])), _mm512_cvtepi32_ps(sub[r]), acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(ya[r].s[i]), acc[r]);
        }
    }
    store_rows(acc, R, y, ldy, nc);
}

#define TILE_R(call)         \
    switch (R) {             \
    case 8: call(8); break;  \
    case 7: call(7); break;  \
    case 6: call(6); break;  \
    case 5: call(5); break;  \
    case 4: call(4); break;  \
    case 3: call(3); break;  \
    case 2: call(2); break;  \
    default: call(1); break; \
    }

V512 static void tile_q4k(const void *P, int64_t nb, const uint8_t *a, size_t as, int R, float *y, int64_t ldy, int nc) {
#define T(r) tile256(8, 0, (const osg_pk256 *)P, nb, a, as, r, y, ldy, nc)
    TILE_R(T)
#undef T
}

V512 static void tile_q6k(const void *P, int64_t nb, const uint8_t *a, size_t as, int R, float *y, int64_t ldy, int nc) {
#define T(r) tile256(16, 5, (const osg_pk256 *)P, nb, a, as, r, y, ldy, nc)
    TILE_R(T)
#undef T
}

V512 static void tile_32(const void *P, int64_t nb, const uint8_t *a, size_t as, int R, float *y, int64_t ldy, int nc) {
#define T(r) tile32((const osg_pk32 *)P, nb, a, as, r, y, ldy, nc)
    TILE_R(T)
#undef T
}

/* Y[m*ldy + n] for n in [n0, n1), m in [0, m_rows); returns 0 when it could not (no memory): the caller
 * then takes the row path. */
static int gemm(int t, int64_t nb, const void *w, size_t rb, const void *xq, size_t ab, int64_t m_rows, float *y,
                int64_t ldy, int64_t n0, int64_t n1) {
    int k256 = t == OSG_Q4_K || t == OSG_Q5_K || t == OSG_Q6_K;
    void *panel = osg_panel((size_t)nb * (k256 ? sizeof(osg_pk256) : sizeof(osg_pk32)));
    if (panel == NULL) return 0;
    void (*tile)(const void *, int64_t, const uint8_t *, size_t, int, float *, int64_t, int) =
        t == OSG_Q6_K ? tile_q6k : k256 ? tile_q4k : tile_32;
    for (int64_t c0 = n0; c0 < n1; c0 += OSG_NR) {
        int nc = n1 - c0 < OSG_NR ? (int)(n1 - c0) : OSG_NR;
        int64_t left = n1 - c0 - nc;
        int next = left < OSG_NR ? (int)left : OSG_NR;
        osg_pack512(t, (const uint8_t *)w + (size_t)c0 * rb, rb, nb, nc, next, panel);
        for (int64_t m0 = 0; m0 < m_rows; m0 += MR) {
            int R = m_rows - m0 < MR ? (int)(m_rows - m0) : MR;
            tile(panel, nb, (const uint8_t *)xq + (size_t)m0 * ab, ab, R, y + m0 * ldy + c0, ldy, nc);
        }
    }
    return 1;
}

int osg_fill_gemm512(osg_kernels *k) {
    osg_set_gemm(k, gemm);
    return 1;
}
#else
int osg_fill_gemm512(osg_kernels *k) { (void)k; return 0; }
#endif
