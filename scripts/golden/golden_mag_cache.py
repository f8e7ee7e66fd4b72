"""MagCache (diffusers' MagCacheConfig, enabled with transformer.enable_cache) on the tiny FLUX.1-dev and
Qwen-Image folders, fp32 on the CPU, 8 steps: the latents and images diffusers makes with it, the passes
it computed in full, and the magnitude ratios its calibration mode gives. One file,
tests/data/golden/mag_cache_pipeline.safetensors; its metadata holds the cases.

Cases (each stores <case>.latents, output_type="latent" as float32, batch dimension dropped, and
<case>.image, uint8 H x W x 3, output_type="np" x 255 rounded); the calls are those of
golden_step_cache.py (FLUX.1-dev guidance-distilled, one pass per step in the context "cond";
Qwen-Image with true CFG, "cond" then "uncond" each step):

- <family>_calibrate: MagCacheConfig(calibrate=True, num_inference_steps=8). No pass is skipped (the
  run checks the latents equal the uncached ones of golden_step_cache exactly); "mag_ratios" per cache
  context are what diffusers prints at the end of the context's passes: 1.0, then per step the mean
  over tokens (and the batch) of |residual| / (|last residual| + 1e-8), the residual being the image
  stream out of the tail block minus the image stream into the head block, norms over the width.
- flux_mag: MagCacheConfig(num_inference_steps=8, mag_ratios=FLUX_MAG_RATIOS) with its other defaults
  (threshold 0.06, max_skip_steps 3, retention_ratio 0.2): the published 28 FLUX ratios, taken to 8
  steps by diffusers' nearest_interp.
- qwen_mag: MagCacheConfig(threshold=T, num_inference_steps=8, mag_ratios=<qwen_calibrate's "cond"
  ratios>): the workflow the calibration mode is for, on this model's own ratios.

Metadata per cached case: the call's arguments, "folder", "cache" (the config's fields, mag_ratios as
the list diffusers was given), "interpolated" (the ratios diffusers took them to for the steps),
"computed" per context (one boolean per pass, read from the state's
should_compute after the head block's hook ran, and checked against the tail block running),
"computed_steps" (over all contexts).

What diffusers 0.42.1 does (the C++ side matches this):
- The decision depends on the step and the ratios only, never on the data: retention_step =
  int(retention_ratio * num_inference_steps + 0.5); from it on each pass multiplies the accumulated
  ratio by mag_ratios[step] (a float32 0-d tensor, so the accumulators are float32 tensors), counts
  one more accumulated step, adds |1 - accumulated ratio| to the accumulated error, and skips when a
  residual is kept, the error is <= threshold and the accumulated steps <= max_skip_steps; otherwise
  it computes and the three accumulators are reset (to Python 1.0, 0 and 0.0).
- Skipping: the head block returns its image input plus the kept residual (its text input unchanged),
  the other blocks return their inputs. Computing: every block runs; the residual is kept.
- Each cache context has its own state; the pipelines' end-of-call hook reset drops them all.
"""
import os

import torch

import golden_step_cache as fbc
from make_golden import save

PARTS = ["mag_cache"]
QWEN_THRESHOLD = 0.035  # on its calibrated ratios: computes 4 of 8 per branch, the threshold deciding two of them
MARGIN = 0.02
HEAD_HOOK, BLOCK_HOOK = "mag_cache_leader_block_hook", "mag_cache_block_hook"


class _Watch:
    """Per pass: the cache context, the head hook's should_compute, whether the tail block's own forward
    ran; and, in calibration mode, each context's ratios as diffusers holds them when it prints them."""

    def __init__(self, transformer):
        from diffusers.hooks.mag_cache import MagCacheBlockHook

        heads = [m for _, m in transformer.named_modules()
                 if hasattr(m, "_diffusers_hook") and HEAD_HOOK in m._diffusers_hook.hooks]
        tails = [m for _, m in transformer.named_modules() if hasattr(m, "_diffusers_hook")
                 and BLOCK_HOOK in m._diffusers_hook.hooks and m._diffusers_hook.hooks[BLOCK_HOOK].is_tail]
        assert len(heads) == 1 and len(tails) == 1
        head = heads[0]._diffusers_hook.hooks[HEAD_HOOK]
        tail = tails[0]._diffusers_hook.hooks[BLOCK_HOOK]
        self.manager = head.state_manager
        self.passes, self.ratios = [], {}
        head_post = head.fn_ref.post_forward

        def after_head(module, output):
            self.passes.append({"context": self.manager.context.name,
                                "computed": bool(self.manager.get_state().should_compute), "tail_ran": False})
            return head_post(module, output)

        head.fn_ref.post_forward = after_head
        tail_forward = tail.fn_ref.original_forward

        def tail_ran(*args, **kwargs):
            self.passes[-1]["tail_ran"] = True
            return tail_forward(*args, **kwargs)

        tail.fn_ref.original_forward = tail_ran
        advance = tail._advance_step

        def advanced(state):
            if state.step_index + 1 >= tail.config.num_inference_steps and tail.config.calibrate:
                self.ratios[self.manager.context.name] = [float(r) for r in state.calibration_ratios]
            return advance(state)

        tail._advance_step = advanced
        assert isinstance(tail, MagCacheBlockHook)

    def take(self):
        passes, self.passes = self.passes, []
        ratios, self.ratios = self.ratios, {}
        assert not self.manager._state_cache, "a cache state outlived the pipeline call"
        for p in passes:
            assert p["tail_ran"] == p["computed"], f"tail ran {p['tail_ran']}, should_compute {p['computed']}"
        contexts = sorted({p["context"] for p in passes})
        return {c: [p["computed"] for p in passes if p["context"] == c] for c in contexts}, ratios


