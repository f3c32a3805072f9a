"""Small posts' signatures verified on a thread beside the event loop
(``decode_verify_thread``, ``ledgerq.ingest.decoding``).

The loop parses and checks a small BatchList with its signatures collected
(``verify=checks``), a thread verifies them; a list that fails anything is
decoded again in one piece, so what a client gets — the batches, or the
error with its rule and message — is exactly what the decode in one piece
gives, whatever is wrong with the list and wherever.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protowire import batch_header, batch_list, hand_batch, hand_tx, private_key, public_key, sign

from ledgerq.codec import Signer, decode_batch_list, encode_batch_list, parse_batch_list
from ledgerq.codec.intkey import make_intkey_batch
from ledgerq.codec.signing import SignatureCheck, signatures_valid
from ledgerq.config import load_settings
from ledgerq.errors import ConfigError, InvalidBatchError
from ledgerq.ingest import decoding
from ledgerq.ingest.decoding import BatchListDecoder, verify_thread_wanted

_SIGNER = Signer.from_hex("22" * 32)
ALICE = private_key(31)
BOB = private_key(32)


def _good(n: int) -> bytes:
    return encode_batch_list(
        [make_intkey_batch(_SIGNER, [("set", f"k{i}", i), ("inc", f"k{i}", 1)]) for i in range(n)]
    )


def _forged_tx_batch() -> bytes:
    """A batch whose transaction is signed by another key than its header names."""
    good = hand_tx(ALICE, b"p")
    forged = hand_tx(ALICE, b"p", header=good.header, signature=sign(BOB, good.header))
    return hand_batch(ALICE, [forged])[1]


def _forged_batch() -> bytes:
    """A batch whose header is signed by another key than its signer."""
    tx = hand_tx(ALICE, b"q")
    header = batch_header(public_key(ALICE), [tx.id])
    return hand_batch(ALICE, [tx], header=header, signature=sign(BOB, header))[1]


def _refusal(exc: InvalidBatchError) -> tuple[object, ...]:
    return ("refused", exc.rule, str(exc), exc.batch_id, exc.transaction_id)


async def _both(body: bytes) -> tuple[object, object, BatchListDecoder]:
    """What the decoder with the thread answers, and a decode in one piece."""
    threaded = BatchListDecoder(max_bytes=1 << 20, verify_thread=True)
    got: object
    want: object
    try:
        try:
            got = await threaded.decode(body, "svc")
        except InvalidBatchError as exc:
            got = _refusal(exc)
        try:
            want = parse_batch_list(body, "svc", max_bytes=1 << 20)
        except InvalidBatchError as exc:
            want = _refusal(exc)
        return got, want, threaded
    finally:
        threaded.close()


def test_collected_signatures_are_those_a_decode_checks() -> None:
    body = _good(3)
    checks: list[SignatureCheck] = []
    unverified = decode_batch_list(body, verify=checks)
    assert unverified == decode_batch_list(body)
    # A batch's signature, then each of its transactions'.
    assert [c[2] for c in checks] == [
        sig
        for b in unverified
        for sig in (b.header_signature, *(t.header_signature for t in b.transactions))
    ]
    assert signatures_valid(checks)


def test_a_forged_signature_is_collected_and_fails_the_check() -> None:
    checks: list[SignatureCheck] = []
    decode_batch_list(batch_list([_forged_tx_batch()]), verify=checks)
    assert not signatures_valid(checks)


async def test_a_valid_list_is_verified_on_the_thread_with_the_same_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = _good(20)
    assert len(body) < decoding.POOL_BYTES
    seen: list[str] = []

    def spy(checks: list[SignatureCheck]) -> bool:
        seen.append(threading.current_thread().name)
        return signatures_valid(checks)

    monkeypatch.setattr(decoding, "signatures_valid", spy)
    got, want, threaded = await _both(body)
    assert got == want
    assert threaded.thread_verified == 1
    assert seen and all(name.startswith("ledgerq-verify") for name in seen)


async def test_a_list_decoded_as_the_decoder_closes_is_verified_on_the_loop() -> None:
    decoder = BatchListDecoder(max_bytes=1 << 20, verify_thread=True)
    decoder.close()
    body = _good(3)
    assert await decoder.decode(body, "svc") == parse_batch_list(body, "svc")
    with pytest.raises(InvalidBatchError) as refused:
        await decoder.decode(batch_list([_forged_batch()]), "svc")
    assert refused.value.rule == "bad_batch_signature"


@pytest.mark.parametrize(
    "parts",
    [
        pytest.param(lambda: [_forged_batch()], id="bad batch signature"),
        pytest.param(lambda: [_forged_tx_batch()], id="bad transaction signature"),
        # A bad signature before a structural problem: the signature's error,
        # as the decode in one piece finds it first.
        pytest.param(lambda: [_forged_batch(), b"\x0a\x03abc"], id="signature, then malformed"),
        pytest.param(lambda: [b"\x0a\x03abc", _forged_batch()], id="malformed, then signature"),
    ],
)
async def test_a_refused_list_gets_the_error_of_a_decode_in_one_piece(parts: object) -> None:
    body = batch_list(parts())  # type: ignore[operator]
    got, want, threaded = await _both(body)
    assert isinstance(want, tuple) and want[0] == "refused"
    assert got == want
    assert threaded.thread_verified == 0


_BASES = [_good(1), _good(4), batch_list([_forged_tx_batch()]), batch_list([_forged_batch()])]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(_BASES)))
    for _ in range(draw(st.integers(0, 3))):
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        kind = draw(st.sampled_from(["flip", "truncate", "overwrite"]))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        else:
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[pos : pos + len(chunk)] = chunk
    return bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_any_list_gets_what_a_decode_in_one_piece_gives(body: bytes) -> None:
    got, want, _ = asyncio.run(_both(body))
    assert got == want


def test_auto_puts_a_thread_beside_a_gateway_of_one_process_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(decoding.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert verify_thread_wanted("auto", 1)
    assert not verify_thread_wanted("auto", 2)
    assert verify_thread_wanted("on", 2)
    assert not verify_thread_wanted("off", 1)
    monkeypatch.setattr(decoding.os, "sched_getaffinity", lambda _pid: {0})
    assert not verify_thread_wanted("auto", 1)


def test_the_setting_takes_auto_on_or_off_only() -> None:
    assert load_settings(environ={}).decode_verify_thread == "auto"
    on = load_settings(environ={"LEDGERQ_DECODE_VERIFY_THREAD": "ON"})
    assert on.decode_verify_thread == "on"
    with pytest.raises(ConfigError, match="decode_verify_thread must be auto, on or off"):
        load_settings(environ={"LEDGERQ_DECODE_VERIFY_THREAD": "sometimes"})
