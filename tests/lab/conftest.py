"""The VM lab's tests import tests/emulators and tests/lab as packages from tests/.

The lab's network namespace is one for the whole session. test_lab.py runs first: it builds
the lab manifest's node image and deploy ramdisk through its apt proxy (the host's end of the
management bridge) beside the guests' boots and first apply, where the host's cores have
room (the emulated guests run one thread each); the image tests then find that very image
in the cache and check it, instead of building it on the lab's critical path.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from lab.labvm import Netns, kill_stale, lab_netns, leftovers  # noqa: E402

APT_CACHE = "http://127.0.0.1:3142/acng-report.html"  # tests/testbed/setup.sh's apt-cacher-ng


def _apt_cache_answers() -> bool:
    try:
        with urllib.request.urlopen(APT_CACHE, timeout=5):
            return True
    except OSError:
        return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_lab.py's tests first (stable: the order within each file is kept)."""
    items.sort(key=lambda item: item.path.name != "test_lab.py" if item.path.parent == HERE else False)


@pytest.fixture(scope="session")
def lab_network() -> Iterator[Netns]:
    """The lab's namespace and bridges (root only), deleted at the end of the session."""
    if os.geteuid() != 0:
        pytest.skip("the VM lab needs root (network namespaces, taps)")
    if not _apt_cache_answers():
        # every image and guest reaches its packages through it: without it the lab fails
        # twenty minutes later in some apt task of some guest
        pytest.fail(f"the test bed's apt cache does not answer ({APT_CACHE}): run tests/testbed/setup.sh")
    netns = lab_netns()
    killed = kill_stale(netns.name)
    if killed:
        print(f"[lab] stopped leftovers of an earlier run: {', '.join(killed)}")
    netns.create()
    try:
        yield netns
    finally:
        if os.environ.get("LAB_KEEP") == "1":
            print(f"[lab] LAB_KEEP=1: namespace {netns.name} left; clean up with: ip netns del {netns.name}")
        else:
            netns.delete()
            left = leftovers(netns)
            assert not left, f"the lab's teardown left behind: {', '.join(left)}"
