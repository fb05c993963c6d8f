"""The fidelity claim, checked on every run: the integer engine against the float32 reference over
the whole committed prompt set (>= 50 prompts, >= 2,000 teacher-forced positions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fx_integer import artifact, fidelity

pytestmark = pytest.mark.slow


def test_full_fidelity_eval_meets_the_targets(real_path: Path) -> None:
    prompts = fidelity.load_prompts()
    assert len(prompts) >= 50
    report = fidelity.evaluate(artifact.load(real_path), prompts=prompts)
    assert report.positions >= 2000
    worst = [(s.id, s.top1, s.positions) for s in report.worst()]
    assert report.top1_rate >= 0.97, (report.top1_rate, worst)
    assert report.top3 == report.positions, (report.top3_rate, worst)
