"""End-to-end training time and ETTR under failures and checkpointing (paper §3.4, §4.2).

The model (docs/fault-tolerance.md explains every choice):

* [37] ``T_eff = N_step · T_step`` with ``N_step = ⌈tokens / (B_g · s)⌉``.
* [38] ``N_fail = N_nodes · λ · T_total / 86400`` — λ failures per node per day over the
  whole wall-clock time, interruptions included.
* [39] ``T_int = T_init + N_fail · (MTTR + T_lost) + (N_step / I) · T_save`` with
  ``T_lost = f · I · T_step`` the progress lost per failure (f = the policy's
  ``lost_interval_fraction``, 0.5: a failure strikes uniformly inside an interval).
* [36] ``ETTR = T_eff / (T_eff + T_int)``; ``T_total = T_eff + T_int``.

[38] makes T_total appear on both sides, linearly, so the fixed point is closed-form::

    T_total = (T_eff + T_init + (N_step/I)·T_save) / (1 − r·(MTTR + f·I·T_step)),  r = N_nodes·λ/86400

When the denominator is ≤ 0 the job fails faster than it recovers and progresses: the
fixed point does not exist, T_total = inf, ETTR = 0 (reported as ``diverged``).

[43]/[44] The interval minimising T_total: with ``A = T_eff + T_init``, ``B = N_step·T_save``,
``C = 1 − r·MTTR``, ``D = r·f·T_step`` the total is ``(A + B/I)/(C − D·I)``, quasi-convex in I,
whose stationary point is the positive root of ``A·D·I² + 2·B·D·I − B·C = 0``::

    I_c = B·C / (B·D + sqrt(B²·D² + A·B·C·D))

For small failure rates (B·D ≪ A·C, C ≈ 1) this is the paper's eq. [44], Young's formula in
steps, ``I* = sqrt(2·N_step·T_save / (N_fail·T_step))`` with N_fail = r·T_eff
(:func:`young_interval_steps`). As the paper says, I_c is rounded down and up and the better
integer is kept; because T_total is quasi-convex in I that integer is the exact optimum.

Everything is vectorised: the step time (and any other input) may be an array of candidates,
e.g. the tuner's million predicted step times; the inputs broadcast together.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from .errors import ConfigError
from .units import SECONDS_PER_DAY, gbps_to_bytes_per_s

if TYPE_CHECKING:  # pragma: no cover
    from .api import Predictor
    from .config import TrainingJob

#: Bytes one parameter occupies in a checkpoint: bf16 weights (2) + fp32 master weights (4)
#: + Adam's two fp32 moments (4 + 4) — Megatron's distributed checkpoint of a bf16 model with
#: Adam. NVIDIA's published NeMo checkpoint sizes match it: Llama 3.1 8B/70B/405B are quoted
#: as ~105 GB / ~920 GB / ~5.2 TB, i.e. 14.1 bytes/param when those sizes are binary units.
CHECKPOINT_BYTES_PER_PARAM = 14.0

#: Fixed part of a job's (re)start — scheduling, container start, NCCL rendezvous — and its
#: growth per node, seconds. Fitted to the paper's Table 5 T_init, which is linear in the
#: node count and independent of model size: 134.41 s (16 nodes), 147.72 (32), 174.34 (64),
#: 227.58 (128), 127.75 (8) → 121.09 s + 0.832 s/node (all five within 0.01 s).
STARTUP_S = 121.09
STARTUP_PER_NODE_S = 0.832


# ====================================================================== result


@attrs.frozen(kw_only=True, eq=False)
class E2EResult:
    """End-to-end time of a training run; each field a float, or an array over candidates."""

    step_time_s: Any
    #: N_step, eq. [37]
    num_steps: Any
    num_gpus: Any
    num_nodes: Any
    #: λ, failures per node per day
    node_failures_per_day: Any
    #: N_fail, eq. [38] (expected; fractional)
    failures: Any
    #: mean time to repair one failure, eq. [41]
    mttr_s: Any
    #: progress lost per failure: lost_interval_fraction · I · T_step
    lost_per_failure_s: Any
    #: I, the checkpoint interval used, steps
    checkpoint_interval_steps: Any
    #: the interval minimising total time, eq. [44] (closed form of the fixed point)
    optimal_interval_steps: Any
    #: N_step / I
    num_checkpoints: Any
    checkpoint_save_s: Any
    init_s: Any
    #: eq. [36]; 0 when diverged
    ettr: Any
    #: T_eff, eq. [37]
    effective_time_s: Any
    #: T_int, eq. [39] = init_s + recovery_time_s + checkpoint_time_s
    interruption_time_s: Any
    #: N_fail · (MTTR + T_lost)
    recovery_time_s: Any
    #: (N_step / I) · T_save
    checkpoint_time_s: Any
    total_time_s: Any
    total_days: Any
    gpu_hours: Any
    #: failures outpace progress: no finite total time (total = inf, ETTR = 0)
    diverged: Any

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values (lists for arrays; ``inf`` stays a float)."""
        out = {}
        for f in attrs.fields(type(self)):
            x = getattr(self, f.name)
            out[f.name] = x.tolist() if isinstance(x, np.ndarray) else x
        return out

    def __len__(self) -> int:
        return int(np.size(self.total_time_s))


