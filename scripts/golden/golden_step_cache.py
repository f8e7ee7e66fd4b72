"""First Block Cache (diffusers' FirstBlockCacheConfig, enabled with transformer.enable_cache) on the
tiny FLUX.1-dev and Qwen-Image folders, fp32 on the CPU, 8 steps: the images and latents diffusers makes
with it and without it, and the cache's decision at every transformer pass, read from diffusers' own
hooks. One file, tests/data/golden/step_cache_pipeline.safetensors; its metadata holds the cases.

Cases (each stores <case>.latents, output_type="latent" as float32, batch dimension dropped, and
<case>.image, uint8 H x W x 3, output_type="np" x 255 rounded):

- flux_uncached, qwen_uncached: FluxPipeline / QwenImagePipeline from the folder, no cache.
- flux_cached, qwen_cached: the same calls with pipe.transformer.enable_cache(FirstBlockCacheConfig(
  threshold=T)). FLUX.1-dev is guidance-distilled (guidance_scale, no negative prompt), so it makes one
  pass per step, in the cache context "cond"; Qwen-Image uses true CFG (true_cfg_scale 4 and a negative
  prompt), two passes per step, "cond" then "uncond".
- flux_taylorseer, qwen_taylorseer: the same calls with TaylorSeerCacheConfig() (cache_interval 5,
  disable_cache_before_step 3, max_order 1, factors in bfloat16; every "transformer_blocks.N.attn" and
  "single_transformer_blocks.N.attn" hooked): the attentions run on passes 0, 1, 2 and 4 of each
  branch and are extrapolated on 3, 5, 6 and 7. "computed_steps": the passes each hooked attention
  ran, each branch's counted (read by wrapping the original forward each hook calls). The
  *_taylorseer_float32 cases are the same with taylor_factors_dtype=torch.float32.

Metadata per case: the call's arguments (seed, steps = num_inference_steps), "folder" relative to the
repository, "cache" (null, or {"type": "first_block_cache", "threshold": T}), and for the cached cases:
- "head_block", "tail_block": the transformer's blocks diffusers made head and tail.
- "computed": per cache context, one boolean per step, true where the remaining blocks ran.
- "metrics": per cache context, per step, the value diffusers compared with T (null at the first step,
  where there is nothing to compare with and the pass always computes).
- "computed_steps": the number of passes computed in full, over all contexts.

What diffusers 0.42.1 does (the C++ side matches this):
- Blocks: every ModuleList child of the transformer named transformer_blocks or
  single_transformer_blocks, in registration order, made one list. The first is the head block, the
  last the tail block. FLUX: head transformer_blocks.0 (a double-stream block), tail
  single_transformer_blocks.1 (the last single-stream block), transformer_blocks.1 and
  single_transformer_blocks.0 between them. Qwen-Image (two blocks): head transformer_blocks.0, tail
  transformer_blocks.1, nothing between.
- The head block always runs. Its residual is its image-stream output minus its image-stream input
  (hidden_states only; the text stream plays no part in the decision). The metric is
  mean|residual - reference| / mean|reference|, the reference being the residual of the last pass of
  the same context that computed in full (it is not updated on a skipped pass, so after skips it
  is older than the previous step). It is computed with float32 tensor ops over the whole tensor and
  read as a Python float (a float32 value; the run checks this). The pass computes in full if
  metric > T, strictly, or if there is no reference yet.
- Computing in full: every block runs; the head block's outputs (both streams) are kept, and the
  tail block's outputs minus them (both streams) are kept as the tail residuals.
- Skipping: the head block's outputs plus the kept tail residuals, stream by stream, stand for the
  tail block's outputs; the blocks between and the tail block return their inputs unchanged. What
  follows the blocks (final norm, projection) runs as always.
- Cache contexts: the pipelines wrap each transformer call in transformer.cache_context("cond") or
  ("uncond"); the hooks keep one state per context name, so cond and uncond each have their own
  reference residual, head outputs and tail residuals, and decide independently. The run checks that
  each context kept one state object for the whole call and that the two are distinct.
- Between pipeline calls: at the end of __call__ (both FluxPipeline and QwenImagePipeline, any
  output_type) maybe_free_model_hooks resets the stateful hooks of every component that can cache
  (the transformer), and the cache's state manager then drops all its per-context states, so the next
  call starts with none. Nothing is reset at the start of a call (a call that raises midway leaves
  its state behind). The image and latent calls of each case therefore start alike: the run checks
  that no state is left after each call and that both calls make identical decisions and metrics.

How the decisions are read: the head block's hook is diffusers' own, unchanged, with two taps. Its
threshold is a float subclass that notes the value compared with it (the exact Python float diffusers
tested), and after the head hook runs, the shared state's should_compute is read in the current
context. The tail block's own forward is wrapped to note that it ran; the run checks it ran exactly
when should_compute was true.

Thresholds: T is chosen so that about half of each context's 8 passes compute (not all, not only the
first), and so that no metric lies within 2% (relative) of T, so that an implementation whose float
summation differs slightly makes the same decisions; the run checks both. FLUX, T = 0.49: computed at
steps 0, 2, 4, 6 (4 of 8), the closest metric 9% from T. Qwen-Image, T = 0.48: computed at steps 0, 1,
2, 4 in both contexts (4 + 4 of 16 passes), the closest metric 6.9% from T. The two contexts' metrics
differ but no T with that margin separates their decisions on this tiny random model.

Checks made on the way (the run stops if one fails): with threshold 0 every pass computes and the
latents equal the uncached ones exactly; the properties above. The cached latents' largest difference
from the uncached ones is printed.
"""
import os

