"""Measurement files: reading them, the plain schema, and the context reader plugins receive.

A measurement file is a CSV with one measured training run per row. Which columns it has decides
which :class:`~mofa_framework.types.MeasurementReader` maps its rows to jobs: the readers
registered by plugins (``mofa_register_measurement_readers``; MoFa's own read the shared set's
dense, NVIDIA and vTrain schemas) and the core's *plain* schema below, which needs no plugin.
Every cell a reader takes goes through the typed accessors of :class:`ReadContext`
(:func:`cell_count`, :func:`cell_float`, ...), so a malformed cell becomes a listed row with
the field, the value and the fix, never a crash or a silently ignored value.

The published measurements ship with MoFa: :func:`builtin_data_dir` locates them and
:func:`builtin_files` names the files of a set (``mofa validate --builtin``).
"""

from __future__ import annotations

import csv
import importlib
import io
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from .config import listing, read_bytes
from .limits import decode_text
from .errors import ConfigError, MofaError, UnknownRecordError
from .types import MappedRow, MeasurementReader, ModelSpec, SkippedRow

#: the Python package the measurement files are installed as (``measurements/`` in a checkout)
DATA_PACKAGE = "mofa_measurements"
#: a count cell above this is refused as implausible (2**31: beyond any GPU count, batch or width)
MAX_COUNT = 2**31
#: cell texts that mean "not stated"
_EMPTY = {"", "n/a", "na", "none", "-", "—", "–", "?", "not stated", "unknown"}


class CellError(ConfigError):
    """A cell that is not what its column holds; the row is listed as malformed."""

    def __init__(self, column: str, value: str, problem: str, fix: str):
        self.column, self.value = column, value
        shown = value if len(value) <= 40 else value[:37] + "..."
        super().__init__(f"{column} = {shown!r}: {problem}; {fix}")


# ====================================================================== built-in data


def builtin_data_dir() -> Path:
    """The folder of the published measurements installed with MoFa (``microbench/`` inside)."""
    return Path(str(resources.files(DATA_PACKAGE)))


def builtin_sets() -> dict[str, tuple[str, ...]]:
    """The named sets of shipped files (``mofa_measurements.SETS``: calibration, newer, duplicates, all)."""
    return importlib.import_module(DATA_PACKAGE).SETS


def builtin_files(name: str = "calibration") -> list[Path]:
    """The shipped files of the named set (:func:`builtin_sets`)."""
    sets = builtin_sets()
    if name not in sets:
        raise ConfigError(f"--builtin-set {name!r}: unknown set; use one of {', '.join(sets)}")
    return [builtin_data_dir() / f for f in sets[name]]


# ====================================================================== cells


def cell_text(row: Mapping[str, Any], column: str) -> str:
    """The cell's text, stripped; ``""`` when the column is absent or the row was cut short."""
    x = row.get(column)
    return x.strip() if isinstance(x, str) else ""


def _stated(text: str) -> bool:
    return text.lower() not in _EMPTY


def cell_float(row: Mapping[str, Any], column: str, *, positive: bool = True, unit_ok: bool = False) -> float | None:
    """A number, or None when the cell is empty (or "n/a", "—", ...).

    "1,024" is a thousands separator. Not a number, not finite (``nan``, ``inf``, ``1e400``) or,
    with `positive`, ≤ 0 raises :class:`CellError`. `unit_ok` accepts a unit or a remark after the
    number ("46.97 GiB (max over ranks)").
    """
    text = cell_text(row, column)
    if not _stated(text):
        return None
    num = text
    if unit_ok:
        m = re.match(r"^([-+]?[0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?[0-9]+)?)(\s*[^\d\s.,].*)?$", text)
        num = m.group(1) if m else text
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d*)?", num):
        num = num.replace(",", "")
    try:
        value = float(num)
    except ValueError:
        raise CellError(column, text, "not a number", "write a plain number (e.g. 12.5)") from None
    if not math.isfinite(value):
        raise CellError(column, text, "not a finite number", "write the measured value")
    if positive and value <= 0:
        raise CellError(column, text, "must be > 0", "write the measured value, or leave the cell empty")
    return value


