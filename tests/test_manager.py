"""The plugin manager: discovery, failures, conflicts, disabling, strict mode, tracing."""

import pytest

from mofa_framework.errors import PluginConflictError, PluginError, PluginLoadError
from mofa_framework.manager import MofaPluginManager

GPU_MODULE = '''
from mofa_framework import hookimpl
from mofa_framework.types import (ComputeSpec, HardwareProfile, InterconnectSpec, MemorySpec)

def make(name):
    return HardwareProfile(
        name=name, gpus_per_node=8, compute=ComputeSpec(peak_tflops={"bf16": 500.0}),
        memory=MemorySpec(hbm_gib=96.0, hbm_bandwidth_gbps=4000.0),
        interconnect=InterconnectSpec(scaleup_domain_gpus=8, scaleup_bandwidth_gbps=400.0,
                                      scaleout_bandwidth_gbps=50.0))

@hookimpl
def mofa_register_hardware_profiles():
    return [make("{gpu}")]
'''


def fresh(**kw) -> MofaPluginManager:
    pm = MofaPluginManager(strict=kw.pop("strict", False), **kw)
    pm.load_entrypoints()
    return pm


def test_builtins_are_entry_points(mofa_pm):
    infos = mofa_pm.infos
    for name in ("roofline", "collectives", "hardware_zoo", "model_zoo", "schedule_1f1b", "schedule_interleaved"):
        assert infos[name].status == "builtin", name
        assert infos[name].distribution == "mofa"


def test_third_party_gpu_is_discovered(mofa_fake_distribution):
    mofa_fake_distribution("acme-gpu", "1.2.0", {"acme_gpu": "acme_gpu"},
                           {"acme_gpu": GPU_MODULE.replace("{gpu}", "acme-x1")})
    pm = fresh()
    assert pm.infos["acme_gpu"].status == "active"
    assert pm.infos["acme_gpu"].distribution == "acme-gpu"
    assert pm.registry.hardware_profile("acme-x1").compute.peak_tflops["bf16"] == 500.0
    assert pm.registry.provided_by[("hardware", "acme-x1")] == "acme_gpu"


def test_import_failure_is_recorded_not_raised(mofa_fake_distribution):
    mofa_fake_distribution("broken", "0.1", {"broken_plugin": "broken_plugin"},
                           {"broken_plugin": "import does_not_exist_anywhere\n"})
    pm = fresh()
    info = pm.infos["broken_plugin"]
    assert info.status == "failed"
    assert "does_not_exist_anywhere" in info.error
    assert len(pm.registry.models) > 10  # everything else still works


def test_import_failure_is_fatal_in_strict_mode(mofa_fake_distribution):
    mofa_fake_distribution("broken", "0.1", {"broken_plugin": "broken_plugin"},
                           {"broken_plugin": "raise RuntimeError('boom')\n"})
    with pytest.raises(PluginLoadError, match="boom"):
        fresh(strict=True)


def test_raising_hook_marks_plugin_failed(mofa_fake_distribution):
    mofa_fake_distribution("raiser", "0.1", {"raiser": "raiser"}, {"raiser": '''
from mofa_framework import hookimpl
@hookimpl
def mofa_register_models():
    raise ValueError("cannot read my models")
'''})
    pm = fresh()
    reg = pm.registry
    assert pm.infos["raiser"].status == "failed"
    assert "cannot read my models" in pm.infos["raiser"].error
    assert "llama3-70b" in reg.models


def test_duplicate_gpu_name_is_a_conflict_naming_both(mofa_fake_distribution):
    mofa_fake_distribution("gpu-a", "1.0", {"gpu_a": "gpu_a"}, {"gpu_a": GPU_MODULE.replace("{gpu}", "twin")})
    mofa_fake_distribution("gpu-b", "2.0", {"gpu_b": "gpu_b"}, {"gpu_b": GPU_MODULE.replace("{gpu}", "twin")})
    pm = fresh()
    reg = pm.registry
    assert "twin" in reg.hardware
    problems = " ".join(reg.problems)
    assert "gpu-a" in problems and "gpu-b" in problems
    failed = [i for i in pm.infos.values() if i.status == "failed"]
    assert [i.name for i in failed] in (["gpu_a"], ["gpu_b"])
    with pytest.raises(PluginConflictError, match="twin"):
        fresh(strict=True).registry


def test_duplicate_entry_point_name_across_distributions(mofa_fake_distribution):
    mofa_fake_distribution("one", "1.0", {"samename": "one_mod"}, {"one_mod": GPU_MODULE.replace("{gpu}", "g1")})
    mofa_fake_distribution("two", "1.0", {"samename": "two_mod"}, {"two_mod": GPU_MODULE.replace("{gpu}", "g2")})
    pm = fresh()
    clash = [i for i in pm.infos.values() if i.status == "failed" and "samename" in i.error]
    assert clash and "one" in clash[0].error and "two" in clash[0].error


def test_disabled_plugin_is_not_loaded(monkeypatch):
    monkeypatch.setenv("MOFA_DISABLED_PLUGINS", "schedule_interleaved")
    pm = fresh()
    assert pm.infos["schedule_interleaved"].status == "disabled"
    assert "interleaved-1f1b" not in pm.registry.schedules
    pm2 = fresh(disabled=["model_zoo"])
    assert not pm2.registry.models


def test_tracing_writes_hook_calls(capsys):
    pm = fresh(trace=True)
    pm.registry  # noqa: B018 - triggers registry hooks
    pm.hook.mofa_register_pipeline_schedules()
    assert "mofa_register_pipeline_schedules" in capsys.readouterr().err


def test_wrong_record_type_is_reported(mofa_pm):
    class Bad:
        from mofa_framework import hookimpl

        @hookimpl
        def mofa_register_models(self):
            return ["not a model"]

    mofa_pm.register_plugin(Bad(), "bad_records")
    assert any("bad_records" in p for p in mofa_pm.registry.problems)
    strict = MofaPluginManager(strict=True)
    strict.load_entrypoints(builtin_only=True)
    strict.register_plugin(Bad(), "bad_records")
    with pytest.raises(PluginError, match="expected ModelSpec"):
        strict.registry
