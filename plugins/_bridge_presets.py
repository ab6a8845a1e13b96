"""Megatron-Bridge performance presets, Megatron-Core MoE model-zoo launch commands and NeMo 2.0's
recommended configurations: settings the published tables do not state.

NVIDIA-NeMo/Megatron-Bridge's performance summaries give the model, GPU, precision and layout of
each run; the features (token dispatcher, 1F1B all-to-all overlap, recompute modules, CUDA graphs,
CPU activation offloading) come from its ``scripts/performance/configs`` presets, read at the commits
cited below and applied by ``reader_nvidia`` to the rows whose model, GPU, precision and layout match.
The Megatron-Core MoE model zoo's README tables likewise print the command each table ran
(:data:`MODEL_ZOO_COMMANDS`), applied to the rows that cite that README.
"""

from __future__ import annotations

import re

import attrs

_RELEASE = re.compile(r"\b(\d{2})\.(\d{2})\b")


def release_key(text: str) -> tuple[int, int] | None:
    """(year, month) of a NeMo / Megatron-Bridge release named in `text` ("NeMo 26.06.01" → (26, 6));
    None when it names none."""
    m = _RELEASE.search(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


@attrs.frozen(kw_only=True)
class BridgeRecipe:
    """Settings of a Megatron-Bridge performance preset (``scripts/performance/configs``) that a
    row's table does not state, applied to the rows whose model, GPU, precision and layout match.

    ``layout`` keys: tp, pp, vpp, cp, ep, mbs, gbs, fsdp (all given must equal the row's); ``precision``:
    substrings of the row's precision column (any one must occur), empty = any; ``since`` /
    ``until``: the first / last release ("26.06") whose preset has the setting, empty = no bound (a
    row whose release column names none does not match a bounded preset); ``cites``: when set, only
    rows whose source reference contains it (a launch command printed in one document);
    ``unmodelled``: what the run also did that no MoFa feature prices — its rows are validated but not
    fitted to (a fit would take that cost for the hardware's). A layout-matched setting is used only if
    every preset version read agrees on it for that layout.
    """

    models: tuple[str, ...]
    gpus: tuple[str, ...]  # profile name prefixes; empty = any GPU
    features: dict
    source: str
    precision: tuple[str, ...] = ()
    layout: dict = attrs.field(factory=dict)
    since: str = ""
    until: str = ""
    cites: str = ""
    unmodelled: str = ""

    def matches(self, model: str, hw: str, precision: str, layout: dict, release: str = "", reference: str = "") -> bool:
        if self.cites and self.cites not in reference:
            return False
        if self.since or self.until:
            row = release_key(release)
            if (row is None or (self.since and row < release_key(self.since))
                    or (self.until and row > release_key(self.until))):
                return False
        return (model in self.models and (not self.gpus or hw.startswith(self.gpus))
                and (not self.precision or any(p in precision for p in self.precision))
                and all(layout.get(k) == v for k, v in self.layout.items()))


_MB = "NVIDIA-NeMo/Megatron-Bridge"
_DSV3 = ("deepseek-v3", "deepseek-v3-no-mtp")
_FLEX = {"flex_dispatcher": {}}
_FLEX_DEEPEP = {"flex_dispatcher": {"backend": "deepep"}}
#: TE per-module CUDA graphs (--cuda-graph-scope attn moe_router moe_preprocess / moe_router moe_preprocess)
_GRAPHS_ATTN_ROUTER = {"scope": "per_module", "attn": True, "mlp": False, "moe_router": True, "moe_preprocess": True}
_GRAPHS_ROUTER = {"scope": "per_module", "attn": False, "mlp": False, "moe_router": True, "moe_preprocess": True}
#: ``enable_cuda_graph`` (Megatron-Core's local graphs of whole transformer layers): the cuda_graphs
#: feature's full_iteration scope
_LAYER_GRAPHS = {"cuda_graphs": {"scope": "full_iteration"}}
#: the 25.09 Qwen3 presets (YAML performance matrices; `utils/helpers.py` set_cuda_graph_overrides: cuda_graphs →
#: model.enable_cuda_graph; `run_script.py`: apply_moe_token_drop for every Qwen3 run)
_QWEN3_2509 = (f"{_MB}@cac49dcd7c7475a15e982412dc67da4629392e4b scripts/performance/configs/qwen3/"
               "qwen3_{30b_a3b,235b_a22b}_llm_pretrain.yaml, scripts/performance/run_script.py and utils/helpers.py")
#: Llama 3 8B's presets: the 25.09 YAML matrix and the Python ones of v0.2.2 to v0.5.0
_LLAMA3_8B_PRESETS = (f"{_MB}@cac49dcd7c7475a15e982412dc67da4629392e4b scripts/performance/configs/llama3/"
                      "llama3_8b_llm_pretrain.yaml; @v0.2.2 scripts/performance/configs/llama3/workload_base_configs.py; "
                      "@v0.3.0, @v0.4.1, @v0.5.0 scripts/performance/configs/llama/llama3_workload_base_configs.py "
                      "(LLAMA3_8B_PRETRAIN_CONFIG_{GB200,B200}_{BF16,FP8_CS,FP8_MX}_V1)")
#: the two Qwen3 preset versions read (older configs/qwen3 layout, newer configs/qwen) and the GPT-OSS one
_QWEN3_PRESETS = (f"{_MB}@0fa501acee1ebfe3d1ab8088b638e2089d800df6 scripts/performance/configs/qwen3/workload_base_configs.py"
                  " and @01b2977e518f0a58ec870daba2fb2c04d76a91b2 scripts/performance/configs/qwen/qwen3_workload_base_configs.py")
_GPT_OSS_PRESET = f"{_MB}@07eea52d4523a69fc8975cef34938d61ae13f9e2 scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py"
_NEMOTRON_3 = ("nemotron-3-nano", "nemotron-3-super")
_NEMOTRON_3_PRESET = (f"{_MB}@bf07e5678 (= @a98a0c5d0 for these entries) "
                      "scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py")
#: Llama 3 70B's Megatron-FSDP presets (TP 1, PP 1, 64 GPUs): Megatron-Core's CPU activation offloading
#: of N of the 80 layers (``cpu_offloading_num_layers``), the same in every version read
_LLAMA3_70B_FSDP = (f"{_MB}@v0.1.0rc4 scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml (GB200), "
                    "@v0.2.0 and @v0.2.2 scripts/performance/configs/llama3/workload_base_configs.py, @v0.3.0, "
                    "@v0.3.1, @v0.4.1 and @v0.5.0 scripts/performance/configs/llama/llama3_workload_base_configs.py "
                    "(LLAMA3_70B_PRETRAIN_CONFIG_{GPU}_{PRECISION}_V1/V2) and @067f987df "
                    "src/megatron/bridge/perf_recipes/llama/{gb200,gb300,b200}/llama3.py")


def _offload(layers: int, of: int) -> dict:
    """Megatron-Core's ``--cpu-offloading-num-layers`` `layers` of `of` (PP 1): the share offloaded."""
    return {"activation_offload": {"fraction": layers / of}}


#: Megatron-Bridge performance presets the tables do not state (read at the commits cited)
BRIDGE_RECIPES: tuple[BridgeRecipe, ...] = (
    # token dispatcher: the DeepSeek-V3 recipe selects the flex dispatcher (HybridEP) on every GPU, from 25.11:
    # 25.09's B200 / GB200 runs dropped tokens (run_script.py disables DeepEP for token drop, which needs the
    # alltoall dispatcher; its H100 runs keep DeepEP, below)
    BridgeRecipe(models=_DSV3, gpus=(), features=_FLEX, since="25.11",
                 source=f"{_MB}@355cef457010f70533a5c83f1ed97899d0e0af43 src/megatron/bridge/recipes/deepseek/deepseek_v3.py"),
    # Kimi-K2 on GB300 (the rows' PP 4 × VP 4, MBS 2, GBS 4096): HybridEP, mla_up_proj recompute, no
    # CUDA graphs (cuda_graph_scope [])
    BridgeRecipe(models=("kimi-k2",), gpus=("gb300",), layout={"tp": 1, "pp": 4, "vpp": 4, "ep": 64, "mbs": 2,
                                                              "gbs": 4096},
                 features={"flex_dispatcher": {"backend": "hybridep"},
                           "recompute": {"granularity": "selective", "mla_up_proj": True}},
                 source=f"{_MB}@fecfbc9a1a2a10c95a843b5983a6d505fc1ecf46 scripts/performance/configs/kimi/"
                        "kimi_workload_base_configs.py (KIMI_K2_PRETRAIN_CONFIG_GB300; the same at 4f910586d and "
                        "in src/megatron/bridge/perf_recipes/kimi/gb300/kimi_k2.py @d98e8a64)"),
    # Qwen3: flex for every 30B row and for 235B on GB300/GB200/B300 (alltoall on B200/H100) from 25.11;
    # 25.09 ran them with token drop (capacity factor 1, padded), which Megatron-Core allows only with the
    # alltoall dispatcher (below)
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=(), features=_FLEX, since="25.11",
                 source=f"{_MB}@05c0c90fbbf69c7bd57ee93c32f28b840f31484f scripts/performance/configs/qwen/qwen3_llm_pretrain.py"),
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb300", "gb200", "b300"), features=_FLEX, since="25.11",
                 source=f"{_MB}@05c0c90fbbf69c7bd57ee93c32f28b840f31484f scripts/performance/configs/qwen/qwen3_llm_pretrain.py"),
    # 1F1B all-to-all overlap (moe_a2a_overlap) and recompute modules of layout-matched presets
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("h100",), features={"ep_overlap": {}},
                 layout={"tp": 2, "pp": 8, "vpp": 4, "ep": 32, "mbs": 1},
                 source=f"{_MB}@01b2977e518f0a58ec870daba2fb2c04d76a91b2 and @f29a269f8728ff9075f88a226f92e554196a7e41 "
                        "scripts/performance/configs/qwen/qwen3_workload_base_configs.py"),
    BridgeRecipe(models=_DSV3, gpus=("h100",), layout={"tp": 2, "pp": 8, "vpp": 4, "ep": 64, "gbs": 8192},
                 features={**_FLEX_DEEPEP, "ep_overlap": {},
                           "recompute": {"granularity": "selective", "mla_up_proj": True, "mlp": True}},
                 source=f"{_MB}@013284246bc0714e406c8a519b8686b7e50628ec scripts/performance/configs/deepseek/"
                        "deepseek_llm_pretrain.py (deepseek_v3_h100_1024gpus_*_config)"),
    BridgeRecipe(models=_DSV3, gpus=("b200",), precision=("MX",), layout={"tp": 1, "pp": 8, "vpp": 2, "ep": 32},
                 features={**_FLEX_DEEPEP, "ep_overlap": {},
                           "recompute": {"granularity": "selective", "mla_up_proj": True, "mlp": True}},
                 source=f"{_MB}@042641823051ce167c52b0ae289941a227c11535 scripts/performance/configs/deepseek/"
                        "deepseek_workload_base_configs.py (B200 FP8-MX V2)"),
    # DeepSeek-V3 MXFP8 on GB300 at MBS 1 (26.06 on, v0.5.0): the all-to-all overlap, the full iteration in
    # one graph, no recompute (26.02-26.04 ran MBS 2 with mla_up_proj recompute, below)
    BridgeRecipe(models=_DSV3, gpus=("gb300",), precision=("MX",), layout={"tp": 1, "pp": 2, "vpp": 8, "ep": 32, "mbs": 1},
                 since="26.06", features={"ep_overlap": {}, "cuda_graphs": {"scope": "full_iteration"}},
                 source=f"{_MB}@v0.5.0 scripts/performance/configs/deepseek/deepseek_workload_base_configs.py "
                        "(DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V1/V2; also @042641823051ce167c52b0ae289941a227c11535)"),
    BridgeRecipe(models=_DSV3, gpus=("gb300",), layout={"tp": 1, "pp": 2, "vpp": 8, "ep": 32, "mbs": 2},
                 features={"recompute": {"granularity": "selective", "mla_up_proj": True}},
                 source=f"{_MB}@042641823051ce167c52b0ae289941a227c11535 and @f0e2c37e3f82c57f9d0e95aa8ae98b3470a91107 "
                        "scripts/performance/configs/deepseek/deepseek_workload_base_configs.py (GB300 FP8-CS)"),
    # DeepSeek-V3 MXFP8 on GB200 (TP1 PP4 VP4 EP64) by release (deepseek_workload_base_configs.py at the
    # tags): 26.02 (v0.3.x) recomputes mla_up_proj, 26.04 (v0.4.x) the MLP, both with TE per-module graphs
    # of attention, router and permutation and no all-to-all overlap; 26.06 on (v0.5.0) the overlap,
    # mla_up_proj and the full iteration in one graph (below)
    BridgeRecipe(models=_DSV3, gpus=("gb200",), precision=("MX",), layout={"tp": 1, "pp": 4, "vpp": 4, "ep": 64, "mbs": 1},
                 until="26.02", features={"recompute": {"granularity": "selective", "mla_up_proj": True},
                                          "cuda_graphs": _GRAPHS_ATTN_ROUTER},
                 source=f"{_MB}@v0.3.0 scripts/performance/configs/deepseek/deepseek_workload_base_configs.py "
                        "(DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_V1)"),
    BridgeRecipe(models=_DSV3, gpus=("gb200",), precision=("MX",), layout={"tp": 1, "pp": 4, "vpp": 4, "ep": 64, "mbs": 1},
                 since="26.04", until="26.04", features={"recompute": {"granularity": "selective", "mlp": True},
                                                         "cuda_graphs": _GRAPHS_ATTN_ROUTER},
                 source=f"{_MB}@v0.4.1 scripts/performance/configs/deepseek/deepseek_workload_base_configs.py "
                        "(DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_V1)"),
    BridgeRecipe(models=_DSV3, gpus=("gb200",), precision=("MX",), layout={"tp": 1, "pp": 4, "vpp": 4, "ep": 64, "mbs": 1},
                 since="26.06", features={"ep_overlap": {}, "recompute": {"granularity": "selective", "mla_up_proj": True},
                                          "cuda_graphs": {"scope": "full_iteration"}},
                 source=f"{_MB}@v0.5.0 scripts/performance/configs/deepseek/deepseek_workload_base_configs.py "
                        "(DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V1)"),
    BridgeRecipe(models=_DSV3, gpus=("b200", "b300"), layout={"tp": 1, "pp": 16, "ep": 8, "mbs": 1},
                 features={"recompute": {"granularity": "selective", "mla_up_proj": True}},
                 source=f"{_MB}@042641823051ce167c52b0ae289941a227c11535 and @f0e2c37e3f82c57f9d0e95aa8ae98b3470a91107 "
                        "scripts/performance/configs/deepseek/deepseek_workload_base_configs.py (B200 V1, older B300)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("gb300", "gb200", "b300"), precision=("MX",),
                 layout={"tp": 1, "pp": 1, "mbs": 4, "gbs": 1280}, features={"ep_overlap": {}},
                 source=f"{_MB}@07eea52d4523a69fc8975cef34938d61ae13f9e2 scripts/performance/configs/gpt_oss/"
                        "gpt_oss_workload_base_configs.py (FP8-MX V2)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("gb200", "b200"), precision=("BF16",),
                 layout={"tp": 1, "pp": 1, "mbs": 4, "gbs": 1280},
                 features={"recompute": {"granularity": "selective", "layernorm": True, "moe_act": True}},
                 source=f"{_MB}@07eea52d4523a69fc8975cef34938d61ae13f9e2 and @1e7adfa90b18d15594c049ed3ca3554096495594 "
                        "scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py (BF16 V2)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("h100",), layout={"tp": 1, "pp": 4, "ep": 8, "mbs": 1},
                 features={"recompute": {"granularity": "selective", "layernorm": True, "moe_act": True}},
                 source=f"{_MB}@07eea52d4523a69fc8975cef34938d61ae13f9e2 and @1e7adfa90b18d15594c049ed3ca3554096495594 "
                        "scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py (H100)"),
    # CUDA graphs (cuda_graph_impl / cuda_graph_scope): Qwen3 presets capture graphs in every version read
    # (the older configs/qwen3 layout the full iteration, the newer one per module); the scope both
    # cover is applied. DeepSeek-V3 is left out: the oldest version read sets no graphs on GB200/B200.
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("gb200",), precision=("MX",), layout={"mbs": 4},
                 features={"cuda_graphs": _GRAPHS_ROUTER}, source=f"{_QWEN3_PRESETS} (GB200 FP8_MX)"),
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("gb200",), precision=("CS", "BF16"), layout={"mbs": 4},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}, source=f"{_QWEN3_PRESETS} (GB200 BF16 / FP8_CS)"),
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("b200",), features={"cuda_graphs": _GRAPHS_ATTN_ROUTER},
                 source=f"{_QWEN3_PRESETS} (B200, every precision)"),
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("gb300", "b300"), layout={"mbs": 8},
                 features={"cuda_graphs": _GRAPHS_ROUTER},
                 source=f"{_QWEN3_PRESETS} (GB300 MBS 8; B300 only in the newer)"),
    # from v0.5.0 (NeMo 26.06) the 30B MXFP8 presets on GB300 / GB200 / B300 overlap the EP all-to-all
    # with the other micro-batch's compute and capture the full iteration in one CUDA graph (also a
    # CuTe-DSL fused grouped MLP and FP8 attention, not modelled); v0.4.x had neither
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("gb300", "gb200", "b300"), precision=("MX",), since="26.06",
                 features={"ep_overlap": {}, "cuda_graphs": {"scope": "full_iteration"}},
                 source=f"{_MB}@v0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
                        "(QWEN3_30B_A3B_PRETRAIN_CONFIG_{GB300,GB200,B300}_FP8_MX_V1: moe_a2a_overlap, "
                        "cuda_graph_impl full_iteration; v0.4.1: per-module graphs, no overlap)"),
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb200",), layout={"tp": 1, "pp": 8, "ep": 32},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER},
                 source=f"{_QWEN3_PRESETS} (GB200 V2, newer only; the older PP8 EP8 GBS1024 layout graphs the full "
                        "iteration)"),
    # Llama 3 8B on 8 GPUs at micro-batch 2 (GBS 128): the whole iteration in one graph (`cuda_graph_impl
    # local`, `full_iteration`; 25.09's `cuda_graphs: true`) on GB200 and B200 in BF16 and FP8, in every
    # version read (GB300's presets run micro-batch 4, NVFP4 none)
    BridgeRecipe(models=("llama3-8b",), gpus=("gb200", "b200"), precision=("BF16", "FP8"),
                 layout={"tp": 1, "pp": 1, "cp": 1, "mbs": 2, "gbs": 128, "fsdp": False}, features=_LAYER_GRAPHS,
                 source=_LLAMA3_8B_PRESETS),
    # 25.09 (the "qwen3 2509" presets): token drop padded to capacity on every Qwen3 run, so the MoE
    # layers' shapes are static, and on GB200 `cuda_graphs: true` (enable_cuda_graph: Megatron-Core's
    # local graphs of whole transformer layers) at the two layouts the rows ran
    BridgeRecipe(models=("qwen3-30b-a3b",), gpus=("gb200",), layout={"tp": 1, "pp": 1, "ep": 8, "mbs": 4, "gbs": 512},
                 since="25.09", until="25.09", features=_LAYER_GRAPHS, source=_QWEN3_2509),
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb200",), layout={"tp": 2, "pp": 1, "ep": 64, "mbs": 1,
                                                                       "gbs": 1024},
                 since="25.09", until="25.09", features=_LAYER_GRAPHS, source=_QWEN3_2509),
    # v0.5.0 (NeMo 26.06) gave the MXFP8 runs of Qwen3-235B (V2: 256 GPUs, GBS 8192) on GB300 / GB200 the EP
    # all-to-all overlap and a full-iteration CUDA graph (and a CuTe-DSL fused grouped MLP and FP8 attention:
    # not modelled); DeepSeek-V3's are above
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb300", "gb200"), precision=("MX",), layout={"gbs": 8192},
                 since="26.06", features={"ep_overlap": {}, "cuda_graphs": {"scope": "full_iteration"}},
                 source=f"{_MB}@v0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
                        "(QWEN3_235B_A22B_PRETRAIN_CONFIG_{GB300,GB200}_FP8_MX_V2; v0.4.1: neither)"),
    # GPT-OSS (one version read): the full iteration for MXFP8 on GB300/GB200, per module for BF16 on GB300
    # and for both precisions on B300
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("gb300", "gb200"), precision=("MX",),
                 layout={"tp": 1, "pp": 1, "mbs": 4, "gbs": 1280}, features={"cuda_graphs": {}},
                 source=f"{_GPT_OSS_PRESET} (FP8-MX V2: full_iteration)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("gb300",), precision=("BF16",), layout={"tp": 1, "pp": 1, "mbs": 4},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}, source=f"{_GPT_OSS_PRESET} (GB300 BF16)"),
    BridgeRecipe(models=("gpt-oss-120b",), gpus=("b300",), layout={"tp": 1, "pp": 1, "mbs": 4},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}, source=f"{_GPT_OSS_PRESET} (B300 BF16 / FP8_MX)"),
    # Nemotron 3 Nano and Super (scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py,
    # the version whose layouts the 26.04-26.08 tables show: Super GB200 TP 2, B300 EP 8, B200 EP 64):
    # every run the HybridEP flex dispatcher and TE per-module CUDA graphs of attn, moe_router and
    # moe_preprocess (and mamba, a scope MoFa's cuda_graphs does not model), B200 without graphs
    BridgeRecipe(models=_NEMOTRON_3, gpus=(), features=_FLEX, source=_NEMOTRON_3_PRESET),
    # nemotron_3_llm_pretrain.py's set_nemotron_3_{nano,super}_common_configs: grad_reduce_in_fp32 = False
    # (bf16 main-grad buffers and gradient reduction)
    BridgeRecipe(models=_NEMOTRON_3, gpus=(), features={"distributed_optimizer": {"grad_reduce_dtype": "bf16"}},
                 source=f"{_MB}@bf07e5678 scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py"),
    BridgeRecipe(models=_NEMOTRON_3, gpus=("gb300", "gb200", "b300"), features={"cuda_graphs": _GRAPHS_ATTN_ROUTER},
                 source=_NEMOTRON_3_PRESET),
    BridgeRecipe(models=("nemotron-3-super",), gpus=("b200",), precision=("NVFP4",), layout={"tp": 2},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}, source=f"{_NEMOTRON_3_PRESET} (B200 NVFP4)"),
    # Super's NVFP4 runs keep the last 14 of its 88 layers in BF16 (nemotron_3_llm_pretrain.py's
    # set_nemotron_3_super_common_configs from v0.4.0 = NeMo 26.04 on, every Super NVFP4 row's release:
    # first_last_layers_bf16, num_layers_at_end_in_bf16 = 14, via mixed_precision.py's
    # nemotron_3_super_bf16_with_nvfp4_mixed since ecbd4ead5). Its te_quant.cfg also keeps attention's
    # QKV and output, the latent projections and the MTP layers in BF16 (not modelled: a share of the GEMMs
    # the nvfp4 feature cannot single out yet)
    BridgeRecipe(models=("nemotron-3-super",), gpus=(), precision=("NVFP4",),
                 features={"nvfp4": {"bf16_layers_at_end": 14}},
                 source=f"{_MB}@v0.4.0 scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py and "
                        f"@ecbd4ead5 src/megatron/bridge/training/mixed_precision.py"),
    # recompute modules: Super on B300 (BF16, NVFP4) and B200 (MXFP8) moe_act + layernorm, B200 BF16 also
    # moe and core_attn; Nano on H100 (FP8_CS) moe, layernorm, core_attn, moe_act (attn graphs off there)
    BridgeRecipe(models=("nemotron-3-super",), gpus=("b300",), precision=("BF16", "NVFP4"),
                 features={"recompute": {"granularity": "selective", "moe_act": True, "layernorm": True}},
                 source=f"{_NEMOTRON_3_PRESET} (B300 BF16 / NVFP4)"),
    BridgeRecipe(models=("nemotron-3-super",), gpus=("b200",), precision=("MX",),
                 features={"recompute": {"granularity": "selective", "moe_act": True, "layernorm": True}},
                 source=f"{_NEMOTRON_3_PRESET} (B200 FP8_MX)"),
    BridgeRecipe(models=("nemotron-3-super",), gpus=("b200",), precision=("BF16",),
                 features={"recompute": {"granularity": "selective", "moe_act": True, "moe": True,
                                         "layernorm": True, "core_attn": True}},
                 source=f"{_NEMOTRON_3_PRESET} (B200 BF16)"),
    BridgeRecipe(models=("nemotron-3-nano",), gpus=("h100",), precision=("FP8",), layout={"mbs": 1, "gbs": 1024},
                 features={"recompute": {"granularity": "selective", "moe": True, "layernorm": True,
                                         "core_attn": True, "moe_act": True}},
                 source=f"{_NEMOTRON_3_PRESET} (H100 FP8_CS)"),
    # DeepSeek-V4 Flash (128 GB200 / GB300, MXFP8; GB300's recipe is GB200's with other environment
    # variables): HybridEP, the full iteration in one CUDA graph, the query up projection recomputed,
    # bf16 gradient reduction (grad_reduce_in_fp32 = False)
    BridgeRecipe(models=("deepseek-v4-flash",), gpus=("gb300", "gb200"), precision=("MX",),
                 layout={"tp": 1, "pp": 1, "ep": 64, "mbs": 1, "gbs": 2048},
                 features={"flex_dispatcher": {"backend": "hybridep"}, "cuda_graphs": {},
                           "recompute": {"granularity": "selective", "mla_up_proj": True},
                           "distributed_optimizer": {"grad_reduce_dtype": "bf16"}},
                 source=f"{_MB}@24849e23c src/megatron/bridge/perf_recipes/deepseek/gb200/deepseek_v4.py "
                        "(deepseek_v4_flash_pretrain_128gpu_gb200_fp8mx_config; gb300/deepseek_v4.py reuses it)"),
    # dense: Llama 3 70B with Megatron-FSDP offloads some layers' activations to the host (Grace over
    # NVLink-C2C on GB200 / GB300); FP8 here is current scaling ("FP8-CS", and the 26.x tables' "FP8":
    # their MXFP8 presets run PP 4, their NVFP4 ones PP 4 too)
    BridgeRecipe(models=("llama3-70b",), gpus=("gb300",), precision=("FP8",), layout={"tp": 1, "pp": 1, "fsdp": True},
                 features=_offload(20, 80), source=f"{_LLAMA3_70B_FSDP} (GB300 FP8-CS: 20 layers)"),
    BridgeRecipe(models=("llama3-70b",), gpus=("gb300",), precision=("BF16",), layout={"tp": 1, "pp": 1, "fsdp": True},
                 features=_offload(30, 80), source=f"{_LLAMA3_70B_FSDP} (GB300 BF16: 30 layers)"),
    BridgeRecipe(models=("llama3-70b",), gpus=("gb200",), precision=("FP8",), layout={"tp": 1, "pp": 1, "fsdp": True},
                 features=_offload(40, 80), source=f"{_LLAMA3_70B_FSDP} (GB200 FP8-CS: 40 layers)"),
    BridgeRecipe(models=("llama3-70b",), gpus=("gb200",), precision=("BF16",), layout={"tp": 1, "pp": 1, "fsdp": True},
                 features=_offload(20, 80), source=f"{_LLAMA3_70B_FSDP} (GB200 BF16: 20 layers)"),
    # B200 FP8-CS: 5 layers offloaded from v0.2.0 (NeMo 25.11) on; v0.1.0's YAML recomputed 5 instead
    BridgeRecipe(models=("llama3-70b",), gpus=("b200",), precision=("FP8",), layout={"tp": 1, "pp": 1, "fsdp": True},
                 since="25.11", features=_offload(5, 80), source=f"{_LLAMA3_70B_FSDP} (B200 FP8-CS: 5 layers)"),
    # Llama 3.1 405B FP8-CS on 128 GB200s, TP 2, PP 1 with Megatron-FSDP: 95 of its 126 layers offloaded in
    # NeMo 25.09, 92 from 25.11 until the preset was dropped (v0.6.0)
    BridgeRecipe(models=("llama3.1-405b",), gpus=("gb200",), precision=("FP8",),
                 layout={"tp": 2, "pp": 1, "fsdp": True}, until="25.09", features=_offload(95, 126),
                 source=f"{_MB}@v0.1.0rc4 scripts/performance/configs/llama31/llama31_405b_llm_pretrain.yaml (GB200 fp8_cs)"),
    BridgeRecipe(models=("llama3.1-405b",), gpus=("gb200",), precision=("FP8",),
                 layout={"tp": 2, "pp": 1, "fsdp": True}, since="25.11", features=_offload(92, 126),
                 source=f"{_MB}@v0.2.2 scripts/performance/configs/llama31/workload_base_configs.py "
                        "(LLAMA31_405B_GB200_FP8_CS_BASE_CONFIG) and @v0.5.0 scripts/performance/configs/llama/"
                        "llama31_workload_base_configs.py (LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V1)"),
)


