"""``kafka-quorum-operator`` (or ``python -m kafka_quorum_operator``): run the operator.

    kafka-quorum-operator [--namespace NS ...] [--liveness URL] [--verbose]

Watches every namespace unless ``--namespace`` is given; logs are JSON lines. The health
endpoint (``--liveness``) listens on every interface, IPv6 and IPv4, unless the URL names a host.
"""

from __future__ import annotations

import argparse
import socket
import sys

import kopf

from kafka_quorum_operator import handlers
from kafka_quorum_operator.serving import parse_endpoint
from kafka_quorum_operator.settings import OperatorSettings, SettingsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kafka-quorum-operator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch this namespace (repeatable); default: all namespaces")
    parser.add_argument("--liveness", default="http://:8080/healthz",
                        help="the health endpoint of the liveness and readiness probes; no "
                             "host: every interface (default %(default)s)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        parse_endpoint(args.liveness)
    except ValueError as error:
        parser.error(f"--liveness: {error}")
    try:
        settings = OperatorSettings.from_environment()
    except SettingsError as error:
        parser.exit(2, "".join(f"{parser.prog}: {line}\n" for line in str(error).splitlines()))
    handlers.STATE.settings = settings
    handlers.STATE.health_url = args.liveness
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.JSON)
    assert handlers.STATE is not None  # registers the handlers
    # Named explicitly: kopf would otherwise name the process after its user (getpass), which
    # fails for a uid without a passwd entry (OpenShift's arbitrary uids, any runAsUser the image
    # does not list).
    identity = settings.identity or socket.gethostname()
    kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace,
             identity=identity)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
