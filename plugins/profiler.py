"""``mofa profile``: measure your own GPUs and write a hardware profile grounded in them.

    pip install 'mofa[profile]'                      # PyTorch
    mofa profile --base h100-sxm5-80gb --name my-cluster --out my-cluster.toml
    torchrun --nnodes 2 --nproc-per-node 8 ... -m mofa_framework.cli profile ...   # + collectives

What it measures, on the device torch sees (``cuda`` when there is one, else the CPU):

- **GEMMs** (``[[gemm_profile]]``): the per-GPU shapes the zoo's models produce at common tensor
  parallelism — each layer's QKV, output, MLP-in and MLP-out projections, forward (m = tokens of a
  micro-batch) and the two backward GEMMs (the same FLOPs with k = tokens, or n and k swapped) —
  in every precision the device supports (bf16 and fp16; fp8 through ``torch._scaled_mm`` on
  compute capability ≥ 8.9);
- **fused attention** (``[[attention_profile]]``): ``scaled_dot_product_attention`` by head
  dimension and sequence length, causal, forward and backward, counting the causal-masked FLOPs
  (forward 4·b·h·s²·d/2, backward 2.5× that);
- **HBM bandwidth**: a device-to-device copy of a large buffer, written as the profile's
  ``memory_efficiency`` against the base profile's datasheet bandwidth;
- **the host link** (on a GPU): copies between a pinned host buffer and the device, each way, written
  as ``[interconnect] h2d_bandwidth_gbps`` / ``d2h_bandwidth_gbps`` (what the offload features and
  the CPU optimizer move data at; the shipped profiles take nvbandwidth's figures);
- **the host's CPU Adam** (one process, not under ``torchrun``): torch's fused AdamW over fp32
  weights on the process's threads, written as ``[host] cpu_optimizer_params_per_s`` (the CPU
  optimizer's update rate for the node);
- **collectives** (``[[collective_profile]]``, when launched with ``torchrun`` on ≥ 2 ranks):
  all-reduce, all-gather, reduce-scatter, all-to-all and p2p bus bandwidth by message size with
  nccl-tests' conventions, scope ``scaleup`` when every rank is on one node (``LOCAL_WORLD_SIZE ==
  WORLD_SIZE``) else ``scaleout``; a kind the backend lacks (gloo has no reduce-scatter) is skipped
  and named.

The profile is the ``--base`` profile (datasheet peaks, memory, links) renamed to ``--name``, with
those tables in it: the ``profiled_gemm``, ``profiled_attention`` and ``collectives`` providers
price with them at once, and ``mofa calibrate --hardware NAME`` then fits what no microbenchmark
measures from a few of your own step times. ``--quick`` (one model, one TP, tiny sizes) is what the
tests run on a CPU. Rank 0 writes the file.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import click

from mofa_framework import hookimpl
from mofa_framework.errors import ConfigError

#: models whose GEMM shapes the full sweep measures, and the tensor parallelism they run at
SWEEP_MODELS = ("llama3-8b", "llama3-70b", "llama3.1-405b", "gpt3-175b", "mixtral-8x7b")
SWEEP_TP = (1, 2, 4, 8)
SWEEP_TOKENS = (4096, 8192)
ATTENTION_HEAD_DIMS = (64, 128)
ATTENTION_SEQS = (1024, 2048, 4096, 8192)
MESSAGE_BYTES = tuple(2 ** e for e in range(16, 31, 2))
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
BEGIN = "# >>> microbenchmark tables (benchmarks/ground_profiles.py writes this block; do not edit)"
END = "# <<< microbenchmark tables"
PROFILE_BEGIN = "# >>> microbenchmark tables (measured by `mofa profile`)"


def _torch():
    try:
        import torch
    except ImportError:
        raise ConfigError("mofa profile needs PyTorch: pip install 'mofa[profile]' (or torch itself)") from None
    return torch


# ====================================================================== what to measure


def gemm_shapes(models, tps, tokens, scale: float = 1.0) -> list[tuple[int, int, int]]:
    """(m, n, k) of each model's dense-layer GEMMs at each TP and micro-batch token count: forward
    (m = tokens, n = the TP-sharded output, k = the input) and its backward data-gradient
    (m, k, n) and weight-gradient (n, k, m) GEMMs; `scale` shrinks every dimension (CPU tests)."""
    out = set()
    for model in models:
        h, a, kv = model.hidden_size, model.num_attention_heads, model.num_kv_heads
        d = model.kv_channels
        f = model.moe_ffn_hidden_size if model.num_experts else model.ffn_hidden_size
        up = 2 * f if model.activation.value == "swiglu" else f
        for t in tps:
            if a % t:
                continue
            for T in tokens:
                for m, n, k in ((T, (a * d + 2 * kv * d) // t, h), (T, h, a * d // t), (T, up // t, h), (T, h, f // t)):
                    for shape in ((m, n, k), (m, k, n), (n, k, m)):
                        out.add(tuple(max(16, int(round(x * scale / 16)) * 16) for x in shape))
    return sorted(out)


def _sig(x: float) -> float:
    """`x` to 5 significant digits (a CPU's TFLOPS are small, never rounded to 0)."""
    return float(f"{x:.5g}")


def _time(fn, sync, iters: int) -> float:
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def measure_gemms(torch, device, shapes, dtypes, iters: int) -> list[dict]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = []
    for dtype in dtypes:
        for m, n, k in shapes:
            if dtype == "fp8":
                a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
                one = torch.ones((), device=device)
                fn = lambda a=a, b=b: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            else:
                tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
                a, b = torch.randn(m, k, device=device, dtype=tdt), torch.randn(k, n, device=device, dtype=tdt)
                fn = lambda a=a, b=b: a @ b  # noqa: E731
            s = _time(fn, sync, iters)
            out.append({"m": m, "n": n, "k": k, "tflops": _sig(2.0 * m * n * k / s / 1e12), "dtype": dtype})
    return out


def measure_attention(torch, device, head_dims, seqs, iters: int, batch_heads: int = 16) -> list[dict]:
    import torch.nn.functional as F

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dt = torch.bfloat16
    out = []
    for d in head_dims:
        for s in seqs:
            q, k, v = (torch.randn(1, batch_heads, s, d, device=device, dtype=dt, requires_grad=True) for _ in range(3))
            fwd_flops = 4.0 * batch_heads * s * s * d / 2.0  # causal: half the square
            fwd = _time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), sync, iters)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            grad = torch.randn_like(o)

            def both():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y.backward(grad)

            # the backward is the difference of two timings; on a busy host it can come out at or
            # below zero. A fused attention backward is never shorter than its forward (FlashAttention's
            # is about 2.5×): the forward time bounds it, so noise cannot read as a kernel above peak
            bwd = max(_time(both, sync, iters) - fwd, fwd)
            out.append({"head_dim": d, "seq_len": s, "causal": True, "dtype": "bf16", "direction": "fwd",
                        "tflops": _sig(fwd_flops / fwd / 1e12)})
            out.append({"head_dim": d, "seq_len": s, "causal": True, "dtype": "bf16", "direction": "bwd",
                        "tflops": _sig(2.5 * fwd_flops / bwd / 1e12)})
    return out


