"""The Python API: a :class:`Predictor` assembled from plugins, and :func:`predict`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import numpy as np

from .batch import PRECISIONS, CandidateBatch
from .config import TrainingJob, job_from_dict, jobs_to_batch, load_job as _load_job, own_network
from .engine import STAGES, Prediction, evaluate
from .errors import ConfigError, PluginError
from .invariants import feasible_result, feature_rules, schedule_rules
from .manager import MofaPluginManager, get_plugin_manager
from .types import ConstraintResult, HardwareProfile, ModelSpec
from .units import GIB


@attrs.frozen(kw_only=True)
class PredictionResult:
    """The prediction for one job: the headline numbers and both breakdowns."""

    job: str
    model: str
    hardware: str
    num_gpus: int
    parallel: Mapping[str, Any]
    schedule: str
    features: tuple[str, ...]
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    #: against the peak of ``mfu_precision``: the fastest format the GEMMs run in (the row's
    #: precision, or fp8/fp4 when a feature such as ``fp8`` runs them there)
    mfu: float
    hfu: float
    peak_memory_gib: float
    hbm_gib: float
    #: the peak fits the HBM and the offloaded host memory fits the node's CPU memory per GPU
    fits_in_memory: bool
    #: seconds per component; sums to step_time_s
    breakdown: Mapping[str, float]
    #: GiB per component on the worst stage (``host`` is CPU memory, outside the peak)
    memory_breakdown: Mapping[str, float]
    #: seconds per pipeline phase on the critical stage
    pipeline_phases: Mapping[str, float]
    provenance: Mapping[str, str]
    #: GiB per GPU (incl. reserved) on the first, the worst middle and the last pipeline stage
    #: (only the stages that exist: ``first`` alone when pp = 1, no ``mid`` when pp = 2);
    #: ``peak_memory_gib`` is the largest
    stage_memory_gib: Mapping[str, float] = attrs.field(factory=dict)
    #: the stage whose times set the pipeline (``first``, ``mid`` or ``last``)
    critical_stage: str = "first"
    #: the numeric format whose peak MFU and HFU are measured against
    mfu_precision: str = "bf16"
    #: MFU against the bf16 peak (how fp8 runs are often quoted); equals ``mfu`` for bf16 jobs
    mfu_bf16_peak: float = 0.0
    #: the band the step time likely falls in: 80 % of the cross-validated errors of the nearest
    #: validated runs (:mod:`mofa_framework.uncertainty`; NaN when no cross-validation table is installed)
    step_time_s_low: float = float("nan")
    step_time_s_high: float = float("nan")
    #: which runs the band was drawn from (a sentence)
    band_basis: str = ""
    #: where the job lies outside the calibrated regimes, one sentence each (empty: inside)
    extrapolation: tuple[str, ...] = ()
    #: watts the GPUs are limited to (``compute.power_limit_w``; 0 = their rated power)
    power_limit_w: float = 0.0
    #: GB/s per GPU between scale-up domains when the job sets its own network
    #: (``[hardware] scaleout_bandwidth_gbps``; 0 = the profile's)
    scaleout_bandwidth_gbps: float = 0.0
    #: GiB of host memory per GPU the offload features use (the stage that uses most), and what one
    #: GPU may use: the node's CPU memory over its GPUs
    host_memory_gib: float = 0.0
    host_gib_per_gpu: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class Predictor:
    """Prediction with a chosen set of plugins.

    ``Predictor()`` uses every installed plugin; ``Predictor(disabled=["tp_overlap"])`` leaves
    some out; ``Predictor(plugins={"my_gpu": module})`` adds in-process plugins; pass ``pm``
    to use a manager you assembled yourself.
    """

    def __init__(self, pm: MofaPluginManager | None = None, *, disabled: Iterable[str] = (),
                 plugins: Mapping[str, object] | None = None, strict: bool | None = None):
        self.pm = pm or get_plugin_manager(disabled=disabled, strict=strict, fresh=bool(plugins))
        for name, plugin in (plugins or {}).items():
            self.pm.register_plugin(plugin, name)

    @property
    def registry(self):
        return self.pm.registry

    # ---- jobs
    def load_job(self, path) -> TrainingJob:
        return _load_job(path, self.registry)

    def job(self, data: Mapping[str, Any], name: str = "job") -> TrainingJob:
        """A job from a dict shaped like the TOML file."""
        return job_from_dict(data, self.registry, name)

    # ---- vectorised core
    def plugin_constraints(self, batch: CandidateBatch, model: ModelSpec, hardware: HardwareProfile,
                           feature_rules_only: bool = False) -> list[ConstraintResult]:
        """The ``mofa_candidate_constraints`` hooks' rules alone (some read the rows' features: a
        search checks them again once the features are chosen). `feature_rules_only` leaves out
        the plugins that declare their rules blind to features (``MOFA_CONSTRAINTS_READ_FEATURES =
        False``): for rows whose structures passed them already."""
        only = (lambda plugin: getattr(plugin, "MOFA_CONSTRAINTS_READ_FEATURES", True)) if feature_rules_only else None
        out: list[ConstraintResult] = []
        for plugin, results in self.pm.hook_results("mofa_candidate_constraints", plugins=only, batch=batch,
                                                    model=model, hardware=hardware):
            for r in results:
                mask = np.asarray(r.feasible, dtype=bool)
                if mask.shape != (len(batch),):
                    raise PluginError(f"plugin {plugin!r}: constraint {r.name!r} has shape {mask.shape}, "
                                      f"expected ({len(batch)},)")
                out.append(r)
        return out

    def constraints(self, batch: CandidateBatch, model: ModelSpec, hardware: HardwareProfile) -> list[ConstraintResult]:
        """Every feasibility rule of every plugin, plus feature-specific ones."""
        out = self.plugin_constraints(batch, model, hardware) + schedule_rules(self.registry, batch, model, hardware)
        for code, sched in enumerate(self.registry.schedules.values()):
            rows = batch.schedule == code
            if sched.end_stages is None or not rows.any():
                continue
            rows = rows & ((batch.first_stage_layers > 0) | (batch.last_stage_layers > 0)) & (batch.pp > 1)
            if rows.any():  # only rows that state their end stages: the default split runs everywhere
                r = feasible_result(self.registry, "schedules", sched, batch, rows, "end_stages", model.num_layers)
                out.append(attrs.evolve(r, feasible=r.feasible | ~rows))
        for feat in self.registry.features.values():
            rows = batch.feature(feat.name)
            if rows.enabled.any():
                out += feature_rules(self.registry, feat, batch, rows)
        return out

    def evaluate(self, batch: CandidateBatch, model: ModelSpec, hardware: HardwareProfile,
                 structure=None) -> Prediction:
        """The vectorised engine over a batch (see :func:`mofa_framework.engine.evaluate`)."""
        return evaluate(batch, model, hardware, self.pm, structure=structure)

    # ---- jobs end to end
    def predict(self, jobs: TrainingJob | Iterable[TrainingJob]) -> list[PredictionResult]:
        """Predict each job; jobs sharing a model and hardware are evaluated as one batch."""
        jobs = [jobs] if isinstance(jobs, TrainingJob) else list(jobs)
        results: list[PredictionResult | None] = [None] * len(jobs)
        groups: dict[tuple[str, str, float], list[int]] = {}
        for i, j in enumerate(jobs):
            groups.setdefault(j.batch_key, []).append(i)
        for idx in groups.values():
            group = [jobs[i] for i in idx]
            model, hw = group[0].model, group[0].hardware
            pred = self._evaluate_jobs(group)
            net = own_network(hw.interconnect.scaleout_bandwidth_gbps, self.registry.hardware_profile(hw.name))
            for k, i in enumerate(idx):
                results[i] = _with_band(_result(jobs[i], pred, k, net), jobs[i], self.registry)
        return results  # type: ignore[return-value]

    def sensitivity(self, jobs: TrainingJob | Iterable[TrainingJob], top: int | None = None) -> list[list]:
        """For each job, ∂ ln(step time) / ∂ ln(parameter) for the hardware-profile parameters it
        depends on, largest first (:func:`mofa_framework.uncertainty.sensitivities`)."""
        from .uncertainty import sensitivities

        jobs = [jobs] if isinstance(jobs, TrainingJob) else list(jobs)
        return sensitivities(self, jobs, top)

    def _evaluate_jobs(self, group: list[TrainingJob]) -> Prediction:
        """The engine's prediction for jobs sharing a model and hardware, after every constraint."""
        model, hw = group[0].model, group[0].hardware
        batch = jobs_to_batch(group, self.registry)
        for r in self.constraints(batch, model, hw):
            bad = np.flatnonzero(~np.asarray(r.feasible, bool))
            if len(bad):
                raise ConfigError(f"{group[bad[0]].name}: {r.reason_for(bad[0])}")
        return self.evaluate(batch, model, hw)

    def tune(self, job, *, objective: str = "step_time", top_k: int = 10, features=None, schedules=None,
             values=None, pareto: bool = False, time_budget_s: float | None = None,
             memory_headroom_gib: float | None = None, progress=None):
        """The best configurations for `job` (a :class:`TrainingJob`, job-file path or dict) as
        ``mofa tune`` searches them: a :class:`~mofa_framework.tuner.TuneResult` (``.best``, ranked;
        ``.pareto`` with ``pareto=True``). `features`, `schedules` and `values` (``{"tp": (4, 8)}``)
        narrow or widen the job's ``[search]`` (see :func:`mofa_framework.tuner.job_request`);
        `memory_headroom_gib` is the HBM per GPU every configuration must leave free (else the job's
        ``[search] memory_headroom_gib``, default 0);
        `progress` receives a :class:`~mofa_framework.tuner.TuneProgress` as the search goes."""
        from .tuner import job_request, tune

        req = job_request(_as_job(job, self), self.registry, features=features, schedules=schedules, values=values,
                          objective=objective, top_k=top_k, pareto=pareto, time_budget_s=time_budget_s,
                          memory_headroom_gib=memory_headroom_gib)
        return tune(self, req, progress)

    def trace(self, job, *, all_stages: bool = False) -> dict:
        """The predicted step of `job` as a Chrome trace-event JSON object (open it in
        ui.perfetto.dev; see :mod:`mofa_framework.trace`): the first, a middle and the last
        pipeline stage, or every stage with ``all_stages``."""
        from .trace import build

        job = _as_job(job, self)
        return build(self._evaluate_jobs([job]), 0, registry=self.registry, all_stages=all_stages, name=job.name)


