"""Which part may import which (``../shared/DESIGN.md``, "Parts and where they live").

* ``broker_schema`` imports nothing of ours;
* ``executor`` and ``workload_sdk`` never import each other;
* ``fx_kafka`` knows neither side (no ``fx_node``, ``executor``, ``actuator``, ``workload_sdk``,
  ``fx_integer``);
* ``broker_schema ← fx_kafka ← fx_node ← {executor, actuator}``: the node's shell (``fx_node``)
  imports only the wire contract and ``fx_kafka``, so no runner (``executor``, ``actuator``) and
  no ``workload_sdk``; the two node services never import each other;
* ``fx_integer`` imports no service (``executor``, ``workload_sdk``, ``fx_kafka``, ``fx_cli``),
  and the wire contract (``broker_schema``) only inside the functions that sign or verify;
* only ``fx_cli`` imports ``fx_cli`` (it composes the others' commands);
* ``console`` (``fx console``) is a top-level reader like ``fx_cli``: it may import
  ``workload_sdk`` (the why walk) and ``executor`` (the receipt checks), and no part of ours
  imports it;
* no module of ours takes part in an import cycle, a lazy (function-level) import and an
  annotation-only one (under ``TYPE_CHECKING``) included: no exceptions.

Read from the source (AST: every import statement, at module level or inside a function), and
checked again where it matters most by importing in a fresh interpreter and looking at
``sys.modules``: a verifier must be able to use ``fx_integer`` without the services, and run the
model with numpy alone (the model is the GPU check's closure test,
``tests/unit/integer/test_gpu_check_imports.py``).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("broker_schema", "fx_integer", "fx_node", "executor", "actuator", "workload_sdk",
        "fx_kafka", "fx_cli", "console")
SERVICES = ("fx_node", "executor", "actuator", "workload_sdk", "fx_kafka", "fx_cli", "console")
#: what the node's shell may import of ours
NODE_BELOW = ("broker_schema", "fx_kafka")


@dataclass(frozen=True)
class Import:
    line: int
    target: str  # absolute module name (a relative import resolved; ``from p import m`` -> p.m)
    module_level: bool  # runs on import (not inside a function, not under TYPE_CHECKING)


def _module_files() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package's __init__) for every module of our packages."""
    out: dict[str, tuple[Path, bool]] = {}
    for pkg in OURS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


