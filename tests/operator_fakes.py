"""A gateway on a temporary SQLite store and a ledger that commits what it is sent."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.config import load_settings
from ledgerq.gateway.service import Gateway
from ledgerq.ledgers.base import Accepted, SubmitResult
from ledgerq.model import Committed
from ledgerq.operator import gateway_app
from ledgerq.store import open_store
from tests.ledger_fakes import ScriptedLedger


class CommittingLedger(ScriptedLedger):
    """Every accepted batch is committed at once (read by the follower)."""

    description = "committing fake"

    async def submit(self, service_id: str, batch_id: str, serialized_batch: bytes) -> SubmitResult:
        result = await super().submit(service_id, batch_id, serialized_batch)
        if isinstance(result, Accepted):
            self.statuses[batch_id] = Committed()
        return result


def batch_list(n: int, name: str) -> tuple[bytes, list[str]]:
    """``n`` ordered intkey batches (set, then incs) as one BatchList, and their ids."""
    signer = Signer.generate()
    batches = [
        make_intkey_batch(signer, [("set" if i == 0 else "inc", name, 0 if i == 0 else 1)])
        for i in range(n)
    ]
    return encode_batch_list(batches), [b.header_signature for b in batches]


@contextlib.asynccontextmanager
async def running_gateway(
    flags: Mapping[str, Any] | None = None,
    ledger: ScriptedLedger | None = None,
    *,
    pipeline: bool = True,
) -> AsyncIterator[tuple[str, Gateway]]:
    """A gateway on 127.0.0.1:0; ``pipeline=False`` serves its HTTP app only."""
    folder = tempfile.TemporaryDirectory(prefix="ledgerq-test-")
    db = f"sqlite:///{folder.name}/gateway.sqlite3"
    settings = load_settings(
        {
            "db": db,
            "bind": "127.0.0.1:0",
            "monitor.poll_interval_s": 0.05,
            **(flags or {}),
        },
        environ={},
        config_file=None,
        cwd=Path(__file__).parent,
    )
    store = await open_store(db)
    gateway = Gateway(settings, store, ledger or CommittingLedger())
    if not pipeline:
        runner = web.AppRunner(gateway_app(gateway))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}", gateway
        finally:
            await runner.cleanup()
            await store.close()
            folder.cleanup()
        return
    task = asyncio.create_task(gateway.run())
    try:
        await asyncio.wait_for(gateway.started.wait(), 10)
        yield f"http://127.0.0.1:{gateway.port}", gateway
    finally:
        gateway.stop()
        await asyncio.wait_for(task, 10)
        await store.close()
        folder.cleanup()
