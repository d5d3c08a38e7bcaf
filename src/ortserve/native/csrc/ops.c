/* ONNX Runtime custom ops over the GGUF block kernels of kernels.h (docs/native.md): the kernels'
 * state and compute. ops_schema.c describes the ops to ONNX Runtime and registers them.
 *
 * Domain "ortserve.gguf", version 1:
 *   GgufMatMul(X float [..., K], W uint8 [N, row_bytes]) -> Y float [..., N] = X @ dequant(W)^T
 *     attributes ggml_type, K, N. X is quantized once per call (per block, as llama.cpp does),
 *     then every weight row is dotted against it; the N rows are split in chunks over ORT's
 *     intra-op thread pool. With the attribute swiglu=1, X is [..., 2K], a gate then an up
 *     projection (a fused gate_up's output), and the op multiplies SwiGLU(X) = silu(gate) * up,
 *     computed as each row is quantized: one node in place of Split, Sigmoid, Mul and Mul.
 *   GgufGather(W uint8 [V, row_bytes], ids int64 [...]) -> float [..., K]
 *     attributes ggml_type, K, V. Rows dequantized exactly; an id outside [0, V) is an error.
 *
 * The library needs no link against onnxruntime: RegisterCustomOps receives the API table.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops_internal.h"

OrtStatus *osg_fail(const OrtApi *api, OrtErrorCode code, const char *fmt, ...) {
  char msg[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(msg, sizeof msg, fmt, args);
  va_end(args);
  return api->CreateStatus(code, msg);
}

/* ---- the kernel state: the op's attributes, checked once when the session builds it ---- */

typedef struct {
  const OrtApi *api; /* the runtime that made this kernel */
  int parallel;      /* 1 when api has KernelContext_ParallelFor */
  int gather;       /* 0: GgufMatMul, 1: GgufGather */
  int type;         /* ggml type id */
  int swiglu;       /* GgufMatMul: 1 when X holds [gate | up] and the op multiplies silu(gate) * up */
  int64_t k;        /* elements per row */
  int64_t rows;     /* N (matmul) or V (gather) */
  size_t row_bytes; /* bytes of one weight row in the file */
  size_t act_bytes; /* bytes of one quantized activation row */
} GgufKernel;

static OrtStatus *read_attr(const OrtApi *api, const OrtKernelInfo *info, const char *op, const char *name,
                            int64_t *out) {
  OrtStatus *status = api->KernelInfoGetAttribute_int64(info, name, out);
  if (status == NULL) return NULL;
  api->ReleaseStatus(status);
  return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: missing int attribute '%s'", op, name);
}

/* An optional int attribute: `fallback` when the node does not have it. */
static OrtStatus *read_optional_attr(const OrtApi *api, const OrtKernelInfo *info, const char *name,
                                     int64_t fallback, int64_t *out) {
  OrtStatus *status = api->KernelInfoGetAttribute_int64(info, name, out);
  if (status != NULL) {
    api->ReleaseStatus(status);
    *out = fallback;
  }
  return NULL;
}

static OrtStatus *create_kernel(const GgufOp *g, const OrtKernelInfo *info, void **out) {
  const OrtApi *api = g->api;
  int gather = g->gather;
  const char *op = gather ? "GgufGather" : "GgufMatMul";
  int64_t type, k, rows, swiglu = 0;
  *out = NULL;
  RETURN_IF_ERROR(read_attr(api, info, op, "ggml_type", &type));
  RETURN_IF_ERROR(read_attr(api, info, op, "K", &k));
  RETURN_IF_ERROR(read_attr(api, info, op, gather ? "V" : "N", &rows));
  if (!gather) RETURN_IF_ERROR(read_optional_attr(api, info, "swiglu", 0, &swiglu));
  if (swiglu != 0 && swiglu != 1)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: swiglu=%lld must be 0 or 1", op, (long long)swiglu);
  if (type < 0 || type > 1000 || !osg_supported((int)type))
    return osg_fail(api, OSG_ORT_NOT_IMPLEMENTED, "%s: ggml type %lld is not supported", op,
                    (long long)type);
  int64_t block = osg_block_elems((int)type);
  if (k <= 0 || block <= 0 || k % block != 0)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT,
                    "%s: K=%lld is not a positive multiple of %lld (ggml type %lld)", op, (long long)k,
                    (long long)block, (long long)type);
  if (rows <= 0)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: %s=%lld must be positive", op, gather ? "V" : "N",
                    (long long)rows);
  GgufKernel *kernel = (GgufKernel *)calloc(1, sizeof *kernel);
  if (kernel == NULL) return osg_fail(api, OSG_ORT_FAIL, "%s: out of memory", op);
  kernel->api = api;
  kernel->parallel = g->parallel;
  kernel->gather = gather;
  kernel->type = (int)type;
  kernel->swiglu = (int)swiglu;
  kernel->k = k;
  kernel->rows = rows;
  kernel->row_bytes = osg_row_bytes((int)type, k);
  kernel->act_bytes = osg_act_row_bytes((int)type, k);
  *out = kernel;
  return NULL;
}

