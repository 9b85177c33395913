// GPU burn-in of `provision verify --burn-in SECONDS` (check gpu.burn; docs/verify.md).
//
// Every GPU, each in its own host thread, runs for SECONDS a deterministic chain of fused
// multiply-adds over a 128 MiB buffer, again and again, and compares every result with the
// first run's, bit for bit (the same code on the same inputs gives the same bits: any
// difference is a fault). The first run is itself checked against the CPU on a sample
// (fmaf is IEEE-exact on both sides). Meanwhile NVML, loaded at run time from the driver,
// is read once a second: temperature, power, and the clock slowdowns that mean a cooling or
// power fault (HW slowdown, SW/HW thermal, HW power brake; a power cap is normal under load).
//
// Prints one line per GPU, then "burn-in done gpus=N":
//   gpu 0 seconds=60.0 iterations=1530 errors=0 cpu_mismatch=0 gflops=41234 max_temp_c=71
//     max_power_w=412.3 slowdown=none watch=nvml        (one line; watch=none without NVML)
//   gpu 1 error=<what CUDA said>
// Exit status 0 when every GPU ran (the judge reads the lines), 2 on bad arguments or no GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

constexpr size_t N = size_t(1) << 25;  // floats per buffer: 128 MiB
constexpr int ROUNDS = 1024;           // FMA rounds per element per launch (8 chains each)
constexpr int SAMPLES = 4096;          // elements of the first run checked on the CPU

__host__ __device__ inline float chain(float x) {
  float a = x, b = fmaf(x, 0.5f, 1.0f), c = fmaf(x, -0.25f, 2.0f), d = fmaf(x, 0.125f, -1.0f);
  float e = fmaf(x, 2.0f, 0.5f), f = fmaf(x, -1.5f, 0.25f), g = fmaf(x, 0.75f, 3.0f), h = fmaf(x, -0.5f, -2.0f);
  for (int r = 0; r < ROUNDS; ++r) {
    a = fmaf(a, 0.99991f, 0.00011f); b = fmaf(b, 0.99973f, 0.00029f);
    c = fmaf(c, 0.99989f, -0.00013f); d = fmaf(d, 0.99997f, 0.00007f);
    e = fmaf(e, 0.99983f, 0.00017f); f = fmaf(f, 0.99971f, -0.00019f);
    g = fmaf(g, 0.99993f, 0.00003f); h = fmaf(h, 0.99977f, 0.00023f);
  }
  return ((((((a + b) + c) + d) + e) + f) + g) + h;
}

__global__ void burn(const float *in, float *out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = chain(in[i]);
}

__global__ void compare(const float *out, const float *ref, size_t n, unsigned long long *errors) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    bad += __float_as_uint(out[i]) != __float_as_uint(ref[i]);
  if (bad) atomicAdd(errors, bad);
}

// ---------------------------------------------------------------- NVML, loaded at run time
using NvmlInit = int (*)();
using NvmlByPci = int (*)(const char *, void **);
using NvmlTemp = int (*)(void *, int, unsigned *);
using NvmlPower = int (*)(void *, unsigned *);
using NvmlReasons = int (*)(void *, unsigned long long *);

struct Nvml {
  NvmlByPci by_pci = nullptr;
  NvmlTemp temp = nullptr;
  NvmlPower power = nullptr;
  NvmlReasons reasons = nullptr;
  bool ok = false;
};

static Nvml load_nvml() {
  Nvml n;
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!lib) return n;
  auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
  n.by_pci = reinterpret_cast<NvmlByPci>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  n.temp = reinterpret_cast<NvmlTemp>(dlsym(lib, "nvmlDeviceGetTemperature"));
  n.power = reinterpret_cast<NvmlPower>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
  n.reasons = reinterpret_cast<NvmlReasons>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
  if (!n.reasons) n.reasons = reinterpret_cast<NvmlReasons>(dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
  n.ok = init && n.by_pci && n.temp && n.power && n.reasons && init() == 0;
  return n;
}

// nvmlClocksEventReason*: the slowdowns that mean a fault, not a power cap
static const struct { unsigned long long bit; const char *name; } BAD_REASONS[] = {
    {0x08ULL, "hw_slowdown"}, {0x20ULL, "sw_thermal"}, {0x40ULL, "hw_thermal"}, {0x80ULL, "hw_power_brake"}};

struct Report {
  std::string error;
  double seconds = 0, gflops = 0, max_power_w = -1;
  long long iterations = 0;
  unsigned long long errors = 0, slowdowns = 0;
  int cpu_mismatch = 0, max_temp_c = -1;
  bool watched = false;
};

static bool failed(cudaError_t e, Report &r) {
  if (e == cudaSuccess) return false;
  r.error = cudaGetErrorString(e);
  return true;
}

