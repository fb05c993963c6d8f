"""What each page of ``fx console`` shows, as pure functions of decoded records (no I/O).

Every function here takes records (or the rows :func:`row_of` makes of them) and returns plain
data a template renders; the routes (:mod:`console.app`) only read and pass it on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker_schema import (
    AlarmAckRecord,
    AlarmRecord,
    FactsRecord,
    InlineBody,
    ResponseRecord,
    topics,
)
from broker_schema.binding import epoch_refused
from workload_sdk import MODULE_PLACEHOLDER, log_command, show_command

# the timeline's rows are ``fx log``'s (one home): the console's filters are fx log queries;
# re-exported here for the routes and the console's store
from workload_sdk.log_rows import KINDS as KINDS
from workload_sdk.log_rows import OUTCOMES as OUTCOMES
from workload_sdk.log_rows import STREAM_ORDER as STREAM_ORDER
from workload_sdk.log_rows import Row as Row
from workload_sdk.log_rows import row_of as row_of
from workload_sdk.log_rows import short

#: Rows per timeline page.
PAGE_SIZE = 100
#: The largest page a URL may ask for.
MAX_PAGE_SIZE = 1000


class BadInput(ValueError):
    """A request the console cannot answer as asked (HTTP 400): a malformed offset, id, filter."""


class NotFound(LookupError):
    """What a URL names is not on the cluster (HTTP 404): a workload, a record, an effect."""


def parse_offset(text: str | None, name: str = "offset") -> int | None:
    """A non-negative integer from a URL (None for an absent or empty value); :class:`BadInput`
    otherwise."""
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise BadInput(f"{name} must be a non-negative integer, not {text[:40]!r}")
    return int(text)


def parse_workload_id(text: str) -> str:
    """A workload id usable in topic names (:func:`broker_schema.topics.check_workload_id`);
    :class:`BadInput` otherwise."""
    try:
        return topics.check_workload_id(text)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def parse_stream(text: str) -> str:
    """One of the workload streams; :class:`BadInput` otherwise."""
    if text not in STREAM_ORDER:
        raise BadInput(f"not a workload stream: {text[:40]!r} (one of {', '.join(STREAM_ORDER)})")
    return text


@dataclass(frozen=True)
class Filter:
    """What a timeline shows: record kinds, outcomes, one stream, an offset range (inclusive)."""

    kinds: frozenset[str] = frozenset()
    outcomes: frozenset[str] = frozenset()
    stream: str | None = None
    lo: int | None = None
    hi: int | None = None

    def matches(self, row: Row) -> bool:
        """Does ``row`` pass every filter that is set?"""
        return ((not self.kinds or row.kind in self.kinds)
                and (not self.outcomes or row.outcome in self.outcomes)
                and (self.stream is None or row.stream == self.stream)
                and (self.lo is None or row.offset >= self.lo)
                and (self.hi is None or row.offset <= self.hi))


def parse_filter(kinds: Sequence[str], outcomes: Sequence[str], stream: str | None,
                 lo: str | None, hi: str | None) -> Filter:
    """A :class:`Filter` from URL parameters; :class:`BadInput` for a value it does not know."""
    bad = sorted(set(kinds) - set(KINDS))
    if bad:
        raise BadInput(f"unknown record kind {bad[0][:40]!r} (one of {', '.join(KINDS)})")
    bad = sorted(set(outcomes) - set(OUTCOMES))
    if bad:
        raise BadInput(f"unknown outcome {bad[0][:40]!r} (one of {', '.join(OUTCOMES)})")
    low, high = parse_offset(lo, "from"), parse_offset(hi, "to")
    if low is not None and high is not None and low > high:
        raise BadInput(f"the offset range is empty: from {low} > to {high}")
    return Filter(frozenset(kinds), frozenset(outcomes),
                  parse_stream(stream) if stream else None, low, high)


def log_query(workload_id: str, flt: Filter) -> str:
    """The ``fx log`` command that lists the rows ``flt`` shows (the same rows, the same
    filters: ``fx log`` lists :func:`row_of`'s rows too), for the timeline to show."""
    return log_command(workload_id, streams=() if flt.stream is None else (flt.stream,),
                       kinds=flt.kinds, outcomes=flt.outcomes, lo=flt.lo, hi=flt.hi)


@dataclass
class Page:
    """One page of a filtered timeline."""

    rows: list[Row]
    number: int
    pages: int
    total: int
    size: int
    #: the row a shared link points at (``stream``/``at``), when it is on this page
    focus: tuple[str, int] | None = None


def page_of(rows: Sequence[Row], flt: Filter, *, page: int | None = None,
            size: int = PAGE_SIZE, at: tuple[str, int] | None = None) -> Page:
    """The ``page``-th (0-based) page of the rows that pass ``flt`` (``rows`` in timeline
    order), or the page holding the record ``at`` (stream, offset); the last page when neither
    is given. :class:`BadInput` for a page past the end or a bad size; :class:`NotFound` when
    ``at`` is not among the filtered rows."""
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise BadInput(f"page size must be 1 to {MAX_PAGE_SIZE}, not {size}")
    chosen = [r for r in rows if flt.matches(r)]
    pages = max(1, -(-len(chosen) // size))
    if at is not None:
        index = next((i for i, r in enumerate(chosen) if (r.stream, r.offset) == at), None)
        if index is None:
            raise NotFound(f"no record at {at[0]}@{at[1]} among the rows shown")
        page = index // size
    elif page is None:
        page = pages - 1
    if not 0 <= page < pages:
        raise BadInput(f"page {page} is past the end: {pages} page(s) of {size}")
    return Page(chosen[page * size:(page + 1) * size], page, pages, len(chosen), size, at)


#: Which outcome a strip bucket shows when it holds several: the one that most needs a look.
SEVERITY = ("undecodable", "error", "unknown", "timeout", "backpressure", "passed_over", "ok",
            "delivered", "accepted", "")


@dataclass(frozen=True)
class Bucket:
    """A stretch of offsets ``lo..hi`` of one stream on the offset strip: how many records it
    holds and the outcome among them that most needs a look (:data:`SEVERITY`)."""

    lo: int
    hi: int
    count: int
    worst: str


def offset_strip(rows: Iterable[Row], ends: Mapping[str, tuple[int, int]],
                 buckets: int = 100) -> dict[str, list[Bucket]]:
    """Each stream's offsets (``ends``: stream -> (log start, end)) cut into at most
    ``buckets`` equal stretches, for the strip above the timeline: a whole log at a glance, each
    stretch a link to its offset range."""
    width = {s: max(1, -(-(end - start) // buckets)) for s, (start, end) in ends.items()}
    found: dict[tuple[str, int], tuple[int, int]] = {}  # (stream, bucket) -> (count, severity)
    for row in rows:
        if row.stream not in ends:
            continue
        start = ends[row.stream][0]
        key = (row.stream, (row.offset - start) // width[row.stream])
        count, worst = found.get(key, (0, len(SEVERITY) - 1))
        rank = SEVERITY.index(row.outcome) if row.outcome in SEVERITY else len(SEVERITY) - 1
        found[key] = (count + 1, min(worst, rank))
    out: dict[str, list[Bucket]] = {}
    for stream, (start, end) in ends.items():
        w = width[stream]
        out[stream] = [Bucket(start + i * w, min(end, start + (i + 1) * w) - 1, c, SEVERITY[r])
                       for (s, i), (c, r) in sorted(found.items()) if s == stream]
    return out


# ------------------------------------------------------------------------------ workloads page
@dataclass
class WorkloadSummary:
    """One line of the workloads page."""

    workload_id: str
    holder: str | None = None
    epoch: int | None = None
    outstanding: int = 0
    #: effect kind -> outcome -> count
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    last_ms: int | None = None
    records: int = 0
    alarms: int = 0
    passed_over: int = 0


def summarize(workload_id: str, rows: Iterable[Row],
              alarms: Sequence[AlarmRecord] = ()) -> WorkloadSummary:
    """Holder and epoch (the latest claim), requests with no response yet, response outcomes by
    effect kind, the last append time, and the open alarms of one workload."""
    out = WorkloadSummary(workload_id)
    kind_of: dict[str, str] = {}
    asked: set[str] = set()
    answered: set[str] = set()
    outcomes: dict[str, Counter[str]] = {}
    responses: list[Row] = []
    for row in rows:
        out.records += 1
        out.last_ms = row.time_ms if out.last_ms is None else max(out.last_ms, row.time_ms)
        if row.kind == "claim":
            # the holder comes from .claims only, and from a claim every reader accepts
            # (broker_schema.binding: not too far above the highest before it)
            if (row.stream == "claims" and row.outcome != "wrong_stream"
                    and row.epoch is not None
                    and not epoch_refused(row.epoch, out.epoch or 0)
                    and (out.epoch is None or row.epoch >= out.epoch)):
                out.epoch, out.holder = row.epoch, row.who
        elif row.kind == "request" and row.effect_id:
            asked.add(row.effect_id)
            kind_of[row.effect_id] = row.effect_kind or "?"
        elif row.kind == "response" and row.effect_id:
            answered.add(row.effect_id)
            responses.append(row)
        elif row.kind == "merge" and row.outcome == "passed_over":
            out.passed_over += 1
    for row in responses:
        kind = kind_of.get(row.effect_id or "", "(no request on .out)")
        outcomes.setdefault(kind, Counter())[row.outcome] += 1
    out.outstanding = len(asked - answered)
    out.outcomes = {k: dict(sorted(c.items())) for k, c in sorted(outcomes.items())}
    out.alarms = sum(1 for a in alarms if a.workload_id == workload_id)
    return out


def open_alarms(records: Iterable[tuple[int, Any]]) -> list[tuple[int, AlarmRecord]]:
    """The alarms on ``sys.alarms`` (offset, record) that no ``alarm_ack`` acknowledged."""
    alarms: dict[str, tuple[int, AlarmRecord]] = {}
    acked: set[str] = set()
    for offset, rec in records:
        if isinstance(rec, AlarmRecord):
            alarms.setdefault(rec.alarm_id, (offset, rec))
        elif isinstance(rec, AlarmAckRecord):
            acked.add(rec.alarm_id)
    return [v for k, v in alarms.items() if k not in acked]


def effect_rows(rows: Iterable[Row], effect_id: str) -> list[Row]:
    """Every record of one effect (request, accepted, responses, merge entries, outputs)."""
    return [r for r in rows if r.effect_id == effect_id]


# ------------------------------------------------------------------------------ why graph
@dataclass
class Box:
    """A node of the why graph: a record (or a check) with a title, lines and a link."""

    id: str
    title: str
    lines: list[str]
    cls: str
    href: str | None = None
    x: int = 0
    y: int = 0
    w: int = 0
    h: int = 0


@dataclass
class Graph:
    """Boxes and edges laid out for an SVG."""

    boxes: list[Box]
    edges: list[tuple[int, int, int, int]]
    width: int
    height: int
    #: the input records the walk reached (stream offset, bytes sha256)
    inputs: list[dict[str, Any]] = field(default_factory=list)


MAIN_W, SIDE_W, LINE_H, PAD, GAP = 650, 480, 15, 8, 26


def _sig_verdict(sig: Mapping[str, Any]) -> tuple[str, str]:
    if not sig.get("signed"):
        return "unsigned", "warn"
    if sig.get("valid") is True:
        return ("valid (authenticated)" if sig.get("authenticated") else "valid"), "ok"
    if sig.get("valid") is False:
        return "INVALID", "bad"
    return "not checked", "warn"


def walked_inputs(tree: Any) -> list[dict[str, Any]]:
    """The ``input`` nodes a why tree reaches (to mark the redacted ones)."""
    found: list[dict[str, Any]] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "input" and isinstance(value, dict) and "source" in value:
                found.append(value)
            else:
                found.extend(walked_inputs(value))
    elif isinstance(tree, list):
        for value in tree:
            found.extend(walked_inputs(value))
    return found


def why_graph(tree: Mapping[str, Any], link: Any = None) -> Graph:
    """Lay out the tree of :func:`workload_sdk._why.why` as boxes: the chain from the output
    down to the input bytes in the left column, the binding in force (claim, spec, models) and
    the executor with its signature status beside each step and response. ``link(stream,
    offset)`` makes a box's URL (None: no links)."""
    def href(stream: str, offset: int) -> str | None:
        return None if link is None else str(link(stream, offset))

    main: list[Box] = []
    side: list[tuple[int, Box]] = []  # (index of the main box it belongs to, box)
    inputs: list[dict[str, Any]] = []
    o = tree["output"]
    lines = [f"effect {o['effect_id']}"]
    if o.get("effect_kind"):
        lines.append(f"kind {o['effect_kind']} params {short(o.get('params') or {}, 50)}")
    if o.get("body") is not None:
        lines.append(f"body {short(o['body'].get('data'), 56)}")
    main.append(Box("output", f"output .out@{o['offset']} ({o['kind']})", lines, "output",
                    href("out", o["offset"])))

    def step(node: Mapping[str, Any], depth: int) -> None:
        if "truncated" in node:
            main.append(Box(f"trunc{depth}", "…", [str(node["truncated"])], "warn"))
            return
        c, s, m = node["claim"], node["spec"], node["merge"]
        main.append(Box(f"step{depth}", f"step seq {node['seq']}, epoch {node['epoch']}",
                        [f"merge .merge@{m['offset']}: {m['source']}@{m['source_offset']}"],
                        "step", href("merge", m["offset"])))
        named = s.get("model_names") or {}
        models = ", ".join(f"{k}={named[v] + ' ' if v in named else ''}{v[:19]}…"
                           for k, v in sorted(s["models"].items())) or "none"
        side.append((len(main) - 1, Box(
            f"bind{depth}", f"binding: claim .claims@{c['offset']}",
            [f"holder {c['holder_id']}", f"spec .spec@{s['offset']} module "
             f"{s['module_hash'][:19]}…", f"models {models}"]
            + ([f"binding switched at input offset {s['binding_switch_at']}"]
               if s.get("binding_switch_at") is not None else [])
            + ([f"code deployed at step {s['module_switch_at']} ({s['workload_class']})"]
               if s.get("module_switch_at") is not None else []),
            "binding", href("claims", c["offset"]))))
        if "input" in node:
            i = node["input"]
            b = i["body"]
            inputs.append({"offset": i["offset"], "sha256": b.get("bytes_sha256"),
                           "size": b.get("size")})
            lines = [f"source {i['source']}", f"{b.get('size')} bytes {b.get('bytes_sha256')}",
                     f"{b.get('encoding')} {short(b.get('data'), 50)}"]
            if i.get("redacted"):
                lines = [f"REDACTED: {short(i['redacted'], 80)}", *lines]
            main.append(Box(f"input{depth}", f"input .in@{i['offset']}", lines,
                            "input", href("in", i["offset"])))
            return
        r = node["response"]
        verdict, vcls = _sig_verdict(r["signature"])
        main.append(Box(f"resp{depth}", f"response .resp@{r['offset']}: {r['outcome']}",
                        ["model " + " ".join(filter(None, (r.get("model_name"),
                                                           r["model_hash"] or "-"))),
                         f"written by {r['written_by']}",
                         (f"output {short(r['output'].get('data'), 50)}" if r["output"]
                          else f"error {short(r['error'], 50)}" if r["error"] else "no output")],
                        f"resp-{r['outcome']}", href("resp", r["offset"])))
        e = r.get("executor") or {}
        side.append((len(main) - 1, Box(
            f"exec{depth}", f"signature {verdict}",
            [f"executor {e.get('node_id', '-')} {e.get('engine', '')} "
             f"{e.get('engine_version', '')}", f"device {e.get('device_class', '-')}",
             short(str(r["signature"].get("reason") or ""), 60)], vcls)))
        q = r["request"]
        main.append(Box(f"req{depth}", f"request .out@{q['offset']}: {q['effect_kind']}",
                        [f"model {q['model'] or '-'}",
                         f"params {short(q['params'], 50)}",
                         f"deadline {q['deadline_ms']} ms"],
                        "request", href("out", q["offset"])))
        step(q["step"], depth + 1)

    step(tree["step"], 0)
    snap = tree["snapshot_before"]
    main.append(Box("snapshot", f"snapshot before: seq {snap['seq']}",
                    [f"state {snap['state_hash']}" if "merge_offset" in snap
                     else str(snap.get("note", "")), str(tree.get("replay", ""))], "snapshot",
                    href("merge", snap["merge_offset"]) if "merge_offset" in snap else None))
    y = PAD
    edges: list[tuple[int, int, int, int]] = []
    beside = dict(side)
    for n, box in enumerate(main):
        box.x, box.y, box.w = PAD, y, MAIN_W
        box.h = 2 * PAD + LINE_H * (1 + len(box.lines))
        if n:
            prev = main[n - 1]
            edges.append((prev.x + MAIN_W // 2, prev.y + prev.h, box.x + MAIN_W // 2, box.y))
        row_h = box.h
        other = beside.get(n)
        if other is not None:  # beside its main box, the row as tall as the taller of the two
            other.x, other.y, other.w = PAD + MAIN_W + 3 * GAP, y, SIDE_W
            other.h = 2 * PAD + LINE_H * (1 + len(other.lines))
            edges.append((box.x + MAIN_W, box.y + box.h // 2, other.x, other.y + other.h // 2))
            row_h = max(row_h, other.h)
        y += row_h + GAP
    height = max([b.y + b.h for b in main + [b for _, b in side]], default=0) + PAD
    return Graph(main + [b for _, b in side], edges, PAD * 2 + MAIN_W + 3 * GAP + SIDE_W,
                 height, inputs)


# ------------------------------------------------------------------------------ receipts
@dataclass
class ReceiptRow:
    """One integer-engine response with its receipt's place in its node's chain."""

    offset: int
    effect_id: str
    node_id: str
    seq: int | None
    prev_hash: str | None
    model_hash: str | None
    text: str
    has_receipt: bool
    #: the receipt's hash (:func:`fx_integer.receipt.receipt_hash`): two rows with one seq and
    #: one hash are the same receipt twice, with two hashes a fork
    receipt_hash: str | None = None


def receipt_rows(responses: Iterable[tuple[int, ResponseRecord]],
                 engine: str) -> list[ReceiptRow]:
    """Every response that carries a receipt (``receipt.integer``) or was written by the
    integer engine ``engine``, in ``.resp`` order."""
    from fx_integer.receipt import receipt_hash

    out: list[ReceiptRow] = []
    for offset, resp in responses:
        receipt = (resp.receipt or {}).get("integer")
        by = resp.executor.engine if resp.executor is not None else None
        if not isinstance(receipt, dict) and not (resp.outcome == "ok" and by == engine):
            continue
        r: Mapping[str, Any] = receipt if isinstance(receipt, dict) else {}
        text = ""
        if isinstance(resp.output, InlineBody) and isinstance(resp.output.data, dict):
            text = str(resp.output.data.get("text", ""))
        seq = r.get("seq")
        prev = r.get("prev_receipt_hash")
        out.append(ReceiptRow(offset, resp.effect_id, resp.written_by,
                              seq if isinstance(seq, int) else None,
                              prev if isinstance(prev, str) else None, resp.model_hash,
                              text, isinstance(receipt, dict),
                              receipt_hash(receipt) if isinstance(receipt, dict) else None))
    return out


@dataclass
class ChainCell:
    """A position of a node's receipt chain: receipts at ``seq`` (offsets on ``.resp``), or a
    gap of the seqs ``seq`` to ``last`` that this workload does not hold (receipts the node
    signed for other workloads, or lost)."""

    seq: int
    last: int
    offsets: list[int]
    #: the distinct receipt hashes at this seq
    hashes: frozenset[str] = frozenset()

    @property
    def gap(self) -> bool:
        """No receipt of this workload holds these seqs."""
        return not self.offsets

    @property
    def fork(self) -> bool:
        """Two different receipts with one seq."""
        return len(self.hashes) > 1


def chains(rows: Iterable[ReceiptRow]) -> dict[str, list[ChainCell]]:
    """Per node: its receipts by seq from 0 to the highest seen, a gap cell for each run of
    seqs not seen here, and a fork where two different receipts carry one seq (one receipt on
    two responses is not a fork: a copy)."""
    by_node: dict[str, dict[int, list[ReceiptRow]]] = {}
    for row in rows:
        if row.seq is not None:
            by_node.setdefault(row.node_id, {}).setdefault(row.seq, []).append(row)
    out: dict[str, list[ChainCell]] = {}
    for node, seqs in sorted(by_node.items()):
        cells: list[ChainCell] = []
        expect = 0
        for seq in sorted(seqs):
            if seq > expect:
                cells.append(ChainCell(expect, seq - 1, []))
            here = seqs[seq]
            cells.append(ChainCell(seq, seq, sorted(r.offset for r in here),
                                   frozenset(r.receipt_hash or str(r.offset) for r in here)))
            expect = seq + 1
        out[node] = cells
    return out


# ------------------------------------------------------------------------------ executors
@dataclass
class NodeFacts:
    """One executor or gateway as its latest ``sys.facts`` record describes it."""

    node_id: str
    role: str
    kinds: list[str]
    models_present: list[str]
    models_loaded: list[str]
    engines: dict[str, str]
    accelerators: list[str]
    key_id: str
    updated_us: int
    age_s: float | None


def node_facts(facts: Iterable[FactsRecord], now_us: int | None = None) -> list[NodeFacts]:
    """The latest facts of each node (``sys.facts`` is keyed by node id), sorted by node id; a
    node serving a kind with a ``guarantee`` is a gateway. ``age_s``: seconds since its last
    heartbeat (``updated_us``) at ``now_us``."""
    latest: dict[str, FactsRecord] = {}
    for f in facts:
        if f.node_id not in latest or f.updated_us >= latest[f.node_id].updated_us:
            latest[f.node_id] = f
    out = []
    for node, f in sorted(latest.items()):
        gateway = any(k.guarantee is not None for k in f.kinds)
        out.append(NodeFacts(
            node, "gateway" if gateway else "executor",
            [f"{k.kind} (queue {k.queue_limit}{', ' + k.guarantee if k.guarantee else ''})"
             for k in f.kinds],
            list(f.models_present), list(f.models_loaded), dict(f.engines),
            list(f.accelerators), f.key_id, f.updated_us,
            None if now_us is None else round((now_us - f.updated_us) / 1e6, 1)))
    return out


# ------------------------------------------------------------------------- request guards
#: Host names the console answers to by default: the loopback ones (it has no login).
LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


def host_problem(host: str | None, allowed: Sequence[str]) -> str | None:
    """Why a request whose ``Host`` header is ``host`` is refused, or None: its name (the port
    aside) must be one of ``allowed`` (a DNS-rebinding page that reaches the console through a
    name of its own is turned away, issue 30). Pure."""
    if not host:
        return "the request has no Host header"
    name = host.strip().lower()
    if name.startswith("["):
        name = name[:name.find("]") + 1] if "]" in name else name
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    if name in {a.lower() for a in allowed}:
        return None
    return f"Host {host[:100]!r} is not one this console answers to ({', '.join(allowed)})"


def origin_problem(method: str, host: str | None, origin: str | None,
                   fetch_site: str | None) -> str | None:
    """Why a request that changes something (any method but GET, HEAD, OPTIONS) is refused as
    cross-origin, or None: an ``Origin`` header must name this console's own ``Host``, and a
    browser's ``Sec-Fetch-Site`` must not say ``cross-site`` (issue 30: a page elsewhere could
    make the browser POST to verify). Pure."""
    if method.upper() in ("GET", "HEAD", "OPTIONS"):
        return None
    if fetch_site is not None and fetch_site.lower() == "cross-site":
        return "a cross-site request may not change anything here"
    if origin is not None and origin != "null":
        _, _, rest = origin.partition("://")
        if rest.rstrip("/").lower() != (host or "").lower():
            return f"Origin {origin[:100]!r} is not this console ({host!r})"
    elif origin == "null":
        return "a request from an opaque origin may not change anything here"
    return None


def shadow_report(workload_id: str, eval_id: str, offset: int, topic: str,
                  report: Any) -> dict[str, Any]:
    """One shadow report on the executors page, with the commands that show it again (the
    recorded summary, and the full report recomputed with the workload's code)."""
    return {"workload_id": workload_id, "eval_id": eval_id, "offset": offset, "topic": topic,
            "report": report, "show": show_command(workload_id, eval_id),
            "show_full": show_command(workload_id, eval_id, MODULE_PLACEHOLDER)}