def cell_count(row: Mapping[str, Any], column: str, default: int | None = None, minimum: int = 1) -> int | None:
    """A whole number ≥ `minimum` (GPUs, a parallel size, a batch, a width), or `default` when empty."""
    text = cell_text(row, column)
    if not _stated(text):
        return default
    value = cell_float(row, column, positive=False)
    assert value is not None
    if value != int(value):
        raise CellError(column, text, "not a whole number", "write a count (e.g. 8)")
    if value < minimum:
        raise CellError(column, text, f"must be ≥ {minimum}", "write the count, or leave the cell empty")
    if value > MAX_COUNT:
        raise CellError(column, text, "implausibly large (> 2**31)", "check the column")
    return int(value)


def cell_flag(row: Mapping[str, Any], column: str) -> bool | None:
    """yes/true/1/on → True, no/false/0/off → False, empty → None; anything else is malformed."""
    text = cell_text(row, column).lower()
    if not _stated(text):
        return None
    if text in ("y", "yes", "true", "1", "on"):
        return True
    if text in ("n", "no", "false", "0", "off"):
        return False
    raise CellError(column, text, "not a yes/no value", "write yes or no")


# ====================================================================== context


@attrs.frozen(kw_only=True)
class ReadContext:
    """What a reader's ``map_row`` receives beside the row."""

    #: the file's source name (its stem), every row's ``source``
    source: str
    registry: Any
    #: 0-based index of the data row in the file (line ``index + 2``)
    index: int = 0
    #: ``--hardware``: every row runs on this profile, whatever GPU it names (None: the row's GPU)
    hardware: Any = None

    @property
    def line(self) -> int:
        return self.index + 2

    # typed cells (see the module functions)
    text = staticmethod(cell_text)
    number = staticmethod(cell_float)
    count = staticmethod(cell_count)
    flag = staticmethod(cell_flag)

    def gpu(self, description: str):
        """The profile for a GPU description (``--hardware`` wins), or None if none is recognised."""
        return self.hardware or hardware_for(self.registry, description)

    def model(self, name: str) -> ModelSpec | None:
        """The zoo model a source's model name denotes (a parenthesised remark dropped), or None."""
        for cand in (name, re.sub(r"\s*\(.*?\)\s*", " ", name).strip()):
            try:
                return self.registry.model(cand)
            except UnknownRecordError:
                continue
        return None

    def step_flops(self, convention: str, model: ModelSpec, global_batch_size: int, sequence_length: int
                   ) -> float | str:
        """One step's FLOPs under a registered convention, or why it has none (a string)."""
        try:
            conv = self.registry.flops_convention(convention)
        except UnknownRecordError:
            return f"FLOPs convention {convention!r} is not installed (see `mofa list-plugins`)"
        try:
            flops = float(conv.step_flops(model, global_batch_size, sequence_length))
        except ValueError as exc:
            return f"{conv.name} FLOPs: {exc}"
        return flops if math.isfinite(flops) and flops > 0 else f"{conv.name} FLOPs: not a positive count"

    def skipped(self, reason: str, *, reference: str = "", row_id: str = "", model: str = "") -> SkippedRow:
        return SkippedRow(source=self.source, reference=reference, row_id=row_id or str(self.index + 1),
                          model=model or "?", reason=reason)


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def hardware_for(registry, name: str):
    """The profile a source's GPU description names: by profile name or alias, else by reading it.

    Sources describe one GPU many ways ("H100 80GB HBM3 @700W", "NVIDIA A100 80GB (Selene)"). Read:
    the GPU family is a token equal to the first word of a profile's name (``h100``, ``a100``,
    ``gb200``); within the family a stated form factor (``pcie``) or memory size (``80GB``) picks
    the profile, else the one the bare family name is an alias of. No family token: unknown.
    """
    for cand in (name.strip(), re.sub(r"\s*[(@,].*$", "", name).strip()):
        if not cand:
            continue
        try:
            return registry.hardware_profile(cand)
        except UnknownRecordError:
            continue
    words = _tokens(name)
    families: dict[str, list] = defaultdict(list)
    for hw in registry.hardware.values():
        families[hw.name.split("-")[0]].append(hw)
    hits = [f for f in families if f in words]
    if len(hits) != 1:
        return None
    members = families[hits[0]]
    if "pcie" in words or any(w.startswith("sxm") for w in words):  # the form factor, when stated
        members = [hw for hw in members if ("pcie" in _tokens(hw.name)) == ("pcie" in words)] or members
    gb = re.search(r"(\d+)\s*gb\b", name.lower())
    if gb:
        size = [hw for hw in members if abs(hw.memory.hbm_gib - float(gb.group(1))) <= 0.06 * float(gb.group(1))]
        members = size or members
    if len(members) == 1:
        return members[0]
    try:
        default = registry.hardware_profile(hits[0])
    except UnknownRecordError:
        return None
    return default if default in members else None


