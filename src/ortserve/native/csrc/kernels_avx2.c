/* AVX2 + FMA + F16C paths, compiled for those instructions by function attribute only (the library is
 * built without -march), used when the CPU reports them. */
#include "kernels_internal.h"

#if defined(__x86_64__) || defined(__i386__)
int osg_fill_avx2(osg_kernels *k) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
        return 0;
    (void)k;
    return 1;
}
#else
int osg_fill_avx2(osg_kernels *k) { (void)k; return 0; }
#endif
