"""The outage watch of a PostgreSQL store (``ledgerq.store.outage``), with a
fake ``connect``: an outage is found by connecting, not by a request's
failure; once found, waiting requests are cut to the bound and new ones
refused at once; the first session after it ends it and refreshes the pool."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest

from ledgerq.errors import StoreOutageError
from ledgerq.store.outage import OutageWatch, host_report, hosts_of


class Server:
    """What a fake ``connect`` finds: a primary, nobody, or a standby."""

    def __init__(self) -> None:
        self.state = "primary"
        self.attempts: list[dict[str, Any]] = []

    async def connect(self, url: str, **kwargs: Any) -> Any:
        self.attempts.append(kwargs)
        if self.state == "primary":

            class Conn:
                async def close(self) -> None:
                    pass

            return Conn()
        port = kwargs.get("port", "5432")
        if self.state == "standby" and port == "5433":
            raise psycopg.OperationalError(
                f'connection failed: connection to server at "h2", port {port} failed: '
                "session is read-only"
            )
        raise psycopg.OperationalError(
            f'connection failed: connection to server at "h1", port {port} failed: '
            "Connection refused\n\tIs the server running on that host?"
        )


URL = "postgresql://u:secret@h1:5432,h2:5433/db?target_session_attrs=read-write"


def test_the_hosts_of_a_multi_host_url() -> None:
    assert hosts_of(URL) == [("h1", "5432"), ("h2", "5433")]
    assert hosts_of("postgresql://u@h1,h2:6000/db") == [("h1", "5432"), ("h2", "6000")]
    assert hosts_of("host=h1,h2 port=6000 dbname=db") == [("h1", "6000"), ("h2", "6000")]
    assert hosts_of("postgresql://u@h1/db") == [("h1", "5432")]


async def test_each_host_is_named_with_why_it_gave_no_session() -> None:
    server = Server()
    server.state = "standby"
    report = await host_report(URL, timeout_s=1, connect=server.connect)
    assert report == (
        "h1:5432: Connection refused; h2:5433: session is read-only (a standby, not the primary)"
    )


async def test_an_outage_cuts_waiting_requests_to_the_bound_and_refuses_new_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Server()
    ups: list[None] = []

    async def on_up() -> None:
        ups.append(None)

    watch = OutageWatch(URL, 0.4, on_up=on_up, connect=server.connect)
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    # A busy pool: a request that waits long is answered when a connection comes.
    waiting = asyncio.create_task(watch.bounded(lambda: never))
    await asyncio.sleep(0.3)  # past half the bound: a probe ran and found a primary
    assert not watch.down and not waiting.done()
    never.set_result("a connection")
    assert await waiting == "a connection"

    # No primary: a connection broke under a statement, the watch probes.
    server.state = "standby"
    never = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(watch.bounded(lambda: never))
    await asyncio.sleep(0)
    with caplog.at_level(logging.INFO, logger="ledgerq.store.outage"):
        watch.suspect()
        with pytest.raises(StoreOutageError):
            await asyncio.wait_for(waiting, 30)  # cut to the bound, not left waiting
        assert watch.down
        with pytest.raises(StoreOutageError):
            await watch.bounded(lambda: never)  # refused at once
        server.state = "primary"
        for _ in range(300):
            if not watch.down:
                break
            await asyncio.sleep(0.05)  # the probe's next attempt
    assert not watch.down and ups == [None]
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "PostgreSQL outage: no primary" in m]) == 1
    assert any("h2:5433: session is read-only" in m for m in lines)
    assert any("PostgreSQL outage over" in m for m in lines)
    assert not any("secret" in m for m in lines)  # the URL's password stays out of the log
    await watch.close()
