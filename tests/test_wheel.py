"""The wheel carries what `provision` runs: build it, install it into fresh virtual
environments (Debian 12's /usr/bin/python3, and a Python >= 3.12 when one is found), and
from a folder outside the source tree, with PROVISION_HOME unset, run --version, validate,
inventory and plan of the example cluster, and a syntax check of the installed site.yml
against the generated inventory.

Stage `wheel` of scripts/test.sh (markers wheel + slow; the unit stage leaves it out). It
needs the network or a warm pip cache (~/.cache/pip): the installs resolve ansible-core and
the `ansible` bundle like an operator's `pip install` does. Every step prints its time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.wheel, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")
EXAMPLE = ROOT / "examples" / "llm-200k.yaml"
NODES = ["head01", "gpu01", "gpu02", "gpu03", "gpu04"]

# seconds per step (a cold pip cache downloads ansible, ~50 MB, and unpacks ~40k files)
BUILD_TIMEOUT = 600
VENV_TIMEOUT = 180
INSTALL_TIMEOUT = 1200
COMMAND_TIMEOUT = 120


def say(message: str) -> None:
    """Progress and timings on the terminal, also under pytest's capture."""
    stream = sys.__stdout__ or sys.stdout
    stream.write(f"[wheel] {message}\n")
    stream.flush()


def run(argv: list[str | Path], *, timeout: float, what: str, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    try:
        result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                                timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what}: no result after {timeout:.0f} s: {' '.join(map(str, argv))}")
    say(f"{what}: {time.monotonic() - start:.1f} s")
    assert result.returncode == 0, f"{what} failed (rc {result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def python_version(python: str | Path) -> tuple[int, int] | None:
    """(major, minor) of an interpreter that really runs (a pyenv shim may only complain)."""
    try:
        out = subprocess.run([str(python), "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    return (int(parts[0]), int(parts[1])) if out.returncode == 0 and len(parts) == 2 else None


def newer_python() -> Path | None:
    """The newest Python >= 3.12 on PATH or in pyenv (ansible-core 2.20+ needs 3.12)."""
    candidates: list[Path] = []
    for name in ("python3.14", "python3.13", "python3.12"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(found))
    pyenv = shutil.which("pyenv")
    if pyenv:
        out = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30, check=False)
        versions = Path(out.stdout.strip()) / "versions"
        if out.returncode == 0 and versions.is_dir():
            candidates += sorted(versions.glob("3.1[2-9]*/bin/python3"), reverse=True)
    best: tuple[tuple[int, int], Path] | None = None
    for candidate in candidates:
        version = python_version(candidate)
        if version is not None and version >= (3, 12) and (best is None or version > best[0]):
            best = (version, candidate)
    return best[1] if best else None


def can_make_venvs(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import venv, ensurepip"], capture_output=True,
                          timeout=30, check=False).returncode == 0


def clean_env(venv: Path) -> dict[str, str]:
    """An operator's shell with the new venv first on PATH: no PROVISION_HOME, no dev venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROVISION_HOME", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    dev_bin = str(ROOT / ".venv" / "bin")
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != dev_bin]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["ANSIBLE_NOCOLOR"] = "1"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel, built from a copy of the working tree (tracked and untracked, not ignored
    files), so no earlier build/ folder can leak stale modules into it."""
    src = tmp_path_factory.mktemp("src")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = ROOT / rel
        if source.is_file():  # a deleted but still tracked file is skipped
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, src / rel)
    out = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", out, src], timeout=BUILD_TIMEOUT,
                what="build the wheel")
    # the build backend's own warnings (issue 27 item 17: setuptools' "project.license as a
    # TOML table is deprecated" banners on every install)
    shown = built.stdout + built.stderr
    assert "DeprecationWarning" not in shown and "is deprecated" not in shown, shown[-4000:]
    wheels = list(out.glob("provisioner-*.whl"))
    assert len(wheels) == 1, wheels
    yield wheels[0]


