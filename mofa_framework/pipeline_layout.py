"""Megatron-Core's ``--pipeline-model-parallel-layout``, read into MoFa's stage sizes.

A layout names what each virtual pipeline stage holds, in stage order, ``|`` between stages:
``E`` the embedding, ``t`` a transformer (decoder) layer, ``m`` a multi-token-prediction module,
``L`` the loss (output head); ``(…)*n`` and ``x*n`` repeat, commas are cosmetic
(``megatron/core/transformer/pipeline_parallel_layer_layout.py``, ``parse_str_to_list``).
Virtual stage ``i`` runs on pipeline rank ``i mod pp`` as its chunk ``i div pp``, so a layout of
``pp·v`` stages interleaves ``v`` chunks per rank.

MoFa places layers as a first, ``pp − 2`` equal middle and a last stage (:func:`~mofa_framework.engine.stage_layout`),
with the embedding on the first and the MTP modules and output head on the last. A layout that fits
that shape becomes ``first_stage_layers``, ``last_stage_layers`` and ``vpp``; one that does not
(unequal middle stages, the MTP or the loss on another rank) is refused with the reason.
"""

from __future__ import annotations

import re

from .errors import ConfigError
from .limits import short

#: the layer characters Megatron-Core's parser knows
LAYER_CHARS = "EtmL"


#: the longest unrolled layout read: every layer, MTP module and stage separator of the largest
#: model and pipeline the limits allow, with room to spare (a repeat count beyond it is a typo)
MAX_UNROLLED = 1 << 20


def _unroll(pattern: str, text: str, layout: str, field: str) -> str:
    """`text` with every match of `pattern` (a group and a count) repeated, refused past MAX_UNROLLED."""
    grow = sum(len(m.group(1)) * (int(m.group(2)) - 1) for m in re.finditer(pattern, text))
    if len(text) + grow > MAX_UNROLLED:
        raise ConfigError(f"{field} = {short(layout)} unrolls to over {MAX_UNROLLED:,} characters: a repeat "
                          "count is too large (one per stage or layer, e.g. (t*4|)*14)")
    return re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)


def virtual_stages(layout: str, field: str) -> list[str]:
    """The layout's virtual stages, each the string of its layer characters."""
    text = layout.replace(",", "").replace(" ", "")
    text = _unroll(r"\(([^)]+)\)\*(\d+)", text, layout, field)
    text = _unroll(r"(.)\*(\d+)", text, layout, field)
    bad = sorted(set(text) - set(LAYER_CHARS) - {"|"})
    if bad or not text:
        raise ConfigError(f"{field} = {short(layout)}: {'unknown character ' + repr(bad[0]) if bad else 'empty'}; "
                          "a layout is stages of E (embedding), t (layer), m (MTP), L (loss) separated by |, "
                          "e.g. 'Et*4|(t*4|)*14tmL'")
    return text.split("|")


def end_stage_layers(layout: str, pp: int, num_layers: int, num_mtp_layers: int, field: str) -> tuple[int, int, int]:
    """(first_stage_layers, last_stage_layers, vpp) of `layout` on `pp` pipeline ranks.

    >>> end_stage_layers("Et*4|(t*4|)*14tmL", 4, 61, 1, "layout")
    (16, 13, 4)
    """
    stages = virtual_stages(layout, field)
    if len(stages) % pp:
        raise ConfigError(f"{field} = {short(layout)} has {len(stages)} stages, not a multiple of parallel.pp = {pp}: "
                          "give pp × vpp stages")
    vpp = len(stages) // pp
    layers = sum(s.count("t") for s in stages)
    mtp = sum(s.count("m") for s in stages)
    if layers != num_layers or mtp != num_mtp_layers:
        raise ConfigError(f"{field} = {short(layout)} places {layers} layers and {mtp} MTP modules; the model has "
                          f"{num_layers} and {num_mtp_layers}: give each once")
    on_rank = [[stages[c * pp + r] for c in range(vpp)] for r in range(pp)]
    misplaced = [f"{what} off the {where} rank" for ch, what, where, rank in
                 (("E", "the embedding", "first", 0), ("m", "an MTP module", "last", pp - 1),
                  ("L", "the loss", "last", pp - 1))
                 if any(ch in s for r, chunks in enumerate(on_rank) if r != rank for s in chunks)]
    if misplaced:
        raise ConfigError(f"{field} = {short(layout)} puts {misplaced[0]}: MoFa places the embedding on the first "
                          "pipeline rank and the MTP modules and loss on the last")
    totals = [sum(s.count("t") for s in chunks) for chunks in on_rank]
    if len(set(totals[1:-1])) > 1:
        raise ConfigError(f"{field} = {short(layout)} gives the middle ranks {short(totals[1:-1])} layers: "
                          "MoFa's stages have one middle size; give every rank but the first and last the same layers")
    return totals[0], totals[-1], vpp
