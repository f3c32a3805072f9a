"""What a PostgreSQL write transaction sends: its statements batched into few
messages (docs/store.md, "Batched transactions").

A group write is two round trips: ``BEGIN``, the locks (heads, batch rows,
claims, in that order) in one message; the writes with ``COMMIT`` in the
other. The statements are prepared once per connection (SQL ``PREPARE``) and
stay usable after psycopg deallocates a connection's statements, which it does
on every rollback.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from ledgerq.errors import BatchNotFoundError
from ledgerq.model import BatchStatusName, Committed, Fence, Pending
from ledgerq.store import BatchWrite, open_store
from tests.store.conftest import make_batch

pytestmark = pytest.mark.pg


class Sent:
    """The statements of every query a psycopg cursor sent (one round trip each)."""

    def __init__(self) -> None:
        self.messages: list[str] = []


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    record = Sent()
    execute = psycopg.AsyncCursor.execute

    async def recording(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else str(query)
        record.messages.append(text)
        return await execute(self, query, params, **kwargs)

    # AsyncClientCursor, which sends the batched messages, is an AsyncCursor.
    monkeypatch.setattr(psycopg.AsyncCursor, "execute", recording)
    return record


def _statements(message: str) -> list[str]:
    """Each statement of a message as its first two words, up to a parenthesis."""
    return [" ".join(part.split()[:2]).split("(")[0] for part in message.split("\n;\n")]


async def _claim(url: str, services: list[str]) -> Fence:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE service_id_claims SET claimant = 'a', epoch = 1, expiry_1 = 9e15,"
            " expiry_2 = 9e15, claimed_at = 1, unclaimed_since = NULL"
            " WHERE service_id = ANY(%s)",
            (services,),
        )
    return Fence("a", 1)


async def test_a_fenced_group_write_is_two_messages(pg_url: str, sent: Sent) -> None:
    async with await open_store(pg_url) as store:
        batches = await store.add_batches([make_batch(s) for s in ("s1", "s2", "s3")])
        fence = await _claim(pg_url, ["s1", "s2", "s3"])
        for status in (None, Pending(), Committed()):
            sent.messages.clear()
            results = await store.apply_writes(
                [
                    BatchWrite(
                        b.service_id, b.batch_id, status, attempt=status is None, fence=fence
                    )
                    for b in batches
                ]
            )
            assert results == [None, None, None]
            first, second = sent.messages
            locks = _statements(first)
            assert locks[0] == "BEGIN"
            executed = [s for s in locks if s.startswith("EXECUTE")]
            if isinstance(status, Committed):
                # heads, then the batch rows, then the claims: the lock order.
                assert executed == [
                    "EXECUTE lq_lock_finishing_heads",
                    "EXECUTE lq_lock_group_rows",
                    "EXECUTE lq_lock_claims",
                ], locks
            elif status is None:
                # An attempt takes: refused for a paused or halted service.
                assert executed == [
                    "EXECUTE lq_batch_states",
                    "EXECUTE lq_lock_claims",
                    "EXECUTE lq_stopped_of",
                ], locks
            else:
                assert executed == ["EXECUTE lq_batch_states", "EXECUTE lq_lock_claims"], locks
            writes = _statements(second)
            assert writes[-1] == "COMMIT", writes
            assert all(s.startswith(("EXECUTE", "PREPARE")) for s in writes[:-1]), writes
        for b in batches:
            got = await store.get_batch(b.batch_id, b.service_id)
            assert got is not None and got.status_name is BatchStatusName.COMMITTED


async def test_a_final_status_with_the_next_batch_taken_is_still_two_messages(
    pg_url: str, sent: Sent
) -> None:
    # The commit → next POST merge costs no round trip: the take is checked
    # with the group's locks and written with its other writes.
    async with await open_store(pg_url) as store:
        services = ("s1", "s2")
        pairs = [await store.add_batches([make_batch(s), make_batch(s)]) for s in services]
        fence = await _claim(pg_url, list(services))
        for first, _ in pairs:
            await store.apply_writes(
                [BatchWrite(first.service_id, first.batch_id, attempt=True, fence=fence)]
            )
            await store.apply_writes(
                [BatchWrite(first.service_id, first.batch_id, Pending(), fence=fence)]
            )
        sent.messages.clear()
        writes = []
        for first, second in pairs:
            writes += [
                BatchWrite(first.service_id, first.batch_id, Committed(), fence=fence),
                BatchWrite(
                    first.service_id,
                    second.batch_id,
                    attempt=True,
                    fence=fence,
                    after=first.batch_id,
                ),
            ]
        assert await store.apply_writes(writes) == [None] * 4
        first_message, second_message = sent.messages
        executed = [s for s in _statements(first_message) if s.startswith("EXECUTE")]
        assert executed == [
            "EXECUTE lq_lock_finishing_heads",
            "EXECUTE lq_lock_group_rows",
            "EXECUTE lq_lock_claims",
            "EXECUTE lq_stopped_of",
            "EXECUTE lq_next_open_checks",
        ], executed
        assert _statements(second_message)[-1] == "COMMIT"
        for _, second in pairs:
            got = await store.get_batch(second.batch_id, second.service_id)
            assert got is not None and got.submitted and got.attempts == 1


async def test_prepared_statements_survive_psycopg_deallocating_them(pg_url: str) -> None:
    # One connection: every transaction below uses the same one.
    async with await open_store(pg_url, pg_pool_max_size=1) as store:
        batches = await store.add_batches([make_batch("s") for _ in range(8)])
        fence = await _claim(pg_url, ["s"])
        for b in batches[:4]:
            # Repeated reads: psycopg prepares its own statements too.
            await store.get_batch(b.batch_id, "s")
            await store.apply_writes([BatchWrite("s", b.batch_id, attempt=True, fence=fence)])
        # A refused single call rolls its transaction back: psycopg then
        # deallocates every statement of the connection, ledgerq's included.
        with pytest.raises(BatchNotFoundError):
            await store.update_batch_status("no-such-batch", "s", Pending())
        for b in batches[4:]:
            results = await store.apply_writes(
                [BatchWrite("s", b.batch_id, attempt=True, fence=fence)]
            )
            assert results == [None]
        assert len(await store.add_batches([make_batch("s")])) == 1
