"""Helpers of the GPU suite (tests/gpu), imported as a module from this folder (pytest runs
with --import-mode=importlib; conftest.py puts the folder on sys.path)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
HERE = Path(__file__).parent


def run(argv: Sequence[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """A bounded command; its output is in the assertion message when the test fails."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    driver: str
    uuid: str
    memory_total_mib: int


SMI_FIELDS = "index,name,driver_version,uuid,memory.total"


def parse_smi(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits``."""
    rows = []
    for line in text.splitlines():
        if line.strip():
            index, name, driver, uuid, memory = (c.strip() for c in line.split(","))
            rows.append(Gpu(int(index), name, driver, uuid, int(memory)))
    return rows


def header_version(include: Path) -> str:
    """NCCL_MAJOR.NCCL_MINOR.NCCL_PATCH of nccl.h."""
    text = (include / "nccl.h").read_text()
    parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    assert all(parts), "nccl.h defines no NCCL_MAJOR/MINOR/PATCH"
    return ".".join(p.group(1) for p in parts if p)


def role_task(role: str, tasks_file: str, name_start: str) -> dict[str, Any]:
    """The task of ``roles/<role>/tasks/<tasks_file>`` whose name starts with ``name_start``
    (blocks searched too)."""
    def walk(tasks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for t in tasks:
            yield t
            for key in ("block", "rescue", "always"):
                yield from walk(t.get(key, []))

    for task in walk(yaml.safe_load((ROLES / role / "tasks" / tasks_file).read_text())):
        if str(task.get("name", "")).startswith(name_start):
            return task
    raise AssertionError(f"roles/{role}/tasks/{tasks_file} has no task named {name_start!r}...")


def role_argv(role: str, tasks_file: str, name_start: str, variables: dict[str, Any]) -> list[str]:
    """The ``ansible.builtin.command`` argv of a role task, rendered with ``variables`` (Jinja2,
    undefined names are errors): what the role would run, with our paths."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    argv = role_task(role, tasks_file, name_start)["ansible.builtin.command"]["argv"]
    if isinstance(argv, str):  # one expression that yields the whole list
        rendered = env.from_string(argv).render(**variables).strip()
        value = yaml.safe_load(rendered)
        assert isinstance(value, list), rendered
        return [str(v) for v in value]
    return [env.from_string(str(a)).render(**variables) for a in argv]


def local_manifest(node: str, model: str, count: int, branch: str, cuda: str, nccl: str,
                   verify: dict[str, Any] | None = None) -> dict[str, Any]:
    """A one-node manifest describing this machine (head and compute, its GPUs, driver branch,
    CUDA and NCCL), for verify's checks of the local node. Loopback addresses only: the suite
    runs the node's own commands here and sends nothing anywhere."""
    return {
        "version": 1,
        "cluster": {"name": "gpusuite", "domain": "gpusuite.internal", "ntp_servers": ["127.0.0.1"],
                    "admin_users": [{"name": "ops", "ssh_keys": [
                        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2kqf7m7pIo2l8ZpZ5o0rC8m9Qf3c4C3QWv8wq0m2nA ops@gpu"]}]},
        "networks": {"management": {"cidr": "127.0.0.0/24"}},
        "nodes": [{
            "name": node, "roles": ["head", "compute"], "os": "ubuntu-24.04",
            "interfaces": {"management": {"ip": "127.0.0.1", "interface": "lo"}},
            "hardware": {"cpu": {"cores_per_socket": 1}, "memory_gb": 1,  # no check reads them
                         "gpu": {"model": model, "count": count}},
        }],
        "slurm": {"enabled": False},
        "software": {"nvidia_driver": {"branch": branch}, "cuda": {"versions": [cuda]},
                     "nccl": {"version": nccl, "source": "pypi"}},
        "verify": verify or {},
    }


CUDA_HEADERS = Path("/usr/local/cuda/include/cuda_runtime.h")  # where the role looks for them


def build_smoke(nccl_prefix: Path, folder: Path) -> Path:
    shutil.copy(ROLES / "nccl" / "files" / "nccl_version.c", folder / "nccl_version.c")
    binary = folder / "nccl-version-gpu-suite"
    argv = role_argv("nccl", "smoke.yml", "Build the smoke program", {
        "__nccl_smoke_bin": str(binary), "nccl_smoke_dir": str(folder), "__nccl_prefix": str(nccl_prefix),
        "__nccl_libdir": str(nccl_prefix / "lib"), "__nccl_cuda_headers": {"stat": {"exists": CUDA_HEADERS.is_file()}},
    })
    built = run(argv, 300)
    assert built.returncode == 0, f"{argv}\n{built.stdout}{built.stderr}"
    return binary


def linked(nccl_prefix: Path) -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": f"{nccl_prefix / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}"}


def build_nccl_tests(tarball: Path, nccl_prefix: Path, cuda_home: Path, folder: Path) -> Path:
    with tarfile.open(tarball) as tar:
        tar.extractall(folder, filter="data")
    (src,) = (p for p in folder.iterdir() if (p / "Makefile").is_file())
    argv = role_argv("nccl", "tests.yml", "Build all_reduce_perf", {
        "__nccl_tests_src": str(src), "__nccl_prefix": str(nccl_prefix), "__nccl_libdir": str(nccl_prefix / "lib"),
        "ansible_facts": {"processor_vcpus": os.cpu_count() or 4},
    })
    # the role builds with CUDA_HOME=/usr/local/cuda; this machine's toolkit may live elsewhere
    argv = [f"CUDA_HOME={cuda_home}" if a.startswith("CUDA_HOME=") else a for a in argv]
    if os.environ.get("NCCL_TESTS_NVCC_GENCODE"):  # one architecture instead of six: a shorter build
        argv.append(f"NVCC_GENCODE={os.environ['NCCL_TESTS_NVCC_GENCODE']}")
    built = run(argv, 900)
    assert built.returncode == 0, f"{argv}\n{built.stdout[-3000:]}{built.stderr[-3000:]}"
    binary = src / "build" / "all_reduce_perf"
    assert binary.is_file(), built.stdout[-2000:]
    return binary


def nvcc_release(cuda_home: Path) -> str:
    """The toolkit's release (``13.0``) as its nvcc says."""
    proc = run([str(cuda_home / "bin" / "nvcc"), "--version"], 60)
    m = re.search(r"release (\d+\.\d+)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    return m.group(1)
