"""Entry points of the commands whose dependencies are extras: they check the extra is installed
and otherwise say, in one line, which ``pip install`` brings it (exit 2), instead of failing with
an ImportError traceback. The quick start installs none of the extras."""

from __future__ import annotations

import importlib
import sys

from quorum_node.cli.common import MissingExtraError, fail, require_extra

OPERATOR_PROG = "kafka-quorum-operator"
OPERATOR_MODULES = ("kopf", "kubernetes", "cryptography")  # what the operator extra brings


def operator_main() -> int:
    """``kafka-quorum-operator``: the operator (``kafka_quorum_operator.__main__``), which
    needs the ``operator`` extra."""
    try:
        for module in OPERATOR_MODULES:
            require_extra(module, "operator")
    except MissingExtraError as error:
        return fail(OPERATOR_PROG, str(error), error.code)
    # Found by name once its dependencies are known to be there (an import at the top would
    # fail before the check could speak).
    operator_cli = importlib.import_module("kafka_quorum_operator.__main__")
    code: int = operator_cli.main()
    return code


if __name__ == "__main__":
    sys.exit(operator_main())
