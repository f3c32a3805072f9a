"""BatchLists made by the real Sawtooth Python SDK parse and match their manifest.

The vectors are data made by the SDK, kept in ``tests/vectors/sawtooth-sdk/``
with the README saying how and a manifest of the expected results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cbor2
import pytest

from ledgerq.codec import decode_batch_list, encode_batch_list, parse_batch_list
from ledgerq.codec.intkey import FAMILY_NAME, FAMILY_VERSION, encode_payload, make_address

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "sawtooth-sdk"


def _manifests() -> list[Path]:
    return sorted(VECTORS.glob("*/manifest.json"))


@pytest.fixture(scope="module")
def manifests() -> list[tuple[Path, dict[str, Any]]]:
    found = _manifests()
    assert found, f"no Sawtooth SDK vectors under {VECTORS}"
    return [(path.parent, json.loads(path.read_text())) for path in found]


def test_every_vector_parses_to_the_manifest(manifests: list[tuple[Path, dict[str, Any]]]) -> None:
    services = 0
    for root, manifest in manifests:
        for service_id, service in manifest["services"].items():
            services += 1
            assert make_address(service["name"]) == service["address"]
            parsed = [
                batch
                for file in service["files"]
                for batch in decode_batch_list((root / file).read_bytes())
            ]
            assert [b.header_signature for b in parsed] == service["batch_ids"]
            for batch in parsed:
                assert batch.signer_public_key == manifest["signer"]
                for tx in batch.transactions:
                    h = tx.header
                    assert (h.family_name, h.family_version) == (FAMILY_NAME, FAMILY_VERSION)
                    assert h.inputs == h.outputs == (service["address"],)
                    fields = cbor2.loads(tx.payload)
                    assert fields["Name"] == service["name"]
                    # Our payload encoder writes the SDK's bytes exactly.
                    assert encode_payload(fields["Verb"], fields["Name"], fields["Value"]) == (
                        tx.payload
                    )
            tracked = [
                b
                for file in service["files"]
                for b in parse_batch_list((root / file).read_bytes(), service_id)
            ]
            assert [t.batch_header for t in tracked] == service["batch_ids"]
            assert {t.service_id for t in tracked} == {service_id}
    assert services >= 4


def test_vectors_re_encode_byte_for_byte(manifests: list[tuple[Path, dict[str, Any]]]) -> None:
    for root, _ in manifests:
        for file in sorted(root.rglob("*.batchlist")):
            data = file.read_bytes()
            assert encode_batch_list(decode_batch_list(data)) == data


def test_the_ordered_vectors_set_then_increment(
    manifests: list[tuple[Path, dict[str, Any]]],
) -> None:
    for root, manifest in manifests:
        if root.name != "ordered":
            continue
        for service in manifest["services"].values():
            verbs = [
                cbor2.loads(tx.payload)["Verb"]
                for file in service["files"]
                for batch in decode_batch_list((root / file).read_bytes())
                for tx in batch.transactions
            ]
            assert verbs[0] == "set"
            assert set(verbs[1:]) == {"inc"}
            assert len(verbs) == service["expected"]
