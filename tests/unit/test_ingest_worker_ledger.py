"""An ingest worker of ``serve --workers N`` names the ledger the gateway
submits to (through worker 0), so the dashboard's header says the same
whichever worker answers."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from ledgerq.config import load_settings
from ledgerq.gateway.run import _http_client, ingest_ledger
from ledgerq.gateway.workers import WorkerSpec
from ledgerq.ledgers.inprocess import NodeClient


def _ingest_worker(tmp_path: Path) -> WorkerSpec:
    return WorkerSpec(
        values={},
        sources={},
        config_file=None,
        index=1,
        count=2,
        role="ingest",
        restarts=0,
        port=0,
        inbox_fd=-1,
        outbox_fds=[],
        lifeline_fd=-1,
        supervisor_pid=0,
        sockets_dir=str(tmp_path),
    )


@pytest.mark.parametrize(
    "ledger", ["node", "sawtooth+http://127.0.0.1:1", "splinter+http://127.0.0.1:1"]
)
async def test_an_ingest_worker_names_the_gateways_ledger(ledger: str, tmp_path: Path) -> None:
    settings = load_settings({"ledger": ledger, "db": f"sqlite:///{tmp_path}/db.sqlite3"})
    async with AsyncExitStack() as stack:
        got = await ingest_ledger(settings, stack, _ingest_worker(tmp_path))
        if ledger == "node":
            expected = NodeClient.DESCRIPTION
        else:
            client = _http_client(settings)  # what worker 0 submits through
            stack.push_async_callback(client.close)
            expected = client.description
        assert got.description == expected
        assert "worker" not in got.description
