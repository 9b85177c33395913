"""The image's proof: every package the roles will install on nodes of its OS resolves,
inside the image, from the sources those nodes will use. Pure parts first (sources, apt's
output, the failure message, the record), then the edge (:func:`prove`: unpack the image,
``apt-get update`` and ``apt-get install --simulate`` in a chroot, each bounded).

What a node's apt will see: the OS's own sources, every pocket and component (the image's
``/etc/apt/sources.list``, :meth:`provisioner.image.recipe.OsImage.sources`: what the common
role writes for a mirror), plus the vendor repositories its roles add (CUDA, the container
toolkit, Docker, DOCA), each with its key. Each apt task of a role is one request, simulated
on its own (what one task installs together), so two roles that would conflict only on
different nodes do not fail each other. A package that does not resolve fails the build
with its name, the OS, the sources looked in, and the manifest field that asked for it.

On success ``<image>.proof.json`` lies beside the image: the image's SHA-256, the sources,
the kernel and every package proven. ``provision apply`` checks it before a PXE deploy
(:func:`covers`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from provisioner.errors import ProvisionError

PROOF_SUFFIX = ".proof.json"
PROOF_VERSION = 1
UPDATE_TIMEOUT = 600.0  # apt-get update of every source, through the proxy
SIMULATE_TIMEOUT = 120.0  # one request's apt-get install --simulate
KEY_TIMEOUT = 30.0  # fetching one vendor key
KEY_LIMIT = 1 << 20
# inside the unpacked image: the proof's own sources, lists and keys (nothing of the image's)
WORK = "/var/lib/provision-proof"
WORK_PREFIX = ".proof-"


@dataclass(frozen=True)
class AptRequest:
    """What one apt task of a role installs together on some nodes."""

    packages: tuple[str, ...]  # names, or name=version
    role: str
    task: str  # roles/<role>/tasks/<file>: <task name>
    field: str  # the manifest field that asked for it
    nodes: tuple[str, ...]
    # packages named by the manifest's role_vars: (package, "role_vars: <variable>")
    named_by: tuple[tuple[str, str], ...] = ()

    def origin(self, package: str) -> str:
        """The manifest field that asked for ``package``."""
        return next((f for p, f in self.named_by if base_name(p) == base_name(package)), self.field)


@dataclass(frozen=True)
class Repository:
    """A vendor repository a role adds (its deb822_repository task)."""

    name: str
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str  # a key URL, the key itself (armored), or a path on the node
    role: str


@dataclass(frozen=True)
class ProofInput:
    os: str
    kernel: str
    requests: tuple[AptRequest, ...]
    repositories: tuple[Repository, ...]

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(sorted({p for r in self.requests for p in r.packages}))


@dataclass(frozen=True)
class Unresolved:
    package: str
    reason: str


@dataclass(frozen=True)
class Record:
    """``<image>.proof.json``."""

    os: str
    image_sha256: str
    kernel: str
    sources: tuple[str, ...]
    packages: tuple[str, ...]
    seconds: float = 0.0
    version: int = PROOF_VERSION
    proven_at: float = field(default=0.0)


class ProofError(ProvisionError):
    """The proof failed; the message says what, where it looked and who asked."""


# --------------------------------------------------------------------------- pure
def key_path(repo: Repository) -> str:
    """Where the proof keeps a repository's key inside the image."""
    tag = hashlib.sha256(repo.signed_by.encode()).hexdigest()[:8]
    return f"{WORK}/keys/{re.sub(r'[^A-Za-z0-9_.-]', '_', repo.name)}-{tag}.asc"


def repository_lines(repo: Repository) -> tuple[str, ...]:
    """One-line ``deb`` entries of a deb822 repository (flat ones have suite ``/``)."""
    out = []
    for uri in repo.uris:
        for suite in repo.suites or ("/",):
            comps = "" if suite.endswith("/") else " " + " ".join(repo.components)
            out.append(f"deb [signed-by={key_path(repo)}] {uri} {suite}{comps}".rstrip())
    return tuple(out)


