"""What every command shares: the consoles, diagnostics, error handling, loading, --limit."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from provisioner.errors import Diagnostic, ManifestError, ProvisionError
from provisioner.interrupts import Interrupted
from provisioner.manifest import ranges
from provisioner.manifest.load import Loaded
from provisioner.manifest.select import SelectorError, select_nodes
from provisioner.validate import load_manifest

Command = Callable[[argparse.Namespace, Console, Console], int]


def consoles() -> tuple[Console, Console]:
    """stdout and stderr; no wrapping, and 160 columns when not a terminal."""
    out = Console(highlight=False, emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True, width=None if sys.stderr.isatty() else 160)
    return out, err


MAX_DIAGNOSTICS = 100  # of each severity printed; the rest are counted in one line


def print_diagnostics(console: Console, diags: list[Diagnostic], most: int = MAX_DIAGNOSTICS) -> None:
    """Each diagnostic on its line, at most ``most`` of each severity (in file order), then
    one line counting the rest: 20,000 errors are not 20,000 lines."""
    shown: dict[str, int] = {}
    for d in diags:
        shown[d.severity] = shown.get(d.severity, 0) + 1
        if shown[d.severity] <= most:
            style = "red" if d.severity == "error" else "yellow"
            console.print(d.format(), style=style, markup=False, highlight=False, soft_wrap=True)
    for severity, count in shown.items():
        if count > most:
            console.print(f"... and {count - most:,} more {severity}s", style="red" if severity == "error" else
                          "yellow", markup=False, highlight=False, soft_wrap=True)


def guarded(command: Command, args: argparse.Namespace) -> int:
    """Run ``command``: problems become messages and exit codes, never a traceback for the
    operator (unless PROVISION_DEBUG asks for one)."""
    out, err = consoles()
    try:
        return command(args, out, err)
    except ManifestError as exc:
        print_diagnostics(err, exc.diagnostics)
        return 1
    except Interrupted as exc:  # after SIGHUP the terminal may be gone: the exit code still says it
        with contextlib.suppress(OSError):
            err.print(str(exc), style="red", markup=False, highlight=False)
        return exc.exit_code
    except ProvisionError as exc:
        err.print(f"error: {exc}", style="red", markup=False, highlight=False)
        return 1
    except BrokenPipeError:
        return 1
    except OSError as exc:  # the file system refused (full, read-only): say where, in one line
        where = f"{exc.filename}: " if exc.filename else ""
        err.print(f"error: {where}{exc.strerror or exc}", style="red", markup=False, highlight=False)
        return 1
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            err.print(str(Interrupted(signal.SIGINT)), style="red", markup=False, highlight=False)
        return 130
    except Exception as exc:  # never a traceback for the operator, unless asked for
        if os.environ.get("PROVISION_DEBUG"):
            raise
        err.print(f"internal error: {type(exc).__name__}: {exc} (set PROVISION_DEBUG=1 for a traceback)",
                  style="red", markup=False, highlight=False)
        return 70


def load(console: Console, path: Path) -> Loaded:
    """Load and check the manifest (provisioner.validate); print its warnings."""
    loaded = load_manifest(path)
    print_diagnostics(console, loaded.warnings)
    return loaded


def limit(loaded: Loaded, text: str | None, what: str = "--limit") -> list[str] | None:
    """The nodes named by a node selector (None: none given); ``what`` names the option or
    argument in errors (--limit, --reinstall, NODES)."""
    if text is None:
        return None
    items = [t.strip() for t in split_selectors(text) if t.strip()]
    if not items:  # an empty limit would run the light plays everywhere
        raise ProvisionError(f"{what}: no nodes given")
    try:
        return select_nodes(loaded.manifest, items)
    except SelectorError as exc:
        raise ProvisionError(f"{what}: {exc}") from None


def split_selectors(text: str) -> list[str]:
    """Split on commas outside brackets: 'gpu[01-04],head' -> ['gpu[01-04]', 'head']."""
    return ranges.split_outside_brackets(text)
