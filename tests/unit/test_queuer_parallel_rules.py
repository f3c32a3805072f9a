"""The per-key parallel rules, case by case (docs/queuer.md, "The parallel strategy")."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ledgerq.model import (
    BatchStatus,
    Committed,
    Delayed,
    Invalid,
    Pending,
    TrackingBatch,
    TrackingTransaction,
    Unknown,
    Valid,
)
from ledgerq.queue.parallel import (
    EVERYTHING,
    MAX_LOCK_LENGTH,
    BatchAccess,
    ConflictKind,
    ParallelDecision,
    Wait,
    decide_service_parallel,
    lock_entry,
    overlap,
    select_parallel_round,
)
from ledgerq.queue.serial import DEFAULT_DELAY_WINDOW_MS

NOW = 1_700_000_100_000
WINDOW = DEFAULT_DELAY_WINDOW_MS
A, B, C, D, E, F = (f"1cf126{c * 64}" for c in "abcdef")


def txn(
    tid: str,
    reads: Sequence[str] | None,
    writes: Sequence[str] | None,
    deps: Sequence[str] = (),
    service: str = "s",
) -> TrackingTransaction:
    return TrackingTransaction(
        family_name="intkey",
        family_version="1.0",
        transaction_header=tid,
        payload=b"p",
        signer_public_key="03" + "cd" * 32,
        service_id=service,
        inputs=None if reads is None else tuple(reads),
        outputs=None if writes is None else tuple(writes),
        dependencies=tuple(deps),
    )


def batch(
    header: str,
    seq: int | None,
    *,
    reads: Sequence[str] | None = (),
    writes: Sequence[str] | None = (),
    deps: Sequence[str] = (),
    service: str = "s",
    status: BatchStatus | None = None,
    submitted: bool = False,
    last_attempt_at: int | None = None,
    created_at: int = 1_700_000_000_000,
    txns: Sequence[TrackingTransaction] | None = None,
) -> TrackingBatch:
    return TrackingBatch(
        service_id=service,
        batch_header=header,
        data_change_id=None,
        signer_public_key="02" + "ab" * 32,
        trace=False,
        serialized_batch=b"",
        submitted=submitted,
        created_at=created_at,
        transactions=tuple(txns)
        if txns is not None
        else (txn(f"t-{header}", reads, writes, deps, service),),
        batch_status=status,
        seq=seq,
        last_attempt_at=last_attempt_at,
    )


def rw(header: str, seq: int, *keys: str, **kw: object) -> TrackingBatch:
    """An intkey-like batch: reads and writes ``keys``."""
    return batch(header, seq, reads=keys, writes=keys, **kw)


def decide(batches: Sequence[TrackingBatch], exclude: Sequence[int] = ()) -> ParallelDecision:
    return decide_service_parallel(batches, now=NOW, delay_window_ms=WINDOW, exclude=exclude)


def eligible(batches: Sequence[TrackingBatch], exclude: Sequence[int] = ()) -> list[str]:
    return [b.batch_header for b in decide(batches, exclude).eligible]


def pick(batches: Sequence[TrackingBatch], exclude: Sequence[int] = ()) -> str | None:
    chosen = decide(batches, exclude).pick
    return None if chosen is None else chosen.batch_header


# -- access sets ------------------------------------------------------------------


def test_overlap_is_one_entry_being_a_prefix_of_the_other() -> None:
    assert overlap("1cf126", A) and overlap(A, "1cf126")
    assert overlap(A, A)
    assert not overlap(A, B)
    assert not overlap("1cf127", A)
    assert overlap(EVERYTHING, A) and overlap(A, EVERYTHING)


def test_access_is_the_union_over_transactions_minimal_and_lower_case() -> None:
    b = batch(
        "x",
        1,
        txns=[
            txn("t1", [A.upper(), "1cf126"], [B]),
            txn("t2", [C], [B, "1cf126" + "b" * 10], deps=["t1", "other"]),
        ],
    )
    access = BatchAccess.of(b)
    # "1cf126" covers A and C; B (written) covers nothing more.
    assert access.reads == ("1cf126",)
    assert access.writes == ("1cf126" + "b" * 10,)
    # Dependencies inside the batch order nothing.
    assert access.after == ("other",)


def test_reads_covered_by_writes_are_dropped() -> None:
    access = BatchAccess.of(batch("x", 1, reads=[A, "1cf1", D], writes=["1cf126"]))
    # A and D are under the written prefix; "1cf1" is wider than it and stays.
    assert access.reads == ("1cf1",)
    assert access.writes == ("1cf126",)


def test_unknown_inputs_or_outputs_mean_everything() -> None:
    assert BatchAccess.of(batch("x", 1, reads=None, writes=[A])).reads == (EVERYTHING,)
    assert BatchAccess.of(batch("x", 1, reads=[A], writes=None)) == BatchAccess(
        reads=(), writes=(EVERYTHING,)
    )


# -- conflicts ----------------------------------------------------------------------


def test_batches_on_different_keys_are_all_eligible_and_the_first_is_picked() -> None:
    population = [rw("b1", 1, A), rw("b2", 2, B), rw("b3", 3, C)]
    assert eligible(population) == ["b1", "b2", "b3"]
    assert pick(population) == "b1"


def test_two_writes_of_one_address_are_ordered() -> None:
    population = [batch("b1", 1, writes=[A]), batch("b2", 2, writes=[A])]
    assert eligible(population) == ["b1"]
    waiting = decide(population).waiting
    assert waiting is not None and waiting.why is Wait.BLOCKED and waiting.conflict is not None
    assert (waiting.batch.batch_header, waiting.conflict.blocker.batch_header) == ("b2", "b1")
    assert (waiting.conflict.kind, waiting.conflict.what) == (ConflictKind.WRITES, A)


def test_a_read_after_a_write_is_ordered() -> None:
    population = [batch("w", 1, writes=[A]), batch("r", 2, reads=[A])]
    assert eligible(population) == ["w"]
    found = decide(population).waiting.conflict
    assert found is not None and found.kind is ConflictKind.WRITES


def test_a_write_after_a_read_is_ordered() -> None:
    population = [batch("r", 1, reads=[A]), batch("w", 2, writes=[A])]
    assert eligible(population) == ["r"]
    found = decide(population).waiting.conflict
    assert found is not None and (found.kind, found.what) == (ConflictKind.READS, A)


def test_reads_never_conflict() -> None:
    population = [
        batch("r1", 1, reads=[A]),
        batch("r2", 2, reads=[A, B]),
        batch("r3", 3, reads=[A]),
    ]
    assert eligible(population) == ["r1", "r2", "r3"]


def test_a_prefix_overlaps_the_addresses_under_it_both_ways() -> None:
    namespace = A[:6]
    assert eligible([batch("p", 1, writes=[namespace]), batch("leaf", 2, reads=[B])]) == ["p"]
    assert eligible([batch("leaf", 1, writes=[B]), batch("p", 2, reads=[namespace])]) == ["leaf"]
    assert eligible([batch("p", 1, reads=[namespace]), batch("leaf", 2, writes=[A])]) == ["p"]
    # Disjoint prefixes do not overlap.
    assert eligible([batch("p", 1, writes=["1cf127"]), batch("leaf", 2, writes=[A])]) == [
        "p",
        "leaf",
    ]


def test_upper_and_lower_case_entries_conflict() -> None:
    assert eligible([batch("u", 1, writes=[A.upper()]), batch("l", 2, reads=[A])]) == ["u"]


def test_entries_compare_by_at_most_an_addresss_length_of_hex_characters() -> None:
    long_a = "a" * MAX_LOCK_LENGTH + "1"
    long_b = "a" * MAX_LOCK_LENGTH + "2"
    assert len(A) == MAX_LOCK_LENGTH
    assert eligible([batch("x", 1, writes=[long_a]), batch("y", 2, writes=[long_b])]) == ["x"]
    # A character that is not hex ends the entry: what comes before it is a prefix.
    assert lock_entry("1cf1-zz") == "1cf1"
    assert eligible([batch("x", 1, writes=["1cf1-zz"]), batch("y", 2, reads=[A])]) == ["x"]
    assert eligible([batch("x", 1, writes=["1cf2-zz"]), batch("y", 2, reads=[A])]) == ["x", "y"]


def test_unknown_access_conflicts_with_everything_both_ways() -> None:
    legacy = batch("legacy", 2, reads=None, writes=None)
    assert eligible([rw("b1", 1, A), legacy, rw("b3", 3, B)]) == ["b1"]
    assert eligible([legacy, rw("b3", 3, B)]) == ["legacy"]
    # A batch that declares nothing touches no state.
    assert eligible([rw("b1", 1, A), batch("none", 2)]) == ["b1", "none"]


def test_a_dependency_on_an_earlier_batch_orders_it() -> None:
    first = rw("b1", 1, A)
    later = batch("b2", 2, reads=[B], writes=[B], deps=["t-b1"])
    assert eligible([first, later]) == ["b1"]
    found = decide([first, later]).waiting.conflict
    assert found is not None and (found.kind, found.what) == (ConflictKind.DEPENDS, "t-b1")
    # Once the earlier batch is final the dependency holds nothing.
    done = rw("b1", 1, A, status=Committed())
    assert eligible([done, later]) == ["b2"]


def test_dependencies_on_later_own_or_unknown_transactions_order_nothing() -> None:
    early = batch("b1", 1, reads=[A], writes=[A], deps=["t-b2", "t-zz"])
    assert eligible([early, rw("b2", 2, B)]) == ["b1", "b2"]
    own = batch("b3", 3, txns=[txn("t3a", [C], [C]), txn("t3b", [D], [D], deps=["t3a"])])
    assert eligible([own]) == ["b3"]


def test_services_never_conflict() -> None:
    population = [rw("a1", 1, A, service="a"), rw("b1", 2, A, service="b")]
    assert [b.batch_header for b in select_parallel_round(population, now=NOW)] == ["a1", "b1"]


# -- states -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [
        {"submitted": True},
        {"submitted": True, "status": Pending()},
        {"status": Pending()},
        {"submitted": True, "status": Unknown()},
        {"submitted": True, "status": Delayed(), "last_attempt_at": NOW - WINDOW},
    ],
    ids=[
        "submitted",
        "submitted-pending",
        "pending",
        "unknown-resubmitting",
        "delayed-resubmitting",
    ],
)
def test_a_batch_in_flight_holds_its_keys_only(state: dict[str, object]) -> None:
    population = [rw("b1", 1, A, **state), rw("b2", 2, A), rw("b3", 3, B)]
    decision = decide(population)
    assert [b.batch_header for b in decision.in_flight] == ["b1"]
    assert eligible(population) == ["b3"]
    assert decision.waiting is not None and decision.waiting.batch.batch_header == "b2"


def test_unknown_and_due_delayed_go_first_and_keep_their_locks() -> None:
    population = [
        rw("new", 1, A),
        rw("delayed", 2, B, status=Delayed(), last_attempt_at=NOW - WINDOW),
        rw("unknown", 3, C, status=Unknown()),
        rw("behind-unknown", 4, C),
    ]
    assert eligible(population) == ["new", "delayed", "unknown"]
    assert pick(population) == "unknown"
    assert pick(population[:2]) == "delayed"


def test_delayed_inside_its_window_waits_and_holds_its_locks() -> None:
    population = [
        rw("delayed", 1, A, status=Delayed(), last_attempt_at=NOW - WINDOW + 1),
        rw("behind", 2, A),
        rw("free", 3, B),
    ]
    decision = decide(population)
    assert eligible(population) == ["free"]
    assert decision.waiting is not None
    assert (decision.waiting.batch.batch_header, decision.waiting.why) == (
        "delayed",
        Wait.DELAY_WINDOW,
    )


@pytest.mark.parametrize("final", [Committed(), Valid(), Invalid()], ids=lambda s: s.name.value)
def test_final_batches_hold_nothing(final: BatchStatus) -> None:
    population = [rw("done", 1, A, status=final, submitted=True), rw("next", 2, A)]
    assert eligible(population) == ["next"]
    assert decide(population).in_flight == ()


def test_invalid_releases_what_later_batches_read() -> None:
    # The serial queuer submits the next batch after an Invalid one; so does this.
    population = [batch("w", 1, writes=[A], status=Invalid()), batch("r", 2, reads=[A])]
    assert pick(population) == "r"


def test_a_waiting_batch_holds_its_locks_too() -> None:
    # b1 in flight writes A; b2 reads A (held) and writes B; b3 reads B: held by
    # b2, which is not in flight: conflicts chain through waiting batches.
    population = [
        batch("b1", 1, writes=[A], submitted=True),
        batch("b2", 2, reads=[A], writes=[B]),
        batch("b3", 3, reads=[B]),
        batch("b4", 4, reads=[C]),
    ]
    assert eligible(population) == ["b4"]


def test_excluded_batches_are_not_picked_and_keep_their_locks() -> None:
    population = [rw("b1", 1, A), rw("b2", 2, A), rw("b3", 3, B)]
    assert pick(population, exclude=[1]) == "b3"
    assert pick(population, exclude=[1, 3]) is None
    waiting = decide(population, exclude=[1]).waiting
    assert waiting is not None and (waiting.batch.batch_header, waiting.why) == (
        "b1",
        Wait.EXCLUDED,
    )


def test_acceptance_order_without_seq_falls_back_to_the_seed_key() -> None:
    population = [
        rw("zz", None, A, created_at=1),
        rw("aa", None, A, created_at=2),
    ]
    assert pick(population) == "zz"


def test_nothing_non_final_is_idle() -> None:
    decision = decide([rw("b1", 1, A, status=Committed())])
    assert (decision.pick, decision.in_flight, decision.waiting) == (None, (), None)


# -- rounds -------------------------------------------------------------------------


def test_round_order_is_the_serial_queuers() -> None:
    population = [
        rw("a-new", 1, A, service="a"),
        rw("b-delayed", 2, A, service="b", status=Delayed(), last_attempt_at=None),
        rw("c-unknown", 3, A, service="c", status=Unknown()),
        rw("d-new", 4, A, service="d"),
    ]
    got = select_parallel_round(population, now=NOW)
    assert [b.batch_header for b in got] == ["c-unknown", "b-delayed", "a-new", "d-new"]


def test_round_is_restricted_to_listed_services_and_skips_excluded() -> None:
    population = [
        rw("a1", 1, A, service="a"),
        rw("a2", 2, B, service="a"),
        rw("b1", 3, A, service="b"),
    ]
    got = select_parallel_round(population, now=NOW, services=["a"], exclude=[1])
    assert [b.batch_header for b in got] == ["a2"]


def test_negative_delay_window_is_refused() -> None:
    with pytest.raises(ValueError, match="delay_window_ms"):
        select_parallel_round([], now=NOW, delay_window_ms=-1)


# -- Grid's illustration (queuer_strat_one_round_parallel.md) -------------------------


def _grid(table: dict[int, str]) -> list[TrackingBatch]:
    """Batches from Grid's tables: ``"rB rE wF"`` reads B and E, writes F."""
    key = {"A": A, "B": B, "C": C, "D": D, "E": E, "F": F}
    out = []
    for n, spec in table.items():
        reads = [key[x[1]] for x in spec.split() if x[0] == "r"]
        writes = [key[x[1]] for x in spec.split() if x[0] == "w"]
        out.append(batch(str(n), n, reads=reads, writes=writes))
    return out


def test_grids_few_independent_contracts_go_in_five_rounds() -> None:
    population = _grid(
        {
            1: "rB rE wF",
            2: "rD wE",
            3: "wA rB",
            4: "rA wB rC",
            5: "wC rD",
            6: "wC rD",
            7: "wD",
        }
    )
    rounds = []
    while any(not b.is_final for b in population):
        ready = eligible(population)
        rounds.append(ready)
        population = [
            b if b.batch_header not in ready else rw(b.batch_header, b.seq or 0, status=Committed())
            for b in population
        ]
    # Grid's analysis: 1 and 3, then 2 and 4, then 5, 6, 7 one by one.
    assert rounds == [["1", "3"], ["2", "4"], ["5"], ["6"], ["7"]]


def test_grids_many_independent_contracts_go_at_once() -> None:
    population = _grid({1: "wA rF", 2: "wB rF", 3: "wC rF", 4: "wD rF", 5: "wE rF"})
    assert eligible(population) == ["1", "2", "3", "4", "5"]
