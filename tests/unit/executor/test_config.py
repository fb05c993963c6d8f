"""The executor config: defaults, file, environment, errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker_schema.records import INFERENCE_KIND
from executor.config import ExecutorConfig, load_config
from fx_node.settings import ConfigError


def test_defaults_are_printable() -> None:
    cfg = load_config(environ={})
    assert cfg.kinds == {INFERENCE_KIND: 16}
    assert cfg.group_id(INFERENCE_KIND) == f"fx-executor.{INFERENCE_KIND}"
    text = str(cfg)
    assert "kinds = " in text and "node_id = " in text


def test_toml_then_env_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "exec.toml"
    path.write_text(
        '[executor]\nnode_id = "gpu-7"\nworkers = 2\nhttp_port = 9000\n'
        f'[executor.kinds]\n"{INFERENCE_KIND}" = 4\n'
    )
    cfg = load_config(path, environ={"FX_EXECUTOR_WORKERS": "3",
                                     "FX_EXECUTOR_PRELOAD": '["sha256:' + "a" * 64 + '"]'})
    assert cfg.node_id == "gpu-7" and cfg.kinds == {INFERENCE_KIND: 4}
    assert cfg.workers == 3 and cfg.http_port == 9000
    assert cfg.preload == ["sha256:" + "a" * 64]
    assert load_config(path, environ={}, workers=8).workers == 8


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "exec.json"
    path.write_text('{"node_id": "n", "http_port": null, "chunk_backend": "kafka"}')
    cfg = load_config(path, environ={})
    assert cfg.http_port is None and cfg.chunk_backend == "kafka"


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"FX_EXECUTOR_NOPE": "1"}, "no such executor setting"),
        ({"FX_EXECUTOR_WORKERS": "0"}, "workers"),
        ({"FX_EXECUTOR_KINDS": '{"not a kind": 1}'}, "kinds"),
        ({"FX_EXECUTOR_KINDS": "{broken"}, "not valid JSON"),
        ({"FX_EXECUTOR_TOPIC_PATTERN": "(("}, "regex"),
    ],
)
def test_bad_settings_are_config_errors(environ: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(environ=environ)


def test_unknown_field_in_file(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text("colour = 'blue'\n")
    with pytest.raises(ConfigError, match="colour"):
        load_config(path, environ={})


def test_frozen() -> None:
    cfg = ExecutorConfig()
    with pytest.raises(ValueError, match="frozen"):
        cfg.workers = 5  # type: ignore[misc]


def test_kafka_security_from_the_config(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    cfg = load_config(environ={}, kafka_security={
        "sasl_username": "executor", "sasl_password_file": str(pw), "ca_file": str(ca)})
    sec = cfg.client_security()
    assert sec is not None and sec.protocol == "SASL_SSL" and sec.username == "executor"
    assert sec.password == "s3cret" and "s3cret" not in str(cfg) and "s3cret" not in repr(sec)
    assert load_config(environ={}).client_security() is None
    with pytest.raises(ConfigError, match="sasl_password_file"):
        load_config(environ={}, kafka_security={"sasl_password": "in the clear"})
    bad = load_config(environ={}, kafka_security={"security_protocol": "SASL_SSL",
                                                   "ca_file": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigError, match="FX_KAFKA_CA_FILE"):
        bad.client_security()


def test_a_node_id_that_cannot_name_its_ledger_is_refused_at_load() -> None:
    assert load_config(environ={}, node_id="exec-a.b_c").node_id == "exec-a.b_c"
    for bad in ("exec a", "exec/a", "ex\u00e9c", "sys\x00x"):
        with pytest.raises(ConfigError, match="ledger"):
            load_config(environ={}, node_id=bad)


def test_a_handler_must_be_for_a_kind_served() -> None:
    kind = "acme:digest/run@1.0.0"
    cfg = load_config(environ={}, kinds={INFERENCE_KIND: 4, kind: 2},
                      handlers={kind: "some.module:Handler"})
    assert cfg.handlers == {kind: "some.module:Handler"}
    with pytest.raises(ConfigError, match="not in kinds"):
        load_config(environ={}, handlers={kind: "some.module:Handler"})


def test_a_misplaced_or_unknown_top_level_table_is_refused_naming_its_place(
    tmp_path: Path,
) -> None:
    """Issue 30, attack 7: a top-level ``[kafka_security]`` beside ``[executor]`` was ignored
    (logged as ``{}``) and the executor connected in plaintext. Now loading fails at start,
    naming where the table belongs; an unknown table is refused too."""
    path = tmp_path / "executor.toml"
    path.write_text('[executor]\nnode_id = "n1"\n\n[kafka_security]\n'
                    'security_protocol = "SASL_SSL"\n')
    with pytest.raises(ConfigError, match=r"belongs in \[executor\] \(write it as "
                       r"\[executor.kafka_security\]\)"):
        load_config(path, environ={})
    path.write_text('node_id = "n1"\n[executor]\nhttp_port = 0\n')
    with pytest.raises(ConfigError, match=r"node_id = \.\.\. under \[executor\]"):
        load_config(path, environ={})
    path.write_text('[executor]\nnode_id = "n1"\n[exeuctor_extra]\na = 1\n')
    with pytest.raises(ConfigError, match="'exeuctor_extra' at the top level is not a setting"):
        load_config(path, environ={})
    path.write_text('[executor]\nnode_id = "n1"\n\n[executor.kafka_security]\n'
                    'security_protocol = "PLAINTEXT"\n')
    assert load_config(path, environ={}).kafka_security == {"security_protocol": "PLAINTEXT"}


def test_routing_by_model_is_the_default_and_can_be_turned_off(tmp_path: Path) -> None:
    assert load_config(environ={}).route_by_model is True
    assert load_config(environ={"FX_EXECUTOR_ROUTE_BY_MODEL": "false"}).route_by_model is False
    path = tmp_path / "exec.toml"
    path.write_text("[executor]\nroute_by_model = false\n")
    assert load_config(path, environ={}).route_by_model is False
    repo = Path(__file__).resolve().parents[3]

    def printed(*flag: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "fx_cli.main", "executor", "run", "--print-config", *flag],
            cwd=repo, capture_output=True, text=True, timeout=120, check=False,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo), "HOME": str(tmp_path)})
        return proc.stdout + proc.stderr

    assert "route_by_model = true" in printed()
    assert "route_by_model = false" in printed("--no-route-by-model")
