/* The AVX-512 gemm's panels (kernels_internal.h, osg_pk256 / osg_pk32) made from the file's blocks.
 *
 * Every step reads one 32-bit word at the same offset of sixteen weight rows' blocks with one gather
 * (rows rb bytes apart), so the 16 lanes are the 16 rows and the unpacking is the block format's
 * bit arithmetic done for all rows at once: the word of four packed weights becomes one 64-byte
 * line of the panel, [row][4 bytes]. Lanes past the rows asked for gather nothing and hold zero.
 * The K-quants' integers (Q4_K, Q5_K, Q6_K: the 16-parallel decode's weights) are read by rows instead:
 * 64 bytes of each row, unpacked, then a 16 x 16 transpose of 32-bit words gives 16 lines for 64
 * shuffles. */
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__) && !defined(OSG_NO_SIMD)
#include <immintrin.h>

#define V512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

typedef struct {
    __m512i idx; /* row r at r * rb */
    __mmask16 rows;
} rows16;

V512_INLINE __m512i word(const rows16 *g, const uint8_t *block, int off) {
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), g->rows, g->idx, block + off, 1);
}

V512_INLINE void put(void *dst, __m512i v) { _mm512_store_si512(dst, v); }
V512_INLINE __m512i set1(int v) { return _mm512_set1_epi32(v); }
V512_INLINE __m512i and_(__m512i a, int m) { return _mm512_and_si512(a, set1(m)); }
V512_INLINE __m512i srl(__m512i a, int n) { return _mm512_srli_epi32(a, (unsigned)n); }
V512_INLINE __m512i sll(__m512i a, int n) { return _mm512_slli_epi32(a, (unsigned)n); }
V512_INLINE __m512i or_(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
/* the fp16 in a word's low / high 16 bits as floats */
V512_INLINE __m512 half_lo(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
V512_INLINE __m512 half_hi(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(srl(v, 16))); }

/* r[i] holds row i's sixteen 32-bit words; after, r[w] holds word w of the sixteen rows: one panel
 * line. Four rounds of sixteen shuffles, against sixteen gathers for the same lines. */
V512_INLINE void transpose16(__m512i *r) {
    __m512i t[16];
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* now r[4i + k]'s 128-bit lane L holds rows 4i..4i+3 of word 4L + k */
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        __m512i v0 = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88), v1 = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xDD);
        __m512i v2 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88), v3 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xDD);
        t[k] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        t[8 + k] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        t[4 + k] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        t[12 + k] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* 64 bytes at off of each of the rows' blocks (zero for rows past nc) */
V512_INLINE void rows64(const uint8_t *b, size_t rb, int nc, size_t off, __m512i *r) {
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
        r[i] = _mm512_maskz_loadu_epi32(i < nc ? (__mmask16)0xFFFF : 0, b + (size_t)i * rb + off);
}

/* Q4_K's integers by rows: each row's bytes of nibbles 64 at a time (sub-blocks 4hf..4hf+3) loaded
 * whole, the low or high nibbles taken, then one transpose makes 16 panel lines.
 * At M = 16 the gathers were half the gemm's time (Q4_K, K = 2048, in cache: 154 GFLOP/s at M = 16
 * against 272 at M = 128). */
V512_INLINE void pack_q4k_quants(const uint8_t *b, size_t rb, int nc, osg_pk256 *p) {
    _Pragma("GCC unroll 2") for (int hf = 0; hf < 2; hf++) {
        _Pragma("GCC unroll 2") for (int hi = 0; hi < 2; hi++) {
            __m512i r[16];
            rows64(b, rb, nc, 16 + 64 * (size_t)hf, r);
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++)
                r[i] = and_(hi ? _mm512_srli_epi16(r[i], 4) : r[i], 0x0F0F0F0F);
            transpose16(r);
            /* word w: byte 4w of the 64, i.e. jj = 2hf + w / 8, l = 4 (w % 8); low nibbles are sub-block
             * 2jj, high 2jj + 1 */
            _Pragma("GCC unroll 16") for (int w = 0; w < 16; w++)
                put(p->q[16 * (2 * hf + (w >> 3)) + 8 * hi + (w & 7)], r[w]);
        }
    }
}