#: the Megatron-Core MoE model zoo's Qwen3 README (yanring/Megatron-MoE-ModelZoo@020b8136b3
#: best_practice/qwen3/readme.md): each table prints the ``sbatch_benchmarking.sh`` command it ran, where
#: ``A2A_OVERLAP=1`` adds ``--delay-wgrad-compute --overlap-moe-expert-parallel-comm`` (sbatch_benchmarking.sh
#: @38ce2ed2e1)
_QWEN3_ZOO = "best_practice/qwen3/readme.md"
_QWEN3_ZOO_SOURCE = ("yanring/Megatron-MoE-ModelZoo@020b8136b3bc best_practice/qwen3/readme.md, the command under "
                     "each table; A2A_OVERLAP from sbatch_benchmarking.sh@38ce2ed2e1")
_MOE_ACT_NORM = {"recompute": {"granularity": "selective", "moe_act": True, "layernorm": True}}
MODEL_ZOO_COMMANDS: tuple[BridgeRecipe, ...] = (
    # H100 long context (16K-128K, PP 8 VPP 4 EP 8, TP and CP per row): --recompute-modules layernorm moe
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("h100",), cites=_QWEN3_ZOO, source=_QWEN3_ZOO_SOURCE,
                 layout={"pp": 8, "vpp": 4, "ep": 8, "mbs": 1, "gbs": 256},
                 features={"recompute": {"granularity": "selective", "layernorm": True, "moe": True}}),
    # GB200 BF16 (TP 1 PP 8 EP 8, GBS 8192): TE CUDA graphs of attn, moe_router, moe_preprocess
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb200",), precision=("BF16",), cites=_QWEN3_ZOO,
                 source=_QWEN3_ZOO_SOURCE, layout={"tp": 1, "pp": 8, "vpp": 1, "ep": 8, "mbs": 1, "gbs": 8192},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}),
    # GB200 MXFP8 (TP 1 PP 4 VPP 6 EP 64, MBS 3): A2A_OVERLAP=1, moe_act + layernorm recompute, the same
    # graphs, and --fine-grained-activation-offloading of expert_fc1 and moe_act (no MoFa feature)
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb200",), precision=("FP8",), cites=_QWEN3_ZOO,
                 source=_QWEN3_ZOO_SOURCE, layout={"tp": 1, "pp": 4, "vpp": 6, "ep": 64, "mbs": 3, "gbs": 3072},
                 features={**_MOE_ACT_NORM, "cuda_graphs": _GRAPHS_ATTN_ROUTER, "ep_overlap": {}},
                 unmodelled="--fine-grained-activation-offloading of expert_fc1 and moe_act"),
    # GB300 MXFP8 standard (TP 1 PP 4 EP 32, MBS 2, GBS 8192): the same graphs
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb300",), precision=("FP8",), cites=_QWEN3_ZOO,
                 source=_QWEN3_ZOO_SOURCE, layout={"tp": 1, "pp": 4, "vpp": 1, "ep": 32, "mbs": 2, "gbs": 8192},
                 features={"cuda_graphs": _GRAPHS_ATTN_ROUTER}),
    # GB300 MXFP8 long context (TP 4 PP 4 VPP 12 CP 4 EP 32, 128K): moe_act + layernorm recompute
    BridgeRecipe(models=("qwen3-235b-a22b",), gpus=("gb300",), precision=("FP8",), cites=_QWEN3_ZOO,
                 source=_QWEN3_ZOO_SOURCE, layout={"tp": 4, "pp": 4, "vpp": 12, "cp": 4, "ep": 32, "mbs": 1,
                                                   "gbs": 1024},
                 features=_MOE_ACT_NORM),
)

