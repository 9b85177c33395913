"""The edges of the PXE installs' preflight (the decisions: ``areas/baremetal/preflight.py``):
the image cache and the images' proofs, the deploy ramdisk's kernel modules, the BMCs.
``apply`` runs every check before it arms or powers anything and stops on a failure;
``apply --check`` and ``plan`` show them (``plan`` asks no BMC: that is apply's, which
passes :func:`provisioner.bmc.bmc_answers`; so plan loads no BMC driver)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rich.console import Console

from provisioner import packages
from provisioner.areas import registry
from provisioner.errors import ProvisionError
from provisioner.image.build import ImageError, initramfs_names, read_sidecar
from provisioner.image.recipe import RAMDISK
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

Check = registry.PreflightCheck


def _decisions() -> registry.Preflight | None:
    """The installing area's preflight (None: no area installs nodes, or it has none)."""
    install = registry.install()
    return install.preflight if install is not None else None


def failed(found: Sequence[Check]) -> list[Check]:
    decisions = _decisions()
    return decisions.failed(found) if decisions is not None else []


def refusal(found: Sequence[Check]) -> str:
    decisions = _decisions()
    return decisions.refusal(found) if decisions is not None else ""


def _installs() -> registry.Preflight:
    decisions = _decisions()
    if decisions is None:
        raise ProvisionError("preflight: no area installs nodes")
    return decisions


def image_inputs(m: Manifest, cache: Path, os_names: Sequence[str]) -> dict[str, tuple[str, str | None, str | None]]:
    """Per OS: the published file, its SHA-256 (None: not in the cache), and why its proof
    does not cover it for this manifest now (None: it does)."""
    out: dict[str, tuple[str, str | None, str | None]] = {}
    for os_name in os_names:
        file = _installs().image_file(m, os_name)
        path = cache / file
        digest = read_sidecar(path) if path.exists() else None
        problem = None
        if digest is not None:
            _record, problem = packages.proof_state(m, os_name, path.resolve(), digest)
        out[os_name] = (file, digest, problem)
    return out


def ramdisk_modules(cache: Path) -> set[str] | None:
    """The deploy ramdisk's kernel modules (None: no ramdisk in the cache)."""
    initrd = cache / RAMDISK / "initrd.img"
    if not initrd.is_file():
        return None
    try:
        return _installs().module_names(initramfs_names(initrd))
    except (OSError, EOFError, ImageError) as exc:
        raise ProvisionError(f"preflight: cannot read the deploy ramdisk {initrd}: {exc}") from None


def run(m: Manifest, cache: Path, nodes: Sequence[str],
        bmc: Callable[[Sequence[Node]], Mapping[str, tuple[bool, str, tuple[str, ...] | None]]] | None,
        ) -> list[Check]:
    """Every preflight check of ``nodes`` (the installs of this run); ``bmc`` asks their BMCs
    (``provisioner.bmc.bmc_answers``; None: not asked, as in ``plan``)."""
    decisions = _decisions()
    if not nodes or decisions is None:
        return []
    chosen = [m.node(n) for n in nodes]
    deploys = [n for n in chosen if decisions.method(m, n) == "image"]
    inputs = registry.PreflightInputs(
        images=image_inputs(m, cache, sorted({n.os for n in deploys})),
        ramdisk_modules=ramdisk_modules(cache) if deploys else None,
        bmc=bmc(chosen) if bmc is not None else None,
    )
    return decisions.checks(m, nodes, inputs)


def print_checks(console: Console, checks: Sequence[Check], prefix: str = "preflight: ") -> None:
    for c in checks:
        console.print(f"{prefix}{c.line()}", style=None if c.ok else "bold red", markup=False, highlight=False)
