"""Client security settings, the secured broker's rendered config, and the ACL plan (no broker)."""

from __future__ import annotations

import stat
import string
from pathlib import Path

import pytest

from fx_kafka.acl import AclBinding, Operation, PatternType, ResourceType, Roles, plan_acls
from fx_kafka.local import SECURE_FRAGMENT, deploy_dir, merge_properties, render_server_properties
from fx_kafka.local_security import LocalSecrets
from fx_kafka.security import ClientSecurity, SecurityConfigError, child_env, current, use_security


def test_from_env_defaults_to_plaintext_and_to_sasl_ssl_with_a_user(tmp_path: Path) -> None:
    assert ClientSecurity.from_env({}) == ClientSecurity()
    assert ClientSecurity.from_env({}).client_options() == {"security_protocol": "PLAINTEXT"}
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    sec = ClientSecurity.from_env({"FX_KAFKA_SASL_USERNAME": "executor",
                                   "FX_KAFKA_SASL_PASSWORD_FILE": str(pw),
                                   "FX_KAFKA_CA_FILE": str(ca)})
    assert (sec.protocol, sec.mechanism, sec.username, sec.password) == (
        "SASL_SSL", "SCRAM-SHA-512", "executor", "s3cret")
    assert sec.principal == "User:executor" and "s3cret" not in repr(sec)
    assert ClientSecurity.from_env(sec.to_env()) == sec
    assert ClientSecurity.from_env(sec.to_env(password_file=pw)) == sec


def test_incomplete_settings_name_the_variable() -> None:
    with pytest.raises(SecurityConfigError, match="FX_KAFKA_SASL_PASSWORD"):
        ClientSecurity.from_env({"FX_KAFKA_SASL_USERNAME": "u"})
    with pytest.raises(SecurityConfigError, match="FX_KAFKA_SECURITY_PROTOCOL"):
        ClientSecurity.from_env({"FX_KAFKA_SECURITY_PROTOCOL": "TLS"})
    with pytest.raises(SecurityConfigError, match="FX_KAFKA_CA_FILE"):
        ClientSecurity.from_env({"FX_KAFKA_CA_FILE": "/no/such/ca.crt"})


def test_use_security_reaches_factories_and_child_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FX_KAFKA_SASL_USERNAME", raising=False)
    monkeypatch.delenv("FX_KAFKA_SECURITY_PROTOCOL", raising=False)
    sec = ClientSecurity(protocol="SASL_PLAINTEXT", username="holder-a", password="p")
    assert current() == ClientSecurity()
    assert child_env({"A": "1"}) == {"A": "1"}
    with use_security(sec):
        assert current() == sec
        env = child_env({"A": "1", "FX_KAFKA_SASL_PASSWORD_FILE": "/old"})
    assert env["FX_KAFKA_SASL_USERNAME"] == "holder-a" and "FX_KAFKA_SASL_PASSWORD_FILE" not in env
    assert ClientSecurity.from_env(env) == sec
    assert current() == ClientSecurity()


def test_the_secured_config_replaces_the_listeners_and_adds_the_authorizer(
    tmp_path: Path,
) -> None:
    base = render_server_properties((deploy_dir() / "server.properties.template").read_text(),
                                    port=9092, controller_port=9093, log_dir=tmp_path)
    fragment = string.Template((deploy_dir() / SECURE_FRAGMENT).read_text()).substitute(
        port=9092, controller_port=9093, admin_user="admin", admin_password="pw",
        keystore="/k.pem", truststore="/ca.crt")
    text = merge_properties(base, fragment)
    pairs = [line.split("=", 1) for line in text.splitlines()
             if line.strip() and not line.startswith("#")]
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), "one line per key"
    props = dict(pairs)
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["log.dirs"] == str(tmp_path)  # the rest of the template stays


