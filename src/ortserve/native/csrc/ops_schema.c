/* How ONNX Runtime sees the ortserve.gguf ops: their names, input and output types, output shapes,
 * and RegisterCustomOps, the library's entry point (docs/native.md). The kernels are in ops.c. */
#include <stddef.h>

#include "ops_internal.h"

/* ---- the OrtCustomOp callbacks ---- */

static const char *OSG_ORT_CALL matmul_name(const OrtCustomOp *op) { (void)op; return "GgufMatMul"; }
static const char *OSG_ORT_CALL gather_name(const OrtCustomOp *op) { (void)op; return "GgufGather"; }
static const char *OSG_ORT_CALL cpu_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }

static ONNXTensorElementDataType OSG_ORT_CALL matmul_input_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  return index == 0 ? OSG_TENSOR_FLOAT : OSG_TENSOR_UINT8;
}

static ONNXTensorElementDataType OSG_ORT_CALL gather_input_type(const OrtCustomOp *op, size_t index) {
  (void)op;
  return index == 0 ? OSG_TENSOR_UINT8 : OSG_TENSOR_INT64;
}

static ONNXTensorElementDataType OSG_ORT_CALL float_output(const OrtCustomOp *op, size_t index) {
  (void)op, (void)index;
  return OSG_TENSOR_FLOAT;
}

static size_t OSG_ORT_CALL two(const OrtCustomOp *op) { (void)op; return 2; }
static size_t OSG_ORT_CALL one(const OrtCustomOp *op) { (void)op; return 1; }

static OrtCustomOpInputOutputCharacteristic OSG_ORT_CALL required(const OrtCustomOp *op, size_t index) {
  (void)op, (void)index;
  return OSG_IO_REQUIRED;
}

static OrtMemType OSG_ORT_CALL default_memory(const OrtCustomOp *op, size_t index) {
  (void)op, (void)index;
  return OSG_MEM_DEFAULT;
}

static int OSG_ORT_CALL arity_one(const OrtCustomOp *op) { (void)op; return 1; }
static int OSG_ORT_CALL homogeneous(const OrtCustomOp *op) { (void)op; return 1; }

/* ---- shape inference (API 17): Y is X's shape with the last dimension N; GgufGather's output is
 * ids' shape and K. A dimension ORT knows neither by value nor by name leaves the output unknown. */

static int read_int_attr(const OrtApi *api, const OrtShapeInferContext *ctx, const char *name, int64_t *out) {
  const OrtOpAttr *attr = NULL;
  size_t len = 0;
  OrtStatus *status = api->ShapeInferContext_GetAttribute(ctx, name, &attr);
  if (status == NULL) status = api->ReadOpAttr(attr, OSG_ATTR_INT, out, sizeof *out, &len);
  if (status == NULL) return 1;
  api->ReleaseStatus(status);
  return 0;
}

static OrtStatus *OSG_ORT_CALL infer_shape(const OrtCustomOp *op, OrtShapeInferContext *ctx) {
  const GgufOp *g = (const GgufOp *)op;
  const OrtApi *api = g->api;
  OrtTensorTypeAndShapeInfo *in = NULL; /* owned by ctx */
  size_t ndim = 0;
  int64_t dims[OSG_MAX_DIMS + 1], last = 0;
  const char *names[OSG_MAX_DIMS + 1];
  RETURN_IF_ERROR(api->ShapeInferContext_GetInputTypeShape(ctx, g->gather ? 1 : 0, &in));
  RETURN_IF_ERROR(api->GetDimensionsCount(in, &ndim));
  if (ndim == 0 || ndim > OSG_MAX_DIMS) return NULL; /* rank unknown (or a scalar): left unknown */
  RETURN_IF_ERROR(api->GetDimensions(in, dims, ndim));
  RETURN_IF_ERROR(api->GetSymbolicDimensions(in, names, ndim));
  for (size_t i = 0; i < ndim; i++)
    if (dims[i] < 0 && (names[i] == NULL || names[i][0] == '\0')) return NULL;
  if (!read_int_attr(api, ctx, g->gather ? "K" : "N", &last)) return NULL; /* the kernel will say */
  size_t out_ndim = g->gather ? ndim + 1 : ndim;
  dims[out_ndim - 1] = last;
  names[out_ndim - 1] = "";
  OrtTensorTypeAndShapeInfo *out = NULL;
  RETURN_IF_ERROR(api->CreateTensorTypeAndShapeInfo(&out));
  OrtStatus *status = api->SetTensorElementType(out, OSG_TENSOR_FLOAT);
  if (status == NULL) status = api->SetDimensions(out, dims, out_ndim);
  if (status == NULL) status = api->SetSymbolicDimensions(out, names, out_ndim);
  if (status == NULL) status = api->ShapeInferContext_SetOutputTypeShape(ctx, 0, out);
  api->ReleaseTensorTypeAndShapeInfo(out);
  return status;
}

/* ---- SkipRmsNorm (ops_norm.c): input, skip, gamma -> output, sum; all float ---- */

static const char *OSG_ORT_CALL norm_name(const OrtCustomOp *op) { (void)op; return "SkipRmsNorm"; }

static size_t OSG_ORT_CALL three(const OrtCustomOp *op) { (void)op; return 3; }

