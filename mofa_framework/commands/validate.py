"""``mofa validate`` and ``mofa calibrate``: predicted vs published step times; fitted efficiencies."""

from __future__ import annotations

import csv
import io
import json
import math
import shlex
import sys
from pathlib import Path

import attrs
import click

from ..calibrate import DEFAULT_PARAMETERS, PARAMETERS
from ..cli import _table, pass_state
from ..errors import ConfigError
from ..types import KEBAB
from ._figure import figure, written_path


def _pct(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _json_safe(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def summary_rows(result) -> list[list[str]]:
    out = []
    for s in [*result.sources, result.overall]:
        r = s.ranking
        out.append([s.source, str(s.rows), str(s.skipped), _pct(s.step_time.mape), _pct(s.step_time.p90),
                    _pct(s.step_time.max), f"{100 * s.step_time.bias:+.1f} %" if s.rows else "—",
                    f"{_num(r.spearman_mean)} / {_num(r.spearman_min)}" if r.spearman else "—",
                    f"{_pct(r.regret_mean)} / {_pct(r.regret_max)}" if r.regret else "—",
                    f"{_pct(s.memory.mape)} ({s.memory.n})" if s.memory.n else "—", str(s.ran_over_memory),
                    ", ".join(f"{k}: {v}" for k, v in s.targets.items()) or "—"])
    return out


SUMMARY_HEADERS = ["source", "rows", "skipped", "MAPE", "p90", "max", "bias", "Spearman mean / min",
                   "regret mean / max", "memory MAPE (n)", "ran, predicted over memory", "target column"]


def parity_plot(result, path: Path) -> None:
    """Predicted against measured step time, log-log, one marker series per source, with the
    y = x line and the ±10 % band; the legend gives each source's rows and MAPE."""
    by_source: dict[str, list] = {}
    for r in result.rows:
        by_source.setdefault(r.source, []).append(r)
    if not by_source:
        raise ConfigError("--plot: no row was predicted, nothing to draw")
    summaries = {s.source: s for s in result.sources}
    markers = "osD^vP*Xh<>"
    with figure(path, (6.4, 6.0)) as (_, ax):
        lo = min(min(r.measured_s, r.predicted_s) for r in result.rows) / 1.3
        hi = max(max(r.measured_s, r.predicted_s) for r in result.rows) * 1.3
        ax.fill_between([lo, hi], [lo / 1.1, hi / 1.1], [lo * 1.1, hi * 1.1], color="0.9", label="±10 %")
        ax.plot([lo, hi], [lo, hi], color="0.4", linewidth=0.8)
        for i, (source, rows) in enumerate(by_source.items()):
            s = summaries.get(source)
            label = f"{source} ({len(rows)}, MAPE {_pct(s.step_time.mape) if s else '—'})"
            ax.scatter([r.measured_s for r in rows], [r.predicted_s for r in rows], s=12, alpha=0.7,
                       marker=markers[i % len(markers)], label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured step time (s)")
        ax.set_ylabel("predicted step time (s)")
        o = result.overall.step_time
        ax.set_title(f"MoFa vs published step times: MAPE {_pct(o.mape)} over {o.n} rows")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(True, which="both", alpha=0.2)


def data_options(f):
    """--builtin, --builtin-set and --reader, shared by validate and calibrate."""
    from ..measurements import builtin_sets

    f = click.option("--reader", "reader", metavar="NAME",
                     help="Read every file with this measurement reader (see `mofa list-plugins`; the core's "
                          "own is `plain`) instead of the one its columns select.")(f)
    f = click.option("--builtin-set", "builtin_set", type=click.Choice(list(builtin_sets())),
                     help="Add the published measurements shipped with MoFa: the calibration set (what "
                          "--builtin adds), the sources added after the fits, the *_dense twins, or all.")(f)
    f = click.option("--builtin", "builtin", is_flag=True,
                     help="Add the published measurements shipped with MoFa (the calibration set of "
                          "docs/validation.md).")(f)
    return f


def input_files(files, builtin: bool, builtin_set: str | None) -> list[Path]:
    """FILES plus the shipped measurement set asked for; ConfigError when there is nothing to read."""
    from ..measurements import builtin_files

    out = list(files)
    if builtin or builtin_set:
        out += builtin_files(builtin_set or "calibration")
    if not out:
        raise ConfigError("give measurement CSV FILES, or --builtin for the published measurements shipped with MoFa")
    return out


def report_notes(notes, skipped) -> None:
    """Files passed over and malformed rows, on stderr (the table or JSON on stdout stays clean)."""
    for n in notes:
        click.echo(f"note: {n}", err=True)
    bad = [s for s in skipped if s.kind == "malformed"]
    if bad:
        first = bad[0]
        click.echo(f"warning: {len(bad)} malformed row(s) not predicted (listed with the reason); first: "
                   f"{first.source} row {first.row_id}: {first.reason}", err=True)
    broken = [s for s in skipped if s.kind == "error"]
    if broken:
        first = broken[0]
        click.echo(f"warning: {len(broken)} row(s) could not be priced and are listed as not predicted; first: "
                   f"{first.source} row {first.row_id}: {first.reason}", err=True)


@click.command("validate")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@data_options
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown"]), default="table",
              show_default=True)
@click.option("--source", "sources", multiple=True, metavar="TEXT",
              help="Keep rows whose source (file stem) or reference contains TEXT (repeatable).")
@click.option("--rows", "show_rows", is_flag=True, help="Also list every row (table format).")
@click.option("--hardware", "hardware", metavar="NAME",
              help="Predict every row on this hardware profile instead of the GPU its row names (e.g. a "
                   "profile `mofa calibrate --name` wrote).")
@click.option("--plot", "plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Also draw predicted against measured step time, per source, into FILE.png "
                   "(needs matplotlib).")
@click.option("--by", "by", metavar="KEY[,KEY]",
              help="Also tabulate the error per group of rows, largest share of the error first; keys: "
                   "source, reference, model, hardware, num_gpus, precision (the GEMMs' format), framework "
                   "(the stack the row names) (e.g. --by framework,precision).")
@pass_state
def validate_cmd(state, files, builtin, builtin_set, reader, fmt, sources, show_rows, hardware, plot, by):
    """Predict every row of measurement CSV FILES (or --builtin) and report the error.

    Each file is read by the measurement reader its columns select: MoFa's plain schema, or a
    plugin's (the shared set's dense, NVIDIA and vTrain schemas; docs/validation.md). The `target
    column` says which measured or derived column each step time came from. Unmappable, malformed
    and infeasible rows are listed with the reason; a file no reader recognises is skipped with a
    note when other files are given.
    """
    from ..validate import group_errors, group_keys, validate

    keys = group_keys(by) if by is not None else None  # a bad key fails before any prediction
    paths = input_files(files, builtin, builtin_set)
    result = validate(paths, state.predictor(), sources=sources or None, hardware=hardware, reader=reader)
    report_notes(result.notes, result.skipped)
    groups = group_errors(result.rows, keys) if keys is not None else None
    if plot is not None:
        parity_plot(result, plot)
        click.echo(f"plot written to {written_path(plot)}", err=True)
    if fmt == "json":
        out = result.to_dict()
        if groups is not None:
            out["groups"] = {"by": keys, "groups": [attrs.asdict(g) for g in groups]}
        click.echo(json.dumps(_json_safe(out), indent=2, default=str))
        return
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["source", "reference", "row_id", "model", "hardware", "num_gpus", "strategy", "target",
                    "measured_s", "predicted_s", "error_pct", "measured_tflops", "predicted_tflops_source_convention",
                    "predicted_model_tflops", "measured_memory_gib", "predicted_memory_gib", "fits_in_memory",
                    "status", "reason", "assumptions", "precision", "framework"])
        for r in result.rows:
            w.writerow([r.source, r.reference, r.row_id, r.model, r.hardware, r.num_gpus, r.strategy, r.target,
                        f"{r.measured_s:.6g}", f"{r.predicted_s:.6g}", f"{100 * r.error:.2f}",
                        r.measured_tflops or "", f"{r.predicted_tflops_source_convention:.4g}"
                        if r.predicted_tflops_source_convention else "", f"{r.predicted_model_tflops:.4g}",
                        r.measured_memory_gib or "", f"{r.predicted_memory_gib:.4g}", r.fits_in_memory, "ok", "",
                        r.assumptions, r.precision, r.framework])
        for s in result.skipped:
            w.writerow([s.source, s.reference, s.row_id, s.model, "", "", "", "", "", "", "", "", "", "", "", "",
                        "", s.kind, s.reason, "", "", ""])
        click.echo(buf.getvalue(), nl=False)
        return
    if show_rows:
        _table([[r.source, r.row_id, r.model, r.hardware, r.num_gpus, r.strategy, f"{r.measured_s:.3f}",
                 f"{r.predicted_s:.3f}", f"{100 * r.error:+.1f} %",
                 _num(r.measured_memory_gib, ".1f") + " / " + f"{r.predicted_memory_gib:.1f}"
                 if r.measured_memory_gib else "—"] for r in result.rows],
               ["source", "row", "model", "hardware", "GPUs", "strategy", "measured s", "predicted s", "error",
                "memory GiB meas / pred"], title="rows", fmt=fmt)
    _table(summary_rows(result), SUMMARY_HEADERS, title="step time: predicted vs measured", fmt=fmt)
    if groups is not None:
        _table([[*map(str, g.key), str(g.step_time.n), _pct(g.step_time.mape), f"{100 * g.step_time.bias:+.1f} %",
                 _pct(g.step_time.max), _pct(g.share_of_error)] for g in groups],
               [*keys, "rows", "MAPE", "bias", "max", "share of |error|"], title=f"step time by {', '.join(keys)}",
               fmt=fmt)
    if result.skipped:
        counts: dict[tuple[str, str, str], int] = {}
        for s in result.skipped:
            key = (s.source, s.kind, s.reason)
            counts[key] = counts.get(key, 0) + 1
        _table([[src, kind, str(n), reason] for (src, kind, reason), n in counts.items()],
               ["source", "kind", "rows", "reason"], title="rows not predicted", fmt=fmt)


@click.command("calibrate")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@data_options
@click.option("--hardware", help="Hardware profile to fit (name or alias); with --cross-validate, only this one, "
                                 "refitted as its recorded command did, or with --param's coefficients (default: "
                                 "every profile whose TOML records the command that fitted it).")
@click.option("--param", "params", multiple=True, metavar="NAME",
              help=f"Coefficient to fit (repeatable; default: {', '.join(DEFAULT_PARAMETERS)}; "
                   f"one of: {', '.join(PARAMETERS)}).")
@click.option("--folds", type=int, default=5, show_default=True, help="k of k-fold cross-validation (0 = none).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--source", "sources", multiple=True, metavar="TEXT",
              help="Fit only rows whose source or reference contains TEXT (repeatable).")
@click.option("--hold-out", "hold_out", multiple=True, metavar="TEXT",
              help="Do not fit rows whose source or reference contains TEXT (repeatable); report their error "
                   "before and after the fit (a held-back split).")
@click.option("--prior", "priors", multiple=True, metavar="NAME=VALUE",
              help="Hold coefficient NAME towards VALUE instead of the library default (repeatable): a "
                   "prior from a published measurement of the mechanism; recorded with the command, and "
                   "used by --cross-validate's refits.")
@click.option("--prior-from", "prior_from", metavar="PROFILE",
              help="Hold the coefficients towards this fitted sibling profile's (the same GPU in another "
                   "system, or its predecessor) instead of the library defaults; --prior still wins for the "
                   "coefficients it names. Recorded with the command; --cross-validate's refits take the "
                   "sibling's own refit of the same fold.")
@click.option("--write", "write", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the profile's TOML with the fitted [efficiency] table to this path.")
@click.option("--all-rows", "all_rows", is_flag=True,
              help="Fit to every row of FILES, predicted on --hardware whatever GPU the row names (your own "
                   "measurements, or a profile --name wrote).")
@click.option("--name", "new_name", metavar="NAME",
              help="With --write: write it as a new profile NAME (kebab-case; its aliases dropped), e.g. into "
                   "a directory of MOFA_HARDWARE_PATH.")
@click.option("--cross-validate", "cross_validate", is_flag=True,
              help="Report the held-out error instead of fitting: each source predicted by the profiles refitted "
                   "without it, and each regime (--leave-out) likewise; nothing is written.")
@click.option("--leave-out", "leave_out", multiple=True, metavar="KIND",
              type=click.Choice(["source", "gpu-precision", "model-family", "framework"]),
              help="With --cross-validate: what each fold holds out (repeatable; default: all four).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown"]), default="table",
              show_default=True)
