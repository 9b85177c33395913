"""Fault suite: the alert receivers' credentials (issue 27, "secrets"), through the real CLI.

A cluster on loopback whose receivers take an SMTP password and a webhook URL from the
environment and a bearer token from a file: every verb that reads the manifest, writes the
inventory or prepares a run (validate, plan, inventory, apply --check -vvv, apply -vvv; the
node refuses SSH, so Ansible itself does not run here: molecule/monitoring scans its -vvv
converge) must keep each value out of its output and out of every file it writes but the
state directory's secrets/, raw, base64 and hex.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

SECRETS = {"FAULTS_SMTP_PASSWORD": "smtp-pw-9f3c1e77d2", "FAULTS_WEBHOOK_URL": "https://hooks.test/T0/B9/x-7a41c0de"}
TOKEN = "bearer-token-55e0aa31b8"


def forms(values: list[str]) -> dict[str, bytes]:
    """Each value as a leak could carry it: as given, base64 (Ansible's file contents) and hex."""
    found: dict[str, bytes] = {}
    for value in values:
        raw = value.encode()
        found |= {f"{value} raw": raw, f"{value} base64": base64.b64encode(raw), f"{value} hex": raw.hex().encode()}
    return found


def test_alert_receivers_credentials_reach_no_output_and_no_file_but_secrets(
        write_cluster: Any, provision: Any, tmp_path: Path) -> None:
    manifest: Path = write_cluster(slurm=True)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    data = yaml.safe_load(manifest.read_text())
    data["nodes"][0]["roles"] = ["head", "compute", "services"]
    data["monitoring"] = {"receivers": [
        {"name": "chat", "webhook": {"url_env": "FAULTS_WEBHOOK_URL", "bearer_token_file": str(token)}},
        {"name": "ops", "email": {"to": ["ops@cluster.test"], "sender": "am@cluster.test", "smarthost": "127.0.0.1:25",
                                  "auth_username": "am", "auth_password_env": "FAULTS_SMTP_PASSWORD"}},
    ]}
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    scratch, out = tmp_path / "tmp", tmp_path / "inventory-out"
    scratch.mkdir()
    env = {**os.environ, **SECRETS, "TMPDIR": str(scratch)}
    said: list[tuple[str, str]] = []
    for argv in (["validate"], ["plan", "--offline", "--json"], ["inventory", "--out", str(out)],
                 ["apply", "--check", "-vvv"], ["apply", "--yes", "-vvv"]):
        r = provision(argv[0], str(manifest), *argv[1:], env=env, timeout=120)
        assert "Traceback" not in r.said and r.returncode in (0, 1), (argv, r.said)
        said.append((argv[0], r.said))
    state = manifest.parent / ".provision"
    prepared = {p.read_text().strip() for p in (state / "secrets" / "monitoring").iterdir()}
    assert prepared >= {*SECRETS.values(), TOKEN}  # apply prepared them: the scan has real needles
    needles = forms([*SECRETS.values(), TOKEN])
    found = [f"{form} in {verb}'s output" for verb, text in said for form, needle in needles.items()
             if needle in text.encode()]
    files = [p for root in (out, state, scratch) for p in root.rglob("*")
             if p.is_file() and "secrets" not in p.relative_to(root).parts]
    assert len(files) > 10 and any(p.name == "monitoring.json" for p in files), files  # inventories, runs, checks
    found += [f"{form} in {p}" for p in files for form, needle in needles.items() if needle in p.read_bytes()]
    assert found == []
