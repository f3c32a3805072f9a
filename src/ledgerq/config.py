"""One validated settings object, built from flags over ``LEDGERQ_*`` environment
variables over a TOML file over defaults, and passed down explicitly.

Keys are dotted (``submitter.slots``). In the TOML file they are tables
(``[submitter]`` / ``slots = 64``) or top-level keys (``db = "..."``); in the
environment ``LEDGERQ_`` + the key upper-cased with dots as underscores
(``LEDGERQ_SUBMITTER_SLOTS=64``); as flags, whatever the command maps onto
them. The file is ``--config PATH``, else ``$LEDGERQ_CONFIG``, else
``ledgerq.toml`` in the working directory if present.

:data:`KEYS` is the one table of keys: name, check, default, help. Code
reads the typed :class:`Settings` built from it (``settings.submitter.slots``),
never a key by its name.

An invalid value is refused with :class:`~ledgerq.errors.ConfigError` naming
the key and where the value came from. :attr:`Settings.sources` records, for
every key, which layer its value came from (``default``, ``file``, ``env``,
``flag``), for ``ledgerq config show``.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import stat
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from ledgerq.claims.settings import MAX_INSTANCE_ID_LENGTH, ClaimSettings
from ledgerq.errors import ConfigError
from ledgerq.follow.follower import FollowSettings
from ledgerq.ingest.guard import HttpLimits
from ledgerq.ledgers import LEDGER_CREDENTIALS_TWICE
from ledgerq.ledgers.http import url_credentials
from ledgerq.model import service_id_problem
from ledgerq.procpool import Priority
from ledgerq.queue.strategy import OnInvalid, OnInvalidMap, Strategy, StrategyMap
from ledgerq.scopes import ACCESS_MODES, Scope
from ledgerq.submit.submitter import SubmitterSettings

ENV_PREFIX = "LEDGERQ_"
DEFAULT_CONFIG_FILE = "ledgerq.toml"


def parse_bind(value: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); raises ``ValueError`` with what is wrong."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{value!r} is not HOST:PORT")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 0-65535")
    return host.strip("[]"), port


#: What a TOML value that is not a string is called in an error.
_TOML_TYPES = {bool: "a boolean", int: "an integer", float: "a number", list: "an array"}


def _kind(value: Any) -> str:
    """What a TOML value is called in an error (not the value: it may be a token)."""
    return _TOML_TYPES.get(type(value), f"a {type(value).__name__}")


def _text(value: Any) -> str:
    """A string, as every textual key takes: a TOML number, array or date is refused."""
    if isinstance(value, str):
        return value
    raise ValueError(f"{_kind(value)} is not text; write the value as a string, in quotes")


def _items(value: Any) -> list[str]:
    """The entries of a list key: comma-separated text, or a TOML array of strings."""
    items = [_text(v) for v in value] if isinstance(value, list) else _text(value).split(",")
    return [item.strip() for item in items if item.strip()]


def _ledger(value: Any) -> str:
    text = _text(value)
    if text == "node" or text.startswith(
        ("sawtooth+http://", "sawtooth+https://", "splinter+http://", "splinter+https://")
    ):
        return text
    raise ValueError(f"{text!r}: use node, sawtooth+http://HOST:PORT or splinter+http://HOST:PORT")


def _db(value: Any) -> str:
    text = _text(value)
    if text.startswith(("sqlite:///", "postgresql://", "postgres://", "memory://")):
        return text
    raise ValueError(f"{text!r}: use sqlite:///PATH, postgresql://... or memory://")


def _bind(value: Any) -> str:
    text = _text(value)
    parse_bind(text)
    return text


def _positive(kind: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        v = _finite(kind(value))
        if v <= 0:
            raise ValueError(f"{value!r} must be greater than 0")
        return v

    return check


def _non_negative(kind: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        v = _finite(kind(value))
        if v < 0:
            raise ValueError(f"{value!r} must not be negative")
        return v

    return check


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")


def _finite(v: Any) -> Any:
    # nan passes every comparison's "not too small" test; inf is no duration.
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{v!r} is not a finite number")
    return v


def _numeric(value: Any, what: str) -> Any:
    """``value`` when it may be read as a number (a number, or text such as
    an environment variable's): a TOML boolean, date, time or array is
    refused by what it is, not by a complaint of int() about its type."""
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        return value
    raise ValueError(f"{_kind(value)} is not {what}; write the value as a number")


def _int(value: Any) -> int:
    value = _numeric(value, "an integer")
    if isinstance(value, float) and not value.is_integer():
        # int() would cut 1.5 down to 1 without a word.
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)


def _float(value: Any) -> float:
    return float(_numeric(value, "a number"))


def _instance_id(value: Any) -> str:
    text = _text(value)
    if len(text) > MAX_INSTANCE_ID_LENGTH:
        raise ValueError(f"{text!r} is longer than {MAX_INSTANCE_ID_LENGTH} characters")
    return text


def _event_loop(value: str) -> str:
    kind = str(value).strip().lower()
    if kind not in ("uvloop", "asyncio"):
        raise ConfigError(f"event_loop must be uvloop or asyncio, not {value!r}")
    return kind


def _ledger_client(value: str) -> str:
    kind = str(value).strip().lower()
    if kind not in ("lean", "aiohttp"):
        raise ConfigError(f"ledger_client must be lean or aiohttp, not {value!r}")
    return kind


def _verify_thread(value: Any) -> str:
    kind = str(value).strip().lower()
    if kind not in ("auto", "on", "off"):
        raise ConfigError(f"decode_verify_thread must be auto, on or off, not {value!r}")
    return kind


def _log_level(value: str) -> str:
    level = str(value).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"{value!r}: use debug, info, warning or error")
    return level


def _token(value: Any) -> str:
    token = _text(value)
    if token and (len(token) < 16 or not token.isprintable() or " " in token):
        raise ValueError("use at least 16 printable characters without spaces, or leave it empty")
    return token


def _origins(value: Any) -> str:
    origins = _items(value)
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ValueError(f"{origin!r}: origins look like https://host[:port], or *")
    return ",".join(origins)


def _share(value: Any) -> float:
    share = _float(value)
    if not 0 <= share <= 1:
        raise ValueError(f"{value!r}: a share of one core is 0-1")
    return share


def _priority(value: Any) -> str:
    return str(Priority.parse(value))


def _strategy(value: Any) -> str:
    return Strategy.parse(str(value)).value


def _strategy_rules(value: Any) -> str:
    rules = StrategyMap.parse("serial", ",".join(_items(value))).rules
    return ",".join(f"{pattern}={strategy.value}" for pattern, strategy in rules)


def _on_invalid(value: Any) -> str:
    return OnInvalid.parse(str(value)).value


def _on_invalid_rules(value: Any) -> str:
    rules = OnInvalidMap.parse("continue", ",".join(_items(value))).rules
    return ",".join(f"{pattern}={choice.value}" for pattern, choice in rules)


def _hosts(value: Any) -> str:
    hosts = [h.lower() for h in _items(value)]
    for host in hosts:
        if "/" in host or " " in host:
            raise ValueError(f"{host!r}: list host names or addresses, without scheme or path")
    return ",".join(hosts)


def _public_url(value: Any) -> str:
    url = _text(value).strip().rstrip("/")
    if url and (not url.startswith(("http://", "https://")) or "?" in url or "#" in url):
        raise ValueError(f"{url!r}: give the gateway's base URL, e.g. https://gw.example.com")
    return url


def _service_id(value: Any) -> str:
    service_id = _text(value).strip()
    problem = service_id_problem(service_id) if service_id else None
    if problem is not None:
        raise ValueError(f"{service_id!r}: {problem}")
    return service_id


_TOKEN_FIELDS = {"name", "token", "services", "access"}


def _scoped_tokens(value: Any) -> list[dict[str, Any]]:
    """``auth.tokens``: a TOML array of tables, or the same as JSON text (environment)."""
    if isinstance(value, str):
        if not value.strip():
            return []
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(
                'not JSON; write [{"name": "...", "token": "...", "services": ["a-*"], '
                f'"access": "read-write"}}, ...] ({exc})'
            ) from exc
    if not isinstance(value, list | tuple):
        raise ValueError("give a list of tokens ([[auth.tokens]] tables in TOML)")
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            raise ValueError(f"entry {i} is not a table with name, token, services, access")
        name = str(entry.get("name") or f"token #{i + 1}")
        unknown = sorted(set(entry) - _TOKEN_FIELDS)
        if unknown:
            raise ValueError(
                f"{name}: unknown field {unknown[0]!r}; use {', '.join(sorted(_TOKEN_FIELDS))}"
            )
        token = entry.get("token")
        if not token:
            raise ValueError(f"{name}: token is missing")
        try:
            token = _token(token)
        except ValueError as exc:
            raise ValueError(f"{name}: token: {exc}") from exc
        services = entry.get("services", ["*"])
        if isinstance(services, str):
            services = [s.strip() for s in services.split(",")]
        if (
            not isinstance(services, list | tuple)
            or not services
            or not all(isinstance(s, str) and s.strip() for s in services)
        ):
            raise ValueError(f"{name}: services is a non-empty list of service id patterns")
        access = str(entry.get("access", "read-write"))
        if access not in ACCESS_MODES:
            raise ValueError(f"{name}: access {access!r}: use {', '.join(ACCESS_MODES)}")
        out.append(
            {
                "name": name,
                "token": token,
                "services": [s.strip() for s in services],
                "access": access,
            }
        )
    # A list of plain dicts: the value crosses to ``--workers`` processes as JSON.
    return out


@dataclass(frozen=True, slots=True)
class Key:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str


KEYS: tuple[Key, ...] = (
    Key("db", _db, "sqlite:///ledgerq.sqlite3", "batch tracking store URL"),
    Key(
        "store.outage_timeout_s",
        _positive(_float),
        2.0,
        "PostgreSQL: once no primary answers, a request waits at most this long (s), then 503",
    ),
    Key(
        "store.wait_s",
        _non_negative(_float),
        0.0,
        "`serve`: at start-up, wait up to this long for a PostgreSQL primary (s)",
    ),
    Key("ledger", _ledger, "node", "node (in-process), sawtooth+http://H:P or splinter+http://H:P"),
    Key("bind", _bind, "127.0.0.1:8080", "HOST:PORT the gateway listens on"),
    Key("workers", _non_negative(_int), 0, "gateway processes behind the port (0: one per core)"),
    Key(
        "event_loop",
        _event_loop,
        "uvloop",
        "uvloop (asyncio's if not installed) or asyncio",
    ),
    Key("node.data_dir", _text, "", "in-process node data directory (default: next to the db)"),
    Key("node.shards", _positive(_int), 4, "in-process node shard count"),
    Key("node.ephemeral", _bool, False, "in-process node forgets pending batches on restart"),
    Key("node.token", _token, "", "`ledgerq node`: bearer token on every route (secret)"),
    Key("node.allowed_hosts", _hosts, "", "`ledgerq node`: Host names it answers besides loopback"),
    Key("node.allowed_origins", _origins, "", "`ledgerq node`: web origins let in (default none)"),
    Key(
        "node.insecure_allow_remote",
        _bool,
        False,
        "`ledgerq node`: allow a non-loopback bind without a token",
    ),
    Key("node.max_held", _positive(_int), 10_000, "node: batches held on dependencies, at most"),
    Key(
        "node.held_expiry_s", _positive(_float), 300.0, "node: a held batch turns INVALID after (s)"
    ),
    Key("node.max_status_ids", _positive(_int), 1_000, "node: batch ids per status request"),
    Key("node.max_waiters", _positive(_int), 10_000, "node: status long-polls parked at once"),
    Key(
        "node.max_connections",
        _positive(_int),
        4_096,
        "`ledgerq node`: open connections (then an idle one is closed, else 503)",
    ),
    Key(
        "node.max_connections_per_address",
        _non_negative(_int),
        2_048,
        "`ledgerq node`: open connections from one client address (0: no such cap)",
    ),
    Key(
        "node.max_event_streams",
        _positive(_int),
        64,
        "`ledgerq node`: /events and /subscriptions streams open at once (a quarter per address)",
    ),
    Key("node.max_scabbard_services", _positive(_int), 64, "node: scabbard ledgers open at once"),
    Key("node.scabbard_idle_s", _positive(_float), 300.0, "node: close a scabbard ledger idle (s)"),
    Key("delay_window_ms", _non_negative(_int), 15_000, "wait after a Delayed batch (ms)"),
    Key(
        "queuer.strategy",
        _strategy,
        "serial",
        "serial (Grid's plan), parallel (per key) or pipelined (chained batches in flight)",
    ),
    Key(
        "queuer.strategy_by_service",
        _strategy_rules,
        "",
        "PATTERN=STRATEGY,... overriding queuer.strategy per service id (first match)",
    ),
    Key(
        "queuer.pipeline_depth",
        _positive(_int),
        64,
        "pipelined strategy: batches of a service in flight at once, at most",
    ),
    Key(
        "queuer.on_invalid",
        _on_invalid,
        "continue",
        "after an INVALID batch: continue, or halt the service until an operator resumes it",
    ),
    Key(
        "queuer.on_invalid_by_service",
        _on_invalid_rules,
        "",
        "PATTERN=continue|halt,... overriding queuer.on_invalid per service id (first match)",
    ),
    Key("max_body_bytes", _positive(_int), 10 * 1024 * 1024, "largest accepted BatchList"),
    Key("max_status_ids", _positive(_int), 1_000, "distinct batch ids per status request"),
    Key("max_waiters", _positive(_int), 1_000, "status long-polls parked at once (then 429)"),
    Key("decode_slots", _positive(_int), 2, "large BatchLists decoded at once, off the loop"),
    Key(
        "decode_priority",
        _priority,
        "idle",
        "CPU priority of the decoding processes: idle, normal or a nice value 0-19",
    ),
    Key(
        "decode_verify_thread",
        _verify_thread,
        "auto",
        "signatures of small BatchLists verified on a thread beside the event loop: auto "
        "(when the gateway is one process on a machine with a core to spare), on or off",
    ),
    Key(
        "decode_yield_bytes",
        _positive(_int),
        1024 * 1024,
        "BatchLists this large yield to the pipeline while it is busy",
    ),
    Key(
        "decode_yield_share",
        _share,
        0.1,
        "share of one core those lists' verification takes while the pipeline is busy (0-1)",
    ),
    Key(
        "decode_yield_max_wait_s",
        _non_negative(_float),
        30.0,
        "longest such a list is held back in all, then it runs unthrottled (s)",
    ),
    Key(
        "http.keepalive_s",
        _positive(_float),
        HttpLimits.keepalive_s,
        "gateway and node: close a connection idle this long (s)",
    ),
    Key(
        "http.header_timeout_s",
        _positive(_float),
        HttpLimits.header_timeout_s,
        "gateway and node: a request's headers must arrive in (s)",
    ),
    Key(
        "http.body_timeout_s",
        _positive(_float),
        HttpLimits.body_timeout_s,
        "gateway and node: a request's body must arrive in (s)",
    ),
    Key(
        "http.max_connections",
        _positive(_int),
        HttpLimits.max_connections,
        "gateway: open connections (then an idle one is closed, else 503)",
    ),
    Key(
        "http.max_connections_per_address",
        _non_negative(_int),
        HttpLimits.max_connections_per_address,
        "gateway: open connections from one client address (0: no such cap)",
    ),
    Key("submitter.slots", _positive(_int), SubmitterSettings.slots, "concurrent submissions"),
    Key(
        "submitter.max_retries",
        _non_negative(_int),
        SubmitterSettings.max_retries,
        "busy retries before Delayed",
    ),
    Key(
        "submitter.backoff_initial_ms",
        _non_negative(_int),
        SubmitterSettings.backoff_initial_ms,
        "first retry backoff (ms)",
    ),
    Key(
        "submitter.backoff_max_ms",
        _non_negative(_int),
        SubmitterSettings.backoff_max_ms,
        "longest retry backoff (ms)",
    ),
    Key(
        "submitter.poll_timeout_s",
        _positive(_float),
        SubmitterSettings.poll_timeout_s,
        "queue poll fallback (s)",
    ),
    Key(
        "ledger_token",
        _text,
        "",
        "bearer token the gateway sends to an HTTP ledger (a `ledgerq node`'s node.token; secret)",
    ),
    Key(
        "ledger_client",
        _ledger_client,
        "lean",
        "HTTP client of a Sawtooth ledger's POSTs and status reads: lean or aiohttp",
    ),
    Key("ledger_timeout.connect_s", _positive(_float), 3.0, "ledger connect timeout (s)"),
    Key("ledger_timeout.submit_s", _positive(_float), 10.0, "ledger POST timeout (s)"),
    Key(
        "monitor.poll_interval_s",
        _positive(_float),
        FollowSettings.poll_interval_s,
        "safety-net scan of in-flight batches (s)",
    ),
    Key(
        "monitor.wait_s",
        _positive(_float),
        FollowSettings.wait_s,
        "wait of a parked status read (s)",
    ),
    Key(
        "monitor.max_parked",
        _positive(_int),
        FollowSettings.max_parked,
        "status reads parked at once",
    ),
    Key(
        "monitor.backoff_initial_ms",
        _positive(_int),
        FollowSettings.backoff_initial_ms,
        "first retry of a failed status read (ms)",
    ),
    Key(
        "monitor.backoff_max_ms",
        _positive(_int),
        FollowSettings.backoff_max_ms,
        "longest retry of a failed status read (ms)",
    ),
    Key(
        "claims.instance_id",
        _instance_id,
        ClaimSettings.instance_id,
        "HA instance id (default: host-pid-random)",
    ),
    Key(
        "claims.renew_interval_ms",
        _positive(_int),
        ClaimSettings.renew_interval_ms,
        "claim cycle period (ms)",
    ),
    Key(
        "claims.ttl_ms",
        _positive(_int),
        ClaimSettings.ttl_ms,
        "first claim expiry: idle failover (ms)",
    ),
    Key(
        "claims.slow_ttl_ms",
        _non_negative(_int),
        ClaimSettings.slow_ttl_ms,
        "2nd expiry, mid-submission (ms; 0: TTL+10%)",
    ),
    Key(
        "claims.post_margin_ms",
        _non_negative(_int),
        ClaimSettings.post_margin_ms,
        "claim left to start a POST (ms; 0: TTL/5)",
    ),
    Key(
        "claims.grace_ms",
        _non_negative(_int),
        ClaimSettings.grace_ms,
        "unclaimed wait before any takes it (ms)",
    ),
    Key(
        "claims.forget_service_ms",
        _positive(_int),
        ClaimSettings.forget_service_ms,
        "claim row of a service idle this long is deleted (ms)",
    ),
    Key("log.level", _log_level, "INFO", "debug, info, warning or error"),
    Key("log.json", _bool, False, "JSON log lines"),
    Key(
        "auth.token",
        _token,
        "",
        "bearer token required on every route but health/ready (secret; empty: none)",
    ),
    Key(
        "auth.tokens",
        _scoped_tokens,
        "",
        "scoped tokens: service id patterns, read/write/operate (secret; JSON in the environment)",
    ),
    Key(
        "insecure_allow_remote",
        _bool,
        False,
        "allow a bind beyond loopback without any token",
    ),
    Key(
        "allowed_hosts",
        _hosts,
        "",
        "Host names answered besides the bind address and loopback (*: any)",
    ),
    Key("public_url", _public_url, "", "base URL of status links (default: from the Host)"),
    Key(
        "default_service",
        _service_id,
        "",
        "service of batches posted without one (empty: none, one queue)",
    ),
    Key(
        "trust_forwarded",
        _bool,
        False,
        "build links from X-Forwarded-Proto/-Host (behind a proxy that sets them)",
    ),
    Key("cors.origins", _origins, "", "comma-separated origins allowed by CORS (empty: no CORS)"),
    Key("metrics.top_services", _positive(_int), 20, "services with their own depth series"),
)
#: Keys whose values are never printed (``config show``) nor logged.
SECRET_KEYS = frozenset({"auth.token", "auth.tokens", "node.token", "ledger_token"})
_BY_NAME = {k.name: k for k in KEYS}
#: Keys that existed once: a file or variable still setting them is refused with why.
REMOVED_KEYS = {
    "auth.protect_reads": (
        "it was removed: with a token set every read needs a token now; delete the "
        'setting (read-only access for some clients: auth.tokens with access = "read")'
    ),
}
#: ``LEDGERQ_*`` variables that are not settings but are read by ledgerq, its
#: client commands, its benchmarks or its test suite. Any other ``LEDGERQ_*``
#: variable is a typo and refused (see :func:`check_environment`).
OTHER_VARIABLES = frozenset(
    {
        "LEDGERQ_CONFIG",
        "LEDGERQ_URL",
        "LEDGERQ_TOKEN",
        "LEDGERQ_DB",
        "LEDGERQ_FAILPOINTS",
        "LEDGERQ_NODE_TRACEMALLOC",
        "LEDGERQ_NODE_TRACEMALLOC_FRAMES",
        "LEDGERQ_BENCH_PG",
        "LEDGERQ_TEST_PG",
    }
)


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper().replace(".", "_")


def known_variables() -> frozenset[str]:
    return frozenset({env_name(k.name) for k in KEYS} | OTHER_VARIABLES)


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse any ``LEDGERQ_*`` variable ledgerq does not read (a misspelt
    token variable would otherwise leave the gateway open unnoticed)."""
    known = known_variables()
    removed = {env_name(k): why for k, why in REMOVED_KEYS.items()}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        if name in removed:
            raise ConfigError(f"environment variable {name} is not accepted: {removed[name]}")
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(
            f"unknown environment variable {name}{hint} (ledgerq reads only the variables "
            "listed in docs/configuration.md; unset it or fix its name)"
        )


@dataclass(frozen=True)
class NodeSettings:
    """``node.*``: the in-process node, and ``ledgerq node``'s own limits."""

    data_dir: str
    shards: int
    ephemeral: bool
    token: str
    allowed_hosts: str
    allowed_origins: str
    insecure_allow_remote: bool
    max_held: int
    held_expiry_s: float
    max_status_ids: int
    max_waiters: int
    max_connections: int
    max_connections_per_address: int
    max_event_streams: int
    max_scabbard_services: int
    scabbard_idle_s: float


@dataclass(frozen=True)
class StoreSettings:
    """``store.*``: the PostgreSQL store without a primary."""

    outage_timeout_s: float
    wait_s: float


@dataclass(frozen=True)
class QueuerSettings:
    """``queuer.*``: which strategy serves which service, and what an
    INVALID batch does to it."""

    strategy: str
    strategy_by_service: str
    pipeline_depth: int
    on_invalid: str
    on_invalid_by_service: str

    @property
    def strategies(self) -> StrategyMap:
        return StrategyMap.parse(self.strategy, self.strategy_by_service)

    @property
    def on_invalid_map(self) -> OnInvalidMap:
        return OnInvalidMap.parse(self.on_invalid, self.on_invalid_by_service)


@dataclass(frozen=True)
class LedgerTimeoutSettings:
    """``ledger_timeout.*``: requests to an HTTP ledger."""

    connect_s: float
    submit_s: float


@dataclass(frozen=True)
class LogSettings:
    """``log.*``."""

    level: str
    json: bool


@dataclass(frozen=True)
class AuthSettings:
    """``auth.*``: the tokens clients present."""

    token: str
    #: Entries ``{"name", "token", "services", "access"}`` (plain data: the
    #: value crosses to ``--workers`` processes as JSON).
    tokens: Sequence[Mapping[str, Any]]

    def __post_init__(self) -> None:
        seen = {self.token: "auth.token"} if self.token else {}
        for entry in self.tokens:
            if entry["token"] in seen:
                raise ConfigError(
                    f"auth.tokens: {entry['name']} has the same token as {seen[entry['token']]}; "
                    "give every token its own value"
                )
            seen[entry["token"]] = entry["name"]
        names = [e["name"] for e in self.tokens]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"auth.tokens: the name {twice[0]!r} is used twice; names must differ"
            )

    @property
    def has_token(self) -> bool:
        """Whether any token (``auth.token`` or ``auth.tokens``) is configured."""
        return bool(self.token or self.tokens)

    @property
    def scoped_tokens(self) -> list[tuple[str, Scope]]:
        """Every configured token with the scope it gives (``auth.token``: all)."""
        out = [(self.token, Scope("auth.token"))] if self.token else []
        for e in self.tokens:
            out.append((e["token"], Scope.of(e["name"], tuple(e["services"]), e["access"])))
        return out


