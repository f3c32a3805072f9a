"""A worker of ``ledgerq serve --workers N``, started by its supervisor.

Not a command to run by hand: the supervisor (:mod:`ledgerq.gateway.workers`)
starts ``python -m ledgerq.commands.worker`` and writes the worker's spec
(resolved settings, its index and role, the shared port, the bus and
lifeline file descriptors) on its standard input. The worker then runs the
gateway as :func:`ledgerq.gateway.run.run_gateway` does for ``ledgerq
serve``, dies with its supervisor, and tells it when it serves.
"""

from __future__ import annotations

import asyncio
import os
import sys

from ledgerq.errors import LedgerqError
from ledgerq.procpool import die_with


def main() -> None:
    from ledgerq import failpoints
    from ledgerq.commands.node import tune_gc
    from ledgerq.gateway.loop import run as run_on_loop
    from ledgerq.gateway.run import run_gateway
    from ledgerq.gateway.service import Gateway
    from ledgerq.gateway.workers import EXIT_START_FAILED, WorkerSpec
    from ledgerq.logs import configure_logging

    spec = WorkerSpec.from_json(sys.stdin.read())
    die_with(spec.supervisor_pid)
    settings = spec.settings()
    if settings.db.startswith(("postgresql://", "postgres://")):
        # Each worker is an instance: name its PostgreSQL sessions after it
        # (pg_stat_activity then shows which worker is which).
        os.environ["PGAPPNAME"] = settings.claims.instance_id
    configure_logging(settings.log.level, json_lines=settings.log.json)
    ready_fd = int(spec.extra["ready_fd"])
    started = False

    def ready(_gateway: Gateway) -> None:
        nonlocal started
        started = True
        os.write(ready_fd, b"1")
        os.close(ready_fd)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        # Fallback to PR_SET_PDEATHSIG: the lifeline pipe reads EOF once the
        # supervisor, its only writer, is gone.
        loop.add_reader(spec.lifeline_fd, lambda: os._exit(1))
        await run_gateway(settings, install_signals=True, on_started=ready, worker=spec)

    try:
        failpoints.configure()
        tune_gc()
        run_on_loop(run(), settings.event_loop)
    except LedgerqError as exc:
        print(f"Error: worker {spec.index}: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_START_FAILED if not started else 1)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