static void run_gpu(int dev, double seconds, const Nvml &nvml, Report &r) {
  if (failed(cudaSetDevice(dev), r)) return;
  void *handle = nullptr;
  char bus[32] = {0};
  if (nvml.ok && cudaDeviceGetPCIBusId(bus, sizeof bus, dev) == cudaSuccess && nvml.by_pci(bus, &handle) == 0)
    r.watched = true;
  std::vector<float> host(N);
  for (size_t i = 0; i < N; ++i) host[i] = float((i * 2654435761ULL) % 1000003ULL) / 1000003.0f;
  float *in = nullptr, *out = nullptr, *ref = nullptr;
  unsigned long long *errors = nullptr;
  if (failed(cudaMalloc(&in, N * sizeof(float)), r) || failed(cudaMalloc(&out, N * sizeof(float)), r) ||
      failed(cudaMalloc(&ref, N * sizeof(float)), r) || failed(cudaMalloc(&errors, sizeof *errors), r) ||
      failed(cudaMemset(errors, 0, sizeof *errors), r) ||
      failed(cudaMemcpy(in, host.data(), N * sizeof(float), cudaMemcpyHostToDevice), r))
    return;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int blocks = sms * 8, threads = 256;
  burn<<<blocks, threads>>>(in, ref, N);
  if (failed(cudaDeviceSynchronize(), r)) return;
  for (int s = 0; s < SAMPLES; ++s) {
    size_t i = size_t(s) * (N / SAMPLES);
    float got = 0;
    if (failed(cudaMemcpy(&got, ref + i, sizeof got, cudaMemcpyDeviceToHost), r)) return;
    r.cpu_mismatch += got != chain(host[i]);
  }
  auto start = std::chrono::steady_clock::now(), last_watch = start - std::chrono::seconds(1);
  for (;;) {
    burn<<<blocks, threads>>>(in, out, N);
    compare<<<blocks, threads>>>(out, ref, N, errors);
    if (failed(cudaDeviceSynchronize(), r)) return;
    ++r.iterations;
    auto now = std::chrono::steady_clock::now();
    if (r.watched && now - last_watch >= std::chrono::seconds(1)) {
      unsigned t = 0, mw = 0;
      unsigned long long reasons = 0;
      if (nvml.temp(handle, 0, &t) == 0 && int(t) > r.max_temp_c) r.max_temp_c = int(t);
      if (nvml.power(handle, &mw) == 0 && mw / 1000.0 > r.max_power_w) r.max_power_w = mw / 1000.0;
      if (nvml.reasons(handle, &reasons) == 0) r.slowdowns |= reasons;
      last_watch = now;
    }
    r.seconds = std::chrono::duration<double>(now - start).count();
    if (r.seconds >= seconds) break;
  }
  if (failed(cudaMemcpy(&r.errors, errors, sizeof r.errors, cudaMemcpyDeviceToHost), r)) return;
  r.gflops = double(r.iterations) * N * ROUNDS * 8 * 2 / r.seconds / 1e9;
  cudaFree(in); cudaFree(out); cudaFree(ref); cudaFree(errors);
}

int main(int argc, char **argv) {
  double seconds = argc == 2 ? std::atof(argv[1]) : 0;
  if (!(seconds > 0)) {
    std::fprintf(stderr, "usage: %s SECONDS\n", argv[0]);
    return 2;
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("no usable GPU: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 2;
  }
  Nvml nvml = load_nvml();
  std::vector<Report> reports(count);
  std::vector<std::thread> threads;
  for (int d = 0; d < count; ++d) threads.emplace_back(run_gpu, d, seconds, std::cref(nvml), std::ref(reports[d]));
  for (auto &t : threads) t.join();
  for (int d = 0; d < count; ++d) {
    const Report &r = reports[d];
    if (!r.error.empty()) {
      std::printf("gpu %d error=%s\n", d, r.error.c_str());
      continue;
    }
    std::string slow;
    for (const auto &b : BAD_REASONS)
      if (r.slowdowns & b.bit) slow += (slow.empty() ? "" : ",") + std::string(b.name);
    std::printf("gpu %d seconds=%.1f iterations=%lld errors=%llu cpu_mismatch=%d gflops=%.0f max_temp_c=%d "
                "max_power_w=%.1f slowdown=%s watch=%s\n",
                d, r.seconds, r.iterations, r.errors, r.cpu_mismatch, r.gflops, r.max_temp_c, r.max_power_w,
                slow.empty() ? "none" : slow.c_str(), r.watched ? "nvml" : "none");
  }
  std::printf("burn-in done gpus=%d\n", count);
  return 0;
}
