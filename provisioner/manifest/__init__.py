"""The cluster manifest: schema, loading with source positions, node selectors and the
structural whole-manifest checks. Imports nothing from the areas; ``provisioner.validate``
adds the areas' checks on top."""

from provisioner.manifest.load import Loaded, load_source
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import SelectorError, select_nodes

__all__ = ["Loaded", "Manifest", "Node", "SelectorError", "load_source", "select_nodes"]