def sources(os_sources: Sequence[str], repos: Sequence[Repository]) -> tuple[str, ...]:
    """Every source the proof looks in: the OS's, then each vendor repository's, each once
    (two roles that add the same repository with the same key give one entry)."""
    return tuple(dict.fromkeys([*os_sources, *(line for r in repos for line in repository_lines(r))]))


_LOCATE = re.compile(r"^E: Unable to locate package (\S+)$")
_CANDIDATE = re.compile(r"^E: Package '([^']+)' has no installation candidate$")
_VERSION = re.compile(r"^E: Version '([^']+)' for '([^']+)' was not found$")
_UNMET = re.compile(r"^ (\S+) : (?:Pre)?Depends: (.+?)\s*$")
_UNMET_MORE = re.compile(r"^ {3,}(?:(?:Pre)?Depends|Recommends): ")


def parse_apt(output: str) -> tuple[Unresolved, ...]:
    """The packages ``apt-get install --simulate`` could not resolve, with apt's reason in
    words, from its output (C locale): unknown names, names without a candidate in these
    sources, versions not found, and unmet dependencies."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        if m := _LOCATE.match(line):
            found.setdefault(m[1], "no package of that name in these sources")
        elif m := _CANDIDATE.match(line):
            found.setdefault(m[1], "known, but no version of it is in these sources (a missing pocket or "
                                   "component?)")
        elif m := _VERSION.match(line):
            found.setdefault(f"{m[2]}={m[1]}", f"version {m[1]} is not in these sources")
        elif (m := _UNMET.match(line)) and not _UNMET_MORE.match(line):
            dep = m[2]
            if "not installable" in dep or "not going to be installed" in dep:
                found.setdefault(m[1], f"depends on {dep.split(' but ')[0]}, which these sources cannot install")
    return tuple(Unresolved(p, r) for p, r in found.items())


def base_name(package: str) -> str:
    return package.split("=", 1)[0]


def failure_message(os_name: str, failures: Sequence[tuple[Unresolved, AptRequest]], looked_in: Sequence[str]) -> str:
    """The build's error: per package that does not resolve, why, who asked for it (the
    manifest field, role, task, nodes), then the sources looked in."""
    lines = [f"{os_name}: {len(failures)} package(s) the roles install do not resolve in the image:"]
    for miss, req in failures:
        nodes = ", ".join(req.nodes[:5]) + (f" and {len(req.nodes) - 5} more" if len(req.nodes) > 5 else "")
        lines.append(f"  {miss.package}: {miss.reason}; asked for by {req.origin(miss.package)} "
                     f"(role {req.role}, {req.task}; nodes {nodes})")
    lines.append(f"{os_name}: sources looked in:")
    lines += [f"  {s}" for s in looked_in]
    return "\n".join(lines)


def attribute(unresolved: Sequence[Unresolved], req: AptRequest) -> list[tuple[Unresolved, AptRequest]]:
    """Each unresolved name with the request that asked for it; apt's reports name a package
    without its version (``foo`` for ``foo=1.2``) and sometimes with it."""
    asked = {base_name(p) for p in req.packages} | set(req.packages)
    return [(u, req) for u in unresolved if u.package in asked or base_name(u.package) in asked]


def record_path(image: Path) -> Path:
    return image.with_name(image.name + PROOF_SUFFIX)


def record_text(r: Record) -> str:
    return json.dumps(asdict(r), indent=1, sort_keys=True) + "\n"


def parse_record(text: str) -> Record | None:
    """A proof record, or None when the text is not one (of this version)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != PROOF_VERSION:
            return None
        return Record(str(data["os"]), str(data["image_sha256"]), str(data["kernel"]),
                      tuple(map(str, data["sources"])), tuple(map(str, data["packages"])),
                      float(data.get("seconds", 0.0)), PROOF_VERSION, float(data.get("proven_at", 0.0)))
    except (ValueError, KeyError, TypeError):
        return None


