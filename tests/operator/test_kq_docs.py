"""docs/operator.md's reference tables against what they describe: every key of the chart's
values.yaml (type from values.schema.json, default from values.yaml), every field of the
KafkaQuorum CRD's spec (type and default from its schema), every condition the operator
writes, every alert of the chart's PrometheusRule and every Event reason the operator posts. A
key, field, condition, alert or Event added without its row fails here; the message has the row
to add."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kafka_quorum_operator.settings import OperatorSettings
from kafka_quorum_operator.status import CONDITION_TYPES

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operator.md"
CHART = ROOT / "helm" / "kafka-quorum-operator"
CRD = ROOT / "crds" / "kafkaquorums.kraft.quorum.dev.yaml"
OPERATOR = ROOT / "operator" / "kafka_quorum_operator"
# Spec fields of Kubernetes types: one row each, their fields not expanded.
KUBERNETES_TYPES = frozenset({"spec.resources", "spec.template.imagePullSecrets",
                              "spec.template.topologySpreadConstraints",
                              "spec.security.networkPolicy.allowFrom"})
NO_DEFAULT = "—"
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
               dict: "object"}


def table(heading: str) -> list[list[str]]:
    """The rows of the first table under ``heading`` in docs/operator.md, cells stripped."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table under {heading!r}"
    return rows[2:]  # past the header and its rule


