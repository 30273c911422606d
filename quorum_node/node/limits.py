"""Bounds on what a client may send: a request body's size, how long it may take to send it, and
how deeply its JSON may nest. (How long a request head may take is the server's keep-alive
timeout, set by the runtime.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

# Seconds a body may take to arrive, set by the runtime from http.read.timeout.ms.
READ_TIMEOUT_KEY: web.AppKey[float] = web.AppKey("read_timeout_s", float)
DEFAULT_READ_TIMEOUT_S = 30.0


class BodyRefused(Exception):
    """The body is too large (413) or too slow (408); the connection is closed after the
    answer, as the rest of the body would otherwise still have to be read."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise BodyRefused(413, f"a body of {request.content_length} bytes exceeds the limit of "
                               f"{limit} bytes")
    timeout_s = request.config_dict.get(READ_TIMEOUT_KEY, DEFAULT_READ_TIMEOUT_S)
    try:
        if request.content.is_eof():
            body = await request.read()  # all there already (a small body comes with its head)
        else:
            async with asyncio.timeout(timeout_s):
                body = await request.read()
    except TimeoutError:
        raise BodyRefused(408, f"the body did not arrive within {timeout_s:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise BodyRefused(413, "the body exceeds the server's request size limit") from None
    if len(body) > limit:
        raise BodyRefused(413, f"a body of {len(body)} bytes exceeds the limit of {limit} bytes")
    return body



# No request body of the APIs nests deeper than a few levels; a deeper one is refused before
# anything walks it recursively (the JSON parser stops at the interpreter's recursion limit with
# a RecursionError, which must never escape as a 500).
MAX_JSON_DEPTH = 64


class JsonRefused(ValueError):
    """The body is not JSON, or nests deeper than MAX_JSON_DEPTH; a one-line reason."""


def parse_json(body: bytes) -> Any:
    """The body's JSON document; raises JsonRefused."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise JsonRefused(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise JsonRefused(_too_deep()) from None
    # Fewer brackets than the limit cannot nest deeper than it: no walk for the usual body.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and _depth(document) > MAX_JSON_DEPTH:
        raise JsonRefused(_too_deep())
    return document


def _too_deep() -> str:
    return f"the body's JSON nests deeper than {MAX_JSON_DEPTH} levels"


def _depth(document: Any) -> int:
    """How deeply lists and objects nest in ``document`` (a scalar is 0), without recursion."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        pending.extend((child, depth + 1) for child in children
                       if isinstance(child, dict | list))
    return deepest