# ====================================================================== the plain schema


#: the plain schema's columns (docs/validation.md, "Your own measurements"): required ...
PLAIN_REQUIRED = ("model", "hardware", "num_gpus", "global_batch_size", "sequence_length")
#: ... and optional: layout and features named as in a job file, and one target
PLAIN_LAYOUT = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size", "first_stage_layers", "last_stage_layers",
                "document_length")
#: ... the run's hardware settings where they are not the profile's, as in ``[hardware]`` ...
PLAIN_HARDWARE = ("power_limit_w", "scaleout_bandwidth_gbps")
PLAIN_OPTIONAL = (*PLAIN_LAYOUT, *PLAIN_HARDWARE, "precision", "attention_kernel", "sequence_parallel", "flash_attention",
                  "schedule", "features",
                  "num_layers", "step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "flops_convention",
                  "measured_memory_gib", "row_id", "reference", "notes", "framework")


def parse_features(text: str) -> dict[str, dict]:
    """``name[:key=value,...][; name2 ...]`` (as ``--feature``, several separated by ``;``)."""
    from .cli import parse_feature_flag

    out: dict[str, dict] = {}
    for item in filter(None, (x.strip() for x in text.split(";"))):
        try:
            name, opts = parse_feature_flag(item)
        except ConfigError:
            raise CellError("features", text, f"cannot read {item!r}", "write name[:key=value,...]; name2") from None
        if not name:
            raise CellError("features", text, "a feature without a name", "write name[:key=value,...]; name2")
        out[name] = opts
    return out


def _plain_target(row, ctx: ReadContext, model: ModelSpec | None, gbs: int, seq: int, n: int
                  ) -> tuple[float, str] | str:
    if (t := cell_float(row, "step_time_s")) is not None:
        return t, "step_time_s"
    if (tps := cell_float(row, "tokens_per_s_per_gpu")) is not None:
        return gbs * seq / (tps * n), "tokens_per_s_per_gpu"
    tflops, conv = cell_float(row, "model_tflops_per_gpu"), cell_text(row, "flops_convention")
    if tflops is not None:
        if not conv:
            return "model_tflops_per_gpu without a flops_convention (name one, see `mofa list-plugins`)"
        if model is None:
            return "model_tflops_per_gpu needs a zoo model to count its FLOPs"
        flops = ctx.step_flops(conv, model, gbs, seq)
        if isinstance(flops, str):
            return flops
        return flops / (tflops * 1e12 * n), f"model_tflops_per_gpu ({conv})"
    return "no step_time_s, tokens_per_s_per_gpu or model_tflops_per_gpu"


