import sys
from pathlib import Path

import pytest

# The multi-process harness of tests/node (proc_cluster), for the secured variant here.
sys.path.append(str(Path(__file__).parents[1] / "node"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many generated inputs the fuzz tests ran (the acceptance numbers of a long run)."""
    from fuzz_support import TALLY  # noqa: PLC0415

    if TALLY:
        terminalreporter.write_line(
            "fuzz tally: " + ", ".join(f"{k}={v}" for k, v in sorted(TALLY.items())))