@pass_state
def calibrate_cmd(state, files, builtin, builtin_set, reader, hardware, params, folds, seed, sources, hold_out, priors,
                  prior_from, write, all_rows, new_name, cross_validate, leave_out, fmt):
    """Fit a hardware profile's [efficiency] coefficients to the step times in FILES (or --builtin);
    with --cross-validate, report the error on rows the fits did not see."""
    from ..calibrate import DEFAULT_PARAMETERS, calibrate, parse_priors, write_profile
    from ..measurements import map_files
    from ..validate import select_sources

    if cross_validate:
        return cross_validate_cmd(state, input_files(files, builtin, builtin_set), hardware, params, leave_out,
                                  dict(write=write, name=new_name, hold_out=hold_out, all_rows=all_rows,
                                       source=sources, reader=reader, prior=priors, prior_from=prior_from), fmt)
    if hardware is None:
        raise ConfigError("--hardware: give the profile to fit (`mofa list-hardware`), or --cross-validate")
    if folds < 0 or folds == 1:
        raise ConfigError(f"--folds must be 0 (none) or ≥ 2, got {folds}")
    if new_name is not None and not write:
        raise ConfigError("--name names the profile --write writes: give --write PATH.toml too")
    if new_name is not None and not KEBAB.match(new_name):
        raise ConfigError(f"--name {new_name!r}: use lower-case letters, digits, dots and hyphens (e.g. my-h100)")
    prior = parse_priors(priors)
    predictor = state.predictor()
    given, files = files, input_files(files, builtin, builtin_set)
    mapped, skipped, notes = map_files(files, predictor.registry, hardware if all_rows else None, reader)
    mapped, skipped = select_sources(mapped, skipped, sources)
    report_notes(notes, skipped)
    result = calibrate(files, hardware, predictor, parameters=params or DEFAULT_PARAMETERS, folds=folds, seed=seed,
                       mapped=mapped, hold_out=hold_out, start=prior, prior_from=prior_from)
    if write:
        argv = ["mofa", "calibrate", *sys.argv[2:]] if sys.argv[1:2] == ["calibrate"] else None
        command = shlex.join(argv) if argv else shlex.join(
            ["mofa", "calibrate", "--hardware", hardware, *(f"--param={p}" for p in params), f"--folds={folds}",
             *(f"--source={s}" for s in sources), *(f"--hold-out={h}" for h in hold_out),
             *(f"--prior={p}" for p in priors), *([f"--prior-from={prior_from}"] if prior_from else []),
             *(["--all-rows"] if all_rows else []), *(["--builtin"] if builtin else []),
             *([f"--builtin-set={builtin_set}"] if builtin_set else []), *([f"--reader={reader}"] if reader else []),
             *map(str, given)])
        write_profile(result, write, command, name=new_name, predictor=predictor)
    if fmt == "json":
        click.echo(json.dumps(_json_safe(result.to_dict()), indent=2, default=str))
        return
    left = ("not constrained by the fitted rows: library default" if result.held_back_rows
            else "left at start (rows insensitive)")
    _table([[k, f"{result.start[k]:.4g}", f"{result.fitted[k]:.4g}",
             left if k in result.not_identifiable else "fitted"]
            for k in result.fitted], ["coefficient", "start", "fitted", ""],
           title=f"{result.hardware}: {result.rows} rows"
                 + (f" ({result.unfitted} more marked not for fitting by their reader)" if result.unfitted else "")
                 + f", {result.method}", fmt=fmt)
    rows = [["all (in-sample)", str(result.rows), _pct(result.before.mape), _pct(result.after.mape),
             _pct(result.after.p90), _pct(result.after.max),
             _pct(result.cross_validated.mape) if result.cross_validated else "—",
             _pct(result.cross_validated.max) if result.cross_validated else "—"]]
    for s, st in result.after_by_source.items():
        cv = result.cross_validated_by_source.get(s)
        rows.append([s, str(st.n), "", _pct(st.mape), _pct(st.p90), _pct(st.max), _pct(cv.mape) if cv else "—",
                     _pct(cv.max) if cv else "—"])
    if result.held_back_after is not None:
        hb, h0 = result.held_back_after, result.held_back_before
        rows.append(["held back (not fitted)", str(result.held_back_rows), _pct(h0.mape), _pct(hb.mape),
                     _pct(hb.p90), _pct(hb.max), "—", "—"])
        for s, st in result.held_back_by_source.items():
            rows.append([f"  {s} (held back)", str(st.n), "", _pct(st.mape), _pct(st.p90), _pct(st.max), "—", "—"])
    _table(rows, ["rows", "n", "MAPE before", "MAPE after", "p90", "max", "held-out MAPE", "held-out max"],
           title=f"step-time error ({len(result.folds)}-fold cross-validation)" if result.folds else "step-time error",
           fmt=fmt)
    if write:
        click.echo(f"wrote {write}", err=fmt == "csv")