/* ---- tensor helpers ---- */

OrtStatus *osg_describe(const OrtApi *api, const OrtValue *value, const char *op, const char *name,
                           Tensor *t) {
  OrtTensorTypeAndShapeInfo *info = NULL;
  t->value = value;
  RETURN_IF_ERROR(api->GetTensorTypeAndShape(value, &info));
  OrtStatus *status = api->GetTensorElementType(info, &t->type);
  if (status == NULL) status = api->GetDimensionsCount(info, &t->ndim);
  if (status == NULL && t->ndim > OSG_MAX_DIMS)
    status = osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: %s has %zu dimensions (at most %d)", op, name,
                      t->ndim, OSG_MAX_DIMS);
  if (status == NULL) status = api->GetDimensions(info, t->dims, t->ndim);
  api->ReleaseTensorTypeAndShapeInfo(info);
  return status;
}

OrtStatus *osg_input(const OrtApi *api, OrtKernelContext *ctx, size_t index, const char *op, const char *name,
                     Tensor *t) {
  const OrtValue *value = NULL;
  RETURN_IF_ERROR(api->KernelContext_GetInput(ctx, index, &value));
  if (value == NULL) return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: input %s is missing", op, name);
  return osg_describe(api, value, op, name, t);
}

void *osg_data_of(const OrtApi *api, const OrtValue *value, OrtStatus **status) {
  void *data = NULL;
  /* GetTensorMutableData is the one accessor every API version has; inputs are only read. */
  *status = api->GetTensorMutableData((OrtValue *)value, &data);
  return data;
}

/* The weight both ops take: uint8 [rows, row_bytes], rows and row_bytes as the attributes say
 * (N for GgufMatMul, V for GgufGather). */
static OrtStatus *weight_input(const GgufKernel *kn, OrtKernelContext *ctx, size_t index, const char *op,
                               Tensor *w) {
  RETURN_IF_ERROR(osg_input(kn->api, ctx, index, op, "W", w));
  if (w->type != OSG_TENSOR_UINT8) return osg_fail(kn->api, OSG_ORT_INVALID_ARGUMENT, "%s: W must be uint8", op);
  if (w->ndim != 2 || w->dims[0] != kn->rows || w->dims[1] != (int64_t)kn->row_bytes)
    return osg_fail(kn->api, OSG_ORT_INVALID_ARGUMENT, "%s: W must be [%s=%lld, %zu] (ggml type %d, K=%lld)", op,
                    kn->gather ? "V" : "N", (long long)kn->rows, kn->row_bytes, kn->type, (long long)kn->k);
  return NULL;
}

/* The output of an input whose last `drop` dimensions (0 or 1) give way to one of size `last`:
 * GgufMatMul's [..., K] -> [..., N], GgufGather's ids [...] -> [..., K]. */
static OrtStatus *output_like(const GgufKernel *kn, OrtKernelContext *ctx, const Tensor *src, size_t drop,
                              int64_t last, const char *op, OrtValue **out) {
  int64_t dims[OSG_MAX_DIMS];
  size_t nd = src->ndim - drop;
  if (nd >= OSG_MAX_DIMS)
    return osg_fail(kn->api, OSG_ORT_INVALID_ARGUMENT, "%s: the input has too many dimensions", op);
  memcpy(dims, src->dims, nd * sizeof dims[0]);
  dims[nd] = last;
  return kn->api->KernelContext_GetOutput(ctx, 0, dims, nd + 1, out);
}

static int64_t leading_rows(const Tensor *t, size_t keep) {
  int64_t rows = 1;
  for (size_t i = 0; i + keep < t->ndim; i++) rows *= t->dims[i];
  return rows;
}

/* Runs fn(user, i) for i in [0, total) on ORT's intra-op pool, or in this thread when the API
 * has no ParallelFor (onnxruntime 1.16: parallel is 0) or there is one task. */
