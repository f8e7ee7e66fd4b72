"""What the side-by-side benchmarks against diffusers share: running one side in its own process,
keeping the faster of several runs by its median step, and printing the table with the C++ /
diffusers ratios."""
import json
import math
import os
import statistics
import subprocess
import sys


# The script each benchmark runs diffusers in, in its own process, is IMPORTS, the benchmark's own
# import of its pipeline class and load (setting t1 after the import and t2 after the load), then
# STEP_MARKS, its call between `start = ...` and `end = ...` with callback_on_step_end=on_step, and
# TIMINGS, which prints the JSON line run_json reads.
IMPORTS = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch
"""
STEP_MARKS = r"""
marks = []
def on_step(pipe, i, t, kw):
    marks.append(time.perf_counter())
    return kw
"""
TIMINGS = r"""
first = marks[0] - start  # includes prompt encoding, as the C++ figure does
steps_ms = [first * 1e3] + [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "load_ms": (t2 - t1) * 1e3, "step_ms": steps_ms,
                  "generate_ms": (end - start) * 1e3, "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "threads": torch.get_num_threads()}))
"""


def check_names(names, configs):
    """Exits naming the accepted configs when one of `names` is not among them."""
    for n in names:
        if n not in configs:
            sys.exit(f"unknown config {n!r}; accepted: {', '.join(configs)}")


def transformer_params(folder):
    """Parameters of a folder's transformer/diffusion_pytorch_model.safetensors."""
    from safetensors import safe_open
    path = os.path.join(folder, "transformer", "diffusion_pytorch_model.safetensors")
    with safe_open(path, "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def median_step(run):
    """The median denoising step in ms, the first (which includes prompt encoding) left out."""
    return statistics.median(run["step_ms"][1:] or run["step_ms"])


def best(runs):
    return min(runs, key=median_step)


def side_by_side(runs, cpp, ref):
    """Each side `runs` times, one after the other; the faster run of each: (C++, diffusers)."""
    c, r = [], []
    for _ in range(runs):
        c.append(cpp())
        r.append(ref())
    return best(c), best(r)


def run_json(args, who):
    """Runs one side; its last stdout line is its JSON timings. Exits naming `who` on failure."""
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{who} failed ({' '.join(args[:3])} ...):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_rows(rows, name_width=12):
    """rows: (config name, transformer parameters, image side, C++ run, diffusers run)."""
    w = name_width
    print(f"{'config':<{w}}{'transformer':>12}{'size':>6} | {'':>9}{'load':>10}{'step (median)':>15}{'peak RSS':>11}")
    for name, params, size, c, r in rows:
        for who, x in (("C++", c), ("diffusers", r)):
            print(f"{name:<{w}}{params/1e6:>10.2f} M{size:>6} | {who:>9}{x['load_ms']:>8.1f}ms{median_step(x):>13.1f}ms"
                  f"{x['peak_rss_kb']/1024:>8.0f} MB")
        print(f"{name:<{w}}{'':>12}{'':>6} | {'ratio':>9}{c['load_ms']/r['load_ms']:>9.2f}x"
              f"{median_step(c)/median_step(r):>14.2f}x{c['peak_rss_kb']/r['peak_rss_kb']:>10.2f}x"
              "   (C++ / diffusers; below 1 is faster)")
    print("diffusers' load excludes `import torch, diffusers` (measured separately: "
          f"{statistics.median([r['import_ms'] for *_, r in rows]):.0f} ms); "
          f"threads: C++ {rows[0][3]['threads']}, torch {rows[0][4]['threads']}")
