/* AVX-512 VNNI paths (vpdpbusd) for the hot types. */
#include "kernels_internal.h"

#if defined(__x86_64__)
int osg_fill_avx512(osg_kernels *k) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")))
        return 0;
    (void)k;
    return 1;
}
#else
int osg_fill_avx512(osg_kernels *k) { (void)k; return 0; }
#endif
