"""Kafka's wire framing of the controller listener, on the message types of ``kio`` (generated
from Kafka's own JSON schemas): a frame is a big-endian int32 size and that many bytes; a
request is its header (v1, or the flexible v2 with tagged fields, as the request's version
says) and its body; a response its header (v0, or v1 for a flexible one; ApiVersions always
v0) and its body.

Bounds: a frame over ``max_bytes`` is refused before it is buffered (the caller closes the
connection), and a frame whose bytes do not parse whole as the request its header names is
refused too (``MalformedRequest``, one line saying why)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from kio.serial.readers import read_int16, read_int32
from kio.serial.writers import write_int32
from kio.static.primitive import i32

SIZE_BYTES: Final = 4
# The common prefix of every request header: api key, api version, correlation id.
_PREFIX_BYTES: Final = 8


class MalformedRequest(Exception):
    """A frame that is not a request this server can read; the message is one line."""


@dataclass(frozen=True, slots=True)
class RequestFrame:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request entity


def frame_size(prefix: bytes) -> int:
    """The size of the frame whose first four bytes are ``prefix``."""
    size, _ = read_int32(prefix, 0)
    return int(size)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame, read before its schema is
    known (every request header begins with them)."""
    if len(frame) < _PREFIX_BYTES:
        raise MalformedRequest(f"a request of {len(frame)} bytes has no header")
    api_key, _ = read_int16(frame, 0)
    api_version, _ = read_int16(frame, 2)
    correlation_id, _ = read_int32(frame, 4)
    return int(api_key), int(api_version), int(correlation_id)


def read_request(frame: bytes) -> RequestFrame:
    """The request in ``frame`` (without its size). Raises MalformedRequest."""
    api_key, api_version, correlation_id = peek_header(frame)
    try:
        schema = load_request_schema(api_key, api_version)
    except Exception as error:  # kio's index: an api key or version it has no schema of
        raise MalformedRequest(f"no schema of api key {api_key} version {api_version}"
                               ) from error
    try:
        # kio's readers answer (value, bytes read).
        header, header_bytes = entity_reader(schema.__header_schema__)(frame, 0)
        body, body_bytes = entity_reader(schema)(frame, header_bytes)
    except Exception as error:  # kio's readers raise several kinds on bad bytes
        raise MalformedRequest(f"api key {api_key} version {api_version}: unreadable "
                               f"({type(error).__name__}: {error})") from error
    left = len(frame) - header_bytes - body_bytes
    if left:
        raise MalformedRequest(f"api key {api_key} version {api_version}: {left} bytes after "
                               f"the request")
    return RequestFrame(api_key, api_version, correlation_id, header.client_id, body)


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The frame of ``response`` (a kio response entity) answering ``correlation_id``."""
    header_schema = type(response).__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_schema)(buffer, header_schema(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(buffer, response)
    payload = buffer.getvalue()
    framed = io.BytesIO()
    write_int32(framed, i32(len(payload)))
    framed.write(payload)
    return framed.getvalue()


def encode_request(correlation_id: int, client_id: str | None, request: Any) -> bytes:
    """The frame of ``request`` (a kio request entity): what a client sends."""
    schema = type(request)
    header_schema = schema.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_schema)(buffer, header_schema(
        request_api_key=schema.__api_key__, request_api_version=schema.__version__,
        correlation_id=i32(correlation_id), client_id=client_id))
    entity_writer(schema)(buffer, request)
    payload = buffer.getvalue()
    framed = io.BytesIO()
    write_int32(framed, i32(len(payload)))
    framed.write(payload)
    return framed.getvalue()


def read_response(schema: Any, frame: bytes) -> tuple[int, Any]:
    """(correlation id, response) of a response frame (without its size), as ``schema``."""
    header, header_bytes = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, header_bytes)
    return int(header.correlation_id), body
