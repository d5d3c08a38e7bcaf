/* Private to the kernels_*.c files: block structs, the activation scratch layout, the dispatch table. */
#ifndef ORTSERVE_KERNELS_INTERNAL_H
#define ORTSERVE_KERNELS_INTERNAL_H

#include <string.h>

#include "kernels.h"

#define QK 32    /* elements per block of the 32-families */
#define QKK 256  /* elements per K-quant super-block */
#define OSG_NTYPES 24  /* ggml type ids below this index the dispatch table */

/* Weight blocks exactly as ggml writes them (fp16 fields as raw bits). */
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;                  /* 18 bytes: (q-8)*d */
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;               /* 20 bytes: q*d + m */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;   /* 22 bytes: (q-16)*d */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;/* 24 bytes: q*d + m */
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;                   /* 34 bytes: q*d */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_k;              /* 144 */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_k; /* 176 */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_k;     /* 210 */
typedef struct { uint16_t d; uint8_t qs[16]; } blk_iq4_nl;                /* 18 bytes: d * kvalues[q] */
/* IQ4_XS: sub-block j's scale is (4 bits of scales_l[j/2] | 2 bits of scales_h << 4) - 32 */
typedef struct { uint16_t d, scales_h; uint8_t scales_l[4]; uint8_t qs[128]; } blk_iq4_xs;    /* 136 */

/* the sixteen non-linear 4-bit values of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl) */
extern const int8_t osg_kvalues_iq4[16];

static inline int osg_iq4_xs_scale(const blk_iq4_xs *b, int j) {
    return (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0x0F) | (((b->scales_h >> (2 * j)) & 3) << 4)) - 32;
}

/* Activation rows (private layout).
 * 32-families: the row's nb scales d, then nb values s = d * (sum of the block's int8 values, for the
 * minimum term of Q4_1/Q5_1), then the nb blocks of 32 int8 values: 40 bytes a block, laid out as
 * arrays so that eight blocks' scales load as one vector (act32_row gives the three pointers).
 * K-quants: blocks of {the values, the sums of each 16, scale}. */
typedef struct { const float *d, *s; const int8_t *qs; } act32_row;
static inline act32_row osg_act32(const void *row, int64_t nb) {
    act32_row r = {(const float *)row, (const float *)row + nb, (const int8_t *)row + 8 * nb};
    return r;
}
#define ACT32_BYTES 40
typedef struct { int8_t qs[256]; int16_t bsums[16]; float d; } act256;                /* 292 bytes */

_Static_assert(sizeof(blk_q4_0) == 18, "q4_0");
_Static_assert(sizeof(blk_q4_1) == 20, "q4_1");
_Static_assert(sizeof(blk_q5_0) == 22, "q5_0");
_Static_assert(sizeof(blk_q5_1) == 24, "q5_1");
_Static_assert(sizeof(blk_q8_0) == 34, "q8_0");
_Static_assert(sizeof(blk_q4_k) == 144, "q4_k");
_Static_assert(sizeof(blk_q5_k) == 176, "q5_k");
_Static_assert(sizeof(blk_q6_k) == 210, "q6_k");
_Static_assert(sizeof(blk_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(blk_iq4_xs) == 136, "iq4_xs");
_Static_assert(sizeof(act256) == 292, "act256");

float osg_f16_to_f32(uint16_t h);

/* One K-quant sub-block's 6-bit scale and minimum (j in 0..7), unpacked from the 12 packed bytes. */
static inline void osg_scale_min_k4(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Round half to even, as cvtps2dq and numpy.rint do, without libm (|x| < 2^22). */
static inline int osg_round(float x) {
    const float big = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer in the last place */
    float r = (x + big) - big;
    return (int)r;
}

/* dot of one weight row (nb blocks) with one activation row */
typedef float (*osg_dot_fn)(int64_t nb, const void *w, const void *a);
/* the same weight row against `m` activation rows `astride` bytes apart; out[i*ostride] = dot */
typedef void (*osg_dot_multi_fn)(int64_t nb, const void *w, const void *a, size_t astride, int64_t m,
                                 float *out, int64_t ostride);
/* quantize one row of k floats into blocks of 32 (the act32 row layout) or 256 (act256) */
typedef void (*osg_quant_fn)(const float *x, void *xq, int64_t k);
/* h[j] = silu(x[j]) * x[k + j] for j in [0, k): SwiGLU over a row that holds the gate, then the up */
typedef void (*osg_swiglu_fn)(const float *x, float *h, int64_t k);
/* sum = x + skip; out = sum * gamma / sqrt(mean(sum^2) + eps), one row of h floats (SkipRmsNorm) */
typedef void (*osg_rmsnorm_fn)(const float *x, const float *skip, const float *gamma, float *out, float *sum,
                               int64_t h, float eps);

/* many activation rows at once (osg_matmul_rows' arguments, nb blocks a row, rb / ab bytes a weight /
 * activation row); returns 0 when it could not run (the row path then does) */
typedef int (*osg_gemm_fn)(int t, int64_t nb, const void *w, size_t rb, const void *xq, size_t ab, int64_t m_rows,
                           float *y, int64_t ldy, int64_t n0, int64_t n1);
/* osg_matmul_rows hands calls with more activation rows than this to the gemm entry */
#ifndef OSG_GEMM_MIN_M
#define OSG_GEMM_MIN_M 8
#endif

typedef struct {
    osg_dot_fn dot[OSG_NTYPES];          /* by ggml type id; NULL falls back to the scalar entry */
    osg_dot_multi_fn multi[OSG_NTYPES];  /* optional; NULL: dot per activation row */
    osg_gemm_fn gemm[OSG_NTYPES];        /* optional; NULL: the row path at every M */
    osg_quant_fn quant32, quant256;
    osg_swiglu_fn swiglu;
    osg_rmsnorm_fn rmsnorm;
} osg_kernels;

/* dot_NAME and multi_NAME of one type for a SIMD level (ATTR: its target attribute), over its rows
 * function ROWS(ARG, nb, w, a, as, R, out, os) with R <= RMAX (the including level's, 4 on both:
 * kernels_avx2.h, kernels_avx512.c; the switch takes the last 3..1): multi runs RMAX rows at a time,
 * then the rest with R a constant, so each call site is specialised for its row count. */
#define OSG_ROW_FAMILY(ATTR, name, ROWS, ARG)                                                         \
    ATTR static float dot_##name(int64_t nb, const void *w, const void *a) {                          \
        float o;                                                                                      \
        ROWS(ARG, nb, (const uint8_t *)w, (const uint8_t *)a, 0, 1, &o, 0);                           \
        return o;                                                                                     \
    }                                                                                                 \
    ATTR static void multi_##name(int64_t nb, const void *w, const void *a, size_t as, int64_t m,      \
                                  float *out, int64_t os) {                                           \
        const uint8_t *ap = (const uint8_t *)a, *wp = (const uint8_t *)w;                             \
        int64_t r = 0;                                                                                \
        for (; r + RMAX <= m; r += RMAX) ROWS(ARG, nb, wp, ap + r * as, as, RMAX, out + r * os, os);   \
        switch (m - r) {                                                                              \
        case 3: ROWS(ARG, nb, wp, ap + r * as, as, 3, out + r * os, os); break;                        \
        case 2: ROWS(ARG, nb, wp, ap + r * as, as, 2, out + r * os, os); break;                        \
        case 1: ROWS(ARG, nb, wp, ap + r * as, as, 1, out + r * os, os); break;                        \
        }                                                                                             \
    }

