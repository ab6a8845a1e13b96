"""The fault-recovery policy plugins: three-level (eq. [41]) and the legacy job restart."""

import pytest

from mofa_framework.config import structure
from mofa_framework.errors import ConfigError


@pytest.fixture
def policies(mofa_pm):
    return mofa_pm.registry.policies


def test_both_policies_are_registered_by_their_plugins(mofa_pm, policies):
    assert {"three-level", "job-restart"} <= set(policies)
    assert mofa_pm.registry.provided_by[("policies", "three-level")] == "fault_three_level"
    assert mofa_pm.registry.provided_by[("policies", "job-restart")] == "fault_job_restart"


def test_three_level_default_mttr_is_eq41_with_the_papers_3_6_1_and_141_262_307(policies):
    p = policies["three-level"]
    # 0.3·141 + 0.6·262 + 0.1·307 = 42.3 + 157.2 + 30.7
    assert p.mttr_s(p.options_type()) == pytest.approx(230.2, abs=1e-9)
    assert p.lost_interval_fraction == 0.5


def test_three_level_options_from_a_job_file_table(policies):
    p = policies["three-level"]
    opts = structure({"process_probability": 0.5, "pod_probability": 0.4, "job_probability": 0.1,
                      "job_recovery_s": 600}, p.options_type, "job.toml: fault.options")
    # 0.5·141 + 0.4·262 + 0.1·600
    assert p.mttr_s(opts) == pytest.approx(70.5 + 104.8 + 60.0)


@pytest.mark.parametrize("table, fragments", [
    ({"pod_probability": 0.7}, ["process_probability", "pod_probability", "job_probability", "sum to 1"]),
    ({"process_probability": 0.0, "pod_probability": 0.0, "job_probability": 0.0}, ["sum to 1"]),
    ({"pod_probability": 1.5}, ["pod_probability", "1"]),
    ({"job_probability": -0.1}, ["job_probability"]),
    ({"pod_recovery_s": -1}, ["pod_recovery_s"]),
    ({"pod_probability": "a lot"}, ["pod_probability", "number"]),
    ({"process_prob": 0.3}, ["process_prob", "unknown key"]),
])
def test_three_level_bad_options_are_one_line_config_errors_naming_the_fields(policies, table, fragments):
    with pytest.raises(ConfigError) as exc:
        structure(table, policies["three-level"].options_type, "job.toml: fault.options")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("job.toml: fault.options")
    for f in fragments:
        assert f in msg


def test_job_restart_restarts_everything_on_every_failure(policies):
    p = policies["job-restart"]
    assert p.mttr_s(p.options_type()) == 307.0
    assert p.mttr_s(structure({"restart_s": 900}, p.options_type, "x")) == 900.0
    with pytest.raises(ConfigError, match="restart_s"):
        structure({"restart_s": -5}, p.options_type, "x")


def test_legacy_policy_is_slower_than_three_level(policies):
    three, legacy = policies["three-level"], policies["job-restart"]
    assert legacy.mttr_s(legacy.options_type()) > three.mttr_s(three.options_type())
