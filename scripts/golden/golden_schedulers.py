"""Golden schedules and sampler trajectories of every scheduler NAME dp-launch offers (euler, heun, lcm,
dpm++-2m, dpm++-2m-sde, unipc), built and set up as docs/schedulers.md says, from diffusers.

Each case builds Class.from_config(M, **defaults, **overrides), with M the scheduler config of
models/tiny-random-{sd3,flux-dev,qwen-image}, then sets the timesteps as that model's pipeline does
(SD3: no sigmas, mu only with dynamic shifting; FLUX.1: linspace(1, 1/n, n) unless use_flow_sigmas,
and mu; Qwen-Image: the linspace always, and mu), through the pipeline module's own retrieve_timesteps,
with the pipeline's sigmas dropped where set_timesteps takes none and mu dropped where set_timesteps
takes none or use_dynamic_shifting is off. Then it runs the sampler on a stand-in model:

    for t in scheduler.timesteps:
        v = 0.3 * x + (float32(t) / 1000) * b
        x = scheduler.step(v, t, x[, generator=[g10, g11]]).prev_sample

x: [2, 4, 4, 4] float32, row k drawn by randn([1, 4, 4, 4]) from torch.Generator("cpu").manual_seed(seed_k),
seeds 10 and 11; the stochastic samplers (euler with stochastic_sampling, lcm, dpm++-2m-sde) get
those two generators, continued, in every step call. b: randn([2, 4, 4, 4]) from a generator of seed 99.

Tensors per case NAME: NAME.sigmas, NAME.timesteps (scheduler.sigmas / scheduler.timesteps after
set_timesteps, as float32; DPM's and UniPC's int64 timesteps are exact in float32), NAME.x0, NAME.b,
NAME.trajectory ([calls, 2, 4, 4, 4]: x after every step call). The metadata describes every case
(scheduler, overrides, model, model_config, pipeline, steps, image_seq_len, mu, sigmas, timesteps,
resolved_config (less _use_default_values and _diffusers_version; a non-finite number as the string
"inf", "-inf" or "nan"), order, seeds, stochastic, first_nonfinite_call).

Case names: SAMPLER[+VARIANT]:MODEL:L<image_seq_len>:s<steps>; docs/schedulers.md ("Reference data")
lists what they cover.
"""
import importlib
import inspect
import json
import math
import os

import numpy as np
import torch

from make_golden import save

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODELS = {"sd3": "tiny-random-sd3", "flux": "tiny-random-flux-dev", "qwen": "tiny-random-qwen-image"}
PIPELINE_MODULES = {"sd3": "diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3",
                    "flux": "diffusers.pipelines.flux.pipeline_flux",
                    "qwen": "diffusers.pipelines.qwenimage.pipeline_qwenimage"}
# The default max_shift each pipeline's calculate_shift call falls back to.
MAX_SHIFT_DEFAULT = {"sd3": 1.16, "flux": 1.15, "qwen": 1.15}
FLOW = {"use_flow_sigmas": True, "prediction_type": "flow_prediction"}
NAMES = {
    "euler": ("FlowMatchEulerDiscreteScheduler", {}),
    "heun": ("FlowMatchHeunDiscreteScheduler", {}),
    "lcm": ("FlowMatchLCMScheduler", {}),
    "dpm++-2m": ("DPMSolverMultistepScheduler", FLOW),
    "dpm++-2m-sde": ("DPMSolverMultistepScheduler", {**FLOW, "algorithm_type": "sde-dpmsolver++"}),
    "unipc": ("UniPCMultistepScheduler", FLOW),
}
STEPS = [1, 2, 4, 9, 28]
SEQ_LENS = {"sd3": [1024], "flux": [256, 1024], "qwen": [256, 1024]}
SEEDS = [10, 11]
SIGMAS4 = [1.0, 0.75, 0.5, 0.25]
SIGMAS_LIGHTNING = [1.0, 0.9375, 0.8125, 0.5]  # few steps, front-loaded, as distilled models use
TIMESTEPS4 = [999, 750, 500, 250]
# Qwen-Image's shift_terminal 0.02 stretches a one-step schedule [1.0] by 0/0: NaN sigmas (euler and lcm
# then fail to find the timestep in step(); unipc steps to NaN).
TERMINAL_NAN = ("euler", "lcm", "unipc")
LIGHTNING = {"base_image_seq_len": 256, "base_shift": math.log(3), "invert_sigmas": False, "max_image_seq_len": 8192,
             "max_shift": math.log(3), "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": None,
             "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
             "use_dynamic_shifting": True, "use_exponential_sigmas": False, "use_karras_sigmas": False}


