"""Table 1 in one command: the base model evaluated; GRPO, F-GRPO, DAPO, F-DAPO, CISPO and F-CISPO
trained with fgrpo.py at the paper's settings, each last checkpoint evaluated with eval.py, each
F-run tested against its base run with eval.py --compare; the table laid out as the paper's
Table 1 (arXiv 2602.06717: pass@1 / pass@256 per benchmark and over the six math benchmarks).

    python experiments/table1.py --plan              # the stages, their commands and an estimate
    python experiments/table1.py                     # the campaign on a GPU node; again: resumes
    python experiments/table1.py --model tiny        # the same pipeline offline on a CPU: minutes
    python experiments/table1.py --only dapo,f-dapo --train-flags "--epochs 1" --eval-flags "--n 64"
    python experiments/table1.py --table             # the table again, from the evaluation folders

Every stage is a subprocess through fgrpo.py's and eval.py's command lines, one after the other,
each printed before it starts. Killed and run again with the same flags, the campaign skips the
finished stages (WORK/stages/ records each stage's command and whether it finished), continues a
training from its last checkpoint (fgrpo.py --resume) and an evaluation where it stopped (eval.py
resumes by itself). A training or evaluation started with another command is refused: its
folder holds that run. SIGTERM is passed on to the running stage (fgrpo.py saves where a save is
due or fits in its --grace), and the campaign stops.

With --model tiny, fgrpo.build_tiny(seed)'s base model is saved as an HF folder with its task's
2,000 training and 64 held-out problems, which stand in for the benchmarks (eval.py --data).
The runs train from that folder with fgrpo.py's tiny settings (fgrpo.TINY), fewer steps.

WORK holds: tiny/seedS/ (tiny only), RUN/seedS/train (fgrpo.py --out), RUN/seedS/eval (eval.py
--out), compare/ALGO/seedS/compare.json, stages/, and the table: table1.md, table1.json and
table1_passk_ALGO.png (with matplotlib).
"""
import argparse
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Run(NamedTuple):
    label: str  # as the paper's Table 1 names it
    algo: str | None  # fgrpo.py --algo; None: the base model, evaluated only
    focal: bool  # gamma: fgrpo.py's default, the paper's (Table 7); else --gamma 0


RUNS = {"base": Run("base model", None, False),
        "grpo": Run("GRPO", "grpo", False), "f-grpo": Run("F-GRPO", "grpo", True),
        "dapo": Run("DAPO", "dapo", False), "f-dapo": Run("F-DAPO", "dapo", True),
        "cispo": Run("CISPO", "cispo", False), "f-cispo": Run("F-CISPO", "cispo", True)}
PAIRS = {"grpo": ("grpo", "f-grpo"), "dapo": ("dapo", "f-dapo"), "cispo": ("cispo", "f-cispo")}
# the paper's Table 1, Qwen2.5-7B, N = 8, mean over the six math benchmarks, pass@1 / pass@256 (%)
PAPER = {"grpo": (37.3, 64.1), "f-grpo": (38.6, 70.3), "dapo": (39.4, 69.3),
         "f-dapo": (40.5, 72.5), "cispo": (39.5, 73.2), "f-cispo": (39.5, 76.8)}
PAPER_K = 256
# --model tiny: fgrpo.TINY's settings but fewer steps, and 256 samples per held-out problem
TINY_STEPS = 40
TINY_SAVE_EVERY = 20
TINY_EVAL_N = 256

# The estimate's inputs, from docs/paper-run.md (8 x H100, Qwen2.5-7B; arithmetic, not measured)
PLAN_PARAMS_B = 7.6  # billions of parameters behind its figures
PLAN_STEP_MIN = (4, 6)  # minutes per step on 8 GPUs, 256 prompts x 8 completions
PLAN_GPUS = 8
PLAN_TOKENS = (1000, 3000)  # tokens per completion
PLAN_DECODE = (4300, 2800)  # vLLM tokens/s a GPU: its rollout, 256 x 1-3k tokens in 1.5-3 min
PLAN_CKPT_BYTES = 12  # per parameter: fp32 model (30 GB) and AdamW state (61 GB) for 7.6B
DEEPSCALER = 39_202  # App. L: problems left after the paper's filter
PARAMS_B = {"Qwen/Qwen2.5-7B": 7.6, "Qwen/Qwen3-4B-Base": 4.0,
            "meta-llama/Llama-3.2-3B-Instruct": 3.2}  # the paper's three models