def _pipeline(folder, config):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    pipe.transformer.enable_cache(config)
    return pipe, _Watch(pipe.transformer)


def _run(pipe, call, watch):
    """Image, latents, decisions and calibrated ratios (golden_step_cache's run: both calls must agree)."""
    image, latents, (computed, ratios) = fbc._run(pipe, call, watch)
    return image, latents, computed, ratios


def _uncached_latents(folder, call):
    return fbc._run(fbc._pipeline(folder, None)[0], call, None)[1]


def _errors(ratios, steps, retention_ratio, threshold, max_skip):
    """The accumulated errors diffusers compares with the threshold, replayed in float32 (for margins)."""
    retention = int(retention_ratio * steps + 0.5)
    acc_ratio, acc_err, acc_steps, kept, out = 1.0, 0.0, 0, False, []
    for step in range(steps):
        if step < retention:
            kept = True
            continue
        acc_ratio = acc_ratio * ratios[step]
        acc_steps += 1
        acc_err = acc_err + abs(1.0 - acc_ratio)
        out.append(float(acc_err))
        if kept and acc_err <= threshold and acc_steps <= max_skip:
            continue
        acc_ratio, acc_steps, acc_err = 1.0, 0, 0.0
    return out


def mag_cache():
    from diffusers import MagCacheConfig
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    tensors, meta = {}, {}
    calibrated = {}
    for family, folder, call in (("flux", fbc.FLUX_FOLDER, fbc.FLUX_CALL), ("qwen", fbc.QWEN_FOLDER, fbc.QWEN_CALL)):
        uncached = _uncached_latents(folder, call)
        case = f"{family}_calibrate"
        pipe, watch = _pipeline(folder, MagCacheConfig(calibrate=True, num_inference_steps=call["steps"]))
        tensors[case + ".image"], tensors[case + ".latents"], computed, ratios = _run(pipe, call, watch)
        assert all(all(f) for f in computed.values()), f"{case}: calibration skipped a pass"
        assert torch.equal(tensors[case + ".latents"], uncached), f"{case}: calibration changed the latents"
        assert set(ratios) == set(computed) and all(len(r) == call["steps"] for r in ratios.values()), ratios
        print(f"{case}: ratios {ratios}")
        calibrated[family] = ratios
        meta[case] = dict(call, folder=os.path.relpath(folder, fbc.ROOT),
                          cache={"type": "mag_cache", "calibrate": True}, mag_ratios=ratios,
                          computed_steps=sum(sum(f) for f in computed.values()))

    # Qwen-Image on its own calibrated "cond" ratios: a threshold that skips some passes, every
    # accumulated error at least MARGIN (relative) from it.
    qwen_ratios = calibrated["qwen"]["cond"]
    for family, folder, call, config_args in (
            ("flux", fbc.FLUX_FOLDER, fbc.FLUX_CALL, dict(mag_ratios=FLUX_MAG_RATIOS)),
            ("qwen", fbc.QWEN_FOLDER, fbc.QWEN_CALL, dict(mag_ratios=qwen_ratios, threshold=QWEN_THRESHOLD))):
        config = MagCacheConfig(num_inference_steps=call["steps"], **config_args)
        errors = _errors([torch.tensor(float(r), dtype=torch.float32) for r in config.mag_ratios], call["steps"],
                         config.retention_ratio, torch.tensor(config.threshold, dtype=torch.float32),
                         config.max_skip_steps)
        near = [e for e in errors if abs(e - config.threshold) < MARGIN * config.threshold]
        assert not near, f"{family}: accumulated errors {near} within {MARGIN:.0%} of {config.threshold}"
        case = f"{family}_mag"
        pipe, watch = _pipeline(folder, config)
        tensors[case + ".image"], tensors[case + ".latents"], computed, _ = _run(pipe, call, watch)
        for c, flags in computed.items():
            print(f"{case} [{c}]: computed {''.join('C' if f else '.' for f in flags)}, "
                  f"accumulated errors {['%.5f' % e for e in errors]}")
            assert 2 <= sum(flags) <= len(flags) - 2, f"{case}: {sum(flags)} of {len(flags)} computed"
        given = config_args["mag_ratios"]
        meta[case] = dict(call, folder=os.path.relpath(folder, fbc.ROOT),
                          cache={"type": "mag_cache", "threshold": config.threshold,
                                 "max_skip_steps": config.max_skip_steps, "retention_ratio": config.retention_ratio,
                                 "mag_ratios": [float(r) for r in given]},
                          interpolated=[float(r) for r in config.mag_ratios],
                          computed=computed, computed_steps=sum(sum(f) for f in computed.values()))
        diff = (tensors[case + ".latents"] - _uncached_latents(folder, call)).abs().max().item()
        print(f"{case}: latents max |diff| from uncached {diff:.6g}")
    save("mag_cache_pipeline.safetensors", tensors, meta)