import numpy as np
import torch

from make_golden import save

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FLUX_FOLDER = os.path.join(ROOT, "models", "tiny-random-flux-dev")
QWEN_FOLDER = os.path.join(ROOT, "models", "tiny-random-qwen-image")
FLUX_CALL = dict(prompt="a red fox in the snow", seed=3, steps=8, guidance_scale=3.5, width=32, height=32,
                 max_sequence_length=32)
QWEN_CALL = dict(prompt="a red fox in the snow", negative_prompt="blurry, low quality", seed=7, steps=8,
                 true_cfg_scale=4.0, width=48, height=32, max_sequence_length=512)
FLUX_THRESHOLD = 0.49  # 4 of 8 passes computed; every metric at least 9% from it
QWEN_THRESHOLD = 0.48  # 4 of 8 per branch; every metric at least 6.9% from it
MARGIN = 0.02  # no step's metric may lie within this relative distance of the threshold
HEAD_HOOK, BLOCK_HOOK = "fbc_leader_block_hook", "fbc_block_hook"
PARTS = ["step_cache"]


class _ComparedThreshold(float):
    """A threshold that notes every value compared with it. diffusers decides with `diff > threshold`,
    diff a Python float; Python gives a float subclass's reflected comparison (here __lt__) priority,
    so this sees the very value diffusers compared, and answers as the plain float would."""

    def __new__(cls, value, seen):
        self = super().__new__(cls, value)
        self.seen = seen
        return self

    def __lt__(self, other):
        self.seen.append(other)
        return float.__lt__(self, other)