def _result(job: TrainingJob, pred: Prediction, k: int, own_network_gbps: float = 0.0) -> PredictionResult:
    f = lambda a: float(np.asarray(a)[k])  # noqa: E731
    return PredictionResult(
        job=job.name, model=job.model.name, hardware=job.hardware.name, num_gpus=job.num_gpus,
        parallel={**attrs.asdict(job.parallel), "dp": job.dp}, schedule=job.schedule,
        features=tuple(sorted(job.features)),
        step_time_s=f(pred.step_time_s), tokens_per_s_per_gpu=f(pred.tokens_per_s_per_gpu),
        model_tflops_per_gpu=f(pred.model_tflops_per_gpu), hardware_tflops_per_gpu=f(pred.hardware_tflops_per_gpu),
        mfu=f(pred.mfu), hfu=f(pred.hfu), peak_memory_gib=f(pred.peak_memory_gib), hbm_gib=job.hardware.memory.hbm_gib,
        fits_in_memory=bool(pred.fits_in_memory[k]),
        host_memory_gib=f(pred.host_memory_bytes) / GIB, host_gib_per_gpu=job.hardware.host_bytes_per_gpu / GIB,
        breakdown={name: f(a) for name, a in pred.breakdown.items()},
        memory_breakdown={name: f(a) / GIB for name, a in pred.memory_breakdown.items()},
        pipeline_phases={name: f(a) for name, a in pred.phases.items()},
        provenance=dict(pred.provenance),
        stage_memory_gib={name: float(pred.stage_memory_bytes[i, k]) / GIB for i, name in enumerate(STAGES)
                          if np.isfinite(pred.stage_memory_bytes[i, k])},
        critical_stage=STAGES[int(pred.critical_stage[k])],
        mfu_precision=PRECISIONS[int(pred.mfu_precision[k])], mfu_bf16_peak=f(pred.mfu_bf16_peak),
        power_limit_w=float(job.hardware.compute.power_limit_w), scaleout_bandwidth_gbps=own_network_gbps,
    )


