/* The AVX2 gemm's panels (kernels_internal.h, osg_pk256 / osg_pk32, the AVX-512 gemm's layout) made
 * from the file's blocks without gathers (AVX2's are slow): one weight row's block at a time is
 * unpacked into its integers in a small buffer (plain loops the compiler vectorizes), whose 32-bit
 * words then go to the row's slot of each 64-byte line, [group of 4 elements][row][4 bytes].
 *
 * The integers are the AVX-512 panels' except for Q8_0 and IQ4_NL, kept signed here with no offset
 * term (m = 0): vpmaddubsw takes them by the sign trick (|w| x sign(a, w)), since w + 128 times an
 * activation byte would saturate its int16 pairs. */
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__) && !defined(OSG_NO_SIMD)

#define A2 __attribute__((target("avx2,fma,f16c")))
#define A2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* the n / 4 words of q into column c of lines [0, n / 4) */
A2_INLINE void scatter(uint8_t (*lines)[OSG_NR][4], int c, const uint8_t *q, int n) {
    for (int g = 0; g < n / 4; g++) memcpy(lines[g][c], q + 4 * g, 4);
}

A2_INLINE void pack_q45k_row(const uint8_t *blk, int five, int c, osg_pk256 *p) {
    uint8_t q[256];
    const uint8_t *scales, *qh = NULL, *qs;
    uint16_t d, dm;
    if (five) {
        const blk_q5_k *b = (const blk_q5_k *)blk;
        d = b->d, dm = b->dmin, scales = b->scales, qh = b->qh, qs = b->qs;
    } else {
        const blk_q4_k *b = (const blk_q4_k *)blk;
        d = b->d, dm = b->dmin, scales = b->scales, qs = b->qs;
    }
    p->d[c] = osg_f16_to_f32(d);
    p->dm[c] = osg_f16_to_f32(dm);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        osg_scale_min_k4(scales, j, &sc, &m);
        p->sc[j][c] = sc;
        p->cp[j][c] = (int32_t)m | ((int32_t)m << 16);
    }
    for (int jj = 0; jj < 4; jj++) {
        for (int l = 0; l < 32; l++) {
            uint8_t v = qs[32 * jj + l];
            q[64 * jj + l] = v & 0x0F;
            q[64 * jj + 32 + l] = v >> 4;
        }
        if (five)
            for (int l = 0; l < 32; l++) {
                q[64 * jj + l] |= (uint8_t)(((qh[l] >> (2 * jj)) & 1) << 4);
                q[64 * jj + 32 + l] |= (uint8_t)(((qh[l] >> (2 * jj + 1)) & 1) << 4);
            }
    }
    scatter(p->q, c, q, 256);
}

A2_INLINE void pack_q6k_row(const blk_q6_k *b, int c, osg_pk256 *p) {
    uint8_t q[256];
    p->d[c] = osg_f16_to_f32(b->d);
    p->dm[c] = 0.0f;
    for (int j = 0; j < 16; j++) p->sc[j][c] = b->scales[j];
    for (int j = 0; j < 8; j++)
        p->cp[j][c] = (int32_t)(((uint32_t)(uint16_t)(int16_t)b->scales[2 * j]) |
                                ((uint32_t)(int32_t)b->scales[2 * j + 1] << 16));
    /* element 128h + 32qq + l: low 4 bits of ql[64h + 32(qq&1) + l] (high nibble for qq >= 2),
     * high 2 bits of qh[32h + l] >> 2qq */
    for (int h = 0; h < 2; h++)
        for (int qq = 0; qq < 4; qq++)
            for (int l = 0; l < 32; l++) {
                uint8_t ql = b->ql[64 * h + 32 * (qq & 1) + l];
                ql = qq >= 2 ? ql >> 4 : ql & 0x0F;
                q[128 * h + 32 * qq + l] = (uint8_t)(ql | (((b->qh[32 * h + l] >> (2 * qq)) & 3) << 4));
            }
    scatter(p->q, c, q, 256);
}

/* kind: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 5 IQ4_NL */
A2_INLINE void pack32_row(const uint8_t *b, int kind, int c, osg_pk32 *p) {
    static const int qoff[6] = {2, 4, 6, 8, 2, 2};
    static const float offs[6] = {8.0f, 0.0f, 16.0f, 0.0f, 0.0f, 0.0f};
    uint8_t q[32];
    uint16_t h;
    memcpy(&h, b, 2);
    float d = osg_f16_to_f32(h);
    p->d[c] = d;
    if (kind == 1 || kind == 3) {
        memcpy(&h, b + 2, 2);
        p->m[c] = osg_f16_to_f32(h);
    } else {
        p->m[c] = -offs[kind] * d;
    }
    const uint8_t *qs = b + qoff[kind];
    if (kind == 4) {
        scatter(p->q, c, qs, 32);
        return;
    }
    uint32_t qh = 0;
    if (kind == 2 || kind == 3) memcpy(&qh, b + (kind == 2 ? 2 : 4), 4);
    for (int l = 0; l < 16; l++) {
        uint8_t lo = qs[l] & 0x0F, hi = qs[l] >> 4;
        if (kind == 5) {
            lo = (uint8_t)osg_kvalues_iq4[lo];
            hi = (uint8_t)osg_kvalues_iq4[hi];
        }
        q[l] = (uint8_t)(lo | (((qh >> l) & 1) << 4));
        q[l + 16] = (uint8_t)(hi | (((qh >> (l + 16)) & 1) << 4));
    }
    scatter(p->q, c, q, 32);
}

A2 void osg_pack_avx2(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, void *panel) {
    size_t bb = rb / (size_t)nb;
    int k256 = t == OSG_Q4_K || t == OSG_Q5_K || t == OSG_Q6_K;
    /* rows past nc: zero integers and scales, so their lanes add nothing (they are never stored) */
    if (nc < OSG_NR) memset(panel, 0, (size_t)nb * (k256 ? sizeof(osg_pk256) : sizeof(osg_pk32)));
    for (int64_t i = 0; i < nb; i++) {
        for (int c = 0; c < nc; c++) {
            const uint8_t *b = w + (size_t)c * rb + (size_t)i * bb;
            switch (t) {
            case OSG_Q4_K: pack_q45k_row(b, 0, c, (osg_pk256 *)panel + i); break;
            case OSG_Q5_K: pack_q45k_row(b, 1, c, (osg_pk256 *)panel + i); break;
            case OSG_Q6_K: pack_q6k_row((const blk_q6_k *)b, c, (osg_pk256 *)panel + i); break;
            case OSG_Q4_0: pack32_row(b, 0, c, (osg_pk32 *)panel + i); break;
            case OSG_Q4_1: pack32_row(b, 1, c, (osg_pk32 *)panel + i); break;
            case OSG_Q5_0: pack32_row(b, 2, c, (osg_pk32 *)panel + i); break;
            case OSG_Q5_1: pack32_row(b, 3, c, (osg_pk32 *)panel + i); break;
            case OSG_Q8_0: pack32_row(b, 4, c, (osg_pk32 *)panel + i); break;
            default: pack32_row(b, 5, c, (osg_pk32 *)panel + i); break;
            }
        }
    }
}
#else
void osg_pack_avx2(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, void *panel) {
    (void)t, (void)w, (void)rb, (void)nb, (void)nc, (void)panel;
}
#endif
