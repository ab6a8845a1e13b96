"""The legacy fault-recovery policy: every failure restarts the whole job (paper §3.4).

"Previously, after the pretraining job failed, regardless of the specific fault type, the
job would restart once, meaning all nodes associated with the job required rescheduling."
Eq. [41] degenerates to ``MTTR = t_job``; the default is the paper's job-level recovery
time, 307 s.
"""

from __future__ import annotations

import attrs

from mofa_framework import hookimpl
from mofa_framework.limits import MAX_SECONDS, between
from mofa_framework.types import FaultRecoveryPolicy, option


@attrs.frozen(kw_only=True)
class JobRestartOptions:
    """``[fault.options]`` of the ``job-restart`` policy."""

    restart_s: float = option(307.0, validator=between(0.0, MAX_SECONDS, why="seconds"), doc="time to reschedule and restart the whole job, seconds")


def mttr_s(options: JobRestartOptions) -> float:
    """Eq. [41] with p_job = 1: every failure costs a whole-job restart."""
    return options.restart_s


POLICY = FaultRecoveryPolicy(
    name="job-restart",
    description="legacy: every failure reschedules all nodes and restarts the job (MTTR = restart_s, 307 s)",
    options_type=JobRestartOptions,
    mttr_s=mttr_s,
    lost_interval_fraction=0.5,
    equation="[41] with p_job = 1",
)


@hookimpl
def mofa_register_fault_recovery_policies():
    return [POLICY]
