/* Type table, exact dequantization, activation quantization (scalar) and the run-time dispatch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

float osg_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);             /* inf / nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);     /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;                                         /* +-0 */
    } else {                                                 /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int block_bytes(int t) {
    switch (t) {
    case OSG_Q4_0: return 18;
    case OSG_Q4_1: return 20;
    case OSG_Q5_0: return 22;
    case OSG_Q5_1: return 24;
    case OSG_Q8_0: return 34;
    case OSG_Q4_K: return 144;
    case OSG_Q5_K: return 176;
    case OSG_Q6_K: return 210;
    case OSG_IQ4_NL: return 18;
    case OSG_IQ4_XS: return 136;
    default: return 0;
    }
}

int osg_supported(int t) { return block_bytes(t) != 0; }

int osg_block_elems(int t) {
    if (!osg_supported(t)) return 0;
    return (t == OSG_Q4_K || t == OSG_Q5_K || t == OSG_Q6_K || t == OSG_IQ4_XS) ? QKK : QK;
}

size_t osg_row_bytes(int t, int64_t k) {
    int be = osg_block_elems(t);
    return be ? (size_t)(k / be) * (size_t)block_bytes(t) : 0;
}

size_t osg_act_row_bytes(int t, int64_t k) {
    int be = osg_block_elems(t);
    if (!be) return 0;
    return (size_t)(k / be) * (be == QK ? ACT32_BYTES : sizeof(act256));
}

/* ---- exact dequantization (the same float operations as gguf-py's dequantize) ---- */

static void dq_q4_0(const blk_q4_0 *b, float *y) {
    float d = osg_f16_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b->qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((b->qs[j] >> 4) - 8) * d;
    }
}

static void dq_q4_1(const blk_q4_1 *b, float *y) {
    float d = osg_f16_to_f32(b->d), m = osg_f16_to_f32(b->m);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(b->qs[j] & 0x0F) + m;
        y[j + 16] = d * (float)(b->qs[j] >> 4) + m;
    }
}

static uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void dq_q5_0(const blk_q5_0 *b, float *y) {
    float d = osg_f16_to_f32(b->d);
    uint32_t qh = load_u32(b->qh);
    for (int j = 0; j < 16; j++) {
        int lo = (b->qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
        int hi = (b->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)(lo - 16) * d;
        y[j + 16] = (float)(hi - 16) * d;
    }
}

static void dq_q5_1(const blk_q5_1 *b, float *y) {
    float d = osg_f16_to_f32(b->d), m = osg_f16_to_f32(b->m);
    uint32_t qh = load_u32(b->qh);
    for (int j = 0; j < 16; j++) {
        int lo = (b->qs[j] & 0x0F) | (int)(((qh >> j) & 1) << 4);
        int hi = (b->qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

static void dq_q8_0(const blk_q8_0 *b, float *y) {
    float d = osg_f16_to_f32(b->d);
    for (int j = 0; j < 32; j++) y[j] = d * (float)b->qs[j];
}

/* element e of a Q4_K / Q5_K super-block: sub-block e/32, nibble of byte 32*(e/64) + e%32, low for
 * even sub-blocks, high for odd; Q5_K's fifth bit is bit (e/32) of qh[e%32]. */
static void dq_q4_k(const blk_q4_k *b, float *y) {
    float d = osg_f16_to_f32(b->d), dmin = osg_f16_to_f32(b->dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        osg_scale_min_k4(b->scales, j, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *q = b->qs + 32 * (j / 2);
        int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) y[32 * j + l] = ds * (float)((q[l] >> shift) & 0x0F) - dm;
    }
}

static void dq_q5_k(const blk_q5_k *b, float *y) {
    float d = osg_f16_to_f32(b->d), dmin = osg_f16_to_f32(b->dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        osg_scale_min_k4(b->scales, j, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *q = b->qs + 32 * (j / 2);
        int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0x0F) | (((b->qh[l] >> j) & 1) << 4);
            y[32 * j + l] = ds * (float)v - dm;
        }
    }
}

/* element e of a Q6_K half h (128 each): low 4 bits from ql[64h + e%64] (low nibble if e%128 < 64),
 * high 2 bits from qh[32h + e%32] >> 2*((e%128)/32); scale e/16; value d*scale*(q-32). */
int osg_q6_k_value(const blk_q6_k *b, int e) {
    int h = e / 128, i = e % 128;
    int lo = (b->ql[64 * h + (i % 64)] >> (i < 64 ? 0 : 4)) & 0x0F;
    int hi = (b->qh[32 * h + (i % 32)] >> (2 * (i / 32))) & 3;
    return (lo | (hi << 4)) - 32;
}

static void dq_q6_k(const blk_q6_k *b, float *y) {
    float d = osg_f16_to_f32(b->d);
    for (int e = 0; e < 256; e++) y[e] = (d * (float)b->scales[e / 16]) * (float)osg_q6_k_value(b, e);
}

const int8_t osg_kvalues_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void dq_iq4_nl(const blk_iq4_nl *b, float *y) {
    float d = osg_f16_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)osg_kvalues_iq4[b->qs[j] & 0x0F];
        y[j + 16] = d * (float)osg_kvalues_iq4[b->qs[j] >> 4];
    }
}

static void dq_iq4_xs(const blk_iq4_xs *b, float *y) {
    float d = osg_f16_to_f32(b->d);
    for (int j = 0; j < 8; j++, y += 32) {
        float dl = d * (float)osg_iq4_xs_scale(b, j);
        const uint8_t *q = b->qs + 16 * j;
        for (int l = 0; l < 16; l++) {
            y[l] = dl * (float)osg_kvalues_iq4[q[l] & 0x0F];
            y[l + 16] = dl * (float)osg_kvalues_iq4[q[l] >> 4];
        }
    }
}

void osg_dequant_row(int t, const void *w, float *y, int64_t k) {
    int be = osg_block_elems(t), bb = block_bytes(t);
    if (!be) return;
    const uint8_t *p = (const uint8_t *)w;
    for (int64_t i = 0; i < k / be; i++, p += bb, y += be) {
        switch (t) {
        case OSG_Q4_0: dq_q4_0((const blk_q4_0 *)p, y); break;
        case OSG_Q4_1: dq_q4_1((const blk_q4_1 *)p, y); break;
        case OSG_Q5_0: dq_q5_0((const blk_q5_0 *)p, y); break;
        case OSG_Q5_1: dq_q5_1((const blk_q5_1 *)p, y); break;
        case OSG_Q8_0: dq_q8_0((const blk_q8_0 *)p, y); break;
        case OSG_Q4_K: dq_q4_k((const blk_q4_k *)p, y); break;
        case OSG_Q5_K: dq_q5_k((const blk_q5_k *)p, y); break;
        case OSG_Q6_K: dq_q6_k((const blk_q6_k *)p, y); break;
        case OSG_IQ4_NL: dq_iq4_nl((const blk_iq4_nl *)p, y); break;
        case OSG_IQ4_XS: dq_iq4_xs((const blk_iq4_xs *)p, y); break;
        }
    }
}

/* ---- activation quantization: per block, d = max|x| / 127, q = rint(x * (1/d)) ---- */

static float block_scale(const float *x, int n, float *inv) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = x[i] < 0 ? -x[i] : x[i];
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f;
    *inv = d != 0.0f ? 1.0f / d : 0.0f;
    return d;
}

