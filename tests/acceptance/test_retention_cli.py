"""``ledgerq clean --older-than`` through the real CLI on a SQLite store."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from ledgerq.codec import Signer, to_tracking_batch
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.model import Committed
from ledgerq.store import open_store

DAY = 86_400_000
LEDGERQ = str(Path(sys.executable).parent / "ledgerq")


async def _seed(db: str, now: int) -> list[str]:
    signer = Signer.generate()
    batches = [
        to_tracking_batch(make_intkey_batch(signer, [("set", f"r{i}", 1)]), "svc") for i in range(3)
    ]
    async with await open_store(db) as store:
        await store.add_batches(batches, now=now - 40 * DAY)
        # One committed long ago, one committed yesterday, one still queued.
        await store.update_batch_status(batches[0].batch_id, "svc", Committed(), now=now - 31 * DAY)
        await store.update_batch_status(batches[1].batch_id, "svc", Committed(), now=now - DAY)
    return [b.batch_id for b in batches]


async def _left(db: str) -> set[str]:
    async with await open_store(db) as store:
        listed = await store.list_batches(limit=100)
    return {b.batch_id for b in listed.batches}


def _ledgerq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LEDGERQ, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_clean_deletes_only_old_final_batches(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/r.sqlite3"
    ids = asyncio.run(_seed(db, int(time.time() * 1000)))
    bad = _ledgerq("clean", "--db", db, "--older-than", "soon")
    assert bad.returncode == 2 and "30d" in bad.stderr
    done = _ledgerq("clean", "--db", db, "--older-than", "30d")
    assert done.returncode == 0, done.stderr
    assert "deleted 1 final batches" in done.stdout
    assert asyncio.run(_left(db)) == set(ids[1:])
