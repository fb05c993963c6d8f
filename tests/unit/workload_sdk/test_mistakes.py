"""The decisions behind "mistakes get one clear line" (issue 26, part 6), without a broker:
which workloads topic names hold, what a malformed model hash says, how an escaped error is
said in one line, the printed commands' spelling, ``--at-step`` and its old spelling.
The same mistakes on a real broker: tests/integration/workload_sdk/test_mistakes.py."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from broker_schema import INFERENCE_KIND, SpecRecord, encode, topics
from fx_kafka.cli_errors import EXIT_INTERNAL, EXIT_USAGE, one_line, run_command
from fx_kafka.workloads import KNOWN_SHOWN, workload_ids, workload_problem
from workload_sdk import MODULE_PLACEHOLDER, replay_command, show_command
from workload_sdk._bindings import register as register_bindings
from workload_sdk._model_check import malformed, unknown

H = "sha256:" + "ab" * 32


def test_workload_ids_come_from_topic_names_only() -> None:
    names = [*topics.all_topics("qgate-1"), topics.inputs("b"), "sys.facts",
             topics.shadow_stream("qgate-1", "e1", "eval"), "wl.x.notastream", "__consumer"]
    assert workload_ids(names) == ["b", "qgate-1"]


def test_a_typo_names_the_known_workloads() -> None:
    names = topics.all_topics("qgate-1") + topics.all_topics("valve")
    assert workload_problem("qgate-1", names) is None
    assert workload_problem("qgat-1", names) == (
        "no workload 'qgat-1' on this broker; known: qgate-1, valve")
    partial = [n for n in names if n != topics.resp("valve")]
    assert workload_problem("valve", partial) == (
        "workload 'valve' is incomplete on this broker: no topic wl.valve.resp (or this client "
        "may not describe it)")
    assert workload_problem("valve", partial, streams=("in", "spec")) is None
    assert "no workload exists on this broker yet" in (workload_problem("x", []) or "")
    assert "invalid workload id 'a.b'" in (workload_problem("a.b", names) or "")
    many = [topics.inputs(f"w{i:03d}") for i in range(KNOWN_SHOWN + 5)]
    assert (workload_problem("zz", many, streams=("in",)) or "").endswith("w019 and 5 more")


def test_malformed_model_hashes_say_what_is_wrong() -> None:
    assert malformed("--model", {"m": H}) is None
    assert malformed("--model", {"m": "sha256:6f6f"}) == (
        "--model m=sha256:6f6f: a short hash (4 of 64 hex digits): give the full hash "
        "(fx models list prints it)")
    assert "a short hash (8 of 64" in (malformed("--model", {"m": "6f6f6f6f"}) or "")
    assert "not a sha256:<64 lowercase hex>" in (malformed("--model", {"m": "magika"}) or "")
    assert "not a sha256" in (malformed("--model", {"m": H.upper()}) or "")
    assert unknown([H, H, "sha256:" + "cd" * 32], {H}) == ["sha256:" + "cd" * 32]


def test_unchecked_models_are_on_the_record_only_when_forced() -> None:
    plain = SpecRecord(workload_id="w", module_hash=H, effect_kinds=(INFERENCE_KIND,),
                       models={"m": H})
    assert b"unchecked_models" not in encode(plain)  # old specs keep their canonical bytes
    forced = plain.model_copy(update={"unchecked_models": (H,)})
    assert b'"unchecked_models":["' + H.encode() + b'"]' in encode(forced)
    with pytest.raises(ValidationError):
        SpecRecord(workload_id="w", module_hash=H, effect_kinds=(INFERENCE_KIND,),
                   unchecked_models=("sha256:12",))


def _ns(func: object) -> argparse.Namespace:
    return argparse.Namespace(command="why", func=func, verbose=False)


def test_an_escaped_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def missing(_: argparse.Namespace) -> int:
        raise FileNotFoundError(2, "No such file or directory", "x.bin")

    assert run_command(missing, _ns(missing)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == "fx why: FileNotFoundError: [Errno 2] No such file or directory: 'x.bin'\n"

    def invalid(_: argparse.Namespace) -> int:
        SpecRecord(workload_id="w", module_hash="sha256:12")
        return 0

    assert run_command(invalid, _ns(invalid)) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("fx why: invalid SpecRecord: module_hash: ")

    def bug(_: argparse.Namespace) -> int:
        raise KeyError("k")

    assert run_command(bug, _ns(bug)) == EXIT_INTERNAL
    assert "fx -v shows the traceback" in capsys.readouterr().err
    with pytest.raises(KeyError):
        run_command(bug, argparse.Namespace(command="why", verbose=True), verbose=True)
    try:
        raise ValueError("first\nsecond")
    except ValueError as exc:
        assert one_line(exc) == "ValueError: first"


def test_printed_commands_name_the_code_to_fold_with() -> None:
    assert replay_command("qgate-1", 3) == f"fx replay qgate-1 --to 3 --module {MODULE_PLACEHOLDER}"
    assert replay_command("qgate-1", 3, "m:C") == "fx replay qgate-1 --to 3 --module m:C"
    assert show_command("qgate-1", "v32-vs-v33") == "fx shadow show v32-vs-v33 --workload qgate-1"
    assert show_command("w", "e", "m:C") == "fx shadow show e --workload w --module m:C"


def test_at_step_and_its_deprecated_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    register_bindings(parser.add_subparsers(dest="command"))
    new = parser.parse_args(["upgrade", "w", "--model", f"m={H}", "--at-step", "7"])
    assert new.at_offset == 7 and not new.force and "deprecated" not in capsys.readouterr().err
    old = parser.parse_args(["rollback", "w", "--model", "m", "--at-offset", "7", "--force"])
    assert old.at_offset == 7 and old.force
    assert "--at-offset is deprecated: it is a step number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["upgrade", "w", "--model", f"m={H}", "--at-step", "1",
                           "--at-offset", "2"])
