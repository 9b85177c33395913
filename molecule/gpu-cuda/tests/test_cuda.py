"""Verify the cuda role on Debian 12 in a container (Debian's CUDA 11.8, no GPU)."""

from __future__ import annotations

import re

SAMPLE = r"""
#include <cstdio>
#include <cuda_runtime.h>
__global__ void scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
int main() {
  int n = -1;
  cudaError_t err = cudaGetDeviceCount(&n);
  std::printf("cudart=%d devices=%d (%s)\n", CUDART_VERSION, n, cudaGetErrorString(err));
  return 0;
}
"""


def test_toolkit_package_is_11_8(host):
    pkg = host.package("nvidia-cuda-toolkit")
    assert pkg.is_installed
    assert re.match(r"^11\.8\.", pkg.version), pkg.version


def test_host_compiler_installed(host):
    assert host.package("gcc").is_installed
    assert host.package("g++").is_installed


def test_recommends_not_installed(host):
    # kept lean for CI: no nsight/profiler GUIs
    assert not host.package("nsight-systems").is_installed
    assert not host.package("nvidia-visual-profiler").is_installed


def test_versioned_prefix_and_default_link(host):
    prefix = host.file("/usr/local/cuda-11.8")
    assert prefix.is_directory
    assert host.file("/usr/local/cuda-11.8/bin/nvcc").exists
    assert host.file("/usr/local/cuda-11.8/include/cuda_runtime.h").exists
    assert host.file("/usr/local/cuda-11.8/lib64/libcudart.so").exists
    assert host.file("/usr/local/cuda-11.8/nvvm/libdevice").is_directory
    # /usr/local/cuda -> /etc/alternatives/cuda -> /usr/local/cuda-11.8
    assert host.file("/usr/local/cuda").is_symlink
    assert host.check_output("readlink -f /usr/local/cuda") == "/usr/local/cuda-11.8"
    assert "/usr/local/cuda-11.8" in host.check_output("update-alternatives --query cuda")


def test_nvcc_reports_11_8(host):
    out = host.check_output("/usr/local/cuda/bin/nvcc --version")
    assert "release 11.8," in out


def test_profile_puts_nvcc_on_path(host):
    profile = host.file("/etc/profile.d/cuda.sh")
    assert profile.mode == 0o644
    assert "export CUDA_HOME=/usr/local/cuda" in profile.content_string
    assert host.check_output("bash -lc 'command -v nvcc'") == "/usr/local/cuda/bin/nvcc"
    assert host.check_output("bash -lc 'echo $CUDA_HOME'") == "/usr/local/cuda"


def test_ld_so_conf(host):
    conf = host.file("/etc/ld.so.conf.d/cuda.conf")
    assert conf.mode == 0o644
    assert "/usr/local/cuda/lib64" in conf.content_string.splitlines()
    assert "libcudart.so.11.0" in host.check_output("ldconfig -p")


def test_nvcc_compiles_a_cu_file(host):
    host.run("rm -rf /tmp/cuda-verify && mkdir -p /tmp/cuda-verify")
    host.run(f"cat > /tmp/cuda-verify/scale.cu <<'EOF'\n{SAMPLE}\nEOF")
    build = host.run("bash -lc 'nvcc -o /tmp/cuda-verify/scale /tmp/cuda-verify/scale.cu'")
    assert build.rc == 0, build.stderr
    # no GPU here: the binary runs, libcudart loads the driver library and reports no device
    out = host.check_output("/tmp/cuda-verify/scale")
    assert out.startswith("cudart=11080 "), out
    assert "no CUDA-capable device is detected" in out


def test_role_smoke_program_compiled_and_runs_without_gpu(host):
    binaries = host.check_output("ls /usr/local/share/provision/cuda-smoke/").split()
    smoke = [b for b in binaries if b.startswith("smoke-11.8-")]
    assert len(smoke) == 1, binaries
    result = host.run("/usr/local/share/provision/cuda-smoke/%s", smoke[0])
    # exit 2 = compiled and linked fine, no usable GPU (this container has none)
    assert result.rc == 2, result
    assert "CUDA runtime 11.8" in result.stdout
    assert "no usable GPU" in result.stdout
