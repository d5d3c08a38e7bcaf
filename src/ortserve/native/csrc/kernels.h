/* ortserve native kernels: dot products that read GGUF quantized blocks exactly as the file holds them.
 *
 * Weights stay in ggml's block layouts (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL: blocks of 32; Q4_K, Q5_K,
 * Q6_K, IQ4_XS: super-blocks of 256). Activations are quantized once per row into int8 blocks (a private scratch
 * layout whose size osg_act_row_bytes gives) and every weight block is dotted against them in integers;
 * floats enter only as one scale product per block. The scalar code is the definition; the AVX2 and
 * AVX-512 VNNI paths compute the same integers and differ from it only in the order floats are summed.
 * The numpy twin of the arithmetic is src/ortserve/native/reference.py.
 */
#ifndef ORTSERVE_KERNELS_H
#define ORTSERVE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OSG_API __attribute__((visibility("default")))

/* ggml type ids */
enum {
    OSG_Q4_0 = 2, OSG_Q4_1 = 3, OSG_Q5_0 = 6, OSG_Q5_1 = 7, OSG_Q8_0 = 8,
    OSG_Q4_K = 12, OSG_Q5_K = 13, OSG_Q6_K = 14, OSG_IQ4_NL = 20, OSG_IQ4_XS = 23,
};

OSG_API int    osg_supported(int ggml_type);                 /* 1 if the type is handled */
OSG_API int    osg_block_elems(int ggml_type);               /* 32 or 256 (0 if unsupported) */
OSG_API size_t osg_row_bytes(int ggml_type, int64_t k);      /* bytes of one weight row of k elements, as in the GGUF file */
OSG_API size_t osg_act_row_bytes(int ggml_type, int64_t k);  /* bytes of one quantized activation row */
OSG_API void   osg_quantize_act(int ggml_type, const float *x, void *xq, int64_t k);   /* one activation row */
/* SwiGLU of one row of 2k floats, the gate then the up: h[j] = x[j] / (1 + exp(-x[j])) * x[k + j].
 * The SIMD paths compute exp with a polynomial within a few ulp of expf (the numpy twin allows it). */
OSG_API void   osg_swiglu(const float *x, float *h, int64_t k);
/* SkipRmsNorm of one row of h floats: sum = x + skip, out = sum * gamma / sqrt(mean(sum^2) + eps);
 * the squares summed in float32 lanes of 8 (SIMD) or in order (scalar). */
OSG_API void   osg_rmsnorm(const float *x, const float *skip, const float *gamma, float *out, float *sum,
                           int64_t h, float eps);
OSG_API void   osg_dequant_row(int ggml_type, const void *w_row, float *y, int64_t k); /* exact dequantization */
/* Y[m*ldy + n] = dot(W row n, X row m) for n in [n0, n1), m in [0, m_rows): xq holds m_rows rows
 * quantized by osg_quantize_act, each osg_act_row_bytes(type,k) apart; w is the whole weight
 * (row n at n*osg_row_bytes). k must be a multiple of osg_block_elems(type). */
OSG_API void   osg_matmul_rows(int ggml_type, int64_t k, const void *w, const void *xq, int64_t m_rows,
                               float *y, int64_t ldy, int64_t n0, int64_t n1);
OSG_API const char *osg_isa(void);   /* "avx512vnni", "avx2", "scalar": what is used now */

/* Forces an instruction set no higher than the CPU has: "scalar", "avx2" or "avx512" (alias
 * "avx512vnni"). Returns 0 when applied, -1 when the name is unknown or the CPU lacks it (nothing
 * changes then). The first call of any kernel otherwise picks the best the CPU has, lowered by the
 * environment variable ORTSERVE_NATIVE_ISA (same names), read once. For tests and benchmarks. */
OSG_API int    osg_set_isa(const char *name);

#ifdef __cplusplus
}
#endif

#endif
