"""The mode B executor: consume effect requests, fence, accept, run an engine, respond.

Import-light on purpose: importing ``executor`` (or ``fx_integer``, the integer engine and
its verifier) pulls in no aiokafka, FastAPI or ONNX Runtime. The service
(:mod:`executor.service`) is the node's shell (:mod:`fx_node.shell`) serving with the executor's
runner (:mod:`executor.runner`); the pure decision core is :mod:`fx_node.admission`; the model
store :mod:`executor.models`; engines under :mod:`executor.engines` (held by
:mod:`executor.engine_pool`); input reading :mod:`executor.inputs`; running models and writing
responses :mod:`executor.answering`; the chunk store :mod:`executor.chunks`; node keys and
response signatures :mod:`fx_node.identity`.
"""

__all__ = [
    "answering",
    "chunks",
    "config",
    "engine_pool",
    "engines",
    "inputs",
    "metrics",
    "models",
    "runner",
    "service",
]