/* Q5_K's integers by rows: Q4_K's nibbles (qs at 48) with the fifth bit from the 32 bytes of qh at 16,
 * shared by the 8 sub-blocks: element 32j + l has bit j of qh[l]. The 64 bytes of half hf are sub-blocks
 * 4hf + hi (first 32 bytes) and 4hf + 2 + hi (last 32), so qh is broadcast to both 256-bit halves and
 * tested against bit 4hf + hi there, 4hf + hi + 2 in the upper half: a byte mask that adds the 16
 * (two operations a row; shift, and, shift, or measured 2% slower at M = 16). */
V512_INLINE void pack_q5k_quants(const uint8_t *b, size_t rb, int nc, osg_pk256 *p) {
    _Pragma("GCC unroll 2") for (int hf = 0; hf < 2; hf++) {
        _Pragma("GCC unroll 2") for (int hi = 0; hi < 2; hi++) {
            const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * hf + hi))),
                                                   _mm256_set1_epi8((char)(1 << (4 * hf + hi + 2))), 1);
            __m512i r[16];
            rows64(b, rb, nc, 48 + 64 * (size_t)hf, r);
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
                __m256i qh = _mm256_maskz_loadu_epi32(i < nc ? (__mmask8)0xFF : 0, b + (size_t)i * rb + 16);
                __mmask64 five = _mm512_test_epi8_mask(_mm512_broadcast_i64x4(qh), bit);
                r[i] = and_(hi ? _mm512_srli_epi16(r[i], 4) : r[i], 0x0F0F0F0F);
                r[i] = _mm512_mask_add_epi8(r[i], five, r[i], _mm512_set1_epi8(0x10));
            }
            transpose16(r);
            /* word w: as Q4_K's, sub-block 2jj + hi with jj = 2hf + w / 8 */
            _Pragma("GCC unroll 16") for (int w = 0; w < 16; w++)
                put(p->q[16 * (2 * hf + (w >> 3)) + 8 * hi + (w & 7)], r[w]);
        }
    }
}

/* Q6_K's integers by rows: per half h, the 64 bytes of ql and the 32 of qh (broadcast to both
 * 256-bit halves), the high bits shifted per half (qq = 0 / 1 low, 2 / 3 high nibbles) */
V512_INLINE void pack_q6k_quants(const uint8_t *b, size_t rb, int nc, osg_pk256 *p) {
    const __m512i c01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i c23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        _Pragma("GCC unroll 2") for (int y = 0; y < 2; y++) {
            __m512i r[16];
            rows64(b, rb, nc, 64 * (size_t)h, r);
            _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {
                __m256i qh = _mm256_maskz_loadu_epi32(i < nc ? (__mmask8)0xFF : 0, b + (size_t)i * rb + 128 + 32 * h);
                __m512i hb = _mm512_srlv_epi16(_mm512_broadcast_i64x4(qh), y ? c23 : c01);
                r[i] = or_(and_(y ? _mm512_srli_epi16(r[i], 4) : r[i], 0x0F0F0F0F), sll(and_(hb, 0x03030303), 4));
            }
            transpose16(r);
            /* word w: qq = 2y + w / 8, l = 4 (w % 8): element 128h + 32qq + l, line 32h + 16y + w */
            _Pragma("GCC unroll 16") for (int w = 0; w < 16; w++) put(p->q[32 * h + 16 * y + w], r[w]);
        }
    }
}

