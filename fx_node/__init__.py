"""The effect node: the shell both node services run (the executor, :mod:`executor`, and the
actuator gateway, :mod:`actuator`), and what they share.

Layering: ``broker_schema ← fx_kafka ← fx_node ← {executor, actuator}``. ``fx_node`` knows no
runner: a service hands its shell (:class:`fx_node.shell.NodeShell`) a runner
(:class:`fx_node.runner.Runner`), which decides and does what the node is for; the shell reads
``wl.*.out``, commits, keeps leases, publishes facts, answers HTTP and writes through the
resilient producer (:class:`fx_node.producer.ResilientProducer`).

Modules: :mod:`fx_node.service` the node as one object (lifecycle delegated to the shell);
:mod:`fx_node.admission` the admission rules (pure); :mod:`fx_node.sync` the claims and
spec catch-up; :mod:`fx_node.identity` the node's signing key; :mod:`fx_node.facts` the facts
record; :mod:`fx_node.errors` the errors that become ``error`` outcomes; :mod:`fx_node.settings`
the config loader; :mod:`fx_node.http` the health, readiness, facts and metrics endpoints.
"""
