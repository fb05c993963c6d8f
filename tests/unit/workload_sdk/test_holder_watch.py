"""The holder's role as seen from outside (``/readyz``): pure rules of
:mod:`workload_sdk._holder_watch`."""

from __future__ import annotations

from workload_sdk._holder_watch import CONFIRM_TTL_S, ClaimView, broker_answers, holder_role

TTL = CONFIRM_TTL_S


def _role(*, merging: bool = True, claimed_at: float | None = 0.0, view: ClaimView,
          now: float, epoch: int = 2, holder: str = "b") -> str:
    return holder_role(merging=merging, claimed_at=claimed_at, epoch=epoch, holder_id=holder,
                       view=view, now=now)


def test_a_confirmed_claim_that_is_old_enough_leads() -> None:
    view = ClaimView(confirmed_at=TTL + 1.0, top=(2, "b"))
    assert _role(view=view, now=TTL + 1.5) == "leader"
    assert broker_answers(view, TTL + 1.5)


def test_a_new_claim_is_a_candidate_for_the_ttl_even_when_confirmed() -> None:
    view = ClaimView(confirmed_at=0.5, top=(2, "b"))
    assert _role(view=view, now=1.0) == "candidate"
    assert _role(view=ClaimView(confirmed_at=TTL, top=(2, "b")), now=TTL) == "leader"


def test_no_leader_without_merging_a_claim_or_a_fresh_confirmation() -> None:
    view = ClaimView(confirmed_at=10.0, top=(2, "b"))
    assert _role(merging=False, view=view, now=10.5) == "candidate"
    assert _role(claimed_at=None, view=view, now=10.5) == "candidate"
    # the broker stopped answering: the last confirmation expires
    assert _role(view=view, now=10.0 + TTL) == "candidate"
    assert not broker_answers(view, 10.0 + TTL) and not broker_answers(ClaimView(), 1.0)
    # a newer claim by another holder, or none seen
    assert _role(view=ClaimView(confirmed_at=10.0, top=(3, "c")), now=10.5) == "candidate"
    assert _role(view=ClaimView(confirmed_at=10.0, top=None), now=10.5) == "candidate"


def test_two_holders_never_lead_at_once() -> None:
    """Holder a (epoch 1) confirms every second; b claims epoch 2 at t=20.3 and confirms every
    second from then. Each read shows the claims written before it started. At every instant
    at most one says leader, and b leads in the end."""
    claims = [(0.0, (1, "a")), (20.3, (2, "b"))]

    def top_at(t: float) -> tuple[int, str]:
        return max(c for at, c in claims if at <= t)

    a_reads = [float(t) for t in range(1, 40)]
    b_reads = [20.3 + 0.25 + k for k in range(20)]

    def view_at(reads: list[float], now: float) -> ClaimView:
        done = [r for r in reads if r + 0.1 <= now]  # a read answers 0.1 s after it starts
        return ClaimView() if not done else ClaimView(confirmed_at=done[-1], top=top_at(done[-1]))

    leaders_seen = set()
    for step in range(0, 4000):
        now = step / 100
        roles = {
            "a": holder_role(merging=True, claimed_at=0.0, epoch=1, holder_id="a",
                             view=view_at(a_reads, now), now=now),
            "b": holder_role(merging=now >= 20.5, claimed_at=20.3, epoch=2, holder_id="b",
                             view=view_at(b_reads, now), now=now),
        }
        leading = [h for h, r in roles.items() if r == "leader"]
        assert len(leading) <= 1, (now, roles)
        leaders_seen.update(leading)
    assert leaders_seen == {"a", "b"}
