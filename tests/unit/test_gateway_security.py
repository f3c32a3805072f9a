"""The gateway's safe defaults and scoped tokens, over real HTTP on loopback.

Each test starts a gateway (``tests.operator_fakes.running_gateway``: the
real app and middlewares on 127.0.0.1, SQLite store, a ledger that commits)
and speaks to it with a real client: a token set → every read needs it; the
Host check; the security headers; ``/ready`` without connection details;
scoped tokens refusing and hiding what lies outside their services.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlencode

import aiohttp
import jsonschema_rs
import pytest

from ledgerq.codec import Signer, encode_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.errors import StoreError, StoreUnavailableError
from ledgerq.operator.openapi import load_spec
from tests.operator_fakes import batch_list, running_gateway

OCTET = {"Content-Type": "application/octet-stream"}
ADMIN = "admin-token-0123456789abcdef"
ACME = "acme-token-0123456789abcdef"
AUDIT = "audit-token-0123456789abcdef"
GLOBEX = "globex-token-0123456789abcdef"
TOKENS = [
    {"name": "acme", "token": ACME, "services": ["acme-*"]},
    {"name": "acme-audit", "token": AUDIT, "services": ["acme-*"], "access": "read"},
    {"name": "globex", "token": GLOBEX, "services": ["globex::*", "#none"], "access": "write"},
]


def bearer(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


async def post(
    http: aiohttp.ClientSession, url: str, service: str | None, token: str, n: int = 1
) -> tuple[int, dict[str, Any], list[str]]:
    body, ids = batch_list(n, service or "none")
    params = {"service_id": service} if service else {}
    async with http.post(
        f"{url}/batches", params=params, data=body, headers=bearer(token, **OCTET)
    ) as r:
        return r.status, await r.json(), ids


async def get(
    http: aiohttp.ClientSession, url: str, path: str, token: str | None, **params: str
) -> tuple[int, dict[str, Any]]:
    headers = bearer(token) if token else {}
    async with http.get(url + path, params=params, headers=headers) as r:
        return r.status, await r.json()


async def test_scoped_tokens_write_only_into_their_services() -> None:
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            status, _doc, _ids = await post(http, url, "acme-orders", ACME)
            assert status == 202
            status, doc, _ids = await post(http, url, "globex::ledger", ACME)
            assert status == 403
            assert doc["error"]["rule"] == "out_of_scope"
            assert "'globex::ledger'" in doc["error"]["message"]
            assert "acme" in doc["error"]["message"]
            assert ACME not in json.dumps(doc)
            # Read-only token: no post anywhere, even in its services.
            status, doc, _ids = await post(http, url, "acme-orders", AUDIT)
            assert status == 403
            assert "may not write" in doc["error"]["message"]
            # Write-only token: posts (also without service_id, into "#none"), reads nothing.
            status, _doc, _ids = await post(http, url, "globex::ledger", GLOBEX)
            assert status == 202
            status, _doc, _ids = await post(http, url, None, GLOBEX)
            assert status == 202
            status, doc, _ids = await post(http, url, None, ACME)
            assert status == 403
            assert "'#none'" in doc["error"]["message"]
            status, doc = await get(http, url, "/services", GLOBEX)
            assert status == 403
            assert "may not read" in doc["error"]["message"]
            async with http.post(f"{url}/batch_statuses", json=["x"], headers=bearer(GLOBEX)) as r:
                assert r.status == 403  # a read, whatever the method


async def test_scoped_tokens_see_only_their_services() -> None:
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            _s, _d, acme_ids = await post(http, url, "acme-orders", ACME, n=2)
            _s, _d, globex_ids = await post(http, url, "globex::ledger", GLOBEX, n=2)

            for token in (ACME, AUDIT):
                status, doc = await get(http, url, "/services", token)
                assert status == 200
                assert [s["service_id"] for s in doc["data"]] == ["acme-orders"]
                status, doc = await get(http, url, "/tracking/batches", token)
                assert status == 200
                assert {b["service_id"] for b in doc["data"]} == {"acme-orders"}
                assert len(doc["data"]) == 2
                # Another tenant's batches are as if never seen.
                status, doc = await get(
                    http, url, "/batch_statuses", token, id=",".join(acme_ids + globex_ids)
                )
                assert status == 200
                assert [e["status"] for e in doc["data"]] == ["PENDING"] * 2 + ["UNKNOWN"] * 2
                assert all("service_id" not in e for e in doc["data"][2:])
                # The POST form of the status read is a read too, scoped alike.
                async with http.post(
                    f"{url}/batch_statuses", json=acme_ids + globex_ids, headers=bearer(token)
                ) as r:
                    assert r.status == 200
                    data = (await r.json())["data"]
                    assert [e["status"] for e in data] == ["PENDING"] * 2 + ["UNKNOWN"] * 2
                status, doc = await get(http, url, f"/tracking/batches/{globex_ids[0]}", token)
                assert status == 404
                for path in ("/tracking/batches", "/batch_statuses"):
                    status, doc = await get(
                        http, url, path, token, service_id="globex::ledger", id=globex_ids[0]
                    )
                    assert status == 403, path
                    assert "'globex::ledger'" in doc["error"]["message"]
                status, doc = await get(http, url, "/dashboard/data", token)
                assert status == 200
                assert {b["service_id"] for b in doc["recent"]} == {"acme-orders"}
                assert doc["counts"] is None and doc["throughput"] is None
                status, doc = await get(http, url, "/metrics", token)
                assert status == 403
                assert "every service" in doc["error"]["message"]
                status, _doc = await get(http, url, "/instances", token)
                assert status == 200

            # The full token sees everything.
            status, doc = await get(http, url, "/services", ADMIN)
            assert {s["service_id"] for s in doc["data"]} == {"acme-orders", "globex::ledger"}
            status, doc = await get(http, url, "/dashboard/data", ADMIN)
            assert len(doc["recent"]) == 4 and doc["counts"] is not None
            async with http.get(f"{url}/metrics", headers=bearer(ADMIN)) as r:
                assert r.status == 200


async def test_a_conflict_never_names_a_service_outside_the_token() -> None:
    signer = Signer.generate()
    theirs = make_intkey_batch(signer, [("set", "g", 1)])
    mine = make_intkey_batch(signer, [("set", "a", 1)])
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:

            async def post_list(batches: list[Any], token: str) -> tuple[int, str]:
                async with http.post(
                    f"{url}/batches",
                    params={"service_id": "acme-orders"},
                    data=encode_batch_list(batches),
                    headers=bearer(token, **OCTET),
                ) as r:
                    return r.status, (await r.json())["error"]["message"]

            async with http.post(
                f"{url}/batches",
                params={"service_id": "globex::ledger"},
                data=encode_batch_list([theirs]),
                headers=bearer(GLOBEX, **OCTET),
            ) as r:
                assert r.status == 202
            # Globex's batch re-posted by acme, alone or beside a new one:
            # taken, but by whom is globex's business.
            for batches in ([theirs], [mine, theirs]):
                status, message = await post_list(batches, ACME)
                assert status == 409
                assert "another service" in message
                assert "globex" not in message
            # A token that sees the holder is told which service it is.
            status, message = await post_list([theirs], ADMIN)
            assert status == 409
            assert "'globex::ledger'" in message


async def test_services_paging_never_names_a_service_outside_the_token() -> None:
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            for service, token in (
                ("acme-a", ACME),
                ("acme-b", ACME),
                ("globex::x", GLOBEX),
                ("globex::y", GLOBEX),
                ("zeta-z", ADMIN),
            ):
                status, _doc, _ids = await post(http, url, service, token)
                assert status == 202
            # Page by page, limit 1, from wherever the caller starts: the
            # pages hold acme's services and the links only ever name them.
            for start, expected in ((None, ["acme-a", "acme-b"]), ("b", []), ("acme-b", [])):
                seen: list[str] = []
                params = {"limit": "1"} if start is None else {"limit": "1", "after": start}
                next_link: str | None = f"{url}/services?{urlencode(params)}"
                while next_link is not None:
                    async with http.get(next_link, headers=bearer(ACME)) as r:
                        assert r.status == 200
                        text = await r.text()
                    assert "globex" not in text and "zeta" not in text
                    doc = json.loads(text)
                    seen += [s["service_id"] for s in doc["data"]]
                    next_link = doc["paging"]["next"]
                assert seen == expected, start
            # The full token pages through every service, as before.
            status, doc = await get(http, url, "/services", ADMIN, limit="2", after="acme-b")
            assert [s["service_id"] for s in doc["data"]] == ["globex::x", "globex::y"]
            assert "after=globex%3A%3Ay" in doc["paging"]["next"]


async def test_the_dashboard_shows_the_ledgers_bursts_to_the_full_token_only() -> None:
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags, pipeline=False) as (url, gw):
        # A burst holds the last failure of whichever service: here another
        # tenant's circuit, as a Splinter URL names it.
        gw.health.problem(
            "submit",
            "globex::ledger",
            "HTTP 404",
            "http://splinter:8085/scabbard/globex/ledger/batches answered 404: no such service",
        )
        async with aiohttp.ClientSession() as http:
            for token in (ACME, AUDIT):
                async with http.get(f"{url}/dashboard/data", headers=bearer(token)) as r:
                    assert r.status == 200
                    text = await r.text()
                assert "globex" not in text
                doc = json.loads(text)
                assert doc["ledger_health"] is None
                assert doc["counts"] is None and doc["throughput"] is None
                _matches_spec(doc, "/dashboard/data")
            status, doc = await get(http, url, "/dashboard/data", ADMIN)
            assert status == 200
            assert doc["ledger_health"]["bursts"]["submit"]["cause"] == "HTTP 404"
            _matches_spec(doc, "/dashboard/data")


def _matches_spec(doc: Any, path: str) -> None:
    """``doc`` is what the served spec says a 200 of ``GET path`` holds."""
    spec = load_spec("gateway.openapi.json")
    op = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
    jsonschema_rs.validator_for({**op["schema"], "components": spec["components"]}).validate(doc)


async def test_scoped_tokens_alone_guard_every_route() -> None:
    async with running_gateway({"auth.tokens": TOKENS}, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            for path in (
                "/tracking/batches",
                "/services",
                "/instances",
                "/dashboard/data",
                "/metrics",
            ):
                status, _doc = await get(http, url, path, None)
                assert status == 401, path
            status, _doc = await get(http, url, "/services", "not-a-token-0123456789")
            assert status == 401
            status, _doc = await get(http, url, "/health", None)
            assert status == 200


async def test_a_host_not_allowed_is_refused_with_421() -> None:
    async with running_gateway({"allowed_hosts": "gw.example.com"}, pipeline=False) as (url, _):
        port = url.rsplit(":", 1)[1]
        async with aiohttp.ClientSession() as http:
            # DNS rebinding: a page named evil.example resolving to 127.0.0.1.
            for host in ("evil.example", f"evil.example:{port}", "127.0.0.2.nip.io"):
                async with http.get(f"{url}/tracking/batches", headers={"Host": host}) as r:
                    assert r.status == 421, host
                    doc = await r.json()
                    assert doc["error"]["code"] == 421
                    assert "allowed_hosts" in doc["error"]["message"]
            for host in ("localhost", f"127.0.0.1:{port}", "[::1]:80", "gw.example.com:443"):
                async with http.get(f"{url}/tracking/batches", headers={"Host": host}) as r:
                    assert r.status == 200, host
            # Probes answer whatever the Host (load balancers name instances by address).
            async with http.get(f"{url}/health", headers={"Host": "10.1.2.3:8080"}) as r:
                assert r.status == 200


async def test_links_come_from_public_url_or_the_checked_host_never_a_forged_one() -> None:
    async with running_gateway({"public_url": "https://gw.example.com/"}, pipeline=False) as (
        url,
        _gw,
    ):
        async with aiohttp.ClientSession() as http:
            status, doc, ids = await post(http, url, "svc", ADMIN)
            assert status == 202
            assert doc["link"].startswith("https://gw.example.com/batch_statuses?id=")
            status, doc = await get(http, url, "/batch_statuses", ADMIN, id=ids[0])
            assert doc["link"] == f"https://gw.example.com/batch_statuses?id={ids[0]}"
    async with running_gateway(pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            headers = {"X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https"}
            body, _ids = batch_list(1, "svc")
            async with http.post(
                f"{url}/batches?service_id=svc", data=body, headers={**OCTET, **headers}
            ) as r:
                assert r.status == 202
                # Forwarded headers are ignored unless trusted.
                assert (await r.json())["link"].startswith(f"{url}/batch_statuses?")
    flags = {"trust_forwarded": True, "allowed_hosts": "gw.example.com"}
    async with running_gateway(flags, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            body, _ids = batch_list(1, "svc")
            ok = {**OCTET, "X-Forwarded-Host": "gw.example.com", "X-Forwarded-Proto": "https"}
            async with http.post(f"{url}/batches?service_id=svc", data=body, headers=ok) as r:
                assert (await r.json())["link"].startswith("https://gw.example.com/batch_sta")
            bad = {**OCTET, "X-Forwarded-Host": "evil.example"}
            async with http.post(f"{url}/batches?service_id=svc", data=body, headers=bad) as r:
                assert r.status == 421


async def test_every_answer_carries_the_security_headers() -> None:
    async with running_gateway({"auth.token": ADMIN}, pipeline=False) as (url, _gw):
        async with aiohttp.ClientSession() as http:
            for path, expected in (
                ("/", 200),
                ("/static/dashboard.js", 200),
                ("/batches", 401),
                ("/static/nope.js", 404),
            ):
                async with http.get(url + path) as r:
                    assert r.status == expected, path
                    assert r.headers["X-Content-Type-Options"] == "nosniff", path
                    assert r.headers["X-Frame-Options"] == "DENY", path
                    assert r.headers["Referrer-Policy"] == "no-referrer", path
                    csp = r.headers["Content-Security-Policy"]
                    assert "frame-ancestors 'none'" in csp, path
                    assert "script-src 'self'" in csp and "unsafe-inline" not in csp, path


async def test_failures_carry_the_security_headers_too() -> None:
    async with running_gateway(pipeline=False) as (url, gw):

        async def unavailable(**_kwargs: Any) -> Any:
            raise StoreUnavailableError("the database is down")

        async def broken(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError("a bug")

        gw.store.list_batches = unavailable  # type: ignore[method-assign]
        gw.store.list_services = broken  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as http:
            for path, expected in (("/tracking/batches", 503), ("/services", 500)):
                async with http.get(url + path) as r:
                    assert r.status == expected, path
                    assert r.headers["X-Content-Type-Options"] == "nosniff", path
                    assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]


@pytest.mark.parametrize(
    ("failure", "expected"),
    [(StoreUnavailableError("the database is down"), 503), (StoreError("disk I/O error"), 500)],
)
async def test_store_failures_answer_a_status_the_spec_documents(
    failure: StoreError, expected: int
) -> None:
    async with running_gateway(pipeline=False) as (url, gw):

        async def failing(*_args: Any, **_kwargs: Any) -> Any:
            raise failure

        for name in (
            "add_batches",
            "get_batches_by_id",
            "get_batch_statuses_by_id",
            "list_batches",
            "list_services",
            "status_counts",
        ):
            setattr(gw.store, name, failing)
        spec = load_spec("gateway.openapi.json")
        body, ids = batch_list(1, "k")
        requests = [
            ("post", "/batches", "/batches", body, OCTET),
            ("get", "/tracking/batches", "/tracking/batches", None, {}),
            ("get", "/tracking/batches/{batch_id}", f"/tracking/batches/{ids[0]}", None, {}),
            ("get", "/batch_statuses", f"/batch_statuses?id={ids[0]}", None, {}),
            ("post", "/batch_statuses", "/batch_statuses", json.dumps(ids), {}),
            ("get", "/services", "/services", None, {}),
            ("get", "/metrics", "/metrics", None, {}),
            ("get", "/dashboard/data", "/dashboard/data", None, {}),
        ]
        async with aiohttp.ClientSession() as http:
            for method, route, path, data, headers in requests:
                if method == "post" and route == "/batch_statuses":
                    headers = {"Content-Type": "application/json"}
                async with http.request(method, url + path, data=data, headers=headers) as r:
                    assert r.status == expected, path
                    doc = await r.json()
                documented = spec["paths"][route][method]["responses"]
                assert str(expected) in documented, (method, route)
                assert documented[str(expected)]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"
                }
                assert doc["error"]["code"] == expected, path


async def test_ready_never_shows_the_database_address() -> None:
    async with running_gateway(pipeline=False) as (url, gw):

        async def broken() -> dict[str, int]:
            raise StoreError("connection to postgresql://ledgerq@db.internal:5432 failed")

        gw.store.status_counts = broken  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/ready") as r:
                assert r.status == 503
                text = await r.text()
    assert "db.internal" not in text and "ledgerq@" not in text
    assert "store unavailable" in text


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        ([{"name": "a", "services": ["x"]}], "a: token is missing"),
        ([{"name": "a", "token": "short"}], "a: token"),
        ([{"name": "a", "token": ACME, "services": []}], "non-empty list"),
        ([{"name": "a", "token": ACME, "access": "admin"}], "access 'admin'"),
        ([{"name": "a", "token": ACME, "servises": ["x"]}], "unknown field 'servises'"),
    ],
)
def test_a_malformed_scoped_token_is_refused_naming_it(
    entries: list[dict[str, Any]], problem: str
) -> None:
    from ledgerq.config import load_settings
    from ledgerq.errors import ConfigError

    with pytest.raises(ConfigError, match=r"auth\.tokens") as caught:
        load_settings({"auth.tokens": entries}, environ={}, config_file=None)
    assert problem in str(caught.value)


class _DownClaims:
    """A claims view whose database is down, its error naming the database."""

    async def list_instances(self, now: int | None = None) -> Any:
        raise StoreUnavailableError(DB_DOWN)

    async def claims_for(self, service_ids: Any) -> Any:
        raise StoreUnavailableError(DB_DOWN)


DB_DOWN = "connection to postgresql://ledgerq@db.internal:5432/ledgerq failed: timeout"


@pytest.mark.parametrize("failure", [StoreUnavailableError(DB_DOWN), StoreError(DB_DOWN)])
async def test_no_answer_names_the_store_whatever_fails(failure: StoreError) -> None:
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags, pipeline=False) as (url, gw):
        _s, _d, ids = await _post_one(url)

        async def failing(*_args: Any, **_kwargs: Any) -> Any:
            raise failure

        for name in (
            "add_batches",
            "get_batches_by_id",
            "get_batch_statuses_by_id",
            "list_batches",
            "list_services",
            "status_counts",
        ):
            setattr(gw.store, name, failing)
        gw.api.claims = _DownClaims()
        body, _new = batch_list(1, "acme-x")
        async with aiohttp.ClientSession() as http:
            for token in (ACME, ADMIN):
                for method, path, data in (
                    ("post", "/batches?service_id=acme-x", body),
                    ("get", "/tracking/batches", None),
                    ("get", f"/tracking/batches/{ids[0]}", None),
                    ("get", f"/batch_statuses?id={ids[0]}", None),
                    ("get", "/services", None),
                    ("get", "/instances", None),
                    ("get", "/dashboard/data", None),
                ):
                    headers = bearer(token, **OCTET)
                    async with http.request(method, url + path, data=data, headers=headers) as r:
                        text = await r.text()
                        assert r.status in (500, 503), (path, r.status, text)
                    for secret in ("db.internal", "ledgerq@", "5432", "postgresql"):
                        assert secret not in text, (path, text)


async def test_a_dashboard_read_the_store_does_not_answer_in_time_is_a_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ledgerq.operator import dashboard

    monkeypatch.setattr(dashboard, "STORE_WAIT_S", 0.05)
    async with running_gateway(pipeline=False) as (url, gw):
        await _post_one(url, ADMIN)

        async def stuck(*_args: Any, **_kwargs: Any) -> Any:
            await asyncio.sleep(30)

        gw.store.status_counts = stuck  # type: ignore[method-assign]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/dashboard/data") as r:
                assert r.status == 503
                doc = await r.json()
    assert doc["error"]["code"] == 503 and "retry later" in doc["error"]["message"]


async def _post_one(url: str, token: str = ACME) -> tuple[int, dict[str, Any], list[str]]:
    async with aiohttp.ClientSession() as http:
        return await post(http, url, "acme-orders", token)


class _OneInstance:
    async def list_instances(self, now: int | None = None) -> Any:
        from ledgerq.claims import InstanceInfo

        return [InstanceInfo("gw-1", 1, 2, "10.0.0.1:8080", 7, True)]

    async def claims_for(self, service_ids: Any) -> Any:
        return {}


async def test_a_scoped_token_sees_no_gateway_wide_counts() -> None:
    from ledgerq.gateway.bus import WorkerInfo

    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags, pipeline=False) as (url, gw):
        gw.api.claims = _OneInstance()
        gw.api.workers = lambda: [WorkerInfo(0, 1, 123, "gateway", "gw-1", 1, 0, accepted=42)]
        async with aiohttp.ClientSession() as http:
            status, doc = await get(http, url, "/instances", ACME)
            assert status == 200
            assert doc["data"][0]["claims"] is None and doc["workers"][0]["accepted"] is None
            _matches_spec(doc, "/instances")
            status, doc = await get(http, url, "/instances", ADMIN)
            assert doc["data"][0]["claims"] == 7 and doc["workers"][0]["accepted"] == 42


async def test_another_tenants_final_batch_costs_a_read_as_an_unknown_id_does() -> None:
    flags = {"auth.token": ADMIN, "auth.tokens": TOKENS}
    async with running_gateway(flags) as (url, gw):
        async with aiohttp.ClientSession() as http:
            _s, _d, ids = await post(http, url, "globex::ledger", GLOBEX)
            for _ in range(500):  # final, and in the shared cache of final answers
                status, doc = await get(http, url, "/batch_statuses", ADMIN, id=ids[0])
                if doc["data"][0]["status"] == "COMMITTED":
                    break
                await asyncio.sleep(0.02)
            assert gw.api.changes.final.get(ids[0]) is not None
            reads: list[int] = []
            original = gw.store.get_batch_statuses_by_id

            async def counted(batch_ids: Any) -> Any:
                reads.append(len(batch_ids))
                return await original(batch_ids)

            gw.store.get_batch_statuses_by_id = counted  # type: ignore[method-assign]
            for asked in (ids[0], "f" * 128):
                reads.clear()
                status, doc = await get(http, url, "/batch_statuses", ACME, id=asked)
                assert status == 200 and doc["data"][0]["status"] == "UNKNOWN"
                assert reads == [1], asked
