"""Whole-pipeline images from diffusers for each scheduler a prompt line can choose, on the tiny SD3
(models/tiny-random-sd3), FLUX.1-dev (models/tiny-random-flux-dev) and Qwen-Image
(models/tiny-random-qwen-image) folders, and a Lightning-style preset (an adapter, its scheduler
config, 4 or 8 steps) on Qwen-Image.

What is computed (the scheduler choice as dp-launch implements it):
- Scheduler: Class.from_config(M, **defaults, **scheduler_config), M the folder's
  scheduler/scheduler_config.json, the class and defaults from the name (NAMES below):
      euler         FlowMatchEulerDiscreteScheduler  {}
      heun          FlowMatchHeunDiscreteScheduler   {}
      lcm           FlowMatchLCMScheduler            {}
      dpm++-2m      DPMSolverMultistepScheduler      use_flow_sigmas, flow_prediction, flow_shift M's shift
      dpm++-2m-sde  DPMSolverMultistepScheduler      the same and algorithm_type sde-dpmsolver++
      unipc         UniPCMultistepScheduler          use_flow_sigmas, flow_prediction, flow_shift M's shift
- Timesteps: the pipeline's own retrieve_timesteps call, with `sigmas` passed only when the
  scheduler's set_timesteps takes them (Heun and DPM take none, and make their own schedule from the
  step count) and `mu` only when set_timesteps takes it and the scheduler's config has
  use_dynamic_shifting. The module-level retrieve_timesteps of each pipeline module is patched for
  the call (_patched_timesteps); for the euler baselines the run checks that the patched call gives
  exactly the unpatched pipeline's image and latents.
- Stochastic samplers (euler with stochastic_sampling, lcm, dpm++-2m-sde): each step's noise comes
  from the prompt's own torch.Generator("cpu").manual_seed(seed), the one the initial latents were
  drawn from, continued (scheduler.step is wrapped to get generator=; a batch passes its per-prompt
  list, and each row is drawn from its own generator).

Cases (CASES): for each model the same call with euler (the baseline), euler with
{"use_karras_sigmas": true}, euler with {"stochastic_sampling": true}, heun, lcm, dpm++-2m,
dpm++-2m-sde, unipc, and euler with a user's `sigmas`; on Qwen-Image also heun with true CFG (4, a
negative prompt); on FLUX.1-dev a batch of two prompts (seeds 3 and 5) with the stochastic euler,
whose first row the run checks against the single-prompt case of the same seed; on Qwen-Image the
preset cases qwen-image-lightning-4step and -8step: the committed tiny peft adapter
tests/data/golden/lora/qwen_peft.safetensors at scale 1 (golden_lora's qwen case), the scheduler
FlowMatchEulerDiscreteScheduler.from_config(M, **LIGHTNING), true_cfg_scale 1 and negative prompt " "
(as the Lightning README's example; it has no effect at true_cfg_scale 1).

Each case's metadata gives the call in diffusers' names (folder, family, prompt, negative_prompt or
null, seed, steps, width, height, guidance_scale for sd3 and flux, true_cfg_scale for qwen-image,
max_sequence_length for flux and qwen-image) and the new arguments as a prompt line gives them:
"scheduler", "scheduler_config" (absent when none), "sigmas" (absent when none); the preset cases
"preset" (and "preset_expands_to": the scheduler, its config, steps and true_cfg_scale it stands
for) and "adapters" [{"file" (in tests/data/golden/lora/), "scale"}]. The batch case has lists for
"prompt" and "seed" and its tensors are NAME.0.*, NAME.1.*.

Tensors per case: NAME.image (uint8 HWC), NAME.latents (the final latents, as output_type="latent"
gives them: SD3 channels first, FLUX and Qwen-Image packed [tokens, channels]), NAME.timesteps and
NAME.sigmas (the scheduler's, float32, after the pipeline set them).

What diffusers does here that may surprise:
- FlowMatchLCMScheduler without scale_factors steps exactly as the stochastic euler does (x0, then
  (1 - sigma_next) x0 + sigma_next noise): the lcm and euler_stochastic cases have the same latents.
- Heun takes no sigmas and no mu: it shifts by M's static `shift` (3 on FLUX, 1 on Qwen-Image) and
  ignores use_dynamic_shifting and shift_terminal. DPM takes mu where M shifts dynamically and then
  uses flow_shift = exp(mu) (it sets scheduler.config.flow_shift as an attribute, the config dict
  keeps M's shift); it knows no shift_terminal. UniPC gets Qwen-Image's linspace sigmas (and applies
  shift_terminal), but none from FluxPipeline (use_flow_sigmas) or SD3 (none given): it then builds
  its own schedule, as DPM does.
"""
import functools
import inspect
import json
import math
import os
from contextlib import contextmanager