#: NeMo 2.0's performance summaries (docs.nvidia.com/nemo-framework) ran the recommended configurations of
#: NeMo's ``scripts/performance/recommended_model_configs/model_configs_<gpu>.csv``, whose ``cuda_graphs``
#: column sets ``enable_cuda_graph`` (Megatron-Core's local graphs of whole transformer layers). Every
#: version from NVIDIA/NeMo@96578928a7 (2025-04-07, "GB200 LLM performance scripts tuning": the 25.04
#: tables) to @ae861a9c43 (2025-08-27) sets 1 for the layouts below (the Nemotron-H and Qwen3 rows from
#: June 2025: 25.07); GPT-3 175B on B200, Llama 3 70B on GB200 and Llama 3.1 405B are 0. The 25.02 B200
#: and H100 matrices (@81d94d1501) have no such column: no graphs.
_NEMO2_DOCS = "docs.nvidia.com/nemo-framework"
_NEMO2_SOURCE = ("NVIDIA/NeMo@96578928a7 to @ae861a9c43 scripts/performance/recommended_model_configs/"
                 "model_configs_{gpu}.csv (cuda_graphs = 1)")
NEMO2_CONFIGS: tuple[BridgeRecipe, ...] = tuple(
    BridgeRecipe(models=(m,), gpus=(gpu,), cites=_NEMO2_DOCS, since=since, layout=layout, precision=precision,
                 features=_LAYER_GRAPHS, source=_NEMO2_SOURCE.format(gpu=gpu))
    for gpu, m, layout, precision, since in (
        ("gb200", "gpt3-175b", {"tp": 4, "pp": 4, "vpp": 12, "mbs": 2, "gbs": 256}, (), "25.04"),
        ("gb200", "llama3-8b", {"tp": 1, "pp": 1, "gbs": 128}, (), "25.04"),
        ("gb200", "mixtral-8x7b", {"tp": 1, "pp": 1, "ep": 8, "mbs": 2, "gbs": 256}, (), "25.04"),
        ("gb200", "nemotron-4-15b", {"tp": 1, "pp": 1, "mbs": 2, "gbs": 256}, (), "25.04"),
        ("gb200", "nemotron-4-340b", {"tp": 8, "pp": 4, "vpp": 12, "mbs": 1, "gbs": 32}, ("FP8",), "25.04"),
        ("gb200", "nemotron-h-8b", {"tp": 1, "pp": 1, "mbs": 2, "gbs": 128}, (), "25.07"),
        ("gb200", "nemotron-h-47b", {"tp": 2, "pp": 1, "mbs": 1, "gbs": 192}, (), "25.07"),
        ("gb200", "nemotron-h-56b", {"tp": 2, "pp": 1, "mbs": 1}, (), "25.07"),
        ("gb200", "qwen3-30b-a3b", {"tp": 1, "pp": 1, "ep": 8, "mbs": 1, "gbs": 512}, (), "25.07"),
        ("gb200", "qwen3-235b-a22b", {"tp": 2, "pp": 1, "ep": 64, "mbs": 1, "gbs": 1024}, (), "25.07"),
        ("b200", "llama3-8b", {"tp": 1, "pp": 1, "mbs": 2, "gbs": 128}, (), "25.04"),
        ("b200", "llama3-70b", {"tp": 2, "pp": 4, "cp": 2, "mbs": 1, "gbs": 128}, (), "25.04"),
        ("b200", "mixtral-8x7b", {"tp": 1, "pp": 1, "ep": 8, "mbs": 2, "gbs": 256}, (), "25.04"),
        ("b200", "nemotron-4-15b", {"tp": 1, "pp": 1, "mbs": 2, "gbs": 256}, (), "25.04"),
        ("b200", "nemotron-4-340b", {"tp": 8, "pp": 4, "mbs": 1, "gbs": 32}, (), "25.04"),
        ("b200", "nemotron-h-8b", {"tp": 1, "pp": 1, "mbs": 2, "gbs": 128}, (), "25.07"),
        ("b200", "nemotron-h-47b", {"tp": 2, "pp": 1, "mbs": 1, "gbs": 192}, (), "25.07"),
        ("b200", "nemotron-h-56b", {"tp": 4, "pp": 1, "mbs": 2}, (), "25.07"),
        ("b200", "qwen3-30b-a3b", {"tp": 1, "pp": 1, "ep": 8, "mbs": 1, "gbs": 512}, (), "25.07")))