BENCH_SIZES = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272,
               "olympiadbench": 675, "gpqa_diamond": 198}  # docs/eval.md
SIX_MATH = "math500,aime24,aime25,amc23,minerva,olympiadbench"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--model", default="Qwen/Qwen2.5-7B", help="the base model (HF id or folder) for fgrpo.py "
      "and eval.py (default: the paper's Qwen/Qwen2.5-7B); 'tiny': the offline CPU pipeline")
    a("--work", type=Path, help="folder of every run, evaluation and the table "
      "(default: runs/table1, or runs/table1-tiny for --model tiny)")
    a("--only", metavar="RUNS", help=f"comma-separated runs to run, from: {', '.join(RUNS)} "
      "(default: all)")
    a("--skip", metavar="RUNS", help="comma-separated runs not to run")
    a("--seeds", default="0", help="comma-separated seeds: each run trained and evaluated per "
      "seed (default: 0)")
    a("--train-flags", default="", metavar="FLAGS", help="extra flags for fgrpo.py, one quoted "
      "string, e.g. \"--epochs 1 --max-new-tokens 4096\"; a single flag: "
      "--train-flags=--keep-weights")
    a("--eval-flags", default="", metavar="FLAGS", help="extra flags for eval.py's sampling, "
      "e.g. \"--n 256 --benchmarks math500,aime24\"")
    a("--compare-flags", default="", metavar="FLAGS", help="extra flags for eval.py --compare, "
      "e.g. \"--iters 5000\" or \"--test subsampling\" (the paper's App. Q test)")
    a("--params-b", type=float, metavar="B", help="billions of parameters, for the estimate of a "
      f"model it does not know (it knows {', '.join(PARAMS_B)})")
    a("--plan", action="store_true", help="print the plan and the estimate, run nothing")
    a("--table", action="store_true", help="only build the table from WORK's evaluation folders")
    args = p.parse_args(argv)
    args.work = args.work or Path("runs/table1-tiny" if args.model == "tiny" else "runs/table1")
    args.selected = selected_runs(p, args.only, args.skip)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds takes comma-separated integers, got {args.seeds!r}")
    refused = {"train_flags": ("--model", "--algo", "--out", "--resume", "--seed"),
               "eval_flags": ("--model", "--out", "--seed", "--compare"),
               "compare_flags": ("--compare", "--out")}
    for name, flags in refused.items():
        setattr(args, name, split_flags(p, name, getattr(args, name), flags))
    return args


def selected_runs(parser, only, skip):
    """The runs --only and --skip leave, in Table 1's order; an unknown name: argparse error."""
    chosen = list(RUNS)
    for flag, value in (("--only", only), ("--skip", skip)):
        names = [x.strip() for x in value.split(",")] if value else []
        unknown = [x for x in names if x not in RUNS]
        if unknown:
            parser.error(f"{flag}: unknown run '{unknown[0]}'; runs: {', '.join(RUNS)}")
        if names and flag == "--only":
            chosen = [x for x in chosen if x in names]
        if flag == "--skip":
            chosen = [x for x in chosen if x not in names]
    return chosen


def split_flags(parser, name, text, refused):
    """A pass-through string as a list of words; flags this script sets itself are refused."""
    flag = "--" + name.replace("_", "-")
    try:
        words = shlex.split(text)
    except ValueError as e:
        parser.error(f"{flag}: {e}")
    for word in words:
        if word.split("=")[0] in refused:
            parser.error(f"{flag}: {word.split('=')[0]} is set by table1.py for every stage")
    return words