class _Recorder:
    """Watches diffusers' First Block Cache hooks on one transformer, pass by pass: the cache context,
    the value the head block hook compared with the threshold, whether it set should_compute, and
    whether the tail block's own forward then ran. Nothing of the cache is recomputed here."""

    def __init__(self, transformer):
        heads = [(n, m) for n, m in transformer.named_modules()
                 if hasattr(m, "_diffusers_hook") and HEAD_HOOK in m._diffusers_hook.hooks]
        tails = [(n, m) for n, m in transformer.named_modules() if hasattr(m, "_diffusers_hook")
                 and BLOCK_HOOK in m._diffusers_hook.hooks and m._diffusers_hook.hooks[BLOCK_HOOK].is_tail]
        assert len(heads) == 1 and len(tails) == 1, f"head blocks {heads}, tail blocks {tails}"
        self.head_block, self.tail_block = heads[0][0], tails[0][0]
        self.others = [n for n, m in transformer.named_modules() if hasattr(m, "_diffusers_hook")
                       and BLOCK_HOOK in m._diffusers_hook.hooks and n != self.tail_block]
        head = heads[0][1]._diffusers_hook.hooks[HEAD_HOOK]
        tail = tails[0][1]._diffusers_hook.hooks[BLOCK_HOOK]
        assert tail.state_manager is head.state_manager, "the head and tail blocks share no state"
        self.state_manager = head.state_manager
        self.passes = []
        seen = []
        head.threshold = _ComparedThreshold(head.threshold, seen)
        decide = head._should_compute_remaining_blocks

        def should_compute(residual):
            seen.clear()
            result = decide(residual)
            assert len(seen) <= 1, seen
            self._metric = seen[0] if seen else None
            return result

        head._should_compute_remaining_blocks = should_compute
        head_post = head.fn_ref.post_forward

        def after_head(module, output):
            state = self.state_manager.get_state()
            self.passes.append({"context": self.state_manager.context.name, "state": id(state),
                                "computed": state.should_compute, "metric": self._metric, "tail_ran": False})
            return head_post(module, output)

        head.fn_ref.post_forward = after_head
        tail_forward = tail.fn_ref.original_forward

        def tail_ran(*args, **kwargs):
            assert self.passes[-1]["context"] == self.state_manager.context.name
            self.passes[-1]["tail_ran"] = True
            return tail_forward(*args, **kwargs)

        tail.fn_ref.original_forward = tail_ran

    def take(self):
        """This call's decisions, per cache context; checks that the tail block ran exactly when the
        head block hook said to compute, that each context kept one state of its own, and that
        diffusers dropped every state at the end of the call."""
        passes, self.passes = self.passes, []
        assert not self.state_manager._state_cache, "a cache state outlived the pipeline call"
        contexts = sorted({p["context"] for p in passes})
        states = {c: {p["state"] for p in passes if p["context"] == c} for c in contexts}
        assert all(len(s) == 1 for s in states.values()), f"a context changed state within a call: {states}"
        assert len({next(iter(s)) for s in states.values()}) == len(contexts), "two contexts shared a state"
        for p in passes:
            assert p["tail_ran"] == p["computed"], f"tail block ran {p['tail_ran']}, should_compute {p['computed']}"
        return ({c: [p["computed"] for p in passes if p["context"] == c] for c in contexts},
                {c: [p["metric"] for p in passes if p["context"] == c] for c in contexts})


def _pipeline(folder, threshold):
    from diffusers import DiffusionPipeline, FirstBlockCacheConfig

    pipe = DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    if threshold is None:
        return pipe, None
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    return pipe, _Recorder(pipe.transformer)


def _run(pipe, call, recorder):
    """The image and the latents of `call`, and the cache decisions (the same for both calls)."""
    args = dict(call)
    seed = args.pop("seed")
    args["num_inference_steps"] = args.pop("steps")
    image = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **args).images[0]
    first = recorder.take() if recorder else None
    latents = pipe(generator=torch.Generator("cpu").manual_seed(seed), output_type="latent", **args).images[0]
    second = recorder.take() if recorder else None
    assert first == second, f"the image and latent calls decided differently: {first} vs {second}"
    return torch.from_numpy((image * 255).round().astype(np.uint8)), latents.float(), first


def _check_threshold(case, threshold, computed, metrics):
    for context, flags in computed.items():
        shown = ", ".join("-" if m is None else f"{m:.6f}" for m in metrics[context])
        print(f"{case} [{context}]: computed {''.join('C' if f else '.' for f in flags)} "
              f"({sum(flags)} of {len(flags)}), metrics {shown}")
        assert flags[0] and metrics[context][0] is None, f"{case} [{context}]: the first pass must compute"
        assert all(type(m) is float and float(torch.tensor(m, dtype=torch.float32)) == m
                   for m in metrics[context][1:]), f"{case} [{context}]: a metric is not a float32 value"
        assert 2 <= sum(flags) <= len(flags) - 2, f"{case} [{context}]: threshold {threshold} computes {sum(flags)}"
        near = [m for m in metrics[context][1:] if abs(m - threshold) < MARGIN * threshold]
        assert not near, f"{case} [{context}]: metrics {near} within {MARGIN:.0%} of the threshold {threshold}"
        margin = min(abs(m - threshold) / threshold for m in metrics[context][1:])
        print(f"{case} [{context}]: closest metric {margin:.1%} from the threshold {threshold}")


