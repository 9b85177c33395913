"""Build hook: the wheel ships the Ansible content that `provision` runs.

The source tree keeps ``roles/`` and ``playbooks/`` at the top level (molecule, ansible-lint
and a checkout use them there). Building a wheel copies both into the package as the Ansible
collection ``provisioner.cluster``:

    provisioner/ansible_collections/provisioner/cluster/{galaxy.yml,meta/runtime.yml,roles/,playbooks/}

where ``provisioner.content`` finds them at run time (importlib.resources). Nothing of this
is committed; an editable install uses the checkout's folders directly. Metadata lives in
pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CONTENT = ("roles", "playbooks")
NAMESPACE, NAME = "provisioner", "cluster"  # provisioner.content.COLLECTION
COLLECTION = Path("provisioner", "ansible_collections", NAMESPACE, NAME)
MIN_ANSIBLE_CORE = "2.19.0"  # pyproject.toml: ansible-core>=2.19


class BuildPyWithCollection(build_py):
    """build_py, plus the collection copied into the build directory (not for editable installs)."""

    def run(self) -> None:
        super().run()
        self.collection_files: list[str] = []
        if not self.editable_mode:
            self.collection_files = self.copy_collection(Path(self.build_lib) / COLLECTION)

    def copy_collection(self, target: Path) -> list[str]:
        if target.exists():
            shutil.rmtree(target)  # nothing stale from an earlier build
        for name in CONTENT:
            shutil.copytree(HERE / name, target / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
        version = self.distribution.get_version()
        (target / "galaxy.yml").write_text(
            f"# Written by setup.py when the wheel was built.\n"
            f"namespace: {NAMESPACE}\nname: {NAME}\nversion: {version}\nreadme: README.md\n"
            f"authors:\n  - provisioner\n"
            f"description: The roles and playbooks of provisioner {version} (provision apply runs them).\n"
            f"license:\n  - Apache-2.0\n"
        )
        (target / "README.md").write_text(
            f"# {NAMESPACE}.{NAME}\n\nThe roles and playbooks `provision` {version} runs; built from the "
            "top-level roles/ and playbooks/ of the provisioner source tree.\n"
        )
        (target / "meta").mkdir(exist_ok=True)
        (target / "meta" / "runtime.yml").write_text(f'---\nrequires_ansible: ">={MIN_ANSIBLE_CORE}"\n')
        return [str(p) for p in sorted(target.rglob("*")) if p.is_file()]

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *getattr(self, "collection_files", [])]


setup(cmdclass={"build_py": BuildPyWithCollection})
