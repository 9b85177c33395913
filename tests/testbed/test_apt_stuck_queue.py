"""apt's update cannot stall for good in the test bed or on a node: the apt.conf snippet
that tests/testbed/setup.sh bakes into the base image, and the one the common role writes
to every node, are run against a fake mirror that makes apt 2.3.7-3.0.2 stop for ever (a
retried item delayed behind a new one; LP: #2003851).

The host's apt runs in a private root (no container, no root needed): the test bed host is
Debian 12, whose apt 2.6.1 is the image's. tests/testbed/README.md has the analysis;
tests/testbed/apt_stuck_queue.py the fake mirror and the evidence of a stall.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

HERE = Path(__file__).resolve().parent
COMMON = HERE.parents[1] / "roles" / "common"
SCRIPT = HERE / "apt_stuck_queue.py"
SYSTEM_PYTHON = Path("/usr/bin/python3")

pytestmark = pytest.mark.skipif(
    shutil.which("apt-get") is None or shutil.which("dpkg") is None or not Path("/proc/self/syscall").exists(),
    reason="needs apt-get and dpkg (a Debian/Ubuntu host) and /proc",
)


def apt_version() -> str:
    return subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "apt"], capture_output=True, text=True,
                          timeout=30, check=True).stdout


def version_lt(a: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, "lt", b], timeout=30).returncode == 0


def has_stuck_queue_bug(version: str) -> bool:
    """Delayed retries came in 2.3.7; the fix in 3.0.3 and, in the 3.1 series, 3.1.10."""
    if version_lt(version, "2.3.7"):
        return False
    return version_lt(version, "3.0.3") or (not version_lt(version, "3.1~") and version_lt(version, "3.1.10"))


def image_apt_conf() -> str:
    """The apt.conf.d snippet customize_rootfs writes into the base image."""
    text = (HERE / "setup.sh").read_text()
    m = re.search(r'apt\.conf\.d/01testbed-proxy" <<\'EOF\'\n(.*?)^EOF$', text, re.S | re.M)
    assert m, "tests/testbed/setup.sh no longer writes etc/apt/apt.conf.d/01testbed-proxy"
    return m.group(1)


def common_role_apt_conf(**overrides: Any) -> str:
    """roles/common's 80provision-timeouts as the role renders it from its defaults."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on")
    variables = {**yaml.safe_load((COMMON / "defaults" / "main.yml").read_text()), **overrides}
    template = env.from_string((COMMON / "templates" / "apt-timeouts.conf.j2").read_text())
    return template.render(ansible_managed="Ansible managed", **variables)


CONFIGS: dict[str, Callable[[], str]] = {"image": image_apt_conf, "common role": common_role_apt_conf}


def probe(tmp_path: Path, conf: str, *, bound: float = 30, fail: int = 1,
          client: str = "apt-get") -> tuple[int, str]:
    path = tmp_path / "under-test.conf"
    path.write_text(conf)
    args = [sys.executable, str(SCRIPT), "--conf", str(path), "--bound", str(bound), "--fail", str(fail),
            "--client", client]
    done = subprocess.run(args, capture_output=True, text=True, timeout=bound + 60)
    return done.returncode, done.stdout + done.stderr


def requests(out: str) -> list[str]:
    line = next(x for x in out.splitlines() if x.startswith("requests: "))
    return line.removeprefix("requests: ").split(", ")


def test_apt_defaults_stall_for_good(tmp_path: Path) -> None:
    """The reproduction: with apt's own defaults (3 retries, delayed) one 503 stops apt."""
    if not has_stuck_queue_bug(apt_version()):
        pytest.skip(f"apt {apt_version()} has the fix of LP: #2003851")
    rc, out = probe(tmp_path, "", bound=5)
    assert rc == 3, out
    assert "apt-get STUCK: not finished after 5 s" in out
    # the state seen in the end-to-end stage: the method waits on apt with no timeout, its
    # socket to the proxy half-closed by the proxy; the s2 Release it was never given
    assert re.search(r"\bhttp \[/usr/lib/apt/methods/http\]: .* in pselect6 \(no timeout\)", out), out
    assert "CLOSE_WAIT" in out, out
    assert requests(out) == ["/debian/dists/s1/InRelease 503", "/debian/dists/s2/InRelease 404"]


@pytest.mark.parametrize("config", CONFIGS)
def test_apt_survives_a_transient_failure(tmp_path: Path, config: str) -> None:
    rc, out = probe(tmp_path, CONFIGS[config]())
    assert rc == 0, out
    log = requests(out)
    assert log[:2] == ["/debian/dists/s1/InRelease 503", "/debian/dists/s2/InRelease 404"], out
    assert "/debian/dists/s1/InRelease 404" in log  # retried at once, then the rest
    for suite in ("s1", "s2"):
        assert f"/debian/dists/{suite}/main/binary-amd64/Packages 200" in log, out


@pytest.mark.parametrize("config", CONFIGS)
def test_apt_gives_up_on_a_lasting_failure(tmp_path: Path, config: str) -> None:
    """Still bounded retries: 1 + Acquire::Retries (3) tries, then a warning, no stall."""
    rc, out = probe(tmp_path, CONFIGS[config](), fail=10)
    assert rc == 0, out  # apt-get update warns about a failed index; python-apt raises
    assert requests(out).count("/debian/dists/s1/InRelease 503") == 4, out
    assert "W: Failed to fetch http://mirror.test/debian/dists/s1/InRelease  503" in out


@pytest.mark.skipif(
    subprocess.run([str(SYSTEM_PYTHON), "-c", "import apt"], capture_output=True, timeout=60).returncode != 0
    if SYSTEM_PYTHON.exists() else True,
    reason="needs the system python3 with python3-apt",
)
@pytest.mark.parametrize("config", CONFIGS)
def test_python_apt_survives_a_transient_failure(tmp_path: Path, config: str) -> None:
    """Ansible's apt module updates through python-apt's acquire loop: the same queue."""
    rc, out = probe(tmp_path, CONFIGS[config](), client="python-apt")
    assert rc == 0, out
    assert "python-apt finished" in out


def test_common_role_backoff_is_the_variable() -> None:
    assert 'Acquire::Retries::Delay "false";' in common_role_apt_conf()
    assert 'Acquire::Retries::Delay "true";' in common_role_apt_conf(common_apt_retry_backoff=True)
    assert 'Acquire::Retries "3";' in common_role_apt_conf()