import numpy as np
import torch

from make_golden import OUT, save

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ADAPTERS = os.path.join(OUT, "lora")
PARTS = ["scheduler_pipelines"]

FOLDERS = {
    "sd3": os.path.join(ROOT, "models", "tiny-random-sd3"),
    "flux": os.path.join(ROOT, "models", "tiny-random-flux-dev"),
    "qwen-image": os.path.join(ROOT, "models", "tiny-random-qwen-image"),
}
PIPELINE_MODULES = {
    "sd3": "diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3",
    "flux": "diffusers.pipelines.flux.pipeline_flux",
    "qwen-image": "diffusers.pipelines.qwenimage.pipeline_qwenimage",
}


def _flow(m):
    """DPM's and UniPC's defaults: flow-matching sigmas and predictions, shifted by M's shift."""
    return dict(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=m.get("shift", 1.0))


# name: (diffusers class, defaults from M)
NAMES = {
    "euler": ("FlowMatchEulerDiscreteScheduler", lambda m: {}),
    "heun": ("FlowMatchHeunDiscreteScheduler", lambda m: {}),
    "lcm": ("FlowMatchLCMScheduler", lambda m: {}),
    "dpm++-2m": ("DPMSolverMultistepScheduler", _flow),
    "dpm++-2m-sde": ("DPMSolverMultistepScheduler", lambda m: dict(_flow(m), algorithm_type="sde-dpmsolver++")),
    "unipc": ("UniPCMultistepScheduler", _flow),
}

LIGHTNING = {"base_image_seq_len": 256, "base_shift": math.log(3), "invert_sigmas": False, "max_image_seq_len": 8192,
             "max_shift": math.log(3), "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": None,
             "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
             "use_dynamic_shifting": True, "use_exponential_sigmas": False, "use_karras_sigmas": False}
PRESETS = {f"qwen-image-lightning-{n}step": dict(scheduler="euler", scheduler_config=LIGHTNING, steps=n,
                                                 true_cfg_scale=1.0) for n in (4, 8)}

# Each model's call; every scheduler case of the model makes it (only the scheduler differs).
CALLS = {
    "sd3": dict(prompt="a red circle on a blue background", negative_prompt="blurry, low quality", seed=0, steps=4,
                guidance_scale=5.0, width=32, height=32),
    "flux": dict(prompt="a red fox in the snow", negative_prompt=None, seed=3, steps=4, guidance_scale=3.5,
                 width=32, height=32, max_sequence_length=32),
    "qwen-image": dict(prompt="a lighthouse at dusk", negative_prompt=None, seed=13, steps=4, true_cfg_scale=1.0,
                       width=32, height=32, max_sequence_length=64),
}
SHORT = {"sd3": "sd3", "flux": "flux", "qwen-image": "qwen"}
# case suffix, the line's new arguments (and any call argument it changes)
SCHEDULER_CASES = [
    ("euler", dict(scheduler="euler")),
    ("euler_karras", dict(scheduler="euler", scheduler_config={"use_karras_sigmas": True})),
    ("euler_stochastic", dict(scheduler="euler", scheduler_config={"stochastic_sampling": True})),
    ("heun", dict(scheduler="heun")),
    ("lcm", dict(scheduler="lcm")),
    ("dpmpp_2m", dict(scheduler="dpm++-2m")),
    ("dpmpp_2m_sde", dict(scheduler="dpm++-2m-sde")),
    ("unipc", dict(scheduler="unipc")),
    ("euler_sigmas", dict(scheduler="euler", sigmas=[1.0, 0.8, 0.45, 0.2], steps=4)),
]


