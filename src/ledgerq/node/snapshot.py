"""Snapshots written by earlier versions of the node, imported into its store.

Earlier nodes kept their committed state, final statuses and committed
transaction ids in ``snapshot.bin`` (a pickle, written whole). A node whose
store is empty and finds one imports it once into the store
(:func:`import_snapshot`) and renames it ``snapshot.bin.imported``; the
journal after the snapshot is replayed as usual. Blocks before the import
are not known (``GET /blocks`` starts after them).
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

from ledgerq.errors import NodeDataError
from ledgerq.node.disk import LmdbStore, Meta, Store

log = logging.getLogger(__name__)
_READABLE = frozenset({2, 3})


def import_snapshot(directory: Path, store: Store) -> None:
    path = directory / "snapshot.bin"
    if not path.exists() or not isinstance(store, LmdbStore) or store.meta() != Meta():
        return
    content = read_snapshot(path)
    store.import_legacy(
        state=content.get("state", {}),
        statuses=content.get("statuses", {}),
        transactions=content.get("committed_txs", ()),
        applied=content.get("records", 0),
        events=content.get("event_seq", 0),
        batch_high=content.get("batch", 0),
    )
    path.rename(directory / "snapshot.bin.imported")
    log.info("imported %s into the node store", path)


def read_snapshot(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            content = pickle.load(f)
    except Exception as exc:
        raise NodeDataError(
            f"{path} is unreadable ({exc!r}); restore it or remove the directory"
        ) from exc
    if not isinstance(content, dict) or content.get("format") not in _READABLE:
        raise NodeDataError(f"{path} has an unknown format; it was not written by this ledgerq")
    return content