def covers(record: Record | None, image_sha256: str, looked_in: Sequence[str], packages: Sequence[str]) -> str | None:
    """Why ``record`` does not prove this image for these sources and packages (None: it does)."""
    if record is None:
        return "it has no proof (run provision image build)"
    if record.image_sha256 != image_sha256:
        return "its proof is of another image (run provision image build)"
    if set(looked_in) - set(record.sources):
        return "its proof looked in other sources than the manifest's (run provision image build)"
    missing = sorted(set(packages) - set(record.packages))
    if missing:
        return f"its proof does not cover {', '.join(missing[:5])} (run provision image build)"
    return None


def kernel_release(names: Sequence[str]) -> str | None:
    """The newest kernel release in an image, from its file names (``boot/vmlinuz-<release>``)."""
    found = sorted(m[1] for n in names if (m := re.match(r"^(?:\./)?boot/vmlinuz-(.+)$", n)))
    return found[-1] if found else None


def commands(proxy: str | None, requests: Sequence[AptRequest]) -> list[list[str]]:
    """The proof's apt commands, run in the image with ``chroot``: update (an error on any
    source fails it), then one simulation per request. apt reads only the proof's sources
    and keeps its lists apart from the image's."""
    opts = [f"-oDir::Etc::sourcelist={WORK}/sources.list", f"-oDir::Etc::sourceparts={WORK}/sources.list.d",
            f"-oDir::State::lists={WORK}/lists", f"-oDir::Cache={WORK}/cache", "-oAcquire::Retries=3",
            "-oAcquire::Retries::Delay=false", "-oAcquire::http::Timeout=60", "-oAcquire::https::Timeout=60",
            "-oAPT::Get::List-Cleanup=false", "-oDebug::NoLocking=true"]
    if proxy:
        opts.append(f"-oAcquire::http::Proxy={proxy}")
    out = [["apt-get", *opts, "-q", "update", "--error-on=any"]]
    out += [["apt-get", *opts, "-q", "install", "--simulate", "--no-install-recommends", *r.packages]
            for r in requests]
    return out


# --------------------------------------------------------------------------- edge
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def fetch_key(url: str, proxy: str | None, timeout: float = KEY_TIMEOUT) -> bytes:
    handlers: list[urllib.request.BaseHandler] = []
    if proxy:
        handlers.append(urllib.request.ProxyHandler({"http": proxy}))
    opener = urllib.request.build_opener(*handlers)
    with opener.open(url, timeout=timeout) as response:
        data: bytes = response.read(KEY_LIMIT + 1)
    if len(data) > KEY_LIMIT:
        raise OSError(f"more than {KEY_LIMIT} bytes")
    return data


def place_keys(root: Path, repos: Sequence[Repository], proxy: str | None,
               fetch: Callable[[str, str | None], bytes] = fetch_key) -> None:
    """Each repository's key at :func:`key_path` inside ``root``, as the role would get it."""
    for repo in repos:
        dest = root / key_path(repo).lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        key = repo.signed_by
        if key.startswith("-----BEGIN"):
            dest.write_text(key + "\n")
        elif re.match(r"^https?://", key):
            try:
                dest.write_bytes(fetch(key, proxy))
            except OSError as exc:
                raise ProofError(f"cannot fetch the key of the {repo.name} repository (role {repo.role}) from "
                                 f"{key}: {exc}") from None
        elif key.startswith("/") and (root / key.lstrip("/")).is_file():
            shutil.copyfile(root / key.lstrip("/"), dest)
        else:
            raise ProofError(f"the {repo.name} repository (role {repo.role}) names no key the proof can "
                             f"use: signed_by {key!r}")


