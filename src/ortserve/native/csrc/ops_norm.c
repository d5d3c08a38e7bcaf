/* SkipRmsNorm: com.microsoft::SkipSimplifiedLayerNormalization's two outputs that ortserve's graphs
 * read, without its per-call set-up, in domain "ortserve.gguf", version 1 (docs/native.md).
 *
 *   SkipRmsNorm(input float [..., H], skip float [..., H], gamma float [H]) -> (output, sum)
 *   attribute epsilon (float).
 *
 * sum = input + skip; output = sum * gamma / sqrt(mean(sum^2) + epsilon), per row of H, in float32
 * (osg_rmsnorm: the mean of squares summed in float32 lanes, then in order). A decode step's row is
 * normed in the calling thread; many rows go over the pool.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops_internal.h"

typedef struct {
  const OrtApi *api;
  int parallel;
  float epsilon;
} NormKernel;

OrtStatus *osg_norm_create(const OrtApi *api, int parallel, const OrtKernelInfo *info, void **out) {
  float epsilon = 1e-5f;
  *out = NULL;
  OrtStatus *status = api->KernelInfoGetAttribute_float(info, "epsilon", &epsilon);
  if (status != NULL) {
    api->ReleaseStatus(status);
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "SkipRmsNorm: missing float attribute 'epsilon'");
  }
  if (!(epsilon >= 0.0f))
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "SkipRmsNorm: epsilon=%g must be >= 0", (double)epsilon);
  NormKernel *kn = (NormKernel *)calloc(1, sizeof *kn);
  if (kn == NULL) return osg_fail(api, OSG_ORT_FAIL, "SkipRmsNorm: out of memory");
  kn->api = api;
  kn->parallel = parallel;
  kn->epsilon = epsilon;
  *out = kn;
  return NULL;
}

void osg_norm_destroy(void *kernel) { free(kernel); }

typedef struct {
  const float *x, *skip, *gamma;
  float *out, *sum;
  int64_t h;
  float epsilon;
} NormWork;

static void norm_task(void *user, size_t row) {
  const NormWork *w = (const NormWork *)user;
  int64_t at = (int64_t)row * w->h;
  osg_rmsnorm(w->x + at, w->skip + at, w->gamma, w->out + at, w->sum + at, w->h, w->epsilon);
}

OrtStatus *osg_norm_compute(void *kernel, OrtKernelContext *ctx) {
  const NormKernel *kn = (const NormKernel *)kernel;
  const OrtApi *api = kn->api;
  const char *op = "SkipRmsNorm";
  Tensor x, skip, gamma;
  OrtStatus *status = NULL;
  RETURN_IF_ERROR(osg_input(api, ctx, 0, op, "input", &x));
  RETURN_IF_ERROR(osg_input(api, ctx, 1, op, "skip", &skip));
  RETURN_IF_ERROR(osg_input(api, ctx, 2, op, "gamma", &gamma));
  int64_t h = x.ndim ? x.dims[x.ndim - 1] : 0, rows = 1;
  for (size_t i = 0; i + 1 < x.ndim; i++) rows *= x.dims[i];
  if (x.type != OSG_TENSOR_FLOAT || skip.type != OSG_TENSOR_FLOAT || gamma.type != OSG_TENSOR_FLOAT || x.ndim < 1 ||
      skip.ndim != x.ndim || memcmp(x.dims, skip.dims, x.ndim * sizeof x.dims[0]) != 0 || gamma.ndim != 1 ||
      gamma.dims[0] != h)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT,
                    "%s: input and skip must be float tensors of one shape [..., H], gamma float [H]", op);
  OrtValue *out = NULL, *sum = NULL;
  RETURN_IF_ERROR(api->KernelContext_GetOutput(ctx, 0, x.dims, x.ndim, &out));
  RETURN_IF_ERROR(api->KernelContext_GetOutput(ctx, 1, x.dims, x.ndim, &sum));
  NormWork w = {NULL, NULL, NULL, NULL, NULL, h, kn->epsilon};
  w.x = (const float *)osg_data_of(api, x.value, &status);
  if (status == NULL) w.skip = (const float *)osg_data_of(api, skip.value, &status);
  if (status == NULL) w.gamma = (const float *)osg_data_of(api, gamma.value, &status);
  if (status == NULL) w.out = (float *)osg_data_of(api, out, &status);
  if (status == NULL) w.sum = (float *)osg_data_of(api, sum, &status);
  if (status != NULL || rows == 0 || h == 0) return status;
  /* a decode step's few rows are normed in this thread: less than waking the pool */
  return osg_parallel_for(api, kn->parallel && rows >= 4, ctx, norm_task, (size_t)rows, &w);
}