def _cases():
    cases = {}
    for family, call in CALLS.items():
        for suffix, line in SCHEDULER_CASES:
            cases[f"{SHORT[family]}_{suffix}"] = dict(call, family=family, **line)
    cases["qwen_heun_cfg"] = dict(CALLS["qwen-image"], family="qwen-image", scheduler="heun", true_cfg_scale=4.0,
                                  negative_prompt="blurry, low quality")
    cases["flux_batch_euler_stochastic"] = dict(CALLS["flux"], family="flux", prompt=["a red fox in the snow", "a cat"],
                                                seed=[3, 5], scheduler="euler",
                                                scheduler_config={"stochastic_sampling": True})
    for preset, expands in PRESETS.items():
        cases[f"qwen_lightning_{expands['steps']}step"] = dict(
            CALLS["qwen-image"], family="qwen-image", negative_prompt=" ", steps=expands["steps"],
            true_cfg_scale=expands["true_cfg_scale"], preset=preset, preset_expands_to=expands,
            adapters=[{"file": "qwen_peft.safetensors", "scale": 1.0}])
    return cases


def _config(family):
    with open(os.path.join(FOLDERS[family], "scheduler", "scheduler_config.json")) as f:
        return json.load(f)


def make_scheduler(family, name, overrides):
    """Class.from_config(M, **defaults, **overrides), as dp-launch builds a line's scheduler."""
    import diffusers

    m = _config(family)
    class_name, defaults = NAMES[name]
    return getattr(diffusers, class_name).from_config(m, **{**defaults(m), **(overrides or {})})


def _filtered(original):
    """retrieve_timesteps with `sigmas` passed only where set_timesteps takes them and `mu` only where it
    takes it and the scheduler shifts dynamically."""

    def retrieve_timesteps(scheduler, num_inference_steps=None, device=None, timesteps=None, sigmas=None, **kwargs):
        params = inspect.signature(scheduler.set_timesteps).parameters
        if "sigmas" not in params:
            sigmas = None
        if "mu" in kwargs and not ("mu" in params and scheduler.config.get("use_dynamic_shifting", False)):
            del kwargs["mu"]
        return original(scheduler, num_inference_steps, device, timesteps=timesteps, sigmas=sigmas, **kwargs)

    return retrieve_timesteps


@contextmanager
def _patched_timesteps(family):
    import importlib

    module = importlib.import_module(PIPELINE_MODULES[family])
    original = module.retrieve_timesteps
    module.retrieve_timesteps = _filtered(original)
    try:
        yield
    finally:
        module.retrieve_timesteps = original


def _stochastic(scheduler):
    from diffusers import DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler, FlowMatchLCMScheduler

    if isinstance(scheduler, FlowMatchLCMScheduler):
        return True
    if isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
        return bool(scheduler.config.stochastic_sampling)
    if isinstance(scheduler, DPMSolverMultistepScheduler):
        return scheduler.config.algorithm_type in ("sde-dpmsolver", "sde-dpmsolver++")
    return False


def _pipeline(family):
    from diffusers import DiffusionPipeline

    none = dict(text_encoder_3=None, tokenizer_3=None) if family == "sd3" else {}  # SD3 without T5
    pipe = DiffusionPipeline.from_pretrained(FOLDERS[family], torch_dtype=torch.float32, **none)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _call_args(case):
    args = dict(prompt=case["prompt"], num_inference_steps=case["steps"], width=case["width"], height=case["height"])
    if case["negative_prompt"] is not None:
        args["negative_prompt"] = case["negative_prompt"]
    for key in ("guidance_scale", "true_cfg_scale", "max_sequence_length", "sigmas"):
        if key in case:
            args[key] = case[key]
    return args


def _generators(case):
    seeds = case["seed"] if isinstance(case["seed"], list) else [case["seed"]]
    gens = [torch.Generator("cpu").manual_seed(s) for s in seeds]
    return gens if isinstance(case["seed"], list) else gens[0]


def _uint8(images):
    return [torch.from_numpy((image * 255).round().astype(np.uint8)) for image in images]


