/* The scalar dot products: the definition every SIMD path is tested against. Each block gives an exact
 * integer sum; floats enter as (weight scale * activation scale) * that sum, summed over blocks. */
#include <string.h>

#include "kernels_internal.h"


/* The 32-families: Q4_0 (q-8)*d, Q4_1 q*d + m, Q5_0 (q-16)*d, Q5_1 q*d + m, Q8_0 q*d.
 * Block i's integer sum times (dw * da), plus m * s for the minimum (s = da * sum of a). */
static void weights32(int t, const uint8_t *b, int *q, float *d, float *m) {
    uint32_t qh = 0;
    *d = osg_f16_to_f32(*(const uint16_t *)b);
    *m = 0.0f;
    if (t == OSG_Q8_0) {
        for (int j = 0; j < 32; j++) q[j] = ((const int8_t *)(b + 2))[j];
        return;
    }
    if (t == OSG_IQ4_NL) {
        for (int j = 0; j < 16; j++) {
            q[j] = osg_kvalues_iq4[b[2 + j] & 0x0F];
            q[j + 16] = osg_kvalues_iq4[b[2 + j] >> 4];
        }
        return;
    }
    const uint8_t *qs = b + (t == OSG_Q4_0 ? 2 : t == OSG_Q4_1 ? 4 : t == OSG_Q5_0 ? 6 : 8);
    if (t == OSG_Q5_0) memcpy(&qh, b + 2, 4);
    if (t == OSG_Q5_1) memcpy(&qh, b + 4, 4);
    if (t == OSG_Q4_1 || t == OSG_Q5_1) *m = osg_f16_to_f32(*(const uint16_t *)(b + 2));
    int off = t == OSG_Q4_0 ? 8 : t == OSG_Q5_0 ? 16 : 0;
    for (int j = 0; j < 16; j++) {
        q[j] = ((qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4)) - off;
        q[j + 16] = ((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - off;
    }
}

static float dot32(int t, int64_t nb, const void *w, const void *a) {
    static const int bytes[OSG_NTYPES] = {[OSG_Q4_0] = 18, [OSG_Q4_1] = 20, [OSG_Q5_0] = 22, [OSG_Q5_1] = 24,
                                          [OSG_Q8_0] = 34, [OSG_IQ4_NL] = 18};
    const uint8_t *p = (const uint8_t *)w;
    act32_row y = osg_act32(a, nb);
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++, p += bytes[t]) {
        int q[32];
        float d, m;
        weights32(t, p, q, &d, &m);
        int32_t qa = 0;
        for (int j = 0; j < 32; j++) qa += q[j] * y.qs[32 * i + j];
        s += (d * y.d[i]) * (float)qa + m * y.s[i];
    }
    return s;
}

static float dot_q4_0(int64_t nb, const void *w, const void *a) { return dot32(OSG_Q4_0, nb, w, a); }
static float dot_q4_1(int64_t nb, const void *w, const void *a) { return dot32(OSG_Q4_1, nb, w, a); }
static float dot_q5_0(int64_t nb, const void *w, const void *a) { return dot32(OSG_Q5_0, nb, w, a); }
static float dot_q5_1(int64_t nb, const void *w, const void *a) { return dot32(OSG_Q5_1, nb, w, a); }
static float dot_q8_0(int64_t nb, const void *w, const void *a) { return dot32(OSG_Q8_0, nb, w, a); }
static float dot_iq4_nl(int64_t nb, const void *w, const void *a) { return dot32(OSG_IQ4_NL, nb, w, a); }

/* IQ4_XS: sum_j (scale_j - 32) * (kvalues[q] . a over sub-block j) */
static float dot_iq4_xs(int64_t nb, const void *w, const void *a) {
    const blk_iq4_xs *x = (const blk_iq4_xs *)w;
    const act256 *y = (const act256 *)a;
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = x[i].qs + 16 * j;
            const int8_t *av = y[i].qs + 32 * j;
            int32_t qa = 0;
            for (int l = 0; l < 16; l++)
                qa += osg_kvalues_iq4[q[l] & 0x0F] * av[l] + osg_kvalues_iq4[q[l] >> 4] * av[l + 16];
            sumi += osg_iq4_xs_scale(&x[i], j) * qa;
        }
        s += (osg_f16_to_f32(x[i].d) * y[i].d) * (float)sumi;
    }
    return s;
}

/* Q4_K / Q5_K: sum_j sc_j * (q . a over sub-block j) and sum_j m_j * (sum of a over sub-block j) */
static float dot_q45_k(int64_t nb, const void *w, const void *a, int five) {
    const act256 *y = (const act256 *)a;
    const uint8_t *p = (const uint8_t *)w;
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++, p += five ? 176 : 144) {
        const blk_q4_k *b4 = (const blk_q4_k *)p;
        const blk_q5_k *b5 = (const blk_q5_k *)p;
        const uint8_t *scales = five ? b5->scales : b4->scales, *qs = five ? b5->qs : b4->qs;
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            osg_scale_min_k4(scales, j, &sc, &m);
            const uint8_t *q = qs + 32 * (j / 2);
            const int8_t *av = y[i].qs + 32 * j;
            int shift = 4 * (j & 1);
            int32_t qa = 0;
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> shift) & 0x0F;
                if (five) v |= ((b5->qh[l] >> j) & 1) << 4;
                qa += v * av[l];
            }
            sumi += sc * qa;
            summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        float d = osg_f16_to_f32(b4->d), dmin = osg_f16_to_f32(b4->dmin);
        s += (d * y[i].d) * (float)sumi - (dmin * y[i].d) * (float)summ;
    }
    return s;
}

static float dot_q4_k(int64_t nb, const void *w, const void *a) { return dot_q45_k(nb, w, a, 0); }
static float dot_q5_k(int64_t nb, const void *w, const void *a) { return dot_q45_k(nb, w, a, 1); }

/* Q6_K: in each half of 128, byte l of ql (l < 64) holds elements l (low nibble) and l + 64 (high),
 * byte l of qh (l < 32) holds the top two bits of elements l, l + 32, l + 64, l + 96. */
static float dot_q6_k(int64_t nb, const void *w, const void *a) {
    const blk_q6_k *x = (const blk_q6_k *)w;
    const act256 *y = (const act256 *)a;
    float s = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t qa[16] = {0};
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *av = y[i].qs + 128 * h;
            for (int l = 0; l < 32; l++) {
                int q0 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
                int q1 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                int g = 8 * h + l / 16;
                qa[g] += q0 * av[l];
                qa[g + 2] += q1 * av[l + 32];
                qa[g + 4] += q2 * av[l + 64];
                qa[g + 6] += q3 * av[l + 96];
            }
        }
        int32_t sumi = 0;
        for (int g = 0; g < 16; g++) sumi += x[i].scales[g] * qa[g];
        s += (osg_f16_to_f32(x[i].d) * y[i].d) * (float)sumi;
    }
    return s;
}

const osg_kernels osg_scalar_kernels = {
    .dot = {
        [OSG_Q4_0] = dot_q4_0, [OSG_Q4_1] = dot_q4_1, [OSG_Q5_0] = dot_q5_0, [OSG_Q5_1] = dot_q5_1,
        [OSG_Q8_0] = dot_q8_0, [OSG_Q4_K] = dot_q4_k, [OSG_Q5_K] = dot_q5_k, [OSG_Q6_K] = dot_q6_k,
        [OSG_IQ4_NL] = dot_iq4_nl, [OSG_IQ4_XS] = dot_iq4_xs,
    },
};
