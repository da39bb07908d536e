"""Planner: predict memory, step time, throughput, MFU, cost and energy before anything runs.

Pure Python (no torch), so ``train`` can print predicted vs measured for its layout::

    from tensorpilot.plan import Layout, TrainSetup, predict, model_spec_from_gpt_config
    plan = predict(model_spec_from_gpt_config(cfg), catalog.get("h100-sxm"), Layout(dp=8), TrainSetup(...))

Modules: models (presets, HF configs), flops (the shared FLOP formulas), memory, timing,
calibration (every global constant), limits (the bounds on user input), predict, search,
validate, command (CLI).
"""

from tensorpilot.plan.models import ModelSpec, get_model, model_spec_from_gpt_config, model_spec_from_hf_config
from tensorpilot.plan.predict import Layout, Plan, TrainSetup, predict, predict_inference

__all__ = ["Layout", "ModelSpec", "Plan", "TrainSetup", "get_model", "model_spec_from_gpt_config",
           "model_spec_from_hf_config", "predict", "predict_inference"]