def prove(image: Path, sha256: str, os_name: str, os_sources: Sequence[str], proxy: str | None,
          derive: Callable[[str], ProofInput], *, run: Runner = subprocess.run,
          fetch: Callable[[str, str | None], bytes] = fetch_key, update_timeout: float = UPDATE_TIMEOUT,
          simulate_timeout: float = SIMULATE_TIMEOUT) -> Record:
    """Unpack ``image`` into a scratch folder beside it, and in a chroot there ask apt about
    every request of ``derive(kernel)`` (``kernel``: the image's own) in the OS's sources and
    the repositories the roles add. Writes and returns the record; raises :class:`ProofError`
    with the failure message. Needs root (the build does)."""
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=image.parent))
    try:
        root = work / "root"
        root.mkdir()
        unpack = run(["tar", "-x", "-C", str(root), "--numeric-owner", "-f", str(image)],
                     capture_output=True, text=True, timeout=update_timeout, check=False)
        if unpack.returncode != 0:
            raise ProofError(f"{os_name}: cannot unpack {image.name} for its proof: {unpack.stderr.strip()}")
        names = [str(p.relative_to(root)) for p in (root / "boot").glob("vmlinuz-*")]
        kernel = kernel_release(names)
        if kernel is None:
            raise ProofError(f"{os_name}: the image {image.name} holds no kernel (boot/vmlinuz-*)")
        wanted = derive(kernel)
        looked_in = sources(os_sources, wanted.repositories)
        (root / WORK.lstrip("/") / "lists" / "partial").mkdir(parents=True)
        (root / WORK.lstrip("/") / "sources.list.d").mkdir()  # empty: the image's own sources stay out
        (root / WORK.lstrip("/") / "cache" / "archives" / "partial").mkdir(parents=True)
        (root / WORK.lstrip("/") / "sources.list").write_text("".join(f"{s}\n" for s in looked_in))
        resolv = root / "etc" / "resolv.conf"
        resolv.unlink(missing_ok=True)  # the image's points at systemd-resolved's stub
        if Path("/etc/resolv.conf").is_file():
            shutil.copyfile("/etc/resolv.conf", resolv)
        place_keys(root, wanted.repositories, proxy, fetch)
        cmds = commands(proxy, wanted.requests)
        env = {**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}
        update = _chroot(run, root, cmds[0], env, update_timeout, os_name, looked_in)
        if update.returncode != 0:
            errors = [ln for ln in (update.stdout + update.stderr).splitlines() if ln.startswith(("E:", "W:", "Err:"))]
            raise ProofError("\n".join([f"{os_name}: apt-get update failed in the image (exit {update.returncode}):",
                                        *(f"  {e}" for e in errors[:20]), f"{os_name}: sources looked in:",
                                        *(f"  {s}" for s in looked_in)]))
        failures: list[tuple[Unresolved, AptRequest]] = []
        for req, cmd in zip(wanted.requests, cmds[1:], strict=True):
            result = _chroot(run, root, cmd, env, simulate_timeout, os_name, looked_in)
            if result.returncode == 0:
                continue
            found = attribute(parse_apt(result.stdout + result.stderr), req)
            if not found:  # apt failed in a way not parsed: name the whole request with apt's errors
                errs = "; ".join(ln for ln in (result.stdout + result.stderr).splitlines() if ln.startswith("E:"))
                found = [(Unresolved(" ".join(req.packages), errs or f"apt-get exit {result.returncode}"), req)]
            failures += found
        if failures:
            raise ProofError(failure_message(os_name, failures, looked_in))
        record = Record(os_name, sha256, kernel, looked_in, wanted.packages, round(time.monotonic() - start, 1),
                        proven_at=time.time())
        path = record_path(image)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(record_text(record))
        os.replace(tmp, path)
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _chroot(run: Runner, root: Path, cmd: list[str], env: dict[str, str], timeout: float, os_name: str,
            looked_in: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return run(["chroot", str(root), *cmd], capture_output=True, text=True, timeout=timeout, env=env,
                   check=False)
    except subprocess.TimeoutExpired:
        raise ProofError("\n".join([f"{os_name}: {' '.join(cmd[:1] + cmd[-3:])} took longer than {timeout:.0f} s "
                                    "in the image; gave up", f"{os_name}: sources looked in:",
                                    *(f"  {s}" for s in looked_in)])) from None


def read_record(image: Path) -> Record | None:
    path = record_path(image)
    try:
        return parse_record(path.read_text())
    except OSError:
        return None

