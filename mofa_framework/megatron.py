"""Megatron-LM arguments in: a launch script, an argument list or a NeMo / Megatron-Bridge
config becomes a MoFa job (``mofa import megatron|nemo``, ``mofa predict --megatron-args``).

The core reads what Megatron-LM itself decides — parallel sizes, the layer split, batch,
precision, attention backend — and the model's shape, which it names after a zoo model when
the shape matches one (otherwise the job carries an inline ``[model]`` table). Everything
else goes through the registry: each feature's ``from_megatron`` (the inverse of its
``megatron_args``) reads the flags that turn it on, and a schedule's ``from_megatron`` claims
the flags that select it. Nothing here names a feature or a schedule. Every flag ends up in
one of three lists: *used* (read by the core or a plugin), *ignored* (Megatron flags that
change nothing MoFa models: data, logging, checkpoints, learning rate, fusions, …) or
*unknown* (neither — listed, never fatal).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .errors import ConfigError, UnknownRecordError

#: Megatron-LM flags that change nothing MoFa models (exact names)
IGNORED_FLAGS = frozenset("""
--seed --split --vocab-file --merge-file --mock-data --train-iters --train-samples --clip-grad --min-lr --lr
--attention-dropout --hidden-dropout --use-mcore-models --use-legacy-models --disable-bias-linear --add-bias-linear
--rampup-batch-size --step-batch-size-schedule --manual-gc --manual-gc-interval --empty-unused-memory-level
--cross-entropy-loss-fusion --cross-entropy-fusion-impl --calculate-per-token-loss --num-workers --apply-layernorm-1p
--norm-epsilon --qk-layernorm --max-position-embeddings --make-vocab-size-divisible-by --rotary-base
--softmax-type --glu-linear-offset --activation-func-clamp-value --hf-model-id --params-dtype --pipeline-dtype
--autocast-dtype
--rotary-percent --rotary-scaling-factor --rotary-seq-len-interpolation-factor --use-rope-scaling --mscale
--mscale-all-dim --no-rope-fusion --no-position-embedding --use-rotary-position-embeddings --weight-decay
--adam-beta1 --adam-beta2 --adam-eps --sgd-momentum --optimizer --transformer-impl --spec --enable-experimental
--no-check-for-nan-in-loss-and-grad --check-for-large-grads --no-mmap-bin-files --no-create-attention-mask-in-dataloader
--fp8-amax-history-len --fp8-amax-compute-algo --fp8-margin --fp8-interval --fp8-wgrad
--fp4-param-gather --first-last-layers-bf16 --num-layers-at-start-in-bf16 --moe-router-load-balancing-type
--moe-aux-loss-coeff --moe-z-loss-coeff --moe-router-pre-softmax --moe-grouped-gemm --moe-permute-fusion
--moe-router-fusion --moe-router-dtype --moe-router-score-function --moe-router-enable-expert-bias
--moe-router-bias-update-rate --moe-router-topk-scaling-factor --moe-router-force-load-balancing
--moe-token-drop-policy --moe-expert-capacity-factor --moe-pad-expert-input-to-capacity --moe-input-jitter-eps
--moe-per-layer-logging --moe-use-legacy-grouped-gemm --mtp-loss-scaling-factor --init-method-std
--init-model-with-meta-device --no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-bias-gelu-fusion
--no-bias-swiglu-fusion --no-bias-dropout-fusion --no-persist-layer-norm --use-nccl-ub --fsdp-double-buffer
--timing-log-level --timing-log-option --tiktoken-pattern --exit-interval --exit-signal-handler --async-save
--use-persistent-ckpt-worker --finetune --pretrained-checkpoint --use-checkpoint-args --auto-detect-ckpt-format
--no-load-optim --no-load-rng --no-save-optim --no-save-rng --deterministic-mode --te-rng-tracker
--decoupled-lr --decoupled-min-lr --override-opt_param-scheduler
--use-checkpoint-opt_param-scheduler --moe-layer-recompute --ddp-num-buckets
--ddp-average-in-collective
--accumulate-allreduce-grads-in-fp32 --align-param-gather --no-align-grad-reduce --use-sharp
--high-priority-stream-groups --tp-comm-overlap-cfg --tp-comm-bootstrap-backend --moe-router-topk-limited-devices
""".split())
#: prefixes of Megatron-LM flag families that change nothing MoFa models
IGNORED_PREFIXES = ("--lora-", "--log-", "--save", "--load", "--eval-", "--tensorboard", "--wandb", "--data-", "--tokenizer",
                    "--lr-", "--ckpt-", "--dist-ckpt", "--profile", "--distributed-", "--exit-", "--rerun-",
                    "--inprocess-", "--straggler", "--non-persistent", "--one-logger", "--no-one-logger",
                    "--record-memory", "--memory-snapshot", "--start-weight-decay", "--end-weight-decay",
                    "--weight-decay-incr", "--no-", "--nvtx", "--logging-", "--megatron-fsdp-",
                    "--use-pytorch-profiler")

#: GPT-2 BPE's vocabulary, which Megatron's GPT2BPETokenizer uses
GPT2_VOCAB = 50257


@attrs.define
class MegatronArgs:
    """Parsed Megatron-LM arguments (the last occurrence of a flag wins, as in argparse).

    Plugins read them in ``from_megatron``: :meth:`has`, :meth:`value`, :meth:`values` and
    :meth:`number` mark a flag as understood. ``parallel`` holds the sizes Megatron derives
    (``tp``, ``pp``, ``vpp``, ``cp``, ``ep``, ``etp``, ``dp``) for flags whose default depends on them.
    """

    flags: dict[str, tuple[str, ...]]
    parallel: dict[str, int] = attrs.field(factory=dict)
    read: set[str] = attrs.field(factory=set)

    def has(self, flag: str) -> bool:
        self.read.add(flag)
        return flag in self.flags

    def values(self, flag: str) -> tuple[str, ...]:
        self.read.add(flag)
        return self.flags.get(flag, ())

    def value(self, flag: str, default: str | None = None) -> str | None:
        vals = self.values(flag)
        return vals[0] if vals else default

    def number(self, flag: str, default=None, kind=int):
        text = self.value(flag)
        if text is None:
            return default
        try:
            x = float(text)
            if kind is int and not x.is_integer():
                raise ValueError(text)
            return int(x) if kind is int else kind(text)
        except ValueError:
            raise ConfigError(f"{flag} {text}: expected {'an integer' if kind is int else 'a number'}") from None


def parse_flags(words: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--flag v1 v2 --switch --k=v`` → ``{"--flag": ("v1", "v2"), "--switch": (), "--k": ("v",)}``."""
    out: dict[str, tuple[str, ...]] = {}
    flag: str | None = None
    vals: list[str] = []
    for w in list(words) + ["--"]:
        if w.startswith("--"):
            if flag is not None:
                out[flag] = tuple(vals)
            flag, vals = w, []
            if "=" in w:
                flag, _, v = w.partition("=")
                vals = [v]
            if w == "--":
                flag = None
        elif flag is not None:
            vals.append(w)
    return out


