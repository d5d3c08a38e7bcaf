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

#if defined(__x86_64__) && !defined(OSG_NO_SIMD)
#include <immintrin.h>

#define V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define V512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define RMAX 4

V512_INLINE float f16(uint16_t h) { return _cvtsh_ss(h); }

V512_INLINE __m256i dot_vnni(__m256i u, __m256i a) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a);
}

V512_INLINE int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

V512_INLINE float hsum_ps(__m256 v) {
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

/* ---------------- the 32-families: kind 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 5 IQ4_NL ---------------- */

/* ---- the 32-families, eight blocks at a time ----
 * Eight blocks are unpacked once (to a buffer in L1) for all R activation rows; per row, their eight
 * int32 lane vectors fold into one vector of eight block sums (hadd tree), which meets the eight weight
 * scales (one gather) times the row's eight activation scales (one load: the row keeps its scales as an
 * array) in one fmadd, and the minimum term m * s in one more. A last group of under eight blocks goes
 * one block at a time. kind 0 Q4_0 (signed q-8), 1 Q4_1, 2 Q5_0 (signed q-16), 3 Q5_1, 4 Q8_0,
 * 5 IQ4_NL (signed: the sixteen values). */

/* block j's 32 weights, in element order (signed for kinds 0, 2, 4) */
V512_INLINE __m256i weights32(int kind, const uint8_t *w) {
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
V512_INLINE void scales8(const uint8_t *w, int bb, int with_m, __m256 *d, __m256 *m) {
#define H(j, o) (short)*(const uint16_t *)(w + (j) * bb + (o))
    *d = _mm256_cvtph_ps(_mm_setr_epi16(H(0, 0), H(1, 0), H(2, 0), H(3, 0), H(4, 0), H(5, 0), H(6, 0), H(7, 0)));
    if (with_m)
        *m = _mm256_cvtph_ps(_mm_setr_epi16(H(0, 2), H(1, 2), H(2, 2), H(3, 2), H(4, 2), H(5, 2), H(6, 2), H(7, 2)));
#undef H
}

/* eight vectors of 8 int32 -> one vector of their eight sums */
V512_INLINE __m256i sums8(const __m256i *s) {
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* the same weights offset to be unsigned (q + off), for the group path: Q4_0 +8, Q5_0 +16, Q8_0 and
 * IQ4_NL +128 */
V512_INLINE __m256i weights32u(int kind, const uint8_t *w) {
    switch (kind) {
    case 0: return nibbles32(w + 2);
    case 2: return _mm256_or_si256(nibbles32(w + 6), fifth_bits(w + 2));
    case 4: return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 2)), _mm256_set1_epi8((char)0x80));
    case 5: return _mm256_xor_si256(weights32(kind, w), _mm256_set1_epi8((char)0x80));
    default: return weights32(kind, w);
    }
}

V512_INLINE void rows32(int kind, int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
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
     * vpdpbusd takes q + 128 for Q8_0 without saturating */
    static const float offs[6] = {8.0f, 0.0f, 16.0f, 0.0f, 128.0f, 128.0f};
    const int signtrick = 0;
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
                s[j] = dot_vnni(qu[j], av);
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
            tail[r] += (d * y[r].d[i]) * (float)hsum_epi32(dot_vnni(u, av)) + m * y[r].s[i];
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = hsum_ps(acc[r]) + tail[r];
}

/* ---------------- K-quants ---------------- */

/* The 12 packed bytes of Q4_K/Q5_K scales -> one register: bytes 0-7 the 8 scales, 8-15 the 8
 * minimums (osg_scale_min_k4's values, four 32-bit lanes at once: bytes 0-3 hold scales 0-3 and the
 * top bits of scales 4-7, bytes 4-7 the same for the minimums, bytes 8-11 the low 4 bits of scales
 * 4-7 and minimums 4-7). Reads 16 bytes: the block goes on. */
