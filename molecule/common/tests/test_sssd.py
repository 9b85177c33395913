"""Issue 29: gpu01 (common-compute) joined the head's OpenLDAP through the sssd role, over
ldap:// with StartTLS verified against the run's CA (prepare.yml made slapd and the CAs)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from provisioner.areas.people import verify

WRONG_CA = (Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "ldap-wrong-ca.pem").read_text()
RIGHT_CA = (Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "ldap-ca.pem").read_text()


@pytest.fixture
def compute(host):
    if host.backend.get_hostname() != "common-compute":
        pytest.skip("only gpu01 joins the directory")
    return host


def getent(host, key: str, tries: int = 10):
    """``getent passwd key``, retried while sssd (re)connects: (rc, stdout)."""
    for _ in range(tries):
        out = host.run("timeout 10 getent passwd %s", key)
        if out.rc == 0:
            break
        time.sleep(1)
    return out.rc, out.stdout.strip()


def test_a_directory_user_resolves_with_the_manifests_home(compute):
    rc, line = getent(compute, "carol")
    assert rc == 0, line
    # the directory says /ldap-homes/carol: override_homedir puts homes under homes.path
    assert line == "carol:*:10007:10007:Carol Directory:/home/carol:/bin/bash"


def test_id_shows_the_directory_groups(compute):
    out = compute.run("timeout 10 id carol")
    assert out.rc == 0, out.stderr
    assert "uid=10007(carol)" in out.stdout and "10100(gpu-users)" in out.stdout


def test_an_entry_outside_the_id_range_is_ignored(compute):
    assert getent(compute, "low", tries=1)[0] == 2  # uid 2500: the local accounts' side


def test_pam_logs_a_directory_user_in_and_makes_the_home(compute):
    out = compute.run("timeout 20 su -s /bin/sh -c 'id -un; pwd' - dave")
    assert out.rc == 0, out.stderr
    assert out.stdout.split() == ["dave", "/home/dave"]
    home = compute.file("/home/dave")
    assert home.is_directory and home.uid == 10008 and home.gid == 10008


def test_the_config_holds_the_secret_for_root_only(compute):
    conf = compute.file("/etc/sssd/sssd.conf")
    assert (conf.user, conf.group, conf.mode) == ("root", "root", 0o600)
    assert "ldap_tls_reqcert = demand" in conf.content_string
    assert compute.file("/etc/sssd/ldap-ca.pem").content_string.strip() == RIGHT_CA.strip()
    for db in ("passwd", "group", "shadow"):
        assert compute.run("grep -E '^%s:.*\\bsss\\b' /etc/nsswitch.conf", db).rc == 0


def _probe(host, name):
    """verify's identity.directory command on the node, parsed by verify's own parser."""
    return verify.parse_directory(host.run(verify.directory_command(name)).stdout)


def test_verifys_directory_probe_on_real_sssd(compute):
    """provision verify's ``identity.directory``: a person and a group resolve through sssd
    alone, an entry outside id_range does not, and a stopped sssd is seen."""
    for _ in range(10):  # sssd may still be (re)connecting after the tests before
        carol = _probe(compute, "carol")
        if carol.found:
            break
        time.sleep(1)
    assert carol == verify.DirectoryProbe("active", ("user", 10007))
    assert _probe(compute, "gpu-users") == verify.DirectoryProbe("active", ("group", 10100))
    assert _probe(compute, "low").found is None  # uid 2500: outside id_range, sssd ignores it
    assert _probe(compute, "root").found is None  # a local account is no answer from sssd
    try:
        assert compute.run("systemctl stop sssd").rc == 0
        stopped = _probe(compute, "carol")
        assert stopped.sssd == "inactive", stopped  # its fast cache may still answer: the state decides
    finally:
        assert compute.run("systemctl start sssd").rc == 0


def _restart_with_empty_cache(host) -> None:
    # sssd answers from its cache while offline: a wrong CA is only seen with the cache gone
    assert host.run("systemctl stop sssd && rm -f /var/lib/sss/db/*.ldb && systemctl start sssd").rc == 0


def test_a_wrong_ca_fails_to_verify_the_server(compute):
    ca = "/etc/sssd/ldap-ca.pem"
    compute.run("cp %s /root/ldap-ca.pem.right", ca)
    try:
        assert compute.run("printf '%%s' %s > %s", WRONG_CA, ca).rc == 0
        _restart_with_empty_cache(compute)
        assert getent(compute, "carol", tries=3)[0] == 2  # TLS refused: nobody resolves
    finally:
        compute.run("cp /root/ldap-ca.pem.right %s", ca)
        _restart_with_empty_cache(compute)
    assert getent(compute, "carol")[0] == 0
