"""Value objects and the typed records plugins return.

Everything here is a frozen attrs class with validators. Files are read into these by the
cattrs converter in :mod:`mofa_framework.config`; human units (GiB, GB/s, TFLOPS, µs) live
only in field names that say so, and the SI properties (``*_bytes``, ``*_bytes_per_s``,
``*_flops_per_s``, ``*_s``) are derived once here.
"""

from __future__ import annotations

import enum
import functools
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from attrs import validators as v

from .limits import LIMITS, check, limit, limit_in, option_backstop
from .stack import BlockSpec, kind_key, pattern_blocks
from .units import DTYPE_BYTES, GIB, gbps_to_bytes_per_s, tflops_to_flops_per_s

KEBAB = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def _kebab(inst, attribute, value):
    if not KEBAB.match(value):
        raise ValueError(f"'{attribute.name}' must be lowercase kebab-case (e.g. 'h100-sxm5-80gb'), got {value!r}")


def _snake(inst, attribute, value):
    if not SNAKE.match(value):
        raise ValueError(f"'{attribute.name}' must be a snake_case identifier (e.g. 'tp_overlap'), got {value!r}")


#: counts and sizes of hardware records (GPUs per node, GEMM dimensions) are at most 2**31, their
#: rates and capacities (TFLOPS, GiB, GB/s, parameters/s) at most 1e15: finite however they are read
_pos_int = [v.instance_of(int), v.ge(1), v.le(2**31)]
_nonneg_int = [v.instance_of(int), v.ge(0)]


#: each field of a hardware profile's table checks its own bound (``limits.PROFILE_LIMITS``)
_MEMORY, _INTERCONNECT, _HOST, _EFFICIENCY = (limit_in(s) for s in ("memory", "interconnect", "host", "efficiency"))


def _pos_float(default=None):
    return attrs.field(default=default, converter=float, validator=[v.gt(0.0), v.le(1e15)])


def _tuple_of_str(x) -> tuple[str, ...]:
    return tuple(str(i) for i in x)


_BLOCK_KEYS = ("mixer", "attention", "output_gate", "ffn", "compress_ratio", "indexed")


def _block_table(d) -> dict[str, BlockSpec]:
    """``{symbol: BlockSpec}``: one character each, not a digit, a parenthesis or a space; each block a
    table of ``mixer``, ``attention``, ``output_gate``, ``ffn``, ``compress_ratio``, ``indexed``."""
    if not isinstance(d, Mapping):
        raise ValueError(f"blocks must be a table of symbol = {{{', '.join(_BLOCK_KEYS)}}}, got {d!r:.60}")
    out = {}
    for symbol, block in d.items():
        if not (isinstance(symbol, str) and len(symbol) == 1 and not symbol.isdigit() and symbol not in "() \t"):
            raise ValueError(f"blocks: symbol {symbol!r} must be one character (not a digit, parenthesis or space)")
        if isinstance(block, BlockSpec):
            out[symbol] = block
            continue
        if not isinstance(block, Mapping):
            raise ValueError(f"blocks.{symbol} must be a table of {', '.join(_BLOCK_KEYS)}, got {block!r:.60}")
        unknown = sorted(set(map(str, block)) - set(_BLOCK_KEYS))
        if unknown:
            raise ValueError(f"blocks.{symbol}: unknown key(s) {', '.join(unknown)} (known: {', '.join(_BLOCK_KEYS)})")
        out[symbol] = BlockSpec(**block)
    return out


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------