V512_INLINE __m128i scales_mins(const uint8_t *s) {
    __m128i v = _mm_loadu_si128((const __m128i *)s);            /* lanes a, b, c, (next bytes) */
    __m128i x = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));   /* a, c, b, c */
    __m128i y = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));   /* a, a, b, b */
    __m128i lo = _mm_and_si128(_mm_srlv_epi32(x, _mm_setr_epi32(0, 0, 0, 4)),
                               _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi32(y, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

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
        const __m128i scm = scales_mins(b4->scales);
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

/* Q4_K / Q5_K, one weight row against one activation row (decode): each 32-weight sub-block is paired
 * by vpmaddubsw (int16, exact: at most 2 * 31 * 127) and vpdpwssd multiplies the pairs by the
 * sub-block's scale (broadcast by one in-lane vpshufb) into one int32 accumulator, so no horizontal
 * sums are taken inside a block; the eight int32 lanes are converted once per block and summed once
 * per row. The integers are exact; floats enter once per block, as in the kernels above. */
V512_INLINE void row1_q45k(int five, int64_t nb, const uint8_t *w, const uint8_t *a, float *out) {
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256i pick[8];
    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) pick[j] = _mm256_set1_epi16((short)(2 * j | (2 * j + 1) << 8));
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    const int bb = five ? 176 : 144;
    const act256 *y = (const act256 *)a;
    for (int64_t i = 0; i < nb; i++, w += bb, y++) {
        const blk_q4_k *b4 = (const blk_q4_k *)w;
        const uint8_t *qs = five ? ((const blk_q5_k *)w)->qs : b4->qs;
        const __m128i scm = scales_mins(b4->scales);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm)); /* int16: the 8 scales, twice */
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)((const blk_q5_k *)w)->qh) : _mm256_setzero_si256();
        __m256i part[4];   /* four short chains of vpdpwssd, not one long one: its latency bound the loop */
        _Pragma("GCC unroll 4") for (int j2 = 0; j2 < 4; j2++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j2));
            __m256i q0 = _mm256_and_si256(v, low), q1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            if (five) {
                q0 = _mm256_or_si256(q0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2), one), 4));
                q1 = _mm256_or_si256(q1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2 + 1), one), 4));
            }
            __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j2)));
            __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(y->qs + 64 * j2 + 32)));
            part[j2] = _mm256_madd_epi16(p0, _mm256_shuffle_epi8(sc, pick[2 * j2]));
            part[j2] = _mm256_dpwssd_epi32(part[j2], p1, _mm256_shuffle_epi8(sc, pick[2 * j2 + 1]));
        }
        __m256i sumi = _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]), _mm256_add_epi32(part[2], part[3]));
        __m128i m8 = _mm_unpackhi_epi64(scm, scm);   /* the minimums, each twice: one per 16 activations */
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m256i summ = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), m16);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(b4->d) * y->d), _mm256_cvtepi32_ps(sumi), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(f16(b4->dmin) * y->d), _mm256_cvtepi32_ps(summ), accm);
    }
    *out = hsum_ps(_mm256_sub_ps(acc, accm));
}

/* Q6_K: per half of 128, elements 0-63 are the low nibbles of ql (64 bytes) with qh bits 0-1 / 2-3,
 * elements 64-127 the high nibbles with qh bits 4-5 / 6-7; q in 0..63, minus 32 * (sum of a) per 16 */
V512_INLINE void rows_q6k(int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                          float *out, int64_t ostride) {
    const __m512i low = _mm512_set1_epi8(0x0F), hi2 = _mm512_set1_epi8(0x30);
    const __m512i sh_a = halves_idx(4, 2), sh_b = halves_idx(0, 2);
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
            /* the two high bits moved straight to bits 4-5 (left 4 / 2, right 0 / 2: what crosses a
             * byte inside the 16-bit lane is masked off), merged by one ternary-logic op: (x & low) | h */
            __m512i ha = _mm512_and_si512(_mm512_sllv_epi16(qh, sh_a), hi2);
            __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, sh_b), hi2);
            __m512i qa = _mm512_ternarylogic_epi32(ql, low, ha, 0xEA);
            __m512i qb = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), low, hb, 0xEA);
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
    case OSG_IQ4_NL: rows32(5, nb, w, a, as, R, out, os); break;
    /* one activation row: the 256-bit kernel is faster (12% for Q4_K); a tile of rows: the 512-bit one */
    case OSG_Q4_K:
        if (R == 1) row1_q45k(0, nb, w, a, out);
        else rows_q45k(0, nb, w, a, as, R, out, os);
        break;
    case OSG_Q5_K:
        if (R == 1) row1_q45k(1, nb, w, a, out);
        else rows_q45k(1, nb, w, a, as, R, out, os);
        break;
    default: rows_q6k(nb, w, a, as, R, out, os); break;
    }
}

OSG_ROW_FAMILY(V512, q4_0, rows_any, OSG_Q4_0)
OSG_ROW_FAMILY(V512, q4_1, rows_any, OSG_Q4_1)
OSG_ROW_FAMILY(V512, q5_0, rows_any, OSG_Q5_0)
OSG_ROW_FAMILY(V512, q5_1, rows_any, OSG_Q5_1)
OSG_ROW_FAMILY(V512, q8_0, rows_any, OSG_Q8_0)
OSG_ROW_FAMILY(V512, q4_k, rows_any, OSG_Q4_K)
OSG_ROW_FAMILY(V512, q5_k, rows_any, OSG_Q5_K)
OSG_ROW_FAMILY(V512, q6_k, rows_any, OSG_Q6_K)
OSG_ROW_FAMILY(V512, iq4_nl, rows_any, OSG_IQ4_NL)

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
    k->dot[OSG_IQ4_NL] = dot_iq4_nl; k->multi[OSG_IQ4_NL] = multi_iq4_nl;
    /* IQ4_XS keeps the AVX2 kernel */
    return 1;
}
#else
int osg_fill_avx512(osg_kernels *k) { (void)k; return 0; }
#endif
