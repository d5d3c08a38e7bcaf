/* What ops.c and ops_schema.c share: the ortserve.gguf op as registered with one runtime, error
 * plumbing, and the kernel callbacks (docs/native.md). Private to the library. */
#ifndef ORTSERVE_OPS_INTERNAL_H
#define ORTSERVE_OPS_INTERNAL_H

#include "ort_abi.h"

#define OSG_DOMAIN "ortserve.gguf"
#define OSG_MAX_DIMS 8

/* One op as registered with one runtime: ORT hands the OrtCustomOp pointer back to every callback,
 * so the op carries the API table of the runtime that registered it. One process may hold two
 * onnxruntime builds (the Python package's and the one beside onnxruntime-genai), each calling
 * RegisterCustomOps with its own table, and a kernel must call back into the runtime that made it. */
typedef struct {
  OrtCustomOp op;    /* first member: ORT's pointer to it is a pointer to this */
  const OrtApi *api; /* the runtime that registered the op */
  int parallel;      /* 1 when api has KernelContext_ParallelFor and the shape-inference entries */
  int gather;        /* 0: GgufMatMul, 1: GgufGather */
} GgufOp;

/* An error status made by api, its message formatted as printf does (at most 511 bytes). */
OrtStatus *osg_fail(const OrtApi *api, OrtErrorCode code, const char *fmt, ...);

#define RETURN_IF_ERROR(expr)            \
  do {                                   \
    OrtStatus *status_ = (expr);         \
    if (status_ != NULL) return status_; \
  } while (0)

/* A tensor as a kernel sees it: its value, element type and dimensions. */
typedef struct {
  const OrtValue *value;
  ONNXTensorElementDataType type;
  size_t ndim;
  int64_t dims[OSG_MAX_DIMS];
} Tensor;

/* ops.c: describe a value; input `index` of the kernel (an error naming it when it is missing);
 * a tensor's data (inputs are only read). */
OrtStatus *osg_describe(const OrtApi *api, const OrtValue *value, const char *op, const char *name, Tensor *t);
OrtStatus *osg_input(const OrtApi *api, OrtKernelContext *ctx, size_t index, const char *op, const char *name,
                     Tensor *t);
void *osg_data_of(const OrtApi *api, const OrtValue *value, OrtStatus **status);
/* fn(user, i) for i in [0, total): on ORT's intra-op pool when parallel and total > 1, else in this thread */
OrtStatus *osg_parallel_for(const OrtApi *api, int parallel, OrtKernelContext *ctx, void (*fn)(void *, size_t),
                            size_t total, void *user);

/* ops.c: make a kernel from the op's attributes (checked there), run it, free it. */
OrtStatus *OSG_ORT_CALL osg_op_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                      void **kernel);
OrtStatus *OSG_ORT_CALL osg_op_compute(void *kernel, OrtKernelContext *ctx);
void OSG_ORT_CALL osg_op_destroy(void *kernel);

/* ops_norm.c: the SkipRmsNorm op's kernel. */
OrtStatus *osg_norm_create(const OrtApi *api, int parallel, const OrtKernelInfo *info, void **kernel);
OrtStatus *osg_norm_compute(void *kernel, OrtKernelContext *ctx);
void osg_norm_destroy(void *kernel);

#endif /* ORTSERVE_OPS_INTERNAL_H */
