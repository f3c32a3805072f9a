from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SettingsPayload(_message.Message):
    __slots__ = ("action", "data")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSET: _ClassVar[SettingsPayload.Action]
        PROPOSE: _ClassVar[SettingsPayload.Action]
        VOTE: _ClassVar[SettingsPayload.Action]
    ACTION_UNSET: SettingsPayload.Action
    PROPOSE: SettingsPayload.Action
    VOTE: SettingsPayload.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    action: SettingsPayload.Action
    data: bytes
    def __init__(self, action: _Optional[_Union[SettingsPayload.Action, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class SettingProposal(_message.Message):
    __slots__ = ("setting", "value", "nonce")
    SETTING_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    setting: str
    value: str
    nonce: str
    def __init__(self, setting: _Optional[str] = ..., value: _Optional[str] = ..., nonce: _Optional[str] = ...) -> None: ...

class SettingVote(_message.Message):
    __slots__ = ("proposal_id", "vote")
    class Vote(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        VOTE_UNSET: _ClassVar[SettingVote.Vote]
        ACCEPT: _ClassVar[SettingVote.Vote]
        REJECT: _ClassVar[SettingVote.Vote]
    VOTE_UNSET: SettingVote.Vote
    ACCEPT: SettingVote.Vote
    REJECT: SettingVote.Vote
    PROPOSAL_ID_FIELD_NUMBER: _ClassVar[int]
    VOTE_FIELD_NUMBER: _ClassVar[int]
    proposal_id: str
    vote: SettingVote.Vote
    def __init__(self, proposal_id: _Optional[str] = ..., vote: _Optional[_Union[SettingVote.Vote, str]] = ...) -> None: ...

class SettingCandidate(_message.Message):
    __slots__ = ("proposal_id", "proposal", "votes")
    class VoteRecord(_message.Message):
        __slots__ = ("public_key", "vote")
        PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
        VOTE_FIELD_NUMBER: _ClassVar[int]
        public_key: str
        vote: SettingVote.Vote
        def __init__(self, public_key: _Optional[str] = ..., vote: _Optional[_Union[SettingVote.Vote, str]] = ...) -> None: ...
    PROPOSAL_ID_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    proposal_id: str
    proposal: SettingProposal
    votes: _containers.RepeatedCompositeFieldContainer[SettingCandidate.VoteRecord]
    def __init__(self, proposal_id: _Optional[str] = ..., proposal: _Optional[_Union[SettingProposal, _Mapping]] = ..., votes: _Optional[_Iterable[_Union[SettingCandidate.VoteRecord, _Mapping]]] = ...) -> None: ...

class SettingCandidates(_message.Message):
    __slots__ = ("candidates",)
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[SettingCandidate]
    def __init__(self, candidates: _Optional[_Iterable[_Union[SettingCandidate, _Mapping]]] = ...) -> None: ...

class Setting(_message.Message):
    __slots__ = ("entries",)
    class Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Setting.Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[Setting.Entry, _Mapping]]] = ...) -> None: ...