# ====================================================================== formulas


def _check(name: str, x, *, minimum: float = 0.0, strict: bool = False) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    bad = (a <= minimum) if strict else (a < minimum)
    if np.any(bad):
        first = a[bad].flat[0] if a.ndim else float(a)
        rel = ">" if strict else "≥"
        raise ConfigError(f"{name} must be {rel} {minimum:g}, got {first:g}")
    return a


def num_steps(tokens, global_batch_size, sequence_length) -> np.ndarray:
    """Eq. [37]: ``N_step = ⌈tokens / (B_g · s)⌉`` (the last, partial batch is a step too)."""
    tok = _check("tokens", tokens, strict=True)
    per_step = _check("global_batch_size", global_batch_size, strict=True) * _check(
        "sequence_length", sequence_length, strict=True)
    # a relative nudge so that an exact multiple computed in floating point does not round up
    return np.ceil(tok / per_step * (1.0 - 1e-12)).astype(np.int64)


def num_nodes(num_gpus, gpus_per_node) -> np.ndarray:
    """``N_nodes = ⌈N / G⌉`` (a partly used node still fails like a whole one)."""
    return np.ceil(np.asarray(num_gpus, np.float64) / np.asarray(gpus_per_node, np.float64)).astype(np.int64)


def _total_s(t_eff, init_s, n_steps, save_s, rate_per_s, mttr_s, frac, step_s, interval):
    """Closed-form fixed point of [38]/[39]: T_total for interval `interval`; inf if it diverges."""
    base = t_eff + init_s + n_steps / interval * save_s
    denom = 1.0 - rate_per_s * (mttr_s + frac * interval * step_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0.0, base / np.where(denom > 0.0, denom, 1.0), np.inf)


def optimal_interval_steps(step_time_s, *, num_steps, num_nodes, node_failures_per_day, mttr_s,
                           checkpoint_save_s, init_s=0.0, lost_interval_fraction=0.5) -> np.ndarray:
    """[43][44]: the integer checkpoint interval (steps) minimising T_total, vectorised.

    The stationary point ``I_c = B·C / (B·D + sqrt(B²D² + A·B·C·D))`` of the exact
    fixed-point total (module docstring), rounded down and up, keeping the better; clipped to
    ``[1, N_step]``. Free saves give 1; no failures (or no lost work) give N_step.
    """
    step = np.asarray(step_time_s, np.float64)
    n = np.asarray(num_steps, np.float64)
    rate = np.asarray(num_nodes, np.float64) * np.asarray(node_failures_per_day, np.float64) / SECONDS_PER_DAY
    mttr = np.asarray(mttr_s, np.float64)
    save = np.asarray(checkpoint_save_s, np.float64)
    init = np.asarray(init_s, np.float64)
    frac = np.asarray(lost_interval_fraction, np.float64)
    t_eff = n * step
    a, b, c, d = t_eff + init, n * save, 1.0 - rate * mttr, rate * frac * step
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        i_c = b * c / (b * d + np.sqrt(b * b * d * d + a * b * c * d))
    i_c = np.where(b <= 0.0, 1.0, i_c)  # saving is free: checkpoint every step
    i_c = np.where(c <= 0.0, 1.0, i_c)  # diverges at any interval
    n_b = np.broadcast_to(n, np.broadcast(i_c, n).shape)
    i_c = np.where(np.isnan(i_c), 1.0, i_c)
    i_c = np.clip(np.minimum(i_c, n_b), 1.0, np.maximum(n_b, 1.0))
    lo, hi = np.floor(i_c), np.ceil(i_c)
    t_lo = _total_s(t_eff, init, n, save, rate, mttr, frac, step, lo)
    t_hi = _total_s(t_eff, init, n, save, rate, mttr, frac, step, hi)
    return np.where(t_hi < t_lo, hi, lo).astype(np.int64)


