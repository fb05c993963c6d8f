"""One home per wire concept: topic names only from ``broker_schema.topics``, the ``sha256:``
spelling only from ``broker_schema.canonical``, signature checks only through
``broker_schema.signatures``; the holder's own outcomes only from ``broker_schema.records``.
(Which package may import which: ``test_import_rules.py``.)

The checks read the source tree (AST, so docstrings, comments and help texts that *mention* a
topic or a hash do not count) and name every offending line.
"""

from __future__ import annotations

import ast
import re
import typing
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
BARE_HEX_OK = ("broker_schema/", "fx_integer/", "bench/", "tests/")


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
        if (isinstance(node, ast.ImportFrom) and node.module == "cryptography.exceptions"
                and any(a.name == "InvalidSignature" for a in node.names)):
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


# ==================================================================================================
# Effect ids and stream kinds (issue 25, "one home for every policy"). Key-trust rules: elsewhere.
# ==================================================================================================
#: The one place an effect id is spelled (:attr:`EffectHeader.effect_id`) and read back
#: (:func:`broker_schema.parse_effect_id`).
EFFECT_ID_HOME = {"broker_schema/records.py"}


def _is_str(node: ast.AST, value: str | None = None) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (value is None or node.value == value))


def _effect_id_problems(rel: str, tree: ast.Module) -> Iterator[str]:
    """An effect id formatted (``f"{w}/{o}/{i}@{e}"``, ``f"shadow:{name}/..."``) or taken apart
    (split at ``@``, a ``shadow:`` prefix looked for, a pattern of one) by hand."""
    if rel in EFFECT_ID_HOME or not _builds_topics(rel):
        return
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = _fstring_text(node)
            if re.search(r"\{\}/\{\}/\{\}@\{\}", text) or text.startswith("shadow:{}"):
                yield (f"{rel}:{node.lineno}: an effect id formatted by hand: f{text!r} (use "
                       "EffectHeader.effect_id)")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("split", "rsplit", "partition", "rpartition")
              and node.args and _is_str(node.args[0], "@")):
            yield (f"{rel}:{node.lineno}: .{node.func.attr}('@'): an effect id taken apart by "
                   "hand (use broker_schema.parse_effect_id)")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs
              and (node.value == "shadow:" or "(?P<epoch>" in node.value
                   or re.search(r"\)@\(", node.value))):
            yield (f"{rel}:{node.lineno}: {node.value[:40]!r}: an effect id's spelling outside "
                   "broker_schema (use parse_effect_id / EffectHeader.effect_id)")


def test_effect_ids_are_formatted_and_parsed_only_by_broker_schema() -> None:
    problems = [p for rel, tree in _sources() for p in _effect_id_problems(rel, tree)]
    assert problems == [], "\n".join(problems)


def test_the_effect_id_rule_finds_a_parser_by_hand() -> None:
    bad = ast.parse('def f(e):\n    rest, epoch = e.rsplit("@", 1)\n'
                    '    return e.startswith("shadow:") or f"{a}/{b}/{c}@{d}"\n')
    assert len(list(_effect_id_problems("workload_sdk/x.py", bad))) == 3


#: Where the stream names and the records each stream holds are declared.
STREAMS_HOME = {"broker_schema/topics.py", "broker_schema/streams.py"}


def _stream_tables() -> tuple[list[frozenset[str]], list[frozenset[str]]]:
    """The string sets that only the homes may spell (stream names, each stream's kinds of two
    or more) and the class-name sets (each stream's record classes, three or more, and what the
    merge order names; two classes, ``OutputRecord | EffectRequest``, read as a type)."""
    from broker_schema import streams, topics

    strings = [frozenset(topics.STREAMS), frozenset(topics.SHADOW_STREAMS)]
    strings += [k for table in (streams.STREAM_KINDS, streams.SHADOW_KINDS) for k in
                table.values() if len(k) > 1]
    classes = [frozenset(c.__name__ for c in models) for table in
               (streams.STREAM_RECORDS, streams.SHADOW_RECORDS) for models in table.values()
               if len(models) > 2]
    classes.append(frozenset(c.__name__ for c in typing.get_args(streams.SourceRecord)))
    return strings, classes


