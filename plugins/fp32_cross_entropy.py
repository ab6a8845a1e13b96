"""The loss as PyTorch's ``cross_entropy`` on logits upcast to fp32 (torchtitan, Hugging Face
trainers), instead of Megatron's fused vocab-parallel cross entropy (the engine's default,
``engine.LOSS_BYTES_PER_LOGIT`` = 6 bytes per logit element).

``loss = F.cross_entropy(logits.float(), labels)`` keeps, per logit element (``b·s·V/t`` of them on
the stage holding the output layer):

- forward: the bf16 logits (2, held by the training loop until the loss is formed), their fp32
  copy (4) and ``log_softmax``'s fp32 output (4, saved for backward): 10 bytes;
- backward (the loop has dropped the bf16 logits, torchtitan's ``del pred``): the saved
  ``log_softmax`` output (4), the dense fp32 gradient ``nll_loss`` returns (4) and
  ``log_softmax_backward``'s fp32 result (4): **12 bytes**, the peak, before the cast back to bf16
  (4 + 2) frees them.

So ``M_loss = b·s·V/t · 12 · (1 + MTP heads)`` replaces the fused loss's ``· 6``.

``compiled = true`` (torchtitan from 2025, ``components/loss.py``, compiles the loss with the model;
its 2024 ``train.py`` left it uncompiled, a TODO citing CUDA errors): Inductor fuses the upcast,
``log_softmax`` and ``nll_loss`` forward and backward; only the bf16 logits (2, saved) and a
per-row fp32 log-sum-exp are kept, and the backward writes the bf16 gradient (2) directly:
**4 bytes** per logit element.

No time is changed (the loss is a small share of the step; its FLOPs are in the output layer's GEMM).
"""

from __future__ import annotations

import attrs
import numpy as np

from mofa_framework import hookimpl
from mofa_framework.engine import LOSS_BYTES_PER_LOGIT
from mofa_framework.types import CostTransform, option

#: the peak bytes per logit element of the upcast loss, eager and compiled (module docstring)
UPCAST_BYTES_PER_LOGIT = 12.0
COMPILED_BYTES_PER_LOGIT = 4.0


@attrs.frozen(kw_only=True)
class Fp32CrossEntropyOptions:
    compiled: bool = option(False, doc="the loss is compiled with torch.compile (torchtitan 2025 with compile "
                                       "on): 4 bytes per logit element instead of 12")


def memory(state, rows):
    mem = state.mem
    per_logit = np.where(rows.options["compiled"] > 0.5, COMPILED_BYTES_PER_LOGIT, UPCAST_BYTES_PER_LOGIT)
    return attrs.evolve(state, mem=attrs.evolve(mem, logits_bytes=mem.logits_bytes * (per_logit / LOSS_BYTES_PER_LOGIT)))


FEATURE = CostTransform(
    name="fp32_cross_entropy",
    description="the loss is PyTorch's cross_entropy on fp32-upcast logits (torchtitan, HF), not Megatron's "
                "fused vocab-parallel loss: 12 bytes per logit element at its backward instead of 6",
    equation="M_loss = b·s·V/t · (12, compiled 4) · (1 + MTP)",
    options_type=Fp32CrossEntropyOptions,
    memory=memory,
    lowers_memory=("logits_loss",),  # compiled: 4 bytes per logit against Megatron's fused 6
    applies=lambda batch, model, hardware: np.ones(len(batch), dtype=bool),
    tunable=False,  # the framework's loss is not a tuning knob
)


@hookimpl
def mofa_register_cost_transforms():
    return [FEATURE]