def code(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return cell[1:-1]


def default_of(cell: str) -> Any:
    return NO_DEFAULT if cell == NO_DEFAULT else json.loads(code(cell))


def cell_of(value: Any) -> str:
    return NO_DEFAULT if value is NO_DEFAULT else f"`{json.dumps(value)}`"


def check(documented: list[list[str]], expected: Mapping[str, tuple[str, Any]],
          what: str) -> None:
    """Each row: name, type (the schema's, perhaps followed by words), default, meaning."""
    rows = {code(row[0]): row for row in documented}
    assert len(rows) == len(documented), f"a {what} documented twice"
    missing = [f"| `{name}` | {kind} | {cell_of(default)} | ... |"
               for name, (kind, default) in expected.items() if name not in rows]
    assert not missing, f"{what}s without a row in docs/operator.md:\n" + "\n".join(missing)
    assert not set(rows) - set(expected), f"{what}s that do not exist: " \
        f"{sorted(set(rows) - set(expected))}"
    for name, (kind, default) in expected.items():
        _, kind_cell, default_cell, meaning = rows[name]
        assert kind_cell.split()[0] == kind, (name, kind_cell, kind)
        assert default_of(default_cell) == default, (name, default_cell, default)
        assert meaning, f"{name}: no meaning"


def chart_values() -> dict[str, tuple[str, Any]]:
    """Every key of values.yaml, and of the schema, to the depth the schema describes: a mapping
    the schema gives properties is expanded, any other value is one key."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    found: dict[str, tuple[str, Any]] = {}

    def walk(value: Any, node: Mapping[str, Any], name: str) -> None:
        properties = node.get("properties") or {}
        if properties and (value is NO_DEFAULT or (isinstance(value, dict) and value)):
            given = value if isinstance(value, dict) else {}
            for key in [*given, *(k for k in properties if k not in given)]:
                walk(given.get(key, NO_DEFAULT), properties.get(key, {}), f"{name}.{key}")
            return
        kind = node.get("type") or _JSON_TYPES[type(value)]
        found[name.lstrip(".")] = (kind, value)

    walk(values, schema, "")
    return found


def spec_fields() -> dict[str, tuple[str, Any]]:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    found: dict[str, tuple[str, Any]] = {}

    def walk(node: Mapping[str, Any], name: str) -> None:
        found[name] = (node["type"], node.get("default", NO_DEFAULT))
        if name not in KUBERNETES_TYPES and node["type"] == "object":
            for key, child in (node.get("properties") or {}).items():
                walk(child, f"{name}.{key}")

    for key, child in spec["properties"].items():
        walk(child, f"spec.{key}")
    return found


def test_the_values_table_has_every_key_of_the_chart() -> None:
    expected = chart_values()
    assert {"image.repository", "metrics.prometheusRule.noLeaderFor", "resources",
            "nameOverride"} <= set(expected)
    check(table("## Chart values"), expected, "chart value")


def operator_settings() -> dict[str, tuple[str, Any]]:
    """Every setting by its variable: its type, and its default as the variable would give it
    (a selector as ``k=v,...``)."""
    schema = OperatorSettings.model_json_schema()["properties"]
    found: dict[str, tuple[str, Any]] = {}
    for name, field in OperatorSettings.model_fields.items():
        kinds = [k.get("type") for k in schema[field.alias or name].get("anyOf", [])] or \
            [schema[field.alias or name]["type"]]
        default = field.get_default(call_default_factory=True)
        if isinstance(default, dict):
            kinds, default = ["string"], ",".join(f"{k}={v}" for k, v in default.items())
        found[str(field.alias)] = (next(k for k in kinds if k != "null"),
                                   NO_DEFAULT if default is None else default)
    return found


def test_the_settings_table_has_every_setting_of_the_operator() -> None:
    expected = operator_settings()
    assert expected["KQ_OPERATOR_INTERVAL"] == ("number", 5.0)
    assert expected["KQ_OPERATOR_POD_SELECTOR"][0] == "string"
    check(table("## Operator settings"), expected, "operator setting")
    # The chart and the manifests set no variable of no setting.
    for source in (CHART / "templates" / "deployment.yaml", ROOT / "manifests" / "install.yaml"):
        given = set(re.findall(r"name: (KQ_OPERATOR_\w+)", source.read_text()))
        assert given and given <= set(expected), (source, given - set(expected))


def test_the_spec_table_has_every_field_of_the_crd() -> None:
    expected = spec_fields()
    assert {"spec.replicas", "spec.security.tls.certManager.issuerRef.kind",
            "spec.bootstrap.fromBackup.location"} <= set(expected)
    check(table("## KafkaQuorum spec"), expected, "spec field")


def test_every_condition_is_documented() -> None:
    # The section's tables: status fields, conditions, Events.
    rows = _tables_under("## Status and conditions")[1]
    assert [code(row[0]) for row in rows] == list(CONDITION_TYPES)
    status = (OPERATOR / "status.py").read_text()
    documented = " ".join(" ".join(row) for row in rows)
    # Every literal reason the operator writes for a condition.
    written = set(re.findall(r'"([A-Z][A-Za-z]+)" if', status) +
                  re.findall(r'else\s+"([A-Z][A-Za-z]+)"', status) +
                  re.findall(r'\(\w+, "([A-Z][A-Za-z]+)",', status) +
                  re.findall(r'"reason": "([A-Z][A-Za-z]+)"', status)) - {"True", "False"}
    assert {"MajorityOfVolumesLost", "UntrustedLeader", "NoneRefused", "InvalidSpec"} <= written
    missing = sorted(r for r in written if f"`{r}`" not in documented)
    assert not missing, missing


def test_every_alert_is_documented() -> None:
    rule = (CHART / "templates" / "prometheusrule.yaml").read_text()
    alerts = sorted(re.findall(r"- alert: (\w+)", rule))
    assert len(alerts) == 6
    assert sorted(code(row[0].split()[0]) for row in table("### Alerts")) == alerts


def test_every_event_reason_is_documented() -> None:
    source = "\n".join(p.read_text() for p in OPERATOR.glob("*.py"))
    reasons = set(re.findall(r'event\(\s*owner,\s*"([A-Z][A-Za-z]+)"', source))
    reasons |= set(re.findall(r'reason, message = "([A-Z][A-Za-z]+)"', source))
    reasons |= set(re.findall(r'"(Voter(?:Added|Removed))"', source))
    assert {"PodRejected", "CreateRefused", "BackupTaken", "VoterAdded"} <= reasons
    documented = " ".join(row[0] for row in _tables_under("## Status and conditions")[2])
    missing = sorted(r for r in reasons if f"`{r}`" not in documented)
    assert not missing, missing


def _tables_under(heading: str) -> list[list[list[str]]]:
    """Every table of the section under ``heading`` (to the next heading of any level)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        else:
            current = None
    return [rows[2:] for rows in tables]
