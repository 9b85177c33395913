"""The layers of provisioner/ point one way (docs/design.md, "Layers"):

    (errors, platforms) <- manifest <- (state, bmc, image, nodecheck) <- areas
           <- the engine (validate, inventory, plan, apply, verify, display, ...) <- commands <- cli

Checked on the source with ``ast``: no import cycle among our modules, the manifest layer
imports nothing above it, what lies below the areas imports neither them nor the engine,
areas import only areas and what lies below them, the engine reaches the areas only through
their registry (it imports no area by name), and every import statement sits at module
level (an import inside a function is how cycles hide).
The CLI loads command modules by name (importlib.import_module), which is no import
statement; so does the registry for the one area step that loads SSH and BMC libraries.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "provisioner"

# The modules below the manifest layer: errors, and the OS releases and node roles.
BASE = ("provisioner.errors", "provisioner.platforms")
# What the areas build on besides the manifest layer: the state directory, the BMC drivers,
# node images, and what a check of a running node is (a check, the output parsers).
BELOW_AREAS = ("provisioner.errors", "provisioner.platforms", "provisioner.state", "provisioner.bmc",
               "provisioner.image", "provisioner.nodecheck", "provisioner.secretfile")
AREAS = "provisioner.areas"
REGISTRY = "provisioner.areas.registry"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    """Our modules (a build's copy of the Ansible content is no part of the package's code)."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "ansible_collections" not in p.parts}


MODULES = sources()


def is_ours(name: str) -> bool:
    return name == "provisioner" or name.startswith("provisioner.")


def within(name: str, *packages: str) -> bool:
    """``name`` is one of ``packages`` or a module inside one."""
    return any(name == p or name.startswith(p + ".") for p in packages)


def in_engine(module: str) -> bool:
    """Above the areas: everything but the manifest layer, the areas and what they build on."""
    return not within(module, "provisioner.manifest", AREAS, *BELOW_AREAS) and module != "provisioner"


def resolve(name: str) -> str:
    """The module an imported name lives in: ``provisioner.manifest.Manifest`` -> ``provisioner.manifest``."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(module: str, tree: ast.Module) -> Iterator[tuple[ast.stmt, str]]:
    """(statement, imported module of ours) for every import statement in ``tree``."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_ours(alias.name):
                    yield node, resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if not is_ours(base):
                continue
            for alias in node.names:
                # `from provisioner import inventory` imports a module; `from x import Name` the module x
                yield node, resolve(f"{base}.{alias.name}")


def parse(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), str(MODULES[module]))


def graph() -> dict[str, set[str]]:
    return {m: {target for _, target in imports(m, parse(m)) if target != m} for m in MODULES}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path a -> b -> ... -> a, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_checker_sees_our_modules_and_their_imports() -> None:
    edges = graph()
    assert {"provisioner.cli", "provisioner.manifest.load", "provisioner.areas.registry"} <= set(edges)
    assert "provisioner.manifest.checks" in edges["provisioner.manifest.load"]
    assert "provisioner.areas.gpu.rolevars" in edges["provisioner.areas.registry"]
    assert "provisioner.inventory" in edges["provisioner.commands.inventory"]  # `from provisioner import inventory`
    assert "provisioner.manifest" in edges["provisioner.commands.common"] or any(
        t.startswith("provisioner.manifest.") for t in edges["provisioner.commands.common"])
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_manifest_layer_imports_nothing_above_it() -> None:
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{stmt.lineno}: imports {target}"
        for m in MODULES if m == "provisioner.manifest" or m.startswith("provisioner.manifest.")
        for stmt, target in imports(m, parse(m))
        if not (target.startswith("provisioner.manifest") or target in BASE)
    ]
    assert bad == []


def area_import_problems(module: str, targets: list[tuple[int, str]]) -> list[str]:
    """An area module may import areas, the manifest layer and what lies below the areas."""
    return [f"{module}:{line}: imports {target}" for line, target in targets
            if not within(target, AREAS, "provisioner.manifest", *BELOW_AREAS)]


def below_areas_import_problems(module: str, targets: list[tuple[int, str]]) -> list[str]:
    """What lies below the areas imports only the manifest layer and what lies below the areas."""
    return [f"{module}:{line}: imports {target}" for line, target in targets
            if not within(target, "provisioner.manifest", *BELOW_AREAS)]


