"""The gateway's event loop choice (ledgerq.gateway.loop, setting event_loop)."""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

import pytest
import uvloop

from ledgerq.config import load_settings
from ledgerq.errors import ConfigError
from ledgerq.gateway.loop import loop_factory, run


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_by_default_and_asyncio_on_request() -> None:
    assert load_settings({}).event_loop == "uvloop"
    assert issubclass(run(_loop_type(), "uvloop"), uvloop.Loop)
    assert not issubclass(run(_loop_type(), "asyncio"), uvloop.Loop)
    with pytest.raises(ConfigError, match="event_loop"):
        load_settings({"event_loop": "trio"})


def test_ledger_client_setting() -> None:
    assert load_settings({}).ledger_client == "lean"
    assert load_settings({"ledger_client": "AIOHTTP"}).ledger_client == "aiohttp"
    with pytest.raises(ConfigError, match="ledger_client"):
        load_settings({"ledger_client": "httpx"})


def test_without_uvloop_asyncio_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_uvloop(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise ImportError("no uvloop here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    assert loop_factory("uvloop") is None
    assert not issubclass(run(_loop_type(), "uvloop"), uvloop.Loop)