extern const osg_kernels osg_scalar_kernels;
int osg_fill_avx2(osg_kernels *k);    /* returns 0 when built without x86 support */
int osg_fill_avx512(osg_kernels *k);
int osg_fill_gemm512(osg_kernels *k); /* kernels_gemm512.c: the AVX-512 VNNI many-row path */

/* The gemm's panels (kernels_gemm512.c, packed by kernels_pack512.c): OSG_NR weight rows' blocks,
 * their integers as unsigned bytes laid [group of 4 elements][row][4 bytes], so one 64-byte load
 * holds four consecutive weights of every row, and their scales per row. */
#define OSG_NR 16
/* one super-block of 256: q' (unsigned), sub-block scales, the correction's int16 pairs (Q4_K/Q5_K:
 * each minimum twice, against the two sums of 16 of its sub-block; Q6_K: two consecutive scales,
 * against the two sums), and the float scales d and dmin */
typedef struct {
    uint8_t q[64][OSG_NR][4];
    int32_t sc[16][OSG_NR];
    int32_t cp[8][OSG_NR];
    float d[OSG_NR], dm[OSG_NR];
} osg_pk256;
/* one block of 32: q' (unsigned), the scale, and the offset term's factor (the minimum of
 * Q4_1/Q5_1, or -offset x d for the signed types taken as unsigned: 8, 16, 128) */
typedef struct {
    uint8_t q[8][OSG_NR][4];
    float d[OSG_NR], m[OSG_NR];
} osg_pk32;
/* nc <= OSG_NR weight rows (rb bytes apart, from w) into nb panel blocks; rows past nc are zero.
 * next_nc: rows of the next panel (from w + OSG_NR * rb) to prefetch the first blocks of, or 0. */
void osg_pack512(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, int next_nc, void *panel);
/* kernels_pack_avx2.c: the same panels without gathers, for kernels_gemm_avx2.c (Q8_0 and IQ4_NL
 * kept signed, m = 0: the AVX2 tile takes them by the sign trick) */
void osg_pack_avx2(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, void *panel);
int osg_fill_gemm_avx2(osg_kernels *k); /* kernels_gemm_avx2.c: the AVX2 many-row path */
/* kernels_common.c, for both gemms: this thread's panel, grown as needed and 64-byte aligned (one per
 * pool thread: K = 8192 takes 184 KB; NULL when out of memory), and the gemm entry set for the types
 * they cover (the 32-weight types, the K-quants, IQ4_NL) */
void *osg_panel(size_t bytes);
void osg_set_gemm(osg_kernels *k, osg_gemm_fn gemm);

#endif