def young_interval_steps(step_time_s, *, num_steps, failures, checkpoint_save_s) -> np.ndarray:
    """Eq. [44] as the paper prints it (Young's formula in steps), not rounded:
    ``I* = sqrt(2 · N_step · T_save / (N_fail · T_step))``."""
    with np.errstate(divide="ignore"):
        return np.sqrt(2.0 * np.asarray(num_steps, np.float64) * np.asarray(checkpoint_save_s, np.float64)
                       / (np.asarray(failures, np.float64) * np.asarray(step_time_s, np.float64)))


def e2e_time(step_time_s, *, num_steps, num_gpus, gpus_per_node=8, node_failures_per_day=0.005, mttr_s,
             checkpoint_save_s, init_s, checkpoint_interval_steps=0, lost_interval_fraction=0.5) -> E2EResult:
    """Eqs. [36]–[39], [44]: ETTR and end-to-end time for predicted step time(s).

    Every argument broadcasts (pass arrays to evaluate many candidates at once); a
    ``checkpoint_interval_steps`` of 0 means the optimal interval (eq. [44]) of that row; one
    longer than the run is clipped to N_step (a single checkpoint, at the end).
    Scalars in, floats out; any array in, arrays out. Raises ConfigError on negative rates or
    times, a negative interval or fewer than one step.
    """
    step = _check("step time", step_time_s)
    n = _check("number of steps", num_steps, minimum=1.0)
    gpus = _check("num_gpus", num_gpus, minimum=1.0)
    gpn = _check("gpus_per_node", gpus_per_node, minimum=1.0)
    lam = _check("failure rate (failures per node per day)", node_failures_per_day)
    mttr = _check("MTTR", mttr_s)
    save = _check("checkpoint save time", checkpoint_save_s)
    init = _check("init time", init_s)
    given = _check("checkpoint interval", checkpoint_interval_steps)
    frac = _check("lost_interval_fraction", lost_interval_fraction)
    scalar = all(np.ndim(x) == 0 for x in (step, n, gpus, gpn, lam, mttr, save, init, given, frac))

    nodes = num_nodes(gpus, gpn)
    rate = nodes * lam / SECONDS_PER_DAY
    opt = optimal_interval_steps(step, num_steps=n, num_nodes=nodes, node_failures_per_day=lam, mttr_s=mttr,
                                 checkpoint_save_s=save, init_s=init, lost_interval_fraction=frac)
    # an interval longer than the run is one checkpoint, at the end: [39] counts N_step / I saves
    interval = np.where(given > 0, np.minimum(np.floor(given), np.maximum(n, 1.0)), opt).astype(np.int64)
    t_eff = n * step
    total = _total_s(t_eff, init, n, save, rate, mttr, frac, step, interval)
    diverged = ~np.isfinite(total) & ~np.isnan(total)
    with np.errstate(invalid="ignore", over="ignore"):
        failures = rate * total
        lost = frac * interval * step
        recovery = failures * (mttr + lost)
        saves = n / interval
        ckpt = saves * save
        interruption = total - t_eff
        ettr = np.where(diverged, 0.0, t_eff / np.where(diverged, 1.0, total))
    out = dict(
        step_time_s=step, num_steps=n.astype(np.int64), num_gpus=gpus.astype(np.int64), num_nodes=nodes,
        node_failures_per_day=lam, failures=failures, mttr_s=mttr, lost_per_failure_s=lost,
        checkpoint_interval_steps=interval, optimal_interval_steps=opt, num_checkpoints=saves,
        checkpoint_save_s=save, init_s=init, ettr=ettr, effective_time_s=t_eff,
        interruption_time_s=interruption, recovery_time_s=recovery, checkpoint_time_s=ckpt,
        total_time_s=total, total_days=total / SECONDS_PER_DAY, gpu_hours=total * gpus / 3600.0,
        diverged=diverged,
    )
    shape = np.broadcast(*[np.asarray(x) for x in out.values()]).shape
    if scalar:
        return E2EResult(**{k: np.asarray(x).item() for k, x in out.items()})
    return E2EResult(**{k: np.broadcast_to(x, shape).copy() for k, x in out.items()})