def test_local_secrets_are_made_once_with_private_modes(tmp_path: Path) -> None:
    secrets = LocalSecrets(tmp_path / "security")
    created = secrets.ensure(["executor"])
    assert created == ["admin", "executor"]
    assert stat.S_IMODE(secrets.root.stat().st_mode) == 0o700
    for path in (secrets.ca_key, secrets.keystore, secrets.password_file("admin")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ca, pw = secrets.ca_cert.read_bytes(), secrets.password("admin")
    assert secrets.ensure(["executor", "holder-a"]) == ["holder-a"]
    assert secrets.ca_cert.read_bytes() == ca and secrets.password("admin") == pw
    args = secrets.scram_args(["admin"])
    assert args == ["--add-scram", f"SCRAM-SHA-512=[name=admin,password={pw}]"]
    with pytest.raises(ValueError):
        secrets.password_file("../etc")


def test_the_acl_plan_is_what_the_design_implies() -> None:
    plan = plan_acls(Roles(holder="holder-w", producer="producer-w"), ["w"])
    assert plan == sorted(set(plan))

    def allowed(principal: str, op: Operation, topic: str) -> bool:
        for b in plan:
            if b.principal != principal or b.resource_type != ResourceType.TOPIC:
                continue
            if b.operation != op:
                continue
            if b.pattern == PatternType.LITERAL and b.name in (topic, "*"):
                return True
            if b.pattern == PatternType.PREFIXED and topic.startswith(b.name):
                return True
        return False

    ex, ho, pr, op = "User:executor", "User:holder-w", "User:producer-w", "User:operator"
    W, R = Operation.WRITE, Operation.READ
    for stream in ("out", "claims", "spec", "in"):
        assert allowed(ex, R, f"wl.w.{stream}")
    assert allowed(ex, W, "wl.w.resp") and allowed(ex, W, "sys.facts")
    assert allowed(ex, W, "sys.rejects") and allowed(ex, W, "sys.chunks")
    for stream in ("out", "merge", "claims", "spec", "in"):
        assert not allowed(ex, W, f"wl.w.{stream}"), stream
    assert not allowed(ex, R, "wl.w.merge") and not allowed(ex, R, "wl.other.out")
    for stream in ("in", "spec", "claims", "out", "resp", "merge"):
        assert allowed(ho, R, f"wl.w.{stream}")
        assert allowed(ho, W, f"wl.w.{stream}") == (stream in ("claims", "out", "resp", "merge"))
        assert not allowed(ho, R, f"wl.other.{stream}")
    # issue 30: a spec's grants are worth what its writer may read: only the operator (who
    # reads every topic) writes .spec; the holder never does
    assert not allowed(ho, W, "wl.w.spec") and not allowed(ho, W, "wl.w.shadow.e1.out")
    # DELETE (records for fx trim; topics are never deleted: delete.topic.enable=false) only
    # on the trimmed streams, as LITERAL names: never a prefix, never .spec or .claims
    deletes = [b for b in plan if b.operation == Operation.DELETE]
    assert deletes and all(b.pattern == PatternType.LITERAL and b.resource_type ==
                           ResourceType.TOPIC for b in deletes), deletes
    assert {(b.principal, b.name) for b in deletes} == {
        (who, f"wl.w.{s}") for who in (ho, op) for s in ("in", "out", "resp", "merge")}
    assert allowed(pr, W, "wl.w.in") and not allowed(pr, W, "wl.w.out")
    assert not allowed(pr, R, "wl.w.in")
    assert allowed(op, R, "wl.other.merge") and allowed(op, W, "wl.w.spec")
    assert not allowed(op, W, "wl.w.out")
    # the key history is the operator's (with the fleet key); no service writes it
    assert allowed(op, W, "sys.keys") and allowed(op, R, "sys.keys")
    assert not allowed(ex, W, "sys.keys") and not allowed(ho, W, "sys.keys")
    # the model registry (issue 28): only the operator writes it; no service reads it
    assert allowed(op, W, "sys.models") and allowed(op, R, "sys.models")
    assert not any(allowed(who, W, "sys.models") for who in (ex, ho, pr))
    assert not allowed(ho, R, "sys.models") and not allowed(ex, R, "sys.models")
    # the holder reads it (and sys.facts) for its signature checks
    assert allowed(ho, R, "sys.keys") and allowed(ho, R, "sys.facts")
    # alarms: the holder raises them with its unknown or timeout, a gateway when its device
    # does not confirm a write, the operator acknowledges them
    assert allowed(ho, W, "sys.alarms") and allowed(op, W, "sys.alarms")
    assert allowed(ex, W, "sys.alarms") and not allowed(ex, R, "sys.alarms")
    # an actuator gateway (the executor role) keeps its memory
    assert allowed(ex, W, "sys.actuator.gw-1") and allowed(ex, R, "sys.actuator.gw-1")
    assert AclBinding(ho, ResourceType.TRANSACTIONAL_ID, "fx-holder.w", PatternType.LITERAL,
                      W) in plan
    assert AclBinding(ex, ResourceType.GROUP, "fx-executor.", PatternType.PREFIXED,
                      R) in plan
    assert AclBinding(ho, ResourceType.GROUP, "fx-holder-elect.w", PatternType.LITERAL,
                      R) in plan
    # the holder's metrics read the executors' committed offsets: describe only, never join
    for prefix in ("fx-executor.", "fx-actuator."):
        assert AclBinding(ho, ResourceType.GROUP, prefix, PatternType.PREFIXED,
                          Operation.DESCRIBE) in plan
        assert AclBinding(ho, ResourceType.GROUP, prefix, PatternType.PREFIXED, R) not in plan
    with pytest.raises(ValueError):
        plan_acls(Roles(), ["bad.id"])


def test_per_node_users_write_only_their_own_ledger() -> None:
    # issue 31: anyone allowed to write sys.ledger.<node> could append a foreign leaf; with
    # per-node users only the node itself may
    roles = Roles(holder=None, producer=None, ledger_nodes=(("gpu-1", "node-gpu-1"),
                                                            ("gpu-2", "node-gpu-2")))
    plan = plan_acls(roles, ["w"])

    def allowed(principal: str, op: Operation, topic: str) -> bool:
        return any(b.principal == principal and b.resource_type == ResourceType.TOPIC
                   and b.operation == op and (
                       (b.pattern == PatternType.LITERAL and b.name == topic)
                       or (b.pattern == PatternType.PREFIXED and topic.startswith(b.name)))
                   for b in plan)

    W, R = Operation.WRITE, Operation.READ
    assert allowed("User:node-gpu-1", W, "sys.ledger.gpu-1")
    assert not allowed("User:node-gpu-1", W, "sys.ledger.gpu-2")
    assert not allowed("User:node-gpu-2", W, "sys.ledger.gpu-1")
    assert not allowed("User:executor", W, "sys.ledger.gpu-1")  # the shared user only reads
    assert allowed("User:executor", R, "sys.ledger.gpu-1")
    # a node user is an executor in every other respect
    for user in ("User:node-gpu-1", "User:node-gpu-2"):
        assert allowed(user, W, "wl.w.resp") and allowed(user, R, "wl.w.out")
        assert allowed(user, W, "sys.facts")
    # without per-node users the shared executor user writes every ledger, as before
    shared = plan_acls(Roles(holder=None, producer=None), ["w"])
    assert any(b.principal == "User:executor" and b.operation == W
               and b.name == "sys.ledger." for b in shared)
