// CUDA smoke program (role cuda): adds two vectors on every GPU it finds.
// Without a GPU it still reports the toolkit version and exits 2 with the runtime's
// reason, so a node without GPUs can check that nvcc builds working binaries.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void add(const int *a, const int *b, int *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main() {
  // CUDART_VERSION: the toolkit this was built with (the runtime reports its version only
  // once a device is there)
  std::printf("CUDA runtime %d.%d\n", CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no usable GPU: %s\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 2;
  }
  const int n = 1 << 16;
  int failures = 0;
  for (int dev = 0; dev < count; ++dev) {
    cudaSetDevice(dev);
    int *a, *b, *c;
    cudaMallocManaged(&a, n * sizeof(int));
    cudaMallocManaged(&b, n * sizeof(int));
    cudaMallocManaged(&c, n * sizeof(int));
    for (int i = 0; i < n; ++i) { a[i] = i; b[i] = 2 * i; }
    add<<<(n + 255) / 256, 256>>>(a, b, c, n);
    err = cudaDeviceSynchronize();
    int bad = 0;
    for (int i = 0; i < n && err == cudaSuccess; ++i) bad += c[i] != 3 * i;
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    std::printf("GPU %d %s: %s\n", dev, prop.name, err != cudaSuccess ? cudaGetErrorString(err) : (bad ? "WRONG RESULT" : "ok"));
    failures += (err != cudaSuccess || bad);
    cudaFree(a); cudaFree(b); cudaFree(c);
  }
  return failures ? 1 : 0;
}
