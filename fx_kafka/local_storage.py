"""A local Kafka's storage: its nodes' configs (rendered from
``deploy/local-kafka/server.properties.template``) and the decision to reuse the formatted storage
of a data dir (the same cluster id, logs and ports) or format it. Used by
:class:`fx_kafka.local.LocalKafka`; nothing here deletes a log dir."""

from __future__ import annotations

import dataclasses
import logging
import os
import string
import time
from dataclasses import dataclass
from pathlib import Path

from fx_kafka.errors import BrokerStartError, PortInUseError
from fx_kafka.local_process import NodeProcesses, pick_free_ports, port_bindable, port_owner
from fx_kafka.local_security import ADMIN_USER, LocalSecrets
from fx_kafka.local_state import (
    HOST,
    BrokerState,
    NodeFiles,
    NodeState,
    bootstrap_of,
    read_state,
    write_state,
)
from fx_kafka.replication import default_for

__all__ = ["SECURE_FRAGMENT", "LocalStorage", "StartPlan", "merge_properties",
           "render_server_properties"]

log = logging.getLogger("fx_kafka.local")

#: The security lines of a secured broker, merged into the rendered template.
SECURE_FRAGMENT = "server-secure.properties.fragment"


def render_server_properties(
    template: str,
    *,
    port: int,
    controller_port: int,
    log_dir: Path | str,
    node_id: int = 1,
    voters: dict[int, int] | None = None,
) -> str:
    """Fill the template's placeholders; a placeholder left unfilled raises ``KeyError``.

    ``voters`` (node id -> controller port) makes the node one voter of a static quorum of that
    many nodes, with the internal topics replicated ``min(3, nodes)`` times and a min ISR of 2
    from 3 nodes on. Without it the node is a one-node dynamic quorum (format ``--standalone``).
    """
    if port == controller_port:
        raise ValueError("the broker and controller ports must differ")
    if voters:
        if voters.get(node_id) != controller_port:
            raise ValueError(f"node {node_id} must be a voter on its controller port")
        quorum = "controller.quorum.voters=" + ",".join(
            f"{nid}@{HOST}:{cport}" for nid, cport in sorted(voters.items())
        )
        replication, min_isr = default_for(len(voters))
    else:
        quorum = f"controller.quorum.bootstrap.servers={HOST}:{controller_port}"
        replication, min_isr = 1, 1
    return string.Template(template).substitute(
        port=port,
        controller_port=controller_port,
        log_dir=str(log_dir),
        node_id=node_id,
        quorum=quorum,
        replication_factor=replication,
        min_isr=min_isr,
    )


def merge_properties(base: str, overrides: str) -> str:
    """``base`` (a ``.properties`` text) with every line whose key ``overrides`` sets removed,
    then ``overrides`` appended: one line per key, the override's."""
    def key_of(line: str) -> str | None:
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "!")) or "=" not in stripped:
            return None
        return stripped.split("=", 1)[0].strip()

    replaced = {k for k in map(key_of, overrides.splitlines()) if k}
    kept = [line for line in base.splitlines() if key_of(line) not in replaced]
    return "\n".join(kept).rstrip("\n") + "\n\n" + overrides.rstrip("\n") + "\n"


@dataclass
class StartPlan:
    """How a start goes on: the java to run, the cluster id and nodes, whether the storage was
    reused, and whether the broker runs secured (a data dir formatted secured stays so)."""

    java: str
    cluster_id: str
    nodes: list[NodeState]
    t0: float
    reused: bool
    #: users that got a password after the storage was formatted: added once the broker runs
    new_users: list[str] = dataclasses.field(default_factory=list)
    secure: bool = False