OrtStatus *osg_parallel_for(const OrtApi *api, int parallel, OrtKernelContext *ctx, void (*fn)(void *, size_t),
                            size_t total, void *user) {
  if (parallel && total > 1) return api->KernelContext_ParallelFor(ctx, fn, total, 0, user);
  for (size_t i = 0; i < total; i++) fn(user, i);
  return NULL;
}

static OrtStatus *parallel_for(const GgufKernel *kn, OrtKernelContext *ctx, void (*fn)(void *, size_t),
                               size_t total, void *user) {
  return osg_parallel_for(kn->api, kn->parallel, ctx, fn, total, user);
}

/* ---- GgufMatMul ---- */

typedef struct {
  const GgufKernel *kernel;
  const float *x;
  const uint8_t *w;
  uint8_t *xq;
  float *y;
  int64_t m;
  int64_t chunk;    /* weight rows per task */
  int64_t n_chunks; /* tasks per block of activation rows */
  int failed;       /* set by a task that could not get memory */
} MatMulWork;

/* Activation rows per task: a block of quantized rows that stays in a core's cache (64 rows of a
 * K=8192 activation are 0.55 MB) while the task's weight rows stream past it. */
#define OSG_M_BLOCK 64

/* One SwiGLU row of each pool thread, grown to the widest K it has seen (a few dozen KB). */
static __thread float *g_swiglu_row;
static __thread int64_t g_swiglu_k;

