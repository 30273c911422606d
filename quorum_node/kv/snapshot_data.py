"""A snapshot of the key-value store: its entries, their data records (below) and loading them
beside a store (``LoadedSnapshot``).
"""

from __future__ import annotations

import bisect
import itertools
import json
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import add, lt
from typing import NamedTuple, TypeGuard

from sortedcontainers import SortedList

from quorum_node.kv.ops import (
    KV_RECORD_KEY,
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    KvOpError,
    Put,
    check_key,
    check_value,
    decode_op,
)
from quorum_node.raft.records import Record

# What the store keeps of a key: its value, modification offset and version.
Entry = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    """A snapshot's map, built from its data records and not yet installed in a store
    (``KvStore.install_snapshot``): building it touches no store, so it can be done in a thread
    while the store goes on serving."""

    entries: dict[str, Entry]
    keys: SortedList[str]
    versions_from: int | None
    next_offset: int

    @classmethod
    def build(cls, records: Iterable[Record], next_offset: int) -> LoadedSnapshot:
        """Decode and check a snapshot's data records (``snapshot_data``), as of ``next_offset``
        (its end offset). Raises KvOpError for a snapshot the store cannot load."""
        entries: dict[str, Entry] = {}
        versions_from, chunks = snapshot_data(records, next_offset)
        for keys, values, mod_offsets, versions in chunks:
            entries.update(zip(keys, zip(values, mod_offsets, versions, strict=True),
                               strict=True))
        # The snapshot's records come in key order: sorting them again is a linear pass.
        return cls(entries, SortedList(entries), versions_from, next_offset)


class SnapshotEntries(NamedTuple):
    """What a snapshot of the store holds: its keys in order and its entries by key (copies of
    the store's, which goes on changing), and ``KvStore.versions_from``."""

    keys: list[str]
    entries: dict[str, Entry]
    versions_from: int | None

    @classmethod
    def of(cls, entries: dict[str, Entry], versions_from: int | None) -> SnapshotEntries:
        """The entries of a map that keeps no key order."""
        return cls(sorted(entries), entries, versions_from)


# --- snapshots -------------------------------------------------------------------------------
#
# A snapshot's data records (framed as KIP-630 has it: ``quorum_node.raft.snapshot_format``), in
# SNAPSHOT_FORMAT 1:
#
#   record 0   key SNAPSHOT_HEADER_KEY, value {"format": 1, "versions_from": OFFSET or null}
#   record 1.. key SNAPSHOT_ENTRIES_KEY, value a chunk of entries, every key in order (the keys
#              of a chunk follow those of the one before), each chunk little-endian:
#                count                  u32, at least 1
#                key sizes              count x u32, UTF-8 bytes
#                value sizes            count x u32, UTF-8 bytes
#                modification offsets   count x i64
#                versions               count x i64
#                keys                   their UTF-8 bytes back to back, then the values' alike
#
# A chunk is read with a few struct calls and slices of two decoded strings, not a JSON document
# a key: loading a large snapshot costs about what building its map does. Format 0, written by
# earlier releases and still read, has no header record: one JSON put a key
# ({"op": "put", "key", "value", "mod_offset", "version"}; the last two absent before versions
# were kept), after {"op": "versions", "from": OFFSET} once the quorum has had a txn. A release
# before format 1 refuses a format-1 snapshot as a whole (a leader's, or a backup's): it keeps
# its log, so every node is upgraded before a snapshot in it is sent to an older one.

SNAPSHOT_FORMAT = 1
SNAPSHOT_HEADER_KEY = b"\x00kv-snapshot"
SNAPSHOT_ENTRIES_KEY = b"\x00kv-entries"
# A chunk ends once its keys and values reach SNAPSHOT_CHUNK_CHARS characters or it holds
# SNAPSHOT_CHUNK_ENTRIES entries: at most 4 bytes a character before its last entry, which is
# within the key and value bounds, so that a chunk always fits a batch of the snapshot.
SNAPSHOT_CHUNK_CHARS = 256 * 1024
SNAPSHOT_CHUNK_ENTRIES = 8192
_CHUNK_COUNT = struct.Struct("<I")
_CHUNK_ENTRY_FIXED_BYTES = 4 + 4 + 8 + 8  # an entry's two sizes, offset and version
_LEGACY_CHUNK_RECORDS = 1024  # format 0's puts, decoded into chunks of this many


