"""``fx console`` against the real broker, driven by a real headless Chromium.

Two recorded workloads (see conftest): the file-type gate (magika through the real executor, the
gate requests timed out) and a question to the integer engine with a genuine receipt, plus a
tampered copy of its response. The tests click through the pages as an operator would: the
workloads, a timeline (filters, paging, a shared link), the why walk down to the input bytes, a
receipt verified on this machine (and the tampered one failing), executors and gateways, and
the error pages. Each page is screenshotted.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from broker_schema import sha256_hex, topics
from tests.integration.console.conftest import Run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _click(browser: Any, element: Any) -> None:
    """Click a link or button that loads a page, and wait until the new page replaced the old."""
    old = browser.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(browser, 600).until(ec.staleness_of(old))


def _texts(browser: Any, css: str) -> list[str]:
    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, css)]


def test_workloads_page_lists_both_runs(browser: Any, console_url: str, magika_run: Run,
                                        llm_run: Run, shoot: Any) -> None:
    browser.get(console_url + "/")
    rows = {e.get_attribute("data-workload"): e.text
            for e in browser.find_elements(By.CSS_SELECTOR, "tr.workload")}
    assert magika_run.workload_id in rows and llm_run.workload_id in rows
    gate = rows[magika_run.workload_id]
    assert "console-holder" in gate  # the holder of the latest claim
    assert "timeout" in gate and "ok" in gate  # outcomes by kind: magika ok, the gate timed out
    assert "console-llm-holder" in rows[llm_run.workload_id]
    shoot("workloads")


def test_timeline_filters_pages_and_shared_links(browser: Any, console_url: str,
                                                 magika_run: Run, shoot: Any) -> None:
    wid = magika_run.workload_id
    browser.get(f"{console_url}/w/{wid}")
    kinds = set(_texts(browser, "#timeline tr.row td:nth-child(3)"))
    assert {"input", "spec", "claim", "request", "accepted", "response", "merge",
            "output"} <= kinds
    assert browser.find_elements(By.CSS_SELECTOR, "tr.o-timeout")  # timeouts are visible
    # the strip: every stream along its offsets, the timeouts' stretch of .resp marked; a
    # stretch is a link to its offset range
    assert browser.find_elements(By.CSS_SELECTOR, "#strip rect.bucket.o-timeout")
    assert browser.find_elements(By.CSS_SELECTOR, "#strip rect.bucket.o-passed_over")
    shoot("timeline")
    # filter by outcome through the form, as a person would
    browser.find_element(By.CSS_SELECTOR, "input[name=outcome][value=timeout]").click()
    _click(browser, browser.find_element(By.ID, "apply"))
    outcomes = set(_texts(browser, "#timeline tr.row td:nth-child(4)"))
    assert outcomes == {"timeout"}, outcomes
    assert "outcome=timeout" in browser.current_url
    # the same query as an fx log command to copy (tests/integration/workload_sdk/test_log.py
    # runs it: the same rows)
    assert browser.find_element(By.ID, "log-command").text == f"fx log {wid} --outcome timeout"
    # a page of 3 rows, and the next one
    browser.get(f"{console_url}/w/{wid}?size=3&page=0")
    first = _texts(browser, "#timeline tr.row td:nth-child(2)")
    assert len(first) == 3
    _click(browser, browser.find_element(By.CSS_SELECTOR, "a.next"))
    second = _texts(browser, "#timeline tr.row td:nth-child(2)")
    assert second and not set(first) & set(second)
    # an offset range on one stream
    browser.get(f"{console_url}/w/{wid}?stream=in&from=1&to=1")
    assert _texts(browser, "#timeline tr.row td:nth-child(2)") == [".in@1"]
    # a shared link to one record opens the page holding it, the row marked
    browser.get(f"{console_url}/w/{wid}?stream=out&at=0&size=3")
    focus = browser.find_element(By.CSS_SELECTOR, "tr.focus")
    assert focus.get_attribute("id") == "out-0"
    # the record itself, by URL
    browser.get(f"{console_url}/w/{wid}/r/in/0")
    assert browser.find_element(By.ID, "record-name").text == f"{topics.inputs(wid)}@0"
    assert '"kind": "input"' in browser.find_element(By.ID, "record-body").text
    shoot("record")


def test_why_by_clicking_reaches_the_input_bytes(browser: Any, console_url: str,
                                                 magika_run: Run, shoot: Any) -> None:
    wid = magika_run.workload_id
    browser.get(f"{console_url}/w/{wid}?kind=output")
    decisions = [e for e in browser.find_elements(By.CSS_SELECTOR, "#timeline tr.row")
                 if "decision" in e.text]
    assert decisions
    _click(browser, decisions[0].find_element(By.CSS_SELECTOR, "a.why"))
    reached = browser.find_elements(By.CSS_SELECTOR, "#why-inputs li.input-reached")
    assert len(reached) == 1
    shas = {sha256_hex(data): offset for offset, data in magika_run.inputs.items()}
    sha = reached[0].find_element(By.CSS_SELECTOR, "code.sha").text
    assert sha in shas  # the walk ends at the bytes that were uploaded
    # the graph: output, step, response (with the model and a checked signature), request,
    # step, input
    svg = browser.find_element(By.ID, "why-graph")
    assert svg.find_element(By.ID, "box-output")
    assert svg.find_element(By.ID, "box-input1")
    resp = svg.find_element(By.ID, "box-resp0").text
    assert magika_run.extra["model_hash"] in resp
    assert "signature valid" in svg.find_element(By.ID, "box-exec0").text
    assert "holder console-holder" in svg.find_element(By.ID, "box-bind0").text
    shoot("why")
    # a box is a link to its record
    browser.get(browser.find_element(By.CSS_SELECTOR, "#why-inputs a").get_attribute("href"))
    assert browser.find_element(By.ID, "record-name").text == (
        f"{topics.inputs(wid)}@{shas[sha]}")


def test_why_of_an_integer_engine_answer_reaches_the_question(browser: Any, console_url: str,
                                                              llm_run: Run) -> None:
    wid = llm_run.workload_id
    browser.get(f"{console_url}/w/{wid}?kind=output")
    answers = [e for e in browser.find_elements(By.CSS_SELECTOR, "#timeline tr.row")
               if "answer" in e.text]
    assert len(answers) == 1
    _click(browser, answers[0].find_element(By.CSS_SELECTOR, "a.why"))
    (reached,) = browser.find_elements(By.CSS_SELECTOR, "#why-inputs li.input-reached")
    (question,) = llm_run.inputs.values()
    assert reached.find_element(By.CSS_SELECTOR, "code.sha").text == sha256_hex(question)
    svg = browser.find_element(By.ID, "why-graph")
    assert llm_run.extra["model_hash"] in svg.find_element(By.ID, "box-resp0").text
    executor = svg.find_element(By.ID, "box-exec0").text
    assert "signature valid" in executor and "integer" in executor


def test_verify_on_this_machine(browser: Any, console_url: str, llm_run: Run,
                                shoot: Any) -> None:
    wid = llm_run.workload_id
    genuine, tampered = llm_run.extra["genuine"], llm_run.extra["tampered"]
    browser.get(f"{console_url}/w/{wid}/receipts")
    assert browser.find_element(By.ID, f"receipt-{genuine}")
    assert browser.find_elements(By.CSS_SELECTOR, ".chain .cell.here")
    shoot("receipts")
    _click(browser, browser.find_element(By.CSS_SELECTOR,
                                         f"button.verify[data-offset='{genuine}']"))
    result = browser.find_element(By.ID, "verify-result")
    assert "verify-ok" in result.get_attribute("class"), result.text
    assert "CHECKED" in result.text and "FAIL" not in result.text
    assert any("re-execut" in t or "oracle" in t
               for t in _texts(browser, "#verify-result li.check")), result.text
    shoot("verify-ok")
    _click(browser, browser.find_element(By.CSS_SELECTOR,
                                         f"button.verify[data-offset='{tampered}']"))
    result = browser.find_element(By.ID, "verify-result")
    assert "verify-fail" in result.get_attribute("class"), result.text
    reasons = _texts(browser, "#verify-result li.reason")
    assert any("signature does not verify" in r for r in reasons), reasons
    shoot("verify-tampered")


def test_executors_and_gateways(browser: Any, console_url: str, magika_run: Run,
                                llm_run: Run, shoot: Any) -> None:
    browser.get(console_url + "/executors")
    nodes = {e.get_attribute("data-node"): e.text
             for e in browser.find_elements(By.CSS_SELECTOR, "tr.node")}
    magika_node = f"exec-{magika_run.workload_id[-8:]}"
    assert magika_node in nodes, nodes
    assert "inference" in nodes[magika_node] and "executor" in nodes[magika_node]
    assert magika_run.extra["model_hash"][:23] in nodes[magika_node]
    assert f"int-{llm_run.workload_id[-8:]}" in nodes
    gateway = nodes[magika_run.extra["gateway"]]
    assert "gateway" in gateway and "acme:gate/set@1.0.0" in gateway
    assert "at-most-once" in gateway and "pymodbus" in gateway
    shoot("executors")


def test_bad_input_is_a_clear_4xx_never_a_500(browser: Any, console_url: str,
                                              magika_run: Run) -> None:
    wid = magika_run.workload_id
    cases = {
        "/w/no-such-workload": 404,
        "/w/bad.id": 400,
        f"/w/{wid}/r/out/abc": 400,
        f"/w/{wid}/r/out/99999": 404,
        f"/w/{wid}/r/nope/0": 400,
        f"/w/{wid}/why/-1": 400,
        f"/w/{wid}/why/99999": 404,
        f"/w/{wid}?page=999": 400,
        f"/w/{wid}?kind=bogus": 400,
        f"/w/{wid}?from=9&to=1": 400,
        f"/w/{wid}?at=3": 400,
        f"/w/{wid}?size=0": 400,
        f"/w/{wid}?size=x": 400,
        f"/w/{wid}/effect/nothing": 404,
        "/no/such/page": 404,
    }
    for path, want in cases.items():
        code, body = _status(console_url + path)
        assert code == want, (path, code, body[-500:])
        assert 'id="error-message"' in body, path
    browser.get(console_url + "/w/no-such-workload")
    assert browser.find_element(By.ID, "error-title").text == "404 Not found"
    assert "no-such-workload" in browser.find_element(By.ID, "error-message").text
