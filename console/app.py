"""The console's web application: FastAPI routes rendering Jinja2 templates (read-only).

URLs name what they show, so they can be shared:

* ``/`` the workloads; ``/executors`` executors, gateways, shadow reports and alarms;
* ``/w/<id>`` a workload's timeline (``?kind=``, ``?outcome=``, ``?stream=``, ``?from=``,
  ``?to=``, ``?page=``; ``?stream=S&at=N`` opens the page holding record ``S@N``);
* ``/w/<id>/r/<stream>/<offset>`` one record; ``/w/<id>/effect/<effect id>`` one effect;
* ``/w/<id>/why/<out offset>`` the ``why`` walk from an output, as a graph;
* ``/w/<id>/receipts`` integer-engine receipts and chains; ``POST
  /w/<id>/receipts/<offset>/verify`` re-executes one on this machine's CPU.

Bad input is a 400 page, what is not there a 404 page; neither is ever a 500. A broker that
does not answer is a 503 page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker_schema import ChunkRef, DecodeError, FactsRecord, ResponseRecord, decode, topics
from broker_schema.key_history import node_keys
from console import views
from console.store import Cluster
from console.views import BadInput, NotFound
from fx_kafka.workload_log import LogGap
from workload_sdk import why

HERE = Path(__file__).resolve().parent


def _ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def make_templates(bootstrap: str) -> Jinja2Templates:
    """The console's Jinja2 templates (``console/templates``), with the helpers they use."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["fmt_ms"] = _ms
    templates.env.globals["bootstrap"] = bootstrap
    return templates