def peek(words, names, cast, default):
    """A flag's last value among pass-through words (the one argparse keeps), or the default."""
    value = default
    for i, word in enumerate(words):
        key, _, attached = word.partition("=")
        if key in names and (attached or i + 1 < len(words)):
            raw = attached or words[i + 1]
            try:
                value = cast(raw)
            except ValueError:
                sys.exit(f"error: {key} {raw}: not an integer")  # int is the only cast that fails
    return value


# ---------------------------------------------------------------- the stages and their commands
class Stage(NamedTuple):
    name: str  # also its file in WORK/stages/
    kind: str  # tiny | train | eval | compare
    run: str  # the run it belongs to (compare: the pair's F-run; tiny: "tiny", for all runs)
    seed: int
    cmd: list  # "python" is this interpreter; "<latest>" the checkpoint that training left
    out: Path  # the folder it fills
    inputs: tuple = ()  # compare: the two evaluation folders


def script(name):  # fgrpo.py or eval.py, as a path from where this runs
    return os.path.relpath(ROOT / name)


def tiny_flags(args, seed, kind):
    """--model tiny: the flags that make fgrpo.py or eval.py use the saved base and its task."""
    if args.model != "tiny":
        return []
    folder = args.work / "tiny" / f"seed{seed}"
    settings = dict(args.tiny_settings, steps=TINY_STEPS, save_every=TINY_SAVE_EVERY)
    if kind == "train":  # fgrpo.TINY's settings, as fgrpo.py --model tiny uses them; transformers
        pairs = [(k, v) for k, v in settings.items() if k != "out"] + [("rollout", "hf")]
        return ["--data", str(folder / "train.jsonl")] + \
            [w for k, v in pairs for w in (f"--{k.replace('_', '-')}", str(v))]
    return ["--data", str(folder / "held_out.jsonl"), "--n", str(TINY_EVAL_N), "--max-new-tokens",
            str(settings["max_new_tokens"]), "--gen-batch", str(TINY_EVAL_N), "--rollout", "hf"]


def base_model(args, seed):
    return str(args.work / "tiny" / f"seed{seed}" / "model") if args.model == "tiny" else args.model


def run_stages(args, seed):
    """One seed's stages, in running order: [tiny base], base eval, then per pair: train, eval of
    the base run and of the F-run, and their --compare."""
    work = args.work
    stages = []
    if args.model == "tiny":
        folder = work / "tiny" / f"seed{seed}"
        stages.append(Stage(f"tiny/seed{seed}", "tiny", "tiny", seed, [], folder))
    for run, spec in RUNS.items():
        folder = work / run / f"seed{seed}"
        model = base_model(args, seed)
        if spec.algo:
            gamma = [] if spec.focal else ["--gamma", "0"]
            cmd = ["python", script("fgrpo.py"), *tiny_flags(args, seed, "train"),
                   *args.train_flags, "--model", model, "--algo", spec.algo, *gamma,
                   "--seed", str(seed), "--out", str(folder / "train")]
            train = Stage(f"{run}/seed{seed}/train", "train", run, seed, cmd, folder / "train")
            stages.append(train)
            model = str(folder / "train" / "<latest>")
        cmd = ["python", script("eval.py"), *tiny_flags(args, seed, "eval"), *args.eval_flags,
               "--model", model, "--seed", str(seed), "--out", str(folder / "eval")]
        stages.append(Stage(f"{run}/seed{seed}/eval", "eval", run, seed, cmd, folder / "eval"))
        if spec.focal:
            stages.append(compare_stage(args, seed, spec.algo))
    return stages


def compare_stage(args, seed, algo):
    base = args.work / PAIRS[algo][0] / f"seed{seed}" / "eval"
    focal = args.work / PAIRS[algo][1] / f"seed{seed}" / "eval"
    out = args.work / "compare" / algo / f"seed{seed}"
    cmd = ["python", script("eval.py"), "--compare", str(base), str(focal), *args.compare_flags,
           "--out", str(out)]
    return Stage(f"compare/{algo}/seed{seed}", "compare", PAIRS[algo][1], seed, cmd, out,
                 (base, focal))


