"""`provision slurm build MANIFEST [--os OS] [--jobs N]`: the manifest's pinned Slurm built into
.deb packages, one build per OS release of its Slurm nodes, unless the cache holds it (as
`provision image build` does for images).

What is built, from what and how is the area's (provisioner.areas.slurm.build, reached through
the registry); this edge fetches the source tarball (http(s) or file://, bounded) and checks
it against its pinned sha256, runs the build in a throwaway chroot of the OS release
(mmdebstrap, bounded), checks that every package and every build option came out, and moves
the packages into the cache with a SHA256SUMS; then it publishes each OS release's packages
as a flat apt repository, indexed and signed with the cluster's key (made once, a GnuPG home
in the state directory's secrets/). Layout (``.provision/slurm/`` beside the manifest unless
given): ``<os>-<version>-<key>/`` holding the .deb files and ``SHA256SUMS``; ``repo/<os>/``
(the .debs, Packages, Packages.gz, Release, InRelease) and ``repo/public.asc``;
``.partial-<name>/`` while a build or a publication runs (gone when it ends, however it ends).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from provisioner.areas import registry
from provisioner.commands.common import guarded, load
from provisioner.errors import ProvisionError
from provisioner.image import builder as chroot
from provisioner.proctree import processes_end_with_a_signal
from provisioner.state import StateDir

FETCH_TIMEOUT_S = 60.0  # per socket operation of a download
SUMS = "SHA256SUMS"
PARTIAL_PREFIX = ".partial-"
STOP_GRACE = 10.0  # after a signal, the time of our other children (mmdebstrap stops itself: image/builder.py)

Runner = Callable[..., Any]


@dataclass(frozen=True)
class Built:
    os: str
    version: str
    path: Path
    debs: tuple[str, ...]  # file names
    source: str  # built, cached
    seconds: float = 0.0


def cache_dir(manifest: Path, override: Path | None) -> Path:
    return override if override is not None else StateDir.beside(manifest).root / "slurm"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(url: str, dest: Path, timeout: float = FETCH_TIMEOUT_S) -> None:
    """``url`` (http(s):// or file://) to ``dest``."""
    parsed = urllib.parse.urlparse(url)
    try:
        if parsed.scheme == "file":
            shutil.copyfile(urllib.parse.unquote(parsed.path), dest)
            return
        with urllib.request.urlopen(url, timeout=timeout) as resp, dest.open("wb") as out:
            shutil.copyfileobj(resp, out)
    except OSError as exc:
        raise ProvisionError(f"fetching {url} failed: {exc}") from None


def package_name(deb: str) -> str:
    return deb.split("_", 1)[0]


def cached(path: Path, wanted: Sequence[str]) -> tuple[str, ...] | None:
    """The .deb files of a finished build in ``path`` if every one still matches SHA256SUMS and
    every wanted package is there; None otherwise."""
    sums = path / SUMS
    if not sums.is_file():
        return None
    entries = [line.split(maxsplit=1) for line in sums.read_text().splitlines() if line.strip()]
    names = tuple(name.strip() for _, name in entries)
    if any(sha256_file(path / name) != digest for digest, name in entries if (path / name).is_file()):
        raise ProvisionError(f"{path}: a cached package does not match {SUMS}; remove the folder and build again")
    if not all((path / name).is_file() for name in names) or set(wanted) - {package_name(n) for n in names}:
        return None
    return names


def build_one(job: registry.BuildJob, cache: Path, *, proxy: str | None, mirror: str | None, jobs: int, timeout: float,
              missing: Callable[[list[str]], list[str]], run: Runner = subprocess.run,
              chroot_run: Runner = chroot.run, fetcher: Callable[[str, Path], None] = fetch) -> Built:
    """Build ``job`` (an area's build job) into ``cache`` unless it is there. ``chroot_run``
    runs mmdebstrap (a stop leaves nothing mounted), ``run`` the short tools."""
    final = cache / job.name
    found = cached(final, job.debs)
    if found is not None:
        return Built(job.os, job.source.version, final, found, "cached")
    partial = cache / f"{PARTIAL_PREFIX}{job.name}"
    shutil.rmtree(partial, ignore_errors=True)
    work, out = partial / "src", partial / "out"
    work.mkdir(parents=True)
    out.mkdir()
    start = time.monotonic()
    try:
        fetcher(job.url, work / job.source.file)
        got = sha256_file(work / job.source.file)
        if got != job.source.sha256:
            raise ProvisionError(f"{job.url}: sha256 {got}, pinned {job.source.sha256}; not built")
        cmd = job.mmdebstrap(str(work), str(out), proxy=proxy, mirror=mirror, jobs=jobs)
        try:
            result = chroot_run(cmd, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ProvisionError(f"{job.os}: building Slurm {job.source.version} took longer than "
                                 f"{timeout:.0f} s; gave up") from None
        if result.returncode != 0:
            raise ProvisionError(f"{job.os}: building Slurm {job.source.version} failed (mmdebstrap exit "
                                 f"{result.returncode}); its output above says where")
        debs = sorted(p.name for p in out.glob("*.deb"))
        lacking = sorted(set(job.debs) - {package_name(d) for d in debs})
        if lacking:
            raise ProvisionError(f"{job.os}: the build left no {', '.join(lacking)}")
        files = [line for deb in debs for line in _contents(out / deb, run)]
        left_out = missing(files)
        if left_out:
            raise ProvisionError(f"{job.os}: the built packages lack build options {', '.join(left_out)} "
                                 "(their libraries were not in the chroot)")
        (out / SUMS).write_text("".join(f"{sha256_file(out / d)}  {d}\n" for d in debs))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(out, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return Built(job.os, job.source.version, final, tuple(debs), "built", time.monotonic() - start)


def _contents(deb: Path, run: Runner) -> list[str]:
    """The paths a .deb holds (``dpkg-deb -c``, the last column)."""
    result = run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise ProvisionError(f"dpkg-deb -c {deb.name} failed: {result.stderr.strip()}")
    return [line.split()[-1] for line in result.stdout.splitlines() if line.split()]


def _run_checked(cmd: Sequence[str], run: Runner, what: str, **kw: Any) -> Any:
    result = run(list(cmd), capture_output=True, timeout=120, check=False, **kw)
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace") if isinstance(result.stderr, bytes) else result.stderr
        raise ProvisionError(f"{what} failed: {str(detail).strip()[:400]}")
    return result


@contextlib.contextmanager
def gnupg(home: Path, run: Runner = subprocess.run) -> Iterator[str]:
    """``home`` under a short name (gpg's agent socket lives in the home, and a deep state
    directory's path is longer than a socket's 108 bytes); the agent gpg starts is stopped
    when the block ends, however it ends."""
    link_dir = Path(tempfile.mkdtemp(prefix="pv-gpg-"))
    short = link_dir / "h"
    short.symlink_to(home.resolve())
    try:
        yield str(short)
    finally:
        run(["gpgconf", "--homedir", str(short), "--kill", "gpg-agent"], capture_output=True, timeout=30,
            check=False)
        shutil.rmtree(link_dir, ignore_errors=True)


def signing_key(repo: registry.PackageRepo, secrets: Path, cluster: str, run: Runner = subprocess.run) -> Path:
    """The GnuPG home holding the cluster's repository key in ``secrets`` (0700), made once."""
    home = secrets / repo.signing_home
    if (home / repo.public_key).is_file():
        return home
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(secrets, 0o700)
    os.chmod(home, 0o700)
    with gnupg(home, run) as short:
        for cmd in repo.key_commands(short, cluster):
            _run_checked(cmd, run, "making the Slurm repository's signing key")
    return home


def publish(built: Built, root: Path, repo: registry.PackageRepo, home: Path, *, run: Runner = subprocess.run,
            now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> Path:
    """``root``/<os>/: the flat repository of ``built``'s packages, indexed and signed (the
    head serves it as is); ``root``/<public key>: what the nodes trust it with."""
    target, partial = root / built.os, root / f"{PARTIAL_PREFIX}{built.os}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        entries = []
        for deb in sorted(built.debs):
            shutil.copyfile(built.path / deb, partial / deb)
            control = _run_checked(["dpkg-deb", "--field", str(partial / deb)], run, f"reading {deb}", text=True)
            entries.append(repo.stanza(control.stdout, deb, (partial / deb).read_bytes()))
        packages = "\n".join(entries).encode()
        indexes = {"Packages": packages, "Packages.gz": gzip.compress(packages, mtime=0)}
        for name, data in indexes.items():
            (partial / name).write_bytes(data)
        date = now().strftime("%a, %d %b %Y %H:%M:%S UTC")
        (partial / "Release").write_text(repo.release(built.os, indexes, date))
        with gnupg(home, run) as short:
            _run_checked(repo.sign_command(short), run, "signing the Slurm repository", cwd=partial)
        shutil.copyfile(home / repo.public_key, root / repo.public_key)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with processes_end_with_a_signal(STOP_GRACE):
        return build_all(args, out, err)


def build_all(args: argparse.Namespace, out: Console, err: Console, *, euid: Callable[[], int] = os.geteuid,
              which: Callable[[str], str | None] = shutil.which, runner: Runner = subprocess.run) -> int:
    """``--json``: {ok, builds: [{os, version, source, path, debs, seconds}]} on stdout."""
    if args.json:
        out = err
    loaded = load(err, args.manifest)
    m = loaded.manifest
    builder = registry.package_build()
    todo = builder.jobs(m, args.os)
    if not builder.jobs(m, None):
        raise ProvisionError("nothing to build: the manifest has slurm.source: os")
    if not todo:
        raise ProvisionError(f"--os {args.os}: none of the manifest's Slurm nodes runs it")
    if which("mmdebstrap") is None:
        raise ProvisionError("mmdebstrap is not installed: apt-get install mmdebstrap")
    if euid() != 0:
        raise ProvisionError("building Slurm needs root (a chroot of each OS release): run it with sudo")
    cache = cache_dir(args.manifest, args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    done: list[Built] = []
    for job in todo:
        out.print(f"{job.os}: Slurm {job.source.version} from {job.url}: building unless cached ...",
                  markup=False)
        built = build_one(job, cache, proxy=m.cluster.mirrors.apt_proxy, mirror=m.cluster.mirrors.apt,
                          jobs=args.jobs, timeout=builder.timeout_s, missing=builder.missing, run=runner)
        took = f" in {built.seconds:.0f} s" if built.source == "built" else ""
        out.print(f"{job.os}: {built.source}{took}: {len(built.debs)} packages in {built.path}", markup=False)
        done.append(built)
    home = signing_key(builder.repo, StateDir.beside(args.manifest).secrets, m.cluster.name, runner)
    repos = {b.os: publish(b, cache / "repo", builder.repo, home, run=runner) for b in done}
    for os_name, path in repos.items():
        out.print(f"{os_name}: signed repository {path}", markup=False)
    if args.json:
        print(json.dumps({"ok": True, "builds": [
            {"os": b.os, "version": b.version, "source": b.source, "path": str(b.path), "debs": list(b.debs),
             "repo": str(repos[b.os]), "seconds": round(b.seconds, 1) if b.source == "built" else None}
            for b in done]}))
    return 0


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
