/* AVX2 + FMA + F16C kernels for the K-quants (Q4_K, Q5_K, Q6_K) and IQ4_XS, against 256-weight
 * activation blocks; the helpers and conventions are kernels_avx2.c's (kernels_avx2.h). */
#include "kernels_internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && !defined(OSG_NO_SIMD)
#include "kernels_avx2.h"

/* ---------------- K-quants ---------------- */

/* The 12 packed bytes of Q4_K/Q5_K scales -> one register: bytes 0-7 the 8 scales, 8-15 the 8
 * minimums (osg_scale_min_k4's values, four 32-bit lanes at once: bytes 0-3 hold scales 0-3 and the
 * top bits of scales 4-7, bytes 4-7 the same for the minimums, bytes 8-11 the low 4 bits of scales
 * 4-7 and minimums 4-7). Reads 16 bytes: the block goes on. */
AVX2_INLINE __m128i scales_mins(const uint8_t *s) {
    __m128i v = _mm_loadu_si128((const __m128i *)s);            /* lanes a, b, c, (next bytes) */
    __m128i x = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0));   /* a, c, b, c */
    __m128i y = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));   /* a, a, b, b */
    __m128i lo = _mm_and_si128(_mm_srlv_epi32(x, _mm_setr_epi32(0, 0, 0, 4)),
                               _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    __m128i hi = _mm_and_si128(_mm_srli_epi32(y, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* Q4_K (five = 0) and Q5_K (five = 1), R activation rows */
AVX2_INLINE void rows_q45k(int five, int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                           float *out, int64_t ostride) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const int bb = five ? 176 : 144;
    for (int64_t i = 0; i < nb; i++, w += bb) {
        const blk_q4_k *b4 = (const blk_q4_k *)w;
        const uint8_t *qs = five ? ((const blk_q5_k *)w)->qs : b4->qs;
        const __m128i scm = scales_mins(b4->scales);
        /* each scale twice in a 32-bit lane (lanes 0-7: scales 0-7): one vpermd broadcasts one */
        const __m256i s16 = _mm256_cvtepu8_epi16(scm);
        const __m256i sdup = _mm256_permute2x128_si256(_mm256_unpacklo_epi16(s16, s16), _mm256_unpackhi_epi16(s16, s16), 0x20);
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)((const blk_q5_k *)w)->qh) : _mm256_setzero_si256();
        __m256i sumi[RMAX];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int j2 = 0; j2 < 4; j2++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j2));
            __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
            if (five) {
                __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2 + 1), one), 4));
            }
            __m256i slo = _mm256_permutevar8x32_epi32(sdup, _mm256_set1_epi32(2 * j2));
            __m256i shi = _mm256_permutevar8x32_epi32(sdup, _mm256_set1_epi32(2 * j2 + 1));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const int8_t *av = ((const act256 *)(a + r * astride) + i)->qs + 64 * j2;
                __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)av));
                __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(av + 32)));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(_mm256_madd_epi16(plo, slo), _mm256_madd_epi16(phi, shi)));
            }
        }
        float d = f16(b4->d), dmin = f16(b4->dmin);
        /* minimums against the sums of 16: each minimum twice, as 16 int16 */
        __m128i m8 = _mm_unpackhi_epi64(scm, scm);
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            __m256i summ = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), m16);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * y->d), _mm256_cvtepi32_ps(summ), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = hsum_ps(acc[r]);
}

/* Q6_K: q in 0..63 (unsigned) times a, minus 32 * (sum of a) per group of 16, times the group's scale */
AVX2_INLINE void rows_q6k(int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                          float *out, int64_t ostride) {
    const __m256i low = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
    __m256 acc[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, w += 210) {
        const blk_q6_k *b = (const blk_q6_k *)w;
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        /* each scale twice in a 32-bit lane, groups 0-7 and 8-15: one vpermd then gives the int16
         * vector of a 32-element step (group g in the low half, g + 1 in the high half) */
        __m256i dlo = _mm256_unpacklo_epi16(sc16, sc16), dhi = _mm256_unpackhi_epi16(sc16, sc16);
        __m256i sdup[2] = {_mm256_permute2x128_si256(dlo, dhi, 0x20), _mm256_permute2x128_si256(dlo, dhi, 0x31)};
        __m256i sumi[RMAX];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), sc16);
            sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        }
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low), _mm256_slli_epi16(_mm256_and_si256(qh, three), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), three), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), three), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), three), 4));
            for (int c = 0; c < 4; c++) {
                __m256i s = _mm256_permutevar8x32_epi32(
                    sdup[h], _mm256_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1));
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                    const int8_t *av = ((const act256 *)(a + r * astride) + i)->qs + 128 * h + 32 * c;
                    __m256i p = _mm256_maddubs_epi16(q[c], _mm256_loadu_si256((const __m256i *)av));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, s));
                }
            }
        }
        float d = f16(b->d);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = hsum_ps(acc[r]);
}

/* IQ4_XS: per sub-block the sixteen values by pshufb (signed), |w| against a with w's sign, pairs
 * times the sub-block's scale (-32..31) into int32 */
AVX2_INLINE void rows_iq4xs(int64_t nb, const uint8_t *w, const uint8_t *a, size_t astride, int R,
                            float *out, int64_t ostride) {
    const __m256i kv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)osg_kvalues_iq4));
    __m256 acc[RMAX];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, w += 136) {
        const blk_iq4_xs *b = (const blk_iq4_xs *)w;
        __m256i sumi[RMAX];
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_shuffle_epi8(kv, nibbles32(b->qs + 16 * j)), qa = _mm256_abs_epi8(q);
            __m256i sc = _mm256_set1_epi16((short)osg_iq4_xs_scale(b, j));
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
                const int8_t *av = ((const act256 *)(a + r * astride) + i)->qs + 32 * j;
                __m256i p = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)av), q));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, sc));
            }
        }
        float d = f16(b->d);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const act256 *y = (const act256 *)(a + r * astride) + i;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * y->d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) out[r * ostride] = hsum_ps(acc[r]);
}

AVX2_INLINE void rows_k(int t, int64_t nb, const uint8_t *w, const uint8_t *a, size_t as, int R, float *out, int64_t os) {
    if (t == OSG_Q6_K) rows_q6k(nb, w, a, as, R, out, os);
    else if (t == OSG_IQ4_XS) rows_iq4xs(nb, w, a, as, R, out, os);
    else rows_q45k(t == OSG_Q5_K, nb, w, a, as, R, out, os);
}

OSG_ROW_FAMILY(AVX2, q4_k, rows_k, OSG_Q4_K)
OSG_ROW_FAMILY(AVX2, q5_k, rows_k, OSG_Q5_K)
OSG_ROW_FAMILY(AVX2, q6_k, rows_k, OSG_Q6_K)
OSG_ROW_FAMILY(AVX2, iq4_xs, rows_k, OSG_IQ4_XS)

void osg_fill_avx2_k(osg_kernels *k) {
    k->dot[OSG_Q4_K] = dot_q4_k; k->multi[OSG_Q4_K] = multi_q4_k;
    k->dot[OSG_Q5_K] = dot_q5_k; k->multi[OSG_Q5_K] = multi_q5_k;
    k->dot[OSG_Q6_K] = dot_q6_k; k->multi[OSG_Q6_K] = multi_q6_k;
    k->dot[OSG_IQ4_XS] = dot_iq4_xs; k->multi[OSG_IQ4_XS] = multi_iq4_xs;
}
#endif
