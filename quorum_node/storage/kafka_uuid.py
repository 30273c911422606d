"""Kafka's textual form of a UUID: the 16 bytes in URL-safe base64 without padding (22 chars).

Kafka writes cluster ids, ``directory.id`` and the voted directory id this way, so the files here
use it too; the canonical hyphenated form is accepted when reading.
"""

from __future__ import annotations

import base64
import binascii
import uuid

KAFKA_UUID_LENGTH = 22

# Kafka reserves the uuids whose 64 high bits are zero and low bits < 100 (DirectoryId: 0 is
# UNASSIGNED, 1 LOST, 2 MIGRATING); a real directory or cluster must never carry one.
_RESERVED_BELOW = 100


def to_kafka_string(value: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


def parse_uuid(text: str) -> uuid.UUID:
    """Parse Kafka's 22-character form or the canonical 36-character form; ValueError otherwise."""
    if len(text) == KAFKA_UUID_LENGTH:
        try:
            raw = base64.b64decode(text + "==", altchars=b"-_", validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{text!r} is not a base64url uuid") from exc
        # Reject non-canonical spellings (stray low bits in the last character).
        if to_kafka_string(uuid.UUID(bytes=raw)) != text:
            raise ValueError(f"{text!r} is not a canonical base64url uuid")
        return uuid.UUID(bytes=raw)
    if len(text) == 36:
        value = uuid.UUID(text)
        if str(value) != text.lower():
            raise ValueError(f"{text!r} is not a canonical uuid")
        return value
    raise ValueError(f"{text!r} is neither a 22-character base64url nor a 36-character uuid")


def is_reserved(value: uuid.UUID) -> bool:
    return value.int < _RESERVED_BELOW


def random_uuid() -> uuid.UUID:
    """A random (v4) uuid that is not reserved and whose Kafka form does not start with '-'
    (Kafka avoids those too: they read as options on a command line)."""
    while True:
        value = uuid.uuid4()
        if not is_reserved(value) and not to_kafka_string(value).startswith("-"):
            return value