static void quantize_task(void *user, size_t row) {
  const MatMulWork *work = (const MatMulWork *)user;
  const GgufKernel *kn = work->kernel;
  if (!kn->swiglu) {
    osg_quantize_act(kn->type, work->x + (int64_t)row * kn->k, work->xq + row * kn->act_bytes, kn->k);
    return;
  }
  if (g_swiglu_k < kn->k) {
    free(g_swiglu_row);
    g_swiglu_row = (float *)malloc((size_t)kn->k * sizeof(float));
    g_swiglu_k = g_swiglu_row != NULL ? kn->k : 0;
  }
  if (g_swiglu_row == NULL) { /* out of memory: matmul_compute reports it */
    __atomic_store_n(&((MatMulWork *)user)->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  osg_swiglu(work->x + (int64_t)row * 2 * kn->k, g_swiglu_row, kn->k);
  osg_quantize_act(kn->type, g_swiglu_row, work->xq + row * kn->act_bytes, kn->k);
}

static void matmul_task(void *user, size_t task) {
  const MatMulWork *work = (const MatMulWork *)user;
  const GgufKernel *kn = work->kernel;
  int64_t m0 = (int64_t)task / work->n_chunks * OSG_M_BLOCK;
  int64_t m1 = m0 + OSG_M_BLOCK < work->m ? m0 + OSG_M_BLOCK : work->m;
  int64_t n0 = (int64_t)task % work->n_chunks * work->chunk;
  int64_t n1 = n0 + work->chunk < kn->rows ? n0 + work->chunk : kn->rows;
  osg_matmul_rows(kn->type, kn->k, work->w, work->xq + (size_t)m0 * kn->act_bytes, m1 - m0,
                  work->y + m0 * kn->rows, kn->rows, n0, n1);
}

/* Weight rows per task: 64, or fewer (down to 16) until there are 32 tasks to balance a few
 * threads over (ORT's pool hands them out one by one), each long enough to hide its dispatch. A
 * multiple of 16 keeps every task's rows aligned for kernels that work on groups of rows. */
static int64_t chunk_rows(int64_t n, int64_t m_blocks) {
  int64_t chunk = 64;
  while (chunk > 16 && m_blocks * ((n + chunk - 1) / chunk) < 32) chunk /= 2;
  return chunk;
}

static OrtStatus *matmul_compute(const GgufKernel *kn, OrtKernelContext *ctx) {
  const OrtApi *api = kn->api;
  const char *op = "GgufMatMul";
  Tensor x, w;
  OrtStatus *status = NULL;
  RETURN_IF_ERROR(osg_input(api, ctx, 0, op, "X", &x));
  RETURN_IF_ERROR(weight_input(kn, ctx, 1, op, &w));
  if (x.type != OSG_TENSOR_FLOAT) return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: X must be float", op);
  int64_t width = kn->swiglu ? 2 * kn->k : kn->k;
  if (x.ndim < 1 || x.dims[x.ndim - 1] != width)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: X's last dimension must be %s=%lld", op,
                    kn->swiglu ? "2K (swiglu: gate and up)" : "K", (long long)width);
  OrtValue *out = NULL;
  RETURN_IF_ERROR(output_like(kn, ctx, &x, 1, kn->rows, op, &out));
  MatMulWork work = {kn, NULL, NULL, NULL, NULL, leading_rows(&x, 1), 0, 0, 0};
  if (work.m == 0) return NULL;
  int64_t m_blocks = (work.m + OSG_M_BLOCK - 1) / OSG_M_BLOCK;
  work.chunk = chunk_rows(kn->rows, m_blocks);
  work.n_chunks = (kn->rows + work.chunk - 1) / work.chunk;
  work.x = (const float *)osg_data_of(api, x.value, &status);
  if (status == NULL) work.w = (const uint8_t *)osg_data_of(api, w.value, &status);
  if (status == NULL) work.y = (float *)osg_data_of(api, out, &status);
  if (status != NULL) return status;
  work.xq = (uint8_t *)malloc((size_t)work.m * kn->act_bytes + 64);
  if (work.xq == NULL)
    return osg_fail(api, OSG_ORT_FAIL, "%s: out of memory for %lld quantized rows", op, (long long)work.m);
  if (work.m >= 4) {
    status = parallel_for(kn, ctx, quantize_task, (size_t)work.m, &work);
  } else {
    for (int64_t row = 0; row < work.m; row++) quantize_task(&work, (size_t)row);
  }
  if (status == NULL && __atomic_load_n(&work.failed, __ATOMIC_RELAXED))
    status = osg_fail(api, OSG_ORT_FAIL, "%s: out of memory for a SwiGLU row of %lld", op, (long long)kn->k);
  if (status == NULL)
    status = parallel_for(kn, ctx, matmul_task, (size_t)(m_blocks * work.n_chunks), &work);
  free(work.xq);
  return status;
}

/* ---- GgufGather ---- */

typedef struct {
  const GgufKernel *kernel;
  const uint8_t *w;
  const int64_t *ids;
  float *y;
} GatherWork;

static void gather_task(void *user, size_t i) {
  const GatherWork *work = (const GatherWork *)user;
  const GgufKernel *kn = work->kernel;
  osg_dequant_row(kn->type, work->w + (size_t)work->ids[i] * kn->row_bytes, work->y + (int64_t)i * kn->k,
                  kn->k);
}

static OrtStatus *gather_compute(const GgufKernel *kn, OrtKernelContext *ctx) {
  const OrtApi *api = kn->api;
  const char *op = "GgufGather";
  Tensor w, ids;
  OrtStatus *status = NULL;
  RETURN_IF_ERROR(weight_input(kn, ctx, 0, op, &w));
  RETURN_IF_ERROR(osg_input(api, ctx, 1, op, "ids", &ids));
  if (ids.type != OSG_TENSOR_INT64) return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: ids must be int64", op);
  GatherWork work = {kn, NULL, NULL, NULL};
  int64_t count = leading_rows(&ids, 0);
  work.ids = (const int64_t *)osg_data_of(api, ids.value, &status);
  if (status != NULL) return status;
  for (int64_t i = 0; i < count; i++)
    if (work.ids[i] < 0 || work.ids[i] >= kn->rows)
      return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: id %lld at position %lld is outside [0, %lld)", op,
                  (long long)work.ids[i], (long long)i, (long long)kn->rows);
  OrtValue *out = NULL;
  RETURN_IF_ERROR(output_like(kn, ctx, &ids, 0, kn->k, op, &out));
  if (count == 0) return NULL;
  work.w = (const uint8_t *)osg_data_of(api, w.value, &status);
  if (status == NULL) work.y = (float *)osg_data_of(api, out, &status);
  if (status != NULL) return status;
  /* A decode step gathers one row per sequence: a few microseconds, less than waking the pool. */
  if (count * kn->k < (1 << 16)) {
    for (int64_t i = 0; i < count; i++) gather_task(&work, (size_t)i);
    return NULL;
  }
  return parallel_for(kn, ctx, gather_task, (size_t)count, &work);
}

/* ---- the callbacks that make and run a kernel (ops_schema.c puts them in the OrtCustomOp) ---- */

OrtStatus *OSG_ORT_CALL osg_op_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                      void **kernel) {
  (void)api; /* the registering runtime's own table (op->api) has every entry the ops use */
  return create_kernel((const GgufOp *)op, info, kernel);
}

OrtStatus *OSG_ORT_CALL osg_op_compute(void *kernel, OrtKernelContext *ctx) {
  const GgufKernel *kn = (const GgufKernel *)kernel;
  return kn->gather ? gather_compute(kn, ctx) : matmul_compute(kn, ctx);
}

void OSG_ORT_CALL osg_op_destroy(void *kernel) { free(kernel); }