class SnapshotChunk(NamedTuple):
    """Entries of a snapshot, in key order, each checked as a put of the store is."""

    keys: list[str]
    values: list[str]
    mod_offsets: Sequence[int]
    versions: Sequence[int]


class SnapshotData(NamedTuple):
    """A snapshot's data as it is read: where versions are counted from, and its entries, each
    chunk decoded and checked as it is reached (a defect raises KvOpError then, naming the data
    record)."""

    versions_from: int | None
    chunks: Iterator[SnapshotChunk]


def snapshot_records(content: SnapshotEntries) -> Iterator[Record]:
    """A snapshot's data in SNAPSHOT_FORMAT: its header record, then the entries in key order, a
    chunk at a time as the snapshot is framed. Raises KvOpError for a key or value the store
    could not hold (the API refuses those before they are written)."""
    header = json.dumps({"format": SNAPSHOT_FORMAT, "versions_from": content.versions_from},
                        separators=(",", ":"))
    yield Record(value=header.encode("utf-8"), key=SNAPSHOT_HEADER_KEY)
    keys = content.keys
    if len(keys) != len(content.entries):  # a key the list lacks would be left out unseen
        raise ValueError(f"a snapshot's key list holds {len(keys)} keys and its map "
                         f"{len(content.entries)}")
    values, mod_offsets, versions, chars = _columns(keys, content.entries)
    start = 0
    while start < len(keys):
        # The first entry that brings the chunk to its characters, or its count of entries.
        end = min(start + SNAPSHOT_CHUNK_ENTRIES,
                  bisect.bisect_left(chars, chars[start] + SNAPSHOT_CHUNK_CHARS, start + 1),
                  len(keys))
        yield Record(value=encode_snapshot_chunk(keys[start:end], values[start:end],
                                                 mod_offsets[start:end], versions[start:end]),
                     key=SNAPSHOT_ENTRIES_KEY)
        start = end


def _columns(keys: list[str], entries: dict[str, Entry]
             ) -> tuple[list[str], list[int], list[int], list[int]]:
    """The values, modification offsets and versions of ``keys``, and the characters of the
    first i keys and values for each i. A block of keys at a time: a snapshot is written in a
    thread, and one call over a large map would hold the GIL, and the event loop, throughout."""
    values: list[str] = []
    mod_offsets: list[int] = []
    versions: list[int] = []
    chars = [0]
    for block in range(0, len(keys), SNAPSHOT_CHUNK_ENTRIES):
        block_keys = keys[block:block + SNAPSHOT_CHUNK_ENTRIES]
        block_values, block_mod_offsets, block_versions = zip(
            *map(entries.__getitem__, block_keys), strict=True)
        values += block_values
        mod_offsets += block_mod_offsets
        versions += block_versions
        chars += itertools.accumulate(map(add, map(len, block_keys), map(len, block_values)),
                                      initial=chars.pop())
    return values, mod_offsets, versions, chars


def encode_snapshot_chunk(keys: Sequence[str], values: Sequence[str],
                          mod_offsets: Sequence[int], versions: Sequence[int]) -> bytes:
    """One chunk of a snapshot's entries (see SNAPSHOT_FORMAT), given as columns, in the order
    given."""
    key_bytes, key_sizes = _utf8_joined(keys, check_key)
    value_bytes, value_sizes = _utf8_joined(values, check_value)
    if min(key_sizes) < 1 or max(key_sizes) > MAX_KEY_BYTES:
        for key in keys:
            check_key(key)
    if max(value_sizes) > MAX_VALUE_BYTES:
        for value in values:
            check_value(value)
    count = len(keys)
    fixed = struct.pack(f"<I{count}I{count}I{count}q{count}q", count, *key_sizes, *value_sizes,
                        *mod_offsets, *versions)
    return b"".join((fixed, key_bytes, value_bytes))


def _utf8_joined(texts: Sequence[str], check: Callable[[str], None]) -> tuple[bytes, list[int]]:
    """The UTF-8 bytes of ``texts`` back to back, and each one's size: one encoding of them all
    when they are ASCII (a byte a character), the usual case."""
    joined = "".join(texts)
    try:
        encoded = joined.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: check names it
        for text in texts:
            check(text)
        raise
    if len(encoded) == len(joined):
        return encoded, [len(text) for text in texts]
    each = [text.encode("utf-8") for text in texts]
    return encoded, [len(item) for item in each]


