"""One home per wire concept: topic names only from ``broker_schema.topics``, the ``sha256:``
spelling only from ``broker_schema.canonical``, signature checks only through
``broker_schema.signatures``; and the import layering of docs (DESIGN "Parts").

The checks read the source tree (AST, so docstrings, comments and help texts that *mention* a
topic or a hash do not count) and name every offending line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker_schema", "executor", "actuator", "workload_sdk", "fx_kafka", "fx_cli")
SKIP_DIRS = {".venv", ".git", "build", "node_modules", "__pycache__", ".fx", ".pytest_cache",
             ".mypy_cache", ".ruff_cache", "shared"}


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP_DIRS & set(rel.parts) or rel.parts[0].endswith(".egg-info"):
            continue
        yield rel.as_posix(), ast.parse(path.read_text(encoding="utf-8"), str(rel))


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings or bare string statements."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _fstring_text(node: ast.JoinedStr) -> str:
    """The f-string with every replacement field written as ``{}``."""
    return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
                   for v in node.values)


_STREAM = r"(in|spec|claims|out|resp|merge)"
TOPIC_HOME = {"broker_schema/topics.py"}


def _builds_topics(rel: str) -> bool:
    """Code that must build topic names through broker_schema.topics: the packages, bench, and
    the tests' helpers (harnesses, fixtures, strategies). A test module itself may spell the
    names it expects, and the hostile-input builders spell names no function would build."""
    name = rel.rsplit("/", 1)[-1]
    if rel in TOPIC_HOME:
        return False
    if rel.startswith("tests/"):
        return not name.startswith("test_") and "/fuzz/" not in rel
    return True


def _topic_problems(rel: str, tree: ast.Module) -> Iterator[str]:
    if not _builds_topics(rel):
        return
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = _fstring_text(node)
            if re.search(r"(?<![\w<])wl\.\{\}", text) or re.search(r"\^?wl\\\\?\.\{\}", text):
                yield f"{rel}:{node.lineno}: a workload topic built by hand: f{text!r}"
            if re.search(r"(?<![\w.])sys\.\{\}", text):
                yield f"{rel}:{node.lineno}: a system topic built by hand: f{text!r}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
            for side in (node.left, node.right):
                if (isinstance(side, ast.Constant) and isinstance(side.value, str)
                        and re.fullmatch(rf"(wl\.|sys\.|\.{_STREAM}|wl\.[^.]*\.)", side.value)):
                    yield f"{rel}:{node.lineno}: a topic name built by hand: {side.value!r} + ..."
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs
              and re.fullmatch(r"sys\.(facts|rejects|chunks|alarms|ledger\..*)", node.value)):
            yield (f"{rel}:{node.lineno}: the system topic {node.value!r} spelled out: use "
                   "broker_schema.topics")


HASH_HOME = {"broker_schema/canonical.py"}
#: the integer engine's own formats are bare hex (its modelHash, receipt hashes): no prefix
BARE_HEX_OK = ("broker_schema/", "executor/integer/", "bench/", "tests/")


def _is_hexdigest_of_sha256(node: ast.AST) -> bool:
    """``hashlib.sha256(...).hexdigest()``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "hexdigest" and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Attribute)
            and node.func.value.func.attr == "sha256")


def _hash_problems(rel: str, tree: ast.Module) -> Iterator[str]:
    if rel in HASH_HOME:
        return
    in_tests = rel.startswith(("tests/", "bench/"))  # they may spell made-up hashes
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = _fstring_text(node)
            if text.startswith("sha256:{}") and (not in_tests or any(
                    _is_hexdigest_of_sha256(v.value) for v in node.values
                    if isinstance(v, ast.FormattedValue))):
                yield f"{rel}:{node.lineno}: a sha256: hash spelled by hand: f{text!r}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            prefix = (isinstance(node.left, ast.Constant) and node.left.value == "sha256:")
            if prefix and (not in_tests or _is_hexdigest_of_sha256(node.right)):
                # tests may spell made-up hashes ("sha256:" + "a" * 64), never hash bytes so
                yield (f"{rel}:{node.lineno}: 'sha256:' + ...: use sha256_hex / hash_from_hex "
                       "(broker_schema.canonical)")
        elif (not in_tests and isinstance(node, ast.Constant) and node.value == "sha256:"
              and id(node) not in docs):
            yield f"{rel}:{node.lineno}: the 'sha256:' prefix spelled out: use hex_of_hash etc."
        if _is_hexdigest_of_sha256(node) and not rel.startswith(BARE_HEX_OK):
            yield (f"{rel}:{getattr(node, 'lineno', 0)}: hashlib.sha256(...).hexdigest(): use "
                   "broker_schema.sha256_hex")


SIGNATURE_HOME = {"broker_schema/signatures.py"}


def _signature_problems(rel: str, tree: ast.Module) -> Iterator[str]:
    if rel in SIGNATURE_HOME or rel.startswith("tests/"):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in (
                "from_public_bytes", "load_der_public_key", "load_pem_public_key"):
            yield f"{rel}:{node.lineno}: a public key decoded outside broker_schema.signatures"
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "verify" and node.args and len(node.args) == 2):
            yield (f"{rel}:{node.lineno}: a signature verified outside "
                   "broker_schema.signatures.verify")
        if isinstance(node, ast.ImportFrom) and node.module == "cryptography.exceptions":
            yield f"{rel}:{node.lineno}: InvalidSignature handled outside broker_schema.signatures"


def test_topic_names_are_built_only_by_broker_schema_topics() -> None:
    problems = [p for rel, tree in _sources() for p in _topic_problems(rel, tree)]
    assert problems == [], "\n".join(problems)


def test_the_sha256_spelling_lives_in_broker_schema_canonical() -> None:
    problems = [p for rel, tree in _sources() for p in _hash_problems(rel, tree)]
    assert problems == [], "\n".join(problems)


def test_signatures_are_checked_only_by_broker_schema_signatures() -> None:
    problems = [p for rel, tree in _sources() for p in _signature_problems(rel, tree)]
    assert problems == [], "\n".join(problems)


def _imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def test_layering() -> None:
    """broker_schema imports nothing of ours; executor and workload_sdk never import each other;
    the actuator gateway may import the executor (never the reverse) and never workload_sdk;
    the integer engine imports no service (its cli, the service's front door, aside) and the wire
    contract only lazily."""
    problems = []
    for rel, tree in _sources():
        top = rel.split("/")[0]
        for line, module in _imports(tree):
            head = module.split(".")[0]
            if top == "broker_schema" and head in PACKAGES and head != "broker_schema":
                problems.append(f"{rel}:{line}: broker_schema imports {module}")
            if top == "executor" and head == "workload_sdk":
                problems.append(f"{rel}:{line}: executor imports {module}")
            if top == "workload_sdk" and head in ("executor", "actuator"):
                problems.append(f"{rel}:{line}: workload_sdk imports {module}")
            # the gateway reuses the executor's pieces; never the other way, never the SDK
            if top == "executor" and head == "actuator":
                problems.append(f"{rel}:{line}: executor imports {module}")
            if top == "actuator" and head == "workload_sdk":
                problems.append(f"{rel}:{line}: actuator imports {module}")
            top_level = any(isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno == line
                            for n in tree.body)
            if (rel.startswith("executor/integer/") and rel != "executor/integer/cli.py"
                    and head in PACKAGES and not module.startswith("executor.integer")
                    and (head != "broker_schema" or top_level)):
                problems.append(f"{rel}:{line}: the integer engine imports {module}"
                                + (" at module level" if top_level else ""))
    assert problems == [], "\n".join(problems)
