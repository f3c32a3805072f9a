"""The gateway's HA wiring: claims on PostgreSQL, the single-instance lock on SQLite."""

from __future__ import annotations

import asyncio
import socket
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from ledgerq.claims import ClaimChange
from ledgerq.claims.lock import InstanceLockedError
from ledgerq.clock import ManualClock
from ledgerq.config import load_settings
from ledgerq.gateway.ha import advertised_address, open_high_availability
from ledgerq.gateway.service import Gateway
from ledgerq.ledgers import HttpTimeouts, http_ledger_client
from ledgerq.store import open_store
from tests.integration.claims_helpers import T0, claimants, manager
from tests.store.conftest import make_batch


async def test_sqlite_gateway_takes_the_file_lock(tmp_path: Path) -> None:
    settings = load_settings(
        {"db": f"sqlite:///{tmp_path / 'g.sqlite3'}"}, environ={}, cwd=tmp_path
    )
    async with AsyncExitStack() as first:
        assert await open_high_availability(settings, first) is None
        async with AsyncExitStack() as second:
            with pytest.raises(InstanceLockedError, match="PostgreSQL"):
                await open_high_availability(settings, second)
    async with AsyncExitStack() as again:  # released with the first gateway
        assert await open_high_availability(settings, again) is None


@pytest.mark.pg
async def test_postgres_gateway_claims_before_serving_and_releases_on_exit(
    pg_url: str, tmp_path: Path
) -> None:
    async with await open_store(pg_url) as store:
        from tests.store.conftest import make_batch

        await store.add_batches([make_batch("s1"), make_batch("s2")])
    settings = load_settings(
        {"db": pg_url}, environ={"LEDGERQ_CLAIMS_INSTANCE_ID": "gw"}, cwd=tmp_path
    )
    async with AsyncExitStack() as stack:
        claims = await open_high_availability(settings, stack, address="127.0.0.1:1234")
        assert claims is not None
        assert claims.claimed_services() == {"s1", "s2"}
        assert claimants(pg_url) == {"s1": "gw", "s2": "gw"}
        (me,) = await claims.list_instances()
        assert me.address == "127.0.0.1:1234"
    assert claimants(pg_url) == {"s1": None, "s2": None}


@pytest.mark.pg
async def test_store_sessions_left_idle_in_a_transaction_are_ended_by_the_server(
    pg_url: str,
) -> None:
    # A gateway frozen mid-write (SIGSTOP) must not keep its claim row
    # share-locked past the TTL: the server ends such sessions.
    store = await open_store(pg_url, pg_idle_in_transaction_ms=1_234)
    async with store:
        backend = store._backend  # type: ignore[attr-defined]
        async with backend.transaction(write=False) as session:
            cur = await session.conn.execute(b"SHOW idle_in_transaction_session_timeout")
            row = await cur.fetchone()
    assert row is not None and row[0] == "1234ms"


class HangingLedger:
    """A ledger that reads every POST /batches and never answers it; it sees
    when the client gives up (closes the connection). Status reads get 503."""

    def __init__(self) -> None:
        self.posts = 0
        self.posted = asyncio.Event()
        self.abandoned = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"POST /batches"):
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.posts += 1
                self.posted.set()
                # Never answered: the next read ends only when the client closes.
                while await reader.read(1024):
                    pass
                self.abandoned.set()
            else:
                writer.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.mark.pg
async def test_a_post_ends_when_the_claim_it_was_made_under_lapses(
    pg_url: str, tmp_path: Path
) -> None:
    # The HTTP submit timeout is 300 s; the claim has 1.2 s left (as last
    # renewed) when the POST starts. The POST must be abandoned with the
    # claim, long before anyone else may take the service (its second
    # expiry), and recorded ambiguous (still submitted), so the ledger is
    # asked before anything is resent.
    ledger = HangingLedger()
    url = await ledger.start()
    clock = ManualClock(T0)
    settings = load_settings(
        {"db": pg_url, "ledger": f"sawtooth+{url}", "bind": "127.0.0.1:0"},
        environ={"LEDGERQ_LEDGER_TIMEOUT_SUBMIT_S": "300"},
        cwd=tmp_path,
    )
    batch = make_batch("s")
    async with await open_store(pg_url) as store:
        await store.add_batches([batch], now=T0)
        claims = manager(pg_url, "a", clock)
        client = http_ledger_client(settings.ledger, HttpTimeouts(connect=3, submit=300))
        async with claims:
            await claims.cycle()  # lease until T0 + 5000; the clock stays put from here
            clock.advance(3_800)
            fence = claims.fence_for("s")
            assert fence is not None and claims.claim_left_ms("s", fence) == 1_200
            gateway = Gateway(settings, store, client, claims=claims)
            task = asyncio.create_task(gateway.run())
            try:
                async with asyncio.timeout(120):
                    await ledger.posted.wait()
                    await ledger.abandoned.wait()
                    # Recorded ambiguous: the ledger is asked next.
                    for _ in range(12_000):
                        got = await store.get_batch(batch.batch_id, "s")
                        if got is not None and got.submission_error is not None:
                            break
                        await asyncio.sleep(0.01)
                assert got is not None and got.submitted and got.status_name is None
                assert got.submission_error is not None
                assert got.submission_error.error_type == "ambiguous"
                assert "left on this instance's claim" in got.submission_error.error_message
                assert got.attempts == 1 and ledger.posts == 1
            finally:
                gateway.stop()
                await asyncio.wait_for(task, 60)
                await client.close()
                await ledger.close()