# ---------------------------------------------------------------- the estimate: docs/paper-run.md
class Cost(NamedTuple):
    gpu_hours: tuple  # (low, high)
    disk_gb: float  # what the stage leaves on disk
    peak_gb: float  # more, for a while: a checkpoint is written whole before the last is deleted


def estimate(stage, args):
    """A stage's Cost: docs/paper-run.md's arithmetic, scaled by model size, batch and samples;
    None where there is nothing to scale (tiny, compare) or the model's size is unknown."""
    params = args.params_b or PARAMS_B.get(args.model)
    if args.model == "tiny" or stage.kind not in ("train", "eval") or params is None:
        return None
    size = params / PLAN_PARAMS_B
    if stage.kind == "train":
        flags = args.train_flags
        prompts = peek(flags, ("--prompts",), int, 256)
        n = peek(flags, ("--n", "--group-size"), int, 8)
        epochs = peek(flags, ("--epochs",), int, 10)
        steps = peek(flags, ("--steps",), int, 0) or epochs * DEEPSCALER // prompts
        scale = size * prompts * n / (256 * 8)
        hours = tuple(steps * PLAN_GPUS * minutes / 60 * scale for minutes in PLAN_STEP_MIN)
        return Cost(hours, PLAN_CKPT_BYTES * params, PLAN_CKPT_BYTES * params)
    names = peek(args.eval_flags, ("--benchmarks",), str, SIX_MATH).split(",")
    problems = sum(BENCH_SIZES.get(x, 0) for x in names)
    completions = problems * peek(args.eval_flags, ("--n", "--samples"), int, 1024)
    hours = tuple(completions * t / (r / size) / 3600 for t, r in zip(PLAN_TOKENS, PLAN_DECODE))
    return Cost(hours, completions * PLAN_TOKENS[1] * 4 / 1e9, 0.0)  # ~4 bytes of JSON a token


def print_plan(stages, args):
    """Each stage: its state, name, estimate and command; then the campaign's estimate."""
    print(f"Table 1 campaign in {args.work}: {len(stages)} stages, in this order")
    costs = []
    for stage in stages:
        state = status(stage, args)
        cost = estimate(stage, args)
        note = ""
        if cost:
            low, high = cost.gpu_hours
            note = f"  [~{low:,.0f}-{high:,.0f} GPU-h, ~{cost.disk_gb:,.0f} GB on disk]"
        print(f"  {state:7} {stage.name}{note}")
        what = "save fgrpo.build_tiny(seed): model/, train.jsonl, held_out.jsonl (in this process)"
        print(f"          {what if stage.kind == 'tiny' else shlex.join(stage.cmd)}")
        costs += [cost] if cost and state not in ("done", "skip") else []
    if args.model == "tiny":
        print("estimate: CPU only, minutes on 2 cores (README); no GPU-hours")
    elif args.params_b or args.model in PARAMS_B:
        low = sum(c.gpu_hours[0] for c in costs)
        high = sum(c.gpu_hours[1] for c in costs)
        disk = sum(c.disk_gb for c in costs)
        peak = max([c.peak_gb for c in costs] or [0])
        print(f"estimate for the stages left, not a measurement: ~{low:,.0f}-{high:,.0f} GPU-hours "
              f"and ~{disk:,.0f} GB of disk (~{peak:,.0f} GB more while a checkpoint is saved), "
              "scaled from docs/paper-run.md (8 x H100, Qwen2.5-7B, 1,000-3,000 tokens a "
              "completion)")
        print(f"wall-clock: ~{low / 8 / 24:,.0f}-{high / 8 / 24:,.0f} days on one 8-GPU node, "
              "about that over N on N nodes if a step scales with the GPUs (stages run one by one)")
    else:
        print(f"estimate: pass --params-b for {args.model}, whose size this script does not know")


# ---------------------------------------------------------------- running the stages
def marker(stage, args):
    return args.work / "stages" / (stage.name.replace("/", "_") + ".json")


