from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransactionHeader(_message.Message):
    __slots__ = ("batcher_public_key", "dependencies", "family_name", "family_version", "inputs", "nonce", "outputs", "payload_sha512", "signer_public_key")
    BATCHER_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    FAMILY_NAME_FIELD_NUMBER: _ClassVar[int]
    FAMILY_VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SHA512_FIELD_NUMBER: _ClassVar[int]
    SIGNER_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    batcher_public_key: str
    dependencies: _containers.RepeatedScalarFieldContainer[str]
    family_name: str
    family_version: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    nonce: str
    outputs: _containers.RepeatedScalarFieldContainer[str]
    payload_sha512: str
    signer_public_key: str
    def __init__(self, batcher_public_key: _Optional[str] = ..., dependencies: _Optional[_Iterable[str]] = ..., family_name: _Optional[str] = ..., family_version: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., nonce: _Optional[str] = ..., outputs: _Optional[_Iterable[str]] = ..., payload_sha512: _Optional[str] = ..., signer_public_key: _Optional[str] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("header", "header_signature", "payload")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    HEADER_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    header: bytes
    header_signature: str
    payload: bytes
    def __init__(self, header: _Optional[bytes] = ..., header_signature: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class TransactionList(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[Transaction]
    def __init__(self, transactions: _Optional[_Iterable[_Union[Transaction, _Mapping]]] = ...) -> None: ...
