"""Failpoints: named points in the gateway and the node where a fault test makes the real
process fail, at exactly that point.

Enabled only through the environment, read once when ``ledgerq serve``
starts::

    LEDGERQ_FAILPOINTS="before_post=kill@3,claim_cycle=stop@10"

Each entry is ``point=action[@n]``: at the ``n``-th time (default 1) the
process passes ``point``, it

* ``kill`` — SIGKILLs itself (FAIL: the instance dies right there);
* ``stop`` — SIGSTOPs itself (DELAY: it resumes where it stopped when the
  test sends SIGCONT, typically after its claims expired);
* ``drop`` — raises :class:`~ledgerq.errors.StoreUnavailableError`, as a
  lost PostgreSQL connection does at that point.

An entry fires once. The points follow the high-availability plan's
PASS/DELAY/FAIL list (``docs/ha.md``):

======================  =========================================================
``claim_cycle``         start of a claim cycle (request claim / renewal)
``submitting``          the producer took a batch, before marking it submitted
                        (a batch taken with its predecessor's final status
                        too: before that transaction)
``taken_with_final``    a batch was recorded taken with its predecessor's final
                        status (the commit → next POST merge), before its POST
``before_post``         claim checked, before the POST to the ledger
``after_response``      the ledger answered, nothing recorded yet
``before_record``       before the outcome is written (through the completer)
``after_record``        after the outcome was written
======================  =========================================================

and in the node (``ledgerq node``, and a gateway's in-process node):

======================  =================================================
``node_journal_synced``  a journal group is on disk, not yet acknowledged
``node_store_write``     the store's write is done but not committed
``node_store_written``   the store's write committed, journal not yet cut
======================  =================================================

With the variable unset (production), :func:`failpoint` is one test of an
empty dict.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from ledgerq.errors import ConfigError, StoreUnavailableError

log = logging.getLogger(__name__)

ENV = "LEDGERQ_FAILPOINTS"
POINTS = (
    "claim_cycle",
    "submitting",
    "taken_with_final",
    "before_post",
    "after_response",
    "before_record",
    "after_record",
    "node_journal_synced",
    "node_store_write",
    "node_store_written",
)
ACTIONS = ("kill", "stop", "drop")


@dataclass(slots=True)
class _Armed:
    action: str
    at: int
    hits: int = 0


_armed: dict[str, _Armed] = {}


def parse(spec: str) -> dict[str, tuple[str, int]]:
    """``"a=kill@3,b=stop"`` → ``{"a": ("kill", 3), "b": ("stop", 1)}``; refuses typos."""
    out: dict[str, tuple[str, int]] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        point, sep, rest = entry.partition("=")
        action, _, count = rest.partition("@")
        if not sep or point not in POINTS or action not in ACTIONS:
            raise ConfigError(
                f"{ENV}: bad entry {entry!r}; use point=action[@n] with a point among "
                f"{', '.join(POINTS)} and an action among {', '.join(ACTIONS)}"
            )
        try:
            at = int(count) if count else 1
        except ValueError:
            at = 0
        if at < 1:
            raise ConfigError(f"{ENV}: {entry!r}: the count after @ must be a positive integer")
        out[point] = (action, at)
    return out


def configure(environ: Mapping[str, str] | None = None) -> None:
    """Arm the failpoints named in ``$LEDGERQ_FAILPOINTS`` (none when unset)."""
    spec = (os.environ if environ is None else environ).get(ENV, "")
    _armed.clear()
    for point, (action, at) in parse(spec).items():
        _armed[point] = _Armed(action, at)
    if _armed:
        log.warning("failpoints armed (fault testing only): %s", spec)


def failpoint(name: str) -> None:
    """Pass the point ``name``: fail here if an armed entry says so."""
    if not _armed:
        return
    armed = _armed.get(name)
    if armed is None:
        return
    armed.hits += 1
    if armed.hits != armed.at:
        return
    log.warning("failpoint %s: %s at hit %d", name, armed.action, armed.hits)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if armed.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif armed.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        log.warning("failpoint %s: resumed", name)
    else:
        raise StoreUnavailableError(f"failpoint {name}: the database connection was dropped")
