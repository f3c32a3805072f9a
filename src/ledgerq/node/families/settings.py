"""``sawtooth_settings`` 1.0: on-chain settings by proposal and vote, as Sawtooth's
settings transaction processor.

State: each setting lives at :func:`make_settings_address` (``000000`` and
four 16-hex-digit parts, the SHA-256 of each of the first four dot-separated
parts of the key, missing parts hashed as empty strings) as a ``Setting``
protobuf listing its entries (more than one on a collision). Rules, in the
order checked, with the processor's messages:

* with ``sawtooth.settings.vote.authorized_keys`` set, a signer not in it is
  refused (``"<key>" is not authorized to change settings``);
* the payload is a ``SettingsPayload``: ``PROPOSE`` (a ``SettingProposal``)
  or ``VOTE`` (a ``SettingVote``); any other action is refused;
* a proposal is checked: nothing but ``authorized_keys`` may be set while it
  is empty; ``authorized_keys`` must not be set empty; the approval
  threshold must be an integer no larger than the number of authorized
  keys; ``sawtooth.settings.vote.proposals`` is read-only;
* with ``sawtooth.settings.vote.approval_threshold`` at 1 (its default) a
  proposal sets the setting at once; above 1 it becomes a candidate (id: the
  SHA-256 of the proposal's bytes; a duplicate is refused) carrying its
  proposer's ACCEPT, kept base64-encoded in
  ``sawtooth.settings.vote.proposals``;
* a vote names an open candidate, once per key; the setting is set once the
  ACCEPTs reach the threshold; the candidate is dropped then, or once the
  REJECTs reach it or every authorized key has voted.

Where the processor answers an internal error (a payload or a stored value
that does not parse: a validator then retries the transaction forever), the
node makes the transaction INVALID with that message. No events are emitted.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from google.protobuf.message import DecodeError, Message

from ledgerq.codec import settings_pb2
from ledgerq.node.families import Context, InvalidTransaction, TransactionLike

FAMILY_NAME = "sawtooth_settings"
NAMESPACE = "000000"
AUTHORIZED_KEYS = "sawtooth.settings.vote.authorized_keys"
APPROVAL_THRESHOLD = "sawtooth.settings.vote.approval_threshold"
PROPOSALS = "sawtooth.settings.vote.proposals"
_PARTS = 4
_PART_HEX = 16


def _short_hash(part: str) -> str:
    return hashlib.sha256(part.encode()).hexdigest()[:_PART_HEX]


def make_settings_address(key: str) -> str:
    parts = key.split(".", _PARTS - 1)
    parts += [""] * (_PARTS - len(parts))
    return NAMESPACE + "".join(_short_hash(p) for p in parts)


def _parse(message: Message, data: bytes, what: str) -> Any:
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise InvalidTransaction(f"Failed to unmarshal {what}: {exc}") from exc
    return message


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _quoted(text: str) -> str:
    """A string as the processor prints one in its messages (Rust's ``{:?}``)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SettingsHandler:
    family_name = FAMILY_NAME
    family_versions: tuple[str, ...] = ("1.0",)

    def apply(self, transaction: TransactionLike, context: Context) -> None:
        public_key = transaction.header.signer_public_key
        auth_keys = _split(_get_setting(context, AUTHORIZED_KEYS) or "")
        if auth_keys and public_key not in auth_keys:
            raise InvalidTransaction(f"{_quoted(public_key)} is not authorized to change settings")
        payload = _parse(settings_pb2.SettingsPayload(), transaction.payload, "SettingsTransaction")
        if payload.action == settings_pb2.SettingsPayload.PROPOSE:
            _propose(auth_keys, public_key, payload.data, context)
        elif payload.action == settings_pb2.SettingsPayload.VOTE:
            _vote(auth_keys, public_key, payload.data, context)
        else:
            raise InvalidTransaction("'action' must be one of {PROPOSE, VOTE} in 'Ballot' mode")


def _propose(auth_keys: list[str], public_key: str, data: bytes, context: Context) -> None:
    proposal = _parse(settings_pb2.SettingProposal(), data, "SettingsTransaction")
    proposal_id = hashlib.sha256(data).hexdigest()
    threshold = _threshold(context)
    _validate(auth_keys, proposal.setting, proposal.value)
    if threshold <= 1:
        _set_setting(context, proposal.setting, proposal.value)
        return
    candidates = _candidates(context)
    if any(c.proposal_id == proposal_id for c in candidates.candidates):
        raise InvalidTransaction(f"Duplicate proposal for {_quoted(proposal.setting)}")
    candidate = candidates.candidates.add(proposal_id=proposal_id)
    candidate.proposal.CopyFrom(proposal)
    candidate.votes.add(public_key=public_key, vote=settings_pb2.SettingVote.ACCEPT)
    _save_candidates(context, candidates)


def _vote(auth_keys: list[str], public_key: str, data: bytes, context: Context) -> None:
    vote = _parse(settings_pb2.SettingVote(), data, "SettingsTransaction")
    candidates = _candidates(context)
    found = [i for i, c in enumerate(candidates.candidates) if c.proposal_id == vote.proposal_id]
    if not found:
        raise InvalidTransaction(f"Proposal {_quoted(vote.proposal_id)} does not exist")
    index = found[0]
    candidate = candidates.candidates[index]
    if any(record.public_key == public_key for record in candidate.votes):
        raise InvalidTransaction(f"{_quoted(public_key)} already has voted")
    candidate.votes.add(public_key=public_key, vote=vote.vote)
    accepted = rejected = 0
    for record in candidate.votes:
        if record.vote == settings_pb2.SettingVote.ACCEPT:
            accepted += 1
        elif record.vote == settings_pb2.SettingVote.REJECT:
            rejected += 1
        else:
            raise InvalidTransaction("Transaction type unset")
    threshold = _threshold(context)
    if accepted >= threshold:
        _set_setting(context, candidate.proposal.setting, candidate.proposal.value)
        del candidates.candidates[index]
    elif rejected >= threshold or rejected + accepted == len(auth_keys):
        del candidates.candidates[index]
    _save_candidates(context, candidates)


def _validate(auth_keys: list[str], setting: str, value: str) -> None:
    if not auth_keys and setting != AUTHORIZED_KEYS:
        raise InvalidTransaction(f"Cannot set {_quoted(setting)} until authorized_keys is set.")
    if setting == AUTHORIZED_KEYS and not _split(value):
        raise InvalidTransaction("authorized_keys must not be empty.")
    if setting == APPROVAL_THRESHOLD:
        try:
            threshold = int(value)
        except ValueError:
            raise InvalidTransaction("approval_threshold must be an integer") from None
        if threshold > len(auth_keys):
            raise InvalidTransaction(
                "approval_threshold must be less than or equal to number of authorized_keys"
            )
    if setting == PROPOSALS:
        raise InvalidTransaction(f"Setting {PROPOSALS} is read-only")


def _threshold(context: Context) -> int:
    value = _get_setting(context, APPROVAL_THRESHOLD)
    if value is None:
        return 1
    try:
        return int(value)
    except ValueError:
        raise InvalidTransaction(f"Failed to parse {APPROVAL_THRESHOLD} value: {value!r}") from None


def _candidates(context: Context) -> Any:
    value = _get_setting(context, PROPOSALS)
    candidates = settings_pb2.SettingCandidates()
    if value is None:
        return candidates
    try:
        data = base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise InvalidTransaction(f"Cannot decode {PROPOSALS}: {exc}") from exc
    return _parse(candidates, data, "SettingCandidates")


def _save_candidates(context: Context, candidates: Any) -> None:
    _set_setting(context, PROPOSALS, base64.b64encode(candidates.SerializeToString()).decode())


def _read(context: Context, address: str) -> Any:
    setting = settings_pb2.Setting()
    data = context.get_state([address]).get(address)
    return setting if data is None else _parse(setting, data, "Setting")


def _get_setting(context: Context, key: str) -> str | None:
    for entry in _read(context, make_settings_address(key)).entries:
        if entry.key == key:
            return str(entry.value)
    return None


def _set_setting(context: Context, key: str, value: str) -> None:
    address = make_settings_address(key)
    setting = _read(context, address)
    for entry in setting.entries:
        if entry.key == key:
            entry.value = value
            break
    else:
        setting.entries.add(key=key, value=value)
    context.set_state({address: setting.SerializeToString()})
