"""Reader of vTrain's profile set (the ``reader_vtrain`` plugin).

``vtrain_single_node_a100.csv``: GPT models on one node of A100s under Microsoft's
Megatron-DeepSpeed, architecture by columns (hidden size, attention heads, layers, sequence) and
the layout (TP, DP, PP, micro and global batch), iteration time in ms. What vTrain's repository
and descriptions say the runs used, and the rows do not: GELU, LayerNorm and learned positions,
GPT-2's vocabulary padded to 50,304, fp16, full activation recompute, plain 1F1B, no sequence
parallelism, unfused attention, torch DDP's overlapped all-reduce; and its cluster's network:
nodes of 8 GPUs joined by 4 × 200 Gb/s InfiniBand (``../shared/data/README.md``; vTrain's own
configurations give ``inter_node_bandwidth = 800`` Gb/s per node, ``src/config.py``), half the
NICs of the DGX A100 the profile describes — 12.5 GB/s per GPU between nodes. One node's rows
never cross it; a multi-node row in this schema does.
"""

from __future__ import annotations

from mofa_framework import hookimpl
from mofa_framework.measurements import ReadContext
from mofa_framework.types import MappedRow, MeasurementReader, SkippedRow

COLUMNS = ("# GPUs", "global batch", "hidden size", "# layers", "iteration time (ms)")
#: Megatron-DeepSpeed's GPT-2 vocabulary (50,257) padded to a multiple of 128
VTRAIN_VOCAB = 50304
#: the profile of an A100 node; vTrain's rows name no GPU
VTRAIN_GPU = "a100-sxm4-80gb"
#: GB/s per GPU between vTrain's nodes: 4 × 200 Gb/s NICs per node of 8 GPUs (800 Gb/s / 8 bits / 8 GPUs)
VTRAIN_SCALEOUT_GBPS = 800.0 / 8.0 / 8.0


def map_row(r: dict, ctx: ReadContext) -> MappedRow | SkippedRow:
    c = ctx.count
    h, a, L = c(r, "hidden size"), c(r, "attention heads"), c(r, "# layers")
    seq, n = c(r, "sequence length"), c(r, "# GPUs")
    tp, dp, pp = c(r, "tensor parallelism"), c(r, "data parallelism"), c(r, "pipeline parallelism")
    mbs, gbs = c(r, "micro batch"), c(r, "global batch")
    ms = ctx.number(r, "iteration time (ms)")
    rid = str(ctx.index + 1)
    name = f"vtrain-h{h}-a{a}-l{L}"
    missing = [k for k, x in (("hidden size", h), ("attention heads", a), ("# layers", L), ("sequence length", seq),
                              ("tensor parallelism", tp), ("data parallelism", dp), ("pipeline parallelism", pp),
                              ("micro batch", mbs), ("global batch", gbs), ("iteration time (ms)", ms)) if not x]
    if missing:
        return SkippedRow(source=ctx.source, reference="vTrain", row_id=rid, model=name,
                          reason=f"{', '.join(missing)} not stated")
    if tp * dp * pp != n:
        return SkippedRow(source=ctx.source, reference="vTrain", row_id=rid, model=name,
                          reason=f"tp·dp·pp = {tp * dp * pp} ≠ # GPUs = {n}")
    model = {"name": name, "num_layers": L, "hidden_size": h, "num_attention_heads": a, "num_kv_heads": a,
             "ffn_hidden_size": 4 * h, "vocab_size": VTRAIN_VOCAB, "activation": "gelu",
             "normalization": "layernorm", "position_embedding": "learned"}
    par = {"tp": tp, "pp": pp, "micro_batch_size": mbs, "global_batch_size": gbs,
           "sequence_length": seq, "sequence_parallel": False, "precision": "fp16", "flash_attention": False}
    # on another profile (``mofa validate --hardware``) the rows take that profile's network too
    hw = {"name": ctx.hardware.name} if ctx.hardware else {"name": VTRAIN_GPU, "scaleout_bandwidth_gbps": VTRAIN_SCALEOUT_GBPS}
    job = {"model": model, "hardware": {**hw, "num_gpus": n}, "parallel": par,
           "pipeline": {"schedule": "1f1b"}, "features": {"recompute": {"granularity": "full"}}}
    if dp > 1:
        job["features"]["dp_overlap"] = {}
    return MappedRow(source=ctx.source, reference="vTrain", row_id=rid, job=job, measured_s=ms / 1e3,
                     target="iteration time (ms)", group=(ctx.source, name, n, seq),
                     framework="Megatron-DeepSpeed (vTrain)")


READER = MeasurementReader(
    name="vtrain", description="vTrain's single-node A100 profiles (Megatron-DeepSpeed, fp16, full recompute, 1F1B)",
    columns=frozenset(COLUMNS), map_row=map_row, sources=("vTrain (Bang et al. 2024)",))


@hookimpl
def mofa_register_measurement_readers():
    return [READER]