# ---------------------------------------------------------------------- NeMo / Megatron-Bridge configs

#: config keys (NeMo 1 YAML, NeMo 2 / Megatron-Bridge) whose Megatron-LM flag is not ``--key-with-dashes``
_CONFIG_ALIASES = {
    "num_moe_experts": "--num-experts", "encoder_seq_length": "--seq-length",
    "virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
    "num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "activations_checkpoint_granularity": "--recompute-granularity",
    "activations_checkpoint_method": "--recompute-method",
    "activations_checkpoint_num_layers": "--recompute-num-layers",
    "use_flash_attention": "--use-flash-attn", "layernorm_epsilon": "--norm-epsilon",
    "fp8": "--fp8-format", "padded_vocab_size": "--vocab-size",
    "bucket_size": "--ddp-bucket-size",  # DistributedDataParallelConfig.bucket_size (ddp.bucket_size)
    "sequence_length": "--seq-length",  # Megatron-Bridge's dataset.sequence_length
    "fp4": "--fp4-format",  # Megatron-Bridge's mixed_precision.fp4: e2m1
}


def _config_leaves(obj, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    if isinstance(obj, Mapping) and obj.get("_call_") is False and "_target_" in obj:
        # a dumped config's reference to an object, not a config: ``{_call_: false, _target_:
        # torch.bfloat16}`` is the dtype torch.bfloat16 (Megatron-Bridge's optimizer dtypes)
        yield path, obj["_target_"]
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _config_leaves(v, (*path, str(k)))
    else:
        yield path, obj


def _repr_pairs(text: str) -> list[tuple[str, str]]:
    """``key=value`` pairs of a printed config (NeMo 2's ``Config[...]`` trees) or Hydra overrides."""
    out = []
    for m in re.finditer(r"([A-Za-z_][\w.]*)\s*=\s*(\[[^\]]*\]|'[^']*'|\"[^\"]*\"|[^,()\s<>]+)", text):
        key, value = m.group(1).split(".")[-1], m.group(2).strip("'\"")
        out.append((key, value))
    return out


def _scalar(value) -> Any:
    if isinstance(value, str):
        low = value.lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null", ""):
            return None
        if re.fullmatch(r"[0-9]+", value):
            return int(value)
    return value


def config_model_names(text: str) -> list[str]:
    """Model names a NeMo 2.0 recipe's config classes suggest: ``Llama3Config8B`` → ``Llama3-8B``,
    ``Llama3 8B``, ``Llama3.1-8B`` for ``Llama31...`` (the registry normalises case and separators)."""
    out: list[str] = []
    for m in re.finditer(r"\b([A-Z][A-Za-z0-9]*?)Config([0-9][0-9A-Za-z.x]*)?\b", text):
        pre, suf = m.group(1), m.group(2) or ""
        if pre in ("", "Model", "Trainer", "Transformer", "MLATransformer", "Optimizer"):
            continue
        variants = [pre, re.sub(r"(\d)(\d)$", r"\1.\2", pre)]
        for v in dict.fromkeys(variants):
            out += [f"{v}-{suf}", f"{v} {suf}"] if suf else [v]
    return list(dict.fromkeys(out))


def flags_from_config(text: str) -> tuple[dict[str, tuple[str, ...]], int | None, list[str]]:
    """Megatron-LM flags of a NeMo / Megatron-Bridge config (YAML, the printed recipe, or
    ``a.b=c`` overrides), the GPUs it states (``num_nodes × devices``) and notes."""
    notes: list[str] = []
    pairs: list[tuple[str, Any]] = []
    data = None
    try:
        import yaml

        data = yaml.safe_load(text)
    except ImportError:
        raise ConfigError("reading NeMo / Megatron-Bridge YAML needs PyYAML: pip install pyyaml") from None
    except Exception:  # noqa: BLE001 - not YAML: a printed config or overrides
        data = None
    if isinstance(data, Mapping) and any(isinstance(v, Mapping) for v in data.values()):
        precision: list[tuple[str, Any]] = []
        for path, v in _config_leaves(data):
            key = _peft_key(path, v) if path else ""
            if key == "lora" or (path and not path[-1].startswith("_")):
                # Megatron-Bridge's MixedPrecisionConfig.setup() writes its fields over the model
                # config's (a dump keeps the model's defaults, fp8_recipe: delayed): it is read last
                (precision if path[0] == "mixed_precision" else pairs).append((key, True if key == "lora" else v))
        pairs += precision
        top = dict(data)
        if isinstance(top.get("mixed_precision"), str):
            pairs.append(("mixed_precision", top["mixed_precision"]))
    else:
        # a printed NeMo 2 recipe (peft=Config[LoRA](dim=...)) or NeMo 1 overrides (model.peft.peft_scheme=lora)
        lora = re.search(r"\bLoRA\b|peft_scheme\s*=\s*['\"]?lora\b", text, re.I) is not None
        pairs = [(PEFT_KEYS.get(k, k) if lora else k, _scalar(v)) for k, v in _repr_pairs(text)]
        pairs += [("lora", True)] if lora else []
        if not pairs:
            raise ConfigError("no configuration found: give a NeMo / Megatron-Bridge YAML file, a printed recipe "
                              "(key=value, ...) or overrides such as model.tensor_model_parallel_size=8")
    flags: dict[str, tuple[str, ...]] = {}
    nodes = devices = None
    for key, value in pairs:
        value = _scalar(value)
        if key == "num_nodes" and isinstance(value, int):
            nodes = value
            continue
        if key == "devices" and isinstance(value, int):
            devices = value
            continue
        if key in PACKED_KEYS:
            if value and PACKED_NOTE not in notes:
                notes.append(PACKED_NOTE)
            continue
        if key == "grad_reduce_in_fp32" and isinstance(value, bool):  # the DDP and mixed-precision configs
            if value:  # Megatron's default; the mixed-precision section, read last, overrides the DDP one
                flags.pop("--grad-reduce-in-bf16", None)
            else:
                flags["--grad-reduce-in-bf16"] = ()
            continue
        for flag, vals in _config_flag(key, value):
            flags[flag] = vals
    gpus = nodes * devices if nodes and devices else None
    return flags, gpus, notes


#: a fine-tuning config's sequence packing (Megatron-Bridge ``packed_sequence_specs``, NeMo 1's
#: ``packed_sequence``): its documents' length is the data's, not the config's
PACKED_KEYS = ("packed_sequence_size", "packed_sequence")
PACKED_NOTE = ("the sequences are packed: set [parallel] document_length to the mean length of the documents "
               "(NVIDIA's packed SQuAD: 210 tokens; docs/features/fine-tuning.md)")
#: keys of a PEFT section (NeMo 2 / Megatron-Bridge ``peft: LoRA(dim, target_modules)``; NeMo 1
#: ``model.peft.lora_tuning``) and the flags they become: Megatron-LM has no LoRA, so these are MoFa's
#: own, read by the ``lora`` feature
PEFT_KEYS = {"dim": "lora_rank", "adapter_dim": "lora_rank", "target_modules": "lora_target_modules"}


def _peft_key(path: tuple[str, ...], value) -> str:
    """The key a config leaf counts as: PEFT options under a ``peft`` section get the names of
    :data:`PEFT_KEYS`, the section's LoRA class (``_target_: ...LoRA``) or NeMo 1's
    ``peft_scheme: lora`` the key ``lora``, its other options (alpha, dropout: no cost) ``lora_*``."""
    key = path[-1]
    if "peft" not in path[:-1]:
        return key
    if (key == "_target_" and str(value).split(".")[-1] == "LoRA") or (key == "peft_scheme" and str(value).lower()
                                                                        == "lora"):
        return "lora"
    return PEFT_KEYS.get(key, key if key.startswith("lora_") else f"lora_{key}")


#: config keys holding a dtype (Megatron-Bridge's ``OptimizerConfig``), and the Megatron-LM names of
#: the torch dtypes they hold (TE's FusedAdam keeps fp8 moments as uint8)
_DTYPE_KEYS = ("exp_avg_dtype", "exp_avg_sq_dtype", "main_grads_dtype", "main_params_dtype")
_DTYPE_NAMES = {"float32": "fp32", "float": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16",
                "float16": "fp16", "half": "fp16", "fp16": "fp16", "uint8": "fp8", "float8": "fp8", "fp8": "fp8"}


#: config keys whose list is one entry per layer (Megatron reads the flag as a list expression)
_PER_LAYER_KEYS = ("moe_layer_freq", "window_attn_skip_freq")


def _config_flag(key: str, value) -> list[tuple[str, tuple[str, ...]]]:
    """The Megatron-LM flags one config key stands for."""
    if value is None or value is False:
        if key == "overlap_p2p_comm" and value is False:
            return [("--no-overlap-p2p-communication", ())]
        if key == "share_embeddings_and_output_weights" and value is False:
            return [("--untie-embeddings-and-output-weights", ())]
        return []
    if key == "peft_scheme":  # NeMo 1 overrides: read as the key "lora" (flags_from_config)
        return []
    if key == "gated_linear_unit":
        return [("--swiglu", ())] if value is True else []
    if key in ("activation", "activation_func"):  # NeMo 1: "fast-swiglu"; Bridge: silu with gated_linear_unit
        return [("--swiglu", ())] if "glu" in str(value).lower() else []
    if key == "share_embeddings_and_output_weights" or key == "add_bias_linear" or key == "overlap_p2p_comm":
        return []
    if key in ("precision", "mixed_precision"):
        return _precision_flags(str(value))
    if key == "num_query_groups":
        return [("--group-query-attention", ()), ("--num-query-groups", (str(value),))]
    if key == "kv_lora_rank":
        return [("--multi-latent-attention", ()), ("--kv-lora-rank", (str(value),))]
    flag = _CONFIG_ALIASES.get(key, "--" + key.replace("_", "-"))
    if key in _DTYPE_KEYS:  # Megatron-Bridge states torch dtypes: torch.bfloat16 → bf16
        value = _DTYPE_NAMES.get(str(value).lower().removeprefix("torch."), str(value))
    if value is True:
        return [(flag, ())]
    if key == "pipeline_model_parallel_layout" and isinstance(value, (list, tuple)):
        return [(flag, (_layout_string(value),))]
    if isinstance(value, (list, tuple)):  # a per-layer list is one value, Megatron's list expression
        return [(flag, tuple(str(x) for x in value))] if key not in _PER_LAYER_KEYS else [
            (flag, ("[" + ",".join(str(x) for x in value) + "]",))]
    return [(flag, (str(value),))]


#: Megatron-Core's layer names in a pipeline layout given as lists (``PipelineParallelLayerLayout``)
#: and their characters in its string form (``mofa_framework.pipeline_layout``)
_LAYOUT_NAMES = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def _layout_string(stages) -> str:
    """A layout as a dumped config holds it — a list of stages, each a list of layer names
    (``[[embedding, decoder], …, [decoder, mtp, loss]]``) — in Megatron's string form
    (``Et|…|tmL``); a stage given as a string is kept as it is."""
    out = []
    for stage in stages:
        if isinstance(stage, str):
            out.append(stage)
            continue
        try:
            out.append("".join(_LAYOUT_NAMES[str(x).lower()] for x in stage))
        except (KeyError, TypeError):
            raise ConfigError(f"pipeline_model_parallel_layout: stage {stage!r} holds a layer name other than "
                              f"{', '.join(_LAYOUT_NAMES)}") from None
    return "|".join(out)


def _precision_flags(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """NeMo's ``precision: bf16-mixed`` / Bridge's ``mixed_precision: bf16_with_fp8_..._mixed``."""
    t = text.lower().replace("-", "_")
    out: list[tuple[str, tuple[str, ...]]] = []
    if "bf16" in t:
        out.append(("--bf16", ()))
    elif t.startswith("16") or "fp16" in t:
        out.append(("--fp16", ()))
    if "fp8" in t:
        recipe = ("mxfp8" if "mxfp8" in t else "blockwise" if "subchannel" in t or "blockwise" in t
                  else "tensorwise" if "current" in t or "tensorwise" in t else "delayed")
        out += [("--fp8-format", ("hybrid",)), ("--fp8-recipe", (recipe,))]
    elif "nvfp4" in t:
        out += [("--fp4-format", ("e2m1",)), ("--fp4-recipe", ("nvfp4",))]
    return out


# ---------------------------------------------------------------------- the import


@attrs.frozen(kw_only=True)
class ImportResult:
    """A job read from Megatron-LM arguments, and what became of every flag."""

    #: the job as a dict shaped like the TOML job file
    job: dict
    #: the zoo model whose shape the arguments describe (None: an inline model)
    model_match: str | None
    used: tuple[str, ...]
    ignored: tuple[str, ...]
    unknown: tuple[str, ...]
    notes: tuple[str, ...]
    #: the variables a launch script sets before its launch line (name, value): its environment, which
    #: :func:`mofa_framework.tuner.environment_findings` holds against what the line needs
    exported: tuple[tuple[str, str], ...] = ()
    #: whether the source is a launch script whose environment can be read (argument lists and
    #: configs say nothing of it)
    script: bool = False


def _moe_layers(pattern: str | None, num_layers: int) -> tuple[int, int, list[str]]:
    """(first_k_dense_layers, moe_layer_frequency, notes) of ``--moe-layer-freq``."""
    if pattern is None:
        return 0, 1, []
    every = _int_or_layer_list("--moe-layer-freq", pattern, num_layers, "[0]*3+[1]*58")
    if isinstance(every, int):
        return 0, every, []
    layers = every
    k = next((i for i, x in enumerate(layers) if x), len(layers))
    rest = layers[k:]
    ones = [i for i, x in enumerate(rest) if x]
    freq = ones[1] - ones[0] if len(ones) > 1 else 1
    notes = []
    if rest != [1 if i % freq == 0 else 0 for i in range(len(rest))]:
        notes.append(f"--moe-layer-freq {pattern}: not leading dense layers plus a period; read as "
                     f"{k} dense layers then an MoE layer every {freq}")
    return k, freq, notes


def _int_or_layer_list(flag: str, value: str, num_layers: int, example: str) -> int | list[int]:
    """A Megatron per-layer flag (``--moe-layer-freq``, ``--window-attn-skip-freq``): an integer, or
    a list expression of one entry per layer (``[0]*3+[1]*58``); one-line ConfigError otherwise."""
    text = value.strip()
    if re.fullmatch(r"[0-9]+", text):
        return int(text)
    if re.search(r"[^\s,\d\[\]()+*]", text):
        raise ConfigError(f"{flag} {value}: expected an integer or a list expression like {example}")
    try:
        layers = _list_expr(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError):
        raise ConfigError(f"{flag} {value}: not a list expression like {example}") from None
    if len(layers) != num_layers:
        raise ConfigError(f"{flag} {value}: {len(layers)} entries for --num-layers {num_layers}")
    return layers


def _list_expr(node) -> list:
    if isinstance(node, ast.List):
        return [_int_const(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _list_expr(node.left) + _list_expr(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        if isinstance(node.right, ast.Constant):
            return _list_expr(node.left) * _int_const(node.right)
        return _list_expr(node.right) * _int_const(node.left)
    raise ValueError("not a list expression")


def _int_const(node) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    raise ValueError("not an integer")


def _model_fields(a: MegatronArgs, notes: list[str]) -> dict:
    """The model's shape in ModelSpec field names (None where the arguments do not say)."""
    need = {"--num-layers", "--hidden-size", "--num-attention-heads"}
    missing = sorted(f for f in need if not a.has(f))
    if missing:
        raise ConfigError(f"the arguments lack {', '.join(missing)}: give the model's shape, or --model NAME")
    L, h, heads = a.number("--num-layers"), a.number("--hidden-size"), a.number("--num-attention-heads")
    swiglu = a.has("--swiglu")
    a.has("--squared-relu")
    ffn = a.number("--ffn-hidden-size", int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h)
    kv = a.number("--num-query-groups", heads) if a.has("--group-query-attention") else heads
    a.values("--num-query-groups")
    head_dim = a.number("--kv-channels", 0)
    vocab = a.number("--vocab-size")
    if vocab is None and a.value("--tokenizer-type") == "GPT2BPETokenizer":
        vocab = GPT2_VOCAB
    # Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by × TP
    multiple = a.number("--make-vocab-size-divisible-by", 128) * a.number("--tensor-model-parallel-size", 1)
    padded = -(-vocab // multiple) * multiple if vocab else None
    norm = (a.value("--normalization") or "LayerNorm").lower()
    pos = (a.value("--position-embedding-type") or ("rope" if a.has("--use-rotary-position-embeddings")
                                                    else "learned_absolute")).lower()
    fields: dict[str, Any] = {
        "num_layers": L, "hidden_size": h, "num_attention_heads": heads, "num_kv_heads": kv,
        "ffn_hidden_size": ffn, "vocab_size": vocab, "padded_vocab_size": padded,
        "activation": "swiglu" if swiglu else "gelu",
        "normalization": "rmsnorm" if "rms" in norm else "layernorm",
        "position_embedding": {"rope": "rope", "learned_absolute": "learned", "none": "none"}.get(pos, "rope"),
        "tied_embeddings": not a.has("--untie-embeddings-and-output-weights"),
    }
    if head_dim and head_dim != h // heads:
        fields["head_dim"] = head_dim
    experts = a.number("--num-experts", 0)
    if experts:
        moe_ffn = a.number("--moe-ffn-hidden-size", ffn)
        shared = a.number("--moe-shared-expert-intermediate-size", 0)
        first_dense, freq, more = _moe_layers(a.value("--moe-layer-freq"), L)
        notes += more
        fields.update(num_experts=experts, experts_per_token=a.number("--moe-router-topk", 2),
                      moe_ffn_hidden_size=moe_ffn, num_shared_experts=shared // moe_ffn if shared else 0,
                      first_k_dense_layers=first_dense, moe_layer_frequency=freq,
                      moe_router_num_groups=a.number("--moe-router-num-groups", 0),
                      moe_router_group_topk=a.number("--moe-router-group-topk", 0))
        if shared % moe_ffn:
            notes.append(f"--moe-shared-expert-intermediate-size {shared} is not a multiple of the expert size "
                         f"{moe_ffn}: read as {shared // moe_ffn} shared experts")
    if a.has("--multi-latent-attention"):
        fields.update(q_lora_rank=a.number("--q-lora-rank", 0), kv_lora_rank=a.number("--kv-lora-rank", 512),
                      qk_nope_head_dim=a.number("--qk-head-dim", 128),
                      qk_rope_head_dim=a.number("--qk-pos-emb-head-dim", 64), v_head_dim=a.number("--v-head-dim", 128))
        fields.pop("head_dim", None)
    else:
        for f in ("--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"):
            a.values(f)
    mtp = a.number("--mtp-num-layers", 0)
    if mtp:
        fields["num_mtp_layers"] = mtp
        if a.has("--mtp-use-repeated-layer"):  # one set of MTP weights run mtp-num-layers times
            fields["mtp_shared_weights"] = True
    latent = a.number("--moe-latent-size", 0)
    if latent and "num_experts" in fields:
        fields["moe_latent_size"] = latent
    fields.update(_window_fields(a, L))
    return fields


def _window_fields(a: MegatronArgs, num_layers: int) -> dict:
    """``sliding_window`` (keys per query) and ``sliding_window_layer_fraction`` of
    ``--window-size LEFT RIGHT`` (a query attends keys ``i − LEFT .. i + RIGHT``; causal models give
    RIGHT = 0) and ``--window-attn-skip-freq`` (an integer N: layer n, counted from 1, attends fully
    when N divides n, else in the window; a list such as ``[1,0]*18``: 1 windowed, 0 full, per layer).
    Empty when no window is given (every layer attends fully)."""
    text = " ".join(a.values("--window-size"))
    skip = a.value("--window-attn-skip-freq")
    if not text.strip() or text.strip().lower() in ("none", "null"):
        return {}
    sizes = [int(x) for x in re.findall(r"-?[0-9]+", text)]
    if len(sizes) != 2 or sizes[0] < 0 or sizes[1] < 0:
        raise ConfigError(f"--window-size {text}: expected two non-negative integers LEFT RIGHT (a causal "
                          "model's 4095 0 attends 4,096 keys)")
    if sizes[1]:
        raise ConfigError(f"--window-size {text}: a window reaching {sizes[1]} keys ahead is not causal; MoFa prices "
                          "causal windows: give RIGHT = 0")
    every = num_layers + 1 if skip is None else _int_or_layer_list("--window-attn-skip-freq", skip, num_layers,
                                                                     "[1,0]*18")
    if isinstance(every, list):
        windowed = sum(1 for x in every if x)
    elif every < 1:
        raise ConfigError(f"--window-attn-skip-freq {skip}: expected a positive integer or a list like [1,0]*18")
    else:
        windowed = num_layers - num_layers // every
    return {"sliding_window": sizes[0] + 1, "sliding_window_layer_fraction": windowed / num_layers} if windowed else {}


#: ModelSpec fields compared to find a zoo model with the same shape (absent fields count as 0)
_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "num_experts",
          "experts_per_token", "moe_ffn_hidden_size", "num_shared_experts", "first_k_dense_layers", "kv_lora_rank",
          "q_lora_rank", "num_mtp_layers")


def match_model(fields: Mapping[str, Any], models: Mapping[str, Any]) -> list[str]:
    """Zoo models whose shape equals `fields`: the fields of ``_SHAPE`` (0 where absent), the
    per-head dimension, and the vocabulary (as given or as Megatron pads it) when known."""
    out = []
    head = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    for name, m in sorted(models.items()):
        same = all(getattr(m, k, 0) == (fields.get(k) or 0) for k in _SHAPE)
        same = same and (m.is_mla or m.kv_channels == head)
        if same and fields.get("sliding_window"):  # a stated window must be the zoo model's (±1 key: the
            # configs count the window with or without the query itself, HF's 128 is Bridge's (127, 0))
            same = abs(m.sliding_window - fields["sliding_window"]) <= 1 and abs(
                _windowed_share(m) - fields["sliding_window_layer_fraction"]) < 1e-9
        if same and fields.get("vocab_size") is not None:
            same = m.vocab_size in (fields["vocab_size"], fields.get("padded_vocab_size"))
        if same:
            out.append(name)
    return out


def _windowed_share(m) -> float:
    """The share of a zoo model's layers that attend in its sliding window."""
    if not m.sliding_window:
        return 0.0
    share = {"sliding": 1.0, "model": m.sliding_window_layer_fraction}
    kinds = [m.block(k).attention for k in m.layer_kinds]
    return sum(share.get(k, 0.0) for k in kinds) / len(kinds)


def _parallel(a: MegatronArgs, num_layers: int | None, notes: list[str]) -> dict:
    tp = a.number("--tensor-model-parallel-size", 1)
    pp = a.number("--pipeline-model-parallel-size", 1)
    first = a.number("--decoder-first-pipeline-num-layers", 0)
    last = a.number("--decoder-last-pipeline-num-layers", 0)
    vpp = a.number("--num-virtual-stages-per-pipeline-rank", None)
    per_chunk = a.number("--num-layers-per-virtual-pipeline-stage", None)
    if vpp is None and per_chunk:
        counted = (num_layers or 0) + a.has("--account-for-embedding-in-pipeline-split") + a.has(
            "--account-for-loss-in-pipeline-split")
        if num_layers is None or counted % pp or (counted // pp) % per_chunk:
            raise ConfigError(f"--num-layers-per-virtual-pipeline-stage {per_chunk}: the layers per stage "
                              f"({counted} / {pp}) must be a multiple of it")
        vpp = counted // pp // per_chunk
    # the embedding / the loss counted as a layer of the first / last stage's share
    emb, loss = a.has("--account-for-embedding-in-pipeline-split"), a.has("--account-for-loss-in-pipeline-split")
    if (emb or loss) and pp > 1 and num_layers is not None and not (first or last):
        per_stage = (num_layers + emb + loss) // pp
        first, last = per_stage - emb, per_stage - loss
    # Megatron-DeepSpeed's DeepSpeed-Ulysses degree stands for Megatron's context parallelism (its form:
    # the cp_a2a feature's `from_megatron`)
    cp = max(a.number("--context-parallel-size", 1), a.number("--ds-sequence-parallel-size", 1))
    par = {"tp": tp, "pp": pp, "vpp": vpp or 1, "cp": cp,
           "ep": a.number("--expert-model-parallel-size", 1), "etp": a.number("--expert-tensor-parallel-size", 0)}
    if first:
        par["first_stage_layers"] = first
    if last:
        par["last_stage_layers"] = last
    layout = a.value("--pipeline-model-parallel-layout")
    if layout:  # read into the stage sizes and vpp when the job is resolved (mofa_framework.pipeline_layout)
        par["pipeline_layout"] = layout
    return par


def _precision(a: MegatronArgs, notes: list[str]) -> str:
    if a.has("--bf16"):
        return "bf16"
    if a.has("--fp16"):
        return "fp16"
    notes.append("neither --bf16 nor --fp16: Megatron trains in fp32, which MoFa does not model; predicted as bf16")
    return "bf16"


def _flash_attention(a: MegatronArgs) -> bool:
    backend = (a.value("--attention-backend") or "auto").lower()
    return a.has("--use-flash-attn") or backend not in ("unfused", "local")


def from_args(words_or_flags, registry, *, hardware: str | None, num_gpus: int | None, model: str | None = None,
              name: str = "megatron", notes: Sequence[str] = ()) -> ImportResult:
    """A job from Megatron-LM arguments (words, or flags from :func:`parse_flags`).

    `hardware` and `num_gpus` are what the arguments cannot say; `model` names a zoo model
    (or a HuggingFace ``config.json``) instead of matching the shape.
    """
    flags = words_or_flags if isinstance(words_or_flags, Mapping) else parse_flags(words_or_flags)
    a = MegatronArgs(flags=dict(flags))
    notes = list(notes)
    if not hardware:
        raise ConfigError("the hardware is not in Megatron's arguments: give --hardware NAME (see mofa list-hardware)")
    registry.hardware_profile(hardware, field="--hardware")
    if not num_gpus:
        raise ConfigError("the GPU count is not in the arguments (no torchrun --nproc_per_node/--nnodes): "
                          "give --gpus N")

    # the model: a zoo name, a HuggingFace config, or the shape the arguments give
    shape_given = all(f in flags for f in ("--num-layers", "--hidden-size", "--num-attention-heads"))
    fields = _model_fields(a, notes) if model is None or shape_given else None
    match: str | None = None
    if model is not None:
        model_table = {"config": model} if model.endswith(".json") else {"name": model}
        if not model.endswith(".json"):
            zoo = registry.model(model, field="--model")
            model_table = {"name": zoo.name}
            if fields is not None and zoo.name not in match_model(fields, {zoo.name: zoo}):
                notes.append(f"--model {zoo.name}: its shape differs from the arguments'; the zoo model is used")
    else:
        matches = match_model(fields, registry.models)
        if matches:
            match = matches[0]
            model_table = {"name": match}
            if len(matches) > 1:
                notes.append(f"the shape matches {', '.join(matches)}; using {match}")
            zoo = registry.model(match)
            if zoo.sliding_window and not fields.get("sliding_window"):
                fix = ("give sliding_window = 0 under [model]" if not zoo.layer_pattern else
                       "give the model inline, its [model] table without layer_pattern")
                notes.append(f"no --window-size, but the zoo's {match} attends in a window of {zoo.sliding_window} "
                             f"keys on {_windowed_share(zoo):.0%} of its layers: priced with that window (if the "
                             f"run attended fully, {fix})")
        else:
            if fields.get("vocab_size") is None:
                raise ConfigError("the model matches no zoo model and the arguments give no --vocab-size (or a "
                                  "GPT2BPETokenizer): add --vocab-size N, or name the model with --model")
            slug = re.sub(r"[^a-z0-9.\-]+", "-", name.lower()).strip("-.") or "megatron"
            model_table = {"name": f"{slug}-model", **{k: v for k, v in fields.items()
                                                       if v is not None and k != "padded_vocab_size"}}
            if fields["padded_vocab_size"] != fields["vocab_size"]:
                model_table["vocab_size"] = fields["padded_vocab_size"]
                notes.append(f"vocabulary {fields['vocab_size']} padded to {fields['padded_vocab_size']}, as "
                             "Megatron pads it (--make-vocab-size-divisible-by × TP)")
    num_layers = fields["num_layers"] if fields else registry.model(model).num_layers if (
        model and not model.endswith(".json")) else None
    par = _parallel(a, num_layers, notes)
    tp_cp_pp = par["tp"] * par["pp"] * par["cp"]
    dp = num_gpus // tp_cp_pp if num_gpus % tp_cp_pp == 0 else 0
    a.parallel.update(par, dp=dp)
    seq = a.number("--seq-length") or a.number("--encoder-seq-length")
    if seq is None:
        raise ConfigError("the arguments lack --seq-length")
    mbs = a.number("--micro-batch-size", 1)
    gbs = a.number("--global-batch-size", None)
    if gbs is None:
        gbs = mbs * max(dp, 1)
        notes.append(f"no --global-batch-size: Megatron's default, micro-batch × data-parallel = {gbs}")
    parallel = {**{k: v for k, v in par.items() if v or k != "etp"}, "micro_batch_size": mbs,
                "global_batch_size": gbs, "sequence_length": seq,
                "sequence_parallel": a.has("--sequence-parallel") and par["tp"] > 1,
                "precision": _precision(a, notes), "flash_attention": _flash_attention(a)}
    if (a.value("--transformer-impl") or "").lower() == "local" and parallel["flash_attention"]:
        # Megatron's local transformer (no Transformer Engine) calls the flash_attn package: FlashAttention-2
        parallel["attention_kernel"] = "fa2"
    job: dict[str, Any] = {"name": name, "model": model_table, "hardware": {"name": hardware, "num_gpus": num_gpus},
                           "parallel": parallel}
    sched = [s.name for s in registry.schedules.values() if s.from_megatron is not None and s.from_megatron(a)]
    if len(sched) == 1:
        job["pipeline"] = {"schedule": sched[0]}
    elif len(sched) > 1:
        notes.append(f"the arguments select several schedules ({', '.join(sched)}); Megatron's default is used")
    features = {}
    for feat in registry.features.values():
        if feat.from_megatron is None:
            continue
        try:
            opts = feat.from_megatron(a)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - a plugin's reader must name itself
            plugin = registry.provided_by.get(("features", feat.name), feat.name)
            raise ConfigError(f"feature {feat.name!r} (plugin {plugin!r}) could not read the Megatron arguments: "
                              f"{type(exc).__name__}: {exc}") from None
        if opts is not None:
            features[feat.name] = dict(opts)
    if features:
        job["features"] = features
    for f in ("--rampup-batch-size", "--step-batch-size-schedule"):
        if f in flags:
            notes.append(f"{f}: MoFa predicts the steady state at --global-batch-size {gbs}")
    used, ignored, unknown = _classify(flags, a.read)
    return ImportResult(job=job, model_match=match, used=used, ignored=ignored, unknown=unknown, notes=tuple(notes))


def _classify(flags: Mapping[str, Any], read: set[str]) -> tuple[tuple[str, ...], ...]:
    used, ignored, unknown = [], [], []
    for f in flags:
        if f in read:
            used.append(f)
        elif f in IGNORED_FLAGS or f.startswith(IGNORED_PREFIXES):
            ignored.append(f)
        else:
            unknown.append(f)
    return tuple(used), tuple(ignored), tuple(unknown)


def read_source(text: str, registry, *, kind: str, hardware: str | None, num_gpus: int | None,
                model: str | None = None, name: str = "megatron") -> ImportResult:
    """A job from a Megatron-LM launch script / argument list (`kind` ``"megatron"``) or a NeMo /
    Megatron-Bridge config (``"nemo"``)."""
    if kind == "nemo":
        flags, gpus, notes = flags_from_config(text)
        if model is None and "--num-layers" not in flags:
            for cand in config_model_names(text):
                try:
                    model = registry.model(cand).name
                except UnknownRecordError:
                    continue
                notes.append(f"the model is the zoo's {model}, after the recipe's config class")
                break
        return from_args(flags, registry, hardware=hardware, num_gpus=num_gpus or gpus, model=model, name=name,
                         notes=notes)
    from .launch_script import launcher_gpus, read_script

    launch = read_script(text)
    gpus = launcher_gpus(launch)
    notes = list(launch.notes)
    if num_gpus and gpus and num_gpus != gpus:
        notes.append(f"--gpus {num_gpus} overrides the launcher's {gpus} GPUs")
    res = from_args(launch.arguments, registry, hardware=hardware, num_gpus=num_gpus or gpus, model=model,
                    name=name, notes=notes)
    return attrs.evolve(res, exported=launch.variables, script=bool(launch.program))


# ---------------------------------------------------------------------- writing TOML


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(job: Mapping[str, Any], header: Sequence[str] = ()) -> str:
    """`job` (scalars, lists and tables of them, one level of nested tables) as TOML text."""
    lines = [f"# {h}" for h in header]
    for k, v in job.items():
        if not isinstance(v, Mapping):
            lines.append(f"{k} = {_toml_value(v)}")
    for k, v in job.items():
        if isinstance(v, Mapping):
            scalars = {a: b for a, b in v.items() if not isinstance(b, Mapping)}
            tables = {a: b for a, b in v.items() if isinstance(b, Mapping)}
            if scalars or not tables:
                lines += ["", f"[{k}]"] + [f"{a} = {_toml_value(b)}" for a, b in scalars.items()]
            for a, b in tables.items():
                lines += ["", f"[{k}.{a}]"] + [f"{c} = {_toml_value(d)}" for c, d in b.items()]
    return "\n".join(lines) + "\n"


__all__ = ["IGNORED_FLAGS", "ImportResult", "MegatronArgs", "flags_from_config", "from_args", "match_model",
           "parse_flags", "read_source", "to_toml"]


def with_environment_findings(res: ImportResult, job, registry) -> ImportResult:
    """`res` with a note for each variable the launch script sets against (or leaves out of) what the
    imported job's Megatron line needs (:func:`mofa_framework.tuner.environment_findings`); `job` is
    the imported job resolved. Argument lists and configs carry no environment: unchanged."""
    if not res.script:
        return res
    from .tuner import LaunchConfig, environment_findings, megatron_environment

    env = megatron_environment(job.model, LaunchConfig.of_job(job, registry), registry, job.hardware)
    return attrs.evolve(res, notes=res.notes + tuple(environment_findings(env, dict(res.exported))))
