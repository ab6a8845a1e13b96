"""Eager PyTorch element-wise kernels (a cost transform beyond the paper): the extra HBM passes of a
framework that runs each norm, activation and rotary embedding as separate autograd kernels.

The base model prices a layer's element-wise work as fused kernels (Megatron-Core with Transformer
Engine / Apex, or ``torch.compile``): a norm reads and writes its tensor once, the activation reads
its input(s) and writes its output once, RoPE is fused into the attention's QKV path, and each
backward moves the same bytes as its forward. PyTorch eager mode (FSDP / FSDP2 frameworks without
``torch.compile``: llm-foundry, torchtitan's uncompiled runs) runs every op of the module's Python
code as its own kernel, and autograd runs the backward of each. Counting the bytes each kernel
reads and writes (bf16 tensors, fp32 where the module upcasts), per element of the tensor, on top of
the fused count (``decompose``: 2·2 bytes per norm element each pass, 3·2 per SwiGLU, 2·2 per GELU,
RoPE 0)::

    RMSNorm (composite: x.float(), pow, mean, ·rsqrt, type_as, ·weight)   fwd +32 B   bwd +72 B
    LayerNorm (one native kernel; backward: dx kernel + weight-grad kernel)    fwd  +0 B   bwd  +6 B
    SwiGLU  silu(a)·b: silu, mul; backward: two muls + silu'                  fwd  +4 B   bwd +12 B
    GELU    one kernel; backward reads the saved input and the gradient        fwd  +0 B   bwd  +2 B
    RoPE    complex: .float(), view_as_complex, ·freqs, view_as_real, type_as  fwd +20 B   bwd +20 B
            (per element of Q and K)

derived from the ops: RMSNorm forward 6 (2→4 B cast) + 8 (square) + 4 (mean) + 12 (x·r) + 6 (cast
back) + 4 (·weight) = 36 B against the fused 4; its backward is autograd through the same chain,
76 B against 4. So per token of one layer on one GPU (h_s the hidden size over the sequence-
parallel divisor, f the MLP width per TP rank, q/k widths a·d/t and kv·d/t)::

    ΔB_fwd = 2·n_fwd·h_s + a_fwd·f + 20·(a + kv)·d/t·[RoPE]
    ΔB_bwd = 2·n_bwd·h_s + a_bwd·f + 20·(a + kv)·d/t·[RoPE]

each priced as an element-wise operator (bandwidth-bound at η_m·BW_hbm; bytes only — the extra
launches are queued by a host that runs ahead of the GPU) and added to the layer's forward and backward-input times. Full recompute re-runs
the forward, so this runs before ``recompute``. **Choices**: the LM head's fp32 cross-entropy, the
attention output's layout copy and eager memory temporaries are not counted; MoE routed experts'
activations (grouped GEMM paths) are not changed; with ``torch.compile`` leave this feature off
(Inductor fuses each element-wise chain into one kernel: the fused count).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.decompose import elementwise_op
from mofa_framework.engine import price_operators
from mofa_framework.types import Activation, CostTransform

#: extra bytes per element over the fused kernels, (forward, backward), derived in the docstring
NORM_EXTRA = {"rmsnorm": (32.0, 72.0), "layernorm": (0.0, 6.0)}
ACT_EXTRA = {Activation.swiglu: (4.0, 12.0), Activation.gelu: (0.0, 2.0)}
ROPE_EXTRA = (20.0, 20.0)


def extra_bytes(model, g) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) extra bytes per micro-batch of one dense layer on one GPU."""
    h_s = model.hidden_size / g.sp_div
    f = model.ffn_hidden_size / g.t
    n_f, n_b = NORM_EXTRA[model.normalization]
    a_f, a_b = ACT_EXTRA.get(model.activation, (0.0, 0.0))
    qk = (model.num_attention_heads + model.num_kv_heads) * model.kv_channels / g.t
    rope = 1.0 if model.position_embedding == "rope" else 0.0
    T = g.tokens
    fwd = T * (2.0 * n_f * h_s + a_f * f + rope * ROPE_EXTRA[0] * qk)
    bwd = T * (2.0 * n_b * h_s + a_b * f + rope * ROPE_EXTRA[1] * qk)
    return fwd, bwd


def extra_seconds(ctx) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per micro-batch of one layer, priced as element-wise operators."""
    fwd_b, bwd_b = extra_bytes(ctx.model, ctx.geometry)
    # bytes only (kernels = 0): the extra kernels' launches are queued by a host that runs ahead
    ops = [elementwise_op(f"eager_elementwise_{p}", b, "norm", bwd=0.0, kernels=0.0)
           for p, b in (("fwd", fwd_b), ("bwd", bwd_b))]
    t_f, t_b = price_operators(ctx, ops)
    return np.where(fwd_b > 0, t_f, 0.0), np.where(bwd_b > 0, t_b, 0.0)


def layer(state, rows):
    fwd, bwd = state.ctx.per_structure(extra_seconds)
    out = {kind: attrs.evolve(c, fwd_compute_s=c.fwd_compute_s + fwd, bwd_input_s=c.bwd_input_s + bwd)
           for kind, c in state.layers.items()}
    return attrs.evolve(state, layers=out)


FEATURE = CostTransform(
    name="eager_kernels",
    description="PyTorch eager element-wise kernels (no torch.compile, no fused norm/activation/RoPE kernels): "
                "the extra HBM passes of composite RMSNorm, SwiGLU / GELU backward and complex RoPE",
    equation="ΔB_fwd/bwd = T·(2·n·h_s + a·f + 20·(a+kv)·d/t·[RoPE]) at η_m·BW_hbm, per layer",
    layer=layer,
    after=("fp8", "nvfp4", "cuda_graphs"),
    before=("kernel_scaling", "recompute", "memfine", "activation_offload", "fsdp", "tp_overlap", "cp_overlap",
            "ep_overlap", "dp_overlap", "pp_overlap"),
    tunable=False,  # a property of the software stack, not a knob: `mofa tune --features ...` searches it
    adds_time_only=True,
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
