"""provisioner.areas.common.checks: what the common role cannot enforce."""

from __future__ import annotations

from typing import Any


def test_a_root_key_list_that_cannot_be_enforced_is_a_warning_at_admin_users(kit: Any) -> None:
    data = kit.base()
    data["cluster"]["admin_users"][0]["sudo"] = False
    text = kit.dump(data)
    loaded = kit.load(text)
    warnings = [d for d in loaded.warnings if d.path == "cluster.admin_users"]
    assert len(warnings) == 1
    assert "leaves root's authorized_keys as they are" in warnings[0].message
    assert warnings[0].line == kit.line_of(text, "admin_users:")
    data["cluster"]["admin_users"][0]["sudo"] = True
    assert not [d for d in kit.load(data).warnings if d.path == "cluster.admin_users"]