def resolved(stage):
    """The command with <latest> replaced by the checkpoint that training named in OUT/latest."""
    out = []
    for word in stage.cmd:
        if "<latest>" in word:
            train = Path(word).parent
            if not (train / "latest").exists():
                sys.exit(f"error: {stage.name}: {train} holds no checkpoint: train it first")
            word = str(train / (train / "latest").read_text().strip())
        out.append(word)
    return out


def status(stage, args):
    """done | resume | run | skip (not selected) | wait (compare: an evaluation is missing)."""
    if stage.kind == "tiny":  # every run starts from it
        return "done" if stage.out.exists() else "run"
    if stage.run not in args.selected:
        return "skip"
    if stage.kind == "compare":  # after both evaluations; "wait": one is neither there nor selected
        results = [d / "results.json" for d in stage.inputs]
        if not all(r.exists() for r in results):
            pair = PAIRS[RUNS[stage.run].algo]
            return "run" if all(run in args.selected for run in pair) else "wait"
    state = json.loads(marker(stage, args).read_text()) if marker(stage, args).exists() else {}
    if stage.kind == "compare":  # done: with the same command, since both evaluations last changed
        saved = stage.out / "compare.json"
        fresh = saved.exists() and all(saved.stat().st_mtime >= r.stat().st_mtime for r in results)
        return "done" if fresh and state.get("cmd", [])[2:] == stage.cmd[2:] else "run"
    if state.get("done"):
        return "done"
    started = (stage.out / "latest").exists() if stage.kind == "train" else \
        any(stage.out.glob("*.jsonl"))
    return "resume" if started else "run"


def save_tiny_base(stage):
    """fgrpo.py's own --model tiny set-up, fgrpo.prepare_tiny_demo: the tiny model as an HF folder
    and its training and held-out problems as JSONL, written whole or not at all."""
    sys.path.insert(0, str(ROOT))
    import fgrpo  # only --model tiny needs it in this process
    fgrpo.prepare_tiny_demo(argparse.Namespace(seed=stage.seed), stage.out)


def run_stage(stage, args, running):
    """Run one stage unless it is done; record its command, and that it finished when it exits 0."""
    state = status(stage, args)
    inputs_missing = not all((d / "results.json").exists() for d in stage.inputs)
    state = "wait" if stage.kind == "compare" and inputs_missing else state
    if state in ("done", "skip", "wait"):
        print(f"[{state}] {stage.name}", flush=True)
        return
    start = time.time()
    if stage.kind == "tiny":
        print(f"[run] {stage.name}: fgrpo.build_tiny({stage.seed}) -> {stage.out}", flush=True)
        save_tiny_base(stage)
    else:
        cmd = resolved(stage)
        record(stage, args, cmd, None)
        cmd = cmd + ["--resume"] if state == "resume" and stage.kind == "train" else cmd
        print(f"[{state}] {stage.name}: {shlex.join(cmd)}", flush=True)
        running.append(subprocess.Popen([sys.executable, *cmd[1:]]))
        code = running[-1].wait()
        running.pop()
        if code:
            sys.exit(f"error: {stage.name} stopped (exit code {code}); run the same command again "
                     "to continue from it")
        record(stage, args, resolved(stage), time.time() - start)
    print(f"[finished] {stage.name} in {time.time() - start:.0f} s", flush=True)


def record(stage, args, cmd, seconds):
    """WORK/stages/NAME.json: the stage's command, and the seconds of the run that finished it. A
    training or evaluation started with another command is refused: its folder holds that run."""
    path = marker(stage, args)
    recorded = json.loads(path.read_text())["cmd"] if path.exists() else cmd
    # the interpreter and the script's path (relative to where this runs) may differ, not the rest
    if recorded[2:] != cmd[2:] and stage.kind != "compare":  # a compare is redone, it is cheap
        sys.exit(f"error: {stage.name} was started as `{shlex.join(recorded)}`; it would now run "
                 f"`{shlex.join(cmd)}`: pass another --work, or delete {stage.out} and {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cmd": cmd, "done": seconds is not None, "seconds": seconds}))


