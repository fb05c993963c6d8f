"""Hypothesis strategies for every record kind (shared by unit tests of all packages)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import broker_schema as bs
from broker_schema.canonical import sha256_hex

HEX = "0123456789abcdef"
hashes = st.text(alphabet=HEX, min_size=64, max_size=64).map(lambda h: "sha256:" + h)
workload_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True)
node_ids = st.text(min_size=1, max_size=30)
offsets = st.integers(min_value=0, max_value=2**53 - 1)
small = st.integers(min_value=0, max_value=10_000)
epochs = st.integers(min_value=1, max_value=2**40)
guarantees = st.sampled_from(["idempotent", "fenced", "at-most-once"])
kinds = st.sampled_from(
    [bs.INFERENCE_KIND, "ninelives:actuate/set@1.0.0", "acme:valve.position/set@2.1.3"]
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    # an integral float of magnitude >= 2^53 prints as an integer JSON cannot read back exactly
    | st.floats(min_value=-(2.0**52), max_value=2.0**52, allow_nan=False, width=64)
    | st.text(max_size=20)
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

inline_bodies = st.one_of(
    json_values.map(bs.InlineBody.of_json),
    st.text(max_size=50).map(bs.InlineBody.of_text),
    st.binary(max_size=80).map(bs.InlineBody.of_bytes),
)
chunk_refs = st.builds(bs.ChunkRef, hash=hashes, size=offsets,
                       media_type=st.none() | st.just("audio/wav"),
                       workload=st.none() | workload_ids)
stream_refs = st.builds(bs.StreamRef, topic=st.just("wl.cam-1.in"), partition=st.just(0),
                        offset=offsets, hash=st.none() | hashes)
bodies = st.one_of(inline_bodies, chunk_refs, stream_refs)

headers = st.builds(
    bs.EffectHeader, workload_id=workload_ids, input_offset=offsets,
    index=st.integers(min_value=0, max_value=100), epoch=epochs,
    shadow=st.none() | st.just("eval-7"),
)
timings = st.builds(bs.Timing, received_us=offsets, started_us=st.none() | offsets,
                    finished_us=st.none() | offsets)
executors = st.builds(bs.ExecutorInfo, node_id=node_ids, engine=st.just("onnxruntime"),
                      engine_version=st.just("1.32.0"), device_class=st.just("cpu"))
signatures = st.builds(bs.Signature, key_id=hashes, value=st.binary(min_size=64, max_size=64).map(
    lambda b: __import__("base64").b64encode(b).decode()))


@st.composite
def responses(draw: st.DrawFn) -> bs.ResponseRecord:
    outcome = draw(st.sampled_from(["ok", "error", "timeout", "unknown", "backpressure"]))
    code = draw(st.sampled_from(sorted(bs.ERROR_RETRIABLE)))
    header = draw(headers)
    return bs.ResponseRecord(
        effect_id=header.effect_id, header=header, request_offset=draw(offsets),
        outcome=outcome,
        error=bs.ErrorInfo(code=code, message=draw(st.text(max_size=30)))
        if outcome == "error" else None,
        output=draw(st.none() | bodies) if outcome == "ok" else None,
        model_hash=draw(st.none() | hashes), executor=draw(st.none() | executors),
        timing=draw(st.none() | timings), written_by=draw(node_ids),
        receipt=draw(st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=3)),
        signature=draw(st.none() | signatures),
    )


skip_notes: st.SearchStrategy[bs.SkipNote] = st.builds(
    bs.SkipNote, cause=st.sampled_from(["unresolvable", "step_raised", "operator"]),
    detail=st.text(max_size=30), principal=st.none() | node_ids,
    order_offset=st.none() | offsets)


@st.composite
def merges(draw: st.DrawFn) -> bs.MergeEntry:
    action = draw(st.sampled_from(["deliver", "pass_over"]))
    workload_id = draw(workload_ids)
    return bs.MergeEntry(
        workload_id=workload_id, seq=draw(offsets), epoch=draw(epochs),
        source=draw(st.sampled_from(["in", "resp"])), source_offset=draw(offsets),
        effect_id=draw(st.none() | st.just(f"{workload_id}/1/0@1")), action=action,
        reason=draw(st.sampled_from(["duplicate", "after_outcome", "unknown_effect"]))
        if action == "pass_over" else None,
    )


records: st.SearchStrategy[Any] = st.one_of(
    st.builds(bs.InputRecord, workload_id=workload_ids, body=bodies,
              source=st.none() | st.text(max_size=10)),
    st.builds(bs.SpecRecord, workload_id=workload_ids, module_hash=hashes,
              effect_kinds=st.lists(kinds, max_size=3).map(tuple),
              models=st.dictionaries(st.text(min_size=1, max_size=8), hashes, max_size=3),
              binding_switches=st.lists(small, max_size=3, unique=True).map(
                  lambda offs: tuple(bs.BindingSwitch(at_input_offset=o, models={})
                                     for o in sorted(offs))),
              module_switches=st.lists(small, max_size=2, unique=True).map(
                  lambda steps: tuple(bs.ModuleSwitch(at_step=o, module_hash="sha256:" + "ab" * 32,
                                                      workload_class="Gate")
                                      for o in sorted(steps))),
              outstanding_limit=st.integers(1, 100), audit_horizon_ms=st.none() | offsets,
              chunks_from=st.lists(workload_ids, max_size=2).map(tuple),
              input_policy=st.builds(bs.InputPolicy, wait_ms=offsets,
                                     then=st.sampled_from(["quarantine", "stop"])),
              chunk_store=st.sampled_from(["kafka", "fs"])).flatmap(
        lambda spec: st.dictionaries(st.sampled_from(spec.effect_kinds or (bs.INFERENCE_KIND,)),
                                     guarantees, max_size=2).map(
            lambda g: spec.model_copy(update={"guarantees": g})
            if set(g) <= set(spec.effect_kinds) else spec)),
    st.builds(bs.ClaimRecord, workload_id=workload_ids, epoch=epochs, holder_id=node_ids,
              spec_hash=hashes, spec_offset=offsets, from_seq=st.none() | offsets,
              forced=st.lists(st.text(max_size=20), max_size=2).map(tuple)),
    st.builds(bs.OutputRecord, header=headers, body=bodies),
    st.builds(bs.EffectRequest, header=headers, effect_kind=kinds, model=st.none() | hashes,
              params=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
              input=st.none() | bodies, deadline_ms=st.integers(1, 10**9)),
    headers.filter(lambda h: h.input_offset > 0).flatmap(lambda h: st.builds(
        bs.EffectRequest, header=st.just(h), effect_kind=kinds, params=st.just({"set_point": 40}),
        deadline_ms=st.integers(1, 10**9),
        reissue_of=st.just(h.model_copy(update={"input_offset": h.input_offset - 1,
                                                "epoch": 1}).effect_id))),
    headers.flatmap(lambda h: st.builds(
        bs.AcceptedRecord, effect_id=st.just(h.effect_id), header=st.just(h),
        request_offset=offsets, node_id=node_ids, lease_ms=st.integers(1, 10**6),
        accepted_us=offsets)),
    responses(),
    merges(),
    st.builds(bs.SnapshotRecord, workload_id=workload_ids, seq=offsets, epoch=epochs,
              state_hash=hashes, state=bodies,
              positions=st.dictionaries(st.sampled_from(["in", "resp"]), offsets)),
    st.builds(bs.TickRecord, workload_id=workload_ids, epoch=epochs, holder_id=node_ids),
    st.builds(bs.FactsRecord, node_id=node_ids,
              kinds=st.lists(st.builds(bs.KindServed, kind=kinds, queue_limit=st.integers(1, 64),
                                       guarantee=st.none() | guarantees),
                             max_size=2).map(tuple),
              models_present=st.lists(hashes, max_size=2).map(tuple),
              models_loaded=st.lists(hashes, max_size=2).map(tuple),
              engines=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
              accelerators=st.lists(st.text(max_size=5), max_size=2).map(tuple),
              public_key=st.just("MCowBQYDK2VwAyEA"), key_id=hashes, updated_us=offsets),
    headers.flatmap(lambda h: st.builds(
        bs.AlarmRecord, alarm_id=st.just(h.effect_id), workload_id=st.just(h.workload_id),
        header=st.just(h), effect_kind=kinds, guarantee=guarantees, request_offset=offsets,
        reissue_of=st.none() | st.just(f"{h.workload_id}/0/0@1"),
        accepted_by=st.none() | node_ids, reason=st.text(max_size=30), raised_by=node_ids,
        raised_us=offsets, cause=st.sampled_from(["unknown", "timeout", "device_timeout"]),
        read_back=st.none() | st.builds(
            bs.DeviceReadBack, device=st.just("valve-1"),
            address=st.integers(min_value=0, max_value=65535),
            wanted=st.integers(min_value=0, max_value=100),
            value=st.none() | st.integers(min_value=0, max_value=65535)))),
    st.builds(bs.AlarmAckRecord, alarm_id=st.just("cam-1/4/1@2"), acked_by=node_ids,
              note=st.text(max_size=20), acked_us=offsets),
    st.builds(bs.SkipOrderRecord, workload_id=workload_ids, input_offset=offsets,
              reason=st.text(min_size=1, max_size=20), principal=node_ids, ordered_us=offsets),
    st.tuples(workload_ids, offsets, skip_notes).map(lambda t: bs.SkipAlarmRecord(
        alarm_id=bs.skip_alarm_id(t[0], t[1]), workload_id=t[0], input_offset=t[1], seq=0,
        skip=t[2], raised_by="holder-a", raised_us=1)),
    st.tuples(workload_ids, offsets, skip_notes).map(lambda t: bs.MergeEntry(
        workload_id=t[0], seq=t[1], epoch=1, source="in", source_offset=t[1],
        action="pass_over", reason="quarantined", skip=t[2])),
    st.builds(bs.ActuatorMemoryRecord, node_id=node_ids, entry=st.just("epoch"),
              device=st.just("valve-1"), workload_id=workload_ids, epoch=epochs,
              written_us=offsets),
    st.builds(bs.ActuatorMemoryRecord, node_id=node_ids,
              entry=st.sampled_from(["attempt", "done", "cleared"]), device=st.just("gate-1"),
              workload_id=st.just("cam-1"), epoch=epochs, effect_id=st.just("cam-1/3/1@2"),
              request_effect_id=st.none() | st.just("cam-1/9/0@2"),
              written_us=offsets).map(
        lambda m: m.model_copy(update={"output": bs.InlineBody.of_json({"read_back": 40})})
        if m.entry == "done" else m),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=40).map(
        lambda src: bs.ModuleRecord(module_hash=sha256_hex(src.encode()), workload_class="Gate",
                                    filename="gate.py", source=src, written_by="ops",
                                    written_us=1)),
    st.builds(bs.RejectedRecord, topic=st.just("wl.x.out"), partition=st.just(0), offset=offsets,
              code=st.sampled_from([*bs.DECODE_CODES, "wrong_workload"]),
              detail=st.text(max_size=30),
              size=small, value_hash=hashes, seen_by=node_ids),
)
