"""provisioner.state: the state directory, atomic saves and the apply lock."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner import state as state_mod
from provisioner.errors import ProvisionError
from provisioner.state import MAX_RUNS, NodeState, RunRecord, State, StateDir, atomic_write

ROOT = Path(__file__).resolve().parents[1]

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from provisioner.state import StateDir

    with StateDir(Path(sys.argv[1])).lock("apply --limit gpu01"):
        print("locked", flush=True)
        sys.stdin.readline()
    print("released", flush=True)
    """
)

TRY_LOCK = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from provisioner.errors import ProvisionError
    from provisioner.state import StateDir

    try:
        with StateDir(Path(sys.argv[1])).lock("plan"):
            print("got it")
    except ProvisionError as exc:
        print(f"refused: {exc}")
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock on tmp_path/state until its stdin gets a line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "state")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "locked"
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=30)


def sample_state() -> State:
    return State(
        cluster="testc",
        cluster_fingerprint="abc123",
        nodes={
            "node02": NodeState(lifecycle="installed", fingerprints={"node": "1", "bmc": "2"}),
            "head01": NodeState(
                lifecycle="configured",
                fingerprints={"node": "3", "common": "4"},
                applied_at="2024-01-01T00:00:00+00:00",
                last_run="r1",
                last_result="ok",
            ),
        },
        runs=[
            RunRecord(
                id="r1",
                started="2024-01-01T00:00:00+00:00",
                finished="2024-01-01T00:05:00+00:00",
                limit=["head01"],
                targets=["head01"],
                result="ok",
                changed={"head01": 3},
            )
        ],
    )


# --------------------------------------------------------------------------- save / load
def test_save_load_round_trip(tmp_path: Path) -> None:
    sd = StateDir(tmp_path / "state")
    st = sample_state()
    sd.save(st)
    loaded = sd.load()
    assert loaded == st
    assert list(loaded.nodes) == ["head01", "node02"]  # saved sorted
    data = json.loads(sd.state_file.read_text())
    assert data["version"] == 1
    assert data["nodes"]["node02"]["fingerprints"] == {"bmc": "2", "node": "1"}
    assert [p.name for p in sd.root.iterdir()] == ["state.json"]  # no temporary files left


def test_missing_state_is_empty(tmp_path: Path) -> None:
    assert StateDir(tmp_path).load() == State()


