"""Published training measurements shipped with MoFa (package data, installed as ``mofa_measurements``).

Every file here is a byte-for-byte copy of the shared measurement set (its ``README.md`` names the
source of every file and ``NOTES-dense-schema.md`` explains the columns); ``microbench/`` holds the
kernel and network microbenchmarks. ``mofa_framework.measurements.builtin_data_dir()`` locates this
folder; a test checks the copies still equal ``../shared/data`` of a checkout.

The named sets below are what ``mofa validate --builtin`` / ``mofa calibrate --builtin`` read.
"""

#: each measurement once, the files the shipped hardware profiles were fitted to and the overall
#: step-time gate reads (``mofa validate --builtin``)
CALIBRATION = ("megatron_selene_a100.csv", "zero_bubble.csv", "vtrain_single_node_a100.csv",
               "nvidia_megatron_bridge.csv", "nemo_2407.csv", "nemo_long_context.csv", "megatron_core_moe.csv",
               "torchtitan.csv")
#: sources added after the fits (predicted, not fitted to): ``--builtin-set newer``
NEWER = ("llm_foundry.csv", "torchtitan_benchmarks.csv")
#: NVIDIA-schema rows repeated with architecture columns (``--builtin-set duplicates``)
DUPLICATES = ("nvidia_megatron_bridge_dense.csv", "nemo_2407_dense.csv", "torchtitan_dense.csv")

SETS = {"calibration": CALIBRATION, "newer": NEWER, "duplicates": DUPLICATES,
        "all": CALIBRATION + NEWER + DUPLICATES}