def snapshot_data(records: Iterable[Record], end_offset: int) -> SnapshotData:
    """Read a snapshot's data records, of either format, as of ``end_offset`` (its end: every
    modification offset is below it). Raises KvOpError, naming the data record, for anything
    the store could not load, here for the first record and while iterating for the others."""
    remaining = iter(records)
    first = next(remaining, None)
    if first is None:
        return SnapshotData(None, iter(()))
    if first.key == SNAPSHOT_HEADER_KEY:
        return SnapshotData(_snapshot_header(first), _chunks(remaining, end_offset))
    versions_from = _legacy_versions_from(first)
    if versions_from is None:
        remaining = itertools.chain((first,), remaining)
    return SnapshotData(versions_from,
                        _legacy_chunks(remaining, end_offset, 0 if versions_from is None else 1))


def _snapshot_header(record: Record) -> int | None:
    try:
        document = json.loads(record.value)
    except (ValueError, RecursionError):  # not UTF-8 or JSON, nested too deep
        raise KvOpError("data record 0: a snapshot's header is not JSON") from None
    if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
        found = document.get("format") if isinstance(document, dict) else document
        raise KvOpError(f"data record 0: a snapshot of format {found!r}, which this release "
                        f"does not read (it reads {SNAPSHOT_FORMAT} and 0)")
    versions_from = document.get("versions_from")
    if versions_from is not None and not _is_offset(versions_from):
        raise KvOpError(f"data record 0: a snapshot's header carries a bad versions_from "
                        f"{versions_from!r}")
    return versions_from


def _chunks(records: Iterator[Record], end_offset: int) -> Iterator[SnapshotChunk]:
    last_key = ""  # below every key: a key is never empty
    for index, record in enumerate(records, start=1):
        if record.key != SNAPSHOT_ENTRIES_KEY:
            raise KvOpError(f"data record {index} is not a chunk of entries: a snapshot of "
                            f"format {SNAPSHOT_FORMAT} holds only those after its header")
        try:
            chunk = decode_snapshot_chunk(record.value, end_offset)
        except KvOpError as error:
            raise KvOpError(f"data record {index}: {error}") from None
        keys = chunk.keys
        if not (last_key < keys[0] and all(map(lt, keys, itertools.islice(keys, 1, None)))):
            raise KvOpError(f"data record {index}: keys out of order or repeated")
        last_key = keys[-1]
        yield chunk


def decode_snapshot_chunk(payload: bytes, end_offset: int) -> SnapshotChunk:
    """A chunk's entries (see SNAPSHOT_FORMAT), checked: sizes that add up to the payload's,
    keys and values within the store's bounds and UTF-8, modification offsets below
    ``end_offset`` and versions from 1. Raises KvOpError."""
    size = len(payload)
    (count,) = _CHUNK_COUNT.unpack_from(payload) if size >= _CHUNK_COUNT.size else (0,)
    fixed = _CHUNK_COUNT.size + count * _CHUNK_ENTRY_FIXED_BYTES
    if count < 1 or fixed > size:
        raise KvOpError(f"a chunk of {size} bytes cannot hold the {count} entries it counts")
    key_sizes = struct.unpack_from(f"<{count}I", payload, 4)
    value_sizes = struct.unpack_from(f"<{count}I", payload, 4 + 4 * count)
    mod_offsets = struct.unpack_from(f"<{count}q", payload, 4 + 8 * count)
    versions = struct.unpack_from(f"<{count}q", payload, 4 + 16 * count)
    keys_end = fixed + sum(key_sizes)
    if keys_end + sum(value_sizes) != size:
        raise KvOpError(f"a chunk's entries do not add up to its {size} bytes")
    if (shortest := min(key_sizes)) < 1 or (longest := max(key_sizes)) > MAX_KEY_BYTES:
        bad = shortest if shortest < 1 else longest
        raise KvOpError(f"a chunk holds a key of {bad} bytes (1 to {MAX_KEY_BYTES})")
    if (longest := max(value_sizes)) > MAX_VALUE_BYTES:
        raise KvOpError(f"a chunk holds a value of {longest} bytes (at most {MAX_VALUE_BYTES})")
    if (lowest := min(mod_offsets)) < 0 or (highest := max(mod_offsets)) >= end_offset:
        bad = lowest if lowest < 0 else highest
        raise KvOpError(f"a chunk carries a mod_offset of {bad} (0 to {end_offset - 1})")
    if (lowest := min(versions)) < 1:
        raise KvOpError(f"a chunk carries a version of {lowest} (versions start at 1)")
    return SnapshotChunk(_utf8_split(payload, fixed, key_sizes, "key"),
                         _utf8_split(payload, keys_end, value_sizes, "value"),
                         mod_offsets, versions)