#: every preset and launch command the reader applies, each to the rows citing its document: the
#: Megatron-Bridge presets to rows citing Megatron-Bridge's performance summaries (its source's), the
#: model zoo's commands to rows citing its README, NeMo 2.0's recommended configurations to rows citing
#: its performance summaries
PRESETS: tuple[BridgeRecipe, ...] = tuple(attrs.evolve(r, cites=r.cites or _MB) for r in BRIDGE_RECIPES) \
    + MODEL_ZOO_COMMANDS + NEMO2_CONFIGS


#: Megatron-Bridge's DeepSeek-V3 pipeline layouts (``--pipeline-model-parallel-layout``) by the number
#: of virtual stages pp·vpp: ``set_deepseek_v3_pipeline_model_parallel_layout`` (4, 8 and 16 stages,
#: whatever the split into pp and vpp) and the presets' ``pp_layout`` (32 stages, H100 PP 8 VP 4): the
#: embedding with the first layers, the MTP module and the loss after the last layer, which is why the
#: last stage holds the fewest layers. "{mtp}" is "m" per MTP layer ("" for the model without MTP)
DSV3_LAYOUT_SOURCE = (f"{_MB}@042641823051ce167c52b0ae289941a227c11535 src/megatron/bridge/recipes/deepseek/"
                      "deepseek_v3.py (set_deepseek_v3_pipeline_model_parallel_layout) and scripts/performance/"
                      "configs/deepseek/deepseek_workload_base_configs.py (pp_layout)")
