"""A missing tool skips a deployment test locally and fails it in CI (CI=true)."""

from __future__ import annotations

import pytest

from tests.unit.deploy.helpers import need_tool

MISSING = "fx-deploy-no-such-tool"


def test_missing_tool_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=f"CI=true and {MISSING} is not installed"):
        need_tool(MISSING, "nowhere")


def test_missing_tool_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{MISSING} is not installed"):
        need_tool(MISSING, "nowhere")


def test_present_tool_is_found() -> None:
    assert need_tool("sh", "always there").endswith("/sh")
