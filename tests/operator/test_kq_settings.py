"""The operator's settings (``settings.OperatorSettings``): read once from the KQ_OPERATOR_*
environment variables, each problem one line naming its variable, the operator stopped at start
by any."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kafka_quorum_operator import MANAGER
from kafka_quorum_operator.settings import OperatorSettings, SettingsError


def test_the_defaults() -> None:
    settings = OperatorSettings.from_environment({"PATH": "/bin", "QUORUM_ELSEWHERE": "x"})
    assert (settings.interval_s, settings.refusal_backoff_s, settings.metrics_port) == \
        (5.0, 60.0, 0)
    assert settings.pod_selector == {"app.kubernetes.io/name": MANAGER}
    assert (settings.namespace, settings.identity, settings.api_server) == (None, None, None)
    assert (settings.cluster_domain, settings.pod_ids) == ("cluster.local", "fixed")


def test_the_chart_s_values() -> None:
    settings = OperatorSettings.from_environment({
        "KQ_OPERATOR_INTERVAL": "0.5", "KQ_OPERATOR_REFUSAL_BACKOFF": "0",
        "KQ_OPERATOR_METRICS_PORT": "9090", "KQ_OPERATOR_NAMESPACE": "ops",
        "KQ_OPERATOR_IDENTITY": "kqo-1", "KQ_OPERATOR_POD_SELECTOR": "a=b, c = d",
        "KQ_OPERATOR_CLUSTER_DOMAIN": "example.org", "KQ_OPERATOR_POD_IDS": "platform",
        "KQ_OPERATOR_API_SERVER": "http://127.0.0.1:1"})
    assert (settings.interval_s, settings.refusal_backoff_s, settings.metrics_port) == \
        (0.5, 0.0, 9090)
    assert settings.pod_selector == {"a": "b", "c": "d"}
    assert (settings.namespace, settings.identity, settings.cluster_domain, settings.pod_ids,
            settings.api_server) == ("ops", "kqo-1", "example.org", "platform",
                                     "http://127.0.0.1:1")


def test_an_empty_variable_is_an_unset_one() -> None:
    assert OperatorSettings.from_environment(
        {"KQ_OPERATOR_INTERVAL": "", "KQ_OPERATOR_POD_IDS": " "}) == \
        OperatorSettings.from_environment({})


@pytest.mark.parametrize(("name", "value", "line"), [
    ("KQ_OPERATOR_INTERVAL", "0", "KQ_OPERATOR_INTERVAL: Input should be greater than 0, "
                                  "got '0'"),
    ("KQ_OPERATOR_INTERVAL", "soon", "KQ_OPERATOR_INTERVAL: Input should be a valid number, "
                                     "unable to parse string as a number, got 'soon'"),
    ("KQ_OPERATOR_REFUSAL_BACKOFF", "-1", "KQ_OPERATOR_REFUSAL_BACKOFF: Input should be "
                                          "greater than or equal to 0, got '-1'"),
    ("KQ_OPERATOR_METRICS_PORT", "70000", "KQ_OPERATOR_METRICS_PORT: Input should be less than "
                                          "or equal to 65535, got '70000'"),
    ("KQ_OPERATOR_POD_SELECTOR", "a=b,=c", "KQ_OPERATOR_POD_SELECTOR: expected k=v,..., got "
                                           "'a=b,=c'"),
    ("KQ_OPERATOR_POD_IDS", "openshift", "KQ_OPERATOR_POD_IDS: expected one of fixed, "
                                         "platform, got 'openshift'"),
])
def test_a_wrong_value_is_one_line_naming_its_variable(name: str, value: str,
                                                       line: str) -> None:
    with pytest.raises(SettingsError) as raised:
        OperatorSettings.from_environment({name: value})
    assert str(raised.value) == line


def test_a_variable_of_no_setting_is_refused_and_every_problem_has_its_line() -> None:
    with pytest.raises(SettingsError) as raised:
        OperatorSettings.from_environment({"KQ_OPERATOR_INTERVALL": "5",
                                           "KQ_OPERATOR_METRICS_PORT": "x"})
    lines = str(raised.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("KQ_OPERATOR_METRICS_PORT: Input should be a valid integer")
    assert lines[1].startswith("KQ_OPERATOR_INTERVALL: not a setting of the operator (they "
                               "are KQ_OPERATOR_API_SERVER, ")


def test_the_operator_stops_at_start_on_a_wrong_setting() -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KQ_OPERATOR_")}
    found = subprocess.run(
        [sys.executable, "-m", "kafka_quorum_operator"], capture_output=True, text=True,
        timeout=60, check=False, env={**environment, "KQ_OPERATOR_INTERVAL": "-1",
                                      "KQ_OPERATOR_POD_IDS": "openshift"})
    assert found.returncode == 2, found.stderr
    assert found.stderr.splitlines() == [
        "kafka-quorum-operator: KQ_OPERATOR_INTERVAL: Input should be greater than 0, got '-1'",
        "kafka-quorum-operator: KQ_OPERATOR_POD_IDS: expected one of fixed, platform, got "
        "'openshift'"]
