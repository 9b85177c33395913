"""Fault suite: a file system that refuses writes, for the verbs that write (issue 27 item 7).

The real CLI runs in a subprocess whose file size limit (RLIMIT_FSIZE, SIGXFSZ ignored)
makes the kernel refuse every write past a few bytes with EFBIG, the way a full disk
refuses with ENOSPC; this works as root, where permission bits stop nothing. Each verb must
say in one line which file it could not write, exit 1, and leave no temporary file and no
half-written state behind. (In-process, tests/test_state.py and tests/test_inventory.py
inject OSError(ENOSPC) itself.)
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml


def file_size_limit(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".tmp" in p.name or p.name.startswith("."))


def test_inventory_on_a_full_disk_names_the_file(write_cluster: Any, provision: Any, tmp_path: Path) -> None:
    out = tmp_path / "inv"
    r = provision("inventory", str(write_cluster()), "--out", str(out), preexec=file_size_limit(200))
    assert r.returncode == 1 and r.stdout == "", r.said
    assert r.stderr.startswith(f"error: cannot write the inventory in {out}: {out}/") and r.stderr.count("\n") == 1
    assert r.stderr.endswith(": File too large\n")
    assert leftovers(out) == []


@pytest.mark.parametrize(("limit", "what"), [
    (0, "cannot take the lock {state}/lock: File too large; choose another state directory with --state-dir"),
    (300, "{state}/secrets/munge.key: File too large"),  # the cluster's munge key (1024 bytes)
    (500, "cannot write the inventory in {state}/inventory: {state}/inventory/group_vars/all/baremetal.json: "
          "File too large"),
])
def test_apply_on_a_full_disk_says_which_file(write_cluster: Any, provision: Any, limit: int, what: str) -> None:
    manifest = write_cluster(slurm=True)
    state = manifest.parent / ".provision"
    if limit > 300:  # past the munge key: a cluster that has one
        (state / "secrets").mkdir(parents=True)
        (state / "secrets" / "munge.key").write_bytes(os.urandom(1024))
        (state / "secrets" / "munge.key").chmod(0o600)
    r = provision("apply", str(manifest), "--yes", preexec=file_size_limit(limit))
    assert r.returncode == 1, r.said
    assert r.stderr == "error: " + what.format(state=state) + "\n"
    assert leftovers(state) == []
    assert not (state / "state.json").exists()


@pytest.mark.parametrize("limit", [0, 3])
def test_a_dry_run_on_a_full_temporary_folder_is_one_line_and_leaves_nothing(
        write_cluster: Any, provision: Any, tmp_path: Path, limit: int) -> None:
    """apply --check makes a scratch folder in TMPDIR. With no room there it said Python's
    'No usable temporary directory found in [...]'; with room for part of the folder's mark
    (its cluster's name) it went on with a mark no later dry run recognises, so the folder
    was never pruned."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = provision("apply", str(write_cluster()), "--check", preexec=file_size_limit(limit),
                  env={**os.environ, "TMPDIR": str(scratch)})
    assert r.returncode == 1 and "Traceback" not in r.said, r.said
    if limit == 0:  # tempfile's own probe (it writes a few bytes) finds no usable folder
        assert r.stderr.startswith("error: cannot make the dry run's scratch folder: No usable temporary directory")
    else:
        assert r.stderr.startswith(f"error: cannot write {scratch}/provision-check-faults-"), r.stderr
        assert "/check.lock: only 3 of 6 bytes written;" in r.stderr
    assert r.stderr.endswith("; set TMPDIR to a writable folder with room\n") and r.stderr.count("\n") == 1
    assert list(scratch.iterdir()) == []


def test_image_build_on_a_full_disk_names_the_cache_file(write_cluster: Any, provision: Any, tmp_path: Path) -> None:
    """A named image whose download the cache's disk refused was said as 'cannot fetch the
    image URL: [Errno 27] File too large', as if the server had failed, without the file."""
    image = tmp_path / "site.tar.gz"
    image.write_bytes(os.urandom(5000))
    manifest = write_cluster()
    data = yaml.safe_load(manifest.read_text())
    data["cluster"]["images"] = {"debian-12": {"url": image.as_uri(),
                                               "sha256": hashlib.sha256(image.read_bytes()).hexdigest()}}
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    cache = manifest.parent / ".provision" / "images"
    r = provision("image", "build", str(manifest), "--skip-proof", preexec=file_size_limit(1000))
    assert r.returncode == 1, r.said
    assert r.stderr.startswith(f"error: {cache}/.partial-debian-12-named-") and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.endswith(".tar.gz: File too large\n"), r.stderr
    assert list(cache.iterdir()) == []