/* Q4_K's and Q5_K's scales and minimums (their integers: pack_q4k_quants, pack_q5k_quants) */
V512_INLINE void pack_q45k(const rows16 *g, const uint8_t *b, osg_pk256 *p) {
    __m512i h = word(g, b, 0);
    _mm512_store_ps(p->d, half_lo(h));
    _mm512_store_ps(p->dm, half_hi(h));
    /* osg_scale_min_k4 for the 16 rows: bytes 0-3 (s0) scales 0-3 and the top bits of 4-7, bytes
     * 4-7 (s1) the same for the minimums, bytes 8-11 (s2) the low 4 bits of scales and minimums 4-7 */
    __m512i s0 = word(g, b, 4), s1 = word(g, b, 8), s2 = word(g, b, 12);
    for (int j = 0; j < 4; j++) {
        __m512i sc = and_(srl(s0, 8 * j), 63), m = and_(srl(s1, 8 * j), 63);
        put(p->sc[j], sc);
        put(p->cp[j], or_(m, sll(m, 16)));
        sc = or_(and_(srl(s2, 8 * j), 15), sll(and_(srl(s0, 8 * j + 6), 3), 4));
        m = or_(and_(srl(s2, 8 * j + 4), 15), sll(and_(srl(s1, 8 * j + 6), 3), 4));
        put(p->sc[j + 4], sc);
        put(p->cp[j + 4], or_(m, sll(m, 16)));
    }
}

V512_INLINE void pack_q6k(const rows16 *g, const uint8_t *b, osg_pk256 *p) {
    _mm512_store_ps(p->d, half_hi(word(g, b, 206)));   /* d at 208: the word ending there */
    _mm512_store_ps(p->dm, _mm512_setzero_ps());
    __m512i sc[16];
    for (int w4 = 0; w4 < 4; w4++) {
        __m512i s = word(g, b, 192 + 4 * w4);
        for (int t = 0; t < 4; t++) {
            sc[4 * w4 + t] = _mm512_srai_epi32(sll(s, 24 - 8 * t), 24);   /* int8 -> int32 */
            put(p->sc[4 * w4 + t], sc[4 * w4 + t]);
        }
    }
    for (int j = 0; j < 8; j++) put(p->cp[j], or_(and_(sc[2 * j], 0xFFFF), sll(sc[2 * j + 1], 16)));
}

/* four bits of a Q5 fifth-bit word -> 0x10 in the bytes whose bit is set */
V512_INLINE __m512i spread4(__m512i x) {
    return or_(or_(sll(and_(x, 1), 4), sll(and_(x, 2), 11)), or_(sll(and_(x, 4), 18), sll(and_(x, 8), 25)));
}

/* kind: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 5 IQ4_NL */
V512_INLINE void pack32(const rows16 *g, int kind, const uint8_t *b, osg_pk32 *p) {
    static const int qoff[6] = {2, 4, 6, 8, 2, 2};
    static const float offs[6] = {8.0f, 0.0f, 16.0f, 0.0f, 128.0f, 128.0f};
    __m512i h = word(g, b, 0);
    __m512 d = half_lo(h);
    _mm512_store_ps(p->d, d);
    _mm512_store_ps(p->m, kind == 1 || kind == 3 ? half_hi(h) : _mm512_mul_ps(d, _mm512_set1_ps(-offs[kind])));
    if (kind == 4) {
        for (int gi = 0; gi < 8; gi++) put(p->q[gi], _mm512_xor_si512(word(g, b, 2 + 4 * gi), set1((int)0x80808080u)));
        return;
    }
    __m512i qh = kind == 2 || kind == 3 ? word(g, b, kind == 2 ? 2 : 4) : _mm512_setzero_si512();
    const __m512i kv = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)osg_kvalues_iq4)),
                                        set1((int)0x80808080u));
    for (int l = 0; l < 16; l += 4) {
        __m512i v = word(g, b, qoff[kind] + l);
        __m512i lo = and_(v, 0x0F0F0F0F), hi = and_(srl(v, 4), 0x0F0F0F0F);
        if (kind == 2 || kind == 3) {
            lo = or_(lo, spread4(srl(qh, l)));
            hi = or_(hi, spread4(srl(qh, l + 16)));
        } else if (kind == 5) {
            lo = _mm512_shuffle_epi8(kv, lo);
            hi = _mm512_shuffle_epi8(kv, hi);
        }
        put(p->q[l / 4], lo);
        put(p->q[(l + 16) / 4], hi);
    }
}