def interpreters() -> list[Any]:
    newer = newer_python()
    return [
        pytest.param(SYSTEM_PYTHON, id="system-python3"),
        pytest.param(newer, id="python3.12+",
                     marks=pytest.mark.skipif(newer is None, reason="no Python >= 3.12 on PATH or in pyenv")),
    ]


@pytest.mark.parametrize("python", interpreters())
def test_installed_wheel_validates_plans_and_finds_its_playbooks(
    python: Path, wheel: Path, tmp_path: Path
) -> None:
    if not can_make_venvs(python):
        pytest.fail(f"{python} cannot create virtual environments (no venv/ensurepip): install the Debian "
                    f"package python3-venv (apt-get install python3-venv)")
    version = python_version(python)
    assert version is not None
    say(f"{python} (Python {version[0]}.{version[1]})")
    venv = tmp_path / "venv"
    run([python, "-m", "venv", venv], timeout=VENV_TIMEOUT, what="create the venv")
    # the pip cache stays on: a second run installs from it
    run([venv / "bin" / "python", "-m", "pip", "install", "-q", wheel], timeout=INSTALL_TIMEOUT,
        what="pip install the wheel")

    work = tmp_path / "operator"  # outside the source tree
    work.mkdir()
    manifest = work / "llm-200k.yaml"
    shutil.copy(EXAMPLE, manifest)
    env = clean_env(venv)
    provision = venv / "bin" / "provision"

    def cmd(*args: str | Path, what: str) -> subprocess.CompletedProcess[str]:
        return run([provision, *args], cwd=work, env=env, timeout=COMMAND_TIMEOUT, what=what)

    line = cmd("--version", what="provision --version").stdout.strip()
    match = re.fullmatch(r"provision (\S+) \(ansible-core (\d+)\.(\d+)\.\S+, ansible (\d+)\.\S+, python (\S+)\)", line)
    assert match, line
    core = (int(match[2]), int(match[3]))
    assert match[5].startswith(f"{version[0]}.{version[1]}.")
    if version < (3, 12):
        assert core == (2, 19), line  # the newest ansible-core that runs on Python 3.11
    else:
        assert (2, 20) <= core < (2, 22), line
    assert 12 <= int(match[4]) < 15, line

    out = cmd("validate", manifest, what="provision validate").stdout
    assert f"{manifest}: OK: cluster llm200k, 5 nodes" in out

    out = cmd("inventory", manifest, "--out", "inv", what="provision inventory").stdout
    assert re.search(r"wrote \d+ files to inv", out), out
    hosts = json.loads((work / "inv" / "hosts.json").read_text())
    assert sorted(hosts["all"]["hosts"]) == sorted(NODES), hosts

    plan = json.loads(cmd("plan", manifest, "--json", what="provision plan").stdout)
    assert [n["name"] for n in plan["nodes"]] == NODES
    plays = {n["name"]: n["plays"] for n in plan["nodes"]}
    assert "zfs" in plays["head01"] and "nvidia_driver" in plays["gpu01"], plays
    assert all("common" in p and "slurm" in p for p in plays.values()), plays

    # the playbooks and roles apply would run: installed in the venv, not the source tree
    where = run([venv / "bin" / "python", "-c",
                 "import json; from provisioner.content import ansible_paths, project_root; "
                 "r = project_root(); print(json.dumps({'root': str(r), 'env': ansible_paths(r)}))"],
                cwd=work, env=env, timeout=COMMAND_TIMEOUT, what="find the installed content")
    found = json.loads(where.stdout)
    root = Path(found["root"])
    assert root.is_relative_to(venv) and root.parts[-3:] == ("ansible_collections", "provisioner", "cluster"), root
    assert (root / "galaxy.yml").is_file() and (root / "meta" / "runtime.yml").is_file()
    checked = run([venv / "bin" / "ansible-playbook", "--syntax-check", "-i", work / "inv",
                   root / "playbooks" / "site.yml"], cwd=work, env={**env, **found["env"]},
                  timeout=COMMAND_TIMEOUT, what="ansible-playbook --syntax-check")
    assert f"playbook: {root / 'playbooks' / 'site.yml'}" in checked.stdout
