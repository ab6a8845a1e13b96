"""MoFa: predict, explain and tune the performance of LLM pretraining jobs.

Python API::

    import mofa_framework as mofa
    job = mofa.load_job("examples/llama3-405b-h100.toml")
    result = mofa.predict(job)            # a PredictionResult
    print(result.step_time_s, result.mfu, result.breakdown)

    timeline = mofa.Predictor().trace(job)   # Chrome trace-event JSON (mofa_framework.trace)
    best = mofa.tune(job, values={"tp": (4, 8)}).best[0]  # as `mofa tune` searches (a TuneResult)
    predictor = mofa.Predictor(disabled=["tp_overlap"])   # assemble from chosen plugins
    print(predictor.predict(predictor.load_job("examples/gpt3-175b-a100.toml"))[0].step_time_s)
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .hookspecs import hookimpl

try:
    __version__ = version("mofa")
except PackageNotFoundError:  # pragma: no cover - running from an uninstalled checkout
    __version__ = "0.0.0+unknown"

from .api import PredictionResult, Predictor, load_job, predict, tune  # noqa: E402

__all__ = ["hookimpl", "__version__", "Predictor", "PredictionResult", "predict", "load_job", "tune"]
