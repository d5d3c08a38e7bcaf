/* CachedAttention: com.microsoft::GroupQueryAttention's computation for the graphs ortserve writes
 * (docs/native.md), without its per-call set-up, in domain "ortserve.gguf", version 1.
 *
 *   CachedAttention(query, key?, value?, past_key, past_value, seqlens_k int32 [B],
 *                   total_sequence_length int32, cos_cache, sin_cache)
 *     -> output [B, S, heads * D], present_key, present_value
 *   attributes num_heads, kv_num_heads (int), scale (float; 0: 1/sqrt(D)).
 *
 * The same inputs in the same order as GQA with do_rotary=1, rotary_interleaved=0, no local window
 * and no soft-cap (engine/graph.py swaps a node only then). query is [B, S, heads * D], or the packed
 * [B, S, (heads + 2 * kv_heads) * D] with key and value absent. The cache is BNSH,
 * [B, kv_heads, capacity, D], and present is past's shape: the engine binds both to one buffer,
 * and the op writes only the new tokens' keys and values into it (a separate present gets past
 * copied first). Row b holds seqlens_k[b] + 1 tokens after this call, the S new ones last: the new
 * token s sits at position p = seqlens_k[b] + 1 - S + s (at least s: a right-padded first prompt),
 * is rotated by the caches' row p (the first 2 * cos_cache.dims[1] values of each head, in halves),
 * and attends to positions 0..p. Everything is float32; the softmax subtracts the row's maximum (on
 * AVX2, exp is kernels_avx2.h's polynomial, within 2 ulp of expf).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops_internal.h"

typedef struct {
  const OrtApi *api;
  int parallel;
  int64_t heads, kv_heads;
  float scale;
} AttentionKernel;

OrtStatus *osg_attention_create(const OrtApi *api, int parallel, const OrtKernelInfo *info, void **out) {
  const char *op = "CachedAttention";
  int64_t heads = 0, kv_heads = 0;
  float scale = 0.0f;
  *out = NULL;
  OrtStatus *status = api->KernelInfoGetAttribute_int64(info, "num_heads", &heads);
  if (status == NULL) status = api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &kv_heads);
  if (status != NULL) {
    api->ReleaseStatus(status);
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: needs int attributes num_heads and kv_num_heads", op);
  }
  status = api->KernelInfoGetAttribute_float(info, "scale", &scale);
  if (status != NULL) { /* absent: 1/sqrt(D), as GQA */
    api->ReleaseStatus(status);
    scale = 0.0f;
  }
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT,
                    "%s: num_heads=%lld must be a positive multiple of kv_num_heads=%lld", op, (long long)heads,
                    (long long)kv_heads);
  AttentionKernel *kn = (AttentionKernel *)calloc(1, sizeof *kn);
  if (kn == NULL) return osg_fail(api, OSG_ORT_FAIL, "%s: out of memory", op);
  kn->api = api;
  kn->parallel = parallel;
  kn->heads = heads;
  kn->kv_heads = kv_heads;
  kn->scale = scale;
  *out = kn;
  return NULL;
}

void osg_attention_destroy(void *kernel) { free(kernel); }

/* ---- one head's attention over positions 0..n-1: scores, softmax, the weighted sum of values ---- */

static void attend_plain(const float *q, const float *keys, const float *values, int64_t n, int64_t d, float scale,
                         float *score, float *o) {
  float top = -INFINITY, total = 0.0f;
  for (int64_t t = 0; t < n; t++) {
    float s = 0.0f;
    for (int64_t i = 0; i < d; i++) s += q[i] * keys[t * d + i];
    score[t] = s * scale;
    if (score[t] > top) top = score[t];
  }
  for (int64_t t = 0; t < n; t++) total += (score[t] = expf(score[t] - top));
  memset(o, 0, (size_t)d * sizeof(float));
  for (int64_t t = 0; t < n; t++)
    for (int64_t i = 0; i < d; i++) o[i] += score[t] * values[t * d + i];
  float inv = 1.0f / total;
  for (int64_t i = 0; i < d; i++) o[i] *= inv;
}

#if defined(__x86_64__) && !defined(OSG_NO_SIMD)
#include "kernels_avx2.h"

#define OSG_ATT_MAXV 32 /* head sizes up to 256 stay in registers */

