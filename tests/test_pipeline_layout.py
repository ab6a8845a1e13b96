"""Megatron-Core's ``--pipeline-model-parallel-layout`` read into MoFa's stage sizes
(:mod:`mofa_framework.pipeline_layout`): the job file, the Megatron import, the round trip with the
tuner's own layout strings, and the refusals (one line naming the field, the value and the fix)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mofa_framework.api import Predictor
from mofa_framework.config import job_from_dict
from mofa_framework.errors import ConfigError
from mofa_framework.megatron import from_args
from mofa_framework.pipeline_layout import end_stage_layers, virtual_stages
from mofa_framework.tuner import _layout_string


@pytest.fixture(scope="module")
def registry():
    return Predictor().registry


def test_repeats_and_commas_unroll_as_megatron_parses_them():
    # Megatron-Core's own docstring example: "Ettt|(tt|)*29,m|L" -> Ettt, 29 × tt, m, L
    stages = virtual_stages("Ettt|(tt|)*29,m|L", "f")
    assert stages[0] == "Ettt" and stages[1:30] == ["tt"] * 29 and stages[30:] == ["m", "L"]
    assert virtual_stages("Et*4|t*2", "f") == ["Etttt", "tt"]


def test_end_stages_of_megatron_bridge_deepseek_v3_layouts():
    """Derived by hand. 16 virtual stages E t4 | 14 × t4 | t m L: on PP 16 each rank holds one, so
    the first rank 4 layers (with the embedding), the last 1 (with the MTP module and the loss); on
    PP 4 rank r holds stages r, r+4, r+8, r+12: rank 0 = 4·4 = 16, rank 3 = 4+4+4+1 = 13, vpp 4.
    Megatron-Core's GB200 guide, "Et|(tt|)*30L" on PP 8 (32 stages): rank 0 = 1+2+2+2 = 7, rank 7 =
    2+2+2+0 = 6, the middle ranks 8."""
    assert end_stage_layers("Et*4|(t*4|)*14tmL", 16, 61, 1, "f") == (4, 1, 1)
    assert end_stage_layers("Et*4|(t*4|)*14tmL", 4, 61, 1, "f") == (16, 13, 4)
    assert end_stage_layers("Et|(tt|)*30L", 8, 61, 0, "f") == (7, 6, 4)


@pytest.mark.parametrize(("layout", "pp", "mtp", "message"), [
    ("Et*4|(t*4|)*14tmL", 3, 1, "not a multiple of parallel.pp"),
    ("Et*4|(t*4|)*14tL", 16, 1, "the model has 61 and 1"),
    ("Et*5|(t*4|)*14tmL", 16, 1, "places 62 layers"),
    ("Et*4|(t*4|)*13t*3|ttmL", 16, 1, "middle ranks"),
    ("Et*4|(t*4|)*13tm|t*4L", 16, 1, "an MTP module off the last rank"),
    ("t*4|(t*4|)*14tmEL", 16, 1, "the embedding off the first rank"),
    ("Et*4|(t*4|)*14tmX", 16, 1, "unknown character 'X'"),
])
def test_layouts_mofa_cannot_place_are_refused_with_the_reason(layout, pp, mtp, message):
    with pytest.raises(ConfigError) as exc:
        end_stage_layers(layout, pp, 61, mtp, "job: parallel.pipeline_layout")
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"job: parallel.pipeline_layout = {layout!r}") and message in text


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(3, 16), v=st.integers(1, 4), chunks=st.integers(1, 8), mtp=st.integers(0, 2))
def test_the_tuners_layout_strings_read_back_to_their_stage_sizes(registry, pp, v, chunks, mtp):
    """`mofa tune --format megatron` writes a layout for uneven interleaved stages; reading it back
    gives the same first / last stage sizes and vpp (a round trip through Megatron's syntax)."""
    import attrs

    model = attrs.evolve(registry.model("llama3.1-405b"), num_mtp_layers=mtp)
    mid = v * chunks  # middle stages of whole chunks; the end stages share the rest
    rest = model.num_layers - mid * (pp - 2)
    first, last = rest - rest // 2, rest // 2
    if min(first, last) < v:
        return
    text = _layout_string(model, pp, v, first, mid, last)
    assert end_stage_layers(text, pp, model.num_layers, mtp, "f") == (first, last, v)


def _job(**parallel):
    base = {"tp": 1, "pp": 16, "ep": 8, "global_batch_size": 4096, "sequence_length": 4096}
    return {"model": {"name": "deepseek-v3"}, "hardware": {"name": "b200-sxm-180gb", "num_gpus": 256},
            "parallel": {**base, **parallel}}


def test_a_job_files_layout_becomes_its_stage_sizes_and_vpp(registry):
    job = job_from_dict(_job(pipeline_layout="Et*4|(t*4|)*14tmL"), registry)
    p = job.parallel
    assert (p.first_stage_layers, p.last_stage_layers, p.vpp, p.pipeline_layout) == (4, 1, 1, "")
    job = job_from_dict(_job(pp=4, pipeline_layout="Et*4|(t*4|)*14tmL"), registry)
    assert (job.parallel.first_stage_layers, job.parallel.last_stage_layers, job.parallel.vpp) == (16, 13, 4)
    assert job.schedule == "interleaved-1f1b"  # vpp from the layout chooses the interleaved default
    with pytest.raises(ConfigError, match=r"implies last_stage_layers = 1, but parallel.last_stage_layers = 3"):
        job_from_dict(_job(pipeline_layout="Et*4|(t*4|)*14tmL", last_stage_layers=3), registry)
    with pytest.raises(ConfigError, match=r"implies vpp = 1, but parallel.vpp = 2"):
        job_from_dict(_job(pipeline_layout="Et*4|(t*4|)*14tmL", vpp=2), registry)


def test_the_lighter_last_stage_is_what_the_prediction_prices(registry):
    """DeepSeek-V3 on 16 stages: the default split puts 3 layers, the MTP module and both output
    heads on the last stage; Megatron-Bridge's layout leaves it one layer, so the step is shorter."""
    p = Predictor()
    default = p.predict(p.job(_job()))[0]
    laid = p.predict(p.job(_job(pipeline_layout="Et*4|(t*4|)*14tmL")))[0]
    assert laid.parallel["first_stage_layers"] == 4 and laid.parallel["last_stage_layers"] == 1
    assert laid.step_time_s < default.step_time_s


def test_the_megatron_import_reads_the_layout(registry):
    words = ["--pipeline-model-parallel-size", "4", "--expert-model-parallel-size", "8", "--seq-length", "4096",
             "--global-batch-size", "64", "--bf16", "--pipeline-model-parallel-layout", "Et*4|(t*4|)*14tmL"]
    r = from_args(words, registry, hardware="b200-sxm-180gb", num_gpus=64, model="deepseek-v3")
    assert r.job["parallel"]["pipeline_layout"] == "Et*4|(t*4|)*14tmL"
    job = job_from_dict(r.job, registry)
    assert (job.parallel.first_stage_layers, job.parallel.last_stage_layers, job.parallel.vpp) == (16, 13, 4)


def test_the_cli_takes_the_layout_as_a_flag_and_refuses_a_runaway_repeat():
    """`mofa predict --pipeline-layout`: the same end stages as the job file (4 / 1 on PP 16 for the
    16-stage Bridge layout); a repeat count that would unroll past MAX_UNROLLED is one line, exit 2."""
    import json

    from click.testing import CliRunner

    from mofa_framework.cli import cli

    args = ["predict", "--model", "deepseek-v3", "--hardware", "b200-sxm-180gb", "--gpus", "256", "--pp", "16",
            "--ep", "8", "--gbs", "4096", "--seq", "4096", "--format", "json"]
    r = CliRunner().invoke(cli, [*args, "--pipeline-layout", "Et*4|(t*4|)*14tmL"])
    assert r.exit_code == 0, r.output
    par = json.loads(r.output)["parallel"]
    assert (par["first_stage_layers"], par["last_stage_layers"], par["vpp"]) == (4, 1, 1)
    bad = CliRunner().invoke(cli, [*args, "--pipeline-layout", "(t|)*99999999999"])
    lines = [ln for ln in bad.output.splitlines() if ln.strip()]
    assert bad.exit_code == 2 and len(lines) == 1 and "repeat count is too large" in lines[0], bad.output


def test_the_cli_takes_the_end_stage_sizes_as_flags():
    """`mofa predict --first-stage-layers / --last-stage-layers` price what the layout flag (and the
    job file's [parallel] keys) price: Llama 3.1 405B on PP 16 with 7-layer end stages (8 per middle
    stage) is the layout 'Et*7|(t*8|)*14t*7L', and 21-layer ends are slower than the even split; an
    out-of-range size is one line naming the field, exit 2."""
    import json

    from click.testing import CliRunner

    from mofa_framework.cli import cli

    args = ["predict", "--model", "llama3.1-405b", "--hardware", "h100-sxm5-80gb", "--gpus", "16384", "--tp", "8",
            "--pp", "16", "--gbs", "2048", "--seq", "8192", "--format", "json"]
    flags = CliRunner().invoke(cli, [*args, "--first-stage-layers", "7", "--last-stage-layers", "7"])
    layout = CliRunner().invoke(cli, [*args, "--pipeline-layout", "Et*7|(t*8|)*14t*7L"])
    assert flags.exit_code == 0 and layout.exit_code == 0, flags.output + layout.output
    a, b = json.loads(flags.output), json.loads(layout.output)
    assert (a["parallel"]["first_stage_layers"], a["parallel"]["last_stage_layers"]) == (7, 7)
    assert a["step_time_s"] == b["step_time_s"] and a["peak_memory_gib"] == b["peak_memory_gib"]
    even = json.loads(CliRunner().invoke(cli, args).output)
    heavy = json.loads(CliRunner().invoke(cli, [*args, "--first-stage-layers", "21", "--last-stage-layers", "21"]).output)
    assert heavy["step_time_s"] > even["step_time_s"]  # 21-layer end stages against the middle's 6
    bad = CliRunner().invoke(cli, [*args, "--first-stage-layers", "-1"])
    lines = [ln for ln in bad.output.splitlines() if ln.strip()]
    assert bad.exit_code == 2 and len(lines) == 1 and "parallel.first_stage_layers" in lines[0], bad.output
