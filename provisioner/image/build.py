"""Building, caching, fetching and verifying node OS images (side effects at this edge).

Layout of the image cache (``.provision/images/`` beside the manifest unless given):

* ``<os>-<key>.tar.zst`` and ``<os>-<key>.tar.zst.sha256`` (``sha256sum`` format): a built
  image, ``key`` the content hash of its recipe (:mod:`provisioner.image.recipe`);
* ``<os>-named-<sha256[:16]>.<ext>`` (+ ``.sha256``): an image the manifest names, fetched
  and verified;
* ``<os><ext>`` / ``<os><ext>.sha256``: the current image of ``os`` for the manifest (a
  symbolic link to the file above and a copy of its checksum line), what the PXE server
  publishes; ``ext`` is the image's own compression (``.tar.zst`` when built), so the deploy
  agent unpacks it with the right tar flag. At most one per OS.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from provisioner.errors import ProvisionError
from provisioner.image import builder
from provisioner.image.recipe import KEYRINGS, RAMDISK, ImageRecipe, build_environment, mmdebstrap_command
from provisioner.manifest.cluster import BUILT_IMAGE_EXT, IMAGE_EXTS

BUILD_TIMEOUT = 3600.0
FETCH_TIMEOUT = 60.0
CHUNK = 1 << 20
PARTIAL_PREFIX = ".partial-"  # a file being built or fetched
RAMDISK_WORK_PREFIX = ".ramdisk-"  # the deploy ramdisk's tree while it is built

Runner = Callable[..., Any]


class ImageError(ProvisionError):
    """An image could not be built, fetched or verified (the message says which and why)."""


@dataclass(frozen=True)
class Image:
    os: str
    path: Path
    sha256: str
    source: str  # built, cached, fetched
    seconds: float = 0.0


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def sidecar_line(digest: str, path: Path) -> str:
    return f"{digest}  {path.name}\n"


def read_sidecar(path: Path) -> str | None:
    """The SHA-256 in ``<path>.sha256``, or None when there is none (or it is not one)."""
    try:
        first = sidecar(path).read_text().split()
    except OSError:
        return None
    return first[0] if first and len(first[0]) == 64 else None


def verify(path: Path, expected: str, what: str) -> str:
    """Raise ImageError unless ``path`` hashes to ``expected``; return the digest."""
    got = sha256_file(path)
    if got != expected.lower():
        raise ImageError(f"{what}: SHA-256 mismatch: expected {expected.lower()}, got {got} ({path})")
    return got


def current_name(os_name: str, ext: str = BUILT_IMAGE_EXT) -> str:
    """The link to the current image of ``os_name``, named with the image's own extension."""
    return f"{os_name}{ext}"


def image_ext(name: str) -> str:
    """The tarball extension ``name`` ends in (its compression)."""
    for ext in IMAGE_EXTS:
        if name.endswith(ext):
            return ext
    raise ImageError(f"{name}: not a .tar.gz, .tar.xz or .tar.zst root file system tarball")


def _publish(cache: Path, os_name: str, image: Path, digest: str) -> None:
    """Point ``<os><ext>`` (link) and its checksum file at ``image``; a link of ``os_name``
    with another extension (an earlier image of another compression) goes."""
    ext = image_ext(image.name)
    current = cache / current_name(os_name, ext)
    tmp = cache / f".{os_name}.link"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(image.name)
    os.replace(tmp, current)
    sidecar(current).write_text(sidecar_line(digest, current))
    for other in IMAGE_EXTS:
        if other != ext:
            stale = cache / current_name(os_name, other)
            if stale.is_symlink():
                stale.unlink()
                sidecar(stale).unlink(missing_ok=True)


def host_problem(r: ImageRecipe, exists: Callable[[str], bool]) -> str | None:
    """Why this host cannot build ``r`` although mmdebstrap is there (its archive keyring, or
    a hook directory of mmdebstrap's, is missing), in one line with how to mend it; None when
    it can."""
    path, how = KEYRINGS[r.distro]
    if not exists(path):
        return f"building the {r.os} image needs the {r.distro} archive keyring {path}, which this host lacks: {how}"
    for hooks in r.hook_dirs:
        if not exists(hooks):
            return (f"building the {r.os} image needs mmdebstrap's hooks {hooks}, which this host's mmdebstrap lacks: "
                    "use mmdebstrap 1.3 or newer (Debian 12's)")
    return None


