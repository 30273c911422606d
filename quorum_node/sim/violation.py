"""What a failed check reports: enough to reproduce it (seed, scenario) and to start debugging."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Violation:
    seed: int
    scenario: str
    invariant: str
    time_ms: int
    message: str

    def __str__(self) -> str:
        return (
            f"violation: seed={self.seed} scenario={self.scenario} invariant={self.invariant} "
            f"t={self.time_ms}ms: {self.message}"
        )