@dataclass(frozen=True)
class CorsSettings:
    """``cors.*``."""

    origins: str


@dataclass(frozen=True)
class MetricsSettings:
    """``metrics.*``."""

    top_services: int


#: The attribute of :class:`Settings` the keys ``PREFIX.*`` fill, where it
#: is not named as the prefix: the ``monitor.*`` keys set the follower's.
_SECTION_ATTRIBUTES = {"monitor": "follower"}


@dataclass(frozen=True)
class Settings:
    """The validated settings, typed: one attribute per top-level key and
    one section object per key prefix (``settings.submitter.slots`` is the
    key ``submitter.slots``; the ``monitor.*`` keys are
    ``settings.follower``).

    Built by :meth:`build` from the values :func:`load_settings` checked
    one by one with :data:`KEYS`; a section's class checks how its values
    fit together. :data:`KEYS` holds every default, but that a component's
    own settings class (:class:`SubmitterSettings`, :class:`FollowSettings`,
    :class:`ClaimSettings`, :class:`HttpLimits`) holds its keys' defaults,
    which :data:`KEYS` reads from it. A key added to :data:`KEYS` needs its
    attribute here (or in its section's class): :meth:`build` fails on a
    key without one, and on an attribute without its key.
    """

    db: str
    ledger: str
    #: ``HOST:PORT``; :attr:`bind_address` splits it.
    bind: str
    workers: int
    event_loop: str
    delay_window_ms: int
    max_body_bytes: int
    max_status_ids: int
    max_waiters: int
    decode_slots: int
    decode_priority: str
    decode_verify_thread: str
    decode_yield_bytes: int
    decode_yield_share: float
    decode_yield_max_wait_s: float
    ledger_token: str
    ledger_client: str
    insecure_allow_remote: bool
    allowed_hosts: str
    public_url: str
    trust_forwarded: bool
    default_service: str
    store: StoreSettings
    node: NodeSettings
    queuer: QueuerSettings
    http: HttpLimits
    submitter: SubmitterSettings
    ledger_timeout: LedgerTimeoutSettings
    follower: FollowSettings
    claims: ClaimSettings
    log: LogSettings
    auth: AuthSettings
    cors: CorsSettings
    metrics: MetricsSettings
    #: Every key's validated value, by key name (``config show``, and what a
    #: ``--workers`` process is handed).
    values: Mapping[str, Any]
    #: Every key's layer: ``default``, ``file``, ``env`` or ``flag``.
    sources: Mapping[str, str]
    config_file: str | None
    #: What the commands print before they start (:func:`file_warnings`).
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.public_url and self.trust_forwarded:
            raise ConfigError(
                "public_url and trust_forwarded are both set: links are built from one of them; "
                "keep public_url (a fixed address) or trust_forwarded (the proxy's headers)"
            )

    @classmethod
    def build(
        cls,
        values: Mapping[str, Any],
        sources: Mapping[str, str] | None = None,
        config_file: str | None = None,
        warnings: tuple[str, ...] = (),
    ) -> Settings:
        """The typed settings of ``values`` (each key's validated value)."""
        top: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {}
        for key in KEYS:
            section, _, name = key.name.rpartition(".")
            (sections.setdefault(section, {}) if section else top)[name] = values[key.name]
        for section, fields in sections.items():
            attribute = _SECTION_ATTRIBUTES.get(section, section)
            top[attribute] = _SETTINGS_TYPES[attribute](**fields)
        return cls(
            **top,
            values=dict(values),
            sources=dict(sources or {}),
            config_file=config_file,
            warnings=warnings,
        )

    @property
    def bind_address(self) -> tuple[str, int]:
        return parse_bind(self.bind)

    @property
    def node_data_dir(self) -> Path:
        if self.node.data_dir:
            return Path(self.node.data_dir)
        if self.db.startswith("sqlite:///"):
            db_path = Path(self.db.removeprefix("sqlite:///"))
            return db_path.with_name(db_path.stem + "-node")
        return Path("ledgerq-data") / "node"


