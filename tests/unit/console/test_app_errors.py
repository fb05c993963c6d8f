"""The console's error pages that need no broker: bad input is a 400 before anything is read,
an unknown path a 404, and a broker that does not answer (a real closed port) a 503; never a
500."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from console.app import create_app


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    transport = httpx.ASGITransport(app=create_app(f"127.0.0.1:{port}"),
                                    raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c


@pytest.mark.parametrize(("path", "status", "says"), [
    ("/w/bad.id", 400, "invalid workload id"),
    ("/w/ok/r/nope/0", 400, "not a workload stream"),
    ("/w/ok/r/out/abc", 400, "non-negative integer"),
    ("/w/ok/why/-3", 400, "non-negative integer"),
    ("/w/ok/receipts/x/verify", 405, "Method Not Allowed"),  # a GET of a POST-only path
    ("/no/such/page", 404, "Not Found"),
])
async def test_bad_input_is_a_4xx_page(client: httpx.AsyncClient, path: str, status: int,
                                       says: str) -> None:
    r = await client.get(path)
    assert r.status_code == status, (path, r.status_code, r.text[-300:])
    assert 'id="error-message"' in r.text and says in r.text


async def test_a_broker_that_does_not_answer_is_a_503(client: httpx.AsyncClient) -> None:
    r = await client.get("/")
    assert r.status_code == 503, r.text[-500:]
    assert "did not answer" in r.text


async def test_static_files_and_health(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).text == "ok\n"
    assert "verify-form" in (await client.get("/static/console.js")).text


def test_fx_console_is_a_subcommand() -> None:
    from fx_cli.main import build_parser

    args = build_parser().parse_args(["console", "--bootstrap", "b:1", "--port", "9000"])
    assert (args.bootstrap, args.port, args.host, args.refresh) == ("b:1", 9000, "127.0.0.1", 1.0)
    assert args.func.__module__ == "console.cli"


async def test_other_hosts_and_cross_origin_posts_are_refused(
    client: httpx.AsyncClient,
) -> None:
    """Issue 30: the console answered any Host header and accepted a cross-origin POST to
    verify; it has no /openapi.json either."""
    r = await client.get("/healthz", headers={"Host": "evil.example:8470"})
    assert r.status_code == 400 and "not one this console answers to" in r.text
    assert (await client.get("/healthz", headers={"Host": "localhost:8470"})).status_code == 200
    assert (await client.get("/healthz", headers={"Host": "[::1]:8470"})).status_code == 200
    path = "/w/ok/receipts/resp/0/verify"
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site"}):
        r = await client.post(path, headers=headers)
        assert r.status_code == 403, (headers, r.status_code, r.text)
    same = await client.post(path, headers={"Origin": "http://127.0.0.1",
                                             "Sec-Fetch-Site": "same-origin"})
    assert same.status_code != 403  # past the guard: the app's own answer (no broker: 503)
    assert (await client.get("/openapi.json")).status_code == 404


def test_the_guards_are_pure() -> None:
    from console.views import LOCAL_HOSTS, host_problem, origin_problem

    assert host_problem("127.0.0.1:8470", LOCAL_HOSTS) is None
    assert host_problem("console.internal", (*LOCAL_HOSTS, "console.internal")) is None
    assert host_problem(None, LOCAL_HOSTS) is not None
    assert host_problem("127.0.0.1.evil.example", LOCAL_HOSTS) is not None
    assert origin_problem("GET", "127.0.0.1:1", "http://evil.example", "cross-site") is None
    assert origin_problem("POST", "127.0.0.1:1", "http://127.0.0.1:1", "same-origin") is None
    assert origin_problem("POST", "127.0.0.1:1", None, None) is None  # curl, a form post
    assert origin_problem("POST", "127.0.0.1:1", "http://127.0.0.1:2", None) is not None
