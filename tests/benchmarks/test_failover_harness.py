"""The failover bench's harness: the ledger cut that forces slow-path samples, and the
share it waits for before the kill."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from bench._cluster import LedgerCut
from bench.failover import Sample, _balanced, _late


class _Ledger(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    posted: ClassVar[list[bytes]] = []

    def do_GET(self) -> None:
        self._answer(b"got")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.posted.append(body)
        self._answer(b"accepted")

    def _answer(self, body: bytes) -> None:
        self.send_response(202 if self.command == "POST" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ledger() -> Iterator[str]:
    _Ledger.posted = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ledger)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def _request(sock: socket.socket, method: str, body: bytes = b"") -> None:
    sock.sendall(
        f"{method} /batches HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _answer(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    data = b""
    try:
        while not data.endswith((b"got", b"accepted")):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        pass
    return data


def _wait_posted(count: int) -> None:
    for _ in range(100):
        if len(_Ledger.posted) >= count:
            return
        threading.Event().wait(0.02)


def test_relays_both_ways_until_cut_then_withholds_answers_and_half_the_posts(
    ledger: str,
) -> None:
    cut = LedgerCut(ledger)
    try:
        even, odd = _connect(cut.url), _connect(cut.url)
        _request(even, "GET")
        assert _answer(even, 5).endswith(b"got")
        _request(odd, "POST", b"before")
        assert _answer(odd, 5).endswith(b"accepted")
        assert _Ledger.posted == [b"before"]

        cut.cut()
        _request(even, "POST", b"reaches the ledger")
        _request(odd, "POST", b"never reaches it")
        _wait_posted(2)
        # Connection 0 (even): the POST goes through, its answer does not come back.
        assert _Ledger.posted == [b"before", b"reaches the ledger"]
        assert _answer(even, 0.5) == b""
        # Connection 1 (odd): the POST is dropped, so no answer either.
        assert _answer(odd, 0.2) == b""
        assert cut.posts_dropped == 1
        assert cut.chunks_withheld >= 1
        # A new connection after the cut: reads get no answer.
        late = _connect(cut.url)
        _request(late, "GET")
        assert _answer(late, 0.5) == b""
        for sock in (even, odd, late):
            sock.close()
    finally:
        cut.close()


def test_balanced_needs_every_instance_at_half_its_share() -> None:
    services = [f"s{i}" for i in range(90)]
    even = {"a": services[:30], "b": services[30:60], "c": services[60:]}
    assert _balanced(even, 90)
    assert _balanced({"a": services[:50], "b": services[50:75], "c": services[75:]}, 90)
    assert not _balanced({"a": services[:70], "b": services[70:80], "c": services[80:]}, 90)
    assert not _balanced({"a": services[:45], "b": services[45:]}, 90)


def test_the_late_samples_are_named_with_their_claim_and_first_write() -> None:
    on_time = Sample("svc-1", False, resumed_s=5.2, claimed_s=5.0, taker="gw-b-2")
    late = Sample(
        "svc-2",
        False,
        resumed_s=6.4,
        claimed_s=5.0,
        writes=[(False, "marked submitted")],
        taker="gw-c-3",
    )
    never = Sample("svc-3", True, left="b3", claimed_s=5.5, taker="gw-b-2")
    [line] = _late([on_time, late, never], target=6.0)
    assert "svc-1" not in line
    assert line.index("svc-2") < line.index("svc-3")
    assert "svc-2 (fast, by gw-c-3: claimed 5.00 s, first write 6.40 s (marked submitted))" in line
    assert "svc-3 (slow, by gw-b-2: claimed 5.50 s, first write none seen)" in line
    assert _late([on_time], target=6.0) == []
    many = [Sample(f"svc-{i}", False, resumed_s=7.0 + i) for i in range(12)]
    [capped] = _late(many, target=6.0, most=10)
    assert capped.endswith("; 2 more.")


def test_the_primary_lost_rows_count_what_the_outage_met() -> None:
    from bench._pg_failover import Attempt, PrimaryLostRun
    from bench.failover import _primary_lost_row

    def run(accepting: dict[str, float | None]) -> PrimaryLostRun:
        attempts = [
            Attempt("gw-a-1", "s", 9.0, 10.5, 202),  # answered at the kill: not counted
            Attempt("gw-a-1", "s", 10.5, 11.0, 202),  # under way at the kill
            Attempt("gw-b-2", "s", 11.0, 11.1, 503),
            Attempt("gw-b-2", "s", 12.0, 14.5, 503),  # past the bound
            Attempt("gw-a-1", "s", 13.0, 43.0, 0, "timed out"),  # no answer
            Attempt("gw-a-1", "s", 16.0, 16.1, 202),  # after the promotion
        ]
        return PrimaryLostRun(
            attempts=attempts,
            killed_at=10.6,
            promoted_at=15.0,
            accepting_again=accepting,
            problems=[],
            same_processes=True,
            bound_s=2.0,
            batches=6,
            elapsed_s=40.0,
        )

    row = _primary_lost_row(4.4, run({"a": 1.1, "b": 2.9}))
    assert row[1:4] == [4, "2 / 1", 1]  # under way, 503 / 202, not answered
    assert row[5] == "2 / 4"  # answered within the bound
    assert row[7] == "yes"  # both accepting again within 3 s
    assert _primary_lost_row(4.4, run({"a": 1.1, "b": 3.2}))[7] == "no"
    assert _primary_lost_row(4.4, run({"a": 1.1, "b": None}))[7] == "no"