def test_runs_are_capped(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    st = State(runs=[RunRecord(id=str(i), started="t") for i in range(MAX_RUNS + 7)])
    sd.save(st)
    runs = sd.load().runs
    assert len(runs) == MAX_RUNS
    assert runs[0].id == "7"
    assert runs[-1].id == str(MAX_RUNS + 6)


def test_node_creates_an_entry() -> None:
    st = State()
    ns = st.node("gpu01")
    assert ns == NodeState()
    assert st.node("gpu01") is ns


@pytest.mark.parametrize(
    "content",
    [
        b"{",
        b"",
        b"not json at all",
        b"[]",
        b"null",
        b'"text"',
        b"\xff\xfe\x00\x01",
        b'{"version": 1, "nodes": []}',
        b'{"version": 1, "nodes": {"a": "x"}}',
        b'{"version": 1, "nodes": {"a": {"bogus": 1}}}',
        b'{"version": 1, "runs": [{"id": "x"}]}',
        b'{"version": 1, "runs": 5}',
    ],
)
def test_unreadable_state_is_a_provision_error(tmp_path: Path, content: bytes) -> None:
    sd = StateDir(tmp_path)
    sd.state_file.write_bytes(content)
    with pytest.raises(ProvisionError) as info:
        sd.load()
    message = str(info.value)
    assert message.startswith(f"{sd.state_file}: ")
    assert "\n" not in message


@pytest.mark.parametrize("version", [2, 0, None, "1"])
def test_wrong_version(tmp_path: Path, version: object) -> None:
    sd = StateDir(tmp_path)
    sd.state_file.write_text(json.dumps({"version": version, "nodes": {}}))
    with pytest.raises(ProvisionError, match="version"):
        sd.load()


def test_state_file_that_is_a_directory(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.state_file.mkdir()
    with pytest.raises(ProvisionError, match="cannot read"):
        sd.load()


# --------------------------------------------------------------------------- atomic_write
def test_atomic_write_replaces_and_sets_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.txt"
    atomic_write(path, "one")
    assert path.read_text() == "one"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    atomic_write(path, "two", mode=0o600)
    assert path.read_text() == "two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.txt"]


def test_atomic_write_failure_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(state_mod.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # the temporary file is gone


# --------------------------------------------------------------------------- directory layout
def test_ensure_creates_the_layout_with_private_secrets(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        sd = StateDir(tmp_path / ".provision")
        sd.ensure()
    finally:
        os.umask(old)
    for sub in (sd.runs, sd.inventory, sd.secrets):
        assert sub.is_dir()
    assert stat.S_IMODE(sd.secrets.stat().st_mode) == 0o700
    assert stat.S_IMODE(sd.known_hosts.stat().st_mode) == 0o600


def test_ensure_tightens_an_existing_secrets_dir(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.secrets.mkdir(mode=0o755)
    os.chmod(sd.secrets, 0o755)
    sd.ensure()
    sd.ensure()  # idempotent
    assert stat.S_IMODE(sd.secrets.stat().st_mode) == 0o700


def test_beside_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "site").mkdir()
    monkeypatch.chdir(tmp_path)
    assert StateDir.beside(Path("site/m.yaml")).root == tmp_path / "site" / ".provision"
    assert StateDir.beside(Path("site/m.yaml"), tmp_path / "elsewhere").root == tmp_path / "elsewhere"


# --------------------------------------------------------------------------- the lock
def test_lock_from_another_process_is_refused_with_the_holder(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    sd = StateDir(tmp_path / "state")
    with pytest.raises(ProvisionError) as info, sd.lock("apply"):
        pass
    message = str(info.value)
    assert message.startswith(f"another provision run holds {sd.root / 'lock'}: ")
    assert "apply --limit gpu01 by " in message
    assert f"pid {holder.pid} since " in message


def test_lock_is_released_after_the_holder_leaves(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "released"
    holder.wait(timeout=30)
    sd = StateDir(tmp_path / "state")
    with sd.lock("apply"):
        assert f"pid {os.getpid()}" in (sd.root / "lock").read_text()


def test_lock_is_released_after_the_context(tmp_path: Path) -> None:
    sd = StateDir(tmp_path / "state")
    with sd.lock("apply"):
        text = (sd.root / "lock").read_text()
        assert text.startswith("apply by ")
        assert f"pid {os.getpid()}" in text
        other = subprocess.run(
            [sys.executable, "-c", TRY_LOCK, str(sd.root)], capture_output=True, text=True, env=_env(), check=True
        )
        assert other.stdout.startswith("refused: another provision run holds")
        assert f"pid {os.getpid()}" in other.stdout
    assert (sd.root / "lock").read_text() == ""
    after = subprocess.run(
        [sys.executable, "-c", TRY_LOCK, str(sd.root)], capture_output=True, text=True, env=_env(), check=True
    )
    assert after.stdout.strip() == "got it"


def test_lock_is_released_when_the_body_raises(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    with pytest.raises(RuntimeError), sd.lock("apply"):
        raise RuntimeError("boom")
    with sd.lock("apply"):
        pass


def test_second_lock_in_the_same_process_is_refused(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    with sd.lock("apply"), pytest.raises(ProvisionError, match="another provision run"), sd.lock("plan"):
        pass


# --------------------------------------------------------------------------- backups and errors
def test_the_state_before_each_command_is_kept(tmp_path: Path) -> None:
    """Issue 18 item 12: a corrupt state.json said "restore it from a backup" but none was
    kept. Each command that changes the state keeps the one before it (state.json.1, older
    ones shifted up to .3); saves within one command keep only the first."""
    versions = []
    for n in range(5):
        sd = StateDir(tmp_path)  # one StateDir per command
        for m in range(2):
            sd.save(State(cluster=f"c{n}-{m}"))
        versions.append(f"c{n}-1")
    assert StateDir(tmp_path).load().cluster == "c4-1"
    kept = [json.loads(StateDir(tmp_path).backup(n).read_text())["cluster"] for n in (1, 2, 3)]
    assert kept == ["c3-1", "c2-1", "c1-1"]
    assert not (tmp_path / "state.json.4").exists()
    assert stat.S_IMODE(StateDir(tmp_path).backup(1).stat().st_mode) == 0o600


def test_a_corrupt_state_names_the_backup_to_restore(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.save(sample_state())
    StateDir(tmp_path).save(State(cluster="testc"))
    sd.state_file.write_text("{ half a file")
    with pytest.raises(ProvisionError) as info:
        StateDir(tmp_path).load()
    message = str(info.value)
    assert f"the state before the last change is kept in {sd.backup(1)}" in message
    assert f"copy it over {sd.state_file}" in message
    StateDir(tmp_path).backup(1).unlink()
    with pytest.raises(ProvisionError, match="no earlier state is kept"):
        StateDir(tmp_path).load()


def test_a_state_dir_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    """`--state-dir <a file>` gave `internal error: FileExistsError`."""
    path = tmp_path / "afile"
    path.write_text("x")
    sd = StateDir(path)
    for action in (sd.ensure, sd.load):
        with pytest.raises(ProvisionError, match=rf"{path} is not a directory.*--state-dir"):
            action()
    with pytest.raises(ProvisionError, match="--state-dir"), sd.lock("apply"):
        pass


def test_a_read_only_state_dir_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`internal error: OSError: [Errno 30] Read-only file system` before. (The tests may run
    as root, which ignores permission bits: the file system's answer is simulated.)"""
    sd = StateDir(tmp_path / "state")
    sd.ensure()

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(30, "Read-only file system", str(sd.root))

    monkeypatch.setattr(state_mod, "atomic_write", read_only)
    with pytest.raises(ProvisionError) as info:
        sd.save(State())
    assert str(info.value) == (f"cannot write the state {sd.state_file}: Read-only file system; choose another "
                               "state directory with --state-dir (or make this one writable)")
    monkeypatch.setattr(state_mod.os, "open", read_only)
    with pytest.raises(ProvisionError, match=r"cannot take the lock .*Read-only file system; choose another"), \
            sd.lock("apply"):
        pass
    monkeypatch.undo()
    monkeypatch.setattr(Path, "touch", read_only)
    with pytest.raises(ProvisionError, match=r"cannot set up the state directory .*Read-only file system"):
        sd.ensure()


def test_load_for_refuses_another_clusters_state(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.save(State(cluster="llm200k"))
    assert sd.load_for("llm200k").cluster == "llm200k"
    with pytest.raises(ProvisionError, match=r"belongs to cluster 'llm200k', not 'musiclab'; .*--state-dir"):
        sd.load_for("musiclab")
    assert StateDir(tmp_path / "fresh").load_for("anything").cluster == ""


def test_a_dry_run_shares_the_lock_and_writes_nothing(tmp_path: Path) -> None:
    sd = StateDir(tmp_path / "state")
    with sd.shared_lock():  # no lock file yet: nothing is created
        pass
    assert not sd.root.exists()
    with sd.lock("apply"):
        pass
    before = (sd.root / "lock").stat().st_mtime_ns
    with sd.shared_lock(), sd.shared_lock():  # dry runs share it ...
        other = subprocess.run([sys.executable, "-c", TRY_LOCK, str(sd.root)], capture_output=True, text=True,
                               env=_env(), check=True)
        assert other.stdout.startswith("refused: another provision run holds")  # ... an apply waits
        assert "dry run" in other.stdout
    assert (sd.root / "lock").stat().st_mtime_ns == before
    with sd.lock("apply"), pytest.raises(ProvisionError, match="another provision run holds"), sd.shared_lock():
        pass


# --------------------------------------------------------------------------- hand-edited and full (issue 27)
@pytest.mark.parametrize(("nodes", "said"), [
    ({"a": {"fingerprints": "x"}}, 'nodes.a.fingerprints: expected dict[str], found "x"'),
    ({"a": {"fingerprints": {"common": 3}}}, "nodes.a.fingerprints: expected dict[str]"),
    ({"a": {"lifecycle": "gone"}}, "nodes.a.lifecycle: expected one of new, installed, configured, removed"),
    ({"a": {"applied_at": 5}}, "nodes.a.applied_at: expected str?, found 5"),
])
def test_a_hand_edited_state_of_the_wrong_shape_names_the_field(tmp_path: Path, nodes: object, said: str) -> None:
    """A string of fingerprints loaded and failed later in plan as `internal error: AttributeError`."""
    sd = StateDir(tmp_path)
    sd.state_file.write_text(json.dumps({"version": 1, "nodes": nodes}))
    with pytest.raises(ProvisionError) as info:
        sd.load()
    assert str(info.value).startswith(f"{sd.state_file}: unreadable state ({said}")


def test_a_state_of_another_version_names_the_file(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    sd.state_file.write_text(json.dumps({"version": 99, "nodes": {}}))
    with pytest.raises(ProvisionError) as info:
        sd.load()
    assert str(info.value) == (f"{sd.state_file}: state version 99; this provision reads version 1 (written by "
                               "another version of provision?); choose another state directory with --state-dir "
                               "or use the matching provision")


def test_a_full_disk_at_the_state_names_it_and_keeps_the_old_one(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sd = StateDir(tmp_path)
    sd.save(State(cluster="c"))
    before = sd.state_file.read_text()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_mod.os, "fsync", full)
    with pytest.raises(ProvisionError, match=rf"cannot write the state {sd.state_file}: No space left on device"):
        StateDir(tmp_path).save(State(cluster="c", runs=[RunRecord(id="r", started="now")]))
    assert sd.state_file.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_atomic_write_failures_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_mod.os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic_write(tmp_path / "f", "text")
    assert info.value.filename == str(tmp_path / "f")


def test_a_full_disk_at_the_lock_is_a_clear_error_and_frees_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`internal error: OSError: [Errno 28] No space left on device` before, naming no file."""
    sd = StateDir(tmp_path)

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_mod.os, "pwrite", full)
    with pytest.raises(ProvisionError) as info, sd.lock("apply"):
        pass
    assert str(info.value) == (f"cannot take the lock {tmp_path / 'lock'}: No space left on device; choose another "
                               "state directory with --state-dir")
    monkeypatch.undo()
    with sd.lock("apply"):  # not left held
        pass


def test_the_state_is_private_as_its_backups(tmp_path: Path) -> None:
    """state.json was 0644 while state.json.1 .. .3 were 0600 (issue 27 item 16)."""
    sd = StateDir(tmp_path)
    sd.save(State(cluster="c"))
    StateDir(tmp_path).save(State(cluster="c"))
    assert stat.S_IMODE(sd.state_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(sd.backup(1).stat().st_mode) == 0o600