def _utf8_split(payload: bytes, start: int, sizes: Sequence[int], what: str) -> list[str]:
    """The texts of ``sizes`` UTF-8 bytes each, back to back from ``start``: sliced out of one
    decoded string when it is ASCII (a byte a character), the usual case."""
    bounds = list(itertools.accumulate(sizes, initial=0))
    end = start + bounds[-1]
    try:
        text = payload[start:end].decode("utf-8")
        if len(text) == end - start:
            return list(map(text.__getitem__, map(slice, bounds, bounds[1:])))
        view = memoryview(payload)[start:end]
        return [str(view[low:high], "utf-8") for low, high in itertools.pairwise(bounds)]
    except UnicodeDecodeError:
        raise KvOpError(f"a chunk holds a {what} that is not UTF-8 text") from None


def _legacy_chunks(records: Iterator[Record], end_offset: int,
                   first_index: int) -> Iterator[SnapshotChunk]:
    """Format 0's puts, in chunks of _LEGACY_CHUNK_RECORDS."""
    keys: list[str] = []
    values: list[str] = []
    mod_offsets: list[int] = []
    versions: list[int] = []
    for index, record in enumerate(records, start=first_index):
        try:
            op = decode_op(record)
        except KvOpError as error:
            raise KvOpError(f"data record {index} is not a valid key-value operation: "
                            f"{error}") from None
        if not isinstance(op, Put):
            what = "not a key-value operation" if op is None else f"a {type(op).__name__}"
            raise KvOpError(f"data record {index} is {what}: a snapshot of the store holds puts "
                            f"only")
        try:
            mod_offset, version = _legacy_meta(record, end_offset)
        except KvOpError as error:
            raise KvOpError(f"data record {index}: {error}") from None
        keys.append(op.key)
        values.append(op.value)
        mod_offsets.append(mod_offset)
        versions.append(version)
        if len(keys) == _LEGACY_CHUNK_RECORDS:
            yield SnapshotChunk(keys, values, mod_offsets, versions)
            keys, values, mod_offsets, versions = [], [], [], []
    if keys:
        yield SnapshotChunk(keys, values, mod_offsets, versions)


def _legacy_versions_from(record: Record) -> int | None:
    """The offset versions are counted from if ``record`` is a format-0 snapshot's first record
    saying so; None for any other record."""
    if record.key != KV_RECORD_KEY or not record.value.startswith(b'{"op":"versions"'):
        return None
    try:
        document = json.loads(record.value)
    except (ValueError, RecursionError):
        raise KvOpError("data record 0: a snapshot's versions record is not JSON") from None
    offset = document.get("from") if isinstance(document, dict) else None
    if not _is_offset(offset):
        raise KvOpError(f"data record 0: a snapshot's versions record carries a bad offset "
                        f"{offset!r}")
    return offset


def _legacy_meta(record: Record, end_offset: int) -> tuple[int, int]:
    """The modification offset and version a format-0 put carries. One written before they were
    kept carries neither: its keys count as written once, at the snapshot's last offset (what
    every replica loading that snapshot assumes alike)."""
    document = json.loads(record.value)
    mod_offset, version = document.get("mod_offset"), document.get("version")
    if mod_offset is None and version is None:
        return end_offset - 1, 1
    if (not _is_offset(mod_offset) or not _is_offset(version)
            or not mod_offset < end_offset or version < 1):
        raise KvOpError(f"a snapshot's put carries a bad mod_offset {mod_offset!r} or version "
                        f"{version!r}")
    return mod_offset, version


def _is_offset(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
