"""The soak run's verdicts, on made-up observations: order by the node's event
sequence, double executions, key values, memory growth, 10-second windows."""

from __future__ import annotations

from bench._harness import EventWatcher
from bench.soak import Soak, _outcome


def _observed(reorder: bool = False, twice: bool = False) -> tuple[Soak, EventWatcher]:
    soak = Soak(services=2)
    watcher = EventWatcher("http://127.0.0.1:1")
    seq = 0
    for s in range(2):
        for _ in range(3):
            _service, bid, _body = soak.next_batch(s)
            soak.accepted[bid] = float(seq)
            seq += 1
            watcher.events[bid].append((float(seq) + 0.5, "COMMITTED"))
            watcher.seq[bid] = seq
    ids = soak.order["svc00000"]
    if reorder:
        watcher.seq[ids[1]], watcher.seq[ids[2]] = watcher.seq[ids[2]], watcher.seq[ids[1]]
    if twice:
        watcher.events[ids[0]].append((9.0, "COMMITTED"))
    for t in range(16):
        soak.memory["node"].append((t * 2.0, 100.0 + (t if t >= 8 else 0) * 10))
        soak.heap["node"].append((t * 2.0, 50.0 + (t if t >= 8 else 0)))
    return soak, watcher


def test_an_orderly_run_passes() -> None:
    soak, watcher = _observed()
    out = _outcome(soak, watcher, 0.0, {"svc00000": 2, "svc00001": 2}, 0)
    assert (out.accepted, out.committed, out.invalid, out.missing) == (6, 6, 0, 0)
    assert (out.out_of_order, out.executed_twice, out.wrong_keys) == (0, 0, 0)
    assert out.windows == [(0.0, 6, 1500.0, 1500.0)]


def test_reorders_double_executions_wrong_keys_and_memory_growth_show() -> None:
    soak, watcher = _observed(reorder=True, twice=True)
    out = _outcome(soak, watcher, 0.0, {"svc00000": 3, "svc00001": 2}, 0)
    assert out.out_of_order == 1
    assert out.executed_twice == 1
    assert out.wrong_keys == 1
    assert out.memory_growth["node"] > 64
    assert out.heap_growth["node"] == 13.5  # median of 62..65 against 50
