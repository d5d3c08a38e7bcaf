/* One thread, one weight matrix: the ortserve GGUF kernels (osg_quantize_act + osg_matmul_rows) against
 * llama.cpp's CPU kernels on the same bytes (ggml's from_float for the activation type + vec_dot per
 * row, tiled 16 x 16 as ggml_compute_forward_mul_mat does on one thread). Built and run by
 * benchmarks/native_kernels.py --vs-ggml; prints one JSON object per call.
 *
 *   cc -O2 -o /tmp/vs_ggml benchmarks/native_kernels_vs_ggml.c -ldl
 *   /tmp/vs_ggml LIBOSG.so LIBGGML-BASE.so LIBGGML-CPU.so TYPE K N M REPEAT
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*vec_dot_t)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by, int nrc);
typedef void (*from_float_t)(const float *x, void *y, int64_t k);
struct traits_cpu { from_float_t from_float; vec_dot_t vec_dot; int vec_dot_type; int64_t nrows; };

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) { fprintf(stderr, "missing %s\n", name); exit(2); }
    return p;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);  /* this thread's CPU time: the machine may be loaded */
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 10) { fprintf(stderr, "usage: LIBOSG LIBGGML_BASE LIBGGML_CPU TYPE K N M REPEAT\n"); return 2; }
    void *ho = dlopen(argv[1], RTLD_NOW), *hb = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL), *hc = dlopen(argv[3], RTLD_NOW);
    if (!ho || !hb || !hc) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    int type = atoi(argv[4]);
    int64_t k = atoll(argv[5]), n = atoll(argv[6]), m = atoll(argv[7]);
    int repeat = atoi(argv[8]);
    (void)argv[9];

    size_t (*osg_row_bytes)(int, int64_t) = sym(ho, "osg_row_bytes");
    size_t (*osg_act_row_bytes)(int, int64_t) = sym(ho, "osg_act_row_bytes");
    void (*osg_quantize_act)(int, const float *, void *, int64_t) = sym(ho, "osg_quantize_act");
    void (*osg_matmul_rows)(int, int64_t, const void *, const void *, int64_t, float *, int64_t, int64_t, int64_t) =
        sym(ho, "osg_matmul_rows");
    const char *(*osg_isa)(void) = sym(ho, "osg_isa");
    size_t (*ggml_row_size)(int, int64_t) = sym(hb, "ggml_row_size");
    void (*ggml_cpu_init)(void) = sym(hc, "ggml_cpu_init");
    const struct traits_cpu *(*get_traits)(int) = sym(hc, "ggml_get_type_traits_cpu");
    ggml_cpu_init();

    size_t rb = osg_row_bytes(type, k);
    if (rb != ggml_row_size(type, k)) { fprintf(stderr, "row sizes differ\n"); return 2; }
    uint8_t *w = malloc(rb * n);
    srand(1);
    for (size_t i = 0; i < rb * n; i++) w[i] = (uint8_t)rand();
    /* finite fp16 scales (0.01) where each block keeps them */
    size_t bb = type == 12 ? 144 : type == 13 ? 176 : type == 14 ? 210 : type == 2 ? 18 : type == 3 ? 20 :
                type == 6 ? 22 : type == 7 ? 24 : type == 20 ? 18 : type == 23 ? 136 : 34;
    int two = type == 3 || type == 7 || type == 12 || type == 13;
    for (size_t b = 0; b < rb * n / bb; b++) {
        uint8_t *p = w + b * bb + (type == 14 ? 208 : 0);
        p[0] = 0x1F; p[1] = 0x21;
        if (two) { p[2] = 0x1F; p[3] = 0x21; }
    }
    float *x = malloc(sizeof(float) * k * m), *y = malloc(sizeof(float) * n * m), *y2 = malloc(sizeof(float) * n * m);
    for (int64_t i = 0; i < k * m; i++) x[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;

    const struct traits_cpu *tw = get_traits(type);
    const struct traits_cpu *ta = get_traits(tw->vec_dot_type);
    size_t gab = ggml_row_size(tw->vec_dot_type, k), oab = osg_act_row_bytes(type, k);
    uint8_t *gq = malloc(gab * m), *oq = malloc(oab * m);

    double best_o = 1e9, best_g = 1e9;
    for (int r = 0; r < repeat; r++) {
        double t0 = now();
        for (int64_t i = 0; i < m; i++) osg_quantize_act(type, x + i * k, oq + i * oab, k);
        osg_matmul_rows(type, k, w, oq, m, y, n, 0, n);
        double t1 = now();
        for (int64_t i = 0; i < m; i++) ta->from_float(x + i * k, gq + i * gab, k);
        for (int64_t m0 = 0; m0 < m; m0 += 16)
            for (int64_t n0 = 0; n0 < n; n0 += 16)
                for (int64_t i = m0; i < m0 + 16 && i < m; i++)
                    for (int64_t j = n0; j < n0 + 16 && j < n; j++)
                        tw->vec_dot((int)k, &y2[i * n + j], 0, w + j * rb, 0, gq + i * gab, 0, 1);
        double t2 = now();
        if (t1 - t0 < best_o) best_o = t1 - t0;
        if (t2 - t1 < best_g) best_g = t2 - t1;
    }
    /* the two differ only by the activation quantization (ggml: fp16 scale for q8_0/q8_1) and float order */
    double maxd = 0, maxy = 0;
    for (int64_t i = 0; i < n * m; i++) {
        double d = y[i] - y2[i], s = y2[i] < 0 ? -y2[i] : y2[i];
        d = d < 0 ? -d : d;
        if (d > maxd) maxd = d;
        if (s > maxy) maxy = s;
    }
    double maxrel = maxy > 0 ? maxd / maxy : 0;
    printf("{\"type\": %d, \"k\": %lld, \"n\": %lld, \"m\": %lld, \"isa\": \"%s\", \"ortserve_s\": %.6g, "
           "\"ggml_s\": %.6g, \"weight_bytes\": %zu, \"max_diff_over_max_abs\": %.3g}\n",
           type, (long long)k, (long long)n, (long long)m, osg_isa(), best_o, best_g, rb * n, maxrel);
    return 0;
}
