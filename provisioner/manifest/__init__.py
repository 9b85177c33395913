"""The cluster manifest: schema, loading with source positions, and whole-manifest checks."""

from provisioner.manifest.checks import SelectorError, select_nodes
from provisioner.manifest.load import Loaded, load_manifest, load_text
from provisioner.manifest.model import Manifest, Node

__all__ = ["Loaded", "Manifest", "Node", "SelectorError", "load_manifest", "load_text", "select_nodes"]
