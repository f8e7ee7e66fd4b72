"""The benchmarks' one reader of a dp-launch job's `--progress json` output (stdlib only)."""
import json
import sys


def summary_of(proc):
    """The summary event dp-launch printed last on stdout (`proc`: a finished subprocess.run with
    text output); ends the benchmark when there is none."""
    for line in reversed(proc.stdout.splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "summary":
            return event
    sys.exit("dp-launch printed no summary event:\n" + proc.stderr[-2000:])
