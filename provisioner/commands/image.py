"""`provision image build MANIFEST [--os OS]`: the node OS images of the manifest's image deploys;
`provision image prune MANIFEST [--keep N] [--dry-run]`: the old ones out of the cache.

Per OS the manifest's nodes use (or ``--os``): the image the manifest names in
``cluster.images`` is fetched and verified against its SHA-256; otherwise one is built with
mmdebstrap from ``cluster.mirrors.apt`` (:mod:`provisioner.image`), unless the cache holds
the same recipe's image already. A built image carries what the areas' roles install on
every node anyway (provisioner.areas.registry.image_packages): the common role's base
packages, and for a monitored cluster the monitoring agent; and what every node deployed
from it gets from the areas' image roles (provisioner.packages.image_extras: the NFS client,
munge and Slurm's packages from the OS's archive), so a new node's first apply unpacks
nothing it could have brought. Then each image is proven: every
package the roles will install on its OS's nodes resolves in it from the sources they use
(:mod:`provisioner.image.proof`, the list from :mod:`provisioner.packages`), unless
``--skip-proof``.

Prune keeps each OS's current image and the current deploy ramdisk (what the PXE server
publishes), and the ``--keep`` newest older ones of each (default 1: one to go back to); see
:mod:`provisioner.image.prune`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from provisioner import packages
from provisioner.areas import registry
from provisioner.commands.common import guarded, load
from provisioner.errors import ProvisionError
from provisioner.image import agent, proof
from provisioner.image import prune as cache_prune
from provisioner.image.build import Image, build, build_ramdisk, fetch
from provisioner.image.recipe import ImageRecipeError, ramdisk_recipe, recipe
from provisioner.manifest.model import Manifest
from provisioner.proctree import processes_end_with_a_signal
from provisioner.state import StateDir


def image_dir(manifest: Path, override: Path | None) -> Path:
    return override if override is not None else StateDir.beside(manifest).root / "images"


def os_names(m: Manifest, only: str | None) -> list[str]:
    used: list[str] = sorted({str(n.os) for n in m.nodes})
    if only is None:
        return used
    if only not in used:
        raise ProvisionError(f"--os {only}: no node of the manifest runs it (they run {', '.join(used)})")
    return [only]


def make(m: Manifest, os_name: str, cache: Path) -> Image:
    named = next((img for name, img in m.cluster.images.items() if name == os_name), None)
    if named is not None:
        return fetch(os_name, named.url, named.sha256, cache)
    mirrors = m.cluster.mirrors
    try:
        carried = registry.image_packages(m) + packages.image_extras(m, os_name)
        return build(recipe(os_name, mirrors.apt, mirrors.apt_proxy, carried), cache)
    except ImageRecipeError as exc:
        raise ProvisionError(str(exc)) from None


def prove(m: Manifest, os_name: str, image: Image,
          euid: Callable[[], int] | None = None) -> tuple[proof.Record, bool]:
    """The image's proof, made unless a record beside it already covers this manifest; and
    whether it was made now."""
    record, why_not = packages.proof_state(m, os_name, image.path, image.sha256)
    if record is not None and why_not is None:
        return record, False
    if (euid or os.geteuid)() != 0:
        raise ProvisionError(f"{os_name}: proving the image needs root (a chroot into it): run with sudo, "
                             "or give --skip-proof (apply then refuses to deploy it)")
    made = proof.prove(image.path, image.sha256, os_name, packages.os_sources(m, os_name), m.cluster.mirrors.apt_proxy,
                       lambda kernel: packages.wanted(m, os_name, kernel))
    return made, True


def image_json(image: Image, record: proof.Record | None, made: bool) -> dict[str, Any]:
    """An OS's image for ``--json``: ``seconds`` null when it came from the cache, ``proof``
    null when skipped (--skip-proof)."""
    return {"os": image.os, "source": image.source, "path": str(image.path), "sha256": image.sha256,
            "seconds": None if image.source == "cached" else round(image.seconds, 1),
            "proof": None if record is None else {
                "made": made, "packages": len(record.packages), "sources": len(record.sources),
                "kernel": record.kernel, "record": str(proof.record_path(image.path))}}


# After a signal, how long the build's other children (the proof's chroot and apt) get after
# TERM before KILL; mmdebstrap is passed the stop and waited for by provisioner/image/builder.py.
STOP_GRACE = 10.0


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """A signal ends every process of the build first (mmdebstrap after its own cleanup, so
    nothing stays mounted), then the build's partial tarball, proof tree or ramdisk tree goes,
    and one line says it."""
    with processes_end_with_a_signal(STOP_GRACE):
        return build_images(args, out, err)


def build_images(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``--json``: {ok, images: [image_json], ramdisk: {source, path, seconds} or null} on
    stdout once every image is there; the progress lines go to stderr."""
    if args.json:
        out = err
    loaded = load(err, args.manifest)
    cache = image_dir(args.manifest, args.cache_dir)
    images: list[dict[str, Any]] = []
    made_ramdisk: dict[str, Any] | None = None
    for os_name in os_names(loaded.manifest, args.os):
        what = "fetching" if os_name in loaded.manifest.cluster.images else "building"
        out.print(f"{os_name}: {what} unless cached ...", markup=False)
        image = make(loaded.manifest, os_name, cache)
        took = f" in {image.seconds:.0f} s" if image.source != "cached" else ""
        out.print(f"{os_name}: {image.source}{took}: {image.path} sha256 {image.sha256}", markup=False)
        if args.skip_proof:
            out.print(f"{os_name}: proof skipped (--skip-proof): apply will not deploy this image", markup=False)
            images.append(image_json(image, None, False))
            continue
        out.print(f"{os_name}: proving in the image that every package the roles install resolves ...",
                  markup=False)
        record, made = prove(loaded.manifest, os_name, image)
        how = f"proven in {record.seconds:.0f} s" if made else "proof cached"
        out.print(f"{os_name}: {how}: {len(record.packages)} packages resolve from {len(record.sources)} sources "
                  f"(kernel {record.kernel}): {proof.record_path(image.path)}", markup=False)
        images.append(image_json(image, record, made))
    if args.os is None and needs_ramdisk(loaded.manifest):
        m = loaded.manifest
        debian = any(n.os == "debian-12" for n in m.nodes)  # the cluster's mirror serves Debian
        r = ramdisk_recipe(m.cluster.mirrors.apt if debian else None, m.cluster.mirrors.apt_proxy,
                           Path(agent.__file__).read_text(encoding="utf-8"))
        out.print("deploy ramdisk: building unless cached ...", markup=False)
        ramdisk = build_ramdisk(r, cache)
        took = f" in {ramdisk.seconds:.0f} s" if ramdisk.source != "cached" else ""
        out.print(f"deploy ramdisk: {ramdisk.source}{took}: {ramdisk.directory}", markup=False)
        made_ramdisk = {"source": ramdisk.source, "path": str(ramdisk.directory),
                        "seconds": None if ramdisk.source == "cached" else round(ramdisk.seconds, 1)}
    if args.json:
        print(json.dumps({"ok": True, "images": images, "ramdisk": made_ramdisk}, indent=2))
    return 0


