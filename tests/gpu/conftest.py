"""The GPU suite (``pytest -m gpu tests/gpu``): our GPU-facing code against the real GPUs of
the machine it runs on. Without a GPU (CI, containers) every test says SKIP and why.

What each fixture finds, and where it looks:

* ``gpus``: ``nvidia-smi``'s GPUs (the driver answers), else SKIP.
* ``cuda_home``: the CUDA toolkit (``$CUDA_HOME``, ``/usr/local/cuda``, the ``nvcc`` on PATH).
* ``nccl_prefix``: an NCCL prefix laid out as the nccl role lays out its PyPI source (include/,
  lib/libnccl.so.2, lib/libnccl.so) from ``$NCCL_HOME``, the OS's libnccl-dev, or the
  ``nvidia-nccl-cuXX`` wheel in this Python.
* ``nccl_tests_tarball``: nccl-tests' release source (``$NCCL_TESTS_TARBALL``): GitHub, where
  the role downloads it from, is unreachable from our test machines.

Build steps use the roles' own command lines, read from their task files
(:func:`role_argv`), so the suite builds what the roles build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from gpukit import SMI_FIELDS, Gpu, build_nccl_tests, build_smoke, parse_smi, run  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def gpus() -> list[Gpu]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("no nvidia-smi on PATH: no NVIDIA driver on this machine")
    try:
        proc = run([smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"], 60)
    except subprocess.TimeoutExpired:
        pytest.fail("nvidia-smi did not answer within 60 s (a hung driver?)")
    if proc.returncode != 0:
        pytest.skip(f"nvidia-smi found no usable GPU: {(proc.stdout + proc.stderr).strip()[:300]}")
    found = parse_smi(proc.stdout)
    if not found:
        pytest.skip("nvidia-smi lists no GPU")
    return found


@pytest.fixture(scope="session")
def cuda_home(gpus: list[Gpu]) -> Path:
    candidates = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for c in candidates:
        if c and (Path(c) / "bin" / "nvcc").is_file() and (Path(c) / "include" / "cuda_runtime.h").is_file():
            return Path(c)
    pytest.skip("no CUDA toolkit (nvcc and cuda_runtime.h) in $CUDA_HOME, /usr/local/cuda or on PATH")


def _wheel_nccl() -> Path | None:
    """The ``nvidia-nccl-cuXX`` wheel's folder (nvidia/nccl) in this Python, if installed."""
    try:
        import nvidia.nccl  # type: ignore[import-not-found]
    except ImportError:
        return None
    for base in list(getattr(nvidia.nccl, "__path__", [])):
        if (Path(base) / "include" / "nccl.h").is_file():
            return Path(base)
    return None


def _nccl_sources() -> Iterator[tuple[Path, Path]]:
    """(include folder, folder with libnccl.so.2), in order of preference."""
    if os.environ.get("NCCL_HOME"):
        home = Path(os.environ["NCCL_HOME"])
        yield home / "include", home / "lib"
    for libdir in (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib/aarch64-linux-gnu"), Path("/usr/lib64")):
        yield Path("/usr/include"), libdir
    wheel = _wheel_nccl()
    if wheel is not None:
        yield wheel / "include", wheel / "lib"


@pytest.fixture(scope="session")
def nccl_prefix(gpus: list[Gpu], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prefix in the nccl role's PyPI layout (roles/nccl/tasks/pypi.yml) linking the NCCL found."""
    for include, lib in _nccl_sources():
        if (include / "nccl.h").is_file() and (lib / "libnccl.so.2").exists():
            prefix = tmp_path_factory.mktemp("nccl")
            (prefix / "include").symlink_to(include)
            (prefix / "lib").mkdir()
            (prefix / "lib" / "libnccl.so.2").symlink_to(lib / "libnccl.so.2")
            (prefix / "lib" / "libnccl.so").symlink_to("libnccl.so.2")
            return prefix
    pytest.skip("no NCCL: set NCCL_HOME, or install libnccl-dev or the nvidia-nccl-cuXX wheel")


@pytest.fixture(scope="session")
def nccl_tests_tarball(gpus: list[Gpu]) -> Path:
    path = os.environ.get("NCCL_TESTS_TARBALL", "")
    if not path or not Path(path).is_file():
        pytest.skip("no nccl-tests source: set NCCL_TESTS_TARBALL to its release tarball "
                    "(the role downloads it from GitHub, which our test machines cannot reach)")
    return Path(path)


@pytest.fixture(scope="session")
def nccl_smoke(nccl_prefix: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The nccl role's smoke program, built with the role's command against ``nccl_prefix``."""
    return build_smoke(nccl_prefix, tmp_path_factory.mktemp("nccl-smoke"))


@pytest.fixture(scope="session")
def all_reduce_perf(nccl_tests_tarball: Path, nccl_prefix: Path, cuda_home: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nccl-tests' all_reduce_perf, built with the nccl role's make command line."""
    return build_nccl_tests(nccl_tests_tarball, nccl_prefix, cuda_home, tmp_path_factory.mktemp("nccl-tests"))
