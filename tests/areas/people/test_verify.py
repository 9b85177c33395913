"""provisioner.areas.people.verify: the ``users`` check's command, parser and verdict."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.areas.people import verify
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