_DSV3_LAYOUTS = {4: "Et*16|t*16|t*16|t*13{mtp}L", 8: "Et*8|(t*8|)*6t*5{mtp}L", 16: "Et*4|(t*4|)*14t{mtp}L",
                 32: "Et|(tt|)*30{mtp}L"}


#: Megatron-Bridge's Kimi-K2 layouts: ``_get_kimi_k2_pipeline_layout(pp, vp)``, which its performance
#: configs apply for their PP and VP sizes (GB300 and GB200: PP 4, VP 4) — the same splits as
#: DeepSeek-V3's on 4, 8 and 16 virtual stages, keyed by (pp, vp) (other pairs: no layout)
KIMI_K2_LAYOUT_SOURCE = (f"{_MB}@fecfbc9a1a2a10c95a843b5983a6d505fc1ecf46 src/megatron/bridge/recipes/kimi/"
                         "kimi_k2.py (_get_kimi_k2_pipeline_layout, since 13caf4fc8, 2026-02-12) and scripts/"
                         "performance/configs/kimi/kimi_llm_pretrain.py")
_KIMI_K2 = ("kimi-k2",)
_KIMI_K2_PP_VP = {(4, 1), (8, 1), (4, 2), (16, 1), (8, 2), (4, 4)}


def bridge_layout(model: str, pp: int, vpp: int, mtp_layers: int) -> tuple[str, str]:
    """(layout, source) Megatron-Bridge runs DeepSeek-V3 or Kimi-K2 with on `pp` stages of `vpp`
    chunks, ("", "") where it sets none (or for another model)."""
    if model in _DSV3 and pp * vpp in _DSV3_LAYOUTS:
        return _DSV3_LAYOUTS[pp * vpp].format(mtp="m" * mtp_layers), DSV3_LAYOUT_SOURCE
    if model in _KIMI_K2 and (pp, vpp) in _KIMI_K2_PP_VP:
        return _DSV3_LAYOUTS[pp * vpp].format(mtp="m" * mtp_layers), KIMI_K2_LAYOUT_SOURCE
    return "", ""


