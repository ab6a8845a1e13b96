"""The bounds of every number that enters MoFa, in one place.

Validation happens once, at the boundary: the cattrs converter of :mod:`mofa_framework.config`
types each value (integers where the quantity is a count — ``tp = 2.0`` is refused — finite
floats, strings for names), and the attrs validators built here bound it. A value outside its
bound is a :class:`~mofa_framework.errors.ConfigError` whose one line names the field, the value
and the allowed range. The upper bounds are physical, not tight: each is far beyond any job
that has been or could soon be run, and small enough that every number the engine derives
from them stays finite in float64 (2**24 GPUs, 2**24-token sequences, 2**26-sequence batches).

``docs/bad-inputs.md`` tabulates :data:`LIMITS`; a test keeps the two in step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

#: the largest count any field may hold: everything fits comfortably in int64 and float64
MAX_GPUS = 2**24
MAX_SEQUENCE = 2**24
MAX_BATCH = 2**26
MAX_LAYERS = 2**16
MAX_WIDTH = 2**22  # hidden, FFN and expert widths
MAX_HEADS = 2**16
MAX_VOCAB = 2**24
MAX_EXPERTS = 2**16
MAX_SECONDS = 1e7  # 116 days: any single recovery, checkpoint or start-up time
MAX_TOKENS = 1e18  # a million times today's largest pre-training corpora
MAX_FACTOR = 1e3  # speed-up, slowdown and imbalance factors
#: backstop for an integer option that declares no bound of its own
MAX_OPTION_INT = 2**31
#: backstop for a float option that declares no bound of its own
MAX_OPTION_FLOAT = 1e12
INT64_MAX = 2**63 - 1


@attrs.frozen
class Bound:
    """``lo ≤ value ≤ hi``; `integer`: the value is a count (an ``int``, never a float)."""

    lo: float
    hi: float
    integer: bool
    why: str = ""

    def text(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} from {_num(self.lo)} to {_num(self.hi)}"


def _num(x: float) -> str:
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e15):
        x = int(x)
        for p in range(10, 64):
            if x == 2**p:
                return f"2**{p} = {x:,}"
        return f"{x:,}"
    return f"{x:g}"


def _count(lo: int, hi: int, why: str = "") -> Bound:
    return Bound(lo, hi, True, why)


def _real(lo: float, hi: float, why: str = "") -> Bound:
    return Bound(lo, hi, False, why)


MAX_RATE = 1e7  # GB/s and GiB: ten thousand times today's fastest HBM and largest memories
_FRACTION = 0.01, 1.0  # an efficiency: what reaches under 1 % of its peak is a unit mistake

#: every bounded number of a hardware profile (``hardware_profiles/*.toml``, ``MOFA_HARDWARE_PATH``),
#: by its table and field. Fitted coefficients stay far inside (``mofa calibrate``'s bounds); the
#: bounds keep a hand-written profile's every derived time finite and physical
PROFILE_LIMITS: dict[str, Bound] = {
    "profile.gpus_per_node": _count(1, MAX_GPUS, "GPUs in one node"),
    "compute.peak_tflops": _real(1e-3, 1e6, "dense TFLOPS of each numeric format"),
    "compute.sm_count": _count(0, 2**20, "streaming multiprocessors, 0 = unknown"),
    "compute.tdp_w": _real(0.0, 1e5, "watts the peaks were measured at, 0 = not stated"),
    "compute.power_limit_w": _real(0.0, 1e5, "watts, 0 = the TDP"),
    "memory.hbm_gib": _real(1e-3, MAX_RATE, "GiB of device memory"),
    "memory.hbm_bandwidth_gbps": _real(1e-3, MAX_RATE, "GB/s"),
    "interconnect.scaleup_domain_gpus": _count(1, MAX_GPUS, "GPUs one scale-up (NVLink) domain joins"),
    "interconnect.scaleup_bandwidth_gbps": _real(1e-3, MAX_RATE, "GB/s per GPU, one direction"),
    "interconnect.scaleout_bandwidth_gbps": _real(1e-3, MAX_RATE, "GB/s per GPU, one direction"),
    "interconnect.h2d_bandwidth_gbps": _real(1e-3, MAX_RATE, "GB/s host to device"),
    "interconnect.d2h_bandwidth_gbps": _real(1e-3, MAX_RATE, "GB/s device to host"),
    "host.cpu_memory_gib": _real(1e-3, MAX_RATE, "GiB of host memory per node"),
    "host.disk_read_gbps": _real(1e-6, MAX_RATE, "GB/s"),
    "host.disk_write_gbps": _real(1e-6, MAX_RATE, "GB/s"),
    "host.cpu_optimizer_params_per_s": _real(1.0, 1e15, "parameters one node's CPU Adam updates per second"),
    "efficiency.gemm_efficiency": _real(*_FRACTION, "fraction of peak"),
    "efficiency.gemm_half_efficiency_s": _real(0.0, 1.0, "seconds of peak work"),
    "efficiency.gemm_half_dim": _real(0.0, 65536.0, "GEMM dimension, 0 = none"),
    "efficiency.gemm_half_dim_k": _real(0.0, 65536.0, "GEMM dimension, 0 = gemm_half_dim"),
    "efficiency.kernel_launch_s": _real(0.0, 0.01, "seconds per kernel"),
    "efficiency.host_dispatch_s": _real(0.0, 0.01, "seconds per kernel"),
    "efficiency.profiled_gemm_relative_efficiency": _real(0.01, 1.5, "of the gemm_profile rates"),
    "efficiency.profiled_attention_relative_efficiency": _real(0.01, 4.0, "of the attention_profile rates"),
    "efficiency.attention_efficiency": _real(*_FRACTION, "fraction of the bf16 peak"),
    "efficiency.attention_half_head_dim": _real(0.0, 65536.0, "head dimension, 0 = none"),
    "efficiency.fp4_gemm_relative_efficiency": _real(*_FRACTION, "of gemm_efficiency"),
    "efficiency.fp8_gemm_relative_efficiency": _real(*_FRACTION, "of gemm_efficiency"),
    "efficiency.mxfp8_gemm_relative_efficiency": _real(*_FRACTION, "of a per-tensor fp8 GEMM"),
    "efficiency.memory_efficiency": _real(*_FRACTION, "fraction of HBM bandwidth"),
    "efficiency.scaleup_bus_efficiency": _real(*_FRACTION, "fraction of scale-up bandwidth"),
    "efficiency.scaleout_bus_efficiency": _real(*_FRACTION, "fraction of scale-out bandwidth"),
    "efficiency.alltoall_relative_efficiency": _real(*_FRACTION, "of a ring's bus efficiency"),
    "efficiency.scaleup_latency_us": _real(0.0, 1e6, "µs per collective step"),
    "efficiency.scaleout_latency_us": _real(0.0, 1e6, "µs per collective step"),
    "efficiency.bandwidth_decay_per_doubling": _real(0.0, 0.99, "bandwidth lost per doubling of nodes"),
    "efficiency.contention_compute": _real(1.0, 10.0, "slowdown while overlapping, 1 = none"),
    "efficiency.contention_comm": _real(1.0, 10.0, "slowdown while overlapping, 1 = none"),
    "efficiency.reserved_memory_gib": _real(0.0, MAX_RATE, "GiB per GPU"),
    "efficiency.step_overhead_s": _real(0.0, 3600.0, "seconds per step"),
    "efficiency.moe_step_overhead_s": _real(0.0, 3600.0, "seconds per MoE step"),
    "efficiency.microbatch_overhead_s": _real(0.0, 60.0, "seconds per micro-batch"),
    "efficiency.chunk_overhead_s": _real(0.0, 60.0, "seconds per micro-batch and model chunk"),
}

#: every bounded field of the job file, the model and the hardware profile, by its key path
#: (``section.field``)
LIMITS: dict[str, Bound] = {
    "hardware.num_gpus": _count(1, MAX_GPUS, "GPUs in the job"),
    "parallel.tp": _count(1, MAX_GPUS, "a factor of num_gpus"),
    "parallel.pp": _count(1, MAX_LAYERS, "pipeline stages, each holding at least one layer"),
    "parallel.vpp": _count(1, MAX_LAYERS, "model chunks per stage, each holding at least one layer"),
    "parallel.cp": _count(1, MAX_GPUS, "a factor of num_gpus"),
    "parallel.ep": _count(1, MAX_EXPERTS, "expert-parallel ranks, each holding at least one expert"),
    "parallel.etp": _count(0, MAX_GPUS, "0 = tp"),
    "parallel.micro_batch_size": _count(1, MAX_BATCH, "sequences per micro-batch"),
    "parallel.global_batch_size": _count(1, MAX_BATCH, "sequences per step"),
    "parallel.sequence_length": _count(1, MAX_SEQUENCE, "tokens per sequence"),
    "parallel.document_length": _count(0, MAX_SEQUENCE, "mean tokens per packed document; 0 = one per sequence"),
    "parallel.first_stage_layers": _count(0, MAX_LAYERS, "0 = balanced"),
    "parallel.last_stage_layers": _count(0, MAX_LAYERS, "0 = balanced"),
    "training.tokens": _real(0.0, MAX_TOKENS, "0 = not given"),
    "search.memory_headroom_gib": _real(0.0, MAX_RATE, "GiB of HBM per GPU a configuration must leave free"),
    "fault.node_failures_per_day": _real(0.0, 100.0, "failures per node per day"),
    "fault.checkpoint_interval_steps": _count(0, 2**40, "0 = the optimal interval"),
    "fault.checkpoint_save_s": _real(0.0, MAX_SECONDS, "seconds"),
    "fault.init_s": _real(0.0, MAX_SECONDS, "seconds"),
    "fault.checkpoint_bytes_per_param": _real(1e-3, 1024.0, "bytes per parameter in a checkpoint"),
    "fault.startup_s": _real(0.0, MAX_SECONDS, "seconds"),
    "fault.startup_per_node_s": _real(0.0, 1e5, "seconds per node"),
    "model.num_layers": _count(1, MAX_LAYERS, "transformer layers"),
    "model.hidden_size": _count(1, MAX_WIDTH, "model width"),
    "model.num_attention_heads": _count(1, MAX_HEADS, "query heads"),
    "model.num_kv_heads": _count(1, MAX_HEADS, "key/value heads"),
    "model.ffn_hidden_size": _count(1, MAX_WIDTH, "dense MLP width"),
    "model.vocab_size": _count(1, MAX_VOCAB, "tokens in the vocabulary"),
    "model.head_dim": _count(0, MAX_WIDTH, "0 = hidden_size / num_attention_heads"),
    "model.max_sequence_length": _count(0, 2**32, "0 = not given"),
    "model.num_experts": _count(0, MAX_EXPERTS, "routed experts, 0 = dense"),
    "model.experts_per_token": _count(0, MAX_EXPERTS, "top-k"),
    "model.moe_ffn_hidden_size": _count(0, MAX_WIDTH, "expert MLP width"),
    "model.num_shared_experts": _count(0, MAX_EXPERTS, "shared experts"),
    "model.first_k_dense_layers": _count(0, MAX_LAYERS, "leading dense layers"),
    "model.moe_router_num_groups": _count(0, MAX_EXPERTS, "0 = unrestricted routing"),
    "model.moe_router_group_topk": _count(0, MAX_EXPERTS, "groups a token routes to"),
    "model.moe_layer_frequency": _count(1, MAX_LAYERS, "an MoE layer every this many layers"),
    "model.moe_load_factor": _real(1.0, MAX_FACTOR, "busiest EP rank over the mean, 1 = balanced"),
    "model.q_lora_rank": _count(0, MAX_WIDTH, "low-rank query latent width (MLA, DeepSeek-V4)"),
    "model.kv_lora_rank": _count(0, MAX_WIDTH, "MLA key/value latent width"),
    "model.qk_nope_head_dim": _count(0, MAX_WIDTH, "MLA"),
    "model.qk_rope_head_dim": _count(0, MAX_WIDTH, "MLA"),
    "model.v_head_dim": _count(0, MAX_WIDTH, "MLA"),
    "model.num_mtp_layers": _count(0, MAX_LAYERS, "multi-token-prediction modules"),
    "model.moe_latent_size": _count(0, MAX_WIDTH, "LatentMoE expert width; 0 = hidden_size"),
    "model.sliding_window": _count(0, 2**32, "tokens, 0 = full attention"),
    "model.attention_chunk_size": _count(0, 2**32, "tokens per chunk of chunked attention, 0 = none"),
    "model.shared_expert_ffn_hidden_size": _count(0, MAX_WIDTH, "0 = num_shared_experts × moe_ffn_hidden_size"),
    "model.mamba_state_size": _count(1, MAX_WIDTH, "Mamba state N"),
    "model.mamba_head_dim": _count(1, MAX_WIDTH, "Mamba-2 head dimension P"),
    "model.mamba_num_heads": _count(0, MAX_HEADS, "Mamba-2 heads, 0 = mamba_expand × hidden / head_dim"),
    "model.mamba_num_groups": _count(1, MAX_HEADS, "Mamba-2 B/C groups"),
    "model.mamba_conv_kernel": _count(1, 1024, "causal conv1d width"),
    "model.mamba_chunk_size": _count(1, MAX_SEQUENCE, "SSD chunk length"),
    "model.mamba_expand": _count(1, 1024, "d_inner / hidden"),
    "model.mamba_dt_rank": _count(0, MAX_WIDTH, "Mamba-1 Δ rank, 0 = hidden / 16"),
    "model.linear_num_key_heads": _count(0, MAX_HEADS, "linear-attention query/key heads"),
    "model.linear_num_value_heads": _count(0, MAX_HEADS, "linear-attention value heads"),
    "model.linear_key_head_dim": _count(1, MAX_WIDTH, "linear-attention key head dimension"),
    "model.linear_value_head_dim": _count(1, MAX_WIDTH, "linear-attention value head dimension"),
    "model.linear_conv_kernel": _count(1, 1024, "causal conv1d width"),
    "model.linear_chunk_size": _count(1, MAX_SEQUENCE, "chunk length of the chunked algorithm"),
    "model.o_lora_rank": _count(0, MAX_WIDTH, "grouped low-rank output projection width per group, 0 = none"),
    "model.o_groups": _count(1, MAX_HEADS, "head groups of the low-rank output projection"),
    "model.index_topk": _count(0, 2**32, "pooled keys the lightning indexer picks per query"),
    "model.index_num_heads": _count(0, MAX_HEADS, "lightning-indexer heads"),
    "model.index_head_dim": _count(0, MAX_WIDTH, "lightning-indexer head dimension"),
    "model.hyper_connections": _count(1, 64, "residual streams (hyper-connections' expansion), 1 = a plain residual"),
    **PROFILE_LIMITS,
}


def short(value, limit: int = 48) -> str:
    """``repr(value)`` cut to `limit` characters (a 10**300 integer is not a 300-digit message)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        digits = str(abs(value))
        sign = "-" if value < 0 else ""
        if digits.strip("0") == "1":
            return f"{sign}10**{len(digits) - 1}"
        return f"{sign}{digits[0]}.{digits[1:3]}e{len(digits) - 1} (an integer)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check(bound: Bound, name: str, value) -> None:
    """ValueError (one line: the value, the allowed range) unless `value` is within `bound`."""
    if isinstance(value, bool):
        raise ValueError(f"'{name}': expected {bound.text()}, got {value!r}")
    if bound.integer and not isinstance(value, int):
        raise ValueError(f"'{name}': expected {bound.text()}, got {short(value)}")
    if not isinstance(value, (int, float)):
        raise ValueError(f"'{name}': expected {bound.text()}, got {short(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"'{name}': expected a finite number ({bound.text()}), got {value!r}")
    if not bound.lo <= value <= bound.hi:
        why = f" ({bound.why})" if bound.why else ""
        raise ValueError(f"'{name}': {short(value)} is out of range: must be {bound.text()}{why}")


def limit(key: str) -> Callable:
    """The attrs validator for field `key` of :data:`LIMITS`."""
    bound = LIMITS[key]
    return bounded(bound)


def limit_in(section: str) -> Callable:
    """The attrs validator of every field of a section: each checks ``LIMITS["section.<its name>"]``
    (a field without an entry is a programming error, raised on first use)."""

    def validate(inst, attribute, value):
        check(LIMITS[f"{section}.{attribute.name}"], attribute.name, value)

    return validate


def bounded(bound: Bound) -> Callable:
    """An attrs validator checking `bound` (the message names the attribute)."""

    def validate(inst, attribute, value):
        check(bound, attribute.name, value)

    validate.bound = bound  # type: ignore[attr-defined]
    return validate


def optional(key: str) -> Callable:
    """As :func:`limit`, but None passes (an unset optional field)."""
    inner = limit(key)

    def validate(inst, attribute, value):
        if value is not None:
            inner(inst, attribute, value)

    return validate


def between(lo: float, hi: float, *, integer: bool = False, why: str = "") -> Callable:
    """A validator for a plugin's option: ``lo ≤ value ≤ hi`` (an integer if `integer`)."""
    return bounded(Bound(lo, hi, integer, why))


def option_backstop(default) -> Callable | None:
    """The bound every option gets from its default's type unless it declares its own."""
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return None
    if isinstance(default, int):
        return bounded(Bound(-MAX_OPTION_INT, MAX_OPTION_INT, True))
    return bounded(Bound(-MAX_OPTION_FLOAT, MAX_OPTION_FLOAT, False))


def env_flag(name: str, raw: str | None) -> bool:
    """A boolean environment variable: 1/true/yes/on, 0/false/no/off or empty; anything else is
    an error naming the variable (``MOFA_STRICT_PLUGINS=maybe`` is not silently false)."""
    from .errors import ConfigError

    text = (raw or "").strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"", "0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={short(raw)}: expected 1/true/yes/on or 0/false/no/off (or unset it)")


def markdown_table() -> str:
    """The bounds as the Markdown table docs/bad-inputs.md shows (a test keeps the two in step)."""
    rows = ["| field | allowed | meaning |", "|---|---|---|"]
    for key, b in LIMITS.items():
        rows.append(f"| `{key}` | {b.text()} | {b.why} |")
    return "\n".join(rows) + "\n"


__all__ = ["LIMITS", "PROFILE_LIMITS", "Bound", "between", "bounded", "check", "decode_text", "env_flag", "limit",
           "limit_in", "optional", "short"]


def decode_text(data: bytes, where: str, fix: str) -> str:
    """A file's bytes as UTF-8 text (a leading byte-order mark dropped); for anything else one-line
    ConfigError starting with `where`, naming the first bad byte and ending with `fix`. The one decoder
    of job files, hardware profiles, measurement CSVs and HF config.json files."""
    from .errors import ConfigError

    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); {fix}") from None
