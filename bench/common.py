"""Helpers shared by the bench parts: this process's peak memory, a tiny-model folder, results.

Each part is a script that measures one side (or both, alternating) and writes one JSON
object to the file named by --result; bench/run.py starts the scripts and builds the table.
"""
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # fgrpo.py lives in the repository root


def _status_mb(field):
    """A field of /proc/self/status (VmRSS, VmHWM) in MiB."""
    kb = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)
    return int(kb) / 1024


class PeakRSS:
    """Peak resident memory of the work inside `with`, in MiB.

    torch's CPU tensors are allocated outside Python's heap, where tracemalloc cannot see
    them, so this reads the kernel's high-water mark (VmHWM: ru_maxrss of this process's own
    memory). Writing 5 to /proc/self/clear_refs (Linux >= 4.0) resets it on entry, so the peak
    covers only the work; where that fails, `reset` is False and the peak includes start-up.
    `increment` = peak - RSS on entry: what the work itself added. Ratios use the increment.
    """
    def __enter__(self):
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.reset = True
        except OSError:
            self.reset = False
        self.base = _status_mb("VmRSS")
        return self

    def __exit__(self, *exc):
        self.peak = _status_mb("VmHWM")
        self.increment = self.peak - self.base

    def as_dict(self):
        return {"peak_mb": self.peak, "base_mb": self.base, "increment_mb": self.increment,
                "peak_reset": self.reset}


def timed(fn, *args, **kwargs):
    """(fn's result, wall seconds)."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def median(xs):
    return statistics.median(xs)


def save_tiny(folder, seed=0, warm_steps=150, max_positions=None):
    """fgrpo's tiny demo model (after its supervised warm start) and tokenizer, as an HF folder
    that vLLM, TRL and from_pretrained all load: every part starts from the same weights.
    warm_steps=0 keeps the random initialisation, whose samples run long (the end token has
    probability about 1/34 per step); max_positions raises the demo's 64-position limit."""
    import fgrpo
    model, tok, _, _ = fgrpo.build_tiny(seed, warm_steps)
    if max_positions:  # rotary position embeddings are computed, not learned: any length works
        model.config.max_position_embeddings = max_positions
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def write_result(path, result):
    Path(path).write_text(json.dumps(result, indent=1))
