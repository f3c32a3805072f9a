"""Sawtooth's own CLIs are on no package index, so a machine has them only
when someone built them: their tests are collected only when
``SAWTOOTH_CLIENTS`` names where (``make test-sawtooth-clients``)."""

from __future__ import annotations

import os

collect_ignore = [] if os.environ.get("SAWTOOTH_CLIENTS") else ["test_sawtooth_own_clients.py"]