async def test_services_taken_over_idle_are_not_woken_nor_scanned_for(
    pg_url: str, tmp_path: Path
) -> None:
    # A dead instance's thousands of idle services come in take-overs of
    # hundreds: waking each made the queue ask a round over all of them, and
    # the follower scan, per take-over, while the services with work waited.
    settings = load_settings(
        {"db": pg_url, "ledger": "sawtooth+http://127.0.0.1:9", "bind": "127.0.0.1:0"},
        cwd=tmp_path,
    )
    async with await open_store(pg_url) as store:
        claims = manager(pg_url, "a", ManualClock(T0))
        client = http_ledger_client(settings.ledger, HttpTimeouts(connect=3, submit=3))
        async with claims:
            gateway = Gateway(settings, store, client, claims=claims)
            woken: list[str] = []
            scans: list[None] = []
            gateway.wake = lambda service_id, **_kw: woken.append(service_id)  # type: ignore[method-assign]
            gateway.producer.follower.scan_now = lambda services=None: scans.append(None)  # type: ignore[method-assign]
            idle = frozenset({"i1", "i2"})
            gateway._claims_changed(ClaimChange(idle, frozenset(), idle))
            assert woken == [] and scans == []
            gateway._claims_changed(ClaimChange(idle | {"w"}, frozenset(), idle))
            assert woken == ["w"] and len(scans) == 1
            # One whose next batch the take-over handed to the queue itself
            # needs no round: the status readers alone hear of it.
            woken.clear()
            told: list[str] = []
            gateway.changes.notify = told.append  # type: ignore[method-assign]
            change = ClaimChange(frozenset({"r", "w"}), frozenset(), frozenset(), frozenset({"r"}))
            gateway._claims_changed(change)
            assert woken == ["w"] and told == ["r"] and len(scans) == 2
            await client.close()


@pytest.mark.pg
async def test_a_stopped_gateway_ends_its_claim_cycles_and_gives_its_claims_back_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    # SIGTERM: once the submitter drained, the claim thread must end (and the
    # claims go back) at once, not renew them while the gateway waits out
    # its other tasks (5 s), the services held by an instance submitting
    # nothing.
    async with await open_store(pg_url) as store:
        await store.add_batches([make_batch("s1")])
        settings = load_settings(
            {"db": pg_url, "ledger": "sawtooth+http://127.0.0.1:9", "bind": "127.0.0.1:0"},
            environ={"LEDGERQ_CLAIMS_INSTANCE_ID": "gw"},
            cwd=tmp_path,
        )
        async with AsyncExitStack() as stack:
            claims = await open_high_availability(settings, stack)
            assert claims is not None and claims.claimed_services() == {"s1"}
            client = http_ledger_client(settings.ledger, HttpTimeouts(connect=3, submit=3))
            stack.push_async_callback(client.close)
            gateway = Gateway(settings, store, client, claims=claims)
            run = asyncio.create_task(gateway.run(extra=[claims.run()]))
            await asyncio.wait_for(gateway.started.wait(), 10)
            loop = asyncio.get_running_loop()
            began = loop.time()
            gateway.stop()
            await asyncio.wait_for(run, 10)
            assert loop.time() - began < 2
        assert claimants(pg_url) == {"s1": None}


def test_a_wildcard_bind_is_advertised_under_the_machines_name() -> None:
    # /instances lists where each instance's API listens; "0.0.0.0:8080" on
    # every machine of the cluster would not tell them apart.
    name = socket.gethostname()
    assert advertised_address("0.0.0.0", 8080) == f"{name}:8080"
    assert advertised_address("::", 8080) == f"{name}:8080"
    assert advertised_address("10.0.0.7", 8080) == "10.0.0.7:8080"


@pytest.mark.pg
async def test_a_wildcard_bound_instance_registers_its_machines_name(
    pg_url: str, tmp_path: Path
) -> None:
    await (await open_store(pg_url)).close()  # the schema
    settings = load_settings(
        {"db": pg_url, "bind": "0.0.0.0:8080", "insecure_allow_remote": True},
        environ={"LEDGERQ_CLAIMS_INSTANCE_ID": "gw"},
        cwd=tmp_path,
    )
    async with AsyncExitStack() as stack:
        claims = await open_high_availability(settings, stack)
        assert claims is not None
        (me,) = await claims.list_instances()
        assert me.address == f"{socket.gethostname()}:8080"