class LocalStorage:
    """The storage of the data dir ``data_dir`` of a ``nodes``-node Kafka ``version``: where each
    node's files live, its ``state.json``, the configs, and formatting (Kafka's StorageTool, run
    by ``processes``)."""

    def __init__(self, *, data_dir: Path, nodes: int, version: str, deploy: Path,
                 users: tuple[str, ...], secrets: LocalSecrets,
                 processes: NodeProcesses) -> None:
        self.data_dir = data_dir
        self.nodes = nodes
        self.version = version
        self.deploy = deploy
        self.users = users
        self.secrets = secrets
        self.processes = processes

    @property
    def state_file(self) -> Path:
        """``data_dir/state.json``."""
        return self.data_dir / "state.json"

    def files(self, node_id: int, count: int | None = None) -> NodeFiles:
        """Where node ``node_id`` of a ``count``-node broker (default: this one's) keeps its
        files: the data dir itself for one node, ``node-<id>/`` in a cluster."""
        count = self.nodes if count is None else count
        root = self.data_dir if count == 1 else self.data_dir / f"node-{node_id}"
        return NodeFiles(node_id, root)

    def check_ports_free(self, nodes: list[NodeState]) -> None:
        """``PortInUseError`` naming the owner when a port of ``nodes`` is taken."""
        for node in nodes:
            for what, port in (("listener", node.port), ("controller", node.controller_port)):
                if port_bindable(port):
                    continue
                owner = port_owner(port)
                raise PortInUseError(
                    f"port {port} ({'node ' + str(node.node_id) + ' ' if self.nodes > 1 else ''}"
                    f"{what}, recorded in {self.state_file}) is in use by "
                    f"{owner or 'another process'}. The data in {self.data_dir} is kept and "
                    "needs this port: stop that process and start again, or delete the data "
                    f"with `fx broker reset --data-dir {self.data_dir}` to start afresh on new "
                    "ports",
                    port=port,
                    owner=owner,
                )

    def plan(self, java: str, t0: float, *, secure: bool) -> StartPlan:
        """Reuse the formatted storage (its cluster id and ports, refusing a mismatch of node
        count, version or security) or format it afresh on free ports, the configs rendered
        either way."""
        previous = read_state(self.state_file)
        files = [self.files(i) for i in range(1, self.nodes + 1)]
        if previous is not None:
            count = len(previous.node_states())
            if count != self.nodes:
                raise BrokerStartError(
                    f"{self.data_dir} holds a {count}-node broker; start it with --nodes {count} "
                    f"(or delete its data with `fx broker reset --data-dir {self.data_dir}`)")
        formatted = [f for f in files if f.formatted()]
        if formatted:
            if previous is None:
                raise BrokerStartError(
                    f"{formatted[0].log_dir} holds Kafka data but {self.state_file} is missing "
                    "or unreadable, so its ports and cluster id are unknown. Nothing was "
                    f"deleted; `fx broker reset --data-dir {self.data_dir}` removes the data")
            if previous.version != self.version:
                raise BrokerStartError(
                    f"{self.data_dir} holds data of Kafka {previous.version}, not {self.version}: "
                    f"start it with --version {previous.version}")
            if len(formatted) != len(files):
                missing = [f.node_id for f in files if not f.formatted()]
                raise BrokerStartError(
                    f"node(s) {missing} of {self.data_dir} have no formatted storage while the "
                    "others have: nothing was deleted; restore them or `fx broker reset`")
            if previous.secure != secure:
                if not previous.secure:
                    raise BrokerStartError(
                        f"{self.data_dir} was formatted without --secure: its SCRAM credentials "
                        "are written at format time, so it cannot become secured in place; "
                        f"`fx broker reset --data-dir {self.data_dir}` and start again with "
                        "--secure")
                log.info("%s was formatted secured: starting it secured", self.data_dir)
                secure = True
            nodes = list(previous.node_states())
            self.check_ports_free(nodes)
            new_users = self.secrets.ensure(self.users) if secure else []
            log.info("reusing the storage in %s (cluster %s, ports %s)", self.data_dir,
                     previous.cluster_id, ", ".join(str(n.port) for n in nodes))
            self.render(files, nodes, secure=secure)
            return StartPlan(java, previous.cluster_id, nodes, t0, reused=True, new_users=new_users,
                             secure=secure)

        for f in files:
            if f.holds_files():
                raise BrokerStartError(
                    f"{f.log_dir} holds files but no meta.properties (not a formatted Kafka log "
                    f"dir): nothing was deleted; `fx broker reset --data-dir {self.data_dir}` "
                    "removes it")
        ports = pick_free_ports(2 * self.nodes)
        nodes = [NodeState(i + 1, None, ports[2 * i], ports[2 * i + 1])
                 for i in range(self.nodes)]
        scram: list[str] = []
        if secure:
            self.secrets.ensure(self.users)
            scram = self.secrets.scram_args()
        self.render(files, nodes, secure=secure)
        cluster_id = self.processes.storage_tool(java, "random-uuid").strip().splitlines()[-1]
        for f in files:
            extra = ("--standalone",) if self.nodes == 1 else ()
            self.processes.storage_tool(java, "format", *extra, "-t", cluster_id, "-c",
                                        str(f.properties), *scram)
        # recorded before the first launch: a start that fails after formatting is resumed by the
        # next start on the same ports, never formatted again
        self.write_state(cluster_id, nodes, t0, secure=secure, started=False)
        return StartPlan(java, cluster_id, nodes, t0, reused=False, secure=secure)

    def render(self, files: list[NodeFiles], nodes: list[NodeState], *, secure: bool) -> None:
        """Write each node's ``server.properties`` (and, secured, the client files)."""
        template = (self.deploy / "server.properties.template").read_text()
        fragment = (self.deploy / SECURE_FRAGMENT).read_text() if secure else None
        voters = {n.node_id: n.controller_port for n in nodes} if len(nodes) > 1 else None
        for f, node in zip(files, nodes, strict=True):
            f.root.mkdir(parents=True, exist_ok=True)
            text = render_server_properties(
                template, port=node.port, controller_port=node.controller_port,
                log_dir=f.log_dir, node_id=node.node_id, voters=voters)
            if fragment is None:
                f.properties.write_text(text)
                continue
            sec = self.secrets
            text = merge_properties(text, string.Template(fragment).substitute(
                port=node.port, controller_port=node.controller_port, admin_user=ADMIN_USER,
                admin_password=sec.password(ADMIN_USER), keystore=sec.keystore,
                truststore=sec.ca_cert))
            # it holds the broker's password: readable by its owner only
            fd = os.open(f.properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(f.properties, 0o600)
        if secure:
            # the metadata log holds the SCRAM credentials (salted), the configs a password
            os.chmod(self.data_dir, 0o700)
            self.secrets.write_env_files(bootstrap_of(nodes))
            self.secrets.write_client_properties()

    def write_state(self, cluster_id: str, nodes: list[NodeState], t0: float, *, secure: bool,
                    started: bool = True) -> None:
        """Record the broker in ``state.json``."""
        first = nodes[0]
        write_state(
            self.state_file,
            BrokerState(
                pid=first.pid,
                bootstrap=bootstrap_of(nodes),
                port=first.port,
                controller_port=first.controller_port,
                version=self.version,
                cluster_id=cluster_id,
                started_at=time.time(),
                start_seconds=round(time.perf_counter() - t0, 3) if started else 0.0,
                nodes=tuple(nodes),
                secure=secure,
            ),
        )