static int8_t quant_one(float v) {
    int q = osg_round(v);
    return (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
}

static void quant32_scalar(const float *x, void *xq, int64_t k) {
    int64_t nb = k / QK;
    float *d = (float *)xq, *sd = d + nb;
    int8_t *q = (int8_t *)xq + 8 * nb;
    for (int64_t b = 0; b < nb; b++, x += QK, q += QK) {
        float inv;
        d[b] = block_scale(x, QK, &inv);
        int32_t s = 0;
        for (int i = 0; i < QK; i++) {
            q[i] = quant_one(x[i] * inv);
            s += q[i];
        }
        sd[b] = d[b] * (float)s;
    }
}

static void quant256_scalar(const float *x, void *xq, int64_t k) {
    act256 *a = (act256 *)xq;
    for (int64_t b = 0; b < k / QKK; b++, x += QKK, a++) {
        float inv;
        a->d = block_scale(x, QKK, &inv);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) {
                a->qs[i] = quant_one(x[i] * inv);
                s += a->qs[i];
            }
            a->bsums[g] = (int16_t)s;
        }
    }
}

static void swiglu_scalar(const float *x, float *h, int64_t k) {
    for (int64_t j = 0; j < k; j++) h[j] = x[j] * x[k + j] / (1.0f + expf(-x[j]));
}

static void rmsnorm_scalar(const float *x, const float *skip, const float *gamma, float *out, float *sum,
                           int64_t h, float eps) {
    float sq = 0.0f;
    for (int64_t i = 0; i < h; i++) {
        sum[i] = x[i] + skip[i];
        sq += sum[i] * sum[i];
    }
    float inv = 1.0f / sqrtf(sq / (float)h + eps);
    for (int64_t i = 0; i < h; i++) out[i] = sum[i] * inv * gamma[i];
}

/* ---- dispatch ---- */

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

static osg_kernels g_table[3];
static int g_have = -1;     /* highest level this CPU (and build) offers */
static int g_level = -1;    /* level in use */

static int isa_by_name(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "scalar")) return ISA_SCALAR;
    if (!strcmp(s, "avx2")) return ISA_AVX2;
    if (!strcmp(s, "avx512") || !strcmp(s, "avx512vnni")) return ISA_AVX512;
    return -1;
}

