"""The procrastinate side of ``bench compare``: what a user would write instead of ledgerq.

One job per batch, deferred with ``lock=<service id>`` so the jobs of a service
run one at a time in the order they were deferred (procrastinate refuses to
start a job while another with its lock is ``doing`` or an earlier one is
``todo``). ``queueing_lock`` is not used: it allows only one waiting job per
key, and the workload queues many. The job POSTs the batch to the node and
long-polls ``/batch_statuses?wait=`` until the node reports a final status;
429/503 are retried with backoff inside the job, as a careful user would.

Run as ``python -m bench._procrastinate_worker --pg URL --node URL -c N``; it
prints ``procrastinate worker ready`` on stderr once its worker is registered.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import aiohttp
import procrastinate

_session: aiohttp.ClientSession | None = None


def make_app(pg_url: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=pg_url))

    @app.task(name="submit_batch")
    async def submit_batch(batch_list: str, batch_id: str) -> str:
        return await _submit(os.environ["COMPARE_NODE_URL"], bytes.fromhex(batch_list), batch_id)

    return app


async def _client() -> aiohttp.ClientSession:
    global _session
    if _session is None:
        _session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=60),
            connector=aiohttp.TCPConnector(limit=0),
        )
    return _session


async def _submit(node: str, body: bytes, batch_id: str) -> str:
    session = await _client()
    backoff = 0.01
    while True:
        async with session.post(
            f"{node}/batches", data=body, headers={"Content-Type": "application/octet-stream"}
        ) as resp:
            if resp.status in (429, 503):
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            if resp.status != 202:
                raise RuntimeError(f"node refused {batch_id}: {resp.status} {await resp.text()}")
        while True:
            async with session.get(
                f"{node}/batch_statuses", params={"id": batch_id, "wait": "10"}
            ) as resp:
                data = (await resp.json())["data"][0]
            status = data["status"]
            if status in ("COMMITTED", "INVALID"):
                return str(status)
            if status == "UNKNOWN":
                break  # the node lost it: post again
            # PENDING: keep waiting


async def _main(args: argparse.Namespace) -> None:
    os.environ["COMPARE_NODE_URL"] = args.node
    app = make_app(args.pg)
    async with app.open_async():
        worker = asyncio.create_task(
            app.run_worker_async(
                concurrency=args.concurrency,
                name=args.name,
                install_signal_handlers=True,
                fetch_job_polling_interval=args.poll_s,
            )
        )
        # Registered workers are what the stalled-job recovery looks at.
        for _ in range(200):
            await asyncio.sleep(0.05)
            async with app.connector.pool.connection() as conn:  # type: ignore[attr-defined]
                row = await (
                    await conn.execute("SELECT count(*) FROM procrastinate_workers")
                ).fetchone()
            if row and row[0] > args.index:
                break
        print("procrastinate worker ready", file=sys.stderr, flush=True)
        await worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("-c", "--concurrency", type=int, default=256)
    parser.add_argument("--name", default="worker")
    parser.add_argument(
        "--index", type=int, default=0, help="workers started before this one (ready check)"
    )
    parser.add_argument("--poll-s", type=float, default=1.0, help="job polling interval (s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
