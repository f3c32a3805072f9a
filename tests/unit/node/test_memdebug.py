"""The heap-growth debugging aid of ``ledgerq node`` (LEDGERQ_NODE_TRACEMALLOC)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from ledgerq.node import memdebug


def test_unset_means_no_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(memdebug.ENV, raising=False)
    assert memdebug.from_environment() is None


def test_counts_only_without_frames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "heap.txt"
    monkeypatch.setenv(memdebug.ENV, str(out))
    monkeypatch.setenv(memdebug.ENV_FRAMES, "0")
    tracer = memdebug.from_environment()
    assert tracer is not None and not tracemalloc.is_tracing()
    tracer.dump()
    kept = [[object()] for _ in range(5000)]
    tracer.dump("second")
    text = out.read_text()
    assert text.count("=== snapshot") == 2 and "RssAnon" in text
    assert "collector tracks" in text and len(kept) == 5000


def test_traced_growth_by_traceback(tmp_path: Path) -> None:
    tracer = memdebug.HeapTracer(tmp_path / "heap.txt", frames=2)
    try:
        tracer.dump()
        kept = [bytes(1000) for _ in range(2000)]
        tracer.dump()
    finally:
        tracemalloc.stop()
    text = (tmp_path / "heap.txt").read_text()
    assert "growth since the first snapshot, by traceback" in text
    assert "test_memdebug.py" in text and len(kept) == 2000
