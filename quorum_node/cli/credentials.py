"""The credential options that ``quorum-client`` and ``quorum-admin`` share: flags, or
``QUORUM_CLIENT_*`` environment variables (which ``quorum-node`` leaves alone)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quorum_node.security.client_credentials import ClientCredentials

# flag -> (argparse dest, environment variable, help)
_OPTIONS = {
    "--token-file": ("token_file", "QUORUM_CLIENT_TOKEN_FILE",
                     "a file holding a bearer token (its first line)"),
    "--ca-file": ("ca_file", "QUORUM_CLIENT_CA_FILE",
                  "the CA bundle (PEM) to trust; turns on https"),
    "--cert-file": ("cert_file", "QUORUM_CLIENT_CERT_FILE",
                    "a client certificate (PEM) for mutual TLS; turns on https"),
    "--key-file": ("key_file", "QUORUM_CLIENT_KEY_FILE", "the client certificate's key (PEM)"),
}


def add_credential_options(parser: argparse.ArgumentParser, *, top: bool = True) -> None:
    """Add the options; ``top=False`` for a subcommand (a value given before it is kept)."""
    group = parser.add_argument_group("credentials (for a secured quorum, docs/security.md)")
    for flag, (dest, env, text) in _OPTIONS.items():
        group.add_argument(flag, dest=dest, type=Path, metavar="FILE",
                           default=None if top else argparse.SUPPRESS,
                           help=f"{text} (default: ${env})" if top else argparse.SUPPRESS)


def credentials_from_args(args: argparse.Namespace,
                          environ: Mapping[str, str] | None = None) -> ClientCredentials:
    """Flags first, then the environment. Raises CredentialsError (a ValueError)."""
    environ = os.environ if environ is None else environ
    files: dict[str, Any] = {}
    for dest, env, _ in _OPTIONS.values():
        value = getattr(args, dest, None)
        if value is None and environ.get(env):
            value = Path(environ[env])
        files[dest] = value
    return ClientCredentials.from_files(**files)
