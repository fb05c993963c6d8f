"""No part imports another part's private modules (``workload_sdk._replay``, ``fx_integer._x``).

A module whose name starts with ``_`` is its package's own business: what another part needs is
exported by the package's ``__init__`` (``from workload_sdk import compare_outputs``) or lives in
a public module (``fx_kafka.workload_log``). A package imports its own private modules freely, and
so do its own tests: ``tests/<unit|integration|gpu>/<dir>/`` belongs to the package ``<dir>``
(``integer``: ``fx_integer``). Every other test (the top-level ones, ``fuzz``, ``security``...),
``bench`` and the services follow the rule.

Read from the source (AST: every import statement, at module level or inside a function).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".venv", ".git", "build", "node_modules", "__pycache__", ".fx", ".pytest_cache",
             ".mypy_cache", ".ruff_cache", "shared"}
#: Test folders named after what they test rather than the package.
TEST_DIR_PACKAGE = {"integer": "fx_integer"}
TEST_ROOTS = ("unit", "integration", "gpu")


def _packages() -> set[str]:
    """Our top-level packages (a folder with an ``__init__.py`` at the root)."""
    return {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}


def _owner(rel: Path, packages: set[str]) -> str:
    """The package whose private modules ``rel`` may import: its own top-level package, or for
    a test under ``tests/<root>/<dir>/``, the package ``<dir>`` stands for."""
    parts = rel.parts
    if parts[0] == "tests" and len(parts) > 3 and parts[1] in TEST_ROOTS:
        tested = TEST_DIR_PACKAGE.get(parts[2], parts[2])
        if tested in packages:
            return tested
    return parts[0]


def _is_private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imported_modules(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every module an import statement names (``from p import m``: ``p``,
    and ``p.m`` when ``m`` is a module). Relative imports stay inside their package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _is_module(full):
                    yield node.lineno, full


def _problems_in(rel: Path, tree: ast.Module, packages: set[str]) -> Iterator[str]:
    here = _owner(rel, packages)
    for line, module in _imported_modules(tree):
        parts = module.split(".")
        if parts[0] not in packages or parts[0] == here:
            continue
        private = [p for p in parts[1:] if _is_private(p)]
        if private:
            yield (f"{rel.as_posix()}:{line}: imports {module}, a private module of "
                   f"{parts[0]}: export what is used from {parts[0]} (or a public module)")


def _problems() -> Iterator[str]:
    packages = _packages()
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP_DIRS & set(rel.parts) or rel.parts[0].endswith(".egg-info"):
            continue
        yield from _problems_in(rel, ast.parse(path.read_text(encoding="utf-8"), str(rel)),
                                packages)


def test_no_part_imports_another_parts_private_modules() -> None:
    problems = list(_problems())
    assert problems == [], "\n".join(problems)


def test_the_rule_finds_a_private_import_and_spares_a_packages_own() -> None:
    packages = {"workload_sdk", "console", "tests"}
    tree = ast.parse("from workload_sdk._replay import replay\n"
                     "import workload_sdk._why\n"
                     "def f():\n    from workload_sdk import _replay\n"
                     "from workload_sdk import replay\n")
    assert [p.split(": ")[0] for p in _problems_in(Path("console/app.py"), tree, packages)] == [
        "console/app.py:1", "console/app.py:2", "console/app.py:4"]
    own = Path("tests/unit/workload_sdk/test_x.py")
    assert list(_problems_in(own, tree, packages)) == []
    assert len(list(_problems_in(Path("tests/unit/test_x.py"), tree, packages))) == 3