def model_config(model):
    with open(os.path.join(ROOT, "models", MODELS[model], "scheduler", "scheduler_config.json")) as f:
        return json.load(f)


def build(name, m, overrides):
    import diffusers

    class_name, defaults = NAMES[name]
    if class_name.startswith(("DPM", "UniPC")):
        defaults = {**defaults, "flow_shift": m.get("shift", 1.0)}
    return getattr(diffusers, class_name).from_config(m, **{**defaults, **overrides})


def set_timesteps(s, pipeline, steps, seq_len, user_sigmas, user_timesteps):
    """The pipeline's retrieve_timesteps call, with its kwargs filtered as docs/schedulers.md says.
    Returns the mu passed (or None)."""
    module = importlib.import_module(PIPELINE_MODULES[pipeline])
    cfg = s.config
    mu = None
    if pipeline != "sd3" or cfg.get("use_dynamic_shifting"):
        mu = module.calculate_shift(seq_len, cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                                    cfg.get("base_shift", 0.5), cfg.get("max_shift", MAX_SHIFT_DEFAULT[pipeline]))
    sigmas = user_sigmas
    if pipeline != "sd3" and sigmas is None:
        sigmas = np.linspace(1.0, 1 / steps, steps)
    if pipeline == "flux" and cfg.get("use_flow_sigmas"):
        sigmas = None
    if user_timesteps is not None:
        sigmas = user_sigmas
    accepts = inspect.signature(s.set_timesteps).parameters
    kwargs = {}
    if user_timesteps is not None:
        kwargs["timesteps"] = user_timesteps
    if sigmas is not None and "sigmas" in accepts:
        kwargs["sigmas"] = sigmas
    if mu is not None and "mu" in accepts and cfg.get("use_dynamic_shifting"):
        kwargs["mu"] = mu
    if "sigmas" in kwargs:
        # As an array: UniPC's set_timesteps computes on it directly (a list raises TypeError).
        kwargs["sigmas"] = np.asarray(kwargs["sigmas"], dtype=np.float64)
    module.retrieve_timesteps(s, steps, "cpu", **kwargs)
    return kwargs.get("mu")


def start():
    gens = [torch.Generator("cpu").manual_seed(k) for k in SEEDS]
    x0 = torch.cat([torch.randn([1, 4, 4, 4], generator=g) for g in gens])
    b = torch.randn([2, 4, 4, 4], generator=torch.Generator("cpu").manual_seed(99))
    return gens, x0, b


def trajectory(s, stochastic):
    gens, x, b = start()
    x0, out = x, []
    extra = {"generator": gens} if stochastic else {}
    for t in s.timesteps:
        v = 0.3 * x + (t.to(torch.float32) / 1000) * b
        x = s.step(v, t, x, **extra).prev_sample
        out.append(x)
    return x0, b, torch.stack(out)