/* d a multiple of 8 (at most 8 * OSG_ATT_MAXV): the query and the output in registers, one pass each */
AVX2 static void attend_avx2(const float *q, const float *keys, const float *values, int64_t n, int64_t d,
                             float scale, float *score, float *o) {
  int64_t nv = d / 8;
  __m256 qv[OSG_ATT_MAXV], top = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < nv; j++) qv[j] = _mm256_loadu_ps(q + 8 * j);
  for (int64_t t = 0; t < n; t++) {
    const float *k = keys + t * d;
    __m256 a0 = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k)), a1 = _mm256_setzero_ps();
    int64_t j = 1;
    for (; j + 1 < nv; j += 2) {
      a1 = _mm256_fmadd_ps(qv[j], _mm256_loadu_ps(k + 8 * j), a1);
      a0 = _mm256_fmadd_ps(qv[j + 1], _mm256_loadu_ps(k + 8 * j + 8), a0);
    }
    if (j < nv) a1 = _mm256_fmadd_ps(qv[j], _mm256_loadu_ps(k + 8 * j), a1);
    score[t] = hsum_ps(_mm256_add_ps(a0, a1)) * scale;
    top = _mm256_max_ps(top, _mm256_set1_ps(score[t]));
  }
  __m256 sum = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(score + t), top));
    _mm256_storeu_ps(score + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum_ps(sum), mx = _mm256_cvtss_f32(top);
  for (; t < n; t++) total += (score[t] = expf(score[t] - mx));
  __m256 ov[OSG_ATT_MAXV];
  for (int64_t j = 0; j < nv; j++) ov[j] = _mm256_setzero_ps();
  for (t = 0; t < n; t++) {
    __m256 p = _mm256_set1_ps(score[t]);
    const float *v = values + t * d;
    for (int64_t j = 0; j < nv; j++) ov[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * j), ov[j]);
  }
  __m256 inv = _mm256_set1_ps(1.0f / total);
  for (int64_t j = 0; j < nv; j++) _mm256_storeu_ps(o + 8 * j, _mm256_mul_ps(ov[j], inv));
}

/* the kernels' level (kernels_common.c: the CPU's best, or what ORTSERVE_NATIVE_ISA / osg_set_isa chose)
 * is AVX2 or above, and the head fits the registers */
static int use_avx2(int64_t d) { return strcmp(osg_isa(), "scalar") != 0 && d % 8 == 0 && d <= 8 * OSG_ATT_MAXV; }
#endif

/* x (one head, D values) rotated in place by row p of the caches: the first `rot` values, in halves */
static void rotate(float *x, int64_t rot, const float *cos_row, const float *sin_row) {
  int64_t half = rot / 2;
  for (int64_t i = 0; i < half; i++) {
    float a = x[i], b = x[i + half];
    x[i] = a * cos_row[i] - b * sin_row[i];
    x[i + half] = b * cos_row[i] + a * sin_row[i];
  }
}

typedef struct {
  const AttentionKernel *kn;
  int64_t b_count, s_count, d, capacity, rot, q_stride, k_offset, v_offset, kv_stride;
  const float *q, *k, *v, *cos, *sin;
  const int32_t *seqlens;
  float *out, *present_k, *present_v;
  float scale;
  int failed; /* set by a task that could not get memory */
} AttentionWork;

static int64_t first_position(const AttentionWork *w, int64_t b) {
  int64_t past = (int64_t)w->seqlens[b] + 1 - w->s_count;
  return past > 0 ? past : 0;
}

/* one task a (row, new token, kv head): its key and value into the cache */
static void store_task(void *user, size_t task) {
  const AttentionWork *w = (const AttentionWork *)user;
  int64_t h = (int64_t)task % w->kn->kv_heads, bs = (int64_t)task / w->kn->kv_heads;
  int64_t b = bs / w->s_count, s = bs % w->s_count, p = first_position(w, b) + s, d = w->d;
  size_t src = (size_t)(bs * w->kv_stride + h * d);
  size_t dst = (size_t)(((b * w->kn->kv_heads + h) * w->capacity + p) * d);
  memcpy(w->present_k + dst, w->k + w->k_offset + src, (size_t)d * sizeof(float));
  memcpy(w->present_v + dst, w->v + w->v_offset + src, (size_t)d * sizeof(float));
  rotate(w->present_k + dst, w->rot, w->cos + p * (w->rot / 2), w->sin + p * (w->rot / 2));
}

/* Each pool thread's scratch: one head's rotated query and one row of scores, grown as needed. */
static __thread float *g_scratch;
static __thread int64_t g_scratch_len;

