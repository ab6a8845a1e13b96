"""Hardware profiles and zoo models are indexed by name and aliases at start-up and read when
first looked up (start-up no longer parses every profile's microbenchmark tables)."""

import pytest

from mofa_framework.errors import PluginError
from mofa_framework.registry import LazyTable, Registry
from mofa_framework.types import HardwareProfile, LazyRecord, ModelSpec
from mofa_plugins import _data


def test_names_of_reads_the_top_level_name_and_aliases():
    text = 'name = "x1"\ndisplay_name = "X"\naliases = ["X 1", "x-one"]\ngemm_profile = [\n  { m = 1 },\n]\n[memory]\nname = "no"\n'
    assert _data.names_of(text) == ("x1", ("X 1", "x-one"))


@pytest.mark.parametrize("text", ['name = """x\n1"""\n', 'display_name = "X"\n', 'name = 3\n', 'aliases = [\n "a"]\nname = "x"\n'])
def test_names_of_gives_up_where_a_line_does_not_say(text):
    """A multi-line value, no name, a name that is not a string: the file is read whole instead."""
    assert _data.names_of(text) == (None, ())


@pytest.mark.parametrize("package", ["mofa_hardware_profiles", "mofa_model_zoo"])
def test_every_shipped_file_is_indexed_by_the_names_it_holds(package):
    files = _data._index(package)
    assert files and all(name is not None for _, name, _ in files)  # every shipped file indexed cheaply
    for file, name, aliases in files:
        rec = _data._read(package, file, HardwareProfile if "hardware" in package else ModelSpec)
        assert (rec.name, tuple(rec.aliases)) == (name, aliases)


def test_a_lazy_record_is_read_once_and_only_when_looked_up(mofa_predictor):
    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    calls = []

    def load():
        calls.append(1)
        return hw

    table = LazyTable({hw.name: LazyRecord(name=hw.name, aliases=hw.aliases, load=load)}, HardwareProfile)
    assert list(table) == [hw.name] and len(table) == 1 and not calls  # names without reading
    assert table[hw.name] is hw and table[hw.name] is hw and calls == [1]


def test_a_lazy_record_that_reads_as_another_is_a_plugin_error(mofa_predictor):
    hw = mofa_predictor.registry.hardware_profile("h100-sxm5-80gb")
    table = LazyTable({"other": LazyRecord(name="other", load=lambda: hw)}, HardwareProfile)
    with pytest.raises(PluginError, match="registered as 'other'"):
        table["other"]


def test_start_up_reads_no_profile_and_lookups_and_suggestions_still_work(mofa_pm):
    reg = Registry.collect(mofa_pm)
    assert isinstance(reg.hardware, LazyTable) and isinstance(reg.models, LazyTable)
    assert reg.hardware_profile("H100 SXM5").name == "h100-sxm5-80gb"  # an alias
    assert "h100-sxm5-80gb" in reg.closest("hardware", "h100-sxm5-80g")
    assert len(dict(reg.hardware.items())) == len(reg.hardware)  # listing reads them all