# ====================================================================== checkpoint and init times


def checkpoint_bytes(total_params: float, bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM) -> float:
    """Size of one full training checkpoint: ``params × 14`` bytes by default (bf16 + fp32 Adam)."""
    return float(total_params) * bytes_per_param


def derived_save_s(ckpt_bytes: float, *, num_gpus: int, gpus_per_node: int, disk_write_gbps: float,
                   d2h_bandwidth_gbps: float, async_checkpoint: bool = False) -> float:
    """Seconds one checkpoint stalls training.

    Synchronous: every node writes its shard in parallel (Megatron's fully parallel
    distributed save), ``bytes / (disk_write · N_nodes)``. Asynchronous: only the GPU→host
    snapshot of each GPU's shard stalls, ``bytes / N / d2h``; the write to storage runs in
    the background (assumed to finish within one interval).
    """
    if async_checkpoint:
        return ckpt_bytes / num_gpus / gbps_to_bytes_per_s(d2h_bandwidth_gbps)
    nodes = math.ceil(num_gpus / gpus_per_node)
    return ckpt_bytes / (gbps_to_bytes_per_s(disk_write_gbps) * nodes)


def derived_init_s(ckpt_bytes: float, *, num_gpus: int, gpus_per_node: int, disk_read_gbps: float,
                   startup_s: float = STARTUP_S, startup_per_node_s: float = STARTUP_PER_NODE_S) -> float:
    """Job initialisation: start-up (Table 5 fit, ``121.09 + 0.832·N_nodes`` s) plus loading the
    checkpoint the job starts from, read by all nodes in parallel: ``bytes / (disk_read · N_nodes)``."""
    nodes = math.ceil(num_gpus / gpus_per_node)
    return startup_s + startup_per_node_s * nodes + ckpt_bytes / (gbps_to_bytes_per_s(disk_read_gbps) * nodes)