/* one task a (row, new token, kv head): the heads of its group attend to positions 0..p */
static void attend_task(void *user, size_t task) {
  const AttentionWork *w = (const AttentionWork *)user;
  const AttentionKernel *kn = w->kn;
  int64_t h = (int64_t)task % kn->kv_heads, bs = (int64_t)task / kn->kv_heads;
  int64_t b = bs / w->s_count, s = bs % w->s_count, p = first_position(w, b) + s, d = w->d;
  int64_t group = kn->heads / kn->kv_heads, need = d + p + 1;
  if (g_scratch_len < need) {
    free(g_scratch);
    g_scratch = (float *)malloc((size_t)need * sizeof(float));
    g_scratch_len = g_scratch ? need : 0;
  }
  float *out = w->out + (size_t)(bs * kn->heads * d);
  if (g_scratch == NULL) { /* out of memory: osg_attention_compute reports it */
    __atomic_store_n(&((AttentionWork *)user)->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  void (*attend)(const float *, const float *, const float *, int64_t, int64_t, float, float *, float *) = attend_plain;
#if defined(__x86_64__) && !defined(OSG_NO_SIMD)
  if (use_avx2(d)) attend = attend_avx2;
#endif
  float *q = g_scratch, *score = g_scratch + d;
  const float *keys = w->present_k + (size_t)((b * kn->kv_heads + h) * w->capacity * d);
  const float *values = w->present_v + (size_t)((b * kn->kv_heads + h) * w->capacity * d);
  for (int64_t g = 0; g < group; g++) {
    int64_t head = h * group + g;
    memcpy(q, w->q + (size_t)(bs * w->q_stride + head * d), (size_t)d * sizeof(float));
    rotate(q, w->rot, w->cos + p * (w->rot / 2), w->sin + p * (w->rot / 2));
    attend(q, keys, values, p + 1, d, w->scale, score, out + head * d);
  }
}

static OrtStatus *run_tasks(const AttentionKernel *kn, OrtKernelContext *ctx, void (*fn)(void *, size_t),
                            size_t total, void *user) {
  if (kn->parallel && total > 1) return kn->api->KernelContext_ParallelFor(ctx, fn, total, 0, user);
  for (size_t i = 0; i < total; i++) fn(user, i);
  return NULL;
}

static OrtStatus *float_input(const OrtApi *api, OrtKernelContext *ctx, size_t index, const char *name,
                              size_t ndim, Tensor *t) {
  RETURN_IF_ERROR(osg_input(api, ctx, index, "CachedAttention", name, t));
  if (t->type != OSG_TENSOR_FLOAT || t->ndim != ndim)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "CachedAttention: %s must be a float tensor of %zu dimensions",
                    name, ndim);
  return NULL;
}

OrtStatus *osg_attention_compute(void *kernel, OrtKernelContext *ctx) {
  const AttentionKernel *kn = (const AttentionKernel *)kernel;
  const OrtApi *api = kn->api;
  const char *op = "CachedAttention";
  Tensor q, k, v, pk, pv, lens, cos_t, sin_t;
  const OrtValue *key_value = NULL;
  OrtStatus *status = NULL;
  RETURN_IF_ERROR(float_input(api, ctx, 0, "query", 3, &q));
  RETURN_IF_ERROR(api->KernelContext_GetInput(ctx, 1, &key_value));
  int packed = key_value == NULL;
  if (!packed) {
    RETURN_IF_ERROR(float_input(api, ctx, 1, "key", 3, &k));
    RETURN_IF_ERROR(float_input(api, ctx, 2, "value", 3, &v));
  }
  RETURN_IF_ERROR(float_input(api, ctx, 3, "past_key", 4, &pk));
  RETURN_IF_ERROR(float_input(api, ctx, 4, "past_value", 4, &pv));
  RETURN_IF_ERROR(osg_input(api, ctx, 5, op, "seqlens_k", &lens));
  RETURN_IF_ERROR(float_input(api, ctx, 7, "cos_cache", 2, &cos_t));
  RETURN_IF_ERROR(float_input(api, ctx, 8, "sin_cache", 2, &sin_t));
  AttentionWork w;
  memset(&w, 0, sizeof w);
  w.kn = kn;
  w.b_count = q.dims[0];
  w.s_count = q.dims[1];
  w.d = pk.dims[3];
  w.capacity = pk.dims[2];
  w.rot = 2 * cos_t.dims[1];
  int64_t hd = kn->heads * w.d, kvd = kn->kv_heads * w.d;
  w.q_stride = packed ? hd + 2 * kvd : hd;
  w.kv_stride = packed ? w.q_stride : kvd;
  w.k_offset = packed ? hd : 0;
  w.v_offset = packed ? hd + kvd : 0;
  if (lens.type != OSG_TENSOR_INT32 || lens.ndim != 1 || lens.dims[0] != w.b_count)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: seqlens_k must be int32 [batch=%lld]", op,
                    (long long)w.b_count);
  if (q.dims[2] != w.q_stride || (!packed && (k.dims[2] != kvd || v.dims[2] != kvd)))
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT,
                    "%s: query/key/value widths do not match num_heads=%lld, kv_num_heads=%lld, head size %lld", op,
                    (long long)kn->heads, (long long)kn->kv_heads, (long long)w.d);
  if (pk.dims[0] != w.b_count || pk.dims[1] != kn->kv_heads || memcmp(pk.dims, pv.dims, sizeof pk.dims[0] * 4) != 0)
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: past_key/past_value must be [batch, kv_num_heads, capacity, D]",
                    op);
  if (w.rot > w.d || w.rot <= 0 || sin_t.dims[0] != cos_t.dims[0] || sin_t.dims[1] != cos_t.dims[1])
    return osg_fail(api, OSG_ORT_INVALID_ARGUMENT, "%s: cos_cache/sin_cache must be equal [positions, <= D/2]", op);
  w.q = (const float *)osg_data_of(api, q.value, &status);
  if (status == NULL && !packed) w.k = (const float *)osg_data_of(api, k.value, &status);
  if (status == NULL && !packed) w.v = (const float *)osg_data_of(api, v.value, &status);
  if (packed) w.k = w.v = w.q;
  if (status == NULL) w.seqlens = (const int32_t *)osg_data_of(api, lens.value, &status);
  if (status == NULL) w.cos = (const float *)osg_data_of(api, cos_t.value, &status);
  if (status == NULL) w.sin = (const float *)osg_data_of(api, sin_t.value, &status);
  if (status != NULL) return status;
  for (int64_t b = 0; b < w.b_count; b++) {
    int64_t last = first_position(&w, b) + w.s_count - 1;
    if (w.seqlens[b] < 0 || last >= w.capacity || last >= cos_t.dims[0])
      return osg_fail(api, OSG_ORT_INVALID_ARGUMENT,
                      "%s: row %lld reaches position %lld, past the cache's capacity %lld or the rotary caches' %lld",
                      op, (long long)b, (long long)last, (long long)w.capacity, (long long)cos_t.dims[0]);
  }
  int64_t out_dims[3] = {w.b_count, w.s_count, hd};
  OrtValue *out = NULL, *present_k = NULL, *present_v = NULL;
  RETURN_IF_ERROR(api->KernelContext_GetOutput(ctx, 0, out_dims, 3, &out));
  RETURN_IF_ERROR(api->KernelContext_GetOutput(ctx, 1, pk.dims, 4, &present_k));
  RETURN_IF_ERROR(api->KernelContext_GetOutput(ctx, 2, pv.dims, 4, &present_v));
  w.out = (float *)osg_data_of(api, out, &status);
  if (status == NULL) w.present_k = (float *)osg_data_of(api, present_k, &status);
  if (status == NULL) w.present_v = (float *)osg_data_of(api, present_v, &status);
  const float *past_k = NULL, *past_v = NULL;
  if (status == NULL) past_k = (const float *)osg_data_of(api, pk.value, &status);
  if (status == NULL) past_v = (const float *)osg_data_of(api, pv.value, &status);
  if (status != NULL) return status;
  size_t cache_bytes = (size_t)(w.b_count * kn->kv_heads * w.capacity * w.d) * sizeof(float);
  if (w.present_k != past_k) memcpy(w.present_k, past_k, cache_bytes);   /* not one shared buffer */
  if (w.present_v != past_v) memcpy(w.present_v, past_v, cache_bytes);
  if (w.scale == 0.0f) w.scale = kn->scale != 0.0f ? kn->scale : 1.0f / sqrtf((float)w.d);
  size_t tasks = (size_t)(w.b_count * w.s_count * kn->kv_heads);
  if (tasks == 0) return NULL;
  /* a decode step's few keys are stored in this thread: less than waking the pool */
  if (w.b_count * w.s_count <= 4) {
    for (size_t i = 0; i < tasks; i++) store_task(&w, i);
  } else {
    RETURN_IF_ERROR(run_tasks(kn, ctx, store_task, tasks, &w));
  }
  RETURN_IF_ERROR(run_tasks(kn, ctx, attend_task, tasks, &w));
  return __atomic_load_n(&w.failed, __ATOMIC_RELAXED)
             ? osg_fail(api, OSG_ORT_FAIL, "%s: out of memory for the scores of %lld positions", op,
                        (long long)w.capacity)
             : NULL;
}
