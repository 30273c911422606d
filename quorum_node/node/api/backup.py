"""``GET /v1/backup`` (admin): a consistent, committed-only backup of this node's log directory,
streamed as a tar archive laid out as the backup format says, ``backup.json`` last
(``quorum_node.backup.capture``). Any node answers, leader or follower: a follower's committed
log is the quorum's. The response headers name the backup before its body is read
(``quorum_node.backup.endpoint``), so that a writer can choose where it goes. 503
``BACKUP_UNAVAILABLE`` when the node cannot take one now (no committed offset known yet, a failed
node, or ``backup.max.streams`` backups streaming already), in the one error body of
``quorum_node.node.api.http``.

A backup holds its files open (segments the node deletes meanwhile keep their disk space until
it ends) and a worker thread's turn per chunk: a reader that takes no chunk for
``backup.write.timeout.ms`` is cut off (its connection aborted, the files released), and at most
``backup.max.streams`` run at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from quorum_node.addresses import address_url
from quorum_node.backup.capture import PinnedBackup, in_thread_to_its_end, pin, prepare, stream
from quorum_node.backup.endpoint import (
    BACKUP_PATH,
    CLUSTER_ID_HEADER,
    CREATED_AT_HEADER,
    END_OFFSET_HEADER,
    NODE_ID_HEADER,
)
from quorum_node.backup.manifest import BackupError, rfc3339
from quorum_node.node.api.http import ApiError
from quorum_node.node.errors import ErrorCode
from quorum_node.node.runtime import QuorumNode

logger = logging.getLogger(__name__)


def backup_routes(node: QuorumNode) -> list[web.RouteDef]:
    streaming = 0  # backups between their pin and their end

    async def take_backup(request: web.Request) -> web.StreamResponse:
        nonlocal streaming
        limit = node.config.backup_max_streams
        if streaming >= limit:
            raise ApiError.of(ErrorCode.BACKUP_UNAVAILABLE,
                              f"{streaming} backups are being taken on this node already "
                              f"(backup.max.streams {limit}); retry later")
        streaming += 1
        try:
            return await _take_backup(node, request)
        finally:
            streaming -= 1

    return [web.get(BACKUP_PATH, take_backup)]


def _pin(node: QuorumNode) -> PinnedBackup:
    """Pin the backup's contents: one event-loop turn, so that nothing else runs meanwhile."""
    if node.failure is not None:
        raise BackupError(f"the node stopped after a failure: {node.failure}")
    scheme = node.config.controller_listener.scheme
    return pin(node.status(), node.log_dir, node.voters_at,
               {voter_id: address_url(scheme, *endpoint)
                for voter_id, endpoint in node.endpoints.items()})


async def _take_backup(node: QuorumNode, request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    try:
        pinned = _pin(node)
    except BackupError as error:
        raise ApiError.of(ErrorCode.BACKUP_UNAVAILABLE, str(error)) from None
    pinned_ms = (time.perf_counter() - started) * 1000
    try:
        await in_thread_to_its_end(prepare, pinned)
    except BaseException as error:
        pinned.close()
        if isinstance(error, BackupError):
            raise ApiError.of(ErrorCode.BACKUP_UNAVAILABLE, str(error)) from None
        raise
    logger.info("backup of node %d: offsets below %d pinned in %.3f ms of the event loop "
                "(%d segments), cut in %.3f s", pinned.node_id, pinned.end_offset,
                pinned_ms, len(pinned.segments), time.perf_counter() - started)
    response = web.StreamResponse(headers={
        "Content-Type": "application/x-tar",
        CLUSTER_ID_HEADER: pinned.cluster_id,
        NODE_ID_HEADER: str(pinned.node_id),
        CREATED_AT_HEADER: rfc3339(pinned.created_at),
        END_OFFSET_HEADER: str(pinned.end_offset)})
    chunks = stream(pinned)
    timeout_s = node.config.backup_write_timeout_ms / 1000
    sent = 0
    try:
        await response.prepare(request)
        async for chunk in chunks:
            try:
                async with asyncio.timeout(timeout_s):
                    await response.write(chunk)
            except TimeoutError:
                logger.warning("backup of node %d: the reader took no data for %.1f s "
                               "(backup.write.timeout.ms) after %d bytes: cut off",
                               pinned.node_id, timeout_s, sent)
                if request.transport is not None:
                    request.transport.abort()
                return response
            sent += len(chunk)
        await response.write_eof()
    finally:
        await chunks.aclose()
        pinned.close()  # also when the client went away before the stream began
    return response
