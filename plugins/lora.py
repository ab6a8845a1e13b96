"""LoRA fine-tuning: the base model frozen, low-rank adapters trained (Hu et al. 2021,
arXiv 2106.09685; NeMo 2 and Megatron-Bridge ``peft = LoRA(dim=r, target_modules=[...])``).

Each adapted linear layer ``y = x·W`` becomes ``y = x·W + (x·A)·B`` with ``A`` (in × r) and ``B``
(r × out) trained and ``W`` frozen. Megatron partitions the adapters with their layer: for a
column-parallel layer (QKV, FC1) ``A`` is replicated and ``B`` sharded, for a row-parallel one
(output projection, FC2) ``A`` sharded and ``B`` replicated, so a GEMM of per-GPU shape m×n×k
gains exactly

    A: m × r × k        B: m × n × r        (per member of a grouped expert GEMM)

**Time (layer phase).**

- No weight gradient for the frozen layer weights: the layer's backward-weight time becomes
  the adapters' own (and the TP-GEMM and expert groups the overlap features read lose their
  weight-gradient share).
- The adapter GEMMs, priced by the operator provider at the row's precision: forward, input
  gradient and weight gradient each. Small GEMMs pay the profile's GPU-side ``kernel_launch_s``
  but not its host floor ``host_dispatch_s``: the host issues them while the GPU runs the frozen
  layer's large GEMMs.
- The embedding and the LM head are frozen too: :attr:`~mofa_framework.types.Feature.frozen_weights`
  tells the core, which then prices no backward for the embedding, no weight gradient for the
  head, and counts model FLOPs as forward + input gradient for each weight GEMM (NeMo's
  convention for its LoRA rows: ``2·F + F_attention``).

**Optimizer (optimizer phase).** Gradients, their data-parallel reduction and the update cover
the adapters only: with ``f = P_adapters / P_model`` (the adapters' share of the model's
parameters, per row's rank and targets) the DP communication, the update, the host time and the
gradient bytes are × f.

**Memory (memory phase).** Gradients and optimizer state × f; weights × (1 + f) (the adapters,
kept in the weights' dtype). Activations are unchanged: each adapter's ``A`` needs the input its
frozen layer saved for the weight gradient, which LoRA no longer computes.

Targets (``targets``): ``all`` = linear_qkv, linear_proj, linear_fc1, linear_fc2 (NeMo's and
Megatron-Bridge's default; on MoE layers FC1/FC2 adapt every expert and the shared experts);
``qkv`` (Megatron-Bridge's LoRA performance recipes); ``attention`` (QKV + output projection);
``mlp`` (FC1 + FC2). A Mamba mixer's in/out projections count as QKV / output projection.

With ``fsdp`` (Megatron-FSDP, FSDP2: HF PEFT's and NeMo AutoModel's LoRA) the frozen weights stay
sharded and are gathered for every layer as before, but no gradient of theirs is reduce-scattered
or held unsharded (``fsdp`` reads ``frozen_weights``).

Not modelled (each ≤ r/h of its frozen layer's cost): the adapters' own TP collectives (an
all-reduce or gather of the m × r latent), their saved m × r latents and, under ``fsdp``, their
gradients' reduce-scatter; LoRA dropout (NeMo's default 0); DoRA. Full-parameter fine-tuning (SFT)
needs no feature: it is priced as pretraining.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import GEMM, Geometry, Op, layer_operators, total_params
from mofa_framework.engine import price_operators
from mofa_framework.types import CostTransform, option
from mofa_plugins._lowp import REPRICE_BEFORE, with_op_deltas

#: target choice → adapted modules (Megatron module names without ``linear_``)
TARGETS = {"all": ("qkv", "proj", "fc1", "fc2"), "qkv": ("qkv",), "attention": ("qkv", "proj"),
           "mlp": ("fc1", "fc2")}
#: layer groups whose GEMMs the TP overlap features read (their weight-gradient share goes)
TP_GROUPS = ("qkv", "proj", "mlp")


@attrs.frozen(kw_only=True)
class LoraOptions:
    rank: int = option(32, validator=attrs.validators.gt(0), doc="adapter rank r (NeMo / Megatron-Bridge `dim`)")
    targets: str = option("all", choices=tuple(TARGETS),
                          doc="adapted modules: all (QKV, output projection, FC1, FC2), qkv, attention, mlp")


def module_of(op: Op) -> str | None:
    """The LoRA target module an operator is (None: not adaptable: attention core, router, norms)."""
    if np.any(np.asarray(op.kind) != GEMM) or not op.bwd_weight:
        return None
    if op.group in ("qkv", "proj"):
        return op.group
    for suffix in ("fc1", "fc2"):
        if op.name.endswith(suffix):
            return suffix
    return None


def adapter_operators(op: Op, rank) -> list[Op]:
    """The A (m×r×k) and B (m×n×r) GEMMs LoRA adds beside `op`, as many members as it has."""
    r = np.asarray(rank, dtype=np.float64)
    out = []
    for name, (m, n, k) in (("a", (op.m, r, op.k)), ("b", (op.m, op.n, r))):
        m, n, k = (np.asarray(x, dtype=np.float64) for x in np.broadcast_arrays(m, n, k))
        out.append(Op(name=f"lora_{name}_{op.name}", kind=GEMM, flops=2.0 * m * n * k * op.count,
                      bytes=(m * k + k * n + m * n) * 2.0 * op.count, m=m, n=n, k=k, group="lora", count=op.count))
    return out


def _targeted(rows, module: str) -> np.ndarray:
    """Rows whose target choice adapts `module`."""
    return np.logical_or.reduce([rows.choice("targets", t) for t, mods in TARGETS.items() if module in mods])


def _issued_ahead(ctx):
    """`ctx` without the profile's per-kernel host floor (``host_dispatch_s``): an adapter's two small
    GEMMs are issued while the GPU still runs the large GEMMs of its frozen layer, so the host is not
    what they wait for (the floor binds where every kernel of a step is small). The GPU-side
    ``kernel_launch_s`` stays."""
    eff = ctx.hardware.efficiency
    if eff.host_dispatch_s <= 0.0:
        return ctx
    return attrs.evolve(ctx, hardware=attrs.evolve(ctx.hardware, efficiency=attrs.evolve(eff, host_dispatch_s=0.0)))


def without_weight_gradients(ctx, c, ops):
    """Layer costs `c` with no weight gradient: backward-weight time 0, and the TP-GEMM and expert
    groups (which the overlap features read) without their weight-gradient share. The share is
    each group's priced W scaled to the layer's current W (after FP8 or faster kernels)."""
    n = len(np.asarray(c.bwd_weight_s))
    weighted = [o for o in ops if o.bwd_weight]
    base_w = [t * o.bwd_weight for t, o in zip(price_operators(ctx, weighted), weighted)]
    total_w = sum(base_w, np.zeros(n))
    scale = np.where(total_w > 0, np.asarray(c.bwd_weight_s) / np.where(total_w > 0, total_w, 1.0), 0.0)
    group_w = lambda groups: scale * sum((w for w, o in zip(base_w, weighted) if o.group in groups),  # noqa: E731
                                         np.zeros(n))
    return attrs.evolve(c, bwd_weight_s=np.zeros(n), tp_gemm_bwd_s=np.maximum(c.tp_gemm_bwd_s - group_w(TP_GROUPS), 0.0),
                        expert_bwd_s=np.maximum(c.expert_bwd_s - group_w(("expert",)), 0.0))


def with_adapters(ctx, c, ops, rows):
    """Layer costs `c` plus the adapters of the modules each row targets (forward, input and weight
    gradient), priced without the host floor."""
    rank = np.asarray(rows.options["rank"], dtype=np.float64)
    adapters, masks = [], []
    for o in ops:
        module = module_of(o)
        if module is not None:
            pair = adapter_operators(o, rank)
            adapters += pair
            masks += [_targeted(rows, module)] * len(pair)
    times = price_operators(_issued_ahead(ctx), adapters) if adapters else []
    return with_op_deltas(c, adapters, [np.where(mk, t, 0.0) for t, mk in zip(times, masks)])


def layer(state, rows):
    ctx = state.ctx
    out = {}
    for kind, c in state.layers.items():
        ops = layer_operators(ctx.model, ctx.geometry, kind)
        out[kind] = with_adapters(ctx, without_weight_gradients(ctx, c, ops), ops, rows)
    return attrs.evolve(state, layers=out)


def module_widths(model) -> dict[str, float]:
    """Per target module, Σ (in + out) over the model's adaptable GEMMs (unsharded; every expert):
    an adapter of rank r on them holds r × this many parameters."""
    key = ("lora_module_widths",)
    if key not in model.derived:
        widths = dict.fromkeys(("qkv", "proj", "fc1", "fc2"), 0.0)
        unit = Geometry.unit(np.array([1.0]))
        for kind, count in model.executed_kind_counts.items():
            for o in layer_operators(model, unit, kind):
                module = module_of(o)
                if module is not None:
                    widths[module] += count * float(np.asarray(o.count).ravel()[0]) * float(
                        np.asarray(o.n).ravel()[0] + np.asarray(o.k).ravel()[0])
        model.derived[key] = widths
    return dict(model.derived[key])


def adapter_params(model, options) -> float:
    """Parameters of the adapters for one set of options (what a LoRA checkpoint holds)."""
    return float(options.rank) * sum(module_widths(model)[m] for m in TARGETS[options.targets])


def adapter_fraction(model, rows) -> np.ndarray:
    """Per row, f = adapter parameters / model parameters (unsharded), for its rank and targets."""
    width = sum((np.where(_targeted(rows, mod), w, 0.0) for mod, w in module_widths(model).items()), 0.0)
    return np.asarray(rows.options["rank"], dtype=np.float64) * width / total_params(model)["total"]


def optimizer(state, rows):
    f = adapter_fraction(state.ctx.model, rows)
    o = state.opt
    return attrs.evolve(state, opt=attrs.evolve(
        o, dp_comm_s=o.dp_comm_s * f, dp_exposed_s=o.dp_exposed_s * f, update_s=o.update_s * f,
        host_s=o.host_s * f, dense_grad_bytes=o.dense_grad_bytes * f, expert_grad_bytes=o.expert_grad_bytes * f))


def memory(state, rows):
    f = adapter_fraction(state.ctx.model, rows)[None, :]
    mem = state.mem
    return attrs.evolve(state, mem=attrs.evolve(
        mem, grads_bytes=mem.grads_bytes * f, optimizer_bytes=mem.optimizer_bytes * f,
        weights_bytes=mem.weights_bytes * (1.0 + f)))


#: module names (Megatron-Core / NeMo 2 and NeMo 1) → the module each adapts
MODULE_NAMES = {"linear_qkv": "qkv", "attention_qkv": "qkv", "linear_proj": "proj", "attention_dense": "proj",
                "linear_fc1": "fc1", "mlp_fc1": "fc1", "linear_fc2": "fc2", "mlp_fc2": "fc2"}


def targets_of(names) -> str:
    """The ``targets`` choice for a config's ``target_modules`` (NeMo 1's ``all``, or names of
    :data:`MODULE_NAMES`): the exact set when one matches, else the smallest choice covering them."""
    words = [w.strip().strip("'\"[]") for n in names for w in str(n).split(",")]
    if not words or "all" in words:
        return "all"
    mods = {MODULE_NAMES.get(w.split(".")[-1], w) for w in words if w}
    covering = [t for t, m in TARGETS.items() if mods <= set(m)]
    return min(covering, key=lambda t: len(TARGETS[t])) if covering else "all"


def from_megatron(args):
    """A NeMo / Megatron-Bridge config's PEFT section (``mofa import nemo``): ``peft: LoRA(dim,
    target_modules)`` or NeMo 1's ``peft_scheme: lora`` with ``lora_tuning.adapter_dim`` read as
    ``--lora``, ``--lora-rank``, ``--lora-target-modules`` (Megatron-LM itself has no LoRA)."""
    if not args.has("--lora"):
        return None
    out = {"targets": targets_of(args.values("--lora-target-modules"))}
    rank = args.value("--lora-rank")
    if rank is not None and rank.isdigit() and int(rank) > 0:
        out["rank"] = int(rank)
    return out


def megatron_args(options) -> list[str]:
    o = options if options is not None else LoraOptions()
    mods = ", ".join(f"linear_{m}" for m in TARGETS[o.targets])
    return [f"# LoRA (no Megatron-LM flag): NeMo 2 / Megatron-Bridge peft=LoRA(dim={o.rank}, target_modules=[{mods}])"]


FEATURE = CostTransform(
    name="lora",
    description="LoRA fine-tuning: the base model frozen (no weight gradients, gradients or optimizer state "
                "but the adapters'), rank-r adapter GEMMs beside the adapted layers",
    equation="W_layer = Σ_adapters t(A,B)·1; + t(A: m×r×k) + t(B: m×n×r) per adapted GEMM; grads, optimizer, "
             "DP × f = P_adapters/P; model FLOPs 2·F + F_attention",
    options_type=LoraOptions,
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    layer=layer,
    optimizer=optimizer,
    memory=memory,
    after=("fp8", "nvfp4"),
    before=(*REPRICE_BEFORE, "distributed_optimizer", "dp_overlap", "fsdp"),
    conflicts=("deepspeed_zero", "cpu_optimizer"),
    tunable=False,  # the job's choice (a fine-tuning method), held on when the job sets it
    may_reduce_compute=True,
    frozen_weights=True,
    trainable_params=adapter_params,
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