@attrs.frozen(kw_only=True)
class E2EInputs:
    """A job's end-to-end inputs besides the step time, resolved from its ``[training]`` and
    ``[fault]`` sections, the hardware profile and the recovery policy."""

    num_steps: int = attrs.field(validator=attrs.validators.ge(1))
    num_gpus: int = attrs.field(validator=attrs.validators.ge(1))
    gpus_per_node: int = attrs.field(validator=attrs.validators.ge(1))
    node_failures_per_day: float = attrs.field(validator=attrs.validators.ge(0.0))
    policy: str
    mttr_s: float = attrs.field(validator=attrs.validators.ge(0.0))
    lost_interval_fraction: float
    checkpoint_bytes: float
    checkpoint_save_s: float = attrs.field(validator=attrs.validators.ge(0.0))
    #: "given", "derived" (storage bandwidth) or "derived-async" (GPU→host snapshot)
    checkpoint_save_source: str
    init_s: float = attrs.field(validator=attrs.validators.ge(0.0))
    #: "given" or "derived"
    init_source: str
    #: 0 = optimal
    checkpoint_interval_steps: int = attrs.field(validator=attrs.validators.ge(0))

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`e2e_time` (override any of them with arrays to sweep)."""
        return dict(num_steps=self.num_steps, num_gpus=self.num_gpus, gpus_per_node=self.gpus_per_node,
                    node_failures_per_day=self.node_failures_per_day, mttr_s=self.mttr_s,
                    checkpoint_save_s=self.checkpoint_save_s, init_s=self.init_s,
                    checkpoint_interval_steps=self.checkpoint_interval_steps,
                    lost_interval_fraction=self.lost_interval_fraction)


def policy_options(job: TrainingJob, registry):
    """The job's ``[fault.options]`` read into its policy's options type (ConfigError if bad)."""
    from .config import structure

    policy = registry.policy(job.fault.policy, field=f"{job.name}: fault.policy")
    return policy, structure(dict(job.fault.options), policy.options_type, f"{job.name}: fault.options")


#: bytes per parameter of frozen (not trained) weights loaded at start-up: bf16
FROZEN_BYTES_PER_PARAM = 2.0


def trained_params(job: TrainingJob, registry, params: float) -> float:
    """Parameters the job trains: all `params`, or what an enabled feature that freezes the model's
    weights says it trains (``Feature.trainable_params``: LoRA's adapters)."""
    for name, opts in job.features.items():
        feat = registry.features.get(name)
        if feat is not None and feat.frozen_weights and feat.trainable_params is not None:
            return min(float(feat.trainable_params(job.model, opts)), params)
    return params


def e2e_inputs(job: TrainingJob, registry) -> E2EInputs:
    """Resolve a job's end-to-end inputs; ConfigError names the missing or bad key."""
    from .decompose import total_params

    tokens = job.training.tokens
    if not tokens or tokens <= 0:
        raise ConfigError(f"{job.name}: training.tokens is not set: give [training] tokens = ... in the job file "
                          "or --tokens (end-to-end time needs the number of tokens to train on)")
    policy, opts = policy_options(job, registry)
    mttr = float(policy.mttr_s(opts))
    if not (mttr >= 0.0 and math.isfinite(mttr)):
        raise ConfigError(f"{job.name}: fault policy {policy.name!r} gives MTTR {mttr!r}; expected seconds ≥ 0")
    hw, fault = job.hardware, job.fault
    gpn = hw.gpus_per_node
    # the getattr defaults are the module constants until [fault] grows these keys
    params = total_params(job.model)["total"]
    trained = trained_params(job, registry, params)
    ckpt = checkpoint_bytes(trained, getattr(fault, "checkpoint_bytes_per_param", CHECKPOINT_BYTES_PER_PARAM))
    # a job that trains part of the model (LoRA) also loads the frozen rest at start-up, in its weights' dtype
    frozen_bytes = (params - trained) * FROZEN_BYTES_PER_PARAM
    if fault.checkpoint_save_s is not None:
        save, save_src = float(fault.checkpoint_save_s), "given"
    else:
        save = derived_save_s(ckpt, num_gpus=job.num_gpus, gpus_per_node=gpn, disk_write_gbps=hw.host.disk_write_gbps,
                              d2h_bandwidth_gbps=hw.interconnect.d2h_bandwidth_gbps,
                              async_checkpoint=fault.async_checkpoint)
        save_src = "derived-async" if fault.async_checkpoint else "derived"
    if fault.init_s is not None:
        init, init_src = float(fault.init_s), "given"
    else:
        init = derived_init_s(ckpt + frozen_bytes, num_gpus=job.num_gpus, gpus_per_node=gpn,
                              disk_read_gbps=hw.host.disk_read_gbps, startup_s=getattr(fault, "startup_s", STARTUP_S),
                              startup_per_node_s=getattr(fault, "startup_per_node_s", STARTUP_PER_NODE_S))
        init_src = "derived"
    steps = int(num_steps(tokens, job.parallel.global_batch_size, job.parallel.sequence_length))
    return E2EInputs(num_steps=steps, num_gpus=job.num_gpus, gpus_per_node=gpn,
                     node_failures_per_day=float(fault.node_failures_per_day), policy=policy.name, mttr_s=mttr,
                     lost_interval_fraction=policy.lost_interval_fraction, checkpoint_bytes=ckpt,
                     checkpoint_save_s=save, checkpoint_save_source=save_src, init_s=init, init_source=init_src,
                     checkpoint_interval_steps=int(fault.checkpoint_interval_steps))


def e2e_for_job(job: TrainingJob, predictor: Predictor | None = None, *, step_time_s: float | None = None) -> E2EResult:
    """Predict the job's step time with ``Predictor.predict`` (unless `step_time_s` is given)
    and apply the end-to-end model with the job's ``[training]`` and ``[fault]`` settings."""
    from .api import Predictor

    predictor = predictor or Predictor()
    inputs = e2e_inputs(job, predictor.registry)
    if step_time_s is None:
        step_time_s = predictor.predict(job)[0].step_time_s
    return e2e_time(float(step_time_s), **inputs.model_kwargs())
