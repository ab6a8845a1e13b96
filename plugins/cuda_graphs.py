"""CUDA graphs: captured kernels are replayed without the host issuing them one by one (a cost
transform beyond the paper).

The operator provider prices every operator at least at ``kernels × host_dispatch_s``: the CPU
thread that feeds the stream must issue each kernel, and an operator whose kernels finish faster
than that is host-bound (eager PyTorch; small or fragmented work such as the MoE router and token
permutation). A CUDA graph replays a captured sequence with one launch, so for the operators it
covers that floor goes away. Per operator in scope::

    Δt_op = t_op(host_dispatch_s = 0) − t_op        (≤ 0)

applied to the layer's forward, backward-input and backward-weight times by the operator's
backward multiples, and to the per-group times the overlap features read — through the same
helper the low-precision features use (``plugins/_lowp.py``). On a profile whose
``host_dispatch_s`` is 0 the feature changes nothing. The GPU-side ``kernel_launch_s`` stays: the
kernels still run one after another.

Scope (Megatron-Core ``--cuda-graph-scope``):

- ``full_iteration`` (``--cuda-graph-impl local``): every operator of every transformer layer;
- per module (``--cuda-graph-impl transformer_engine``): ``attn`` — the norms, QKV, attention core
  and output projection; ``mlp`` — a dense layer's MLP (and MoE shared experts); ``moe_router`` —
  the router GEMM and its top-k / score kernels; ``moe_preprocess`` — the token permutation.
  Routed experts are not capturable per module (their shapes depend on the routing).

**Choices.** The embedding and LM head stay as they are (outside the layers); recomputed forward
operators keep their host cost (``recompute`` prices them itself); the graphs' static buffers are
not counted in memory (they hold tensors the step keeps anyway, as long as the captured
micro-batches are the ones in flight). Runs after the features that re-price operators (``fp8``,
``nvfp4``) and before the overlaps, which must see the final compute times.
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import layer_operators
from mofa_framework.engine import price_operators
from mofa_framework.types import CostTransform, option
from mofa_plugins._lowp import with_op_deltas

SCOPES = ("full_iteration", "per_module")
#: operator groups each per-module scope covers (decompose.Op.group), and single operators by name
MODULE_GROUPS = {"attn": ("norm", "qkv", "core_attn", "proj"), "mlp": ("mlp",), "moe_router": ("router",)}
MODULE_OPS = {"moe_preprocess": ("permute",)}
MODULES = ("attn", "mlp", "moe_router", "moe_preprocess")


@attrs.frozen(kw_only=True)
class CudaGraphsOptions:
    scope: str = option("full_iteration", choices=SCOPES,
                        doc="full_iteration: every layer operator is captured; per_module: the modules below")
    attn: bool = option(True, doc="per_module: capture the attention block (norms, QKV, core, projection)")
    mlp: bool = option(True, doc="per_module: capture a dense layer's MLP (and MoE shared experts)")
    moe_router: bool = option(True, doc="per_module: capture the MoE router and its top-k kernels")
    moe_preprocess: bool = option(True, doc="per_module: capture the MoE token permutation")


def _in_scope(rows, op) -> np.ndarray:
    """Rows (bool, N) on which operator `op` is captured."""
    covered = rows.choice("scope", "full_iteration")
    for module in MODULES:
        if op.group in MODULE_GROUPS.get(module, ()) or op.name in MODULE_OPS.get(module, ()):
            covered = covered | (rows.choice("scope", "per_module") & (rows.options[module] > 0.5))
    return rows.enabled & covered


def layer(state, rows):
    ctx = state.ctx
    hw = ctx.hardware
    if hw.efficiency.host_dispatch_s <= 0.0:
        return state
    graphed = attrs.evolve(ctx, hardware=attrs.evolve(hw, efficiency=attrs.evolve(hw.efficiency, host_dispatch_s=0.0)))
    out = {}
    for kind, c in state.layers.items():
        ops = layer_operators(ctx.model, ctx.geometry, kind)
        base, fast = price_operators(ctx, ops), price_operators(graphed, ops)
        deltas = [np.where(_in_scope(rows, o), tg - t0, 0.0) for o, t0, tg in zip(ops, base, fast)]
        out[kind] = with_op_deltas(c, ops, deltas)
    return attrs.evolve(state, layers=out)


def megatron_args(options) -> list[str]:
    o = options if options is not None else CudaGraphsOptions()
    if o.scope == "full_iteration":
        return ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]
    return ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", *[m for m in MODULES if getattr(o, m)]]


def from_megatron(args):
    """``--cuda-graph-impl local`` or scope ``full_iteration``: the whole iteration; ``transformer_engine``:
    per module (``--cuda-graph-scope``; none given = every module). ``--enable-cuda-graph`` /
    ``--external-cuda-graph`` are the older spellings of local / per module."""
    impl = args.value("--cuda-graph-impl", "none")
    scope = args.values("--cuda-graph-scope")
    local, external = args.has("--enable-cuda-graph"), args.has("--external-cuda-graph")
    if impl == "none" and not (local or external):
        return None
    if impl in ("local", "full_iteration") or local or "full_iteration" in scope:
        return {"scope": "full_iteration"}
    return {"scope": "per_module", **({m: m in scope for m in MODULES} if scope else {})}


FEATURE = CostTransform(
    name="cuda_graphs",
    description="CUDA graphs: captured layer operators are replayed without the host's per-kernel dispatch "
                "(the profile's host_dispatch_s floor)",
    equation="Δt_op = t_op(host_dispatch_s = 0) − t_op for the operators in scope",
    megatron_args=megatron_args,
    from_megatron=from_megatron,
    options_type=CudaGraphsOptions,
    layer=layer,
    after=("fp8", "nvfp4"),
    before=("kernel_scaling", "recompute", "memfine", "activation_offload", "tp_overlap", "cp_overlap",
            "ep_overlap", "dp_overlap", "pp_overlap"),
    tunable=False,  # a software-stack setting: `mofa tune --features ...,cuda_graphs` searches it
    may_reduce_compute=True,
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