def cached(r: ImageRecipe, cache: Path) -> Image | None:
    """The built image of ``r`` if the cache holds it with a checksum that still matches."""
    path = cache / r.file_name
    expected = read_sidecar(path)
    if not path.is_file() or expected is None:
        return None
    verify(path, expected, f"cached {r.os} image")
    return Image(r.os, path, expected, "cached")


def build(r: ImageRecipe, cache: Path, *, run: Runner = builder.run, timeout: float = BUILD_TIMEOUT,
          which: Callable[[str], str | None] = shutil.which, euid: Callable[[], int] = os.geteuid,
          exists: Callable[[str], bool] = os.path.exists) -> Image:
    """Build ``r`` into ``cache`` unless the cache holds it already; publish it as current.
    ``run`` runs mmdebstrap (:func:`provisioner.image.builder.run`: a stop leaves nothing
    mounted)."""
    cache.mkdir(parents=True, exist_ok=True)
    found = cached(r, cache)
    if found is not None:
        _publish(cache, r.os, found.path, found.sha256)
        return found
    if which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is not installed: apt-get install mmdebstrap (Debian 12 / Ubuntu 22.04+)")
    if which("zstd") is None:
        raise ImageError("zstd is not installed (mmdebstrap compresses the image with it): apt-get install zstd")
    if euid() != 0:
        raise ImageError("building an image needs root (mmdebstrap --mode=root): run it with sudo")
    problem = host_problem(r, exists)
    if problem:
        raise ImageError(problem)
    path = cache / r.file_name
    partial = cache / f"{PARTIAL_PREFIX}{r.file_name}"
    partial.unlink(missing_ok=True)
    start = time.monotonic()
    try:  # whatever ends the build early (a failure, a signal), no partial tarball stays
        try:
            result = run(mmdebstrap_command(r, str(partial)), env={**os.environ, **build_environment(r)},
                         timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ImageError(f"building the {r.os} image took longer than {timeout:.0f} s; gave up") from None
        if result.returncode != 0 or not partial.is_file():
            raise ImageError(f"mmdebstrap failed building the {r.os} image (exit {result.returncode}) "
                             f"from {r.mirror}")
        digest = sha256_file(partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)
    sidecar(path).write_text(sidecar_line(digest, path))
    _publish(cache, r.os, path, digest)
    return Image(r.os, path, digest, "built", time.monotonic() - start)


def fetch(os_name: str, url: str, sha256: str, cache: Path, *, timeout: float = FETCH_TIMEOUT,
          total: float = BUILD_TIMEOUT) -> Image:
    """Download the image the manifest names into the cache and verify it before keeping it:
    a file whose checksum does not match is deleted and never published. ``timeout`` bounds
    each read, ``total`` the whole download."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{os_name}-named-{sha256[:16]}{image_ext(url)}"
    if path.is_file() and read_sidecar(path) == sha256:
        verify(path, sha256, f"cached {os_name} image from {url}")
        _publish(cache, os_name, path, sha256)
        return Image(os_name, path, sha256, "cached")
    partial = cache / f"{PARTIAL_PREFIX}{path.name}"
    start = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, partial.open("wb", buffering=0) as out:
            while chunk := response.read(CHUNK):
                _write_all(out, chunk, partial)
                if time.monotonic() - start > total:
                    raise TimeoutError(f"the download took longer than {total:.0f} s")
        verify(partial, sha256, f"the {os_name} image {url}")
    except CacheWriteError:  # the cache's disk, not the server: the error names the file
        partial.unlink(missing_ok=True)
        raise
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ImageError(f"cannot fetch the {os_name} image {url}: {exc}") from None
    except BaseException:  # a wrong checksum, a signal: no partial download stays
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)
    sidecar(path).write_text(sidecar_line(sha256, path))
    _publish(cache, os_name, path, sha256)
    return Image(os_name, path, sha256, "fetched", time.monotonic() - start)


class CacheWriteError(OSError):
    """Writing into the image cache failed (a full disk): not the download's fault."""


def _write_all(out: BinaryIO, data: bytes, path: Path) -> None:
    """Write ``data`` to the unbuffered ``out`` (the file ``path``); a failure names the file."""
    view = memoryview(data)
    try:
        while view:
            view = view[out.write(view) or 0:]
    except OSError as exc:
        raise CacheWriteError(exc.errno, exc.strerror, str(path)) from None


def current(cache: Path, os_name: str) -> Image | None:
    """The image published as current for ``os_name`` (None when there is none)."""
    for ext in IMAGE_EXTS:
        link = cache / current_name(os_name, ext)
        digest = read_sidecar(link)
        if link.exists() and digest is not None:
            return Image(os_name, link.resolve(), digest, "cached")
    return None


# --------------------------------------------------------------------------- deploy ramdisk
@dataclass(frozen=True)
class Ramdisk:
    directory: Path  # vmlinuz, initrd.img, SHA256SUMS
    source: str  # built, cached
    seconds: float = 0.0

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"


def cpio_header(name: str, mode: int, size: int, *, ino: int, mtime: int = 0, rdev: tuple[int, int] = (0, 0),
                uid: int = 0, gid: int = 0) -> bytes:
    """One ``newc`` cpio header with its name, padded to 4 bytes (the kernel's initramfs format)."""
    encoded = name.encode() + b"\0"
    fields = (ino, mode, uid, gid, 1, mtime, size, 0, 0, rdev[0], rdev[1], len(encoded), 0)
    head = b"070701" + b"".join(f"{v:08x}".encode() for v in fields) + encoded
    return head + b"\0" * (-len(head) % 4)


def write_initramfs(tree: Path, out: Path, skip: tuple[str, ...] = ("boot",)) -> None:
    """``tree`` as a gzip'd newc cpio archive (what the kernel unpacks as its initramfs),
    without the top-level entries in ``skip``. Owners, modes, links and device nodes kept."""
    ino = 0
    with gzip.open(out, "wb", compresslevel=6) as f:
        for root, dirs, files in os.walk(tree):
            rel_root = Path(root).relative_to(tree)
            if rel_root == Path("."):
                dirs[:] = [d for d in dirs if d not in skip]
                files = [n for n in files if n not in skip]
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = Path(root) / name
                rel = str(rel_root / name) if rel_root != Path(".") else name
                st = path.lstat()
                ino += 1
                if stat.S_ISLNK(st.st_mode):
                    target = os.readlink(path).encode()
                    f.write(cpio_header(rel, st.st_mode, len(target), ino=ino, uid=st.st_uid, gid=st.st_gid))
                    f.write(target + b"\0" * (-len(target) % 4))
                elif stat.S_ISREG(st.st_mode):
                    f.write(cpio_header(rel, st.st_mode, st.st_size, ino=ino, uid=st.st_uid, gid=st.st_gid))
                    with path.open("rb") as data:
                        shutil.copyfileobj(data, f, CHUNK)
                    f.write(b"\0" * (-st.st_size % 4))
                else:  # directories, device nodes, fifos
                    rdev = (os.major(st.st_rdev), os.minor(st.st_rdev)) if (
                        stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) else (0, 0)
                    f.write(cpio_header(rel, st.st_mode, 0, ino=ino, rdev=rdev, uid=st.st_uid, gid=st.st_gid))
        f.write(cpio_header("TRAILER!!!", 0, 0, ino=0))


def initramfs_names(path: Path) -> list[str]:
    """The names in a gzip'd newc cpio archive (what :func:`write_initramfs` writes), read
    as a stream: the deploy ramdisk's file list, e.g. its kernel modules (preflight)."""
    names: list[str] = []
    with gzip.open(path, "rb") as f:
        while True:
            head = f.read(110)
            if len(head) < 110 or not head.startswith(b"070701"):
                raise ImageError(f"{path} is not a newc cpio archive (at entry {len(names)})")
            fields = [int(head[6 + 8 * i:14 + 8 * i], 16) for i in range(13)]
            size, namesize = fields[6], fields[11]
            name = f.read(namesize + (-(110 + namesize) % 4))[:namesize - 1].decode(errors="replace")
            if name == "TRAILER!!!":
                return names
            names.append(name)
            remaining = size + (-size % 4)
            while remaining:
                chunk = f.read(min(remaining, CHUNK))
                if not chunk:
                    raise ImageError(f"{path} ends inside {name}")
                remaining -= len(chunk)


def build_ramdisk(r: ImageRecipe, cache: Path, *, run: Runner = builder.run, timeout: float = BUILD_TIMEOUT,
                  which: Callable[[str], str | None] = shutil.which, euid: Callable[[], int] = os.geteuid,
                  exists: Callable[[str], bool] = os.path.exists) -> Ramdisk:
    """The deploy ramdisk (kernel + initramfs) of ``r`` in ``cache/deploy-ramdisk-<key>/``,
    built unless there; ``cache/deploy-ramdisk`` points at it."""
    assert r.os == RAMDISK
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / f"{RAMDISK}-{r.key}"
    current = cache / RAMDISK
    if (final / "SHA256SUMS").is_file():
        for line in (final / "SHA256SUMS").read_text().splitlines():
            digest, name = line.split()
            verify(final / name, digest, f"cached deploy ramdisk {name}")
        _link(current, final.name)
        return Ramdisk(final, "cached")
    if which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is not installed: apt-get install mmdebstrap (Debian 12 / Ubuntu 22.04+)")
    if euid() != 0:
        raise ImageError("building the deploy ramdisk needs root (mmdebstrap --mode=root): run it with sudo")
    problem = host_problem(r, exists)
    if problem:
        raise ImageError(problem)
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=RAMDISK_WORK_PREFIX, dir=cache))
    try:
        tree = work / "tree"
        try:
            result = run(mmdebstrap_command(r, str(tree), "directory"), env={**os.environ, **build_environment(r)},
                         timeout=timeout, check=False, also=work)  # the tree is where mmdebstrap mounts
        except subprocess.TimeoutExpired:
            raise ImageError(f"building the deploy ramdisk took longer than {timeout:.0f} s; gave up") from None
        kernels = sorted((tree / "boot").glob("vmlinuz-*")) if result.returncode == 0 else []
        if not kernels:
            raise ImageError(f"mmdebstrap failed building the deploy ramdisk (exit {result.returncode}) "
                             f"from {r.mirror}")
        out = work / "out"
        out.mkdir()
        shutil.copyfile(kernels[-1], out / "vmlinuz")
        write_initramfs(tree, out / "initrd.img")
        sums = "".join(sidecar_line(sha256_file(out / n), out / n) for n in ("vmlinuz", "initrd.img"))
        (out / "SHA256SUMS").write_text(sums)
        out.chmod(0o755)
        os.replace(out, final)
    finally:
        builder.remove(work)  # never through a mount point
    _link(current, final.name)
    return Ramdisk(final, "built", time.monotonic() - start)


def _link(link: Path, target: str) -> None:
    tmp = link.with_name(f".{link.name}.link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def deploy_extra_vars(cache: Path, files: Mapping[str, str]) -> dict[str, object]:
    """Extra variables for ``playbooks/baremetal.yml``: the image cache to publish, and per OS of
    ``files`` (OS -> the current image's name the deploy plans download, ``<os><ext>``) that
    name and its SHA-256, read from its checksum file. An OS whose image the cache does not
    hold under that name, or a cache without the deploy ramdisk, is left out: the role then
    refuses the image deploys that need it, naming the command that makes it."""
    empty: dict[str, object] = {"pxe_server_images_src": "", "pxe_server_image_sha256": {},
                                "pxe_server_image_files": {}}
    if not (cache / RAMDISK / "SHA256SUMS").is_file():
        return empty
    sums = {os_name: digest for os_name, name in sorted(files.items())
            if (cache / name).exists() and (digest := read_sidecar(cache / name)) is not None}
    return {"pxe_server_images_src": str(cache), "pxe_server_image_sha256": sums,
            "pxe_server_image_files": {os_name: files[os_name] for os_name in sums}}
