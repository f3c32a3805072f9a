"""Submitter: one batch's POSTs to an outcome — retries, backoff, the claim's lease."""

from __future__ import annotations

import asyncio

import pytest

from ledgerq.backoff import no_jitter
from ledgerq.errors import ConfigError
from ledgerq.ledgers.base import (
    Abandoned,
    Accepted,
    Ambiguous,
    Busy,
    Rejected,
    SubmitResult,
    Unjudged,
    Unreachable,
)
from ledgerq.submit.submitter import Submitter, SubmitterSettings
from tests.factories import tracking_batch as batch
from tests.ledger_fakes import ScriptedLedger


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def make(ledger: ScriptedLedger, **settings: int) -> tuple[Submitter, Sleeps]:
    sleeps = Sleeps()
    submitter = Submitter(ledger, SubmitterSettings(**settings), sleep=sleeps, jitter=no_jitter)
    return submitter, sleeps


class Lease:
    """A claim that allows ``posts`` more attempts, with ``left`` ms on it."""

    def __init__(self, posts: int, left: int = 60_000) -> None:
        self.posts = posts
        self.left = left
        self.asked = 0

    def may_post(self) -> bool:
        self.asked += 1
        return self.asked <= self.posts

    def left_ms(self) -> int:
        return self.left


@pytest.mark.parametrize(
    ("answers", "result", "posts"),
    [
        ([Accepted()], Accepted(), 1),
        ([Rejected(400, "bad signature")], Rejected(400, "bad signature"), 1),
        ([Ambiguous("timeout")], Ambiguous("timeout"), 1),
        ([Busy(503)] * 9, Busy(503), 3),
        ([Unreachable("refused")] * 9, Unreachable("refused"), 3),
        ([Busy(503), Accepted()], Accepted(), 2),
    ],
)
async def test_each_answer_ends_or_is_retried(
    answers: list[SubmitResult], result: SubmitResult, posts: int
) -> None:
    b = batch("a", 1)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: list(answers)}
    submitter, _ = make(ledger, max_retries=2)
    outcome = await submitter.post(b)
    assert outcome.result == result
    assert outcome.attempts == posts
    # An ambiguous or judged batch is never resent here.
    assert ledger.sent == [b.batch_id] * posts


async def test_backoff_doubles_between_retries() -> None:
    b = batch("a", 1)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Busy(503)] * 10}
    submitter, sleeps = make(ledger, max_retries=3, backoff_initial_ms=10)
    await submitter.post(b)
    assert sleeps.calls == [0.01, 0.02, 0.04]


async def test_retry_after_is_honoured_and_capped() -> None:
    b = batch("a", 1)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Busy(429, retry_after_ms=700), Busy(429, retry_after_ms=9000)]}
    submitter, sleeps = make(ledger, backoff_initial_ms=5, backoff_max_ms=1000)
    outcome = await submitter.post(b)
    assert sleeps.calls == [0.7, 1.0]
    assert outcome.result == Accepted()


async def test_an_unjudged_refusal_is_retried_and_shown_as_a_problem() -> None:
    """A 404 (a mistyped URL), a 401 or a proxy's 413 says nothing of the batch."""
    b = batch("a", 1)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Unjudged(404, "http://h/batches answered 404: Not Found")] * 9}
    submitter, sleeps = make(ledger, max_retries=3, backoff_initial_ms=10)
    outcome = await submitter.post(b)
    assert isinstance(outcome.result, Unjudged) and outcome.attempts == 4
    assert sleeps.calls == [0.01, 0.02, 0.04]
    problem = submitter.health.for_service("a")
    assert problem is not None and problem.cause == "HTTP 404" and problem.count == 4


async def test_backoff_is_jittered_between_half_and_all_of_its_nominal_delay() -> None:
    sleeps = Sleeps()
    ledger = ScriptedLedger()
    submitter = Submitter(
        ledger, SubmitterSettings(max_retries=1, backoff_initial_ms=100), sleep=sleeps
    )
    for s in "abcdefgh":
        b = batch(s, 1)
        ledger.script[b.batch_id] = [Busy(503)] * 2
        await submitter.post(b)
    assert all(0.05 <= d <= 0.1 for d in sleeps.calls) and len(set(sleeps.calls)) > 1


async def test_after_stop_a_retryable_answer_ends_the_submission() -> None:
    b = batch("a", 1)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Busy(503)] * 9}
    submitter, sleeps = make(ledger, max_retries=5)
    submitter.stop()
    outcome = await submitter.post(b)
    assert outcome == type(outcome)(Busy(503), 1)
    assert sleeps.calls == []


async def test_the_lease_is_asked_before_every_attempt_not_only_the_first() -> None:
    b = batch("s", 1)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Busy(503)] * 10}
    submitter, _ = make(ledger, max_retries=5)
    lease = Lease(posts=2)  # the claim lapses after the second attempt
    outcome = await submitter.post(b, lease)
    assert lease.asked == 3
    assert ledger.sent == [b.batch_id] * 2  # not the 6 the retry budget allows
    # An earlier attempt may have reached the ledger: ambiguous, to be asked.
    assert isinstance(outcome.result, Ambiguous)
    assert "claim on the service is about to lapse" in outcome.result.message


async def test_no_post_at_all_when_the_claim_lapses_before_the_first_attempt() -> None:
    b = batch("s", 1)
    ledger = ScriptedLedger()
    submitter, _ = make(ledger)
    outcome = await submitter.post(b, Lease(posts=0))
    assert ledger.sent == []
    assert isinstance(outcome.result, Ambiguous) and outcome.attempts == 0


async def test_a_post_lasts_no_longer_than_its_claim_and_is_then_no_ledger_problem() -> None:
    # Under HA a POST still without an answer when its claim lapses (a paused
    # instance) is ended by the gateway: ambiguous, so the ledger is asked
    # first, but the ledger did nothing wrong.
    b = batch("paused", 1)
    ledger = ScriptedLedger()
    ledger.gate = asyncio.Event()  # the ledger never answers
    submitter, _ = make(ledger)
    outcome = await submitter.post(b, Lease(posts=1, left=20))
    assert isinstance(outcome.result, Abandoned)
    assert "20 ms left" in outcome.result.message
    assert submitter.abandoned == 1
    assert submitter.health.for_service("paused") is None
    lapsed = await submitter.post(batch("paused", 2), Lease(posts=1, left=0))
    assert isinstance(lapsed.result, Abandoned) and len(ledger.sent) == 1


async def test_an_ambiguous_answer_is_a_ledger_problem() -> None:
    b = batch("slow", 1)
    ledger = ScriptedLedger()
    ledger.script = {b.batch_id: [Ambiguous("no answer within the submit timeout")]}
    submitter, _ = make(ledger)
    await submitter.post(b)
    problem = submitter.health.for_service("slow")
    assert problem is not None and problem.cause == "ambiguous"
    assert submitter.health.snapshot()["problems_total"]["submit"] == 1


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"submitter\.backoff_max_ms \(5\)"):
        SubmitterSettings(backoff_initial_ms=10, backoff_max_ms=5)
