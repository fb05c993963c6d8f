"""Which chunks and stream records a workload's references may name: one rule for both services.

A body may be a :class:`~broker_schema.records.ChunkRef` (a chunk in the chunk store) or a
:class:`~broker_schema.records.StreamRef` (another record). Whoever reads what a reference names
(the executor for a request's input, the lease holder and replay for an input's body or an
answer's output) reads only what belongs to the workload ``reader``:

- a chunk of ``reader`` itself, of the workload the reference was found in (``context``: a
  reference inside a stream record belongs to the workload of that record's topic), or of a
  workload ``reader``'s spec lists in ``chunks_from``. The chunk's owner is
  :func:`chunk_owner`: ``ref.workload``, else ``context``. Chunks are stored per workload, so
  this also decides where the store is looked in;
- a stream record of ``reader``'s own ``wl.<id>.in``, or of a topic its spec lists in
  ``input_topics`` (workload topics only; the spec's validation refuses ``sys.*``). Nothing
  else: ``sys.facts``, ``sys.chunks``, another workload's topics, the workload's own ``.out``,
  ``.resp``, ``.merge``, ``.claims`` and ``.spec``, and any malformed name.

Pure: the answer is asked before anything of the named topic or chunk is asked of the broker or
the store, so a forbidden or malformed name never reaches it.
"""

from __future__ import annotations

from broker_schema import topics
from broker_schema.records import Body, ChunkRef, SpecRecord, StreamRef

__all__ = ["chunk_owner", "chunk_problem", "describe_topic", "ref_problem", "stream_problem"]


def describe_topic(topic: str) -> str:
    """What kind of topic ``topic`` is, for a refusal message (people only)."""
    shown = repr(topic[:120]) + ("..." if len(topic) > 120 else "")
    if topic.startswith("sys."):
        return f"{shown} is a system topic"
    try:
        workload_id, stream = topics.parse(topic)
    except ValueError:
        return f"{shown} is not a workload topic"
    return f"{shown} is the {stream} stream of workload {workload_id}"


def chunk_owner(ref: ChunkRef, context: str) -> str:
    """The workload a chunk reference names a chunk of: ``ref.workload``, else ``context`` (the
    workload the reference was read in: the request's, or that of the stream record's topic)."""
    return ref.workload if ref.workload is not None else context


def chunk_problem(ref: ChunkRef, *, reader: str, spec: SpecRecord | None,
                  context: str) -> str | None:
    """Why workload ``reader`` may not read the chunk ``ref``, or None.

    ``context`` is the workload the reference was found in: ``reader`` for its own request
    inputs, records and answers, the workload of the topic for a reference inside a stream
    record (a record ``reader`` may read, :func:`stream_problem`; its chunks come with it). The
    chunk's owner (:func:`chunk_owner`) must be ``reader``, ``context``, or a workload
    ``reader``'s spec lists in ``chunks_from``."""
    owner = chunk_owner(ref, context)
    if owner in (reader, context):
        return None
    if spec is not None and owner in spec.chunks_from:
        return None
    return (f"a request of workload {reader} may read its own chunks and those of the workloads "
            f"its spec grants (chunks_from), and chunk {ref.hash} is named as one of workload "
            f"{owner}")


def stream_problem(ref: StreamRef, *, reader: str, spec: SpecRecord | None) -> str | None:
    """Why workload ``reader`` may not read the record ``ref`` names, or None: only its own
    ``wl.<id>.in`` and the topics its spec grants (``input_topics``)."""
    own = topics.inputs(reader)
    if ref.topic == own:
        return None
    if spec is not None and ref.topic in spec.input_topics:
        return None
    return (f"a request of workload {reader} may read {own} and the topics its spec grants "
            f"(input_topics), and {describe_topic(ref.topic)}")


def ref_problem(body: Body | None, *, reader: str, spec: SpecRecord | None) -> str | None:
    """Why workload ``reader`` may not read what ``body`` names (found in its own records), or
    None: an inline body or none is always readable."""
    if isinstance(body, ChunkRef):
        return chunk_problem(body, reader=reader, spec=spec, context=reader)
    if isinstance(body, StreamRef):
        return stream_problem(body, reader=reader, spec=spec)
    return None
