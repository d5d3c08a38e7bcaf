/* The AVX2 gemm's panels (kernels_internal.h, osg_pk256 / osg_pk32, the AVX-512 gemm's layout) made
 * from the file's blocks without gathers (AVX2's are slow). A block is taken 32 elements (a segment:
 * eight 4-element groups) at a time: each of 8 weight rows' segments is unpacked into one register of
 * 32 integers (the format's bit arithmetic, on whole vectors), and an 8 x 8 transpose of 32-bit words
 * turns the 8 registers into the 8 half-lines [group][rows 8h..8h+7][4 bytes] of the panel. The
 * scales are copied per row.
 *
 * The integers are the AVX-512 panels' except for Q8_0 and IQ4_NL, kept signed here with no offset
 * term (m = 0): vpmaddubsw takes them by the sign trick (|w| x sign(a, w)), since w + 128 times an
 * activation byte would saturate its int16 pairs. */
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__) && !defined(OSG_NO_SIMD)
#include <immintrin.h>

#define A2 __attribute__((target("avx2,fma,f16c")))
#define A2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

A2_INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
A2_INLINE __m256i low4(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
A2_INLINE __m256i high4(__m256i v) { return low4(_mm256_srli_epi16(v, 4)); }
A2_INLINE float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> elements 0-15 (low nibbles), 16-31 (high) */
A2_INLINE __m256i nibbles16(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* a Q5 32-bit fifth-bit word -> 0x10 in byte j where bit j is set */
A2_INLINE __m256i fifth_bits(const uint8_t *p) {
    uint32_t qh;
    memcpy(&qh, p, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i x = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(x, bit), _mm256_set1_epi8(0x10));
}

/* segment s (elements 32s..32s+31) of one row's block b as 32 bytes */
A2_INLINE __m256i segment(int t, const uint8_t *b, int s) {
    switch (t) {
    case OSG_Q4_0: return nibbles16(b + 2);
    case OSG_Q4_1: return nibbles16(b + 4);
    case OSG_Q5_0: return _mm256_or_si256(nibbles16(b + 6), fifth_bits(b + 2));
    case OSG_Q5_1: return _mm256_or_si256(nibbles16(b + 8), fifth_bits(b + 4));
    case OSG_Q8_0: return load32(b + 2);
    case OSG_IQ4_NL: {
        const __m256i kv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)osg_kvalues_iq4));
        return _mm256_shuffle_epi8(kv, nibbles16(b + 2));
    }
    case OSG_Q4_K: {
        __m256i v = load32(((const blk_q4_k *)b)->qs + 32 * (s / 2));
        return s & 1 ? high4(v) : low4(v);
    }
    case OSG_Q5_K: {
        const blk_q5_k *k = (const blk_q5_k *)b;
        __m256i v = load32(k->qs + 32 * (s / 2));
        __m256i h = _mm256_and_si256(_mm256_srli_epi16(load32(k->qh), s), _mm256_set1_epi8(1));
        return _mm256_or_si256(s & 1 ? high4(v) : low4(v), _mm256_slli_epi16(h, 4));
    }
    default: { /* Q6_K: element 128h + 32qq + l: low 4 bits of ql[64h + 32(qq&1) + l] (high nibble for
                * qq >= 2), high 2 bits of qh[32h + l] >> 2qq */
        const blk_q6_k *k = (const blk_q6_k *)b;
        int h = s / 4, qq = s % 4;
        __m256i ql = load32(k->ql + 64 * h + 32 * (qq & 1));
        __m256i hb = _mm256_and_si256(_mm256_srli_epi16(load32(k->qh + 32 * h), 2 * qq), _mm256_set1_epi8(3));
        return _mm256_or_si256(qq >= 2 ? high4(ql) : low4(ql), _mm256_slli_epi16(hb, 4));
    }
    }
}

/* r[c] = row c's 8 words; line g (32 bytes at out + 64 g) = word g of rows 0-7 */
A2_INLINE void transpose_store(const __m256i *r, uint8_t *out) {
    __m256i t[8], u[8];
    for (int j = 0; j < 4; j++) {
        t[2 * j] = _mm256_unpacklo_epi32(r[2 * j], r[2 * j + 1]);
        t[2 * j + 1] = _mm256_unpackhi_epi32(r[2 * j], r[2 * j + 1]);
    }
    for (int j = 0; j < 2; j++) {
        u[4 * j + 0] = _mm256_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 1] = _mm256_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 2] = _mm256_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
        u[4 * j + 3] = _mm256_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
    }
    for (int g = 0; g < 4; g++) { /* u[g]: rows 0-3's words g and g + 4; u[g + 4]: rows 4-7's */
        _mm256_store_si256((__m256i *)(out + 64 * g), _mm256_permute2x128_si256(u[g], u[g + 4], 0x20));
        _mm256_store_si256((__m256i *)(out + 64 * (g + 4)), _mm256_permute2x128_si256(u[g], u[g + 4], 0x31));
    }
}

