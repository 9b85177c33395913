"""The VM lab's tests import tests/emulators and tests/lab as packages from tests/.

The lab's network namespace is one for the whole session: the image tests build the lab
manifest's node image through its apt proxy (the host's end of the management bridge), so
test_lab.py's apply finds that image in the cache instead of building it a second time.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
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
