"""Codec throughput: decoding and verifying BatchLists, in batches per second.

One process, one core: the figures are what a single gateway or node worker
can parse. Three shapes of batch: one intkey transaction (the common case;
two signatures to verify per batch), ~10 KiB made of ten ~1 KiB transactions
(eleven signatures), and ~10 KiB in one transaction (hashing-bound). Each
figure is the fastest of ``--rounds`` rounds: on a shared machine the slower
rounds measure the neighbours, not the codec.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import click

from bench import report
from ledgerq.codec import (
    ParsedBatch,
    Signer,
    decode_batch_list,
    encode_batch_list,
    make_batch,
    make_transaction,
    parse_batch_list,
)
from ledgerq.codec.intkey import make_address, make_intkey_batch


@dataclass(frozen=True)
class Shape:
    name: str
    build: Callable[[Signer, int], ParsedBatch]


def _opaque_batch(signer: Signer, i: int, transactions: int, payload_bytes: int) -> ParsedBatch:
    address = make_address(f"k{i}")
    txs = [
        make_transaction(
            signer,
            family_name="intkey",
            family_version="1.0",
            inputs=[address],
            outputs=[address],
            payload=(b"%d-%d:" % (i, t)).ljust(payload_bytes, b"x"),
        )
        for t in range(transactions)
    ]
    return make_batch(signer, txs)


SHAPES = (
    Shape("1 intkey transaction", lambda s, i: make_intkey_batch(s, [("set", f"k{i}", i)])),
    Shape("~10 KiB, 10 transactions", lambda s, i: _opaque_batch(s, i, 10, 280)),
    Shape("~10 KiB, 1 transaction", lambda s, i: _opaque_batch(s, i, 1, 10_000)),
)


def _best_rate(run: Callable[[], None], count: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return count / best


@click.command("codec")
@click.option("--batches", default=5000, show_default=True, help="Batches per shape and round.")
@click.option("--per-list", default=100, show_default=True, help="Batches per BatchList.")
@click.option("--rounds", default=5, show_default=True, help="Rounds; the fastest is reported.")
@click.option("--write/--no-write", default=True, help="Write figures to docs/BENCHMARKS.md.")
def command(batches: int, per_list: int, rounds: int, write: bool) -> None:
    """Parse+verify throughput of the Sawtooth batch codec."""
    signer = Signer.generate()
    load_before = os.getloadavg()[0]
    rows = []
    with report.progress() as bar:
        for shape in SHAPES:
            task = bar.add_task(f"build {shape.name}", total=batches)
            built = []
            for i in range(batches):
                built.append(shape.build(signer, i))
                bar.advance(task)
            lists = [
                encode_batch_list(built[i : i + per_list]) for i in range(0, batches, per_list)
            ]
            size = statistics.mean(len(b.serialized) for b in built)

            def verified(lists: list[bytes] = lists) -> None:
                for data in lists:
                    decode_batch_list(data)

            def unverified(lists: list[bytes] = lists) -> None:
                for data in lists:
                    decode_batch_list(data, verify=False)

            def tracked(lists: list[bytes] = lists) -> None:
                for data in lists:
                    parse_batch_list(data, "bench::svc")

            task = bar.add_task(f"measure {shape.name}", total=3)
            rates = []
            for run in (verified, unverified, tracked):
                rates.append(_best_rate(run, batches, rounds))
                bar.advance(task)
            rows.append(
                (
                    shape.name,
                    f"{size / 1024:.1f} KiB",
                    f"{rates[0]:,.0f}",
                    f"{rates[0] * len(built[0].transactions):,.0f}",
                    f"{rates[1]:,.0f}",
                    f"{rates[2]:,.0f}",
                )
            )
    markdown = (
        f"`decode_batch_list` over BatchLists of {per_list} batches, {batches} batches per "
        f"shape, fastest of {rounds} rounds, one process. *verified* checks every signature "
        "(the default); *unverified* skips only the signature checks (`verify=False`); "
        "*to TrackingBatch* is `parse_batch_list` (verified, plus building the store's "
        f"values). Load average (1 min) {load_before:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after the run, on {os.cpu_count()} cores: the codec uses "
        "one, so a load above that means it shared its core.\n\n"
        + report.table(
            [
                "batch shape",
                "mean batch size",
                "verified batches/s",
                "verified transactions/s",
                "unverified batches/s",
                "to TrackingBatch batches/s",
            ],
            rows,
        )
    )
    click.echo(markdown)
    if write:
        report.write_section("codec", markdown)