def measure_copy_gbps(torch, device, nbytes: int, iters: int) -> float:
    """Device copy bandwidth, GB/s: a copy reads and writes every byte (BabelStream's Copy counts 2×)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    s = _time(lambda: y.copy_(x), sync, iters)
    return 2.0 * nbytes / s / 1e9


def measure_host_link_gbps(torch, device, nbytes: int, iters: int) -> tuple[float, float] | None:
    """(host → device, device → host) GB/s: copies of `nbytes` between a pinned host buffer and the
    device, as nvbandwidth's copy-engine tests time them; None on a CPU, which has no host link."""
    if device.type != "cuda":
        return None
    host = torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize
    h2d = _time(lambda: dev.copy_(host, non_blocking=True), sync, iters)
    d2h = _time(lambda: host.copy_(dev, non_blocking=True), sync, iters)
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


def measure_cpu_adam_params_per_s(torch, nparams: int, iters: int) -> float:
    """Parameters per second one AdamW step updates on this host's CPUs: torch's fused CPU AdamW
    (``foreach`` where this build has no fused kernel) over fp32 weights, gradients and moments, on
    the process's threads — the node's ``[host] cpu_optimizer_params_per_s`` when one process has
    the node's cores."""
    p = torch.zeros(nparams, dtype=torch.float32, requires_grad=True)
    p.grad = torch.rand(nparams, dtype=torch.float32)
    try:
        opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
        opt.step()
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW([p], lr=1e-4, foreach=True)
    return nparams / _time(opt.step, lambda: None, iters)


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (PERFORMANCE.md): busbw = algbw · factor."""
    return {"all_reduce": 2.0 * (n - 1) / n, "p2p": 1.0}.get(kind, (n - 1) / n)


def measure_collectives(torch, device, sizes, iters: int) -> tuple[list[dict], list[str]]:
    import torch.distributed as dist

    n, rank = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", n))
    scope = "scaleup" if local >= n else "scaleout"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out, skipped = [], []
    for kind in COLLECTIVES:
        try:
            for size in sizes:
                elems = max(size // 4 // n * n, n)  # float32, divisible by the group
                full = torch.ones(elems, device=device)
                part = torch.ones(elems // n, device=device)
                fn = {
                    "all_reduce": lambda: dist.all_reduce(full),
                    "all_gather": lambda: dist.all_gather_into_tensor(full, part),
                    "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
                    "all_to_all": lambda: dist.all_to_all_single(full, full.clone()),
                    "p2p": lambda: _pair(dist, full, rank, n),
                }[kind]
                dist.barrier()
                s = _time(fn, sync, iters)
                nbytes = elems * 4
                out.append({"kind": kind, "scope": scope, "group_size": 2 if kind == "p2p" else n,
                            "message_bytes": float(nbytes),
                            "busbw_gbps": _sig(nbytes / s / 1e9 * busbw_factor(kind, 2 if kind == "p2p" else n))})
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # the backend lacks it
            out = [p for p in out if p["kind"] != kind]
            skipped.append(f"{kind} ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})")
    return out, skipped


def _pair(dist, t, rank: int, n: int) -> None:
    """Ranks 0 and 1 exchange `t` (send then receive / receive then send); the others wait."""
    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
        dist.send(t, 0)


# ====================================================================== writing the profile


def _inline(d: dict) -> str:
    def val(x):
        if isinstance(x, bool):
            return "true" if x else "false"
        if isinstance(x, str):
            return f'"{x}"'
        if isinstance(x, float):
            return repr(float(f"{x:.6g}")) if abs(x) < 1e6 else f"{x:.6g}".replace("e+0", "e").replace("e+", "e")
        return str(x)

    return "{ " + ", ".join(f"{k} = {val(v)}" for k, v in d.items()) + " }"


def tables_block(gemm: list[dict], attention: list[dict], collective: list[dict], begin: str = BEGIN) -> str:
    """The three microbenchmark arrays (``[[gemm_profile]]`` … schema as arrays of inline tables)."""
    lines = [begin]
    for rows, field in ((gemm, "gemm_profile"), (attention, "attention_profile"), (collective, "collective_profile")):
        if rows:
            lines.append(f"{field} = [")
            lines += [f"  {_inline(p)}," for p in rows]
            lines.append("]")
    lines.append(END)
    return "\n".join(lines) + "\n"


def with_tables(text: str, block: str) -> str:
    """Profile TOML `text` with any earlier microbenchmark block replaced by `block`, placed before
    the first table header (top-level keys must precede tables)."""
    text = re.sub(r"\n*# >>> microbenchmark tables.*?" + re.escape(END) + r"\n+", "\n\n", text, flags=re.S)
    text = re.sub(r"^(gemm_profile|attention_profile|collective_profile) = \[.*?^\]\n", "", text, flags=re.S | re.M)
    i = re.search(r"^\[", text, flags=re.M).start()
    return text[:i].rstrip("\n") + "\n\n" + block + "\n" + text[i:]


def memory_fields(copy_gbps: float, datasheet_gbps: float) -> tuple[float, float | None]:
    """(``memory_efficiency``, a replacement ``hbm_bandwidth_gbps`` or None) for a device whose
    measured copy rate is `copy_gbps` against its base profile's datasheet `datasheet_gbps`: the
    efficiency against the datasheet — unless that falls under the least efficiency a profile
    accepts (a device far slower than its base: a CPU profiled with a GPU's specs), where the
    measured rate becomes the bandwidth, reached in full."""
    from mofa_framework.limits import LIMITS

    least = LIMITS["efficiency.memory_efficiency"].lo
    ratio = copy_gbps / datasheet_gbps
    if ratio >= least:
        return _sig(min(1.0, ratio)), None
    return 1.0, _sig(copy_gbps)


def set_hbm_bandwidth(text: str, gbps: float) -> str:
    return set_table_value(text, "memory", "hbm_bandwidth_gbps", str(gbps))


def set_memory_efficiency(text: str, value: float) -> str:
    return set_table_value(text, "efficiency", "memory_efficiency", str(value))


def set_table_value(text: str, table: str, key: str, value: str) -> str:
    """The profile text with ``[table] key = value`` set: replaced inside that table where present,
    else added under its header, else the table appended."""
    m = re.search(rf"^\[{table}\]\n(?:(?!\[).*\n?)*", text, flags=re.M)
    if m is None:
        return text.rstrip("\n") + f"\n\n[{table}]\n{key} = {value}\n"
    body = m.group(0)
    if re.search(rf"^{key} = ", body, flags=re.M):
        body = re.sub(rf"^{key} = .*$", f"{key} = {value}", body, count=1, flags=re.M)
    else:
        body = body.replace(f"[{table}]\n", f"[{table}]\n{key} = {value}\n", 1)
    return text[:m.start()] + body + text[m.end():]


def set_host_link(text: str, h2d_gbps: float, d2h_gbps: float) -> str:
    """The profile text with ``[interconnect] h2d_bandwidth_gbps`` / ``d2h_bandwidth_gbps`` set
    (:func:`set_table_value`; every profile has ``[interconnect]``: its scale-up link is required)."""
    if not re.search(r"^\[interconnect\]$", text, flags=re.M):
        raise ValueError("the profile has no [interconnect] table to put the host link in")
    for key, value in (("d2h_bandwidth_gbps", d2h_gbps), ("h2d_bandwidth_gbps", h2d_gbps)):
        text = set_table_value(text, "interconnect", key, str(round(float(value), 2)))
    return text


# ====================================================================== the command


def _dtypes(torch, device) -> list[str]:
    if device.type != "cuda":
        return ["bf16"]
    out = ["bf16", "fp16"]
    if torch.cuda.get_device_capability(device) >= (8, 9) and hasattr(torch, "_scaled_mm"):
        out.append("fp8")
    return out


def run_profile(base: str, name: str, out: Path, quick: bool, iters: int, device_name: str | None) -> dict:
    """Measure and write the profile; returns what was measured (for the summary)."""
    from mofa_framework.api import Predictor
    from mofa_framework.calibrate import profile_path, rename_profile

    torch = _torch()
    reg = Predictor().registry
    hw = reg.hardware_profile(base, field="--base")
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    models = [reg.model(m) for m in (("llama3-8b",) if quick else SWEEP_MODELS)]
    shapes = gemm_shapes(models, (8,) if quick else SWEEP_TP, (256,) if quick else SWEEP_TOKENS,
                         scale=1 / 32 if quick else 1.0)
    if quick:
        shapes = shapes[:6]
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    gemm = measure_gemms(torch, device, shapes, _dtypes(torch, device), iters)
    attention = measure_attention(torch, device, (64,) if quick else ATTENTION_HEAD_DIMS,
                                  (128, 256) if quick else ATTENTION_SEQS, iters, batch_heads=2 if quick else 16)
    copy = measure_copy_gbps(torch, device, (1 << 22) if quick else (1 << 30), iters)
    link = measure_host_link_gbps(torch, device, (1 << 22) if quick else (1 << 30), iters)
    # the host's Adam rate: one process with the node's cores (under torchrun each rank has one thread)
    adam = None if distributed else measure_cpu_adam_params_per_s(torch, (1 << 20) if quick else (1 << 26), iters)
    collective, skipped = [], []
    if distributed:
        collective, skipped = measure_collectives(torch, device, (2 ** 12, 2 ** 16) if quick else MESSAGE_BYTES, iters)
    rank0 = not distributed or torch.distributed.get_rank() == 0
    summary = {"device": str(device), "gemm": len(gemm), "attention": len(attention), "collective": len(collective),
               "skipped": skipped, "copy_gbps": copy, "host_link_gbps": link, "cpu_adam_params_per_s": adam,
               "path": str(out)}
    if rank0:
        text = rename_profile(profile_path(hw.name).read_text(), name,
                              f"{hw.display_name or hw.name} profiled by mofa profile as {name}")
        text = with_tables(text, tables_block(gemm, attention, collective, begin=PROFILE_BEGIN))
        eff, own_bw = memory_fields(copy, hw.memory.hbm_bandwidth_gbps)
        text = set_memory_efficiency(text, eff)
        against = f"memory_efficiency against {hw.name}'s datasheet {hw.memory.hbm_bandwidth_gbps:g} GB/s"
        if own_bw is not None:
            text = set_hbm_bandwidth(text, own_bw)
            against = (f"under 1 % of {hw.name}'s datasheet {hw.memory.hbm_bandwidth_gbps:g} GB/s, so "
                       "hbm_bandwidth_gbps is the measured rate and memory_efficiency 1")
        if link is not None:
            text = set_host_link(text, *link)
        if adam is not None:
            text = set_table_value(text, "host", "cpu_optimizer_params_per_s", f"{adam:.4g}")
        host = (f"host link {link[0]:.4g} / {link[1]:.4g} GB/s host to device / device to host (pinned copies)"
                if link is not None else f"no host link on {device.type} (h2d / d2h kept from {hw.name})")
        host += (f", CPU AdamW {adam:.4g} parameters/s on {torch.get_num_threads()} threads" if adam is not None
                 else f", CPU Adam not measured under torchrun (one thread per rank; kept from {hw.name})")
        what = (f" Measured by `mofa profile` on {device_name or device.type} ({time.strftime('%Y-%m-%d')}): "
                f"{len(gemm)} GEMM shapes, {len(attention)} attention kernels, device copy {copy:.4g} GB/s "
                f"({against}), {host}, {len(collective)} collective points; specs from {hw.name}.")
        text = re.sub(r'^(notes = ".*?)(?: Microbenchmarks:.*)?"$', lambda m: m.group(1) + what + '"', text, count=1,
                      flags=re.M)
        try:
            out.write_text(text)
        except OSError as exc:
            raise ConfigError(f"--out {out}: cannot write: {exc}") from None
    if distributed:
        torch.distributed.barrier()
    return summary


@click.command("profile")
@click.option("--base", required=True, help="Registered profile whose datasheet specs (peaks, memory, links) the "
                                            "new one starts from, e.g. h100-sxm5-80gb.")
@click.option("--name", required=True, help="Name of the new profile (lowercase kebab-case).")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="TOML file to write (put it in a MOFA_HARDWARE_PATH directory to use it).")
@click.option("--quick", is_flag=True, help="A tiny sweep (one model, small shapes): seconds on a CPU.")
@click.option("--iters", default=10, show_default=True, type=click.IntRange(1, 10_000),
              help="Timed repetitions per measurement.")
@click.option("--device", "device_name", default=None, help="torch device (default: cuda when present, else cpu).")
def profile_cmd(base, name, out, quick, iters, device_name):
    """Measure GEMMs, attention, HBM and collectives on this machine; write a hardware profile."""
    from mofa_framework.types import KEBAB

    if not KEBAB.match(name):
        raise ConfigError(f"--name {name!r}: must be lowercase kebab-case (e.g. 'my-cluster')")
    s = run_profile(base, name, out, quick, iters, device_name)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    link = s["host_link_gbps"]
    click.echo(f"profiled on {s['device']}: {s['gemm']} GEMMs, {s['attention']} attention kernels, "
               f"copy {s['copy_gbps']:.1f} GB/s, "
               + (f"host link {link[0]:.1f} / {link[1]:.1f} GB/s, " if link is not None else "")
               + (f"CPU AdamW {s['cpu_adam_params_per_s']:.3g} parameters/s, "
                  if s["cpu_adam_params_per_s"] is not None else "")
               + f"{s['collective']} collective points"
               + (f" (skipped: {', '.join(s['skipped'])})" if s["skipped"] else "") + f" → {s['path']}")


@hookimpl
def mofa_register_commands(cli):
    cli.add_command(profile_cmd)
