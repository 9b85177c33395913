/* NCCL smoke program (role nccl): prints the version of the linked libnccl.
 * Built against nccl.h where the CUDA headers it includes are available (the header's
 * NCCL_VERSION_CODE must then equal the library's), against a declared prototype
 * elsewhere (nodes with NCCL but without a CUDA toolkit). ncclGetVersion needs no GPU. */
#include <stdio.h>
#if defined(__has_include)
#  if __has_include(<cuda_runtime.h>)
#    include <nccl.h>
#    define NCCL_SMOKE_HEADER 1
#  endif
#endif
#ifndef NCCL_SMOKE_HEADER
typedef int ncclResult_t;
ncclResult_t ncclGetVersion(int *version);
#endif

int main(void) {
  int code = 0;
  ncclResult_t rc = ncclGetVersion(&code);
  if (rc != 0) {
    fprintf(stderr, "ncclGetVersion failed: %d\n", (int)rc);
    return 1;
  }
  /* NCCL >= 2.9: code = major * 10000 + minor * 100 + patch */
  printf("NCCL %d.%d.%d (code %d, built with %s)\n", code / 10000, (code % 10000) / 100, code % 100, code,
#ifdef NCCL_SMOKE_HEADER
         "nccl.h"
#else
         "a prototype"
#endif
  );
#ifdef NCCL_SMOKE_HEADER
  if (code != NCCL_VERSION_CODE) {
    fprintf(stderr, "nccl.h says %d but the library is %d\n", NCCL_VERSION_CODE, code);
    return 1;
  }
#endif
  return 0;
}