def jsonable(value):
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "-inf" (DPM's lambda_min_clipped): JSON has no infinities
    return value


def case(name, model, seq_len, steps, overrides=None, sigmas=None, timesteps=None):
    overrides = overrides or {}
    m = model_config(model)
    s = build(name, m, overrides)
    resolved = jsonable({k: v for k, v in s.config.items() if k not in ("_use_default_values", "_diffusers_version")})
    stochastic = (name == "euler" and bool(s.config.stochastic_sampling)) or name in ("lcm", "dpm++-2m-sde")
    mu = set_timesteps(s, model, steps, seq_len, sigmas, timesteps)
    x0, b, traj = trajectory(s, stochastic)
    meta = {"scheduler": name, "overrides": overrides, "model": model, "model_config": m, "pipeline": model,
            "steps": steps, "image_seq_len": seq_len, "mu": mu, "sigmas": sigmas, "timesteps": timesteps,
            "resolved_config": resolved, "order": s.order, "seeds": SEEDS, "stochastic": stochastic,
            "first_nonfinite_call": first_nonfinite(traj)}
    tensors = {"sigmas": s.sigmas.float(), "timesteps": s.timesteps.float(), "x0": x0, "b": b, "trajectory": traj}
    assert torch.isfinite(tensors["sigmas"]).all() and torch.isfinite(tensors["timesteps"]).all()
    return meta, tensors


def first_nonfinite(traj):
    """The index of the first step call whose output has NaN or inf (UniPC's last step with bh1, or without
    lower_order_final, divides by the infinite log-SNR step to sigma 0), or None."""
    bad = [i for i, x in enumerate(traj) if not torch.isfinite(x).all()]
    return bad[0] if bad else None


def plan():
    """(case name, case() arguments) for every case.

    Left out because diffusers itself rejects them:
    - euler, lcm, unipc on qwen at 1 step: see TERMINAL_NAN;
    - dpm++-2m with user timesteps: with use_flow_sigmas, DPMSolverMultistepScheduler.set_timesteps builds its
      flow sigmas from num_inference_steps, which is None when timesteps are given (TypeError);
    - heun, dpm++-2m(-sde) with user sigmas: their set_timesteps take no sigmas (dp-launch refuses them);
    - user sigmas and timesteps together: retrieve_timesteps raises "Only one of `timesteps` or `sigmas`".
    Heun takes no mu, so flux and qwen run it at one image_seq_len only (the other would repeat it).
    """
    rows = []

    def add(label, name, model, seq_len, steps, **kw):
        rows.append((f"{label}:{model}:L{seq_len}:s{steps}", (name, model, seq_len, steps), kw))

    for name in NAMES:
        for model, lens in SEQ_LENS.items():
            for seq_len in lens[-1:] if name == "heun" else lens:
                for steps in STEPS:
                    if not (model == "qwen" and steps == 1 and name in TERMINAL_NAN):
                        add(name, name, model, seq_len, steps)
    # Each variant on a model of static shift (sd3) and one of dynamic shift (flux; qwen for unipc, whose
    # use_dynamic_shifting and shift_terminal apply there); heun's config is only shift, so sd3 alone.
    variants = [
        ("euler", "karras", {"use_karras_sigmas": True}, ("sd3", "flux")),
        ("euler", "exponential", {"use_exponential_sigmas": True}, ("sd3", "flux")),
        ("euler", "beta", {"use_beta_sigmas": True}, ("sd3", "flux")),
        ("euler", "stochastic", {"stochastic_sampling": True}, ("sd3", "flux")),
        ("euler", "invert", {"invert_sigmas": True}, ("sd3", "flux")),
        ("lcm", "karras", {"use_karras_sigmas": True}, ("sd3", "flux")),
        ("heun", "shift2", {"shift": 2.0}, ("sd3",)),
        ("dpm++-2m", "order3", {"solver_order": 3}, ("sd3", "flux")),
        ("dpm++-2m", "heun", {"solver_type": "heun"}, ("sd3", "flux")),
        ("dpm++-2m", "no_lower_final", {"lower_order_final": False}, ("sd3", "flux")),
        ("dpm++-2m", "euler_final", {"euler_at_final": True}, ("sd3", "flux")),
        ("dpm++-2m", "sigma_min", {"final_sigmas_type": "sigma_min"}, ("sd3", "flux")),
        ("unipc", "order3", {"solver_order": 3}, ("sd3", "qwen")),
        ("unipc", "bh1", {"solver_type": "bh1"}, ("sd3", "qwen")),
        ("unipc", "karras", {"use_karras_sigmas": True}, ("sd3", "qwen")),
        ("unipc", "no_corrector0", {"disable_corrector": [0]}, ("sd3", "qwen")),
        ("unipc", "no_lower_final", {"lower_order_final": False}, ("sd3", "qwen")),
    ]
    for name, label, overrides, models in variants:
        for model in models:
            add(f"{name}+{label}", name, model, 1024, 9, overrides=overrides)
    add("euler+stochastic", "euler", "flux", 1024, 4, overrides={"stochastic_sampling": True})
    for model in ("sd3", "flux"):
        add("euler+terminal", "euler", model, 1024, 9, overrides={"shift_terminal": 0.1})
    add("euler+no_terminal", "euler", "qwen", 1024, 9, overrides={"shift_terminal": None})
    for name in ("euler", "lcm", "unipc"):
        for model in ("sd3", "flux", "qwen"):
            add(f"{name}+sigmas4", name, model, 1024, 4, sigmas=SIGMAS4)
            add(f"{name}+sigmas_lightning", name, model, 1024, 4, sigmas=SIGMAS_LIGHTNING)
    for name in ("euler", "lcm"):
        for model in ("sd3", "flux", "qwen"):
            add(f"{name}+timesteps4", name, model, 1024, 4, timesteps=TIMESTEPS4)
    for steps in (4, 8):
        add("euler+lightning", "euler", "qwen", 1024, steps, overrides=LIGHTNING)
    return rows


def schedulers():
    tensors, meta = {}, {}
    for case_name, args, kw in plan():
        meta[case_name], t = case(*args, **kw)
        tensors.update({f"{case_name}.{k}": v for k, v in t.items()})
    save("schedulers.safetensors", tensors, meta)


PARTS = ["schedulers"]
