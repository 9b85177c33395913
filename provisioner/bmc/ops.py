"""Operator-facing BMC operations over manifest nodes, in parallel, one row per node.

These back ``provision bmc status|power|pxe``: one node's failure becomes that node's row
(``ok=False`` with the reason) and never stops the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from provisioner.bmc.base import (
    Bmc,
    BmcError,
    BootOverride,
    BootTarget,
    PowerAction,
    PowerState,
    wait_for_power,
)
from provisioner.bmc.credentials import resolve_password
from provisioner.bmc.ipmi import IpmiBmc
from provisioner.bmc.redfish import RedfishBmc
from provisioner.manifest.nodes import Node

T = TypeVar("T")
BmcFactory = Callable[[Node], Bmc]


def make_bmc(
    node: Node,
    *,
    timeout: float = 20.0,
    retries: int = 3,
    environ: Mapping[str, str] | None = None,
) -> Bmc:
    """The driver for ``node.bmc`` with its password resolved (never logged)."""
    cfg = node.bmc
    if cfg is None:
        raise BmcError(node.name, "-", f"{node.name} has no bmc section in the manifest", kind="config")
    password = resolve_password(node.name, cfg, environ=environ)
    if cfg.type == "redfish":
        return RedfishBmc(
            node.name, cfg.address, user=cfg.user, password=password, port=cfg.port, system_id=cfg.system_id,
            verify_tls=cfg.verify_tls, timeout=timeout, retries=retries,
        )
    return IpmiBmc(node.name, cfg.address, user=cfg.user, password=password, port=cfg.port, timeout=timeout,
                   retries=retries)


@dataclass(frozen=True)
class BmcRow:
    """One node's line in a ``provision bmc`` table."""

    node: str
    type: str  # "redfish", "ipmi" or "-" (no BMC)
    address: str
    ok: bool
    power: PowerState | None = None
    boot: str | None = None  # e.g. "pxe, next boot only, uefi"; "none" without override
    message: str = ""
    warnings: tuple[str, ...] = field(default_factory=tuple)


def describe_boot(override: BootOverride) -> str:
    if override.target is None:
        return "none"
    parts = [str(override.target)]
    if override.once is True:
        parts.append("next boot only")
    elif override.once is False:
        parts.append("persistent")
    if override.mode is not None:
        parts.append(override.mode)
    return ", ".join(parts)


def for_each(items: Sequence[T], fn: Callable[[T], BmcRow], max_parallel: int = 16) -> list[BmcRow]:
    """Run ``fn`` over ``items`` in threads; rows come back in input order."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(items)))) as pool:
        return list(pool.map(fn, items))


def _row_base(node: Node) -> tuple[str, str]:
    if node.bmc is None:
        return "-", "-"
    return node.bmc.type, node.bmc.address


def _guard(node: Node, factory: BmcFactory, work: Callable[[Bmc], BmcRow]) -> BmcRow:
    kind, address = _row_base(node)
    try:
        bmc = factory(node)
    except BmcError as exc:
        return BmcRow(node.name, kind, address, False, message=str(exc))
    try:
        return work(bmc)
    except BmcError as exc:
        return BmcRow(node.name, kind, address, False, message=str(exc))
    finally:
        bmc.close()


def bmc_status(nodes: Sequence[Node], *, factory: BmcFactory = make_bmc, max_parallel: int = 16) -> list[BmcRow]:
    """Power state and boot override of every node."""

    def one(node: Node) -> BmcRow:
        def work(bmc: Bmc) -> BmcRow:
            kind, address = _row_base(node)
            power = bmc.power_state()
            boot = describe_boot(bmc.boot_override())
            return BmcRow(node.name, kind, address, True, power=power, boot=boot, message="")

        return _guard(node, factory, work)

    return for_each(nodes, one, max_parallel)


def bmc_answers(nodes: Sequence[Node], *, factory: BmcFactory = make_bmc,
                max_parallel: int = 16) -> dict[str, tuple[bool, str, tuple[str, ...] | None]]:
    """The install preflight's question to each node's BMC, with the manifest's credentials:
    whether it answers (power state and boot override read), what it said, and the serials
    of the drives it lists (None: it keeps no disk inventory)."""
    drives: dict[str, tuple[str, ...] | None] = {}

    def one(node: Node) -> BmcRow:
        def work(bmc: Bmc) -> BmcRow:
            kind, address = _row_base(node)
            power = bmc.power_state()
            boot = describe_boot(bmc.boot_override())
            drives[node.name] = bmc.drive_serials()
            return BmcRow(node.name, kind, address, True, power=power, boot=boot)

        return _guard(node, factory, work)

    return {row.node: (row.ok, f"power {row.power}, boot override {row.boot}" if row.ok else row.message,
                       drives.get(row.node)) for row in for_each(nodes, one, max_parallel)}


def bmc_power(
    nodes: Sequence[Node],
    action: PowerAction,
    *,
    wait: bool = True,
    wait_timeout: float = 120.0,
    poll_interval: float = 2.0,
    factory: BmcFactory = make_bmc,
    max_parallel: int = 16,
) -> list[BmcRow]:
    """Power ``on``, ``off`` or ``cycle`` every node; with ``wait``, confirm the final
    state (``on`` for on/cycle, ``off`` for off) within ``wait_timeout``."""
    if action not in ("on", "off", "cycle"):
        raise ValueError(f"unknown power action {action!r}; use on, off or cycle")

    def one(node: Node) -> BmcRow:
        def work(bmc: Bmc) -> BmcRow:
            kind, address = _row_base(node)
            if action == "on":
                bmc.power_on()
            elif action == "off":
                bmc.power_off()
            else:
                bmc.power_cycle()
            want: PowerState = "off" if action == "off" else "on"
            if wait:
                wait_for_power(bmc, want, timeout=wait_timeout, interval=poll_interval)
                return BmcRow(node.name, kind, address, True, power=want, message=f"power {action}: done")
            return BmcRow(node.name, kind, address, True, message=f"power {action}: requested")

        return _guard(node, factory, work)

    return for_each(nodes, one, max_parallel)


def bmc_pxe(
    nodes: Sequence[Node],
    *,
    target: BootTarget = "pxe",
    factory: BmcFactory = make_bmc,
    max_parallel: int = 16,
) -> list[BmcRow]:
    """Set every node's next boot (only) to ``target`` in its manifest boot mode and
    confirm it by reading it back. Does not power cycle."""

    def one(node: Node) -> BmcRow:
        def work(bmc: Bmc) -> BmcRow:
            kind, address = _row_base(node)
            mode = node.bmc.boot_mode if node.bmc is not None else "uefi"
            confirmation = bmc.set_boot_once(target, mode)
            return BmcRow(node.name, kind, address, True, boot=describe_boot(confirmation.readback),
                          message=f"next boot: {target} ({mode})", warnings=confirmation.warnings)

        return _guard(node, factory, work)

    return for_each(nodes, one, max_parallel)
