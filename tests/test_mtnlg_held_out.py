"""MT-NLG 530B on 2,240-3,360 Selene A100s (Smith et al. 2022, arXiv 2201.11990, section 2.4):
Megatron-DeepSpeed, TP 8 x PP 35, global batch 1,920 of 2,048 tokens, 60.1 / 50.2 / 44.4 s per
iteration on 280 / 350 / 420 DGX A100 nodes (126 / 121 / 113 TFLOPS per GPU, counting the
recomputed forward). Not in ../shared/data and never fitted to: a held-out check of the 2021
large-scale Megatron-DeepSpeed regime (PP 35, 160-240 micro-batches per pipeline).

Mapped as the dense reader maps Megatron-DeepSpeed: unfused attention, DeepSpeed's pipeline engine
(plain 1F1B, no interleaving), ZeRO stage 1 ("ZeRO data parallelism"), full recompute; micro-batch 1
and bf16 are not stated in the paper (assumed). MoFa predicts these 20-24 % too fast (issue 17's
"2021-era runs at 2,000-3,400 A100s"): the per-micro-batch time of the same model and layout under
Megatron-LM 2022 (Korthikanti's 2,240-GPU full-recompute row, in the calibration set) is predicted
within 5 %, so the gap is the 2021 Megatron-DeepSpeed stack's, not the layout's; this test pins it
so that a change that moves it is seen.
"""

import numpy as np

PUBLISHED = ((2240, 60.1), (2800, 50.2), (3360, 44.4))  # (GPUs, seconds per iteration)


def _job(pred, gpus):
    return pred.job({
        "model": {"name": "mt-nlg-530b"}, "hardware": {"name": "a100-sxm4-80gb", "num_gpus": gpus},
        "parallel": {"tp": 8, "pp": 35, "micro_batch_size": 1, "global_batch_size": 1920, "sequence_length": 2048,
                     "precision": "bf16", "flash_attention": False, "sequence_parallel": False},
        "features": {"recompute": {"granularity": "full"}, "deepspeed_zero": {"stage": 1}}})


def test_mt_nlg_530b_megatron_deepspeed_held_out(mofa_predictor):
    got = np.array([mofa_predictor.predict(_job(mofa_predictor, n))[0].step_time_s for n, _ in PUBLISHED])
    measured = np.array([t for _, t in PUBLISHED])
    err = got / measured - 1.0
    # achieved -20.4 / -21.3 / -23.5 %: within the band issue 17 reports for this regime
    assert np.all((err > -0.27) & (err < -0.15)), err
    # more data-parallel replicas, fewer micro-batches each: faster, but less than linearly (bubble)
    assert np.all(np.diff(got) < 0) and got[0] / got[-1] < 3360 / 2240, got
