"""Load a manifest and check it whole: the manifest layer (schema, positions, structural
checks), then every area's checks (provisioner.areas.registry).

The areas' checks compute role variables, which assumes the references between sections
resolve, so they run only on an otherwise clean manifest. Errors raise ManifestError with
``file:line:col`` diagnostics; warnings come back in ``Loaded.warnings``.
"""

from __future__ import annotations

from pathlib import Path

from provisioner import overrides
from provisioner.areas import registry
from provisioner.content import project_root
from provisioner.errors import ManifestError
from provisioner.manifest import load as manifest_load
from provisioner.manifest.checks import sort_diagnostics
from provisioner.manifest.load import Loaded
from provisioner.manifest.source import Source, parse_text, read_source

__all__ = ["Loaded", "load_manifest", "load_source", "load_text"]


def load_source(source: Source) -> Loaded:
    loaded = manifest_load.load_source(source)
    diags = [d for check in registry.checks() for d in check(loaded.manifest, source)]
    if loaded.manifest.role_vars:  # the roles' argument specs are read only when there is something to check
        diags += overrides.check(loaded.manifest, source, overrides.load_specs(project_root() / "roles"))
    errors, warnings = sort_diagnostics(diags)
    if errors:
        raise ManifestError(errors)
    loaded.warnings.extend(warnings)
    return loaded


def load_manifest(path: str | Path) -> Loaded:
    return load_source(read_source(path))


def load_text(text: str, file: str = "manifest.yaml") -> Loaded:
    return load_source(parse_text(text, file))
