"""The three-level fault-recovery policy of paper §3.4 (eq. [41]).

A failure is recovered at the cheapest level that can handle it:

* process level — the training processes restart in place (software crash); ``t_proc``
* pod level — only the faulty pod(s) are rescheduled (GPU / node / NIC fault); ``t_pod``
* job level — every node of the job is rescheduled (unknown cause); ``t_job``

so the mean time to repair one failure is eq. [41]::

    MTTR = p_proc·t_proc + p_pod·t_pod + p_job·t_job

The defaults are the paper's historical data "from thousands of GPUs": probabilities in the
ratio 3:6:1 and recovery times of 141 s, 262 s and 307 s, i.e. MTTR = 230.2 s. Every level
resumes from the last checkpoint, so the lost progress per failure is the policy's
``lost_interval_fraction`` (half an interval) whatever the level.
"""

from __future__ import annotations

import math

import attrs
from attrs import validators as v

from mofa_framework import hookimpl
from mofa_framework.limits import MAX_SECONDS, between
from mofa_framework.types import FaultRecoveryPolicy, option

_probability = v.and_(v.ge(0.0), v.le(1.0))
_seconds = between(0.0, MAX_SECONDS, why="seconds")


@attrs.frozen(kw_only=True)
class ThreeLevelOptions:
    """``[fault.options]`` of the ``three-level`` policy (paper §3.4, eq. [41])."""

    process_probability: float = option(0.3, validator=_probability,
                                        doc="share of failures recovered by restarting processes (3 of 3:6:1)")
    pod_probability: float = option(0.6, validator=_probability,
                                    doc="share of failures recovered by rescheduling the faulty pod(s) (6 of 3:6:1)")
    job_probability: float = option(0.1, validator=_probability,
                                    doc="share of failures that restart the whole job (1 of 3:6:1)")
    process_recovery_s: float = option(141.0, validator=_seconds, doc="process-level recovery time, seconds")
    pod_recovery_s: float = option(262.0, validator=_seconds, doc="pod-level recovery time, seconds")
    job_recovery_s: float = option(307.0, validator=_seconds, doc="job-level recovery time, seconds")

    def __attrs_post_init__(self):
        total = self.process_probability + self.pod_probability + self.job_probability
        if not math.isclose(total, 1.0, rel_tol=0.0, abs_tol=1e-6):
            raise ValueError(
                f"process_probability + pod_probability + job_probability must sum to 1, got "
                f"{self.process_probability:g} + {self.pod_probability:g} + {self.job_probability:g} = {total:g}")


def mttr_s(options: ThreeLevelOptions) -> float:
    """Eq. [41]: the probability-weighted mean recovery time of one failure, seconds."""
    return (options.process_probability * options.process_recovery_s
            + options.pod_probability * options.pod_recovery_s
            + options.job_probability * options.job_recovery_s)


POLICY = FaultRecoveryPolicy(
    name="three-level",
    description="process / pod / job-level recovery, historical ratio 3:6:1 at 141/262/307 s (MTTR 230.2 s)",
    options_type=ThreeLevelOptions,
    mttr_s=mttr_s,
    lost_interval_fraction=0.5,
    equation="[41]",
)


@hookimpl
def mofa_register_fault_recovery_policies():
    return [POLICY]