def test_verify_junit_on_a_full_disk_names_the_file(write_cluster: Any, provision: Any, tmp_path: Path) -> None:
    """verify's one file, its JUnit report (the node on loopback refuses SSH: one FAIL row)."""
    junit = tmp_path / "reports" / "verify.xml"
    junit.parent.mkdir()
    r = provision("verify", str(write_cluster()), "--junit", str(junit), preexec=file_size_limit(10), timeout=60)
    assert r.returncode == 1, r.said
    assert r.stderr == f"error: --junit {junit}: File too large\n"
    assert leftovers(junit.parent) == [] and not junit.exists()


USAGE = Path(__file__).resolve().parents[1] / "areas" / "monitoring" / "data" / "usage"
EARLIER_REPORT = "<!doctype html><title>GPU usage of usagetest</title><p>the report of last week</p>\n"


def usage_report(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """`report usage --html` against a stand-in ssh on PATH that answers sacct with the usage
    tests' data (it contacts nothing; Prometheus on a closed loopback port), and the page,
    where an earlier report already is."""
    folder = tmp_path / "site"
    (folder / "bin").mkdir(parents=True)
    shutil.copy(USAGE / "cluster.yaml", folder / "cluster.yaml")
    (folder / "bin" / "ssh").write_text(f"#!/bin/sh\nexec cat '{USAGE / 'sacct.txt'}'\n")
    (folder / "bin" / "ssh").chmod(0o755)
    page = folder / "reports" / "usage.html"
    page.parent.mkdir()
    page.write_text(EARLIER_REPORT)
    argv = ["report", "usage", str(folder / "cluster.yaml"), "--since", "2023-11-14T22:14:00+00:00", "--until",
            "2023-11-15T00:14:00+00:00", "--json", "--html", str(page), "--prometheus", "http://127.0.0.1:1"]
    return argv, {**os.environ, "PATH": f"{folder / 'bin'}:{os.environ['PATH']}"}, page


def errors(stderr: str) -> list[str]:
    """The error lines (the manifest's warnings aside)."""
    return [line for line in stderr.splitlines() if ": warning: " not in line]


def test_report_html_on_a_full_disk_or_read_only_folder_names_the_option(provision: Any, tmp_path: Path) -> None:
    """report usage --html on a full disk said 'error: PATH: File too large', not which option's
    file; the earlier report stays whole either way. (Its --json stays unprinted: the command
    did not do all it was asked.)"""
    argv, env, page = usage_report(tmp_path)
    r = provision(*argv, env=env, preexec=file_size_limit(len(EARLIER_REPORT)), timeout=60)
    assert r.returncode == 1 and r.stdout == "", r.said
    assert errors(r.stderr) == [f"error: --html {page}: File too large"], r.stderr
    assert page.read_text() == EARLIER_REPORT and leftovers(page.parent) == []
    r = provision(*argv, env=env, read_only=page.parent, timeout=60)
    assert r.returncode == 1 and r.stdout == "", r.said
    assert errors(r.stderr) == [f"error: --html {page}: Read-only file system"], r.stderr
    assert page.read_text() == EARLIER_REPORT and leftovers(page.parent) == []
    r = provision(*argv, env=env, timeout=60)  # the same command on a writable folder writes the page
    assert r.returncode == 0, r.said
    assert json.loads(r.stdout)["total"]["gpu_h_allocated"] == 6.5 and page.read_text() != EARLIER_REPORT


def test_image_prune_in_a_read_only_cache_names_the_file(write_cluster: Any, provision: Any) -> None:
    """image prune on a read-only cache said 'error: PATH: Read-only file system' without
    saying that it could not remove it, nor what it had removed before."""
    manifest = write_cluster()
    cache = manifest.parent / ".provision" / "images"
    cache.mkdir(parents=True)
    for age, key in enumerate(("cccc", "bbbb", "aaaa")):  # aaaa oldest
        image = cache / f"debian-12-{key}.tar.gz"
        image.write_bytes(b"x" * 1024)
        os.utime(image, (1e9 - age * 3600, 1e9 - age * 3600))
    (cache / "debian-12.tar.gz").symlink_to("debian-12-cccc.tar.gz")
    before = sorted(p.name for p in cache.iterdir())
    for json_flag in ([], ["--json"]):
        r = provision("image", "prune", str(manifest), "--keep", "0", *json_flag, read_only=cache)
        assert r.returncode == 1 and r.stdout == "", r.said
        assert r.stderr == (f"error: cannot remove {cache}/debian-12-aaaa.tar.gz: Read-only file system; "
                            "nothing was removed\n"), r.stderr
        assert sorted(p.name for p in cache.iterdir()) == before
    r = provision("image", "prune", str(manifest), "--keep", "0", "--json")
    assert r.returncode == 0 and [e["names"] for e in json.loads(r.stdout)["removed"]] == [
        ["debian-12-aaaa.tar.gz"], ["debian-12-bbbb.tar.gz"]], r.said


def test_a_read_only_state_directory_is_one_line_and_plan_still_reads(write_cluster: Any, provision: Any) -> None:
    """A state directory on a read-only file system: the verbs that must write there (the lock,
    known_hosts; resume too) say so in one line that names it once ('X: X: Read-only file system' before);
    plan, which writes nothing, still answers, and so do inventory's errors."""
    manifest = write_cluster(slurm=True)
    folder, state = manifest.parent, manifest.parent / ".provision"
    said = (f"error: cannot set up the state directory {state}: Read-only file system; "
            "choose another state directory with --state-dir\n")
    for verb in (["apply", "--yes"], ["verify"], ["status"], ["drain", "n1"], ["resume", "n1"]):
        r = provision(verb[0], str(manifest), *verb[1:], read_only=folder, timeout=60)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", said), (verb, r.said)
    r = provision("plan", str(manifest), "--json", "--offline", read_only=folder)
    assert r.returncode == 0 and json.loads(r.stdout)["targets"] == ["n1"], r.said
    out = folder / "inventory" / "faults"
    r = provision("inventory", str(manifest), read_only=folder)
    assert (r.returncode, r.stdout) == (1, ""), r.said
    assert r.stderr == f"error: cannot write the inventory in {out}: {folder}/inventory: Read-only file system\n"
    assert sorted(p.name for p in folder.iterdir()) == ["cluster.yaml"]


REMOVE_STATE = {"version": 1, "cluster": "faults", "nodes": {"n9": {"lifecycle": "configured"}}, "runs": []}


@pytest.mark.parametrize(("slurm", "limit", "what"), [
    (True, 0, "cannot make the folder of the SSH connections: No usable temporary directory found in [{tmp}, "
              "...]; set TMPDIR to a writable folder with room"),  # the first file it writes anywhere
    (False, 500, "cannot write the inventory in {state}/inventory: {state}/inventory/group_vars/all/baremetal.json: "
                 "File too large"),
    (True, None, "cannot set up the state directory {state}: {state}/runs: Read-only file system; choose another "
                 "state directory with --state-dir"),  # before its drain: known_hosts
    (False, None, "cannot set up the state directory {state}: {state}/runs: Read-only file system; choose another "
                  "state directory with --state-dir"),  # its apply
], ids=["full-tmp", "full-inventory", "read-only-slurm", "read-only"])
def test_remove_on_a_full_disk_or_read_only_state_says_which_file(write_cluster: Any, provision: Any, tmp_path: Path,
                                                                   slurm: bool, limit: int | None, what: str) -> None:
    """remove shares the lock, the inventory and the state's writes with apply: on a full disk
    or a read-only state directory it says which file in one line, exits 1, leaves no
    temporary file, and the state still records the node as it was (nothing half-recorded).
    (Its own record after a finished apply: tests/commands/test_remove.py.)"""
    manifest = write_cluster(slurm=slurm)
    state = manifest.parent / ".provision"
    state.mkdir()
    (state / "state.json").write_text(json.dumps(REMOVE_STATE))
    before = (state / "state.json").read_bytes()
    if limit is None:
        r = provision("remove", str(manifest), "n9", "--yes", read_only=state, timeout=60)
    else:
        r = provision("remove", str(manifest), "n9", "--yes", preexec=file_size_limit(limit), timeout=60,
                      env={**os.environ, "TMPDIR": str(tmp_path)})
    said = "error: " + what.format(state=state, tmp=repr(str(tmp_path))) + "\n"
    head, _, tail = said.partition("...")  # the rest of Python's list of temporary folders
    assert r.returncode == 1 and r.stderr.startswith(head) and r.stderr.endswith(tail), r.said
    assert r.stderr.count("\n") == 1 and (tail or r.stderr == said), r.said
    assert "Traceback" not in r.said
    assert (state / "state.json").read_bytes() == before
    assert leftovers(state) == []


def run_tool(tool: Path, argv: list[str], config: dict[str, Any], folder: Path, *,
             preexec: Callable[[], None] | None = None, mount: str = "") -> subprocess.CompletedProcess[str]:
    """The head's backup tool (provision-backup) on ``config``; ``mount``: the destination is
    mounted so first, in a mount namespace of the tool's own (``ro``: read-only; a tmpfs's
    options: a small disk of its own)."""
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    prefix: list[str] = []
    if mount:
        if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True,
                                                             timeout=30, check=False).returncode != 0:
            pytest.skip("a mount of its own needs unshare -m (root)")
        how = 'mount --bind -o ro "$0" "$0"' if mount == "ro" else f'mount -t tmpfs -o {mount} tmpfs "$0"'
        prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", how + ' && exec "$@"',
                  str(config["destination"]["path"])]
    return subprocess.run([*prefix, sys.executable, str(tool), argv[0], str(path), *argv[1:]],
                          capture_output=True, text=True, timeout=60, preexec_fn=preexec, check=False)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl here")
