"""`provision validate MANIFEST`: check a manifest and report every problem with file:line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from provisioner.commands.common import guarded, load
from provisioner.errors import Diagnostic, ManifestError
from provisioner.manifest.nodes import Node
from provisioner.validate import load_manifest


def diagnostic_json(d: Diagnostic) -> dict[str, Any]:
    """A diagnostic with null for what is unknown (no line, no field path)."""
    return {"file": d.file, "line": d.line or None, "col": (d.col or 1) if d.line else None,
            "path": d.path or None, "severity": d.severity, "message": d.message}


def run_json(args: argparse.Namespace) -> int:
    """``--json``: one object, {"ok", "errors", "warnings", "cluster", "nodes", "gpus"} (the
    last three null when the manifest could not be loaded); exit 0 or 1 as without it."""
    try:
        loaded = load_manifest(args.manifest)
    except ManifestError as exc:
        print(json.dumps({"ok": False, "errors": [diagnostic_json(d) for d in exc.diagnostics if d.severity == "error"],
                          "warnings": [diagnostic_json(d) for d in exc.diagnostics if d.severity != "error"],
                          "cluster": None, "nodes": None, "gpus": None}, indent=2))
        return 1
    m = loaded.manifest
    print(json.dumps({"ok": True, "errors": [], "warnings": [diagnostic_json(d) for d in loaded.warnings],
                      "cluster": m.cluster.name, "nodes": len(m.nodes), "gpus": sum(n.gpu_count for n in m.nodes)},
                     indent=2))
    return 0


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.json:
        return run_json(args)
    loaded = load(err, args.manifest)
    m = loaded.manifest
    gpus = sum(n.gpu_count for n in m.nodes)
    summary = node_summary(m.nodes)
    out.print(
        f"{args.manifest}: OK: cluster {m.cluster.name}, {len(m.nodes)} nodes ({summary}), {gpus} GPUs, "
        f"{len(m.zfs.pools)} ZFS pools, {len(m.nfs.exports)} NFS exports"
        + (f", {len(loaded.warnings)} warnings" if loaded.warnings else ""),
        highlight=False,
    )
    return 0


def node_summary(nodes: list[Node]) -> str:
    """Nodes counted once each, by their combination of roles: ``1 head+storage, 4 compute``
    (counting per role would count a node with two roles twice)."""
    kinds: dict[str, int] = {}
    for n in nodes:
        kind = "+".join(n.roles)
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{count} {kind}" for kind, count in kinds.items())


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
