"""A model's layer stack: which block each layer is, and the pattern language that says so.

A layer is one *block*: an optional sequence mixer (attention, Mamba, gated DeltaNet, …)
followed by an optional feed-forward part (a dense MLP or a mixture of experts), each a
pre-norm residual sublayer. A Llama layer is one block (attention + MLP); a Nemotron-H layer
is a mixer or an MLP alone (Megatron-Core's hybrid layers, ``--hybrid-override-pattern``).

``ModelSpec.layer_pattern`` spells the stack with one symbol per layer. A symbol or a
parenthesised group followed by a count repeats it (``"D3X58"``, ``"(LLLG)12"``); spaces are
ignored. The pattern repeats to ``num_layers`` and is cut there, so a repeat unit describes a
periodic stack and a shorter ``num_layers`` keeps the stack's first layers. The built-in
symbols are Megatron-Core's hybrid vocabulary plus the two transformer layers
(:data:`BUILTIN_BLOCKS`); ``ModelSpec.blocks`` defines more, or redefines these.

Layers of equal :class:`BlockSpec` are one *kind* (:func:`kind_key`): the engine prices each
kind once, whatever the number of layers.
"""

from __future__ import annotations

import re

import attrs
from attrs import validators as v

MIXERS = ("attention", "mamba2", "mamba", "gated_deltanet", "linear_attention", "none")
ATTENTION_TYPES = ("model", "full", "sliding", "chunked", "compressed")
FFNS = ("dense", "moe", "none")
#: mixers with a recurrent state instead of attention over the prefix
RECURRENT_MIXERS = ("mamba2", "mamba", "gated_deltanet", "linear_attention")
#: the most layers a pattern may describe
MAX_LAYERS = 1 << 20


def _true_or_false(_, attribute, x) -> None:
    if not isinstance(x, bool):
        raise ValueError(f"{attribute.name} must be true or false, got {x!r}")


def _ratio(_, attribute, x) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 1 << 20:
        raise ValueError(f"{attribute.name} must be a whole number of tokens from 0 to {1 << 20}, got {x!r}")


@attrs.frozen(kw_only=True)
class BlockSpec:
    """One layer: ``mixer`` then ``ffn``, each a pre-norm residual sublayer (either may be "none").

    ``attention`` (attention mixers only): ``"model"`` follows the model's ``sliding_window`` /
    ``sliding_window_layer_fraction`` (full causal attention when it has no window);
    ``"full"`` is full causal attention; ``"sliding"`` a window of the model's
    ``sliding_window`` keys; ``"chunked"`` attention inside chunks of the model's
    ``attention_chunk_size`` tokens (Llama 4); ``"compressed"`` (DeepSeek-V4) the model's
    ``sliding_window`` most recent keys plus keys pooled from every ``compress_ratio`` tokens
    (a learned, gated pooling), all of them, or with ``indexed`` the ``index_topk`` a lightning
    indexer picks per query (compressed sparse attention; its pooling windows overlap, two
    windows per pooled key, as DeepSeek-V4's ratio-4 layers). ``output_gate`` is attention whose
    output is multiplied by a sigmoid gate the query projection also produces (Qwen3-Next).
    """

    mixer: str = attrs.field(default="attention", validator=v.in_(MIXERS))
    attention: str = attrs.field(default="model", validator=v.in_(ATTENTION_TYPES))
    output_gate: bool = attrs.field(default=False, validator=_true_or_false)
    ffn: str = attrs.field(default="dense", validator=v.in_(FFNS))
    #: compressed attention: tokens pooled into one key (0 for every other attention type)
    compress_ratio: int = attrs.field(default=0, validator=_ratio)
    #: compressed attention: a lightning indexer picks the model's ``index_topk`` pooled keys per query
    indexed: bool = attrs.field(default=False, validator=_true_or_false)

    def __attrs_post_init__(self):
        if self.mixer == "none" and self.ffn == "none":
            raise ValueError("a block needs a mixer or an ffn (both are 'none')")
        if self.mixer != "attention" and (self.attention != "model" or self.output_gate):
            raise ValueError(f"'attention' and 'output_gate' apply to attention mixers only (mixer = {self.mixer!r})")
        if self.attention == "compressed" and self.compress_ratio < 2:
            raise ValueError(f"compressed attention needs compress_ratio ≥ 2 (tokens pooled into one key), "
                             f"got {self.compress_ratio}")
        if self.attention != "compressed" and (self.compress_ratio or self.indexed):
            raise ValueError(f"compress_ratio and indexed apply to attention = 'compressed' only "
                             f"(attention = {self.attention!r})")

    @property
    def sublayers(self) -> int:
        """Residual sublayers: 2 for mixer + ffn, 1 for either alone."""
        return (self.mixer != "none") + (self.ffn != "none")

    @property
    def is_attention(self) -> bool:
        return self.mixer == "attention"