def _with_band(r: PredictionResult, job: TrainingJob, registry) -> PredictionResult:
    from .uncertainty import band_for

    b = band_for(r, job, registry)
    return attrs.evolve(r, step_time_s_low=b.low_s, step_time_s_high=b.high_s, band_basis=b.basis,
                        extrapolation=b.flags)


def load_job(path, predictor: Predictor | None = None) -> TrainingJob:
    return (predictor or Predictor()).load_job(path)


def predict(job, predictor: Predictor | None = None) -> PredictionResult | list[PredictionResult]:
    """Predict one job (a :class:`TrainingJob`, a job-file path or a dict) or a list of them."""
    predictor = predictor or Predictor()
    if isinstance(job, (list, tuple)):
        return predictor.predict([_as_job(j, predictor) for j in job])
    return predictor.predict(_as_job(job, predictor))[0]


def tune(job, predictor: Predictor | None = None, **search):
    """Tune one job (see :meth:`Predictor.tune`, whose keyword arguments `search` are)."""
    return (predictor or Predictor()).tune(job, **search)


def _as_job(job, predictor: Predictor) -> TrainingJob:
    if isinstance(job, TrainingJob):
        return job
    if isinstance(job, Mapping):
        return predictor.job(job)
    if not isinstance(job, (str, os.PathLike)):
        raise ConfigError(f"job: expected a TrainingJob, a job-file path or a dict, got {type(job).__name__}")
    return predictor.load_job(job)