@pytest.mark.parametrize("where", ["read-only destination", "full destination", "full staging disk"])
def test_the_heads_backup_tool_on_a_full_or_read_only_disk_names_the_file(
        backup_tool: Path, backup_head: tuple[dict[str, Any], Path], tmp_path: Path, where: str) -> None:
    """provision-backup make on a read-only destination, a full one (a 12 KiB tmpfs: the
    backup's fourth file does not fit) or a full staging disk: one line naming the file, exit
    1, no partial copy at the destination, nothing left in the staging folder. Before, a full
    disk said '[Errno 27] File too large' with no file, or copytree's list of every file."""
    config, _ = backup_head
    dest = Path(config["destination"]["path"])
    dest.mkdir()
    if where == "full staging disk":
        r = run_tool(backup_tool, ["make"], config, tmp_path, preexec=file_size_limit(100))
    else:
        mount = "ro" if where.startswith("read-only") else "size=12k"
        r = run_tool(backup_tool, ["make"], config, tmp_path, mount=mount)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r
    prefix = f"provision-backup: cannot copy the backup to {dest}: {dest}/provision-backup-faults-"
    said = {"read-only destination": (prefix, ".partial: Read-only file system\n"),
            "full destination": (prefix, ": No space left on device\n"),
            "full staging disk": (f"provision-backup: cannot make {tmp_path}/staging/provision-backup-faults-",
                                  ".clear/munge.tar.gz: File too large\n")}[where]
    assert r.stderr.startswith(said[0]) and r.stderr.endswith(said[1]), r.stderr
    assert list(dest.iterdir()) == [] and list((tmp_path / "staging").iterdir()) == []


