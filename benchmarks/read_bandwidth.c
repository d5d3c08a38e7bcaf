/* How fast this machine's cores can read memory, in 4 KB pages and in 2 MB pages (prints JSON).
 *
 *   cc -O2 -mavx2 -pthread benchmarks/read_bandwidth.c -o /tmp/read_bandwidth
 *   /tmp/read_bandwidth [MB=800] [THREADS=2] [REPS=10] [INTERLEAVE_KB=0]
 *
 * A decode step of a GGUF-native model reads every weight once, front to back: the decode speed
 * no kernel can beat is this bandwidth over the bytes a token reads (docs/native.md). Each thread
 * sums its share of one buffer with 256-bit loads (four accumulators, no prefetch hints); the best
 * of REPS is kept. The buffer is anonymous memory, 2 MB-aligned, filled before timing; for the
 * huge side it is advised MADV_HUGEPAGE before it is touched (THP mode `madvise` or `always`).
 * INTERLEAVE_KB > 0: the threads take turns over blocks of that size instead of each reading its
 * own share front to back, as two threads do that split a weight's rows in alternate chunks.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ALIGN ((size_t)2 << 20)

struct job { const char *p; size_t n; long long sum; size_t block, stride; };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static __m256i sum_run(const char *p, size_t n, __m256i a) {
    __m256i b = _mm256_setzero_si256(), c = b, d = b;
    for (size_t o = 0; o + 128 <= n; o += 128) {
        a = _mm256_add_epi32(a, _mm256_load_si256((const __m256i *)(p + o)));
        b = _mm256_add_epi32(b, _mm256_load_si256((const __m256i *)(p + o + 32)));
        c = _mm256_add_epi32(c, _mm256_load_si256((const __m256i *)(p + o + 64)));
        d = _mm256_add_epi32(d, _mm256_load_si256((const __m256i *)(p + o + 96)));
    }
    return _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));
}

/* job->p .. p + n front to back; or, with a block size, every `stride`-th block of it */
static void *sum_share(void *arg) {
    struct job *j = arg;
    __m256i a = _mm256_setzero_si256();
    if (j->block == 0) {
        a = sum_run(j->p, j->n, a);
    } else {
        for (size_t o = 0; o + j->block <= j->n; o += j->stride) a = sum_run(j->p + o, j->block, a);
    }
    int lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, a);
    j->sum = 0;
    for (int i = 0; i < 8; i++) j->sum += lanes[i];
    return NULL;
}

static double best_gbps(size_t bytes, int threads, int reps, int huge, size_t block, long long *check) {
    char *raw = mmap(NULL, bytes + ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) { perror("mmap"); exit(1); }
    char *buf = (char *)(((size_t)raw + ALIGN - 1) & ~(ALIGN - 1));
    if (huge) madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 1, bytes);
    double best = 1e30;
    struct job jobs[64];
    pthread_t th[64];
    for (int r = 0; r < reps; r++) {
        size_t share = bytes / (size_t)threads / 128 * 128;
        double t = now();
        for (int i = 0; i < threads; i++) {
            jobs[i] = block ? (struct job){buf + (size_t)i * block, share * (size_t)threads - (size_t)i * block, 0,
                                           block, block * (size_t)threads}
                            : (struct job){buf + (size_t)i * share, share, 0, 0, 0};
            pthread_create(&th[i], NULL, sum_share, &jobs[i]);
        }
        for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
        t = now() - t;
        if (t < best) best = t;
        *check = 0;
        for (int i = 0; i < threads; i++) *check += jobs[i].sum;
    }
    munmap(raw, bytes + ALIGN);
    return (double)(bytes / (size_t)threads / 128 * 128 * (size_t)threads) / best / 1e9;
}

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? (size_t)atol(argv[1]) : 800;
    int threads = argc > 2 ? atoi(argv[2]) : 2, reps = argc > 3 ? atoi(argv[3]) : 10;
    long kb = argc > 4 ? atol(argv[4]) : 0;
    if (threads < 1 || threads > 64 || reps < 1 || mb < 1 || kb < 0 || (kb && (mb << 10) % ((size_t)kb * threads))) {
        fprintf(stderr, "bad arguments (INTERLEAVE_KB x THREADS must divide MB)\n");
        return 2;
    }
    size_t block = (size_t)kb << 10;
    long long c4 = 0, c2 = 0;
    double small = best_gbps(mb << 20, threads, reps, 0, block, &c4);
    double huge = best_gbps(mb << 20, threads, reps, 1, block, &c2);
    printf("{\"benchmark\": \"read_bandwidth\", \"mb\": %zu, \"threads\": %d, \"reps\": %d, \"interleave_kb\": %ld, "
           "\"gb_per_s_4k_pages\": %.2f, \"gb_per_s_2m_pages\": %.2f, \"huge_over_4k\": %.3f, \"checksum_equal\": %s}\n",
           mb, threads, reps, kb, small, huge, huge / small, c4 == c2 ? "true" : "false");
    return 0;
}
