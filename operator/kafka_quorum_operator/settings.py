"""The operator's own settings: its ``KQ_OPERATOR_*`` environment variables (the chart's
deployment and manifests/install.yaml set them), read once at start-up into one typed value.

A wrong value, or a ``KQ_OPERATOR_*`` variable the operator does not know (a misspelt name), stops
the operator at start with one line per problem naming the variable, rather than a pass that does
the wrong thing later. An empty variable is an unset one (a chart value left empty). The table of
docs/operator.md (Operator settings) lists them; tests/operator/test_kq_docs.py checks it does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from kafka_quorum_operator import MANAGER
from kafka_quorum_operator.keeper import CLUSTER_DOMAIN
from kafka_quorum_operator.resources import POD_IDS

PREFIX = "KQ_OPERATOR_"
# A voter change the leader refused (INVALID_REQUEST) is not sent again before this.
REFUSAL_BACKOFF_S = 60.0


class SettingsError(ValueError):
    """The environment's settings are wrong: one line per problem, each naming its variable."""


def _labels(text: str) -> dict[str, str]:
    """``k=v,k=v`` as a mapping (a malformed entry is an error at start, not a wrong policy)."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if not pairs or any(len(pair) != 2 or not pair[0].strip() for pair in pairs):
        raise ValueError("expected k=v,...")
    return {k.strip(): v.strip() for k, v in pairs}


class OperatorSettings(BaseModel):
    """Every setting, by its variable's name (the field's alias); what each means, and which
    chart value sets it: docs/operator.md, Operator settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    interval_s: float = Field(5.0, gt=0, alias="KQ_OPERATOR_INTERVAL")
    refusal_backoff_s: float = Field(REFUSAL_BACKOFF_S, ge=0, alias="KQ_OPERATOR_REFUSAL_BACKOFF")
    metrics_port: int = Field(0, ge=0, le=65535, alias="KQ_OPERATOR_METRICS_PORT")  # 0: none
    # Unset: the service account's namespace, else "default".
    namespace: str | None = Field(None, alias="KQ_OPERATOR_NAMESPACE")
    # Unset: the host name (and a random suffix in the Lease).
    identity: str | None = Field(None, alias="KQ_OPERATOR_IDENTITY")
    pod_selector: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": MANAGER},
        alias="KQ_OPERATOR_POD_SELECTOR")  # given as k=v,...
    cluster_domain: str = Field(CLUSTER_DOMAIN, min_length=1, alias="KQ_OPERATOR_CLUSTER_DOMAIN")
    pod_ids: str = Field("fixed", alias="KQ_OPERATOR_POD_IDS")  # one of resources.POD_IDS
    # Unset: the service account, else the kubeconfig.
    api_server: str | None = Field(None, alias="KQ_OPERATOR_API_SERVER")

    @field_validator("pod_selector", mode="before")
    @classmethod
    def _parse_selector(cls, value: Any) -> Any:
        return _labels(value) if isinstance(value, str) else value

    @field_validator("pod_ids")
    @classmethod
    def _known_pod_ids(cls, value: str) -> str:
        if value not in POD_IDS:
            raise ValueError(f"expected one of {', '.join(POD_IDS)}")
        return value

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        """The settings ``environ`` (default: the process's environment) gives. Raises
        SettingsError."""
        source = os.environ if environ is None else environ
        given = {name: value.strip() for name, value in source.items()
                 if name.startswith(PREFIX) and value.strip()}
        try:
            return cls.model_validate(given)
        except ValidationError as error:
            raise SettingsError("\n".join(_line(e) for e in error.errors())) from None


def _line(error: ErrorDetails) -> str:
    """One problem as one line: the variable, what is wrong, and the value given."""
    name = str(error["loc"][0]) if error["loc"] else "environment"
    if error["type"] == "extra_forbidden":
        known = ", ".join(sorted(str(f.alias) for f in OperatorSettings.model_fields.values()))
        return f"{name}: not a setting of the operator (they are {known})"
    context = error.get("ctx") or {}
    message = str(context["error"]) if error["type"] == "value_error" and "error" in context \
        else error["msg"]
    return f"{name}: {message}, got {error['input']!r}"