def map_plain_row(row: Mapping[str, str], ctx: ReadContext) -> MappedRow | SkippedRow:
    """One plain-schema row: the job it describes and its measured step time."""
    name, gpu = cell_text(row, "model"), cell_text(row, "hardware")
    rid = cell_text(row, "row_id") or str(ctx.index + 1)
    ref = cell_text(row, "reference")

    def skip(reason: str) -> SkippedRow:
        return SkippedRow(source=ctx.source, reference=ref, row_id=rid, model=name or "?", reason=reason)

    n, gbs, seq = (cell_count(row, c) for c in ("num_gpus", "global_batch_size", "sequence_length"))
    layers = cell_count(row, "num_layers")
    if not (name and gpu and n and gbs and seq):
        missing = [c for c, x in zip(PLAIN_REQUIRED, (name, gpu, n, gbs, seq)) if not x]
        return skip(f"{', '.join(missing)} not stated")
    hw = ctx.gpu(gpu)
    if hw is None:
        return skip(f"unknown hardware {gpu!r} (`mofa list-hardware` lists the profiles)")
    model = ctx.model(name)
    if model is not None and layers:
        try:
            model = attrs.evolve(model, num_layers=layers)
        except ValueError as exc:
            raise CellError("num_layers", str(layers), str(exc.args[0] if exc.args else exc), "give the layers run") from None
    timed = _plain_target(row, ctx, model, gbs, seq, n)
    if isinstance(timed, str):
        return skip(timed)
    par: dict[str, Any] = {"global_batch_size": gbs, "sequence_length": seq}
    auto = {c for c in ("tp", "pp", "vpp") if cell_text(row, c).lower() == "auto"}
    for col in PLAIN_LAYOUT:
        if col in auto:
            continue
        try:
            x = cell_count(row, col, minimum=0 if col in ("etp", "document_length") else 1)
        except CellError as exc:
            if col not in ("tp", "pp", "vpp"):
                raise
            what = "factor" if col == "vpp" else "layout"
            raise CellError(col, exc.value, "not a count", f"write a whole number, or auto to try every {what}") from None
        if x is not None:
            par[col] = x
    for col in ("sequence_parallel", "flash_attention"):
        if (f := cell_flag(row, col)) is not None:
            par[col] = f
    for col in ("precision", "attention_kernel"):
        if text := cell_text(row, col).lower():
            par[col] = text
    run = {c: x for c in PLAIN_HARDWARE if (x := cell_float(row, c)) is not None}
    job: dict[str, Any] = {"model": {"name": name, **({"num_layers": layers} if layers else {})},
                           "hardware": {"name": hw.name, "num_gpus": n, **run}, "parallel": par,
                           "features": parse_features(cell_text(row, "features"))}
    if sched := cell_text(row, "schedule"):
        job["pipeline"] = {"schedule": sched}
    measured, target = timed
    searched = " and ".join(c for c in ("tp", "pp") if c in auto)
    if searched and model is None:
        return skip(f"{searched} = auto needs a zoo model (its layers and heads bound the layouts); {name!r} is not "
                    "one (`mofa list-models`; your own in MOFA_MODEL_PATH)")
    layouts = _auto_layout(auto & {"tp", "pp"}, par, model, hw, n, gbs)
    if searched and not layouts:
        return skip(f"{searched} = auto, and no layout of {n} GPUs divides the global batch {gbs} into at least one "
                    "micro-batch per pipeline stage")
    return MappedRow(source=ctx.source, reference=ref, row_id=rid, job=job, measured_s=measured, target=target,
                     group=(ctx.source, name, hw.name, n, seq),
                     variants=layouts or _auto_vpp("vpp" in auto, par, model),
                     measured_memory_gib=cell_float(row, "measured_memory_gib"), notes=cell_text(row, "notes")[:200],
                     framework=cell_text(row, "framework")[:60],
                     fit=not layouts, assumptions="the layout is MoFa's choice: not for fitting" if layouts else "")


def layout_variants(model: ModelSpec, hw, num_gpus: int, cp: int, gbs: int, mbs: int) -> list[tuple[int, int]]:
    """The (TP, PP) layouts a run of `num_gpus` GPUs at context parallelism `cp` could have used:
    TP a power of two within the scale-up domain dividing the attention heads, PP a power of two
    that splits the layers (evenly, or with the two end stages a layer lighter, as Megatron-Core's
    embedding / loss accounting does), and the data-parallel size left dividing the global batch in
    micro-batches of `mbs`, at least one per pipeline stage: a pipeline deeper than its
    micro-batches idles most of the step, and which one ran would then decide the answer."""
    L, out, tp = model.num_layers, [], 1
    while tp <= hw.scaleup_domain_gpus and model.num_attention_heads % tp == 0:
        pp = 1
        while pp <= L:
            dp, rem = divmod(num_gpus, tp * pp * cp)
            splits = L % pp == 0 or (pp > 2 and (L + 2) % pp == 0)
            if splits and dp and not rem and gbs % (dp * mbs) == 0 and gbs // (dp * mbs) >= pp:
                out.append((tp, pp))
            pp *= 2
        tp *= 2
    return out