# ---------------------------------------------------------------- the table
def collect(work):
    """{run: {seed: results.json}} and {algo: {seed: compare.json's results}} found under WORK."""
    evals = {}
    compares = {}
    for path in sorted(work.glob("*/seed*/eval/results.json")):
        run = path.parts[-4]
        seed = int(path.parts[-3][len("seed"):])
        if run in RUNS:
            evals.setdefault(run, {})[seed] = json.loads(path.read_text())
    for path in sorted(work.glob("compare/*/seed*/compare.json")):
        algo = path.parts[-3]
        seed = int(path.parts[-2][len("seed"):])
        if algo in PAIRS:
            compares.setdefault(algo, {})[seed] = json.loads(path.read_text())["results"]
    return evals, compares


def curve(results, column):  # {k: pass@k} of a benchmark or of an average ("math_avg")
    benchmarks = results["benchmarks"]
    table = benchmarks[column]["pass@k"] if column in benchmarks else results[column]
    return {int(k): v for k, v in table.items()}


def has(results, column):
    return column in results or column in results["benchmarks"]


def columns_and_k(evals, compares):
    """The benchmarks (then the averages) of the first evaluation, and the largest k <= 256 that
    every evaluation's pass@k and every --compare's k list hold: 256 where n and m allow it."""
    first = next(r for seeds in evals.values() for r in seeds.values())
    columns = list(first["benchmarks"]) + [x for x in ("math_avg", "ood_avg") if x in first]
    ks = {k for k in curve(first, columns[-1]) if k <= PAPER_K}
    for results in (r for seeds in evals.values() for r in seeds.values()):
        ks &= {k for x in columns if has(results, x) for k in curve(results, x)}
    for tests in (t for seeds in compares.values() for t in seeds.values()):
        ks &= {k for x in tests.values() for k in x["k"]}
    if not ks or 1 not in ks:
        sys.exit("error: the evaluations share no pass@k values: were they run with the same --n?")
    return columns, max(ks)


def interval(values):
    """Mean and the half-width of its 95% t-interval over seeds (None below 2 seeds)."""
    t975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
            9: 2.262}  # Student's t, 97.5% quantile by degrees of freedom
    mean = statistics.fmean(values)
    df = len(values) - 1
    if df < 1:
        return mean, None
    # beyond 9 degrees of freedom, Cornish-Fisher: t = z + (z^3 + z) / (4 df), 0.031 low at most
    t = t975.get(df, 1.96 + (1.96 ** 3 + 1.96) / (4 * df))
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def run_rows(evals, columns, ks):
    """Per run: each seed's pass@1 and pass@k_top per column, their mean, and the paper's."""
    rows = {}
    for run in (r for r in RUNS if r in evals):
        per_seed = {s: {x: {str(k): curve(res, x)[k] for k in ks} for x in columns if has(res, x)}
                    for s, res in evals[run].items()}
        mean = {x: {str(k): statistics.fmean(v[x][str(k)] for v in per_seed.values() if x in v)
                    for k in ks} for x in columns if any(x in v for v in per_seed.values())}
        paper = None
        if run in PAPER:
            paper = dict(zip(("1", str(PAPER_K)), (v / 100 for v in PAPER[run])))
        rows[run] = {"label": RUNS[run].label, "seeds": per_seed, "mean": mean,
                     "paper_math_avg": paper}
    return rows


def pair_rows(rows, compares, columns, ks):
    """Per pair: F-run minus base run per seed (paired), mean and 95% interval over seeds, p."""
    pairs = {}
    for algo, (base, focal) in PAIRS.items():
        if base not in rows or focal not in rows:
            continue
        seeds = sorted(set(rows[base]["seeds"]) & set(rows[focal]["seeds"]))
        out = {"runs": [base, focal], "seeds": seeds, "columns": {}}
        for x in columns:
            paired = [(s, rows[base]["seeds"][s].get(x), rows[focal]["seeds"][s].get(x))
                      for s in seeds]
            paired = [triple for triple in paired if triple[1] and triple[2]]
            if paired:
                out["columns"][x] = pair_column(paired, compares.get(algo, {}), x, ks)
        if base in PAPER:
            out["paper_math_avg"] = {k: (PAPER[focal][i] - PAPER[base][i]) / 100
                                     for i, k in enumerate(("1", str(PAPER_K)))}
        pairs[algo] = out
    return pairs


