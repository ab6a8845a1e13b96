"""What the readers know of a training framework's memory: the counter its peak-memory figure
reads, and a loss that is not Megatron's fused one. Shared by ``reader_dense`` and ``reader_nvidia``."""

from __future__ import annotations

import re


def memory_counter(framework: str, notes: str) -> str:
    """What a row's peak-memory figure counts (``MappedRow.memory_counter``).

    - torchtitan logs ``DeviceMemoryMonitor``'s ``max_reserved_gib``: the caching allocator's
      ``reserved_bytes.all.peak`` (``torchtitan/components/metrics.py``), no CUDA context or NCCL;
    - a figure the notes call an ``nvidia-smi`` reading counts everything on the device;
    - otherwise not stated ("peak GB"): compared with the whole predicted peak.
    """
    if "torchtitan" in framework.lower():
        return "reserved"
    if re.search(r"nvidia-smi", notes, re.I):
        return "device"
    return ""


def loss_features(framework: str, notes: str = "") -> dict:
    """torchtitan's loss is ``F.cross_entropy(pred.float(), labels)``: the ``fp32_cross_entropy``
    feature (12 bytes per logit element at its backward, not Megatron's fused 6). A run that says
    it compiles the model compiles the loss too, except under torchtitan's 2024 ``train.py`` (its
    loss compile was commented out, a TODO citing CUDA errors): rows whose notes or source date their
    versions in 2024 keep the eager loss."""
    if "torchtitan" not in framework.lower():
        return {}
    compiled = re.search(r"compile", notes, re.I) is not None and re.search(r"(?<!\d)2024-?(0[1-9]|1[0-2])(?!\d)", notes) is None
    return {"fp32_cross_entropy": {"compiled": True} if compiled else {}}



#: torchtitan's models expanded K and V to every query head before attention (``repeat_kv``) until
#: pytorch/torchtitan#2259, "GQA without kv repeats" (2026-01-27)
TORCHTITAN_GQA_SINCE = "2026-01-27"


def torch_cp_features(framework: str, cp: int, *, repeat_kv: bool, rotate: str = "allgather") -> dict:
    """torchtitan's context parallelism is PyTorch's ``context_parallel``: the ``torch_cp`` feature
    (empty without CP or for another framework)."""
    if cp <= 1 or "torchtitan" not in framework.lower():
        return {}
    return {"torch_cp": {"rotate": rotate, "repeat_kv": repeat_kv}}


def torchtitan_repeats_kv(release: str | None) -> bool:
    """Whether a torchtitan release (``YYYY-MM-DD``; None: not known, taken as current) predates
    :data:`TORCHTITAN_GQA_SINCE`."""
    return release is not None and release < TORCHTITAN_GQA_SINCE


#: the fused-attention kernel a framework runs by default (``[parallel] attention_kernel``), first
#: match on the ``framework`` column wins; anything else is "auto" (Megatron-Core / NeMo / Megatron-
#: Bridge: Transformer Engine's choice for the GPU):
#: - llm-foundry's benchmark launcher sets ``model.attn_impl`` from ``--attn_impl``, default "triton"
#:   (``scripts/train/benchmarking/submit_benchmarks.py``): the Triton FlashAttention of its MPT model;
#: - torchtitan calls ``F.scaled_dot_product_attention``, whose flash backend is FlashAttention-2;
#: - Meta's own 2024 training stack (Llama 3, arXiv 2407.21783: PyTorch-native, FSDP-style sharding;
#:   torchtitan is its open counterpart) does not name its kernel; its pre-training ran before
#:   FlashAttention-3 (2024-07) and before PyTorch's SDPA gained a cuDNN backend (2.5, 2024-10), so
#:   FlashAttention-2 is what PyTorch had. A whole word "Meta" (not "metaseq", OPT's 2022 stack).
FRAMEWORK_KERNELS = ((r"llm-foundry", "triton"), (r"torchtitan", "fa2"), (r"\bmeta\b(?!seq)", "fa2"))

#: NeMo Framework Launcher 24.01 to 24.07 (``launcher_scripts/conf/config.yaml``, ``env_vars``) sets
#: ``NVTE_FUSED_ATTN: 0  # Disable cudnn FA until we've tested it more``: Transformer Engine's
#: DotProductAttention then runs flash-attn 2 instead of cuDNN's fused attention, which it prefers on
#: Hopper (``attention.py``, v1.4: "Select FusedAttention on sm90"); 24.09 dropped the setting
NEMO_LAUNCHER_FA2 = re.compile(r"\bnemo\b.*?\b24\.0[1-7]\b", re.I)


def attention_kernel(framework: str, release: str = "") -> str:
    """The kernel a row's framework (and release) ran: :data:`FRAMEWORK_KERNELS`, then NeMo's 2024
    launcher releases that turned cuDNN's attention off, else "auto"."""
    fw = framework.lower()
    kernel = next((k for pattern, k in FRAMEWORK_KERNELS if re.search(pattern, fw)), None)
    if kernel is None and NEMO_LAUNCHER_FA2.search(f"{framework} {release}"):
        kernel = "fa2"
    return kernel or "auto"