#: symbols every pattern may use: Megatron-Core's hybrid layers (``M`` Mamba-2, ``*``
#: attention, ``-`` MLP, ``E`` MoE) and the transformer layers (``D`` attention + MLP,
#: ``X`` attention + MoE)
BUILTIN_BLOCKS: dict[str, BlockSpec] = {
    "M": BlockSpec(mixer="mamba2", ffn="none"),
    "*": BlockSpec(mixer="attention", ffn="none"),
    "-": BlockSpec(mixer="none", ffn="dense"),
    "E": BlockSpec(mixer="none", ffn="moe"),
    "D": BlockSpec(),
    "X": BlockSpec(ffn="moe"),
}


def kind_key(block: BlockSpec) -> str:
    """The name a kind of layer goes by in the engine (``LayerCosts`` and ``StageLayout`` keys):
    ``"dense"`` and ``"moe"`` for the transformer layers, else ``<mixer>[+<ffn>]`` (e.g.
    ``"mamba2"``, ``"mlp"``, ``"sliding_attention+mlp"``, ``"gated_deltanet+moe"``,
    ``"sparse_compressed4_attention+moe"``)."""
    if block.is_attention:
        mixer = {"model": "attention", "full": "full_attention", "sliding": "sliding_attention",
                 "chunked": "chunked_attention",
                 "compressed": f"{'sparse_' if block.indexed else ''}compressed{block.compress_ratio}_attention",
                 }[block.attention]
        mixer = ("gated_" if block.output_gate else "") + mixer
    else:
        mixer = "" if block.mixer == "none" else block.mixer
    ffn = {"dense": "mlp", "moe": "moe", "none": ""}[block.ffn]
    if mixer == "attention" and ffn:
        return "dense" if ffn == "mlp" else "moe"
    if not mixer:
        return "moe_mlp" if ffn == "moe" else ffn
    return f"{mixer}+{ffn}" if ffn else mixer


_TOKEN = re.compile(r"\(|\)|\d+|\S")


def expand_pattern(pattern: str) -> str:
    """The pattern with every count and group written out: one symbol per layer.

    Raises ValueError for unbalanced parentheses, a count of 0 or one with nothing to repeat,
    or more than :data:`MAX_LAYERS` layers.
    """
    stack: list[list[str]] = [[]]
    last: list[str] | None = None  # what a following count repeats
    for tok in _TOKEN.findall(pattern):
        if tok == "(":
            stack.append([])
            last = None
        elif tok == ")":
            if len(stack) == 1:
                raise ValueError(f"layer_pattern {pattern!r}: ')' without '('")
            group = stack.pop()
            if not group:
                raise ValueError(f"layer_pattern {pattern!r}: empty group '()'")
            stack[-1].extend(group)
            last = group
        elif tok.isdigit():
            n = int(tok)
            if last is None or n < 1:
                raise ValueError(f"layer_pattern {pattern!r}: count {tok} must follow a symbol or a group and be ≥ 1")
            if len(last) * n > MAX_LAYERS:
                raise ValueError(f"layer_pattern {pattern!r} describes more than {MAX_LAYERS} layers")
            stack[-1].extend(last * (n - 1))
            last = None
        else:
            stack[-1].append(tok)
            last = [tok]
        if len(stack[-1]) > MAX_LAYERS:
            raise ValueError(f"layer_pattern {pattern!r} describes more than {MAX_LAYERS} layers")
    if len(stack) != 1:
        raise ValueError(f"layer_pattern {pattern!r}: '(' without ')'")
    return "".join(stack[0])


def pattern_blocks(pattern: str, blocks, field: str = "layer_pattern") -> list[BlockSpec]:
    """The block of each symbol of the expanded pattern (one repeat unit of the stack); errors name
    `field`, the key the pattern came from."""
    symbols = expand_pattern(pattern)
    if not symbols:
        raise ValueError(f"{field} is empty: give one symbol per layer, e.g. 'M-M*-' or '(LG)21'")
    table = {**BUILTIN_BLOCKS, **blocks}
    unknown = sorted(set(symbols) - set(table))
    if unknown:
        raise ValueError(f"{field} uses undefined symbol(s) {', '.join(map(repr, unknown))}: define them under "
                         f"blocks, or use the built-in {', '.join(map(repr, BUILTIN_BLOCKS))}")
    return [table[s] for s in symbols]