def step_cache():
    tensors, meta = {}, {}
    for family, folder, call, threshold in (("flux", FLUX_FOLDER, FLUX_CALL, FLUX_THRESHOLD),
                                            ("qwen", QWEN_FOLDER, QWEN_CALL, QWEN_THRESHOLD)):
        uncached = f"{family}_uncached"
        tensors[uncached + ".image"], tensors[uncached + ".latents"], _ = _run(_pipeline(folder, None)[0], call, None)
        meta[uncached] = dict(call, folder=os.path.relpath(folder, ROOT), cache=None)

        # Threshold 0: every pass computes, and the hooks change nothing.
        pipe, recorder = _pipeline(folder, 0.0)
        _, latents, (computed, _) = _run(pipe, call, recorder)
        assert all(all(flags) for flags in computed.values()), f"{family}: threshold 0 skipped a pass: {computed}"
        assert torch.equal(latents, tensors[uncached + ".latents"]), f"{family}: threshold 0 changed the latents"
        print(f"{family}: threshold 0 computes every pass ({ {c: len(f) for c, f in computed.items()} }); "
              "latents exactly the uncached ones")

        case = f"{family}_cached"
        pipe, recorder = _pipeline(folder, threshold)
        tensors[case + ".image"], tensors[case + ".latents"], (computed, metrics) = _run(pipe, call, recorder)
        print(f"{case}: head block {recorder.head_block}, tail block {recorder.tail_block}, "
              f"between them {recorder.others}")
        _check_threshold(case, threshold, computed, metrics)
        meta[case] = dict(call, folder=os.path.relpath(folder, ROOT),
                          cache={"type": "first_block_cache", "threshold": threshold},
                          head_block=recorder.head_block, tail_block=recorder.tail_block,
                          computed=computed, metrics=metrics,
                          computed_steps=sum(sum(flags) for flags in computed.values()))
        diff = (tensors[case + ".latents"] - tensors[uncached + ".latents"]).abs().max().item()
        print(f"{case}: latents max |diff| from {uncached}'s {diff:.6g} "
              f"(latents max |x| {tensors[uncached + '.latents'].abs().max().item():.4g})")
        _taylorseer(family, folder, call, tensors, meta, float32=False)
        _taylorseer(family, folder, call, tensors, meta, float32=True)
    save("step_cache_pipeline.safetensors", tensors, meta)


# TaylorSeer (TaylorSeerCacheConfig's defaults: cache_interval 5, disable_cache_before_step 3, no
# cool-down, max_order 1, factors in bfloat16): with 8 steps the attentions run on passes 0, 1, 2 and
# 4 of each branch and are extrapolated on 3, 5, 6 and 7. The passes each hooked attention ran are
# counted by wrapping the original forward its hook calls; every attention must agree.
def _taylorseer(family, folder, call, tensors, meta, float32):
    from diffusers import DiffusionPipeline, TaylorSeerCacheConfig
    from diffusers.hooks import HookRegistry

    pipe = DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    # float32: the same with taylor_factors_dtype=torch.float32 (no rounding of the factors: a
    # reimplementation's kernels then differ from these latents by their own rounding only).
    config = TaylorSeerCacheConfig(taylor_factors_dtype=torch.float32) if float32 else TaylorSeerCacheConfig()
    pipe.transformer.enable_cache(config)
    ran = {}
    for name, module in pipe.transformer.named_modules():
        registry = getattr(module, "_diffusers_hook", None)
        hook = registry.get_hook("taylorseer_cache") if registry is not None else None
        if hook is None:
            continue
        original = hook.fn_ref.original_forward
        ran[name] = 0

        def counted(*args, _name=name, _original=original, **kwargs):
            ran[_name] += 1
            return _original(*args, **kwargs)

        hook.fn_ref.original_forward = counted
    hooked = sorted(ran)
    case = f"{family}_taylorseer" + ("_float32" if float32 else "")
    tensors[case + ".image"], tensors[case + ".latents"], _ = _run(pipe, call, None)
    counts = set(ran.values())
    assert len(counts) == 1, f"{case}: the attentions ran different numbers of passes: {ran}"
    branches = 2 if call.get("negative_prompt") else 1
    computed_steps = counts.pop() // 2  # two calls (image, latents); each branch's passes count
    print(f"{case}: {len(hooked)} attentions hooked ({hooked[0]} ... {hooked[-1]}); each ran "
          f"{computed_steps} passes over the call's {branches} branch(es) x {call['steps']} steps")
    meta[case] = dict(call, folder=os.path.relpath(folder, ROOT),
                      cache={"type": "taylorseer_cache", "cache_interval": config.cache_interval,
                             "disable_cache_before_step": config.disable_cache_before_step,
                             "max_order": config.max_order,
                             "taylor_factors_dtype": "float32" if float32 else "bfloat16"},
                      hooked=hooked, computed_steps=computed_steps)
    diff = (tensors[case + ".latents"] - tensors[f"{family}_uncached.latents"]).abs().max().item()
    print(f"{case}: latents max |diff| from {family}_uncached's {diff:.6g}")