def _auto_layout(auto: set[str], par: dict, model: ModelSpec | None, hw, n: int, gbs: int) -> tuple[dict, ...]:
    """``tp = auto`` / ``pp = auto`` (the run's layout was tuned, not stated): every layout of
    :func:`layout_variants` (a stated TP or PP kept), end stages a layer lighter where PP does not
    divide the layers; ``validate.resolve_unstated`` keeps the fastest that fits."""
    if not auto or model is None:
        return ()
    L, out = model.num_layers, []
    for t, q in layout_variants(model, hw, n, par.get("cp", 1), gbs, par.get("micro_batch_size", 1)):
        if ("tp" in auto or par.get("tp", 1) == t) and ("pp" in auto or par.get("pp", 1) == q):
            ends = (L + 2) // q - 1 if L % q else None
            out.append({"tp": t, "pp": q, "first_stage_layers": ends, "last_stage_layers": ends})
    return tuple(out)


def _auto_vpp(auto: bool, par: dict, model: ModelSpec | None) -> tuple[dict, ...]:
    """``vpp = auto`` (the source interleaves, or may, but does not say how deep): every factor up
    to one layer per chunk is a candidate; ``validate.resolve_unstated`` keeps the fastest feasible."""
    pp = par.get("pp", 1)
    if not auto or model is None or pp == 1:
        return ()
    return tuple({"vpp": v} for v in range(1, model.num_layers // pp + 1))


PLAIN_READER = MeasurementReader(
    name="plain", description="MoFa's plain schema: model, hardware, layout and features as in a job file, "
                              "and a measured step time (docs/validation.md)",
    columns=frozenset(PLAIN_REQUIRED), map_row=map_plain_row, row_id_column="row_id", model_column="model")


# ====================================================================== files


@attrs.frozen(kw_only=True)
class MeasurementTable:
    """One file's rows and the reader chosen for it."""

    path: Path
    source: str
    reader: MeasurementReader
    header: tuple[str, ...]
    rows: list[dict[str, str]]
    #: rows with fewer or more cells than the header: 0-based index → their number of cells
    irregular: Mapping[int, int] = attrs.field(factory=dict)


def readers(registry) -> dict[str, MeasurementReader]:
    """Every reader: the plugins' and the core's plain schema (which cannot be replaced)."""
    return {**dict(getattr(registry, "readers", {})), PLAIN_READER.name: PLAIN_READER}


def read_rows(path: str | Path) -> tuple[tuple[str, ...], list[dict[str, str]], dict[int, int]]:
    """(header, rows, irregular rows: index → cells) of a CSV; one-line ConfigError if it cannot be read."""
    raw, p = read_bytes(path, "a CSV file")
    text = decode_text(raw, p, "save the file as UTF-8")
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        header = tuple(h.strip() for h in next(reader, []))
        body = [cells for cells in reader if any(c.strip() for c in cells)]
    except csv.Error as exc:
        raise ConfigError(f"{p}: not a readable CSV ({exc})") from None
    if not any(header):
        raise ConfigError(f"{p}: empty file (no header row)")
    seen = Counter(header)
    dupes = sorted(h for h, k in seen.items() if h and k > 1)
    if dupes:
        raise ConfigError(f"{p}: column(s) {listing(dupes)} appear more than once in the header; keep one of each")
    rows = [dict(zip(header, cells)) for cells in body]
    return header, rows, {i: len(c) for i, c in enumerate(body) if len(c) != len(header)}


def choose_reader(path: Path, header: Sequence[str], registry, name: str | None = None) -> MeasurementReader | None:
    """The reader for a header: `name` if given (its columns must be there), else the one whose
    columns are all present and most numerous; None when none matches. Two equally specific
    matches are a ConfigError naming them."""
    cols = set(header)
    every = readers(registry)
    if name:
        rec = registry.reader(name) if name not in every else every[name]
        missing = sorted(rec.columns - cols)
        if missing:
            raise ConfigError(f"{path}: --reader {rec.name} needs the column(s) {listing(missing)}, missing from "
                              "its header")
        return rec
    fits = sorted((r for r in every.values() if r.columns <= cols), key=lambda r: -len(r.columns))
    if not fits:
        return None
    if len(fits) > 1 and len(fits[0].columns) == len(fits[1].columns):
        tied = [r.name for r in fits if len(r.columns) == len(fits[0].columns)]
        raise ConfigError(f"{path}: readers {', '.join(tied)} all recognise its columns; pick one with --reader NAME")
    return fits[0]


def _schema_help(registry) -> str:
    parts = [f"{r.name} ({listing(sorted(r.columns), 4)})" for r in readers(registry).values()]
    return "; ".join(parts)


def load_tables(paths: Iterable[str | Path], registry, reader: str | None = None
                ) -> tuple[list[MeasurementTable], list[str]]:
    """Each file read and matched to its reader, plus notes on files passed over.

    A file no reader recognises, or with a header and no rows, is passed over with a note when
    other files are given; alone (or when every file is passed over) it is a ConfigError.
    """
    paths = [Path(p) for p in paths]
    tables: list[MeasurementTable] = []
    notes: list[str] = []
    problems: list[str] = []
    for p in paths:
        header, rows, irregular = read_rows(p)
        rec = choose_reader(p, header, registry, reader)
        if rec is None:
            problems.append(f"{p}: not a measurement file: no reader recognises its columns "
                            f"({listing(header, 6)}); the readers need: {_schema_help(registry)}")
            continue
        if not rows:
            problems.append(f"{p}: no data rows (only a header); add one measured run per row")
            continue
        tables.append(MeasurementTable(path=p, source=p.stem, reader=rec, header=header, rows=rows,
                                       irregular=irregular))
    if problems and not tables:
        raise ConfigError(problems[0] + (f" (and {len(problems) - 1} more file(s) like it)" if len(problems) > 1
                                         else ""))
    notes += [f"{m.split(': ', 1)[0]}: skipped, {m.split(': ', 1)[1]}" for m in problems]
    return tables, notes


def _malformed(table: MeasurementTable, i: int, row: Mapping[str, str], reason: str) -> SkippedRow:
    rec = table.reader
    rid = cell_text(row, rec.row_id_column) if rec.row_id_column else ""
    return SkippedRow(source=table.source, reference="", row_id=rid or f"line {i + 2}",
                      model=(cell_text(row, rec.model_column) if rec.model_column else "") or "?",
                      reason=reason, kind="malformed")


def map_table(table: MeasurementTable, registry, hardware=None) -> tuple[list[MappedRow], list[SkippedRow]]:
    """Every row of one file through its reader: a mapped row, or a skipped one with the reason."""
    mapped: list[MappedRow] = []
    skipped: list[SkippedRow] = []
    base = ReadContext(source=table.source, registry=registry, hardware=hardware)
    width = len(table.header)
    for i, row in enumerate(table.rows):
        if i in table.irregular:
            cells = table.irregular[i]
            what = "cut short" if cells < width else "longer than the header"
            skipped.append(_malformed(table, i, row, f"row {what}: {cells} cells for {width} columns; "
                                      "give one cell per column (empty cells are fine)"))
            continue
        try:
            out = table.reader.map_row(row, attrs.evolve(base, index=i))
        except CellError as exc:
            out = _malformed(table, i, row, str(exc))
        except MofaError as exc:
            out = _malformed(table, i, row, str(exc))
        except Exception as exc:  # noqa: BLE001 - a reader's bug lists the row, naming the reader
            out = _malformed(table, i, row, f"internal: reader {table.reader.name!r} failed: "
                                            f"{type(exc).__name__}: {exc}")
        if not isinstance(out, (MappedRow, SkippedRow)):
            out = _malformed(table, i, row, f"internal: reader {table.reader.name!r} returned "
                                            f"{type(out).__name__}, not a MappedRow or SkippedRow")
        (mapped if isinstance(out, MappedRow) else skipped).append(out)
    return mapped, skipped


def map_rows(paths: Iterable[str | Path], registry, hardware: str | None = None, reader: str | None = None
             ) -> tuple[list[MappedRow], list[SkippedRow]]:
    """Every row of every file: mapped to a job, or skipped with the reason. With `hardware`
    (a profile name or alias) every row runs on that profile, whatever GPU it names."""
    mapped, skipped, _ = map_files(paths, registry, hardware, reader)
    return mapped, skipped


def map_files(paths: Iterable[str | Path], registry, hardware: str | None = None, reader: str | None = None
              ) -> tuple[list[MappedRow], list[SkippedRow], list[str]]:
    """:func:`map_rows` plus the notes on files passed over (see :func:`load_tables`)."""
    hw = registry.hardware_profile(hardware, field="--hardware") if hardware else None
    tables, notes = load_tables(paths, registry, reader)
    mapped: list[MappedRow] = []
    skipped: list[SkippedRow] = []
    for t in tables:
        m, s = map_table(t, registry, hw)
        mapped += m
        skipped += s
    return mapped, skipped, notes
