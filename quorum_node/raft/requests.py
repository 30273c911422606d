"""Outbound request bookkeeping: one request in flight per destination, timeouts and back-off.

Every state transition resets it, so a response is accepted only if it answers the request in
flight to that destination in the current state (responses carry no PreVote flag or state: Kafka
disambiguates the same way)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RequestFailure(enum.Enum):
    """Why a request got no answer, as the transport tells it: the core treats a refusal, and a
    connection the peer ended, as news about the peer, and anything else as a lost message."""

    # Timed out, the handshake failed, or the answer was unusable: the peer may be alive and
    # merely slow, paused or cut off by a partition.
    UNANSWERED = "unanswered"
    # The peer ended the connection the request was on (it closed it, or reset it) before
    # answering: its process may have exited, or it may have closed one stream and still
    # listen. The next connection tells which, so the retry is not backed off (``on_failure``).
    CLOSED = "closed"
    # The connection was refused: nothing listens at the peer's address (its process is gone).
    REFUSED = "refused"


@dataclass(slots=True)
class _InFlight:
    correlation_id: int
    deadline_ms: int


class RequestManager:
    def __init__(self, request_timeout_ms: int, retry_backoff_ms: int) -> None:
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._in_flight: dict[int, _InFlight] = {}
        self._backoff_until: dict[int, int] = {}
        # Destinations retried at once after a CLOSED, and not answered since: a peer that
        # closes every stream it accepts is backed off from like any other failure.
        self._retried_at_once: set[int] = set()

    def is_ready(self, destination: int, now_ms: int) -> bool:
        return (
            destination not in self._in_flight
            and self._backoff_until.get(destination, 0) <= now_ms
        )

    def ready_at_ms(self, destination: int) -> int:
        """When the destination's back-off ends (0 if it is not backing off)."""
        return self._backoff_until.get(destination, 0)

    def has_in_flight(self, destination: int) -> bool:
        return destination in self._in_flight

    def any_in_flight(self) -> bool:
        return bool(self._in_flight)

    def on_sent(self, destination: int, correlation_id: int, now_ms: int) -> None:
        self._in_flight[destination] = _InFlight(correlation_id, now_ms + self._request_timeout_ms)

    def on_response(self, source: int, correlation_id: int, now_ms: int, ok: bool) -> bool:
        """Settle the request in flight to ``source``; False if the response was not expected."""
        if not self._settle(source, correlation_id):
            return False
        self._retried_at_once.discard(source)
        if not ok:
            self._backoff_until[source] = now_ms + self._retry_backoff_ms
        return True

    def on_failure(self, destination: int, correlation_id: int, now_ms: int,
                   failure: RequestFailure) -> bool:
        """Settle the request in flight to ``destination``, which got no answer; False if it
        was not the one in flight. The next request backs off, except the first after a
        CLOSED since the destination last answered: that one goes at once, since a dead
        peer's refusal (or a live one's answer) comes back within a round trip."""
        if not self._settle(destination, correlation_id):
            return False
        if failure is RequestFailure.CLOSED and destination not in self._retried_at_once:
            self._retried_at_once.add(destination)
        else:
            self._backoff_until[destination] = now_ms + self._retry_backoff_ms
        return True

    def _settle(self, destination: int, correlation_id: int) -> bool:
        in_flight = self._in_flight.get(destination)
        if in_flight is None or in_flight.correlation_id != correlation_id:
            return False
        del self._in_flight[destination]
        return True

    def back_off(self, destination: int, now_ms: int) -> None:
        """Wait ``retry_backoff_ms`` before the next request to ``destination`` (its last
        response was unusable)."""
        self._backoff_until[destination] = now_ms + self._retry_backoff_ms

    def expire(self, now_ms: int) -> list[int]:
        """Forget requests past their deadline (the destination is ready again); return them."""
        expired = [dest for dest, req in self._in_flight.items() if req.deadline_ms <= now_ms]
        for dest in expired:
            del self._in_flight[dest]
        return expired

    def reset(self) -> None:
        self._in_flight.clear()
        self._backoff_until.clear()
        self._retried_at_once.clear()

    def next_deadline_ms(self, now_ms: int) -> int | None:
        times = [req.deadline_ms for req in self._in_flight.values()]
        times += [until for until in self._backoff_until.values() if until > now_ms]
        return min(times) if times else None
