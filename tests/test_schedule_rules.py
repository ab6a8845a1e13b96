"""A pipeline schedule's own feasibility rule: it may read the model, the hardware profile and the
rows' features, and the search keeps to it on the leaves; a fork's schedule names the mainline
Megatron-LM flags its code base lacks."""

import attrs
import numpy as np
import pytest

from mofa_framework import Predictor, hookimpl
from mofa_framework.errors import ConfigError
from mofa_framework.tuner import SearchSpace, TuneRequest, feature_choices, megatron_arguments, tune
from mofa_framework.types import ConstraintResult


class _ForkSchedule:
    """A test-local plugin: 1F1B as a fork runs it — without DP overlap (its rule reads the rows'
    features and the model), and with a mainline flag it lacks (`megatron_unsupported`)."""

    @hookimpl
    def mofa_register_pipeline_schedules(self):
        from mofa_plugins import schedule_1f1b

        def feasible(batch, rows, model, hardware):
            on = np.asarray(batch.feature("dp_overlap").enabled, bool)
            return ConstraintResult(name="fork", feasible=~(rows & on) & (model.num_layers > 0),
                                    reason=f"the fork on {hardware.name} has no dp_overlap: turn it off")

        return [attrs.evolve(schedule_1f1b.SCHEDULE, name="fork-1f1b", aliases=(), from_megatron=None,
                             feasible=feasible, megatron_unsupported={"--overlap-p2p-communication": "its default"})]


def test_a_schedules_rule_reads_the_features_and_the_search_keeps_to_it():
    """A schedule's ``feasible(batch, rows, model, hardware)`` may read the rows' features: the search
    checks it on the structures with the features off and again on the leaves with them set, so
    it never returns a configuration `mofa predict` refuses; the removed-by table counts the rule,
    and the Megatron line gives a flag the schedule's code base lacks as a note."""
    pred = Predictor(plugins={"fork_schedule": _ForkSchedule()})
    reg = pred.registry
    model, hw = reg.model("llama3-8b"), reg.hardware_profile("h100-sxm5-80gb")
    space = SearchSpace(tp=(1, 2), pp=(2,), vpp=(1,), cp=(1,), ep=(1,), etp=(1,), micro_batch_size=(1,),
                        schedules=("1f1b", "fork-1f1b"),
                        features={f: feature_choices(reg, f) for f in ("dp_overlap", "pp_overlap")})
    result = tune(pred, TuneRequest(model=model, hardware=hw, num_gpus=16, global_batch_size=64,
                                    sequence_length=4096, space=space, top_k=50))
    forks = [c for c in result.best if "fork-1f1b" in (c.schedule, *c.variant_schedules)]
    assert forks and result.removed_by["the fork on h100-sxm5-80gb has no dp_overlap: turn it off"] > 0
    for c in result.best:
        if c.schedule == "fork-1f1b":
            assert "dp_overlap" not in c.features
            args, notes = megatron_arguments(model, c, reg)
            assert "--overlap-p2p-communication" not in " ".join(args)
            assert "--overlap-p2p-communication: its default" in notes
    job = pred.job({"model": {"name": "llama3-8b"}, "hardware": {"name": hw.name, "num_gpus": 16},
                    "parallel": {"tp": 2, "pp": 2, "global_batch_size": 64, "sequence_length": 4096},
                    "pipeline": {"schedule": "fork-1f1b"}, "features": {"dp_overlap": {}}})
    with pytest.raises(ConfigError, match="has no dp_overlap"):
        pred.predict(job)


def test_megatron_unsupported_is_a_mapping_of_flags_to_text():
    """A schedule's ``megatron_unsupported`` holds flag → explanation strings; anything else is
    refused when the plugin builds its record."""
    from mofa_plugins import schedule_1f1b

    ok = attrs.evolve(schedule_1f1b.SCHEDULE, megatron_unsupported={"--x": "y"})
    assert ok.megatron_unsupported == {"--x": "y"}
    with pytest.raises(TypeError):
        attrs.evolve(schedule_1f1b.SCHEDULE, megatron_unsupported={"--x": 3})


def test_pytorchs_zb_v_prices_as_zb_v_without_the_forks_rules():
    """`zbv-zero-bubble` is ZB-V's record (time, activations, order, route) with PyTorch's own rule:
    two stages per rank, no fork limits, no fork padding of the end stages, not searched by default."""
    from mofa_plugins import schedule_zero_bubble as zb

    t = zb.ZBV_TORCH
    assert (t.time, t.inflight, t.order) == (zb.ZB_V.time, zb.ZB_V.inflight, zb.ZB_V.order)
    assert t.end_stages is None and t.megatron_unsupported == {} and not t.searched and zb.ZB_V.searched