def needs_ramdisk(m: Manifest) -> bool:
    """Any node installed with an image (the deploy ramdisk writes it): the installing area says."""
    installer = registry.install()
    return installer is not None and installer.needs_ramdisk(m)


def mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"


def remove_stale(cache: Path, gone: list[cache_prune.Stale]) -> None:
    """Remove ``gone``; a file the file system refuses is one line naming it and saying what
    was removed before it."""
    try:
        cache_prune.remove(cache, gone)
    except cache_prune.RemoveError as exc:
        before = "nothing was removed" if exc.removed == 0 else (
            f"{exc.removed} of {len(gone)} removed before it: "
            + ", ".join(s.names[0] for s in gone[:exc.removed]))
        raise ProvisionError(f"cannot remove {exc.path}: {exc.reason}; {before}") from None


def run_prune(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Remove (or with --dry-run, list) what :func:`provisioner.image.prune.stale` finds; the
    manifest only locates the cache, so a manifest that no longer validates can still prune."""
    cache = image_dir(args.manifest, args.cache_dir)
    gone = cache_prune.stale(cache_prune.scan(cache), args.keep, time.time())
    if args.json:  # {ok, cache, dry_run, removed: [{names, bytes, why}], bytes}
        if not args.dry_run:
            remove_stale(cache, gone)
        print(json.dumps({"ok": True, "cache": str(cache), "dry_run": args.dry_run,
                          "removed": [{"names": list(s.names), "bytes": s.size, "why": s.why} for s in gone],
                          "bytes": sum(s.size for s in gone)}, indent=2))
        return 0
    if not gone:
        out.print(f"{cache}: nothing to prune", markup=False)
        return 0
    verb = "would remove" if args.dry_run else "removed"
    if not args.dry_run:
        remove_stale(cache, gone)
    for s in gone:
        out.print(f"{verb} {', '.join(s.names)} ({mib(s.size)}): {s.why}", markup=False)
    out.print(f"{cache}: {verb} {len(gone)}, {mib(sum(s.size for s in gone))}", markup=False)
    return 0


def main(args: argparse.Namespace) -> int:
    return guarded(run_prune if args.image_action == "prune" else run, args)
