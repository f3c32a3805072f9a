"""Claim cycles while the database is away: they back off with jitter, each
tries to connect once, and a run of failures is logged once.

The database is a TCP listener on 127.0.0.1 that closes every connection at
once (counting them): every claim step fails to connect, as with no primary.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from ledgerq.claims import ClaimManager, ClaimSettings


class Refusing:
    """Accepts connections and closes each at once; counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def refusing() -> Iterator[Refusing]:
    server = Refusing()
    try:
        yield server
    finally:
        server.close()


def _manager(port: int) -> ClaimManager:
    url = f"postgresql://postgres@127.0.0.1:{port}/x?sslmode=disable&gssencmode=disable"
    settings = ClaimSettings(instance_id="gw-x", renew_interval_ms=200, ttl_ms=1_000)
    return ClaimManager(url, settings)


def test_the_pause_after_failed_cycles_backs_off_with_jitter_whatever_the_expiries() -> None:
    manager = _manager(1)
    manager.rng.seed(7)
    manager.next_expiry = 0  # long past: a failed cycle could not move it forward
    assert manager.pause_ms(now=10_000) == 1  # what the cycles spun on
    pauses = {}
    for failures in (1, 2, 3, 8):
        manager.failed_cycles = failures
        pauses[failures] = [manager.pause_ms(now=10_000) for _ in range(50)]
    assert all(25 <= p <= 50 for p in pauses[1])
    assert all(50 <= p <= 100 for p in pauses[2])
    assert all(100 <= p <= 200 for p in pauses[3] + pauses[8])
    assert len(set(pauses[8])) > 10  # jittered: instances do not retry in step


async def test_claim_cycles_without_a_database_back_off_and_warn_once(
    refusing: Refusing, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager(refusing.port)
    # The next foreign expiry, as the last cycle before the outage read it,
    # is past: the outage outlasted it.
    manager.next_expiry = 0
    with caplog.at_level(logging.DEBUG, logger="ledgerq.claims.manager"):
        run = asyncio.create_task(manager.run())
        await asyncio.sleep(2.0)  # real cycles on the claim thread, against a real socket
        manager.stop()
        await asyncio.wait_for(run, 30)
        attempts = refusing.accepted
    # The pauses are at least 25, 50, then 100 ms (upper halves of a quarter,
    # half and whole 200 ms interval): at most ~22 cycles in 2 s, each trying
    # to connect once (its first step; the others would only fail the same
    # way). Without the backoff, one cycle followed another at once, each
    # trying once per step: hundreds of attempts in 2 s (the expiry in the
    # past made every pause 1 ms).
    assert 3 <= attempts <= 25, attempts
    assert manager.failed_cycles >= attempts - 1
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "claim cycle of gw-x failed" in warnings[0].getMessage()
    assert "back off" in warnings[0].getMessage()
    await manager.close()
