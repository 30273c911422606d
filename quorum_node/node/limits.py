"""Bounds on what a client may send: a request body's size, and how long it may take to send
it. (How long a request head may take is the server's keep-alive timeout, set by the runtime.)"""

from __future__ import annotations

import asyncio

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