class Activation(enum.Enum):
    swiglu = "swiglu"  #: gated MLP, three matrices (SwiGLU, GeGLU)
    gelu = "gelu"  #: classic two-matrix MLP


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A model's architecture, in HuggingFace/Megatron field names.

    Dense, MoE (routed + shared experts, leading dense layers) and MLA attention are all
    described by the same record; fields that do not apply stay 0. A stack whose layers
    differ — hybrid Mamba/attention, local/global or chunked attention, linear attention, MoE
    on some layers — is spelled in ``layer_pattern`` (:mod:`mofa_framework.stack`); the
    engine prices each kind of layer (``block_kinds``) once.
    """

    name: str = attrs.field(validator=_kebab)
    num_layers: int = attrs.field(validator=limit("model.num_layers"))
    hidden_size: int = attrs.field(validator=limit("model.hidden_size"))
    num_attention_heads: int = attrs.field(validator=limit("model.num_attention_heads"))
    num_kv_heads: int = attrs.field(validator=limit("model.num_kv_heads"))
    ffn_hidden_size: int = attrs.field(validator=limit("model.ffn_hidden_size"))
    vocab_size: int = attrs.field(validator=limit("model.vocab_size"))
    display_name: str = ""
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    source: str = ""
    notes: str = ""
    activation: Activation = attrs.field(default=Activation.swiglu, converter=Activation)
    normalization: str = attrs.field(default="rmsnorm", validator=v.in_(("rmsnorm", "layernorm")))
    position_embedding: str = attrs.field(default="rope", validator=v.in_(("rope", "learned", "alibi", "none")))
    tied_embeddings: bool = False
    dropout: bool = False
    #: the parallel transformer block (GPT-J, PaLM, Falcon, GPT-NeoX, MegaScale): attention and MLP
    #: both read the layer's normalised input and their outputs join one residual add, so under
    #: TP one all-gather (or all-reduce) feeds both and one reduce-scatter follows their sum
    parallel_attention_mlp: bool = attrs.field(default=False, validator=v.instance_of(bool))
    head_dim: int = attrs.field(default=0, validator=limit("model.head_dim"))
    max_sequence_length: int = attrs.field(default=0, validator=limit("model.max_sequence_length"))
    num_experts: int = attrs.field(default=0, validator=limit("model.num_experts"))
    experts_per_token: int = attrs.field(default=0, validator=limit("model.experts_per_token"))
    moe_ffn_hidden_size: int = attrs.field(default=0, validator=limit("model.moe_ffn_hidden_size"))
    num_shared_experts: int = attrs.field(default=0, validator=limit("model.num_shared_experts"))
    first_k_dense_layers: int = attrs.field(default=0, validator=limit("model.first_k_dense_layers"))
    #: group-limited routing (DeepSeek-V3; Megatron's --moe-router-num-groups / --moe-router-group-topk,
    #: HF n_group / topk_group): the experts form this many groups and a token's top-k experts come
    #: from its best ``moe_router_group_topk`` groups. 0 = unrestricted routing
    moe_router_num_groups: int = attrs.field(default=0, validator=limit("model.moe_router_num_groups"))
    moe_router_group_topk: int = attrs.field(default=0, validator=limit("model.moe_router_group_topk"))
    moe_layer_frequency: int = attrs.field(default=1, validator=limit("model.moe_layer_frequency"))
    #: routing load imbalance: token-expert pairs on the busiest expert-parallel rank over the mean
    #: (1 = balanced, as NVIDIA's benchmarks force it; dropless routing in training is above 1; with
    #: token dropping and padding to capacity it is the capacity factor). The busiest rank sets the
    #: pace of every EP rank: its expert compute, all-to-all volume and expert activations scale by it
    moe_load_factor: float = attrs.field(default=1.0, converter=float, validator=limit("model.moe_load_factor"))
    q_lora_rank: int = attrs.field(default=0, validator=limit("model.q_lora_rank"))
    kv_lora_rank: int = attrs.field(default=0, validator=limit("model.kv_lora_rank"))
    qk_nope_head_dim: int = attrs.field(default=0, validator=limit("model.qk_nope_head_dim"))
    qk_rope_head_dim: int = attrs.field(default=0, validator=limit("model.qk_rope_head_dim"))
    v_head_dim: int = attrs.field(default=0, validator=limit("model.v_head_dim"))
    num_mtp_layers: int = attrs.field(default=0, validator=limit("model.num_mtp_layers"))
    #: the layers of one MTP module, in the layer_pattern symbols (Megatron's
    #: --mtp-hybrid-override-pattern, e.g. "*E": an attention layer then an MoE layer); empty = one
    #: layer of the stack's last kind (DeepSeek-V3). With a layer_pattern its symbols may name blocks
    #: the stack does not use (DeepSeek-V4 Pro's window-only MTP layer): those kinds are priced too
    mtp_layer_pattern: str = attrs.field(default="", validator=[v.instance_of(str), v.max_len(256)])
    #: the MTP modules share one set of weights, run num_mtp_layers times (Megatron's
    #: --mtp-use-repeated-layer): compute and activations per module, parameters once
    mtp_shared_weights: bool = attrs.field(default=False, validator=v.instance_of(bool))
    #: LatentMoE (Nemotron 3 Super/Ultra; Megatron's --moe-latent-size): the routed experts read and
    #: write this width; a down projection (hidden → latent) before dispatch and an up projection
    #: (latent → hidden) after the combine wrap them. 0 = the hidden size (a plain MoE)
    moe_latent_size: int = attrs.field(default=0, validator=limit("model.moe_latent_size"))
    sliding_window: int = attrs.field(default=0, validator=limit("model.sliding_window"))
    #: share of the layers whose attention is windowed (GPT-OSS alternates sliding-window and
    #: full-attention layers: 0.5); the others attend to the whole causal prefix
    sliding_window_layer_fraction: float = attrs.field(default=1.0, converter=float,
                                                       validator=[v.ge(0.0), v.le(1.0)])
    # -- the layer stack (mofa_framework/stack.py; docs/job-file.md "Layer stacks") -----------
    #: one symbol per layer, with counts and groups ("M-M*-", "D3X58", "(LLLG)12"); repeated to
    #: num_layers and cut there. Empty: the stack follows first_k_dense_layers and moe_layer_frequency
    layer_pattern: str = attrs.field(default="", validator=[v.instance_of(str), v.max_len(1 << 16)])
    #: symbols of layer_pattern beyond (or redefining) the built-in ones, e.g. {"L": {attention = "sliding"}}
    blocks: Any = attrs.field(factory=dict, converter=lambda d: _block_table(d))  # {symbol: BlockSpec}
    #: chunked attention (Llama 4): queries attend to the keys of their own chunk of this many tokens
    attention_chunk_size: int = attrs.field(default=0, validator=limit("model.attention_chunk_size"))
    #: width of the shared expert(s) of an MoE layer; 0 = num_shared_experts × moe_ffn_hidden_size
    shared_expert_ffn_hidden_size: int = attrs.field(default=0, validator=limit("model.shared_expert_ffn_hidden_size"))
    #: Mamba-2 (SSD) and Mamba mixers: state size N, head dimension P, heads H (0 = expand·h/P),
    #: B/C groups G, causal conv1d width, SSD chunk length Q, expand (d_inner = expand·h when H = 0),
    #: and Mamba-1's Δ rank (0 = ⌈h/16⌉)
    mamba_state_size: int = attrs.field(default=128, validator=limit("model.mamba_state_size"))
    mamba_head_dim: int = attrs.field(default=64, validator=limit("model.mamba_head_dim"))
    mamba_num_heads: int = attrs.field(default=0, validator=limit("model.mamba_num_heads"))
    mamba_num_groups: int = attrs.field(default=1, validator=limit("model.mamba_num_groups"))
    mamba_conv_kernel: int = attrs.field(default=4, validator=limit("model.mamba_conv_kernel"))
    mamba_chunk_size: int = attrs.field(default=128, validator=limit("model.mamba_chunk_size"))
    mamba_expand: int = attrs.field(default=2, validator=limit("model.mamba_expand"))
    mamba_dt_rank: int = attrs.field(default=0, validator=limit("model.mamba_dt_rank"))
    #: gated DeltaNet / linear attention mixers: key and value heads (query heads = key heads) and
    #: their dimensions, causal conv1d width, chunk length of the chunked (WY) algorithm
    linear_num_key_heads: int = attrs.field(default=0, validator=limit("model.linear_num_key_heads"))
    linear_num_value_heads: int = attrs.field(default=0, validator=limit("model.linear_num_value_heads"))
    linear_key_head_dim: int = attrs.field(default=128, validator=limit("model.linear_key_head_dim"))
    linear_value_head_dim: int = attrs.field(default=128, validator=limit("model.linear_value_head_dim"))
    linear_conv_kernel: int = attrs.field(default=4, validator=limit("model.linear_conv_kernel"))
    linear_chunk_size: int = attrs.field(default=64, validator=limit("model.linear_chunk_size"))
    # -- DeepSeek-V4's attention and residual (docs/job-file.md "Compressed attention") -----------
    #: one key/value projection whose output serves as both keys and values (K = V; DeepSeek-V4's
    #: single shared KV head); the query comes from a ``q_lora_rank`` latent when that is set
    kv_shared: bool = attrs.field(default=False, validator=v.instance_of(bool))
    #: grouped low-rank output projection: the heads form ``o_groups`` groups, each projected to
    #: ``o_lora_rank`` before one projection of all groups to the hidden size. 0 = a plain o_proj
    o_lora_rank: int = attrs.field(default=0, validator=limit("model.o_lora_rank"))
    o_groups: int = attrs.field(default=1, validator=limit("model.o_groups"))
    #: the lightning indexer of indexed compressed attention: pooled keys picked per query, its
    #: heads and head dimension (its scores are ReLU(q·k) summed over heads with learned weights)
    index_topk: int = attrs.field(default=0, validator=limit("model.index_topk"))
    index_num_heads: int = attrs.field(default=0, validator=limit("model.index_num_heads"))
    index_head_dim: int = attrs.field(default=0, validator=limit("model.index_head_dim"))
    #: hyper-connections (DeepSeek-V4's manifold-constrained ones, HF ``hc_mult``): the residual is
    #: this many streams of the hidden size, mixed before and after every sublayer. 1 = a plain residual
    hyper_connections: int = attrs.field(default=1, validator=limit("model.hyper_connections"))

    def __attrs_post_init__(self):
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_experts:
            if not (1 <= self.experts_per_token <= self.num_experts):
                raise ValueError("experts_per_token must be between 1 and num_experts for an MoE model")
            if self.moe_ffn_hidden_size <= 0:
                raise ValueError("moe_ffn_hidden_size must be > 0 for an MoE model (num_experts > 0)")
        if self.moe_router_num_groups:
            g, top = self.moe_router_num_groups, self.moe_router_group_topk
            if not self.num_experts or self.num_experts % g:
                raise ValueError(f"moe_router_num_groups ({g}) must divide num_experts ({self.num_experts})")
            if not 1 <= top <= g:
                raise ValueError(f"moe_router_group_topk must be between 1 and moe_router_num_groups ({g})")
            if self.experts_per_token > top * (self.num_experts // g):
                raise ValueError("experts_per_token exceeds the experts of moe_router_group_topk groups")
        elif self.moe_router_group_topk:
            raise ValueError("moe_router_group_topk needs moe_router_num_groups")
        if self.first_k_dense_layers > self.num_layers:
            raise ValueError("first_k_dense_layers cannot exceed num_layers")
        if not (self.head_dim or self.is_mla) and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) / num_attention_heads ({self.num_attention_heads}) is "
                             f"not a whole head dimension: give head_dim, or a hidden_size that heads divide")
        if self.moe_load_factor != 1.0 and not self.is_moe:
            raise ValueError(f"moe_load_factor ({self.moe_load_factor:g}) applies to MoE models only, and "
                             f"{self.name!r} has no experts: leave it out")
        if self.kv_lora_rank and not (self.qk_nope_head_dim + self.qk_rope_head_dim and self.v_head_dim):
            raise ValueError("an MLA model (kv_lora_rank > 0) needs qk_nope_head_dim/qk_rope_head_dim and v_head_dim")
        _check_stack(self)

    # -- derived -----------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_channels(self) -> int:
        """Per-head dimension of Q/K/V for non-MLA attention."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.kv_channels

    @property
    def v_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.kv_channels

    @property
    def num_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        if self.layer_pattern:
            return sum(self.kind_counts.get(k, 0) for k in self.moe_kinds)
        rest = self.num_layers - self.first_k_dense_layers
        return len(range(0, rest, self.moe_layer_frequency))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # -- the layer stack -----------------------------------------------------------------
    def with_num_layers(self, n: int) -> ModelSpec:
        """The same model cut (or extended) to `n` layers: the first `n` layers of its stack — a
        ``layer_pattern`` keeps repeating past its end, ``first_k_dense_layers`` is capped at `n`
        (docs/job-file.md, "Fewer layers")."""
        return attrs.evolve(self, num_layers=n, first_k_dense_layers=min(self.first_k_dense_layers, n))

    @functools.cached_property
    def layer_kinds(self) -> tuple[str, ...]:
        """The kind (:func:`~mofa_framework.stack.kind_key`) of each layer, first to last.

        Without ``layer_pattern``: ``"dense"`` layers (attention + MLP), and ``"moe"`` ones
        (attention + MoE) from layer ``first_k_dense_layers`` on, every ``moe_layer_frequency``-th
        (Megatron's ``--moe-layer-freq``)."""
        if self.layer_pattern:
            unit = [kind_key(b) for b in self._unit]
            return tuple((unit * -(-self.num_layers // len(unit)))[:self.num_layers])
        return tuple(self._legacy_kind(i) for i in range(self.num_layers))

    @functools.cached_property
    def block_kinds(self) -> dict[str, BlockSpec]:
        """Each distinct kind of layer and its block, in order of first appearance (without a
        pattern: ``dense`` before ``moe``)."""
        if self.layer_pattern:
            kinds = {kind_key(b): b for b in self._unit[:self.num_layers]}
            for b in self._mtp_blocks:  # an MTP module's own kinds follow the stack's (DeepSeek-V4 Pro)
                kinds.setdefault(kind_key(b), b)
            return kinds
        legacy = {"dense": BlockSpec(), "moe": BlockSpec(ffn="moe")}
        return {k: legacy[k] for k in self.kind_counts}

    @functools.cached_property
    def kind_counts(self) -> dict[str, int]:
        """Layers of each kind (keys in :attr:`block_kinds` order)."""
        if not self.layer_pattern:
            counts = {"dense": self.num_dense_layers, "moe": self.num_moe_layers}
            return {k: n for k, n in counts.items() if n}
        unit = [kind_key(b) for b in self._unit]
        reps, rest = divmod(self.num_layers, len(unit))
        counts = dict.fromkeys(self.block_kinds, 0)
        for i, k in enumerate(unit):
            counts[k] = counts.get(k, 0) + reps + (i < rest)
        return {k: n for k, n in counts.items() if n}

    @property
    def moe_kinds(self) -> tuple[str, ...]:
        """The kinds of layer with an MoE (routed experts)."""
        return tuple(k for k, b in self.block_kinds.items() if b.ffn == "moe")

    @property
    def mtp_kind(self) -> str:
        """The kind of the layer each multi-token-prediction module repeats: the stack's last."""
        last = self.num_layers - 1
        return kind_key(self._unit[last % len(self._unit)]) if self.layer_pattern else self._legacy_kind(last)

    @functools.cached_property
    def mtp_kind_counts(self) -> dict[str, int]:
        """Layers of each kind in one multi-token-prediction module: ``mtp_layer_pattern``'s, else
        one layer of the stack's last kind (empty without MTP)."""
        if not self.num_mtp_layers:
            return {}
        if not self.mtp_layer_pattern:
            return {self.mtp_kind: 1}
        counts: dict[str, int] = {}
        for k in map(kind_key, self._mtp_blocks):
            counts[k] = counts.get(k, 0) + 1
        return counts

    @functools.cached_property
    def executed_kind_counts(self) -> dict[str, int]:
        """Layers of each kind one sequence runs through: the stack's, plus each kind's layers of
        the MTP modules times ``num_mtp_layers`` (a kind only the MTP modules use included)."""
        mtp = self.mtp_kind_counts
        return {k: self.kind_counts.get(k, 0) + self.num_mtp_layers * mtp.get(k, 0)
                for k in {**self.kind_counts, **mtp}}

    @functools.cached_property
    def _mtp_blocks(self) -> tuple[BlockSpec, ...]:
        """The blocks of one MTP module's ``mtp_layer_pattern`` (as the stack's: full attention without
        a window is the model's attention); empty without one."""
        if not (self.num_mtp_layers and self.mtp_layer_pattern):
            return ()
        out = pattern_blocks(self.mtp_layer_pattern, self.blocks, "mtp_layer_pattern")
        if not self.sliding_window:
            out = [attrs.evolve(b, attention="model") if b.attention == "full" else b for b in out]
        return tuple(out)

    @property
    def mtp_param_copies(self) -> int:
        """Sets of MTP weights the model holds: one when the modules share them, else one each."""
        return min(1, self.num_mtp_layers) if self.mtp_shared_weights else self.num_mtp_layers

    @property
    def expert_width(self) -> int:
        """The width the routed experts read and write: ``moe_latent_size``, else the hidden size."""
        return self.moe_latent_size or self.hidden_size

    def _legacy_kind(self, i: int) -> str:
        first = self.first_k_dense_layers
        return "moe" if self.is_moe and i >= first and (i - first) % self.moe_layer_frequency == 0 else "dense"

    @functools.cached_property
    def derived(self) -> dict:
        """Values derived from this model alone, memoised by the engine (per-kind parameters and
        FLOPs weights): a model is immutable, so they never go stale."""
        return {}

    @functools.cached_property
    def _unit(self) -> tuple[BlockSpec, ...]:
        """The blocks of the expanded pattern; full attention without a model window is the model's
        attention (one kind, whichever way it is written)."""
        out = pattern_blocks(self.layer_pattern, self.blocks)
        if not self.sliding_window:
            out = [attrs.evolve(b, attention="model") if b.attention == "full" else b for b in out]
        return tuple(out)

    def block(self, kind: str) -> BlockSpec:
        """The block of layer kind `kind` (``"dense"``/``"moe"`` are always known)."""
        if kind in self.block_kinds:
            return self.block_kinds[kind]
        legacy = {"dense": BlockSpec(), "moe": BlockSpec(ffn="moe")}
        if kind in legacy:
            return legacy[kind]
        raise KeyError(f"model {self.name!r} has no layer kind {kind!r} (it has {', '.join(self.block_kinds)})")

    @property
    def mixers(self) -> frozenset[str]:
        """The mixers (and attention types) the stack uses."""
        return frozenset(b.mixer for b in self.block_kinds.values())

    @property
    def shared_expert_ffn(self) -> int:
        """Width of an MoE layer's shared expert(s) (0: none)."""
        return self.shared_expert_ffn_hidden_size or self.num_shared_experts * self.moe_ffn_hidden_size

    @property
    def mamba_heads(self) -> int:
        return self.mamba_num_heads or self.mamba_expand * self.hidden_size // self.mamba_head_dim

    @property
    def mamba_inner_size(self) -> int:
        """d_inner: Mamba-2's heads × head dimension; Mamba-1's expand × hidden."""
        return self.mamba_num_heads * self.mamba_head_dim if self.mamba_num_heads else self.mamba_expand * self.hidden_size

    @property
    def mamba_delta_rank(self) -> int:
        return self.mamba_dt_rank or -(-self.hidden_size // 16)


def _check_latent_and_mtp(m: ModelSpec) -> None:
    """LatentMoE needs experts and a latent no wider than the model; without a layer pattern, MTP
    modules' layers must be kinds the stack has (a patterned stack prices an MTP module's own kinds
    too: they are in ``block_kinds``, with no layer of the stack)."""
    if m.moe_latent_size and not m.num_experts:
        raise ValueError(f"moe_latent_size ({m.moe_latent_size}) applies to MoE models only: leave it out or set "
                         f"num_experts")
    if m.moe_latent_size > m.hidden_size:
        raise ValueError(f"moe_latent_size ({m.moe_latent_size}) must not exceed hidden_size ({m.hidden_size})")
    if (m.mtp_layer_pattern or m.mtp_shared_weights) and not m.num_mtp_layers:
        raise ValueError("mtp_layer_pattern / mtp_shared_weights describe MTP modules but num_mtp_layers is 0: "
                         "set num_mtp_layers or leave them out")
    if m.mtp_layer_pattern and not m.layer_pattern:
        extra = sorted(set(m.mtp_kind_counts) - set(m.block_kinds))
        if extra:
            raise ValueError(f"mtp_layer_pattern {m.mtp_layer_pattern!r} has layer kind(s) {', '.join(extra)} the "
                             f"stack does not have (it has {', '.join(m.block_kinds)}): use the stack's symbols")


def _check_stack(m: ModelSpec) -> None:
    """The layer stack's own rules (ModelSpec's post-init)."""
    _check_latent_and_mtp(m)
    if m.blocks and not m.layer_pattern:
        raise ValueError("blocks defines layer symbols but layer_pattern is empty: give the pattern that uses them")
    if m.layer_pattern and (m.first_k_dense_layers or m.moe_layer_frequency != 1):
        raise ValueError("first_k_dense_layers / moe_layer_frequency describe a stack without layer_pattern: "
                         "write the dense and MoE layers into layer_pattern instead")
    # the rules read the pattern's blocks, not only the first num_layers (a shorter model keeps its
    # MoE and window settings even when its first layers have none)
    blocks = set(m._unit) if m.layer_pattern else list(m.block_kinds.values())  # parses the pattern
    has_moe = any(b.ffn == "moe" for b in blocks)
    if m.layer_pattern and has_moe and not m.num_experts:
        raise ValueError("layer_pattern has MoE blocks but num_experts is 0: set num_experts, experts_per_token "
                         "and moe_ffn_hidden_size")
    if m.layer_pattern and m.num_experts and not has_moe:
        raise ValueError("num_experts is set but layer_pattern has no MoE block ('E', 'X' or a block with ffn = 'moe')")
    attention = [b.attention for b in blocks if b.is_attention]
    if "sliding" in attention and not m.sliding_window:
        raise ValueError("layer_pattern has sliding-window attention blocks: set sliding_window (keys per query)")
    if "chunked" in attention and not m.attention_chunk_size:
        raise ValueError("layer_pattern has chunked attention blocks: set attention_chunk_size (tokens per chunk)")
    if any(b.indexed for b in blocks) and not (m.index_topk and m.index_num_heads and m.index_head_dim):
        raise ValueError("layer_pattern has indexed compressed attention blocks: set index_topk, index_num_heads and "
                         "index_head_dim (the lightning indexer's picks per query, heads and head dimension)")
    if m.o_lora_rank and m.num_attention_heads % m.o_groups:
        raise ValueError(f"o_groups ({m.o_groups}) must divide num_attention_heads ({m.num_attention_heads})")
    if m.o_groups != 1 and not m.o_lora_rank:
        raise ValueError(f"o_groups ({m.o_groups}) needs o_lora_rank (the grouped low-rank output projection's width)")
    if m.kv_shared and m.is_mla:
        raise ValueError("kv_shared describes one key/value projection without MLA's latent: leave out kv_lora_rank")
    mixers = m.mixers
    if "mamba2" in mixers:
        if m.mamba_heads < 1 or m.mamba_heads % m.mamba_num_groups:
            raise ValueError(f"mamba_num_groups ({m.mamba_num_groups}) must divide the Mamba-2 heads ({m.mamba_heads}; "
                             "mamba_num_heads, or mamba_expand × hidden_size / mamba_head_dim)")
    if mixers & {"gated_deltanet", "linear_attention"}:
        hk, hv = m.linear_num_key_heads, m.linear_num_value_heads
        if not hk or not hv or hv % hk:
            raise ValueError(f"linear_num_key_heads ({hk}) and linear_num_value_heads ({hv}) must be > 0, the key heads "
                             "dividing the value heads, for gated_deltanet / linear_attention blocks")
    if m.shared_expert_ffn_hidden_size and not m.num_experts:
        raise ValueError("shared_expert_ffn_hidden_size needs an MoE model (num_experts > 0)")


# ---------------------------------------------------------------------------------------
# Hardware
# ---------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ComputeSpec:
    #: dense peak per numeric format, TFLOPS (file units)
    peak_tflops: Mapping[str, float] = attrs.field(converter=lambda d: {str(k): float(x) for k, x in d.items()})

    @peak_tflops.validator
    def _check(self, attribute, value):
        if "bf16" not in value:
            raise ValueError("compute.peak_tflops needs at least a 'bf16' entry")
        unknown = set(value) - set(DTYPE_BYTES)
        if unknown:
            raise ValueError(f"compute.peak_tflops has unknown formats {sorted(unknown)}; known: {sorted(DTYPE_BYTES)}")
        for fmt, tflops in value.items():
            check(LIMITS["compute.peak_tflops"], f"peak_tflops.{fmt}", tflops)

    #: streaming multiprocessors (compute units): the GEMM model's occupancy term spreads a
    #: GEMM's 128×128 output tiles (split along k) over them; 0 = unknown (no occupancy term)
    sm_count: int = attrs.field(default=0, validator=limit("compute.sm_count"))
    #: GPU architecture ("ampere", "hopper", "blackwell", "cdna3", …; "" = not stated): which published
    #: attention-kernel benchmarks apply (``attention_kernels.toml`` of the built-in plugins)
    architecture: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    #: watts: the board power the peaks and the microbenchmark tables were measured at (the GPU's
    #: rated TDP); 0 = not stated (then no power limit can be applied)
    tdp_w: float = attrs.field(default=0.0, converter=float, validator=limit("compute.tdp_w"))
    #: watts: the power limit the job's GPUs run at (``nvidia-smi -pl``; Meta's Grand Teton H100s:
    #: 500); 0 = the TDP. Below it, tensor-core work runs at :attr:`HardwareProfile.compute_clock_scale`
    power_limit_w: float = attrs.field(default=0.0, converter=float, validator=limit("compute.power_limit_w"))

    @power_limit_w.validator
    def _check_power(self, attribute, value):
        if value <= 0.0:
            return
        if self.tdp_w <= 0.0:
            raise ValueError(f"compute.power_limit_w = {value:g} needs the rated power the profile's peaks and "
                             "tables were measured at: set compute.tdp_w (the GPU's TDP) too")
        if value > self.tdp_w:
            raise ValueError(f"compute.power_limit_w = {value:g} is above the rated compute.tdp_w = {self.tdp_w:g}: "
                             f"a board cannot be limited above its rating; give at most {self.tdp_w:g}")
        if value <= IDLE_POWER_FRACTION * self.tdp_w:
            raise ValueError(f"compute.power_limit_w = {value:g} is at or below the GPU's idle draw "
                             f"(~{IDLE_POWER_FRACTION * self.tdp_w:g} W of its {self.tdp_w:g} W): give a limit above it")


#: a GPU's static (idle and leakage) draw as a fraction of its TDP: an H100 SXM idles at ~70 W of
#: its 700 W, an A100 SXM at ~50–60 W of 400 W. Only the rest scales with the clock
IDLE_POWER_FRACTION = 0.1


@attrs.frozen(kw_only=True)
class MemorySpec:
    hbm_gib: float = attrs.field(converter=float, validator=_MEMORY)
    hbm_bandwidth_gbps: float = attrs.field(converter=float, validator=_MEMORY)


@attrs.frozen(kw_only=True)
class InterconnectSpec:
    scaleup_domain_gpus: int = attrs.field(validator=_INTERCONNECT)
    scaleup_bandwidth_gbps: float = attrs.field(converter=float, validator=_INTERCONNECT)
    scaleout_bandwidth_gbps: float = attrs.field(converter=float, validator=_INTERCONNECT)
    h2d_bandwidth_gbps: float = attrs.field(default=32.0, converter=float, validator=_INTERCONNECT)
    d2h_bandwidth_gbps: float = attrs.field(default=32.0, converter=float, validator=_INTERCONNECT)


@attrs.frozen(kw_only=True)
class HostSpec:
    cpu_memory_gib: float = attrs.field(default=1024.0, converter=float, validator=_HOST)
    disk_read_gbps: float = attrs.field(default=2.0, converter=float, validator=_HOST)
    disk_write_gbps: float = attrs.field(default=2.0, converter=float, validator=_HOST)
    #: CPU Adam update throughput of one node, parameters per second
    cpu_optimizer_params_per_s: float = attrs.field(default=2.0e9, converter=float, validator=_HOST)


@attrs.frozen(kw_only=True)
class EfficiencySpec:
    """Coefficients of the cost model (paper eqs. [1]–[3], [17]–[20]); fit by `mofa calibrate`.

    Defaults are documented in docs/cost-model.md; a shipped profile overrides them only with
    fitted values.
    """

    #: η_c: fraction of peak a large GEMM sustains (modified roofline, [1])
    gemm_efficiency: float = attrs.field(default=0.80, converter=float, validator=_EFFICIENCY)
    #: size at which a GEMM reaches half of η_c·peak, expressed in seconds of peak work
    gemm_half_efficiency_s: float = attrs.field(default=2.0e-6, converter=float, validator=_EFFICIENCY)
    #: GEMM dimension at which a GEMM reaches half its rate along that dimension: the M×N output is
    #: cut into tiles and the K loop is pipelined, so dimensions not ≫ a tile (the batched K = 64/128
    #: GEMMs of unfused attention, narrow TP shards) run below peak. The size factor gains
    #: ``Π_{x ∈ m, n, k} x/(x + d½)``. 0 removes it (the default)
    gemm_half_dim: float = attrs.field(default=0.0, converter=float, validator=_EFFICIENCY)
    #: the reduction dimension's own d½ (the K loop's prologue and epilogue, not the output's tile
    #: padding): 0 uses ``gemm_half_dim`` for k too (the default)
    gemm_half_dim_k: float = attrs.field(default=0.0, converter=float, validator=_EFFICIENCY)
    #: fixed cost of one kernel launch on the GPU's stream (launch + tail), seconds; paid once per
    #: kernel of every operator and pass (a grouped GEMM is one launch)
    kernel_launch_s: float = attrs.field(default=0.0, converter=float, validator=_EFFICIENCY)
    #: host (CPU) time to dispatch one kernel — Python, the framework's op dispatch and autograd
    #: bookkeeping on the thread that feeds the stream. An operator cannot finish before its
    #: kernels have been issued, so it takes at least ``kernels × host_dispatch_s``: small models
    #: in eager frameworks are host-bound. Default 0 (the GPU is always the bottleneck)
    host_dispatch_s: float = attrs.field(default=0.0, converter=float, validator=_EFFICIENCY)
    #: a training run's GEMMs relative to the ``[[gemm_profile]]`` microbenchmarks (sustained clocks
    #: of a full node under its power limit, fused epilogues): scales the profiled rate of every dtype
    profiled_gemm_relative_efficiency: float = attrs.field(default=1.0, converter=float, validator=_EFFICIENCY)
    #: a training run's fused attention relative to the ``[[attention_profile]]`` kernel (the
    #: framework's kernel — cuDNN / FlashAttention-3 — against the profiled FlashAttention-2)
    profiled_attention_relative_efficiency: float = attrs.field(default=1.0, converter=float, validator=_EFFICIENCY)
    #: fused (flash) attention's fraction of the bf16 peak at head dimension 128
    attention_efficiency: float = attrs.field(default=0.55, converter=float, validator=_EFFICIENCY)
    #: head-dimension dependence of fused attention: a kernel's rate scales as d/(d + d½),
    #: normalised to d = 128, capped at the peak. Each K/V tile loaded from shared memory feeds
    #: d multiply-adds per query, so small heads are bound by data movement and softmax. d½ = 64
    #: gives 0.75× at d = 64 and 1.2× at d = 256 (FlashAttention-3 forward on H100: ≈ 0.77× and
    #: ≈ 1.17×, arXiv 2407.08608); 0 removes the dependence
    attention_half_head_dim: float = attrs.field(default=64.0, converter=float, validator=_EFFICIENCY)
    #: an FP4 (NVFP4) GEMM's efficiency relative to ``gemm_efficiency``, of the fp4 peak: block-scale
    #: handling and the epilogues cost more per FLOP at 4 bits. Default 1
    fp4_gemm_relative_efficiency: float = attrs.field(default=1.0, converter=float, validator=_EFFICIENCY)
    #: an FP8 GEMM's efficiency relative to ``gemm_efficiency``, of the fp8 peak: at twice the
    #: bf16 rate the same tiles are shorter, so fixed per-tile costs (the epilogue, the bf16
    #: output write, the scaling) weigh more, and fp8 GEMMs reach a smaller fraction of their peak
    #: than bf16 ones of theirs. Default 1
    fp8_gemm_relative_efficiency: float = attrs.field(default=1.0, converter=float, validator=_EFFICIENCY)
    #: an MXFP8 GEMM's efficiency relative to a per-tensor-scaled fp8 GEMM's: the fp8 feature's
    #: ``recipe = "mxfp8"`` (32-element blocks with E8M0 scales, Blackwell's block-scaled tensor-core
    #: instructions) — scale-factor layout kernels and the scaled epilogue cost more per FLOP than a
    #: per-tensor-scaled fp8 GEMM. Default 1
    mxfp8_gemm_relative_efficiency: float = attrs.field(default=1.0, converter=float, validator=_EFFICIENCY)
    #: η_m: fraction of HBM bandwidth memory-bound kernels reach
    memory_efficiency: float = attrs.field(default=0.80, converter=float, validator=_EFFICIENCY)
    #: fraction of link bandwidth a large collective reaches, inside / across the scale-up domain
    scaleup_bus_efficiency: float = attrs.field(default=0.80, converter=float, validator=_EFFICIENCY)
    scaleout_bus_efficiency: float = attrs.field(default=0.85, converter=float, validator=_EFFICIENCY)
    #: an all-to-all's bandwidth relative to a ring's (``*_bus_efficiency``): many peers, small
    #: per-peer messages. Default 1
    alltoall_relative_efficiency: float = attrs.field(default=1.0, converter=float, validator=_EFFICIENCY)
    #: λ: per-step latency of a collective, µs, inside / across nodes
    scaleup_latency_us: float = attrs.field(default=5.0, converter=float, validator=_EFFICIENCY)
    scaleout_latency_us: float = attrs.field(default=10.0, converter=float, validator=_EFFICIENCY)
    #: eq. [3]: scale-out bandwidth lost per doubling of the nodes a group spans (α = (1-d)^log2 n)
    bandwidth_decay_per_doubling: float = attrs.field(default=0.02, converter=float, validator=_EFFICIENCY)
    #: contention when compute and communication overlap: α (compute) and β (comm), ≥ 1
    contention_compute: float = attrs.field(default=1.05, converter=float, validator=_EFFICIENCY)
    contention_comm: float = attrs.field(default=1.10, converter=float, validator=_EFFICIENCY)
    #: CUDA context, NCCL and allocator slack, GiB per GPU
    reserved_memory_gib: float = attrs.field(default=3.0, converter=float, validator=_EFFICIENCY)
    #: fixed per-step overhead (data loading, logging, launch gaps), seconds
    step_overhead_s: float = attrs.field(default=0.0, converter=float, validator=_EFFICIENCY)
    #: an MoE job's per-step host time on top of ``step_overhead_s`` (the MoE training loop's own
    #: bookkeeping: router statistics and auxiliary-loss tracking, token-count synchronisations),
    #: seconds; 0 for a model without MoE layers. Default 0
    moe_step_overhead_s: float = attrs.field(default=0.0, converter=float, validator=_EFFICIENCY)
    #: host time of the training loop per micro-batch on every pipeline stage (fetching and
    #: broadcasting the batch, masks, loss bookkeeping: once per micro-batch, however many model
    #: chunks interleaving splits it into), seconds; it adds to each stage's forward. Default 0
    microbatch_overhead_s: float = attrs.field(default=0.0, converter=float, validator=_EFFICIENCY)
    #: host time per micro-batch and model chunk on every pipeline stage (a chunk's forward or
    #: backward step call and the wait on its pipeline receives before the CPU can issue it),
    #: seconds: v times per micro-batch with interleaving, on top of ``microbatch_overhead_s``.
    #: Default 0
    chunk_overhead_s: float = attrs.field(default=0.0, converter=float, validator=_EFFICIENCY)


@attrs.frozen(kw_only=True)
class GemmPoint:
    """One profiled GEMM: shape M×N×K in `dtype` and the throughput it measured."""

    m: int = attrs.field(validator=_pos_int)
    n: int = attrs.field(validator=_pos_int)
    k: int = attrs.field(validator=_pos_int)
    tflops: float = _pos_float()
    dtype: str = attrs.field(default="bf16", validator=v.in_(tuple(DTYPE_BYTES)))


ATTENTION_DIRECTIONS = ("fwd", "bwd")
COLLECTIVE_SCOPES = ("scaleup", "scaleout")
#: the collective kinds of ``[[collective_profile]]`` (the engine's CollectiveBatch kinds)
COLLECTIVE_PROFILE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


@attrs.frozen(kw_only=True)
class AttentionPoint:
    """One profiled fused-attention kernel: head dimension, sequence length, causality, pass and
    the TFLOPS it reached, counting only the FLOPs the causal mask keeps (FlashAttention's
    benchmark convention: forward ``4·s²·d·heads·batch``, halved when causal; backward 2.5×)."""

    head_dim: int = attrs.field(validator=_pos_int)
    seq_len: int = attrs.field(validator=_pos_int)
    causal: bool = attrs.field(validator=v.instance_of(bool))
    tflops: float = _pos_float()
    dtype: str = attrs.field(default="bf16", validator=v.in_(tuple(DTYPE_BYTES)))
    direction: str = attrs.field(default="fwd", validator=v.in_(ATTENTION_DIRECTIONS))


@attrs.frozen(kw_only=True)
class CollectivePoint:
    """One profiled collective: kind, where its group lives, its size, the message and the bus
    bandwidth nccl-tests reports for it (GB/s). ``message_bytes`` is nccl-tests' size: the whole
    buffer (all-gather: the gathered output; reduce-scatter: the input; all-to-all: what one rank
    sends in all; p2p: the message). Bus bandwidth is ``algbw·f`` with ``algbw = size / time`` and
    ``f`` = 2(n−1)/n (all-reduce), (n−1)/n (all-gather, reduce-scatter, all-to-all), 1 (p2p)."""

    kind: str = attrs.field(validator=v.in_(COLLECTIVE_PROFILE_KINDS))
    scope: str = attrs.field(validator=v.in_(COLLECTIVE_SCOPES))
    group_size: int = attrs.field(validator=[v.instance_of(int), v.ge(2)])
    message_bytes: float = _pos_float()
    busbw_gbps: float = _pos_float()


@attrs.frozen(kw_only=True)
class HardwareProfile:
    """One accelerator and the node/cluster it sits in (file units in field names)."""

    name: str = attrs.field(validator=_kebab)
    gpus_per_node: int = attrs.field(validator=limit("profile.gpus_per_node"))
    compute: ComputeSpec
    memory: MemorySpec
    interconnect: InterconnectSpec
    host: HostSpec = attrs.field(factory=HostSpec)
    efficiency: EfficiencySpec = attrs.field(factory=EfficiencySpec)
    #: measured GEMM throughput by shape; the `profiled_gemm` provider interpolates it
    gemm_profile: tuple[GemmPoint, ...] = attrs.field(default=(), converter=tuple)
    #: measured fused-attention throughput; the `profiled_attention` provider uses it
    attention_profile: tuple[AttentionPoint, ...] = attrs.field(default=(), converter=tuple)
    #: measured collective bus bandwidth by kind, scope, group and message size; the
    #: `collectives` provider uses it where it covers a collective
    collective_profile: tuple[CollectivePoint, ...] = attrs.field(default=(), converter=tuple)
    display_name: str = ""
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    source: str = ""
    notes: str = ""

    @gemm_profile.validator
    @attention_profile.validator
    def _within_peak(self, attribute, points):
        """A measured point faster than the dense peak of its format is a unit or peak mistake."""
        for i, pt in enumerate(points):
            peak_tflops = self.peak_flops_per_s(pt.dtype) / 1e12
            if pt.tflops > peak_tflops:
                raise ValueError(f"{attribute.name}[{i}] ({pt.dtype}) reads {pt.tflops:g} TFLOPS, above the GPU's "
                                 f"{pt.dtype} peak of {peak_tflops:g} (compute.peak_tflops): no kernel beats the "
                                 "peak; check the point's units (TFLOPS) or the peak")

    # SI views
    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak for `dtype`; formats the GPU lacks fall back to the next wider one."""
        for fmt in {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "fp16": ("fp16", "bf16")}.get(
            dtype, (dtype, "bf16")
        ):
            if fmt in self.compute.peak_tflops:
                return tflops_to_flops_per_s(self.compute.peak_tflops[fmt])
        return tflops_to_flops_per_s(self.compute.peak_tflops["bf16"])

    @property
    def compute_clock_scale(self) -> float:
        """Tensor-core throughput at the job's power limit relative to the profile's tables (1 when
        the GPU runs at its rated power).

        Under load a GPU's clock settles where its draw meets the limit. Dynamic power goes as
        f·V² with the voltage rising with the clock (f³), on top of a static draw P₀ (idle and
        leakage, :data:`IDLE_POWER_FRACTION` of the TDP), so compute-bound kernels that hold a
        board at its TDP run at ``((P_limit − P₀)/(TDP − P₀))^(1/3)`` of their rated-power speed
        under a lower limit: 0.88 at 500 W on a 700 W H100. Memory-bound kernels, which do not
        reach the limit, keep their speed."""
        c = self.compute
        if c.power_limit_w <= 0.0 or c.power_limit_w >= c.tdp_w:
            return 1.0
        idle_w = IDLE_POWER_FRACTION * c.tdp_w
        return ((c.power_limit_w - idle_w) / (c.tdp_w - idle_w)) ** (1.0 / 3.0)

    @property
    def hbm_bytes(self) -> float:
        return self.memory.hbm_gib * GIB

    @property
    def host_bytes_per_gpu(self) -> float:
        """A node's CPU memory shared by its GPUs: what offloaded weights, optimizer states and
        activations of one GPU may use."""
        return self.host.cpu_memory_gib * GIB / self.gpus_per_node

    @property
    def hbm_bandwidth_bytes_per_s(self) -> float:
        return gbps_to_bytes_per_s(self.memory.hbm_bandwidth_gbps)

    @property
    def scaleup_bandwidth_bytes_per_s(self) -> float:
        return gbps_to_bytes_per_s(self.interconnect.scaleup_bandwidth_gbps)

    @property
    def scaleout_bandwidth_bytes_per_s(self) -> float:
        return gbps_to_bytes_per_s(self.interconnect.scaleout_bandwidth_gbps)

    @property
    def h2d_bandwidth_bytes_per_s(self) -> float:
        return gbps_to_bytes_per_s(self.interconnect.h2d_bandwidth_gbps)

    @property
    def d2h_bandwidth_bytes_per_s(self) -> float:
        return gbps_to_bytes_per_s(self.interconnect.d2h_bandwidth_gbps)

    @property
    def scaleup_domain_gpus(self) -> int:
        return self.interconnect.scaleup_domain_gpus

    @property
    def reserved_memory_bytes(self) -> float:
        return self.efficiency.reserved_memory_gib * GIB


# ---------------------------------------------------------------------------------------
# Records plugins register
# ---------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class NoOptions:
    """Options type of a feature or policy that takes none."""


def option(default, *, choices: tuple | None = None, search: tuple | None = None, validator=None, doc: str = ""):
    """Declare a field of a plugin's options class.

    `choices` makes it categorical (the engine carries the index into `choices` as an
    integer code); `search` lists the values `mofa tune` tries (default: just `default`).
    """
    validators = [] if validator is None else list(validator) if isinstance(validator, (list, tuple)) else [validator]
    if choices is not None:
        validators.append(v.in_(choices))
    else:
        backstop = option_backstop(default)  # finite and bounded, whatever the plugin declares
        if backstop is not None:
            validators.append(backstop)
    md = {"choices": tuple(choices) if choices else None, "search": tuple(search) if search else None, "doc": doc}
    conv = None
    if choices is None and isinstance(default, float):
        conv = float
    return attrs.field(default=default, validator=validators or None, metadata=md, converter=conv)


class Phase(enum.Enum):
    """Where a feature acts on the cost model (paper eq. [16]: T_step = F(LO, PO, OO, MO))."""

    layer = "layer"  #: per-layer forward/backward times (LO)
    pipeline = "pipeline"  #: the pipeline schedule's inputs (PO)
    optimizer = "optimizer"  #: DP communication and the parameter update (OO)
    memory = "memory"  #: peak memory (MO)


#: the memory components a prediction breaks the peak into (``Prediction.memory_breakdown``'s keys
#: but ``runtime``), and ``host``: what a feature's ``lowers_memory`` names
MEMORY_COMPONENTS = ("weights", "gradients", "optimizer_states", "activations", "buffers", "logits_loss",
                     "recompute_working", "host")


def _components(x) -> frozenset[str] | None:
    if x is None:
        return None
    out = frozenset(str(c) for c in x)
    unknown = out - set(MEMORY_COMPONENTS)
    if unknown:
        raise ValueError(f"lowers_memory names unknown components {sorted(unknown)}; known: {list(MEMORY_COMPONENTS)}")
    return out


#: an environment variable's name as a shell takes it
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@attrs.frozen(kw_only=True)
class EnvRequirement:
    """One environment variable a Megatron-LM launch of a configuration needs
    (``Feature.megatron_env``; the core adds its own: :func:`mofa_framework.tuner.megatron_environment`).

    ``equal``: the variable must hold ``value``; else it may hold anything but ``value`` (the launch
    leaves it unset). ``required``: Megatron-LM asserts it, and a launch without it stops before its
    first step; else it is what the feature's published launches set for speed. ``reason``: one line
    saying which code or launch asks for it."""

    name: str = attrs.field(validator=v.matches_re(_ENV_NAME))
    value: str = attrs.field(validator=v.instance_of(str))
    equal: bool = attrs.field(default=True, validator=v.instance_of(bool))
    required: bool = attrs.field(default=True, validator=v.instance_of(bool))
    reason: str = attrs.field(default="", validator=v.instance_of(str))


@attrs.frozen(kw_only=True)
class Feature:
    """An optimization feature: a cost transform per phase it acts in.

    Each callable takes ``(state, rows)`` — the engine's :class:`~mofa_framework.engine.CostState`
    of the batch (or, in a large batch where the feature is on in few rows, of those rows alone)
    and a :class:`~mofa_framework.batch.FeatureRows` with the rows where the feature is on and
    their option arrays — and returns a new state. Each row's answer must depend on that row's
    inputs alone, and a layer or pipeline transform may read only the features of its own or an
    earlier phase: the engine prices rows that share those once (``mofa_framework.row_groups``).
    The engine keeps rows where the feature is off bit-identical, orders features within a phase
    by ``after``/``before`` and rejects ``conflicts`` enabled together.
    """

    name: str = attrs.field(validator=_snake)
    description: str
    equation: str = ""
    options_type: type = NoOptions
    layer: Callable | None = None
    pipeline: Callable | None = None
    optimizer: Callable | None = None
    memory: Callable | None = None
    after: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    before: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    conflicts: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    #: the pipeline schedules its rows can run under a pipeline (pp > 1), when the framework the
    #: feature belongs to has only those (DeepSpeed's pipeline engine: its own 1F1B, and ZB-H1 in
    #: Megatron-DeepSpeed); empty: any installed schedule. A row with the feature on, pp > 1 and
    #: another schedule is infeasible (``invariants.schedule_result``), in a prediction and in a
    #: search alike
    schedules: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    #: optional ``(batch, rows) -> ConstraintResult`` for rows where the feature cannot apply
    feasible: Callable | None = None
    #: optional ``(options) -> list[str]``: the Megatron-LM arguments that turn it on; or
    #: ``(options, context) -> list[str]`` when they depend on the configuration (a layer count):
    #: ``context`` is a :class:`MegatronContext`. Items starting with ``#`` are notes
    megatron_args: Callable | None = None
    #: flags of its ``megatron_args`` that Megatron-LM accepts only beside another flag (flag → the
    #: flags, any one of which must be in the line too): the Megatron line drops such a flag where
    #: the configuration has none of them (``--overlap-param-gather`` needs the distributed
    #: optimizer or Megatron-FSDP; without them ``dp_overlap`` hides the plain all-reduce alone)
    megatron_requires: Mapping[str, tuple[str, ...]] = attrs.field(
        factory=dict, converter=lambda d: {str(k): tuple(v) for k, v in dict(d).items()},
        validator=attrs.validators.deep_mapping(attrs.validators.instance_of(str), attrs.validators.instance_of(tuple)))
    #: optional ``(options) -> Iterable[EnvRequirement]``, or ``(options, context)`` (a
    #: :class:`MegatronContext`): the environment its Megatron-LM flags need at launch (Megatron-FSDP:
    #: ``CUDA_DEVICE_MAX_CONNECTIONS`` anything but 1, which Megatron-LM asserts). A feature's
    #: requirement on a variable replaces the core's on it, as Megatron-LM waives its tensor-parallel
    #: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` under Megatron-FSDP and the MoE all-to-all overlap
    #: (:func:`mofa_framework.tuner.megatron_environment` composes them)
    megatron_env: Callable | None = None
    #: optional ``(args: MegatronArgs) -> dict | None``, the inverse of ``megatron_args``: given a
    #: launch's parsed Megatron-LM arguments (:class:`mofa_framework.megatron.MegatronArgs`), the
    #: feature's options (a ``[features.<name>]`` table, ``{}`` for the defaults) when they turn it
    #: on, else None. Every flag it reads counts as understood by ``mofa import megatron``
    from_megatron: Callable | None = None
    #: optional ``(batch, model, hardware) -> BoolArray``: rows where turning the feature on
    #: can change anything (the tuner skips it elsewhere, as on ≡ off there); None = all rows
    applies: Callable | None = None
    #: optional ``(batch, model, hardware) -> BoolArray``: rows where every option setting of the
    #: feature, on, is feasible, changes no memory and is no slower than off in every phase — a cheaper
    #: collective of the same kind, say. There `mofa tune` does not try it off (beside features it
    #: conflicts with it still does), so its off setting never costs a branch where it cannot win: the
    #: optimum is unchanged, and a top-k lists no strictly dominated copy of a row with the feature off.
    #: None (the default) is always safe; ``tests/test_tuner.py`` checks the built-ins' declarations
    never_slower: Callable | None = None
    #: whether `mofa tune` searches it by default (False for what-if knobs such as faster kernels)
    tunable: bool = True
    #: whether it can make compute faster than the base model's (FP8, faster kernels); the
    #: tuner's exact step-time lower bound holds only when no searched feature can
    may_reduce_compute: bool = False
    #: the numeric format (a key of ``compute.peak_tflops``) the feature runs the layers' GEMMs in
    #: ("fp8", "fp4"); MFU and HFU of its rows are measured against that format's peak when it is
    #: faster than the row's precision. None: the feature leaves the GEMMs' format alone
    gemm_precision: str | None = attrs.field(default=None, validator=v.optional(v.in_(tuple(DTYPE_BYTES))))
    #: whether it only ever adds time to a layer (it trades time for memory, as recompute and
    #: offloading do): with any set of such features on, a layer's forward + backward time is never
    #: below its time with all of them off, whatever else is on. The tuner bounds a configuration
    #: by its time with these off and tries them only where that bound can still win; False (the
    #: default) is always safe
    adds_time_only: bool = False
    #: whether its rows train none of the model's own weights (parameter-efficient fine-tuning:
    #: the feature prices its adapters itself). The core then prices no weight gradient for the
    #: embedding and the LM head, and counts model FLOPs as forward + input gradient for every
    #: weight GEMM (``decompose.training_flops_per_sequence``); the layers' own weight gradients,
    #: gradients and optimizer state are the feature's transforms to remove
    frozen_weights: bool = False
    #: with ``frozen_weights``: ``(model, options) -> float``, the parameters its rows train (what a
    #: checkpoint holds; the end-to-end model sizes checkpoints by it). None: all of the model's
    trainable_params: Callable | None = None
    #: the memory components (:data:`MEMORY_COMPONENTS`) its memory transform may lower, in any of its
    #: options and with any other feature on; every other component it keeps or raises. For a feature
    #: decided at the tuner's leaves (no layer or pipeline transform) the tuner skips the leaves below
    #: a node over the GPU (or the host) in every setting they may give such features: the node's
    #: memory with them off, their memory transforms then applied to it in each searched option (one
    #: with no memory transform: these components taken as 0) — so that transform reads only the
    #: memory state and the batch, and gives no less for larger inputs. None (the default): it may
    #: lower any component — always safe, no floor
    lowers_memory: frozenset[str] | None = attrs.field(default=None, converter=_components)

    def acts_in(self, phase: Phase) -> Callable | None:
        return getattr(self, phase.value)

    def megatron_tokens(self, options, context: MegatronContext) -> list[str]:
        """Its Megatron-LM arguments for one configuration (none without ``megatron_args``):
        ``megatron_args(options)``, or ``megatron_args(options, context)`` when it takes two."""
        if self.megatron_args is None:
            return []
        return list(self.megatron_args(options, context) if positional_count(self.megatron_args) >= 2
                    else self.megatron_args(options))

    def megatron_env_requirements(self, options, context: MegatronContext) -> list[EnvRequirement]:
        """The environment its Megatron-LM flags need for one configuration (none without
        ``megatron_env``): ``megatron_env(options)``, or ``megatron_env(options, context)``."""
        if self.megatron_env is None:
            return []
        got = list(self.megatron_env(options, context) if positional_count(self.megatron_env) >= 2
                   else self.megatron_env(options))
        bad = [g for g in got if not isinstance(g, EnvRequirement)]
        if bad:
            raise TypeError(f"feature {self.name!r}: megatron_env returned {bad[0]!r}; return EnvRequirement records")
        return got


@functools.lru_cache(maxsize=256)
def positional_count(fn: Callable) -> int:
    """Positional parameters `fn` takes (a ``*args`` counts as many)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 1 << 30
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


@attrs.frozen(kw_only=True)
class MegatronContext:
    """What a feature's two-argument ``megatron_args`` reads besides its options: the model, the
    configuration's parallel settings (``Candidate.parallel``: ``tp``, ``pp``, ``vpp``, layer split,
    micro-batch, …), every feature on in it (name → options) and its pipeline schedule."""

    model: Any
    parallel: Mapping[str, Any]
    features: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    #: the configuration's pipeline schedule (a registry name; "" when not known)
    schedule: str = ""
    #: the GPU architecture of the hardware profile (``compute.architecture``: "hopper", "blackwell",
    #: …; "" when not known)
    architecture: str = ""


@attrs.frozen(kw_only=True)
class OverlapStrategy(Feature):
    """A feature that hides communication behind computation (paper [20]–[24])."""


@attrs.frozen(kw_only=True)
class MemoryOptimizer(Feature):
    """A feature that trades time for memory or moves state off the GPU (paper [25]–[35])."""


@attrs.frozen(kw_only=True)
class CostTransform(Feature):
    """Any other feature acting on the cost model (kernel speed-ups [17][18], FP8, ...)."""


@attrs.frozen(kw_only=True)
class PipelineSchedule:
    """A pipeline schedule: its step time and the activations it keeps in flight.

    ``time(inputs) -> PipelineTimes`` and ``inflight(inputs) -> FloatArray`` take
    :class:`~mofa_framework.engine.PipelineInputs` (arrays over the rows that chose this
    schedule). ``inflight`` is the number of micro-batches' worth of one stage's activations
    the worst stage holds at its peak.
    """

    name: str = attrs.field(validator=_kebab)
    description: str
    time: Callable
    inflight: Callable
    #: the schedule interleaves virtual chunks (needs vpp > 1) / accepts vpp > 1 at all
    requires_vpp: bool = False
    supports_vpp: bool = False
    #: in ``mofa tune``'s default space (False: another framework's implementation of a schedule,
    #: whose rows would pair it with Megatron-LM's features; asked for by name, ``--schedules``)
    searched: bool = True
    #: busy + bubble never decreases when any stage's forward or backward-input time grows (W and
    #: the p2p times fixed): the tuner then bounds configurations by the bubble too, not only the
    #: busy time. False (the default) is always safe
    monotone_bubble: bool = False
    #: copies of the stage's parameters each GPU holds
    parameter_copies: int = attrs.field(default=1, validator=_pos_int)
    #: each GPU also runs the mirrored stage ``p−1−j`` of a second pipeline that flows the other way
    #: (DualPipe): it holds the parameters of both stages, does half its micro-batches on each, and
    #: its activations are ``Inflight`` of its own stage plus ``Inflight.mirror_*`` of the mirrored
    #: one. The GPUs at the ends each hold the first *and* the last stage; a middle GPU two middle stages
    mirrored: bool = False
    #: minimum micro-batches per step as a function of pp (e.g. m ≥ p); None: m ≥ 1
    min_microbatches: Callable | None = None
    equation: str = ""
    #: the Megatron-LM arguments selecting it (beyond the parallel sizes; "# ..." items are notes),
    #: or ``(model, parallel) -> arguments`` giving every placement argument itself: the core then
    #: adds none (a fork that places its own chunks, ZB-V; or a schedule that adds to Megatron-Core's
    #: own placement, ``tuner.pipeline_layout_arguments``, as interleaved 1F1B adds its micro-batch group);
    #: ``(model, parallel, context)`` when they depend on the configuration's features too (``context``
    #: a :class:`MegatronContext`: interleaved 1F1B turns off the p2p overlap it runs by default when
    #: the configuration was priced without it)
    megatron_args: tuple[str, ...] | Callable = ()
    #: its implementation can run a steady-state micro-batch's p2p beside the next chunk's compute,
    #: so PP overlap (``pp_overlap``) applies to its rows; False where the code base waits on each
    #: transfer (Megatron-LM's non-interleaved 1F1B: its arguments turn ``overlap_p2p_comm`` off
    #: whatever the flags say) or there is no steady phase (GPipe). True (the default) is the paper's
    #: eq. [23]
    overlaps_p2p: bool = True
    #: optional ``(args: MegatronArgs) -> bool``: whether parsed Megatron-LM arguments select it
    #: (``mofa import megatron``); without one, Megatron's own choice (1F1B, interleaved when
    #: vpp > 1) stands
    from_megatron: Callable | None = None
    #: other names it is known by (e.g. the ZeroBubble paper's "ZB-1p")
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    #: optional ``(p, v, m) -> per-stage op lists`` for :mod:`mofa_framework.simulate` and the
    #: trace (:mod:`mofa_framework.trace`); it may also take keywords ``F``, ``B``, ``W`` (the
    #: critical stage's per-chunk times) to adapt a heuristic order to them
    order: Callable | None = None
    #: optional ``(p, v, m) -> (mb -> [(stage, chunk), ...])``: the hops each micro-batch's forward
    #: takes (V shapes, bidirectional pipelines); None = Megatron's interleaved placement
    route: Callable | None = None
    #: optional ``(batch, rows: BoolArray) -> ConstraintResult`` for rows using this schedule, or
    #: ``(batch, rows, model, hardware)`` when the rule reads the model or the hardware profile. It may
    #: read the rows' features (``batch.feature(name)``): a search calls it on each structure with
    #: every feature off and again on the leaves once their features are set
    feasible: Callable | None = None
    #: Megatron-LM flags the code base that runs this schedule does not take (a fork's), each with
    #: what to do there instead: :func:`mofa_framework.tuner.megatron_arguments` prints such a flag
    #: as a note instead of in the command line. Empty: mainline Megatron-LM takes every flag
    megatron_unsupported: Mapping[str, str] = attrs.field(
        factory=dict, converter=dict,
        validator=attrs.validators.deep_mapping(attrs.validators.instance_of(str), attrs.validators.instance_of(str)))
    #: optional ``(batch, rows: BoolArray, num_layers: int) -> ConstraintResult``: which explicit
    #: end-stage sizes (``rows``: this schedule with ``first_stage_layers`` / ``last_stage_layers``
    #: set) its implementation can place; None = any (Megatron-Core's layout arguments)
    end_stages: Callable | None = None


@attrs.frozen(kw_only=True)
class FaultRecoveryPolicy:
    """How a job recovers from a failure (paper §3.4, eq. [41])."""

    name: str = attrs.field(validator=_kebab)
    description: str
    options_type: type = NoOptions
    #: ``mttr_s(options) -> float``: mean time to recover one failure, seconds
    mttr_s: Callable[[Any], float] = attrs.field(kw_only=True)
    #: fraction of a checkpoint interval lost per failure, on average (0.5: uniform failures)
    lost_interval_fraction: float = attrs.field(default=0.5, converter=float, validator=[v.ge(0.0), v.le(1.0)])
    equation: str = ""


@attrs.frozen(kw_only=True)
class ConfigSection:
    """A `[name]` table of the job file owned by a plugin that is not a feature or policy."""

    name: str = attrs.field(validator=_snake)
    options_type: type
    description: str = ""


@attrs.frozen(kw_only=True, eq=False)
class ConstraintResult:
    """A feasibility mask over a candidate batch and the reason rows fail it.

    ``reason`` is the same for every row (a search counts removed rows under it); ``detail``, when
    given, maps a failing row's index to its own numbers and fix (``": here 63 against ..."``), which
    a single job's error appends (:meth:`reason_for`) and a search never computes.
    """

    name: str
    feasible: Any  # BoolArray
    reason: str
    detail: Callable[[int], str] | None = None

    def reason_for(self, row: int) -> str:
        """The reason row `row` fails, with its own numbers when the rule gives them."""
        return self.reason + (self.detail(int(row)) if self.detail is not None else "")


def dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES[dtype]


# ---------------------------------------------------------------------------------------
# Measurements (``mofa validate`` / ``mofa calibrate``)
# ---------------------------------------------------------------------------------------


def _nonempty_columns(inst, attribute, value):
    if not value or not all(isinstance(c, str) and c for c in value):
        raise ValueError(f"'{attribute.name}' must name at least one column (non-empty strings)")


@attrs.frozen(kw_only=True)
class MeasurementReader:
    """Reads one measurement-file schema: the header it recognises and how a row becomes a job.

    ``map_row(row, ctx)`` receives one data row (column → cell text, ``""`` for an empty or
    missing cell) and a :class:`mofa_framework.measurements.ReadContext` (the registry, the file's
    source name, the row's line, typed cell accessors, GPU / model / FLOPs-convention look-ups) and
    returns a :class:`MappedRow` or a :class:`SkippedRow` with the reason. A malformed cell is
    reported by letting the context's accessor raise (``ctx.count(row, "tp")``).
    """

    name: str = attrs.field(validator=_kebab)
    description: str
    #: columns a file's header must all have for this reader to read it (the most columns wins)
    columns: frozenset[str] = attrs.field(converter=frozenset, validator=_nonempty_columns)
    map_row: Callable[..., Any]
    #: the column naming each row (listings of malformed rows); "" = its line number
    row_id_column: str = ""
    #: the column naming the model (listings of malformed rows)
    model_column: str = ""
    #: the publications or frameworks whose conventions it knows (documentation)
    sources: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)


@attrs.frozen(kw_only=True)
class FlopsConvention:
    """How a source counts the FLOPs of a training step (to turn its TFLOPS or MFU into a time).

    ``step_flops(model, global_batch_size, sequence_length)`` returns one step's FLOPs as the
    source counts them (a float > 0), or raises ``ValueError`` naming what the convention does
    not define for that architecture.
    """

    name: str = attrs.field(validator=_kebab)
    description: str
    step_flops: Callable[..., float]
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_str)
    #: where the formula is published
    source: str = ""
    #: the count includes the recomputed forward (hardware-FLOPs-like), not only model FLOPs
    counts_recompute: bool = False


#: what a published peak-memory figure counts (:attr:`MappedRow.memory_counter`)
MEMORY_COUNTERS = ("", "allocated", "reserved", "device")

#: the counters that leave out the runtime's memory outside the caching allocator
ALLOCATOR_COUNTERS = ("allocated", "reserved")


@attrs.frozen(kw_only=True)
class MappedRow:
    """One measurement turned into a job dict (what a reader returns for a predictable row)."""

    source: str
    reference: str
    row_id: str
    job: dict
    #: seconds, and the column it came from
    measured_s: float = attrs.field(converter=float)
    target: str
    #: strategy grouping (Spearman / regret); None = not ranked
    group: tuple | None = None
    measured_tflops: float | None = None
    tflops_convention: str = ""
    measured_memory_gib: float | None = None
    #: what the memory figure counts: ``allocated`` (``torch.cuda.max_memory_allocated``),
    #: ``reserved`` (the caching allocator's segments, ``max_memory_reserved``) — both without the
    #: runtime's own memory (CUDA context, NCCL), compared with the prediction's peak less its
    #: ``runtime`` component — or ``device`` (``nvidia-smi``: everything) / ``""`` (not stated),
    #: compared with the whole peak
    memory_counter: str = attrs.field(default="", validator=attrs.validators.in_(MEMORY_COUNTERS))
    #: constraint names the engine may ignore for this row
    ignore_constraints: frozenset[str] = frozenset()
    notes: str = ""
    #: updates to ``job["parallel"]`` for a setting the source leaves unstated, one per candidate
    #: value (None removes a key; a ``"features"`` entry replaces the job's features, for settings
    #: the features follow); ``validate.resolve_unstated`` keeps the fastest — the fastest that fits
    #: in memory when the unstated setting is the parallel layout itself (``"tp"`` in the variants)
    variants: tuple[dict, ...] = ()
    #: what the mapping assumed beyond the row (an unstated setting chosen, a column overruled)
    assumptions: str = ""
    #: whether ``mofa calibrate`` may fit a profile to the row. A reader sets False (saying why in
    #: ``assumptions``) for a row its source presents as other than the hardware's steady speed
    #: under the stack the reader maps: a step of an optimisation history, a run that stopped scaling
    fit: bool = True
    #: the software stack and its generation that ran the row, as the reader names it ("Megatron-LM
    #: 2021–22", "PyTorch FSDP (llm-foundry)"); "" = not known. Cross-validation holds each one out
    #: in turn (``mofa calibrate --cross-validate``)
    framework: str = ""

    @measured_s.validator
    def _finite_positive(self, attribute, value):
        if not (value > 0 and value < float("inf")):
            raise ValueError(f"measured_s must be finite and > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class SkippedRow:
    """A row that was not predicted, and why."""

    source: str
    reference: str
    row_id: str
    model: str
    reason: str
    #: unmappable (the row lacks what a prediction needs) | malformed (a cell is not what its
    #: column holds) | infeasible (the job breaks a constraint) | error (the engine could not price
    #: it: a plugin's answer broke an output invariant)
    kind: str = "unmappable"


@attrs.frozen(kw_only=True, eq=False)
class LazyRecord:
    """A registry record named now and read when first looked up.

    A registry hook may return one in place of a record whose reading is costly (a hardware
    profile with microbenchmark tables, a zoo model): the registry indexes `name` and `aliases`
    at once (look-ups, suggestions and listings of names stay cheap) and calls `load()` the first
    time the record itself is asked for. `load()` must return the record, with this name and these
    aliases.
    """

    name: str = attrs.field(validator=v.instance_of(str))
    aliases: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    load: Callable[[], Any] = attrs.field(validator=v.is_callable())
