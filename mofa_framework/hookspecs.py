"""Hook specifications: the contract between the MoFa core and every plugin.

Each hook says **when** it is called, **what** it receives, **what** it returns and **how**
the results of several plugins compose. There are four composition modes:

* **registry** — every plugin's results are collected; each yields typed attrs records
  (:mod:`mofa_framework.types`). Two plugins registering the same record name is a
  :class:`~mofa_framework.errors.PluginConflictError` naming both distributions.
* **provider** — ``firstresult``: the first non-``None`` answer wins. The built-in provider
  is ``trylast``, so any installed provider takes precedence; a provider that only
  improves some rows is written as a ``wrapper`` that ``yield``\\s to get the default and
  returns ``np.where(mask, mine, default)``.
* **contribution** — every plugin's array is collected and combined by a stated reducer
  (feasibility masks are AND-ed).
* **lifecycle** — called once for its side effect (e.g. adding CLI commands).

Implement a hook by decorating a module-level function (or method) with
:data:`mofa_framework.hookimpl` and naming it exactly as below; declare the module under the
``mofa`` entry-point group. Hooks take arrays over a whole batch of candidate
configurations and must not loop over rows in Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # pragma: no cover
    import click

    from .batch import CandidateBatch, CollectiveBatch, OperatorBatch
    from .types import (
        ConfigSection,
        ConstraintResult,
        CostTransform,
        FaultRecoveryPolicy,
        FlopsConvention,
        HardwareProfile,
        MeasurementReader,
        MemoryOptimizer,
        ModelSpec,
        OverlapStrategy,
        PipelineSchedule,
    )
    from .units import FloatArray

PROJECT = "mofa"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class MofaSpecs:
    """The namespace pluggy reads the specifications from."""

    # ------------------------------------------------------------------ registries
    @hookspec
    def mofa_register_hardware_profiles(self) -> Iterable[HardwareProfile]:
        """Register accelerator profiles.

        Composition: registry.

        Called once, when the registry is first built (before any job file is read).
        Receives nothing. Returns an iterable of :class:`~mofa_framework.types.HardwareProfile`
        (or of :class:`~mofa_framework.types.LazyRecord` standing for one, read when first looked
        up); each ``name`` (and each alias) must be unique across all plugins. The built-in
        ``hardware_zoo`` plugin registers the TOML files of ``hardware_profiles/``, and
        ``user_profiles`` those in the directories of ``MOFA_HARDWARE_PATH``.
        """

    @hookspec
    def mofa_register_models(self) -> Iterable[ModelSpec]:
        """Register model architectures.

        Composition: registry.

        Called once, when the registry is first built. Receives nothing. Returns an iterable
        of :class:`~mofa_framework.types.ModelSpec` (or of :class:`~mofa_framework.types.LazyRecord`
        standing for one); names and aliases must be unique. The
        built-in ``model_zoo`` plugin registers the TOML files of ``model_zoo/``, and
        ``user_profiles`` those in the directories of ``MOFA_MODEL_PATH``.
        """

    @hookspec
    def mofa_register_pipeline_schedules(self) -> Iterable[PipelineSchedule]:
        """Register pipeline schedules (1F1B, interleaved, ZeroBubble, DualPipe, ...).

        Composition: registry.

        Called once, when the registry is first built. Returns an iterable of
        :class:`~mofa_framework.types.PipelineSchedule`. Each schedule's ``time`` and
        ``inflight`` callables are later called by the engine with a
        :class:`~mofa_framework.engine.PipelineInputs` holding the rows (candidate
        configurations) that chose it, and must return arrays of that length (an ``Inflight``
        field may also be one number for every row). A schedule
        whose GPUs each run two mirrored stages (``mirrored = True``: GPU j also runs stage
        ``p−1−j``, as DualPipe does) has the engine price each GPU rather than each stage:
        the end GPUs' work is the mean of the first and the last stage's, their parameters
        both stages', and ``inflight`` says in ``Inflight.mirror_*`` how many micro-batches
        of the mirrored stage's activations the GPU holds besides its own.

        A schedule's ``feasible(batch, rows)`` — or ``feasible(batch, rows, model, hardware)``
        when it reads them — returns one ``ConstraintResult`` whose mask counts only on
        ``rows`` (the batch's rows using the schedule; the others pass). It may read the rows'
        features: ``mofa predict`` applies it to the job as given, and ``mofa tune`` to each
        structure with every feature off and again to the leaves with their features set, so
        a schedule that runs only in some code base (a fork) can refuse what that code base
        lacks. ``megatron_unsupported`` names the mainline Megatron-LM flags such a code base
        does not take (flag → what it does instead): ``mofa tune`` prints them as notes. A
        callable ``megatron_args`` of three arguments, ``(model, parallel, context)``, also gets
        the configuration's features (a ``MegatronContext``). ``overlaps_p2p = False`` says the
        schedule's implementation cannot overlap a steady micro-batch's p2p with compute (the
        ``pp_overlap`` feature then changes nothing on its rows).
        """

    @hookspec
    def mofa_register_overlap_strategies(self) -> Iterable[OverlapStrategy]:
        """Register features that overlap communication with computation (TP/CP/EP/PP/DP).

        Composition: registry.

        Called once, when the registry is first built. Returns an iterable of
        :class:`~mofa_framework.types.OverlapStrategy`. The engine calls each strategy's
        per-phase transform only for the rows where it is enabled, orders strategies within
        a phase by their ``after``/``before`` names, and keeps other rows bit-identical. An
        overlap must never make a step slower than no overlap with contention coefficients 1.
        """

    @hookspec
    def mofa_register_memory_optimizers(self) -> Iterable[MemoryOptimizer]:
        """Register features that cut or move memory (recompute, offload, optimizers).

        Composition: registry.

        Called once, when the registry is first built. Returns an iterable of
        :class:`~mofa_framework.types.MemoryOptimizer`; applied like overlap strategies.
        A memory optimizer must never raise peak memory.
        """

    @hookspec
    def mofa_register_cost_transforms(self) -> Iterable[CostTransform]:
        """Register any other feature that changes the cost model (FP8, faster kernels).

        Composition: registry.

        Called once, when the registry is first built. Returns an iterable of
        :class:`~mofa_framework.types.CostTransform`; applied like overlap strategies.
        """

    @hookspec
    def mofa_register_fault_recovery_policies(self) -> Iterable[FaultRecoveryPolicy]:
        """Register how a job recovers from failures (process / pod / job restart, ...).

        Composition: registry.

        Called once, when the registry is first built. Returns an iterable of
        :class:`~mofa_framework.types.FaultRecoveryPolicy`; the ``[fault]`` section of a job
        file selects one by ``policy`` and its options are read into its ``options_type``.
        """

    @hookspec
    def mofa_register_config_sections(self) -> Iterable[ConfigSection]:
        """Register a top-level table of the job file owned by the plugin.

        Composition: registry.

        Called once, when the registry is first built. Returns an iterable of
        :class:`~mofa_framework.types.ConfigSection`. Features and fault policies need not use
        this: their ``options_type`` already defines ``[features.<name>]`` and ``[fault]``.
        """

    @hookspec
    def mofa_register_measurement_readers(self) -> Iterable[MeasurementReader]:
        """Register readers of measurement files (``mofa validate`` / ``mofa calibrate``).

        Composition: registry.

        Called once, when the registry is first built. Receives nothing. Returns an iterable
        of :class:`~mofa_framework.types.MeasurementReader`: the columns a file's header must
        have for the reader to read it, and ``map_row(row, ctx)``, called once per data row with
        the row (column → cell text) and a :class:`~mofa_framework.measurements.ReadContext`,
        returning a :class:`~mofa_framework.types.MappedRow` (a job and its measured step time)
        or a :class:`~mofa_framework.types.SkippedRow` (why the row cannot be predicted). A cell
        that is not what its column holds is reported by the context's accessors, which raise
        :class:`~mofa_framework.measurements.CellError`; the row is then listed as malformed.

        A file is read by the reader whose ``columns`` are all in its header; of several, the
        one requiring the most columns wins; two requiring equally many are an error that
        ``--reader NAME`` settles. The core's own *plain* schema
        (:data:`mofa_framework.measurements.PLAIN_READER`) is always available and cannot be
        replaced. The built-in readers cover the shared measurement set's dense, NVIDIA and
        vTrain schemas.
        """

    @hookspec
    def mofa_register_flops_conventions(self) -> Iterable[FlopsConvention]:
        """Register how sources count a training step's FLOPs (``6ND``, Megatron, NeMo, ...).

        Composition: registry.

        Called once, when the registry is first built. Receives nothing. Returns an iterable
        of :class:`~mofa_framework.types.FlopsConvention`, whose ``step_flops(model,
        global_batch_size, sequence_length)`` gives one step's FLOPs as that source counts them.
        Readers call them through ``ctx.step_flops(name, ...)`` to turn a published TFLOPS or
        MFU into a step time; a plain-schema file names one in its ``flops_convention`` column.
        """

    # ------------------------------------------------------------------ providers
    @hookspec(firstresult=True)
    def mofa_operator_latency(self, ops: OperatorBatch, hardware: HardwareProfile) -> FloatArray | None:
        """Seconds each operator takes on one GPU (paper eq. [1]).

        Composition: provider (first non-``None`` result wins; the built-in ``roofline``
        plugin is ``trylast``).

        Called by the engine once per prediction batch with every operator of every layer
        type of every candidate stacked into one :class:`~mofa_framework.batch.OperatorBatch`
        (flat arrays: FLOPs, bytes moved, operator kind, numeric format, GEMM shape). Returns
        a float64 array of the same length, seconds, finite and ≥ 0; ``None`` defers to the
        next provider. Tensor-core work runs at ``hardware.compute_clock_scale`` of the rated-power
        rate (a GPU run below its TDP, ``compute.power_limit_w``); the built-in providers apply it.
        Each row is priced from its own fields alone: the engine prices the operators of rows with
        the same geometry (parallel sizes, micro-batch, sequence, precision, kernel) once and
        repeats the answer.
        """

    @hookspec(firstresult=True)
    def mofa_collective_latency(self, colls: CollectiveBatch, hardware: HardwareProfile) -> FloatArray | None:
        """Seconds each collective takes (paper eqs. [2], [3], [18]).

        Composition: provider (first non-``None`` result wins; the built-in ``collectives``
        plugin is ``trylast``).

        Called by the engine once per prediction batch with every collective stacked into
        one :class:`~mofa_framework.batch.CollectiveBatch` (kind, bytes, group size, nodes
        spanned, whether it stays in the scale-up domain). Returns a float64 array of the
        same length, seconds, finite and ≥ 0; ``None`` defers to the next provider. Each row is
        priced from its own fields alone: the engine asks for a distinct row once and reuses it.
        """

    # ------------------------------------------------------------------ contributions
    @hookspec
    def mofa_candidate_constraints(self, batch: CandidateBatch, model: ModelSpec, hardware: HardwareProfile) -> Iterable[ConstraintResult]:
        """Rules that make candidate configurations infeasible (paper §4.1 pruning).

        Composition: contribution (all masks are AND-ed; each reason is reported for the
        rows it removes).

        Called before costing every batch — one prediction or a chunk of a tuning search.
        Receives the batch and the model and hardware it is evaluated for. Returns an
        iterable of :class:`~mofa_framework.types.ConstraintResult`, each holding a boolean
        array of the batch's length (``True`` = feasible) and a one-line reason naming the
        field and the fix, the same for every row (a search counts the rows it removes under
        it); an optional ``detail(i)`` gives failing row i's own numbers, which a single job's
        error appends (``ConstraintResult.reason_for``) and a search never computes. Memory
        feasibility is added by the engine itself.

        A search checks a structure's rules once with every feature off, then each feature
        setting's again (an offload's host memory, a recipe's hardware). A plugin whose rules read
        only the batch's sizes, shape and precision, never ``batch.features``, says so with a
        module-level ``MOFA_CONSTRAINTS_READ_FEATURES = False`` (an attribute of the plugin
        object); its rules are then not run again per feature setting.
        :func:`mofa_framework.testing.contract.assert_constraints_ignore_features` checks the claim.
        """

    # ------------------------------------------------------------------ lifecycle
    @hookspec
    def mofa_register_commands(self, cli: click.Group) -> None:
        """Add sub-commands to the ``mofa`` command line.

        Composition: lifecycle.

        Called once when the CLI is assembled, after plugins are loaded. Receives the
        top-level :class:`click.Group`; add commands with ``cli.add_command``. The core's
        own groups (``import``, …) are loaded when first used: to add a sub-command to one,
        call ``mofa_framework.cli.add_subcommand(cli, group, command)``, which wraps the group's loader
        (``plugins/import_torchtitan.py`` and ``plugins/import_llm_foundry.py`` add
        ``mofa import torchtitan`` and ``mofa import llm-foundry`` so). Returns nothing.
        """
