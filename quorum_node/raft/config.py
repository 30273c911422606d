"""Timing configuration of the quorum, with Kafka's names and defaults (QuorumConfig)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class QuorumConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # controller.quorum.election.timeout.ms: each timer is uniform in [T, 2T).
    election_timeout_ms: int = Field(1000, ge=1)
    # controller.quorum.fetch.timeout.ms: follower -> Prospective; check-quorum is 1.5x;
    # BeginQuorumEpoch heartbeats every 0.5x.
    fetch_timeout_ms: int = Field(2000, ge=2)
    # controller.quorum.election.backoff.max.ms: cap of the EndQuorumEpoch successor back-off.
    election_backoff_max_ms: int = Field(1000, ge=0)
    # controller.quorum.request.timeout.ms
    request_timeout_ms: int = Field(2000, ge=1)
    # controller.quorum.retry.backoff.ms
    retry_backoff_ms: int = Field(20, ge=0)
    # controller.quorum.append.linger.ms
    append_linger_ms: int = Field(25, ge=0)
    # How long the leader parks a Fetch with nothing to return (Kafka: 500 ms).
    fetch_max_wait_ms: int = Field(500, ge=0)
    fetch_max_bytes: int = Field(8 * 1024 * 1024, ge=1)
    max_batch_bytes: int = Field(8 * 1024 * 1024, ge=1)

    @model_validator(mode="after")
    def _long_poll_fits_in_request(self) -> QuorumConfig:
        if self.fetch_max_wait_ms >= self.request_timeout_ms:
            raise ValueError(
                "fetch_max_wait_ms must be below request_timeout_ms, or every idle fetch times out"
            )
        return self

    @property
    def check_quorum_timeout_ms(self) -> int:
        return self.fetch_timeout_ms * 3 // 2

    @property
    def begin_quorum_interval_ms(self) -> int:
        return self.fetch_timeout_ms // 2