def engine_import_problems(module: str, targets: list[tuple[int, str]]) -> list[str]:
    """An engine module reaches the areas only through the registry."""
    return [f"{module}:{line}: imports {target}" for line, target in targets
            if within(target, AREAS) and target != REGISTRY]


def targets_of(module: str) -> list[tuple[int, str]]:
    return [(stmt.lineno, target) for stmt, target in imports(module, parse(module))]


def test_areas_import_nothing_above_them() -> None:
    bad = [p for m in MODULES if within(m, AREAS) for p in area_import_problems(m, targets_of(m))]
    assert bad == []


def test_what_lies_below_the_areas_imports_nothing_above_it() -> None:
    below = [m for m in MODULES if within(m, *BELOW_AREAS)]
    assert {"provisioner.state", "provisioner.nodecheck.check", "provisioner.nodecheck.parsers"} <= set(below)
    bad = [p for m in below for p in below_areas_import_problems(m, targets_of(m))]
    assert bad == []


def test_the_engine_imports_no_area_by_name() -> None:
    engine = [m for m in MODULES if in_engine(m)]
    assert {"provisioner.apply", "provisioner.inventory", "provisioner.plan", "provisioner.verify.catalog",
            "provisioner.commands.image", "provisioner.display", "provisioner.cli"} <= set(engine)
    assert not any(in_engine(m) for m in ("provisioner.areas.gpu.verify", "provisioner.nodecheck.check",
                                          "provisioner.manifest.model", "provisioner.bmc.ops"))
    bad = [p for m in engine for p in engine_import_problems(m, targets_of(m))]
    assert bad == []


def test_the_import_rules_catch_what_they_forbid() -> None:
    assert engine_import_problems("provisioner.plan", [(3, "provisioner.areas.baremetal.decide")]) == [
        "provisioner.plan:3: imports provisioner.areas.baremetal.decide"]
    assert engine_import_problems("provisioner.plan", [(3, REGISTRY), (4, "provisioner.state")]) == []
    assert area_import_problems("provisioner.areas.gpu.verify", [(5, "provisioner.verify.catalog")]) == [
        "provisioner.areas.gpu.verify:5: imports provisioner.verify.catalog"]
    assert area_import_problems("provisioner.areas.gpu.verify", [(5, "provisioner.verify.run")]) == [
        "provisioner.areas.gpu.verify:5: imports provisioner.verify.run"]
    assert below_areas_import_problems("provisioner.nodecheck.check", [(7, "provisioner.verify.catalog"),
                                                                       (8, "provisioner.nodecheck.parsers")]) == [
        "provisioner.nodecheck.check:7: imports provisioner.verify.catalog"]
    assert area_import_problems("provisioner.areas.gpu.verify", [(5, "provisioner.nodecheck.check"),
                                                                 (6, "provisioner.areas.storage.decide")]) == []


def function_level_imports(tree: ast.Module) -> list[ast.stmt | ast.expr]:
    """Import statements (and __import__ calls) inside a function, method or class body."""
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    found: dict[int, ast.stmt | ast.expr] = {}
    for scope in ast.walk(tree):
        if not isinstance(scope, scopes):
            continue
        for node in ast.walk(scope):
            if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__"
            ):
                found[id(node)] = node  # nested scopes see a node more than once
    return list(found.values())


def test_imports_only_at_module_level() -> None:
    bad = sorted({
        f"{MODULES[m].relative_to(ROOT)}:{node.lineno}"
        for m in MODULES for node in function_level_imports(parse(m))
    })
    assert bad == []


@pytest.mark.parametrize("code", [
    "def f():\n    import os\n",
    "class C:\n    def m(self):\n        from provisioner import plan\n",
    "def f():\n    return __import__('types')\n",
])
def test_function_level_imports_are_found(code: str) -> None:
    assert len(function_level_imports(ast.parse(code))) == 1


def test_module_level_imports_are_fine() -> None:
    code = "import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x import y\n"
    assert function_level_imports(ast.parse(code)) == []


def test_the_cli_imports_no_command_module() -> None:
    # --help must stay cheap: the command modules are loaded by name, only when chosen
    targets = {t for _, t in imports("provisioner.cli", parse("provisioner.cli"))}
    # defaults and choices for the parser's help (--os: the platform table), nothing else
    assert targets <= {"provisioner.settings", "provisioner.platforms"}
    for light in ("provisioner.settings", "provisioner.platforms"):
        assert {t for _, t in imports(light, parse(light))} == set(), light
