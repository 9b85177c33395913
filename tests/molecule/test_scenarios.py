"""Run every molecule scenario (create, converge, idempotence, verify, destroy) under pytest.

Each scenario under molecule/<name>/ becomes one test; its full log goes to
.cache/molecule-logs/<name>.log and the tail is shown on failure. A scenario is named after
its area (docs/design.md): molecule/<area> or molecule/<area>-<part>.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The order the stage runs them in, two at a time (pytest -n 2 --dist worksteal,
# scripts/test.sh). worksteal gives each worker half of the collected tests in this order
# (the first worker this module's two quick checks and the first five scenarios, the second
# the other eight), and a worker that runs dry takes half of the other's queue: the halves are
# balanced by their seconds in a fresh run (2 cores, 2026-11-27: slurm 719, monitoring 271,
# baremetal 162, storage-mergerfs 161, gpu-docker 159 = 1472 s; gpu-cuda 410, common 347,
# storage-zfs 150, storage-scratch 142, gpu-driver 142, fabric 136, gpu-nccl 135,
# storage-nfs 119 = 1581 s). The order before put slurm and gpu-cuda, the two longest, in one
# half: 1741 s for the stage. A new scenario goes last until measured.
_ORDER = [
    "slurm", "monitoring", "baremetal", "storage-mergerfs", "gpu-docker",
    "gpu-cuda", "common", "storage-zfs", "storage-scratch", "gpu-driver", "fabric", "gpu-nccl", "storage-nfs",
]
SCENARIOS = sorted(
    (p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml")),
    key=lambda s: (_ORDER.index(s) if s in _ORDER else len(_ORDER), s),
)
LOGS = ROOT / ".cache" / "molecule-logs"
IMAGE = "localhost/provision-base:bookworm"
SHIM = Path(__file__).resolve().parent / "bin"

pytestmark = [pytest.mark.container, pytest.mark.molecule, pytest.mark.slow]


def _testbed_missing() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (run tests/testbed/setup.sh)"
    probe = subprocess.run(["podman", "image", "exists", IMAGE], check=False)
    return None if probe.returncode == 0 else f"{IMAGE} is missing (run tests/testbed/setup.sh)"


def _scenario_text(scenario: str) -> str:
    """Every playbook of a scenario plus the project playbooks it imports."""
    texts = [p.read_text() for p in (ROOT / "molecule" / scenario).glob("*.yml")]
    imported = re.findall(r"import_playbook:\s*['\"]?([^'\"\s]+)", " ".join(texts))
    for rel in imported:
        path = (ROOT / "molecule" / scenario / rel).resolve()
        if path.is_file():
            texts.append(path.read_text())
    return "\n".join(texts)


def test_every_role_has_a_scenario() -> None:
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").is_file())
    covered = set(SCENARIOS)
    text = "\n".join(_scenario_text(s) for s in SCENARIOS)
    used = set(re.findall(r"\b(?:role|name):[ \t]*([a-z_]+)", text))
    used |= set(re.findall(r"^\s*-\s*([a-z_]+)\s*$", text, re.M))
    missing = [r for r in roles if r not in covered and r not in used]
    assert missing == [], f"roles without a molecule scenario: {missing}"


def test_every_scenario_is_named_after_its_area() -> None:
    from provisioner.areas.registry import AREAS

    areas = {area.name for area in AREAS}
    strays = [s for s in SCENARIOS if s.split("-", 1)[0] not in areas]
    assert strays == [], f"scenarios not named <area> or <area>-<part> (areas: {sorted(areas)}): {strays}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: str) -> None:
    reason = _testbed_missing()
    if reason:
        pytest.skip(reason)
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{scenario}.log"
    venv_bin = ROOT / ".venv" / "bin"
    # bin/ansible-playbook first: the roles' plays under MOLECULE_STRATEGY (see there)
    env = dict(os.environ, PATH=f"{SHIM}:{venv_bin}:{os.environ.get('PATH', '')}", ANSIBLE_FORCE_COLOR="0",
               PY_COLORS="0")
    start = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run([str(venv_bin / "molecule"), "test", "-s", scenario], cwd=ROOT, env=env,
                              stdout=fh, stderr=subprocess.STDOUT, check=False)
    took = time.monotonic() - start
    print(f"molecule {scenario}: {took:.0f}s, rc {proc.returncode}, log {log}")
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-150:])
        pytest.fail(f"molecule test -s {scenario} failed (rc {proc.returncode}) after {took:.0f}s:\n{tail}")