def create_app(bootstrap: str, *, store: Path | None = None, artifact: Path | None = None,
               refresh_s: float = 1.0, allowed_hosts: Sequence[str] = ()) -> FastAPI:
    """The console for the cluster at ``bootstrap``. ``store``/``artifact``: where the verify
    action finds the committed integer artifacts (as ``fx verify --store/--artifact``; the
    engine's cache is always tried). ``allowed_hosts``: host names it answers to besides the
    loopback ones (:data:`views.LOCAL_HOSTS`); any other ``Host`` header is a 400, and a
    cross-origin request that would change something a 403 (:func:`views.origin_problem`)."""
    app = FastAPI(title="fx console", docs_url=None, redoc_url=None, openapi_url=None)
    hosts = (*views.LOCAL_HOSTS, *allowed_hosts)

    @app.middleware("http")
    async def _guard(request: Request, call_next: Any) -> Response:
        headers = request.headers
        problem = views.host_problem(headers.get("host"), hosts)
        status = 400
        if problem is None:
            problem = views.origin_problem(request.method, headers.get("host"),
                                           headers.get("origin"), headers.get("sec-fetch-site"))
            status = 403
        if problem is not None:
            return PlainTextResponse(problem + "\n", status_code=status)
        response: Response = await call_next(request)
        return response

    cluster = Cluster(bootstrap, refresh_s=refresh_s)
    app.state.cluster = cluster
    templates = make_templates(bootstrap)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    verify_lock = asyncio.Lock()

    def page(request: Request, name: str, code: int = 200, **ctx: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, name, ctx, status_code=code)

    def error(request: Request, status: int, message: str) -> HTMLResponse:
        title = {400: "Bad request", 404: "Not found", 405: "Method not allowed",
                 503: "Broker unavailable"}.get(status, "Error")
        return page(request, "error.html", status, title=title, status=status, message=message)

    @app.exception_handler(BadInput)
    async def _bad(request: Request, exc: BadInput) -> HTMLResponse:
        return error(request, 400, str(exc))

    @app.exception_handler(NotFound)
    async def _missing(request: Request, exc: NotFound) -> HTMLResponse:
        return error(request, 404, str(exc.args[0]) if exc.args else "not found")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> HTMLResponse:
        problems = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"
                             for e in exc.errors())
        return error(request, 400, problems)

    @app.exception_handler(KafkaError)
    @app.exception_handler(TimeoutError)
    @app.exception_handler(ConnectionError)
    async def _broker(request: Request, exc: Exception) -> HTMLResponse:
        return error(request, 503, f"the broker at {bootstrap} did not answer: "
                     f"{type(exc).__name__}: {exc}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        return error(request, exc.status_code, str(exc.detail))

    async def workload(wid_text: str) -> Any:
        wid = views.parse_workload_id(wid_text)
        if not await cluster.exists(wid):
            raise NotFound(f"no workload {wid!r} on {bootstrap} (no topic {topics.prefix(wid)}*)")
        return await cluster.workload(wid)

    async def alarms() -> list[tuple[int, Any]]:
        return views.open_alarms((await cluster.system(topics.ALARMS)).records)

    # ------------------------------------------------------------------ pages
    @app.get("/", response_class=HTMLResponse)
    async def index(request: Request) -> HTMLResponse:
        open_ = [a for _, a in await alarms()]
        rows = []
        for wid in await cluster.workload_ids():
            cached = await cluster.workload(wid)
            rows.append(views.summarize(wid, cached.rows, open_))
        return page(request, "workloads.html", workloads=rows, alarms=len(open_))

    @app.get("/w/{wid}", response_class=HTMLResponse)
    async def timeline(request: Request, wid: str) -> HTMLResponse:
        cached = await workload(wid)
        q = request.query_params
        flt = views.parse_filter(q.getlist("kind"), q.getlist("outcome"), q.get("stream"),
                                 q.get("from"), q.get("to"))
        size = views.parse_offset(q.get("size"), "size")
        size = views.PAGE_SIZE if size is None else size
        at_offset = views.parse_offset(q.get("at"), "at")
        at = None
        if at_offset is not None:
            if not q.get("stream"):
                raise BadInput("?at= names an offset on a stream: give ?stream= too")
            at = (views.parse_stream(q["stream"]), at_offset)
        pg = views.page_of(cached.rows, flt, page=views.parse_offset(q.get("page"), "page"),
                           size=size, at=at)
        base = [(k, v) for k, v in q.multi_items() if k not in ("page", "at")]
        ends = {s: (cached.log[s].start, cached.log[s].end) for s in views.STREAM_ORDER}
        return page(request, "timeline.html", wid=cached.log.workload_id, page=pg, flt=flt,
                    kinds=views.KINDS, outcomes=views.OUTCOMES, streams=views.STREAM_ORDER,
                    base=base, ends=ends, strip=views.offset_strip(cached.rows, ends),
                    log_cmd=views.log_query(cached.log.workload_id, flt))

    @app.get("/w/{wid}/r/{stream}/{offset}", response_class=HTMLResponse)
    async def record(request: Request, wid: str, stream: str, offset: str) -> HTMLResponse:
        stream = views.parse_stream(stream)
        off = views.parse_offset(offset)
        cached = await workload(wid)
        view = cached.log[stream]
        assert off is not None
        rec = view.records.get(off)
        if rec is None:
            where = ("trimmed: the log starts at " + str(view.start)) if off < view.start else (
                f"not on {view.topic} (read up to {view.end})")
            raise NotFound(f"{view.topic} offset {off} is {where}")
        row = views.row_of(stream, rec.offset, rec.time_ms, rec.value)
        try:
            body = json.dumps(json.loads(rec.value), indent=2, sort_keys=True)
        except ValueError:
            body = rec.value.decode("utf-8", "replace")
        return page(request, "record.html", wid=cached.log.workload_id, row=row, body=body,
                    topic=view.topic, size=len(rec.value))

    @app.get("/w/{wid}/effect/{effect_id:path}", response_class=HTMLResponse)
    async def effect(request: Request, wid: str, effect_id: str) -> HTMLResponse:
        cached = await workload(wid)
        rows = views.effect_rows(cached.rows, effect_id)
        if not rows:
            raise NotFound(f"no record of effect {effect_id[:200]!r} on workload {wid}")
        return page(request, "effect.html", wid=cached.log.workload_id, effect_id=effect_id,
                    rows=rows)

    @app.get("/w/{wid}/why/{offset}", response_class=HTMLResponse)
    async def why_page(request: Request, wid: str, offset: str) -> HTMLResponse:
        off = views.parse_offset(offset)
        cached = await workload(wid)
        if off not in cached.log["out"].records:
            raise NotFound(f"no record at {cached.log['out'].topic} offset {off}")
        try:
            tree = why(cached.log, out_offset=off)
        except LogGap as exc:
            return page(request, "why.html", wid=cached.log.workload_id, offset=off,
                        tree=None, graph=None, gap=str(exc))
        wl = cached.log.workload_id
        for node in views.walked_inputs(tree):  # a redacted input is said on the page
            if node["body"].get("type") == "chunk":
                why_not = await cluster.chunk_redacted(wl, ChunkRef.model_validate(node["body"]))
                if why_not is not None:
                    node["redacted"] = why_not

        def link(stream: str, o: int) -> str:
            return f"/w/{wl}/r/{stream}/{o}"

        graph = views.why_graph(tree, link)
        return page(request, "why.html", wid=wl, offset=off, tree=tree, graph=graph, gap=None,
                    tree_json=json.dumps(tree, indent=2, sort_keys=True))

    def _responses(cached: Any) -> list[tuple[int, ResponseRecord]]:
        out = []
        view = cached.log["resp"]
        for rec in view:
            try:
                r = decode(rec.value)
            except DecodeError:
                continue
            if isinstance(r, ResponseRecord):
                out.append((rec.offset, r))
        return out

    @app.get("/w/{wid}/receipts", response_class=HTMLResponse)
    async def receipts(request: Request, wid: str) -> HTMLResponse:
        from executor.engines.integer import ENGINE
        from fx_integer import ledger as fl

        cached = await workload(wid)
        rows = views.receipt_rows(_responses(cached), ENGINE)
        ledgers: dict[str, dict[str, Any]] = {}
        for node in sorted({r.node_id for r in rows}):
            values = await cluster.ledger(node)
            if values is None:
                ledgers[node] = {"present": False}
                continue
            keys = node_keys(node, cached.log.facts, None)  # the one key rule (key_history)
            result = fl.audit(values, node, keys)
            ledgers[node] = {"present": True, "leaves": len(result.tree),
                             "checkpoints": len(result.checkpoints), "pending": result.pending,
                             "problems": result.problems, "topic": topics.ledger(node)}
        return page(request, "receipts.html", wid=cached.log.workload_id, rows=rows,
                    chains=views.chains(rows), ledgers=ledgers, result=None)

    @app.post("/w/{wid}/receipts/{offset}/verify", response_class=HTMLResponse)
    async def verify(request: Request, wid: str, offset: str) -> HTMLResponse:
        from executor.engines.integer import ENGINE
        from executor.verify_workload import ReceiptLog, artifact_resolver, verify_records

        off = views.parse_offset(offset)
        cached = await workload(wid)
        responses = _responses(cached)
        chosen = [(o, r) for o, r in responses if o == off]
        if not chosen:
            raise NotFound(f"no response at {cached.log['resp'].topic} offset {off}")
        vlog = dataclasses.replace(ReceiptLog.of(cached.log), responses=chosen, undecodable=0)
        resolve = artifact_resolver(artifact=artifact, store=store)
        t0 = time.monotonic()
        async with verify_lock:  # one re-execution at a time on this machine
            result = await asyncio.to_thread(verify_records, vlog, resolve=resolve)
        rows = views.receipt_rows(responses, ENGINE)
        return page(request, "receipts.html", wid=cached.log.workload_id, rows=rows,
                    chains=views.chains(rows), ledgers={}, result=result,
                    result_offset=off, seconds=round(time.monotonic() - t0, 1))

    @app.get("/executors", response_class=HTMLResponse)
    async def executors(request: Request) -> HTMLResponse:
        facts = [r for _, r in (await cluster.system(topics.FACTS)).records
                 if isinstance(r, FactsRecord)]
        nodes = views.node_facts(facts, int(time.time() * 1e6))
        reports = []
        for wid, eval_id, name in await cluster.shadow_topics():
            for off, rec in (await cluster.system(name)).records:
                if rec is not None and rec.kind == "shadow_report":
                    reports.append(views.shadow_report(wid, eval_id, off, name, rec))
        return page(request, "executors.html", nodes=nodes, reports=reports,
                    alarms=await alarms())

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    return app
