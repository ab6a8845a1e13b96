"""The Python API: predict() on paths, dicts and jobs; a Predictor assembled from chosen plugins."""

from pathlib import Path

import pytest

import mofa_framework as mofa
from mofa_framework import hookimpl
from mofa_framework.types import ComputeSpec, HardwareProfile, InterconnectSpec, MemorySpec

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gpt3-175b-a100.toml"
JOB = {"model": {"name": "llama3-8b"}, "hardware": {"name": "h100-sxm5-80gb", "num_gpus": 8},
       "parallel": {"tp": 2, "global_batch_size": 16, "sequence_length": 4096}}


def test_predict_accepts_path_dict_and_job(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    from_path = mofa.predict(EXAMPLE)
    assert isinstance(from_path, mofa.PredictionResult) and from_path.model == "gpt3-175b"
    from_dict = mofa.predict(JOB)
    job = mofa.load_job(EXAMPLE)
    assert mofa.predict(job).step_time_s == from_path.step_time_s
    both = mofa.predict([JOB, job])
    assert [r.model for r in both] == ["llama3-8b", "gpt3-175b"]
    assert both[0].step_time_s == from_dict.step_time_s


class ToyGpu:
    @hookimpl
    def mofa_register_hardware_profiles(self):
        return [HardwareProfile(name="toy-x", gpus_per_node=8, compute=ComputeSpec(peak_tflops={"bf16": 2000.0}),
                                memory=MemorySpec(hbm_gib=192.0, hbm_bandwidth_gbps=8000.0),
                                interconnect=InterconnectSpec(scaleup_domain_gpus=8, scaleup_bandwidth_gbps=900.0,
                                                              scaleout_bandwidth_gbps=100.0))]


def test_predictor_assembled_from_chosen_plugins(monkeypatch):
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    pred = mofa.Predictor(plugins={"toy_gpu": ToyGpu()}, disabled=["tp_overlap"])
    assert "toy-x" in pred.registry.hardware and "tp_overlap" not in pred.registry.features
    fast = pred.predict(pred.job({**JOB, "hardware": {"name": "toy-x", "num_gpus": 8}}))[0]
    slow = pred.predict(pred.job(JOB))[0]
    assert fast.step_time_s < slow.step_time_s
    # the default predictor is untouched by the assembled one
    assert "toy-x" not in mofa.Predictor().registry.hardware


def test_a_job_with_a_feature_the_predictor_lacks_is_refused_not_priced_without_it(monkeypatch):
    """A job built by one predictor and handed to one assembled without a feature it enables is
    one ConfigError naming the feature (as loading it there would be), never silently priced
    without that feature."""
    monkeypatch.delenv("MOFA_DISABLED_PLUGINS", raising=False)
    job = mofa.Predictor().job({**JOB, "features": {"tp_overlap": {}}})
    pred = mofa.Predictor(disabled=["tp_overlap"])
    for run in (pred.predict, pred.trace):
        with pytest.raises(mofa.errors.ConfigError, match="features.tp_overlap: this predictor has no 'tp_overlap'"):
            run(job)
    with pytest.raises(mofa.errors.ConfigError, match="unknown feature 'tp_overlap'"):
        pred.tune(job)
    assert pred.predict(pred.job(JOB))[0].step_time_s > 0  # the same predictor on a job without it


def test_result_to_dict_round_trips_the_headline_numbers():
    r = mofa.predict(JOB)
    d = r.to_dict()
    assert d["step_time_s"] == r.step_time_s and d["breakdown"] == dict(r.breakdown)
    assert sum(d["breakdown"].values()) == pytest.approx(d["step_time_s"])
