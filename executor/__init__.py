"""The mode B executor: consume effect requests, fence, accept, run an engine, respond.

Import-light on purpose: importing ``executor`` (or ``fx_integer``, the integer engine and
its verifier) pulls in no aiokafka, FastAPI or ONNX Runtime. The service lives in
:mod:`executor.service`; the pure decision core in :mod:`fx_node.admission`; the model store in
:mod:`executor.models`; engines under :mod:`executor.engines`; the chunk store in
:mod:`executor.chunks`; node keys and response signatures in :mod:`fx_node.identity`.
"""

__all__ = [
    "chunks",
    "config",
    "core",
    "engines",
    "errors",
    "facts",
    "identity",
    "metrics",
    "models",
    "service",
]