static ONNXTensorElementDataType OSG_ORT_CALL all_float(const OrtCustomOp *op, size_t index) {
  (void)op, (void)index;
  return OSG_TENSOR_FLOAT;
}

static OrtStatus *OSG_ORT_CALL norm_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                           void **kernel) {
  const GgufOp *g = (const GgufOp *)op;
  (void)api;
  return osg_norm_create(g->api, g->parallel, info, kernel);
}

static OrtStatus *OSG_ORT_CALL norm_compute(void *kernel, OrtKernelContext *ctx) { return osg_norm_compute(kernel, ctx); }

static void OSG_ORT_CALL norm_destroy(void *kernel) { osg_norm_destroy(kernel); }

static GgufOp norm_op(const OrtApi *api, int parallel) {
  GgufOp g = {
      {
          OSG_CUSTOM_OP_VERSION, NULL, norm_name, cpu_provider, all_float, three, float_output, two,
          NULL, norm_destroy, required, required, default_memory,
          arity_one, homogeneous, arity_one, homogeneous,
          norm_create, norm_compute, NULL, NULL, NULL,
      },
      api, parallel, 0};
  return g;
}

/* ---- registration ---- */

static GgufOp op_for(const OrtApi *api, int parallel, int gather) {
  GgufOp g = {
      {
          parallel ? OSG_CUSTOM_OP_VERSION_SHAPES : OSG_CUSTOM_OP_VERSION,
          NULL, gather ? gather_name : matmul_name, cpu_provider,
          gather ? gather_input_type : matmul_input_type, two, float_output, one,
          NULL, osg_op_destroy, required, required, default_memory,
          arity_one, homogeneous, arity_one, homogeneous,
          osg_op_create, osg_op_compute, parallel ? infer_shape : NULL,
          NULL, NULL, /* GetStartVersion, GetEndVersion: opset 1 onwards */
      },
      api, parallel, gather};
  return g;
}

/* Each runtime's two ops; they must outlive every session, so they live as long as the library. */
#define OSG_MAX_RUNTIMES 8
static struct {
  const OrtApi *api;
  GgufOp matmul, gather, norm;
} g_runtimes[OSG_MAX_RUNTIMES];
static int g_runtime_count;

static int runtime_index(const OrtApi *api, int parallel) {
  static volatile int lock;
  int found = -1;
  while (__sync_lock_test_and_set(&lock, 1)) {
  }
  for (int i = 0; i < g_runtime_count && found < 0; i++)
    if (g_runtimes[i].api == api) found = i;
  if (found < 0 && g_runtime_count < OSG_MAX_RUNTIMES) {
    found = g_runtime_count;
    g_runtimes[found].api = api;
    g_runtimes[found].matmul = op_for(api, parallel, 0);
    g_runtimes[found].gather = op_for(api, parallel, 1);
    g_runtimes[found].norm = norm_op(api, parallel);
    __sync_synchronize();
    g_runtime_count++;
  }
  __sync_lock_release(&lock);
  return found;
}

/* What onnxruntime (SessionOptions.register_custom_ops_library) and onnxruntime-genai
 * (session_options.custom_ops_library) call after loading the library. */
OSG_EXPORT OrtStatus *OSG_ORT_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *api_base) {
  if (api_base == NULL || api_base->GetApi == NULL) return NULL; /* nothing to report an error with */
  const OrtApi *api = api_base->GetApi(OSG_ORT_API_PARALLEL);
  int parallel = api != NULL;
  if (api == NULL) api = api_base->GetApi(OSG_ORT_API_MIN);
  if (api == NULL) {
    /* No table of a version the ops can use: the error is made with the first table's
     * CreateStatus, which every version has at slot 0. */
    const OrtApi *oldest = api_base->GetApi(1);
    if (oldest == NULL) return NULL;
    return oldest->CreateStatus(OSG_ORT_NOT_IMPLEMENTED,
                                "ortserve.gguf ops need onnxruntime >= 1.16 (C API version 16)");
  }
  int rt = runtime_index(api, parallel);
  if (rt < 0)
    return osg_fail(api, OSG_ORT_FAIL, "ortserve.gguf: more than %d onnxruntime builds in one process",
                    OSG_MAX_RUNTIMES);
  OrtCustomOpDomain *domain = NULL;
  RETURN_IF_ERROR(api->CreateCustomOpDomain(OSG_DOMAIN, &domain));
  RETURN_IF_ERROR(api->CustomOpDomain_Add(domain, &g_runtimes[rt].matmul.op));
  RETURN_IF_ERROR(api->CustomOpDomain_Add(domain, &g_runtimes[rt].gather.op));
  RETURN_IF_ERROR(api->CustomOpDomain_Add(domain, &g_runtimes[rt].norm.op));
  /* The domain must outlive every session made from these options, and ORT gives no hook for
   * when the last one ends: it is kept for the life of the process (a few dozen bytes). */
  return api->AddCustomOpDomain(options, domain);
}

/* What this build of the library offers beyond version 1's two ops, for a caller deciding what to
 * write into a graph (ortserve.native.library_features): space-separated names. */
OSG_EXPORT const char *osg_features(void) { return "swiglu skip_rms_norm"; }