def _run(pipe, case):
    """One patched call: the images, the final latents (kept at the last step's callback) and the
    scheduler's timesteps and sigmas."""
    family = case["family"]
    if "preset" in case:
        expands = case["preset_expands_to"]
        scheduler = make_scheduler(family, expands["scheduler"], expands["scheduler_config"])
    else:
        scheduler = make_scheduler(family, case["scheduler"], case.get("scheduler_config"))
    generator = _generators(case)
    if _stochastic(scheduler):
        scheduler.step = functools.partial(type(scheduler).step, scheduler, generator=generator)
    pipe.scheduler = scheduler
    kept = {}

    def keep(p, i, t, kw):
        kept["latents"] = kw["latents"]
        return kw

    with _patched_timesteps(family):
        out = pipe(generator=generator, output_type="np", callback_on_step_end=keep,
                   callback_on_step_end_tensor_inputs=["latents"], **_call_args(case))
    return _uint8(out.images), [x.float() for x in kept["latents"]], scheduler


def _check_unpatched(case, image, latents):
    """The folder's own scheduler without the patch: exactly the same image and latents."""
    pipe = _pipeline(case["family"])
    args = _call_args(case)
    ref_image = _uint8(pipe(generator=_generators(case), output_type="np", **args).images)[0]
    ref_latents = pipe(generator=_generators(case), output_type="latent", **args).images[0].float()
    assert torch.equal(ref_image, image), f"{case['family']}: the patched euler call changed the image"
    assert torch.equal(ref_latents, latents), f"{case['family']}: the patched euler call changed the latents"
    print(f"{case['family']}: the patched euler call gives the unpatched pipeline's image and latents exactly")


def _with_adapters(family, adapters):
    pipe = _pipeline(family)
    names = []
    for k, adapter in enumerate(adapters):
        names.append(f"a{k}")
        pipe.load_lora_weights(ADAPTERS, weight_name=adapter["file"], adapter_name=names[-1])
    pipe.set_adapters(names, [a["scale"] for a in adapters])
    return pipe


def scheduler_pipelines():
    cases = _cases()
    pipes = {family: _pipeline(family) for family in FOLDERS}
    tensors, meta = {}, {}
    for name, case in cases.items():
        pipe = _with_adapters(case["family"], case["adapters"]) if "adapters" in case else pipes[case["family"]]
        images, latents, scheduler = _run(pipe, case)
        rows = [""] if len(images) == 1 else [f".{k}" for k in range(len(images))]
        for row, image, lat in zip(rows, images, latents):
            tensors[f"{name}{row}.image"], tensors[f"{name}{row}.latents"] = image, lat
        tensors[f"{name}.timesteps"] = scheduler.timesteps.float()
        tensors[f"{name}.sigmas"] = scheduler.sigmas.float()
        meta[name] = dict(case, folder=os.path.relpath(FOLDERS[case["family"]], ROOT))
        print(f"{name}: {type(scheduler).__name__}, {len(scheduler.timesteps)} model calls per branch, "
              f"timesteps {[round(t, 3) for t in scheduler.timesteps.tolist()]}")
        if case.get("scheduler") == "euler" and "scheduler_config" not in case and "sigmas" not in case:
            _check_unpatched(case, images[0], latents[0])

    # Per-prompt noise: the batch's first row is the single prompt of the same seed.
    single, batch = tensors["flux_euler_stochastic.latents"], tensors["flux_batch_euler_stochastic.0.latents"]
    diff = (single - batch).abs().max().item()
    assert diff < 1e-4, f"the batch's first row moved {diff} from the single prompt of its seed"
    other = (tensors["flux_batch_euler_stochastic.1.latents"] - single).abs().max().item()
    print(f"flux_batch_euler_stochastic: row 0 within {diff:.3g} of flux_euler_stochastic; row 1 {other:.3g} away")
    save("scheduler_pipelines.safetensors", tensors, meta)

    print("max |latents - the euler baseline's| (max |baseline latents|):")
    for family, short in SHORT.items():
        base = tensors[f"{short}_euler.latents"]
        moved = {n[len(short) + 1:]: (tensors[f"{n}.latents"] - base).abs().max().item()
                 for n in cases if n.startswith(short + "_") and f"{n}.latents" in tensors and n != f"{short}_euler"}
        for n, d in moved.items():
            assert d > 1e-3, f"{short}_{n}: the latents are the euler baseline's ({d})"
        print(f"  {family} ({base.abs().max().item():.3g}): " + ", ".join(f"{n} {d:.3g}" for n, d in moved.items()))
