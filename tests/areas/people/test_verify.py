"""provisioner.areas.people.verify: the ``users`` check's command, parser and verdict."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.areas.people import verify
from provisioner.nodecheck.check import Output
from provisioner.nodecheck.parsers import ParseError

# what getent printed on the molecule slurm scenario's nodes (Debian 12)
GETENT = """alice:x:2001:3000:Alice Example:/home/alice:/bin/bash
bob:x:2002:2002::/home/bob:/bin/bash
vision:x:3000:bob
bob:x:2002:
"""


def _manifest(kit: Any) -> Any:
    data: dict[str, Any] = kit.base()
    data["groups"] = [{"name": "vision", "gid": 3000}]
    data["users"] = [{"name": "alice", "uid": 2001, "group": "vision", "comment": "Alice Example"},
                     {"name": "bob", "uid": 2002, "groups": ["vision"]}]
    return kit.load(data).manifest


def test_the_check_runs_on_every_node_only_with_people(kit: Any) -> None:
    m = _manifest(kit)
    rows = [(c.node, c.name, c.command.text) for n in m.nodes for c in verify.checks(m)(n, "")]
    assert rows == [(n, "users", "getent passwd alice bob; getent group vision; true")
                    for n in ("head01", "node01", "node02")]
    plain = kit.load(kit.base()).manifest
    assert [c for n in plain.nodes for c in verify.checks(plain)(n, "")] == []


def test_the_manifests_ids_pass(kit: Any) -> None:
    m = _manifest(kit)
    found = verify.parse_getent(GETENT)
    assert found.users["alice"] == (2001, 3000, "/home/alice") and found.groups == {"vision": 3000, "bob": 2002}
    assert verify.ids_verdict(m)(found).status == "PASS"


def test_a_missing_user_or_a_wrong_id_fails_naming_it(kit: Any) -> None:
    m = _manifest(kit)
    text = GETENT.replace("alice:x:2001:3000", "alice:x:2001:100").replace("vision:x:3000:bob\n", "")
    outcome = verify.ids_verdict(m)(verify.parse_getent(text))
    assert outcome.status == "FAIL"
    assert outcome.detail == "alice is uid 2001 gid 100 home /home/alice, not 2001 3000 /home/alice; no group vision"
    outcome = verify.ids_verdict(m)(verify.parse_getent("bob:x:2002:2002::/home/bob:/bin/bash\n"))
    assert outcome.detail.startswith("no user alice")


def test_output_that_is_not_getent_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="not a passwd or group line"):
        verify.parse_getent("getent: command not found\n")
    with pytest.raises(ParseError, match="not a number"):
        verify.parse_getent("alice:x:two:3000:::\n")


# --------------------------------------------------------------------------- identity sssd
# A Debian 12 container with sssd 2.8.2 (sssd-ldap, libnss-sss) pointed at a directory that
# does not answer: `getent -s sss` printed nothing and exited 2 for a user and a group, and
# `sssctl domain-status directory -o` said "Unable to connect to system bus!" (it asks
# sssd's InfoPipe over D-Bus, which a node need not run: hence a lookup, not sssctl)
UNREACHABLE = "active\nsssd rc=0\npasswd rc=2\ngroup rc=2\n"
# what sssd answered for carol in the molecule common scenario (its slapd, StartTLS)
CAROL = "carol:*:10007:10007:Carol Directory:/home/carol:/bin/bash"


def _directory(kit: Any, users: list[dict[str, Any]], **sssd: Any) -> Any:
    data: dict[str, Any] = kit.base()
    data["identity"] = {"provider": "sssd", "sssd": {
        "uris": ["ldap://ldap.example.org"], "search_base": "dc=example,dc=org",
        "ca_file": "/etc/provision/ldap-ca.pem", "id_range": {"first": 10000, "last": 19999}, **sssd}}
    data["users"] = users
    return kit.load(data)


def test_the_directory_is_probed_even_when_the_manifest_names_nobody_from_it(kit: Any) -> None:
    """identity sssd with no directory person: the users check has nothing to look up, so
    ``identity.directory`` runs on every node anyway, looking up identity.sssd.probe."""
    loaded = _directory(kit, [], probe="hpc-users")
    m = loaded.manifest
    rows = [(c.node, c.name) for n in m.nodes for c in verify.checks(m)(n, "")]
    assert rows == [(n, "identity.directory") for n in ("head01", "node01", "node02")]
    check = verify.checks(m)(m.nodes[0], "")[0]
    text = check.command.text  # type: ignore[union-attr]
    assert text.startswith("systemctl is-active sssd;")
    assert "timeout 20 getent -s sss passwd hpc-users;" in text and "timeout 20 getent -s sss group hpc-users;" in text
    assert not [w for w in loaded.warnings if w.path == "identity.sssd"]
    # a group the directory holds: the user lookup found nothing, the group one its line
    passed = check.judge(Output(stdout="active\nsssd rc=0\npasswd rc=2\nhpc-users:*:10100:carol,dave\ngroup rc=0\n"))
    assert (passed.status, passed.detail) == (
        "PASS", "sssd runs; group hpc-users (gid 10100) resolves from the directory")


def test_an_unreachable_directory_or_a_stopped_sssd_fails(kit: Any) -> None:
    m = _directory(kit, [], probe="hpc-users").manifest
    judge = verify.checks(m)(m.nodes[0], "")[0].judge
    down = judge(Output(stdout=UNREACHABLE))
    assert (down.status, down.detail) == (
        "FAIL", "sssd does not know hpc-users: the directory is unreachable (network, TLS, bind) or lacks it")
    hung = judge(Output(stdout="active\nsssd rc=0\npasswd rc=124\n"))
    assert hung.status == "FAIL" and "took over 20 s" in hung.detail
    stopped = judge(Output(stdout="inactive\nsssd rc=3\npasswd rc=2\ngroup rc=2\n"))
    assert (stopped.status, stopped.detail) == ("FAIL", "sssd is inactive, not running: nobody from the directory "
                                                        "can log in")
    assert judge(Output(stdout="systemctl: command not found\n")).status == "FAIL"  # no "sssd rc=": unparsable


def test_the_first_directory_person_is_looked_up_without_a_probe(kit: Any) -> None:
    m = _directory(kit, [{"name": "carol"}, {"name": "dave"}]).manifest
    check = next(c for c in verify.checks(m)(m.nodes[0], "") if c.name == "identity.directory")
    assert "getent -s sss passwd carol;" in check.command.text  # type: ignore[union-attr]
    ok = check.judge(Output(stdout=f"active\nsssd rc=0\n{CAROL}\npasswd rc=0\n"))
    assert (ok.status, ok.detail) == ("PASS", "sssd runs; user carol (uid 10007) resolves from the directory")
    # sssd itself keeps to id_range; an answer outside it is not the directory's person
    low = check.judge(Output(stdout="active\nsssd rc=0\ncarol:*:2500:2500::/home/carol:/bin/sh\npasswd rc=0\n"))
    assert low.status == "FAIL" and "outside the directory's id_range 10000..19999" in low.detail


def test_without_anyone_to_look_up_verify_skips_and_validate_warns(kit: Any) -> None:
    loaded = _directory(kit, [])
    warned = [w for w in loaded.warnings if w.path == "identity.sssd"]
    assert len(warned) == 1 and "name a user or group the directory always holds" in warned[0].message
    check = verify.checks(loaded.manifest)(loaded.manifest.nodes[0], "")[0]
    assert check.command.text == 'systemctl is-active sssd; echo "sssd rc=$?"'  # type: ignore[union-attr]
    skipped = check.judge(Output(stdout="active\nsssd rc=0\n"))
    assert skipped.status == "SKIP" and "nothing to look up" in skipped.detail
    assert check.judge(Output(stdout="failed\nsssd rc=3\n")).status == "FAIL"