/* the lines of block i of rows [0, nc) from w */
V512_INLINE void prefetch_block(const uint8_t *w, size_t rb, size_t bb, int64_t i, int nc) {
    const uint8_t *b = w + (size_t)i * bb;
    uintptr_t first = (uintptr_t)b & ~(uintptr_t)63, last = (uintptr_t)(b + bb - 1) & ~(uintptr_t)63;
    for (int c = 0; c < nc; c++)
        for (uintptr_t l = first; l <= last; l += 64) _mm_prefetch((const char *)(l + (size_t)c * rb), _MM_HINT_T0);
}

V512 void osg_pack512(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, int next_nc, void *panel) {
    rows16 g;
    g.idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                               _mm512_set1_epi32((int)rb));
    g.rows = (__mmask16)((1u << nc) - 1u);
    size_t bb = rb / (size_t)nb;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = w + (size_t)i * bb;
        /* 16 rows are 16 streams rb apart, which the prefetchers do not follow in time when the
         * weight is past the cache: ask for the blocks two ahead, into the next panel's rows */
        if (i + 2 < nb) prefetch_block(w, rb, bb, i + 2, nc);
        else if (i + 2 - nb < nb) prefetch_block(w + OSG_NR * rb, rb, bb, i + 2 - nb, next_nc);
        /* and the whole next panel (its rows lie one after the other) into L2, a share per block: the
         * blocks two ahead alone left the gemm waiting on memory at M = 16 (one thread, K = 2048,
         * N = 65536: Q4_K 179 -> 236, Q6_K 135 -> 192 GFLOP/s) */
        if (next_nc) {
            const uint8_t *nx = w + OSG_NR * rb;
            size_t span = (size_t)next_nc * rb, from = span * (size_t)i / (size_t)nb & ~(size_t)63,
                   to = span * (size_t)(i + 1) / (size_t)nb;
            for (size_t l = from; l < to; l += 64) _mm_prefetch((const char *)(nx + l), _MM_HINT_T1);
        }
        switch (t) {
        case OSG_Q4_K:
            pack_q45k(&g, b, (osg_pk256 *)panel + i);
            pack_q4k_quants(b, rb, nc, (osg_pk256 *)panel + i);
            break;
        case OSG_Q5_K:
            pack_q45k(&g, b, (osg_pk256 *)panel + i);
            pack_q5k_quants(b, rb, nc, (osg_pk256 *)panel + i);
            break;
        case OSG_Q6_K:
            pack_q6k(&g, b, (osg_pk256 *)panel + i);
            pack_q6k_quants(b, rb, nc, (osg_pk256 *)panel + i);
            break;
        case OSG_Q4_0: pack32(&g, 0, b, (osg_pk32 *)panel + i); break;
        case OSG_Q4_1: pack32(&g, 1, b, (osg_pk32 *)panel + i); break;
        case OSG_Q5_0: pack32(&g, 2, b, (osg_pk32 *)panel + i); break;
        case OSG_Q5_1: pack32(&g, 3, b, (osg_pk32 *)panel + i); break;
        case OSG_Q8_0: pack32(&g, 4, b, (osg_pk32 *)panel + i); break;
        default: pack32(&g, 5, b, (osg_pk32 *)panel + i); break;
        }
    }
}
#else
void osg_pack512(int t, const uint8_t *w, size_t rb, int64_t nb, int nc, int next_nc, void *panel) {
    (void)t, (void)w, (void)rb, (void)nb, (void)nc, (void)next_nc, (void)panel;
}
#endif