MODULES = _module_files()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str) -> Iterator[Import]:
    path, is_pkg = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if is_pkg else name.rpartition(".")[0]

    def visit(node: ast.AST, module_level: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(child.lineno, alias.name, module_level)
            elif isinstance(child, ast.ImportFrom):
                base = (importlib.util.resolve_name("." * child.level + (child.module or ""),
                                                    package)
                        if child.level else child.module or "")
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    yield Import(child.lineno, full if full in MODULES else base, module_level)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                yield from visit(child, False)  # never runs, but still an edge of the graph
            else:
                yield from visit(child, module_level)

    yield from visit(tree, True)


def _top(module: str) -> str:
    return module.split(".")[0]


def _problems() -> Iterator[str]:
    for name in MODULES:
        here = _top(name)
        rel = MODULES[name][0].relative_to(ROOT).as_posix()
        for imp in _imports(name):
            there = _top(imp.target)
            if there not in OURS or there == here:
                continue
            where = f"{rel}:{imp.line}: {here} imports {imp.target}"
            if here == "broker_schema":
                yield f"{where} (broker_schema imports nothing of ours)"
            if {here, there} == {"executor", "workload_sdk"}:
                yield f"{where} (executor and workload_sdk never import each other)"
            if {here, there} == {"actuator", "workload_sdk"}:
                yield f"{where} (the actuator gateway and workload_sdk never import each other)"
            if {here, there} == {"executor", "actuator"}:
                yield (f"{where} (the executor and the actuator gateway never import each other: "
                       "what they share is fx_node)")
            if here == "fx_node" and there not in NODE_BELOW:
                yield f"{where} (fx_node imports only {' and '.join(NODE_BELOW)}: no runner)"
            if {here, there} == {"fx_node", "workload_sdk"}:
                yield f"{where} (the node and workload_sdk never import each other)"
            if here == "fx_kafka" and there in ("fx_node", "executor", "actuator", "workload_sdk",
                                                 "fx_integer"):
                yield f"{where} (fx_kafka knows neither side)"
            if there == "fx_cli":
                yield f"{where} (only fx_cli imports fx_cli)"
            if there == "console":
                yield f"{where} (nothing imports the console: fx_cli registers it by name)"
            if here == "fx_integer" and there in SERVICES:
                yield f"{where} (the integer engine imports no service)"
            if here == "fx_integer" and there == "broker_schema" and imp.module_level:
                yield (f"{where} at module level (only inside the functions that sign or "
                       "verify: running the model needs numpy alone)")


def test_layering() -> None:
    problems = list(_problems())
    assert problems == [], "\n".join(problems)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_import_cycles() -> None:
    """A lazy import inside a function still makes a circle (engine -> receipt -> engine was
    one), and so does an import for annotations only (``TYPE_CHECKING``: the executor's mixins
    hid one): every edge counts, except a module's import of its own parent packages."""
    graph = {name: {i.target for i in _imports(name)
                    if i.target in MODULES and i.target != name
                    and not name.startswith(i.target + ".")}
             for name in MODULES}
    cycles = _cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


# ------------------------------------------------------------------------------ closures
_BLOCKER = """
import importlib.abc, sys
BLOCK = set({block!r})
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCK:
            raise ImportError("blocked by the import-rule test: " + name)
        return None
sys.meta_path.insert(0, Blocker())
def loaded(tops):
    return sorted(m for m in sys.modules if m.split(".")[0] in set(tops))
"""


def _run(script: str, block: tuple[str, ...]) -> str:
    code = _BLOCKER.format(block=list(block)) + textwrap.dedent(script)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


#: what running the model must not need: the services, the wire contract and the packages behind
#: it, the converter's GGUF reader
NOT_FOR_THE_MODEL = (*SERVICES, "broker_schema", "pydantic", "cryptography", "rfc8785", "gguf",
                     "aiokafka", "fastapi", "onnxruntime")


def test_fx_integer_runs_the_model_on_numpy_alone(tmp_path: Path) -> None:
    """The public API end to end (a small synthetic artifact in a model store laid out as the
    executor's), with the services and the wire contract impossible to import."""
    out = _run(f"""
        import fx_integer as fi
        assert loaded(["numpy"]) == [], "importing the package must load only the stdlib"
        from fx_integer import artifact
        store = {str(tmp_path)!r}
        import hashlib, os
        data = artifact.synthetic(seed=3)
        h = hashlib.sha256(data).hexdigest()
        os.makedirs(store + "/sha256", exist_ok=True)
        artifact.write(store + "/sha256/" + h, data)
        art = fi.load_by_hash(h, store)
        ids = fi.tokenize(art, "the cat")
        logits = fi.teacher_forced_logits(art, ids)
        assert logits.shape == (len(ids), art.config.vocab_size) and logits.dtype.name == "int64"
        out = fi.generate(art, ids, max_tokens=3)
        assert len(out.output_tokens) == 3 and fi.detokenize(art, out.output_tokens) == out.text
        fi.IntegerEngine.from_artifact(art).run({{"prompt": "the cat", "max_tokens": 2}})
        assert fi.Q16_SCALE == 1 << 16
        bad = loaded({list(NOT_FOR_THE_MODEL)!r})
        assert bad == [], bad
        print("ok")
    """, NOT_FOR_THE_MODEL)
    assert out.strip() == "ok"


def test_fx_integer_loads_no_service() -> None:
    """Every module of fx_integer imported, and a receipt signed and verified (re-executed on
    the oracle), with the services impossible to import: a third-party verifier's closure."""
    out = _run("""
        import pkgutil, importlib
        import fx_integer
        names = sorted(m.name for m in pkgutil.walk_packages(fx_integer.__path__, "fx_integer."))
        for name in names:
            importlib.import_module(name)
        import tempfile, os
        from fx_integer import artifact
        path = os.path.join(tempfile.mkdtemp(), "synthetic.nlfxint")
        artifact.write(path, artifact.synthetic(seed=3))
        signer = fx_integer.ReceiptSigner.generate(node_id="n1")
        eng = fx_integer.IntegerEngine(path, signer=signer)
        r = eng.run({"prompt": "the cat", "max_tokens": 2})["receipt"]
        res = fx_integer.verify(r, artifact_path=path)
        assert res.ok, res.reasons
        for name in fx_integer.__all__:
            getattr(fx_integer, name)
        clash = sorted(set(fx_integer.__all__) & {n.rsplit(".", 1)[1] for n in names})
        assert clash == [], f"public names that are also submodules: {clash}"
        bad = loaded(["executor", "workload_sdk", "fx_kafka", "fx_cli", "console"])
        assert bad == [], bad
        print(len(names))
    """, SERVICES)
    assert int(out.strip()) >= 15


#: package -> what importing every one of its modules must not load
CLOSURES = {
    "broker_schema": tuple(p for p in OURS if p != "broker_schema"),
    "fx_node": ("executor", "actuator", "workload_sdk", "fx_integer", "fx_cli", "console"),
    "executor": ("workload_sdk", "actuator", "fx_cli"),
    "actuator": ("workload_sdk", "executor", "fx_cli"),
    "workload_sdk": ("fx_node", "executor", "actuator", "fx_cli"),
    "fx_kafka": ("fx_node", "executor", "actuator", "workload_sdk", "fx_integer", "fx_cli"),
    "console": ("actuator", "fx_cli"),
}


@pytest.mark.parametrize("package", sorted(CLOSURES))
def test_importing_a_package_loads_only_what_it_may(package: str) -> None:
    """Every module of the package imported (``__main__`` aside: it runs a command), nothing
    blocked: what it loads, lazily or through a third party, is what ``sys.modules`` says."""
    _run(f"""
        import pkgutil, importlib
        import {package} as pkg
        for m in pkgutil.walk_packages(pkg.__path__, "{package}."):
            if not m.name.endswith(".__main__"):
                importlib.import_module(m.name)
        bad = loaded({list(CLOSURES[package])!r})
        assert bad == [], bad
    """, ())