/* the scales of row c's block b */
A2_INLINE void scales(int t, const uint8_t *b, int c, void *panel) {
    if (t == OSG_Q4_K || t == OSG_Q5_K) {
        osg_pk256 *p = (osg_pk256 *)panel;
        p->d[c] = half(b);
        p->dm[c] = half(b + 2);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            osg_scale_min_k4(b + 4, j, &sc, &m);
            p->sc[j][c] = sc;
            p->cp[j][c] = (int32_t)m | ((int32_t)m << 16);
        }
    } else if (t == OSG_Q6_K) {
        osg_pk256 *p = (osg_pk256 *)panel;
        const blk_q6_k *k = (const blk_q6_k *)b;
        p->d[c] = half(b + 208);
        p->dm[c] = 0.0f;
        for (int j = 0; j < 16; j++) p->sc[j][c] = k->scales[j];
        for (int j = 0; j < 8; j++)
            p->cp[j][c] = (int32_t)((uint32_t)(uint16_t)(int16_t)k->scales[2 * j] | ((uint32_t)(int32_t)k->scales[2 * j + 1] << 16));
    } else {
        osg_pk32 *p = (osg_pk32 *)panel;
        float d = half(b);
        p->d[c] = d;
        p->m[c] = t == OSG_Q4_1 || t == OSG_Q5_1 ? half(b + 2) : t == OSG_Q4_0 ? -8.0f * d : t == OSG_Q5_0 ? -16.0f * d : 0.0f;
    }
}

A2_INLINE void pack_type(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, void *panel) {
    size_t bb = rb / (size_t)nb;
    int k256 = t == OSG_Q4_K || t == OSG_Q5_K || t == OSG_Q6_K;
    size_t pb = k256 ? sizeof(osg_pk256) : sizeof(osg_pk32);
    int nseg = k256 ? 8 : 1;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *p = (uint8_t *)panel + (size_t)i * pb;
        const uint8_t *blk = w + (size_t)i * bb;
        for (int h = 0; h < 2; h++) {
            int rows = nc - 8 * h;
            rows = rows < 0 ? 0 : rows > 8 ? 8 : rows;
            for (int s = 0; s < nseg; s++) {
                __m256i r[8];
                for (int c = 0; c < 8; c++)
                    r[c] = c < rows ? segment(t, blk + (size_t)(8 * h + c) * rb, s) : _mm256_setzero_si256();
                transpose_store(r, p + 64 * 8 * s + 32 * h);
            }
        }
        for (int c = 0; c < nc; c++) scales(t, blk + (size_t)c * rb, c, p);
    }
}

A2 void osg_pack_avx2(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, void *panel) {
    int k256 = t == OSG_Q4_K || t == OSG_Q5_K || t == OSG_Q6_K;
    /* rows past nc: zero scales too, so their lanes are finite (they are never stored) */
    if (nc < OSG_NR) memset(panel, 0, (size_t)nb * (k256 ? sizeof(osg_pk256) : sizeof(osg_pk32)));
    switch (t) { /* one copy per type: the switch in segment() folds away */
    case OSG_Q4_0: pack_type(OSG_Q4_0, w, rb, nb, nc, panel); break;
    case OSG_Q4_1: pack_type(OSG_Q4_1, w, rb, nb, nc, panel); break;
    case OSG_Q5_0: pack_type(OSG_Q5_0, w, rb, nb, nc, panel); break;
    case OSG_Q5_1: pack_type(OSG_Q5_1, w, rb, nb, nc, panel); break;
    case OSG_Q8_0: pack_type(OSG_Q8_0, w, rb, nb, nc, panel); break;
    case OSG_Q4_K: pack_type(OSG_Q4_K, w, rb, nb, nc, panel); break;
    case OSG_Q5_K: pack_type(OSG_Q5_K, w, rb, nb, nc, panel); break;
    case OSG_Q6_K: pack_type(OSG_Q6_K, w, rb, nb, nc, panel); break;
    default: pack_type(OSG_IQ4_NL, w, rb, nb, nc, panel); break;
    }
}
#else
void osg_pack_avx2(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, void *panel) {
    (void)t, (void)w, (void)rb, (void)nb, (void)nc, (void)panel;
}
#endif