@pytest.mark.parametrize("where", ["full temporary folder", "read-only state directory"])
def test_backup_on_a_full_disk_or_read_only_state_names_the_folder(write_cluster: Any, provision: Any,
                                                                    tmp_path: Path, where: str) -> None:
    """provision backup packs the state directory into the temporary folder, encrypted, before
    any ssh: with no room there it said 'error: File too large' (no file); on a read-only state
    directory it says so once. One line, exit 1, no ssh started, nothing left in TMPDIR."""
    scratch, bin_dir = tmp_path / "tmp", tmp_path / "bin"
    scratch.mkdir()
    bin_dir.mkdir()
    called = tmp_path / "ssh.called"
    (bin_dir / "ssh").write_text(f"#!/bin/sh\necho \"$*\" >> {called}\n")
    (bin_dir / "ssh").chmod(0o755)
    manifest = write_cluster(slurm=True)
    data = yaml.safe_load(manifest.read_text())
    data["backup"] = {"destination": {"path": "/srv/backup"}, "key_env": "FAULTS_BACKUP_KEY"}
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    state = manifest.parent / ".provision"
    state.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "FAULTS_BACKUP_KEY": "correct horse battery staple"}
    if where == "read-only state directory":
        r = provision("backup", str(manifest), env=env, read_only=state, timeout=60)
        assert r.stderr == (f"error: cannot set up the state directory {state}: {state}/runs: Read-only file system; "
                            "choose another state directory with --state-dir\n"), r.said
    else:
        r = provision("backup", str(manifest), env=env, preexec=file_size_limit(100), timeout=60)
        assert r.stderr.startswith(f"error: cannot pack {state} into {scratch}/provision-backup-"), r.said
        assert r.stderr.endswith("/provision-state.tar.gz: File too large; set TMPDIR to a writable folder with "
                                 "room\n") and r.stderr.count("\n") == 1, r.said
    assert (r.returncode, r.stdout) == (1, "")
    assert not called.exists() and list(scratch.iterdir()) == []
