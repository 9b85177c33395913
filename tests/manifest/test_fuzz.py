"""Property tests: no input makes the loader (or ``provision validate``) raise a traceback.

Every outcome is either a :class:`Loaded` manifest or a :class:`ManifestError` whose
diagnostics each format to one line that starts with the file name.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.cli import main
from provisioner.errors import Diagnostic, ManifestError
from provisioner.validate import Loaded, load_manifest, load_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_NAMES = ("llm-200k.yaml", "music-lab.yaml")
EXAMPLE_DATA = {name: yaml.safe_load((EXAMPLES / name).read_text()) for name in EXAMPLE_NAMES}
EXAMPLE_TEXT = {name: (EXAMPLES / name).read_text() for name in EXAMPLE_NAMES}

# CI runs 200 examples per test; FUZZ_EXAMPLES=5000 digs deeper locally.
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml when present: the fuzz runs in CI


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=DUMPER, sort_keys=False, allow_unicode=True)


FAST = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "200")), deadline=None)

# Words the schema knows, so random structures sometimes get deep into the model.
VOCAB = [
    "version", "cluster", "name", "domain", "networks", "management", "bmc", "data", "infiniband",
    "cidr", "gateway", "mtu", "nodes", "roles", "interfaces", "ip", "mac", "hardware", "cpu",
    "cores_per_socket", "memory_gb", "gpu", "count", "model", "disks", "id", "zfs", "pools", "node",
    "vdevs", "type", "width", "nfs", "exports", "mounts", "export", "path", "mergerfs", "branches",
    "docker", "users", "slurm", "partitions", "default", "software", "password_env", "address", "user",
]  # fmt: skip
SCALARS = [
    1, 0, -1, 2, 65536, 1.5, True, False, None, "", "head", "compute", "@compute", "@nope", "gpu[1-3]",
    "gpu[3-1]", "x[1-99999]", "10.0.0.1", "10.0.0.0/24", "300.1.1.1", "52:54:00:00:00:01", "/data",
    "relative/path", "ubuntu-22.04", "mirror", "raidz1", "rdma", "off", "on", "ssh-ed25519 AAAA k",
    "\t", "a\nb", "ünïcödé", "[", "{", "*", "&", "!tag",
]  # fmt: skip


def check_outcome(run: Callable[[], Loaded], file: str) -> None:
    try:
        loaded = run()
    except ManifestError as exc:
        assert exc.diagnostics, "a ManifestError must carry diagnostics"
        check_diagnostics(exc.diagnostics, file)
    else:
        assert isinstance(loaded, Loaded)
        check_diagnostics(loaded.warnings, file)


def check_diagnostics(diags: list[Diagnostic], file: str) -> None:
    for d in diags:
        text = d.format()
        assert len(text.splitlines()) == 1, f"diagnostic spans lines: {text!r}"
        assert text.startswith(file), text
        assert d.severity in ("error", "warning")


# --------------------------------------------------------------------------- raw input
@FAST
@given(st.binary(max_size=2000))
def test_random_bytes(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.yaml"
        path.write_bytes(raw)
        check_outcome(lambda: load_manifest(path), str(path))


@FAST
@given(st.text(max_size=2000))
def test_random_text(text: str) -> None:
    check_outcome(lambda: load_text(text, "m.yaml"), "m.yaml")


@FAST
@given(st.text(alphabet=st.sampled_from(list("ab: -[]{},&*!|>'\"#\n\t?%@`~01.\\")), max_size=400))
def test_random_yaml_punctuation(text: str) -> None:
    check_outcome(lambda: load_text(text, "m.yaml"), "m.yaml")


def yaml_values() -> st.SearchStrategy[Any]:
    keys = st.one_of(st.sampled_from(VOCAB), st.text(max_size=8))
    leaves = st.one_of(
        st.sampled_from(SCALARS),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
    )
    return st.recursive(
        leaves,
        lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)),
        max_leaves=30,
    )


@FAST
@given(st.dictionaries(st.sampled_from(VOCAB), yaml_values(), max_size=8), st.booleans())
def test_random_structures(data: dict[str, Any], with_version: bool) -> None:
    if with_version:
        data["version"] = 1
    text = dump(data)
    check_outcome(lambda: load_text(text, "m.yaml"), "m.yaml")


# --------------------------------------------------------------------------- mutated examples
PathKey = tuple[Any, ...]


def all_paths(value: Any, prefix: PathKey = ()) -> Iterator[PathKey]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            yield from all_paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield (*prefix, i)
            yield from all_paths(child, (*prefix, i))


def get(data: Any, path: PathKey) -> Any:
    for part in path:
        data = data[part]
    return data


def put(data: Any, path: PathKey, value: Any) -> None:
    get(data, path[:-1])[path[-1]] = value


def delete(data: Any, path: PathKey) -> None:
    parent = get(data, path[:-1])
    del parent[path[-1]]


EXAMPLE_PATHS = {name: list(all_paths(data)) for name, data in EXAMPLE_DATA.items()}


@st.composite
def mutated_example(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(EXAMPLE_NAMES))
    data = copy.deepcopy(EXAMPLE_DATA[name])
    for _ in range(draw(st.integers(1, 3))):
        paths = list(all_paths(data))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["delete", "retype", "swap", "unknown_key", "duplicate"]))
        if kind == "delete":
            delete(data, path)
        elif kind == "retype":
            put(data, path, draw(yaml_values()))
        elif kind == "swap":
            other = draw(st.sampled_from(paths))
            if other[: len(path)] == path or path[: len(other)] == other:
                continue
            a, b = copy.deepcopy(get(data, path)), copy.deepcopy(get(data, other))
            put(data, path, b)
            put(data, other, a)
        elif kind == "unknown_key":
            target = get(data, path)
            if isinstance(target, dict):
                target[draw(st.sampled_from([*VOCAB, "colour", "pasword", "nodez"]))] = draw(yaml_values())
            else:
                put(data, path, {draw(st.text(min_size=1, max_size=8)): target})
        else:
            parent = get(data, path[:-1])
            if isinstance(parent, list):
                parent.append(copy.deepcopy(parent[path[-1]]))
    return data


@FAST
@given(mutated_example())
def test_mutated_examples(data: dict[str, Any]) -> None:
    text = dump(data)
    check_outcome(lambda: load_text(text, "m.yaml"), "m.yaml")


@st.composite
def mutated_example_text(draw: st.DrawFn) -> str:
    lines = EXAMPLE_TEXT[draw(st.sampled_from(EXAMPLE_NAMES))].splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["drop", "dup", "swap", "tab", "dedent", "indent", "truncate"]))
        if kind == "drop":
            del lines[i]
        elif kind == "dup":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "tab":
            lines[i] = "\t" + lines[i].lstrip(" ")
        elif kind == "dedent":
            lines[i] = lines[i][2:]
        elif kind == "indent":
            lines[i] = "  " + lines[i]
        else:
            lines[i] = lines[i][: draw(st.integers(0, max(len(lines[i]) - 1, 0)))]
    return "\n".join(lines) + "\n"


@FAST
@given(mutated_example_text())
def test_mutated_example_text(text: str) -> None:
    check_outcome(lambda: load_text(text, "m.yaml"), "m.yaml")


def test_unmutated_examples_load() -> None:
    for name in EXAMPLE_NAMES:
        check_outcome(lambda name=name: load_text(EXAMPLE_TEXT[name], name), name)  # type: ignore[misc]


# --------------------------------------------------------------------------- the CLI
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated_example(), text_level=st.booleans(), text=mutated_example_text())
def test_cli_validate_never_shows_a_traceback(
    capsys: pytest.CaptureFixture[str], data: dict[str, Any], text_level: bool, text: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "manifest.yaml"
        path.write_text(text if text_level else dump(data))
        capsys.readouterr()
        code = main(["validate", str(path)])
        out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert "Traceback" not in err
    assert "internal error" not in err
    if code == 0:
        assert out.startswith(f"{path}: OK: ")
    else:
        assert err.strip(), "an error exit prints diagnostics"
    for line in err.splitlines():
        assert line.startswith(str(path)), line