static void init_tables(void) {
    if (g_have >= 0) return;
    int have = ISA_SCALAR;
    for (int l = 0; l < 3; l++) g_table[l] = osg_scalar_kernels;
    g_table[0].quant32 = quant32_scalar;
    g_table[0].quant256 = quant256_scalar;
    g_table[0].swiglu = swiglu_scalar;
    g_table[0].rmsnorm = rmsnorm_scalar;
    g_table[1] = g_table[0];
    if (osg_fill_avx2(&g_table[1])) {
        have = ISA_AVX2;
        g_table[2] = g_table[1];
        if (osg_fill_avx512(&g_table[2])) {
            have = ISA_AVX512;
            osg_fill_gemm512(&g_table[2]);
        }
        osg_fill_gemm_avx2(&g_table[1]); /* after the copy: the AVX-512 level keeps its own gemm */
    }
    int level = have, want = isa_by_name(getenv("ORTSERVE_NATIVE_ISA"));
    if (want >= 0 && want < level) level = want;
    g_level = level;
    __atomic_store_n(&g_have, have, __ATOMIC_RELEASE);
}

/* The choice is made when the library is loaded (one thread, before any kernel runs: ORT calls the
 * kernels from its pool's threads); the lazy check below only covers a loader that skips constructors. */
__attribute__((constructor)) static void osg_init(void) { init_tables(); }

static const osg_kernels *kernels(void) {
    if (__atomic_load_n(&g_have, __ATOMIC_ACQUIRE) < 0) init_tables();
    return &g_table[g_level];
}

int osg_set_isa(const char *name) {
    int want = isa_by_name(name);
    kernels();
    if (want < 0 || want > g_have) return -1;
    g_level = want;
    return 0;
}

const char *osg_isa(void) {
    kernels();
    return g_level == ISA_AVX512 ? "avx512vnni" : g_level == ISA_AVX2 ? "avx2" : "scalar";
}

void osg_swiglu(const float *x, float *h, int64_t k) { kernels()->swiglu(x, h, k); }

void osg_rmsnorm(const float *x, const float *skip, const float *gamma, float *out, float *sum, int64_t h, float eps) {
    kernels()->rmsnorm(x, skip, gamma, out, sum, h, eps);
}

void osg_quantize_act(int t, const float *x, void *xq, int64_t k) {
    int be = osg_block_elems(t);
    if (!be) return;
    const osg_kernels *kt = kernels();
    (be == QK ? kt->quant32 : kt->quant256)(x, xq, k);
}

/* More than OSG_GEMM_MIN_M activation rows go to the level's gemm when it has one (AVX-512 VNNI:
 * kernels_gemm512.c; AVX2: kernels_gemm_avx2.c). Otherwise the weight is taken in chunks that stay in L2 (256 KB); each tile of 4 activation rows (in L1)
 * passes over the chunk, and each weight block is unpacked once per tile. Every weight byte is read
 * from memory once per call, whatever m is. */
void osg_matmul_rows(int t, int64_t k, const void *w, const void *xq, int64_t m_rows, float *y,
                     int64_t ldy, int64_t n0, int64_t n1) {
    int be = osg_block_elems(t);
    if (!be || t < 0 || t >= OSG_NTYPES) return;
    const osg_kernels *kt = kernels();
    osg_dot_fn dot = kt->dot[t] ? kt->dot[t] : osg_scalar_kernels.dot[t];
    osg_dot_multi_fn multi = kt->multi[t];
    size_t rb = osg_row_bytes(t, k), ab = osg_act_row_bytes(t, k);
    int64_t nb = k / be, chunk = rb ? (int64_t)((256 << 10) / rb) : 1;
    if (m_rows > OSG_GEMM_MIN_M && kt->gemm[t] && kt->gemm[t](t, nb, w, rb, xq, ab, m_rows, y, ldy, n0, n1)) return;
    if (chunk < 1) chunk = 1;
    const uint8_t *wp = (const uint8_t *)w;
    const uint8_t *ap = (const uint8_t *)xq;
    for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
        int64_t c1 = c0 + chunk < n1 ? c0 + chunk : n1;
        for (int64_t m0 = 0; m0 < m_rows; m0 += 4) {
            int64_t mr = m_rows - m0 < 4 ? m_rows - m0 : 4;
            const uint8_t *a0 = ap + (size_t)m0 * ab;
            float *y0 = y + m0 * ldy;
            for (int64_t n = c0; n < c1; n++) {
                const uint8_t *row = wp + (size_t)n * rb;
                if (multi && mr > 1) {
                    multi(nb, row, a0, ab, mr, y0 + n, ldy);
                } else {
                    for (int64_t m = 0; m < mr; m++) y0[m * ldy + n] = dot(nb, row, a0 + (size_t)m * ab);
                }
            }
        }
    }
}

static __thread void *g_panel;
static __thread size_t g_panel_bytes;

void *osg_panel(size_t bytes) {
    if (bytes > g_panel_bytes) {
        free(g_panel);
        g_panel = aligned_alloc(64, (bytes + 63) / 64 * 64);
        g_panel_bytes = g_panel ? bytes : 0;
    }
    return g_panel;
}

void osg_set_gemm(osg_kernels *k, osg_gemm_fn gemm) {
    static const int types[] = {OSG_Q4_0, OSG_Q4_1, OSG_Q5_0, OSG_Q5_1, OSG_Q8_0, OSG_Q4_K, OSG_Q5_K, OSG_Q6_K, OSG_IQ4_NL};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) k->gemm[types[i]] = gemm;
}