def pair_column(paired, compares, x, ks):
    """One benchmark or average x of a pair: [(seed, base run's figures, F-run's figures)] ->
    the differences per seed, their mean and interval, and --compare's p per seed (or None)."""
    delta = {str(k): [focal[str(k)] - base[str(k)] for _, base, focal in paired] for k in ks}
    tests = [compares.get(seed, {}).get(x) for seed, _, _ in paired]
    p = {str(k): [t["p"][t["k"].index(k)] if t else None for t in tests] for k in ks}
    mean = {k: interval(v) for k, v in delta.items()}
    return {"seeds": [seed for seed, _, _ in paired], "delta": delta, "mean": mean, "p": p}


def percent(value):
    return f"{100 * value:.1f}"


def signed(mean_and_half):
    mean, half = mean_and_half
    return f"{100 * mean:+.1f}" + ("" if half is None else f" ± {100 * half:.1f}")


def p_values(ps):
    return ", ".join(f"{p:.3f}" for p in ps if p is not None) or "-"


def markdown(table):
    """Table 1's layout: runs by benchmarks (pass@1 / pass@K), then F-run minus base run."""
    model = table["model"]
    model = "tiny (fgrpo.build_tiny, offline)" if model == "tiny" else model
    seeds = ", ".join(map(str, table["seeds"]))
    top = table["k"][-1]
    lines = [f"# Table 1: {model}", "",
             f"pass@1 / pass@{top} (%) of each run's last checkpoint (eval.py, n samples a "
             f"problem), mean over seeds {seeds}." + (f" {table['note']}" if table["note"] else ""),
             "",
             *run_lines(table), "", "## F-run minus base run", "",
             "Δ: the F-run minus its base run at the same seed, in points (mean ± 95% t-interval "
             "over seeds where there are several). p: eval.py --compare's two-sided p, one per "
             "seed (its default test, an exact per-problem permutation test, unless "
             "--compare-flags names another). It re-deals the two checkpoints' samples, so it "
             "speaks of sampling noise, not of a method across training seeds.", "",
             *pair_lines(table)]
    return "\n".join(lines) + "\n"


def run_lines(table):
    """A row per run: pass@1 / pass@K per column, and the paper's math average."""
    columns = table["columns"]
    top = str(table["k"][-1])
    names = " | ".join(x.replace("_", " ") for x in columns)
    lines = [f"| run | {names} | paper math avg (Qwen2.5-7B, pass@1 / pass@256) |",
             "|---" * (len(columns) + 2) + "|"]
    for row in table["runs"].values():
        cells = [f"{percent(row['mean'][x]['1'])} / {percent(row['mean'][x][top])}"
                 if x in row["mean"] else "-" for x in columns]
        paper = row["paper_math_avg"]
        cells.append(f"{percent(paper['1'])} / {percent(paper[str(PAPER_K)])}" if paper else "-")
        lines.append(f"| {row['label']} | {' | '.join(cells)} |")
    return lines


def pair_lines(table):
    """A row per pair and column: the difference and p at k = 1 and K, the paper's difference."""
    top = str(table["k"][-1])
    lines = [f"| pair | benchmark | Δ pass@1 | p | Δ pass@{top} | p | paper Δ math avg, 1 / 256 |",
             "|---" * 7 + "|"]
    for pair in table["pairs"].values():
        title = f"{RUNS[pair['runs'][1]].label} − {RUNS[pair['runs'][0]].label}"
        for x in (x for x in table["columns"] if x in pair["columns"]):
            column = pair["columns"][x]
            paper = pair.get("paper_math_avg") if x == "math_avg" else None
            cells = [title, x.replace("_", " "), signed(column["mean"]["1"]),
                     p_values(column["p"]["1"]), signed(column["mean"][top]),
                     p_values(column["p"][top]),
                     f"{100 * paper['1']:+.1f} / {100 * paper[str(PAPER_K)]:+.1f}" if paper else ""]
            lines.append("| " + " | ".join(cells) + " |")
            title = ""
    if not table["pairs"]:
        lines.append("| no pair has both runs evaluated yet | | | | | | |")
    return lines


