"""``sawtooth_settings`` 1.0 on the node: proposals, votes, authorized keys and the
approval threshold, with the settings processor's messages."""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator

import pytest

from ledgerq.codec import ParsedTransaction, Signer, make_batch, make_transaction, settings_pb2
from ledgerq.node import Node
from ledgerq.node.families.settings import (
    APPROVAL_THRESHOLD,
    AUTHORIZED_KEYS,
    PROPOSALS,
    make_settings_address,
)

ALICE, BOB, CAROL = Signer.generate(), Signer.generate(), Signer.generate()
_INPUTS = [make_settings_address(k) for k in (PROPOSALS, AUTHORIZED_KEYS, APPROVAL_THRESHOLD)]


def test_addresses_are_sawtooth_s() -> None:
    # As `sawtooth state list` shows it on a validator (sawtooth-core's docs).
    assert make_settings_address(AUTHORIZED_KEYS) == (
        "000000a87cb5eafdcca6a8cde0fb0dec1400c5ab274474a6aa82c12840f169a04216b7"
    )


def _txn(signer: Signer, action: int, data: bytes, setting: str = "") -> ParsedTransaction:
    addresses = [*_INPUTS, *([make_settings_address(setting)] if setting else [])]
    payload = settings_pb2.SettingsPayload(action=action, data=data).SerializeToString()
    return make_transaction(
        signer,
        family_name="sawtooth_settings",
        family_version="1.0",
        inputs=addresses,
        outputs=[make_settings_address(PROPOSALS), *addresses[3:]],
        payload=payload,
    )


def propose(signer: Signer, setting: str, value: str) -> ParsedTransaction:
    data = settings_pb2.SettingProposal(
        setting=setting, value=value, nonce=secrets.token_hex(8)
    ).SerializeToString()
    return _txn(signer, settings_pb2.SettingsPayload.PROPOSE, data, setting)


def vote(signer: Signer, proposal_id: str, accept: bool, setting: str) -> ParsedTransaction:
    choice = settings_pb2.SettingVote.ACCEPT if accept else settings_pb2.SettingVote.REJECT
    data = settings_pb2.SettingVote(proposal_id=proposal_id, vote=choice).SerializeToString()
    return _txn(signer, settings_pb2.SettingsPayload.VOTE, data, setting)


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    node = await Node.open(None)
    yield node
    await node.close()


async def run(node: Node, signer: Signer, txn: ParsedTransaction) -> tuple[str, str]:
    batch = make_batch(signer, [txn])
    await node.submit([batch])
    info = (await node.batch_statuses([batch.header_signature], wait=10))[batch.header_signature]
    message = info.invalid_transactions[0].message if info.invalid_transactions else ""
    return info.status, message


async def setting(node: Node, key: str) -> str | None:
    data = await node.get_state(make_settings_address(key))
    if data is None:
        return None
    stored = settings_pb2.Setting()
    stored.ParseFromString(data)
    return {e.key: e.value for e in stored.entries}.get(key)


async def candidates(node: Node) -> list[settings_pb2.SettingCandidate]:
    value = await setting(node, PROPOSALS)
    parsed = settings_pb2.SettingCandidates()
    if value:
        parsed.ParseFromString(base64.b64decode(value))
    return list(parsed.candidates)


async def test_the_first_setting_is_the_authorized_keys(node: Node) -> None:
    status, message = await run(node, ALICE, propose(ALICE, "my.setting", "1"))
    assert (status, message) == (
        "INVALID",
        'Cannot set "my.setting" until authorized_keys is set.',
    )
    _, message = await run(node, ALICE, propose(ALICE, AUTHORIZED_KEYS, " , "))
    assert message == "authorized_keys must not be empty."
    keys = f"{ALICE.public_key}, {BOB.public_key}"
    assert (await run(node, ALICE, propose(ALICE, AUTHORIZED_KEYS, keys)))[0] == "COMMITTED"
    assert await setting(node, AUTHORIZED_KEYS) == keys
    assert (await run(node, BOB, propose(BOB, "my.setting", "1")))[0] == "COMMITTED"
    assert await setting(node, "my.setting") == "1"
    _, message = await run(node, CAROL, propose(CAROL, "my.setting", "2"))
    assert message == f'"{CAROL.public_key}" is not authorized to change settings'
    _, message = await run(node, ALICE, propose(ALICE, PROPOSALS, "x"))
    assert message == f"Setting {PROPOSALS} is read-only"
    _, message = await run(node, ALICE, propose(ALICE, APPROVAL_THRESHOLD, "3"))
    assert message == "approval_threshold must be less than or equal to number of authorized_keys"
    _, message = await run(node, ALICE, propose(ALICE, APPROVAL_THRESHOLD, "two"))
    assert message == "approval_threshold must be an integer"


async def test_above_a_threshold_of_one_a_proposal_waits_for_votes(node: Node) -> None:
    keys = f"{ALICE.public_key},{BOB.public_key},{CAROL.public_key}"
    assert (await run(node, ALICE, propose(ALICE, AUTHORIZED_KEYS, keys)))[0] == "COMMITTED"
    assert (await run(node, ALICE, propose(ALICE, APPROVAL_THRESHOLD, "2")))[0] == "COMMITTED"

    proposal = propose(BOB, "x.y", "on")
    assert (await run(node, BOB, proposal))[0] == "COMMITTED"
    assert await setting(node, "x.y") is None
    [candidate] = await candidates(node)
    assert [(v.public_key, v.vote) for v in candidate.votes] == [
        (BOB.public_key, settings_pb2.SettingVote.ACCEPT)
    ]
    _, message = await run(node, BOB, vote(BOB, candidate.proposal_id, True, "x.y"))
    assert message == f'"{BOB.public_key}" already has voted'
    _, message = await run(node, BOB, vote(BOB, "nope", True, "x.y"))
    assert message == 'Proposal "nope" does not exist'
    assert (await run(node, CAROL, vote(CAROL, candidate.proposal_id, True, "x.y")))[0] == (
        "COMMITTED"
    )
    assert await setting(node, "x.y") == "on"
    assert await candidates(node) == []

    # Rejected: two REJECTs reach the threshold; the setting stays.
    assert (await run(node, BOB, propose(BOB, "x.y", "off")))[0] == "COMMITTED"
    [candidate] = await candidates(node)
    for signer in (ALICE, CAROL):
        assert (await run(node, signer, vote(signer, candidate.proposal_id, False, "x.y")))[0] == (
            "COMMITTED"
        )
    assert await setting(node, "x.y") == "on" and await candidates(node) == []


async def test_a_payload_that_does_not_parse_is_invalid(node: Node) -> None:
    txn = make_transaction(
        ALICE,
        family_name="sawtooth_settings",
        family_version="1.0",
        inputs=_INPUTS,
        outputs=_INPUTS[:1],
        payload=b"\xff\xff\xff",
    )
    status, message = await run(node, ALICE, txn)
    assert status == "INVALID" and message.startswith("Failed to unmarshal SettingsTransaction")
    unset = _txn(ALICE, settings_pb2.SettingsPayload.ACTION_UNSET, b"")
    assert (await run(node, ALICE, unset))[1] == (
        "'action' must be one of {PROPOSE, VOTE} in 'Ballot' mode"
    )
