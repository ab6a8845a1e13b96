"""Names as sources write them (issue 18 §4): one normalisation rule for every kind of record, and
an unknown name answered with the closest registered ones."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mofa_framework.errors import UnknownRecordError
from mofa_framework.registry import normalize_name

#: the spellings issue 18 quotes from benchmark tables
ISSUE_SPELLINGS = ["Llama3.1 405b", "Nemotron 340b", "Nemotron4 15b", "LLAMA4 Maverick 400b", "Llama 3.1 70B"]


@pytest.mark.parametrize("a, b", [
    ("Llama3.1 405b", "llama-3.1-405B"),
    ("LLAMA3.1_405B", "Llama 3.1 405B"),
    ("meta-llama/Llama-3.1-70B", "llama3.1 70b"),
    ("Mixtral-8x7B", "mixtral 8x7b"),
    ("H100 SXM5", "h100-sxm5"),
    ("interleaved-1f1b", "Interleaved_1F1B"),
    ("distributed_optimizer", "distributed-optimizer"),
])
def test_spellings_that_name_the_same_record(a, b):
    assert normalize_name(a) == normalize_name(b)


@pytest.mark.parametrize("a, b", [
    ("llama3.1-8b", "llama31-8b"),       # a dot inside a number is kept: 3.1 is not 31
    ("gpt3-5b", "gpt-35b"),
    ("DeepSeek-V3 (w/o MTP)", "DeepSeek-V3 (w/ MTP)"),  # a "/" inside a name is not an organisation prefix
    ("qwen3-30b-a3b", "qwen3-30b"),
])
def test_spellings_that_stay_different(a, b):
    assert normalize_name(a) != normalize_name(b)


@pytest.mark.parametrize("spelling, expected", [
    ("Llama3.1 405b", "llama3.1-405b"),
    ("Nemotron 340b", "nemotron-4-340b"),
    ("Llama 3.1 70B", "llama3.1-70b"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama3.1-8b"),  # organisation prefix and -Instruct dropped
    ("mixtral_8x22b base", "mixtral-8x22b"),
])
def test_issue_spellings_resolve_in_the_current_zoo(mofa_predictor, spelling, expected):
    assert mofa_predictor.registry.model(spelling).name == expected


@pytest.mark.parametrize("spelling, family", [("Nemotron4 15b", "nemotron"), ("LLAMA4 Maverick 400b", "llama")])
def test_issue_spellings_missing_from_the_zoo_get_suggestions(mofa_predictor, spelling, family):
    """Resolved once the zoo has the model (helper `stack` adds it); until then one line naming
    the closest models of the same family."""
    reg = mofa_predictor.registry
    try:
        got = reg.model(spelling)
    except UnknownRecordError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith("model.name: unknown model") and "closest: " in msg
        closest = msg.split("closest: ")[1].split(";")[0].split(", ")
        assert closest and all(family in name for name in closest), closest
        assert closest == reg.closest("models", spelling)
    else:
        assert normalize_name(spelling).split("-")[:2] == normalize_name(got.name).split("-")[:2] or \
            normalize_name(spelling) in {normalize_name(a) for a in got.aliases}


def test_unknown_name_with_nothing_close_lists_the_installed_ones(mofa_predictor):
    with pytest.raises(UnknownRecordError, match=r"run `mofa list-hardware` to see the installed ones \(a100"):
        mofa_predictor.registry.hardware_profile("zzzz")


def test_a_variant_suffix_is_dropped_only_as_a_fallback(mofa_predictor):
    # "Kimi-K2-Base" is itself an alias of kimi-k2; "-Instruct" is dropped because nothing else matches
    reg = mofa_predictor.registry
    assert reg.model("Kimi-K2-Base").name == reg.model("Kimi K2 Instruct").name == "kimi-k2"


def _respell(name: str, draw) -> str:
    out = []
    for ch in name:
        if ch in "-_ ":
            out.append(draw(st.sampled_from(["-", "_", " ", "  "])))
        elif ch.isalpha():
            out.append(ch.upper() if draw(st.booleans()) else ch.lower())
        else:
            out.append(ch)
    return "".join(out)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_registered_name_survives_case_and_separator_changes(mofa_predictor, data):
    reg = mofa_predictor.registry
    kind, table, get = data.draw(st.sampled_from([
        ("models", reg.models, reg.model), ("hardware", reg.hardware, reg.hardware_profile),
        ("schedules", reg.schedules, reg.schedule), ("features", reg.features, reg.feature)]))
    name = data.draw(st.sampled_from(sorted(table)))
    rec = table[name]
    spelling = data.draw(st.sampled_from([name, *getattr(rec, "aliases", ())]))
    assert get(_respell(spelling, data.draw)).name == name, (kind, spelling)