def plot_pairs(evals, work):
    """WORK/table1_passk_ALGO.png: the math average's pass@k against k for the base model, the base
    run and the F-run (mean over seeds). Skipped, with a one-line note, without matplotlib."""
    try:
        import matplotlib.pyplot as plt  # without a display it draws with Agg
    except ImportError:
        print("note: pip install matplotlib to get the pass@k plots")
        return []
    paths = []
    for algo, runs in PAIRS.items():
        if not all(r in evals for r in runs):
            continue
        fig, ax = plt.subplots(figsize=(5.6, 3.8))
        for run in ("base", *runs):
            curves = [curve(r, "math_avg") for r in evals.get(run, {}).values()]
            ks = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            ax.plot(ks, [100 * statistics.fmean(c[k] for c in curves) for k in ks], "o-",
                    label=RUNS[run].label)
        ax.set_xscale("log", base=2)
        title = f"{RUNS[runs[1]].label} vs {RUNS[runs[0]].label}"
        ax.set(xlabel="k", ylabel="pass@k (%), math avg", title=title)
        ax.legend(fontsize=8)
        paths.append(work / f"table1_passk_{algo}.png")
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return paths


def build_table(args):
    """WORK/table1.md and WORK/table1.json from the evaluation and --compare folders under WORK."""
    evals, compares = collect(args.work)
    if not evals:
        sys.exit(f"error: {args.work} holds no evaluation yet (RUN/seedS/eval/results.json)")
    columns, top = columns_and_k(evals, compares)
    ks = [1, top]
    first = next(iter(next(iter(evals.values())).values()))
    n = min(min(b["samples"]) for seeds in evals.values() for r in seeds.values()
            for b in r["benchmarks"].values())
    note = ""
    if top != PAPER_K:
        note = (f"pass@{top} stands in for the paper's pass@256: n = {n} samples a problem "
                "(and --compare's m under --test subsampling) allow no larger k.")
    rows = run_rows(evals, columns, ks)
    campaign = args.work / "campaign.json"
    model = json.loads(campaign.read_text())["model"] if campaign.exists() else first["model"]
    table = {"model": model, "work": str(args.work), "k": ks, "n_min": n, "note": note,
             "seeds": sorted({s for seeds in evals.values() for s in seeds}), "columns": columns,
             "runs": rows, "pairs": pair_rows(rows, compares, columns, ks)}
    text = markdown(table)
    (args.work / "table1.md").write_text(text)
    (args.work / "table1.json").write_text(json.dumps(table, indent=1))
    plots = plot_pairs(evals, args.work)
    print(text)
    print(f"written: {args.work / 'table1.md'}, {args.work / 'table1.json'}"
          + "".join(f", {p}" for p in plots))
    return table


# ---------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    if args.table:
        return build_table(args)
    if args.model == "tiny":
        sys.path.insert(0, str(ROOT))
        import fgrpo  # its tiny settings: one source of truth
        args.tiny_settings = fgrpo.TINY
    stages = [stage for seed in args.seeds for stage in run_stages(args, seed)]
    print_plan(stages, args)
    if args.plan:
        return None
    args.work.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(args, k) for k in ("model", "seeds", "train_flags", "eval_flags",
                                               "compare_flags")}
    (args.work / "campaign.json").write_text(json.dumps(settings, indent=1))  # for the table
    running = []  # the running stage's process
    signal.signal(signal.SIGTERM, lambda *_: stop(running))
    for stage in stages:
        run_stage(stage, args, running)
    return build_table(args)


def stop(running):
    """SIGTERM: passed on to the running stage, whose exit then ends the campaign (fgrpo.py saves
    if due or within its --grace); between stages, or while the tiny base is saved, it ends now."""
    if not running:
        sys.exit("stopped by SIGTERM; run the same command again to continue")
    running[-1].send_signal(signal.SIGTERM)


if __name__ == "__main__":
    main()