_SETTINGS_TYPES: dict[str, Any] = get_type_hints(Settings)


def _flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in doc.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Build and validate the settings; raises ``ConfigError`` naming the key."""
    env = os.environ if environ is None else environ
    check_environment(env)
    layers: list[tuple[str, Mapping[str, Any]]] = []

    path: Path | None = None
    if config_file is not None:
        path = Path(config_file)
    elif env.get(ENV_PREFIX + "CONFIG"):
        path = Path(env[ENV_PREFIX + "CONFIG"])
    else:
        candidate = (cwd or Path.cwd()) / DEFAULT_CONFIG_FILE
        path = candidate if candidate.is_file() else None
    if path is not None:
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read the configuration file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from exc
        from_file = _flatten(doc)
        unknown = sorted(set(from_file) - set(_BY_NAME))
        if unknown:
            if unknown[0] in REMOVED_KEYS:
                raise ConfigError(f"key {unknown[0]!r} in {path}: {REMOVED_KEYS[unknown[0]]}")
            close = difflib.get_close_matches(unknown[0], list(_BY_NAME), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"unknown key {unknown[0]!r} in {path}; {hint}known keys: {', '.join(_BY_NAME)}"
            )
        layers.append(("file", from_file))

    layers.append(
        ("env", {k.name: env[env_name(k.name)] for k in KEYS if env.get(env_name(k.name))})
    )
    layers.append(("flag", {k: v for k, v in (flags or {}).items() if v is not None}))

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in KEYS:
        raw, source = key.default, "default"
        for layer_name, layer in layers:
            if key.name in layer:
                raw, source = layer[key.name], layer_name
        try:
            values[key.name] = key.parse(raw)
        except (TypeError, ValueError) as exc:
            where = {"env": env_name(key.name), "file": str(path), "flag": "command line"}.get(
                source, "defaults"
            )
            raise ConfigError(f"invalid {key.name} (from {where}): {exc}") from exc
        sources[key.name] = source
    warnings = file_warnings(path, sources, values) if path is not None else ()
    settings = Settings.build(values, sources, str(path) if path else None, warnings)
    _check_ledger(settings)
    _check_strategies(settings)
    return settings


def file_warnings(
    path: Path, sources: Mapping[str, str], values: Mapping[str, Any]
) -> tuple[str, ...]:
    """A warning when the settings file holds a secret (a token, a password in
    the database or ledger URL) and anyone on the machine may read it."""
    secrets = [k for k in sorted(SECRET_KEYS) if sources.get(k) == "file" and values[k]]
    for key in ("db", "ledger"):
        if sources.get(key) == "file" and "@" in str(values[key]):
            url = str(values[key]).partition("+")[2] or str(values[key])
            if urllib.parse.urlsplit(url).password:
                secrets.append(key)
    try:
        mode = path.stat().st_mode
    except OSError:
        return ()
    if not secrets or not mode & stat.S_IROTH:
        return ()
    return (
        f"the settings file {path} holds secrets ({', '.join(secrets)}) and every user of "
        f"this machine may read it (mode {stat.S_IMODE(mode):o}); make it readable by the "
        f"service's user only: chmod 600 {path}",
    )


def ledger_password(ledger: str) -> str | None:
    """The password in a ``ledger`` URL's ``user:password@``, if it holds one."""
    _, sep, url = ledger.partition("+")
    if not sep or "@" not in url:
        return None
    return urllib.parse.urlsplit(url).password


def masked_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` shown as ``***``."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return url
    userinfo, _, host = authority.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{host}{slash}{path}"


def _check_ledger(settings: Settings) -> None:
    """Refuse the two forms of ledger credentials together: one Authorization per request."""
    _, sep, url = settings.ledger.partition("+")
    if sep and url_credentials(url)[1] is not None and settings.ledger_token:
        raise ConfigError(f"ledger and ledger_token: {LEDGER_CREDENTIALS_TWICE}")


def _check_strategies(settings: Settings) -> None:
    """The pipelined strategy needs a ledger that enforces declared
    dependencies: the node or a Sawtooth REST API, not a scabbard service."""
    if Strategy.PIPELINED in settings.queuer.strategies.kinds() and settings.ledger.startswith(
        "splinter+"
    ):
        raise ConfigError(
            "queuer.strategy pipelined needs a ledger that holds a batch until the "
            "transactions it depends on are committed (the node, or sawtooth+http://...); "
            f"{settings.ledger.split('://')[0]} does not: use serial or parallel for it"
        )