def cross_validate_cmd(state, files, hardware, params, leave_out, refused: dict, fmt: str) -> None:
    """``mofa calibrate --cross-validate``: in-sample and held-out error per source and per regime."""
    from ..crossval import KIND_TITLES, KINDS, FitPlan, cross_validate, recorded_plans

    given = [k for k, v in refused.items() if v]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} does not go with --cross-validate (it refits every "
                          "profile as its recorded command did and writes nothing)")
    if params and hardware is None:
        raise ConfigError("--param with --cross-validate needs --hardware (the profile those coefficients belong to)")
    predictor = state.predictor()
    plans = None
    if hardware is not None:
        hw = predictor.registry.hardware_profile(hardware, field="--hardware")
        # without --param: the profile's recorded fit (its coefficients and --prior), as the full run refits it
        recorded = [p for p in recorded_plans(predictor.registry) if p.hardware == hw.name and not params]
        plans = recorded or [FitPlan(hardware=hw.name, parameters=tuple(params or DEFAULT_PARAMETERS))]
    progress = (lambda line: click.echo(line, err=True)) if fmt != "json" else None
    cv = cross_validate(files, predictor, plans=plans, kinds=leave_out or KINDS, progress=progress)
    if fmt == "json":
        click.echo(json.dumps(_json_safe(cv.to_dict()), indent=2, default=str))
        return
    for kind, scheme in cv.held_out.items():
        if kind == "source":
            out = {s.source: s for s in scheme.summaries(cv.skipped)}
            rows = []
            for s in cv.in_sample.summaries(cv.skipped):
                o = out[s.source]
                r = o.ranking
                rows.append([s.source, str(o.rows), _pct(s.step_time.mape), _pct(o.step_time.mape),
                             _pct(o.step_time.p90), _pct(o.step_time.max), f"{100 * o.step_time.bias:+.1f} %",
                             f"{_num(r.spearman_mean)} / {_num(r.spearman_min)} ({len(r.spearman)})"
                             if r.spearman else "—", _pct(r.regret_max) if r.regret else "—"])
            _table(rows, ["source", "rows", "in-sample MAPE", "held-out MAPE", "p90", "max", "bias",
                          "Spearman mean / min (groups)", "top-1 regret max"],
                   title=f"step time, {KIND_TITLES[kind]} (each source predicted by profiles fitted without it)",
                   fmt=fmt)
            continue
        rows = [[key, str(b.n), _pct(a.mape), _pct(b.mape), _pct(b.p90), _pct(b.max), f"{100 * b.bias:+.1f} %"]
                for key, a, b in cv.by_regime(kind)]
        _table(rows, [kind, "rows", "in-sample MAPE", "held-out MAPE", "p90", "max", "bias"],
               title=f"step time, {KIND_TITLES[kind]}", fmt=fmt)
    refits = sum(len(f.refits) for s in cv.held_out.values() for f in s.folds)
    click.echo(f"{refits} refits of {len(cv.plans)} profiles ({', '.join(p.hardware for p in cv.plans)}); "
               f"{cv.cpu_s:.0f} s CPU ({cv.prepare_cpu_s:.1f} s mapping and preparing the rows once)", err=True)