#: Megatron-Core's DeepSeek-V3-on-GB200 optimisation guide (the MoE model zoo's MCORE-DSV3GB200 rows,
#: one per step of its history): the recompute modules and CUDA-graph scope its text gives for each
#: step, in order. Steps before "Remove up_proj recompute" ran ``--recompute-modules mlp up_proj``,
#: after it ``mlp moe_act``; from "CUDA Graphs" on the TE per-module graphs capture attn, moe_router
#: and moe_preprocess, and from "CUDA Graphs capture shared expert" the shared experts too (MoFa's
#: ``mlp`` scope, which also takes the three dense layers' MLP)
GB200_GUIDE = (f"NVIDIA/Megatron-LM@eb0783b6d3 docs/discussions/deepseek-v3-gb200-optimization/"
               "deepseek-v3-gb200-optimization.md, sections 1, 2.2.2 and 2.3")
GUIDE_STEPS = ("baseline", "fuse torch.zeros", "router fusion", "enable deepep", "remove up_proj recompute",
               "cuda graphs", "tune deepep", "cpu-side optimization", "pdl for quantization",
               "cuda graphs capture shared expert", "hybridep", "cpu-side optimization", "fuse quantization")


def guide_features(step: int) -> dict:
    """The features of optimisation step `step` (0-based, :data:`GUIDE_STEPS`) of the GB200 guide."""
    mods = {"mlp": True, "mla_up_proj": True} if step < GUIDE_STEPS.index("remove up_proj recompute") else \
        {"mlp": True, "moe_act": True}
    feats: dict = {"recompute": {"granularity": "selective", **mods}}
    if step >= GUIDE_STEPS.index("cuda graphs"):
        feats["cuda_graphs"] = {**_GRAPHS_ATTN_ROUTER, "mlp": step >= GUIDE_STEPS.index("cuda graphs capture shared expert")}
    return feats