def _union_names(node: ast.AST) -> list[str] | None:
    """``A | B | C`` of plain names -> [A, B, C]; None for anything else."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _union_names(node.left), _union_names(node.right)
        return None if left is None or right is None else left + right
    return None


def _stream_kind_problems(rel: str, tree: ast.Module) -> Iterator[str]:
    """A second spelling of which streams there are, or of which record kinds or classes one
    holds: a literal collection of the names, a tuple or union of the classes, a ``STREAMS``."""
    if rel in STREAMS_HOME or not _builds_topics(rel):
        return
    strings, classes = _stream_tables()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1:
            if all(_is_str(e) for e in node.elts):
                values = frozenset(e.value for e in node.elts if isinstance(e, ast.Constant))
                if values in strings:
                    yield (f"{rel}:{node.lineno}: {sorted(values)} spelled again: use "
                           "broker_schema.topics.STREAMS / broker_schema.streams")
            elif all(isinstance(e, ast.Name) for e in node.elts):
                names = frozenset(e.id for e in node.elts if isinstance(e, ast.Name))
                if names in classes:
                    yield (f"{rel}:{node.lineno}: the records of a stream listed again "
                           f"({', '.join(sorted(names))}): use broker_schema.streams")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            union = _union_names(node)
            if union is not None and len(union) > 1 and frozenset(union) in classes:
                yield (f"{rel}:{node.lineno}: the records of a stream listed again "
                       f"({' | '.join(union)}): use broker_schema.streams")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id in ("STREAMS", "STREAM_KINDS",
                                                        "SHADOW_STREAMS", "SHADOW_KINDS"):
                    yield f"{rel}:{node.lineno}: {t.id} defined again: import it"


#: Files whose copy is the business of another change of issue 25 (the lease holder split by
#: job): ``_decode`` picks ``.in``/``.resp`` classes by hand; it becomes
#: ``broker_schema.streams.STREAM_RECORDS[source]``. Empty this when that lands.
_STREAM_KINDS_PENDING: set[str] = set()


def test_stream_kinds_are_declared_once() -> None:
    problems = [p for rel, tree in _sources() if rel not in _STREAM_KINDS_PENDING
                for p in _stream_kind_problems(rel, tree)]
    assert problems == [], "\n".join(problems)


def test_the_stream_kinds_rule_finds_a_copy() -> None:
    bad = ast.parse('STREAMS = ("in", "spec", "claims", "out", "resp", "merge")\n'
                    'ok = isinstance(r, AcceptedRecord | ResponseRecord | TickRecord)\n'
                    'ok = isinstance(r, (AcceptedRecord, ResponseRecord, TickRecord))\n'
                    'allowed = {"accepted", "response", "tick"}\n')
    assert len(list(_stream_kind_problems("workload_sdk/x.py", bad))) == 5


def test_the_stream_tables_are_derived_from_one_declaration() -> None:
    from broker_schema import streams, topics
    from broker_schema.records import RECORD_TYPES, kind_of

    assert tuple(streams.STREAM_RECORDS) == topics.STREAMS
    assert tuple(streams.SHADOW_RECORDS) == topics.SHADOW_STREAMS
    assert typing.get_args(streams.RespRecord) == streams.STREAM_RECORDS["resp"]
    assert {kind_of(c) for c in typing.get_args(streams.SourceRecord)} == (
        streams.STREAM_KINDS["in"] | streams.STREAM_KINDS["resp"])
    declared = [m for table in (streams.STREAM_RECORDS, streams.SHADOW_RECORDS,
                                streams.SYSTEM_RECORDS) for ms in table.values() for m in ms]
    declared += streams.ACTUATOR_RECORDS
    assert set(declared) == set(RECORD_TYPES.values()), "every record kind belongs somewhere"

# ================================================================================================
# Key trust and three-argument signature checks (issue 25). Which key to trust for a response is
# decided only in broker_schema.key_history (response_key_problem / response_signer, the node it
# claims, the key history or sys.facts); every signature check is a three-argument call that
# names the key, the signature and what it signs (signatures.verify), or the response, the facts
# and the history (key_history.response_key_problem) -- never a two-argument form that hides one.
# ================================================================================================

KEY_TRUST_HOME = "broker_schema/"
#: Bare integer receipts (``fx verify`` on files) carry their own node and time and no response:
#: they ask the key history's rule (KeyHistory.key_problem) directly.
KEY_TRUST_BARE_RECEIPTS = {"executor/integer_cli.py"}
#: KeyHistory's lookups and rule: only key_history chooses the node and time they are asked for.
_HISTORY_LOOKUPS = {"key_problem", "spans", "span"}


def _key_trust_problems(rel: str, tree: ast.Module) -> Iterator[str]:
    if rel.startswith((KEY_TRUST_HOME, "tests/")):
        return
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in _HISTORY_LOOKUPS and rel not in KEY_TRUST_BARE_RECEIPTS):
            yield (f"{rel}:{node.lineno}: KeyHistory.{node.func.attr}() asked outside "
                   "broker_schema.key_history: use response_key_problem / receipt_key_problem")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "key_id" for s in sides):
                yield (f"{rel}:{node.lineno}: a key id compared outside "
                       "broker_schema.key_history (which key to trust is decided there)")


#: Two-argument checks: a response against one key (the facts or history that chose it hidden).
_TWO_ARG_RESPONSE_CHECKS = {"response_signature_problem", "verify_response"}
#: The three-argument checks: (key, signature, message).
_THREE_ARG_CHECKS = {"verify", "verify_ed25519"}
#: The receipt verifier checks a record against the key its own receipt names (no trust
#: decision: which key is trusted is asked of key_history by its callers); executor.identity
#: keeps verify_response for a node checking what it signed.
TWO_ARG_RESPONSE_CHECK_OK = {"fx_integer/verifier.py", "fx_node/identity.py"}
#: An independent implementation that cross-checks the test vectors, on purpose.
INDEPENDENT_VERIFY_OK = {"tests/unit/integer/test_receipt_vectors.py"}


def _signature_names(tree: ast.Module) -> set[str]:
    """The names a module imports from broker_schema.signatures or executor.identity (a local
    ``verify`` of a test, a CLI helper, is not a signature check)."""
    return {alias.asname or alias.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module in ("broker_schema.signatures", "executor.identity")
            for alias in node.names}


def _three_arg_problems(rel: str, tree: ast.Module) -> Iterator[str]:
    if rel in SIGNATURE_HOME or rel.startswith(KEY_TRUST_HOME):
        return
    imported = _signature_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute):
            name: str | None = node.func.attr  # signatures.verify, key.verify, ...
        elif isinstance(node.func, ast.Name) and node.func.id in imported:
            name = node.func.id
        else:
            continue
        positional = len(node.args)
        if (name in _THREE_ARG_CHECKS and positional == 2 and not node.keywords
                and rel not in INDEPENDENT_VERIFY_OK):
            yield (f"{rel}:{node.lineno}: {name}() with two arguments (a key object's check): "
                   "use broker_schema.signatures.verify(key, signature, message)")
        if (name in _TWO_ARG_RESPONSE_CHECKS and not rel.startswith("tests/")
                and rel not in TWO_ARG_RESPONSE_CHECK_OK):
            yield (f"{rel}:{node.lineno}: {name}(response, key): check a response with "
                   "broker_schema.key_history.response_key_problem(response, facts, history)")


def test_key_trust_is_decided_only_in_broker_schema_key_history() -> None:
    problems = [p for rel, tree in _sources() for p in _key_trust_problems(rel, tree)]
    assert problems == [], "\n".join(problems)


def test_signature_checks_take_three_arguments() -> None:
    problems = [p for rel, tree in _sources() for p in _three_arg_problems(rel, tree)]
    assert problems == [], "\n".join(problems)


def _holder_outcome_problems(rel: str, tree: ast.Module) -> Iterator[str]:
    """A collection spelling exactly the holder's outcomes (``timeout`` and ``unknown``) outside
    ``broker_schema/records.py``, which declares them once (``HolderOutcome``,
    ``HOLDER_OUTCOMES``). Production code only: tests draw outcomes as data."""
    if rel == "broker_schema/records.py" or rel.startswith("tests/"):
        return
    want = {"timeout", "unknown"}
    for node in ast.walk(tree):
        # a Literal[...] of the two is a tuple in its subscript
        elts = list(node.elts) if isinstance(node, ast.Set | ast.Tuple | ast.List) else None
        if elts and len(elts) == 2 and all(_is_str(e) for e in elts) and \
                {typing.cast(ast.Constant, e).value for e in elts} == want:
            yield f"{rel}:{node.lineno}: spells the holder's outcomes (use HOLDER_OUTCOMES)"


def test_the_holder_outcomes_are_declared_once() -> None:
    problems = [p for rel, tree in _sources() for p in _holder_outcome_problems(rel, tree)]
    assert problems == [], "\n".join(problems)


def test_the_holder_outcome_rule_finds_a_copy() -> None:
    bad = ast.parse('A = frozenset({"timeout", "unknown"})\nB = ("unknown", "timeout")\n'
                    'x: Literal["timeout", "unknown"]\nC = ("timeout", "ok")\n')
    assert len(list(_holder_outcome_problems("workload_sdk/x.py", bad))) == 3
