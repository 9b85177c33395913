"""Verify the nccl role on Debian 12 in a container (PyPI wheel nvidia-nccl-cu12 2.21.5)."""

from __future__ import annotations

PREFIX = "/opt/nccl/2.21.5-cuda12"

PROGRAM = r"""
#include <stdio.h>
typedef int ncclResult_t;
ncclResult_t ncclGetVersion(int *version);
int main(void) { int v = 0; if (ncclGetVersion(&v)) return 1; printf("%d\n", v); return 0; }
"""


def test_wheel_downloaded_at_pinned_version(host):
    files = host.check_output("ls /var/cache/provision/nccl").split()
    assert [f for f in files if f.startswith("nvidia_nccl_cu12-2.21.5-") and f.endswith(".whl")], files


def test_prefix_layout(host):
    assert host.file(f"{PREFIX}/include/nccl.h").exists
    lib = host.file(f"{PREFIX}/lib/libnccl.so.2")
    assert lib.is_symlink and lib.exists
    assert host.file(f"{PREFIX}/lib/libnccl.so").linked_to == f"{PREFIX}/wheel/nvidia/nccl/lib/libnccl.so.2"


def test_header_is_the_pinned_version(host):
    header = host.file(f"{PREFIX}/include/nccl.h").content_string
    assert "#define NCCL_MAJOR 2" in header
    assert "#define NCCL_MINOR 21" in header
    assert "#define NCCL_PATCH 5" in header


def test_ld_so_conf_and_cache(host):
    conf = host.file("/etc/ld.so.conf.d/nccl.conf")
    assert conf.mode == 0o644
    assert f"{PREFIX}/lib" in conf.content_string.splitlines()
    cache = host.check_output("ldconfig -p")
    assert f"libnccl.so.2 (libc6,x86-64) => {PREFIX}/lib/libnccl.so.2" in cache


def test_pkg_config(host):
    assert host.check_output("pkg-config --modversion nccl") == "2.21.5"
    assert host.check_output("pkg-config --cflags nccl").strip() == f"-I{PREFIX}/include"
    assert host.check_output("pkg-config --libs nccl").strip() == f"-L{PREFIX}/lib -lnccl"


def test_role_smoke_program_prints_pinned_version(host):
    smoke = host.check_output("ls /usr/local/share/provision/nccl-smoke/").split()
    binaries = [b for b in smoke if b.startswith("nccl-version-2.21.5-cuda12-")]
    assert len(binaries) == 1, smoke
    out = host.check_output("/usr/local/share/provision/nccl-smoke/%s", binaries[0])
    assert out.startswith("NCCL 2.21.5 (code 22105"), out


def test_program_built_with_pkg_config_runs(host):
    host.run("rm -rf /tmp/nccl-verify && mkdir -p /tmp/nccl-verify")
    host.run(f"cat > /tmp/nccl-verify/v.c <<'EOF'\n{PROGRAM}\nEOF")
    build = host.run("gcc -o /tmp/nccl-verify/v /tmp/nccl-verify/v.c $(pkg-config --cflags --libs nccl)")
    assert build.rc == 0, build.stderr
    # found through ld.so.conf, no LD_LIBRARY_PATH
    assert host.check_output("/tmp/nccl-verify/v") == "22105"


def test_nccl_tests_not_built_without_gpu(host):
    assert not host.file("/opt/nccl-tests").exists
