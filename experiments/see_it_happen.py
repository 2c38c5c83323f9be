"""See it happen: F-GRPO against its base algorithm, through fgrpo.py's own training loop, on a CPU.

The paper's claim (arXiv 2602.06717, Sec. 3-4, App. J): group-relative RL sharpens onto the correct
answers the policy already samples and loses the rare ones, so pass@k at large k falls while pass@1
rises; the focal weight g = (1 - X/N)^gamma keeps more of that coverage. Here it is measured on a
policy whose whole answer space can be enumerated.

    python experiments/see_it_happen.py              # the grid: 3 algos x (gamma 0, paper's gamma,
                                                     # gamma 0 at lr x focal_mean) x 3 seeds: 20 min on 2 busy cores
    python experiments/see_it_happen.py --quick      # DAPO only, 1 seed, 8 steps: under a minute
    python experiments/see_it_happen.py --seeds 1 --algos cispo --n 16 --prompts 16 --mini-batch 4

Task (built in code, offline): fgrpo.build_tiny's 2-layer Qwen2 and byte-level BPE tokenizer, warm
started (supervised, --warm-steps) to answer "\\boxed{d}" with a skewed prior over the ten digits
(--prior): digit 0 is the "heuristic" the base model samples most, digits 3-9 a few % each. Each
problem is a list of digits "(d1,...,d5)=" with an answer SET that the prompt does not reveal:
  common: {0}                   the heuristic solves it (high success rate: F down-weights it)
  multi:  {0, r1, r2}           a common and two rare correct answers coexist (M_ret watches r1, r2)
  rare:   {r}                   one rare correct answer: solved only by sampling it
(r, r1, r2 drawn from --rare-digits, 7-9). As the policy cannot tell the kinds apart, "always 0" is
the best pass@1 policy, and keeping 7-9 is what pass@k at large k needs: the paper's trade-off in
ten actions, behind a real transformer whose parameters all problems share. The answer space is
enumerated (answer_completions: "\\boxed{d}" then <eos>, and the stutter "\\boxed\\boxed{d}" a
trained policy picks up), so every answer's probability is exact, by fgrpo.token_logprobs.

Training is fgrpo.train itself (its optimiser, scheduler, run_step, checkpoints) on `--model tiny`'s
settings, with two documented patches of fgrpo's module attributes: load_policy returns this task's
model and problems, and run_step is wrapped to measure the exact answer probabilities every
--measure-every steps (into metrics.jsonl). Rewards and eval.py's scores come from answer_set_verify
(put in place of fgrpo.verify): 1 if the last \\boxed{...} holds a member of the problem's answer
set, written "0, 4, 7" (math-verify would compare sets, not membership). eval.py samples with
transformers (vLLM hidden from it: a tiny model does not need an engine start per arm).

Arms, per seed and algo (same steps, same sampling seeds, same base model): gamma 0; the paper's
gamma (fgrpo.PAPER_GAMMA); gamma 0 at lr x the F-run's mean focal_mean ("lr-scaled"), so the
focal reweighting can be told apart from a smaller step. Measured on the held-out problems:
exact correct mass, M_ret (SPEC Sec. 7, over the correct answers with pi_0(a) < --rare-below), and
eval.py's pass@k (n = --eval-n) and its paired --compare test, gamma 0 vs F, per seed.
"""
import argparse
import contextlib
import copy
import importlib
import json
import math
import os
import random
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import eval as evaluator  # noqa: E402  (eval.py; the alias keeps the builtin eval)
import fgrpo  # noqa: E402

DIGITS = [str(d) for d in range(10)]
KINDS = {"common": 0.5, "multi": 0.25, "rare": 0.25}  # share of the training problems


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--algos", nargs="+", default=["dapo", "grpo", "cispo"], choices=sorted(fgrpo.PAPER_EPS), help="base algorithms")
    a("--seeds", type=int, default=3, help="seeds 0..S-1: base model, data order and sampling")
    a("--steps", type=int, default=30, help="rollout steps of every arm")
    a("--lr", type=float, default=3e-5, help="AdamW lr of the gamma-0 and F arms; --model tiny's 3e-4 "
      "collapses every arm onto the common answer within 8 steps, 1e-4 within 30")
    a("--n", type=int, default=8, help="group size N")
    a("--prompts", type=int, default=32, help="prompts per rollout batch")
    a("--mini-batch", type=int, default=8, help="prompts per optimiser step (--model tiny's)")
    a("--prior", type=float, nargs=3, default=[0.55, 0.15, 0.10],
      help="warm-start mass of digits 0, 1, 2; digits 3-9 share the rest equally")
    a("--warm-steps", type=int, default=150, help="supervised warm-start steps of the base model")
    a("--rare-digits", default="789", help="the digits rare answers are drawn from (all rare under --prior)")
    a("--train-problems", type=int, default=2000, help="training problems, kinds drawn with the KINDS shares")
    a("--heldout", type=int, default=96, help="held-out problems, a third of each kind")
    a("--rare-below", type=float, default=0.1, help="M_ret counts correct answers with pi_0(a) below this")
    a("--measure-every", type=int, default=5, help="exact answer probabilities every K steps")
    a("--eval-n", type=int, default=64, help="eval.py's samples per held-out problem")
    a("--compare-m", type=int, default=32, help="eval.py --compare's --m (below --eval-n)")
    a("--compare-iters", type=int, default=20_000, help="eval.py --compare's --iters")
    a("--threads", type=int, default=1, help="torch CPU threads")
    a("--work", type=Path, default=ROOT / "runs" / "see_it_happen", help="checkpoints and eval folders")
    a("--out", type=Path, default=ROOT / "experiments" / "results", help="results folder")
    a("--name", default="see_it_happen", help="prefix of the result files")
    a("--quick", action="store_true", help="smoke run: dapo, 1 seed, 8 steps, 24 held-out, n 16")
    args = p.parse_args(argv)
    if args.quick:
        args.algos, args.seeds, args.steps, args.heldout, args.eval_n = ["dapo"], 1, 8, 24, 16
        args.compare_m, args.compare_iters, args.warm_steps, args.measure_every = 8, 2000, 100, 4
        args.train_problems, args.name = 200, args.name + "_quick"
    if not 1 <= args.compare_m < args.eval_n:
        p.error(f"--compare-m must be at least 1 and below --eval-n {args.eval_n}")
    if sum(args.prior) >= 1 or min(args.prior) < 0:
        p.error("--prior: three masses >= 0 summing below 1")
    return args


# ---------------------------------------------------------------- the task
def make_problems(count, rng, rare_digits, balanced=False):
    """[{problem, answer, kind}]: a digit list as the prompt, an answer set as "0, 7, 9". Kinds are
    drawn with the KINDS shares, or (balanced, the held-out set) a third each, in turn."""
    kinds = [list(KINDS)[i % 3] for i in range(count)] if balanced else \
        rng.choices(list(KINDS), list(KINDS.values()), k=count)
    out = []
    for kind in kinds:
        digits = rng.sample(range(10), 5)
        rare = rng.sample(rare_digits, min(2, len(rare_digits)))
        answers = {"common": ["0"], "multi": ["0", *sorted(rare)], "rare": rare[:1]}[kind]
        out.append({"problem": f"({','.join(map(str, digits))})=", "answer": ", ".join(answers), "kind": kind})
    return out


def answer_set_verify(completions, golds, timeout=None):
    """Stands in for fgrpo.verify: 1.0 where the completion's last \\boxed{...} is one of the
    comma-separated answers of its gold, else 0.0 (exact string match after strip)."""
    scores = []
    for text, gold in zip(completions, golds):
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
        scores.append(float(bool(boxed) and boxed[-1].strip() in {a.strip() for a in gold.split(",")}))
    return scores


def build_base(seed, prior, warm_steps, problems):
    """fgrpo.build_tiny's model and tokenizer, warm started on "\\boxed{d}" with d ~ prior (any prompt)."""
    model, tok, _, _ = fgrpo.build_tiny(seed, warm_steps=0)  # seeds torch: the same init per seed
    rng = random.Random(seed)
    weights = [*prior] + [(1 - sum(prior)) / 7] * 7
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)  # build_tiny's warm start, another target
    for _ in range(warm_steps):
        pairs = [(prompt_ids(tok, rng.choice(problems)), answer_ids(tok, rng.choices(DIGITS, weights)[0]))
                 for _ in range(64)]
        ids, attn, mask = fgrpo.collate(pairs, tok.pad_token_id)
        loss = -(fgrpo.token_logprobs(model, ids, attn) * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


def prompt_ids(tok, problem):  # as fgrpo.rollout tokenises a prompt
    return tok(fgrpo.format_prompt(tok, problem["problem"]), add_special_tokens=False).input_ids


def answer_ids(tok, digit):
    return tok(f"\\boxed{{{digit}}}", add_special_tokens=False).input_ids + [tok.eos_token_id]


# ---------------------------------------------------------------- exact measurement (App. J's quantities)
def answer_completions(tok, digit, max_new=fgrpo.TINY["max_new_tokens"]):
    """The completions, as sampled under --max-new-tokens, whose answer is `digit`: "\\boxed{d}", and the
    stutter "\\boxed\\boxed{d}" (a trained policy samples it), each then <eos>, and the longest repeat cut
    at the length cap without <eos>. Disjoint token sequences, so their probabilities add."""
    seqs = []
    for r in range(1, max_new):
        ids = tok("\\boxed" * r + f"{{{digit}}}", add_special_tokens=False).input_ids
        if len(ids) > max_new:
            break
        seqs.append(ids + [tok.eos_token_id] if len(ids) < max_new else ids)
    return seqs


@torch.no_grad()
def answer_probs(model, tok, problems):
    """(P, 10): pi(a completion of answer_completions(d) | prompt) for every digit d, exactly, by teacher
    forcing. Completions outside that list (another tokenisation, text before the box) are not counted:
    a row sums to at most 1, and 1 - its sum is reported as the unlisted mass."""
    seqs = [answer_completions(tok, d) for d in DIGITS]
    pairs = [(prompt_ids(tok, p), s) for p in problems for ss in seqs for s in ss]
    ids, attn, mask = fgrpo.collate(pairs, tok.pad_token_id)
    probs = (fgrpo.token_logprobs(model, ids, attn, mask=mask) * mask).sum(-1).exp()
    digit = torch.tensor([d for d, ss in enumerate(seqs) for _ in ss] * len(problems))
    problem = torch.arange(len(problems)).repeat_interleave(sum(map(len, seqs)))
    return torch.zeros(len(problems), len(DIGITS)).index_put_((problem, digit), probs, accumulate=True)


def correct_mask(problems):
    """(P, 10) bool: which digits are correct answers of each problem."""
    return torch.tensor([[d in p["answer"].split(", ") for d in DIGITS] for p in problems])


def mass_and_retention(p0, pt, correct, rare_below):
    """Mean total correct mass of pt, and M_ret (SPEC Sec. 7) pooled over the (problem, answer)
    pairs that are correct and had pi_0 below rare_below:
    M_ret = 1 - sum max(0, pi_0(a) - pi_T(a)) / sum pi_0(a)."""
    rare = correct & (p0 < rare_below)
    lost = (p0 - pt).clamp(min=0)[rare].sum()
    return float((pt * correct).sum(-1).mean()), float(1 - lost / p0[rare].sum())


# ---------------------------------------------------------------- one arm: fgrpo.train, then eval.py
def train_arm(base, tok, train_set, heldout, p0, arm, args, seed):
    """fgrpo.train on a copy of the base model; returns (metrics rows, final checkpoint folder)."""
    out = args.work / f"seed{seed}" / arm["name"]
    shutil.rmtree(out, ignore_errors=True)  # fgrpo.train refuses a folder that holds a run
    targs = fgrpo.parse_args(["--model", "tiny", "--algo", arm["algo"], "--gamma", str(arm["gamma"]),
                              "--lr", repr(arm["lr"]), "--n", str(args.n), "--prompts", str(args.prompts),
                              "--mini-batch", str(args.mini_batch), "--steps", str(args.steps),
                              "--save-every", str(args.steps), "--seed", str(seed), "--rollout", "hf",
                              "--out", str(out)])
    correct = correct_mask(heldout)
    run_step = fgrpo.run_step

    def measured_step(model, *rest):  # fgrpo.run_step, then the exact probabilities every K steps
        m = run_step(model, *rest)
        step = rest[-1]
        if step % args.measure_every == 0 or step == args.steps:
            mass, m_ret = mass_and_retention(p0, answer_probs(model, tok, heldout), correct, args.rare_below)
            m.update(correct_mass=mass, m_ret=m_ret)
        return m

    patches = {"load_policy": lambda *_: (copy.deepcopy(base), tok, train_set, []), "run_step": measured_step}
    saved = {k: getattr(fgrpo, k) for k in patches}
    out.mkdir(parents=True)
    try:
        vars(fgrpo).update(patches)
        with open(out / "train.log", "w") as log, contextlib.redirect_stdout(log):
            fgrpo.train(targs)
    finally:
        vars(fgrpo).update(saved)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, out / f"step_{args.steps:06d}"


def evaluate_arm(ckpt, data, out, args, seed):
    """eval.py's CLI in-process: n samples per held-out problem -> its results.json."""
    shutil.rmtree(out, ignore_errors=True)  # eval.py resumes what a folder holds: another run's samples
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        return evaluator.main(["--model", str(ckpt), "--data", str(data), "--out", str(out),
                               "--n", str(args.eval_n), "--seed", str(seed),
                               "--max-new-tokens", str(fgrpo.TINY["max_new_tokens"])])


def compare_arms(dir_a, dir_b, args, seed):
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        return evaluator.main(["--compare", str(dir_a), str(dir_b), "--m", str(args.compare_m),
                               "--iters", str(args.compare_iters), "--seed", str(seed)])


def arm_record(rows, probs, res, args):
    """What an arm leaves in the JSON: its curves over steps, exact final probabilities, eval's results."""
    bench = res["benchmarks"]["heldout"]
    curve = [{k: r[k] for k in ("step", "reward", "focal_mean", "correct_mass", "m_ret") if k in r}
             for r in rows if "m_ret" in r]
    return {"focal_mean": statistics.fmean(r["focal_mean"] for r in rows), "curve": curve,
            "probs": probs.tolist(), "samples": bench["samples"], "correct": bench["correct"],
            "pass@k": bench["pass@k"]}


def run_seed(seed, heldout, data, args):
    """The base model of this seed, then every arm of every algo on a copy of it."""
    train_set = make_problems(args.train_problems, random.Random(seed), args.rare_digits)
    base, tok = build_base(seed, args.prior, args.warm_steps, train_set)
    p0 = answer_probs(base, tok, heldout)
    work = args.work / f"seed{seed}"
    base.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    rec = {"p0": p0.tolist(), "arms": {}, "compare": {}}
    rec["base"] = {"probs": p0.tolist(), **{k: v for k, v in arm_record(
        [{"focal_mean": 1.0}], p0, evaluate_arm(work / "base", data, work / "eval_base", args, seed), args).items()
        if k in ("samples", "correct", "pass@k")}}
    for algo in args.algos:
        arms = [{"name": f"{algo}_g0", "algo": algo, "gamma": 0.0, "lr": args.lr},
                {"name": f"{algo}_F", "algo": algo, "gamma": fgrpo.PAPER_GAMMA[algo], "lr": args.lr},
                {"name": f"{algo}_g0_lrscaled", "algo": algo, "gamma": 0.0}]
        for arm in arms:
            t0 = time.time()
            if "lr" not in arm:  # the base algorithm at the F-run's mean step size
                arm["lr"] = args.lr * rec["arms"][f"{algo}_F"]["focal_mean"]
            rows, ckpt = train_arm(base, tok, train_set, heldout, p0, arm, args, seed)
            probs = answer_probs(fgrpo_model(ckpt), tok, heldout)
            res = evaluate_arm(ckpt, data, work / f"eval_{arm['name']}", args, seed)
            rec["arms"][arm["name"]] = {**arm, **arm_record(rows, probs, res, args)}
            r = rec["arms"][arm["name"]]
            print(f"seed {seed} {arm['name']:18s} lr {arm['lr']:.2e} focal_mean {r['focal_mean']:.3f} "
                  f"mass {r['curve'][-1]['correct_mass']:.3f} M_ret {r['curve'][-1]['m_ret']:.3f} "
                  f"pass@1 {r['pass@k']['1']:.3f} pass@{args.eval_n} {r['pass@k'][str(args.eval_n)]:.3f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
        for a, b in ((f"{algo}_g0", f"{algo}_F"), (f"{algo}_g0_lrscaled", f"{algo}_F")):
            res = compare_arms(work / f"eval_{a}", work / f"eval_{b}", args, seed)["heldout"]
            rec["compare"][f"{a}_vs_{b}"] = res
    return rec


def fgrpo_model(ckpt):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()


# ---------------------------------------------------------------- summary, table, plots
def mean_sd(xs):
    return [statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0]


def rare_passk(arm, kinds, k):
    """pass@k over the held-out rare-kind problems, from the saved counts (fgrpo.pass_at_k)."""
    pk = [fgrpo.pass_at_k(n, c, k) for n, c, kind in zip(arm["samples"], arm["correct"], kinds) if kind == "rare"]
    return statistics.fmean(pk)


def above_frontier(seed, arm, algo, correct):
    """M_ret of `arm` minus the gamma-0 run's M_ret at the same correct mass (its trajectory from step 0,
    linear between measurements): > 0 means more rare mass kept than plain sharpening to that point."""
    p0 = torch.tensor(seed["p0"])
    pts = [(float((p0 * correct).sum(-1).mean()), 1.0)] + \
        [(c["correct_mass"], c["m_ret"]) for c in seed["arms"][f"{algo}_g0"]["curve"]]
    mass, m_ret = arm["curve"][-1]["correct_mass"], arm["curve"][-1]["m_ret"]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if min(x0, x1) <= mass <= max(x0, x1) and x0 != x1:
            return m_ret - (y0 + (y1 - y0) * (mass - x0) / (x1 - x0))
    return None  # beyond the gamma-0 run's range


def summarise(seeds, heldout, args):
    """Per arm (and the base model), mean and sd over seeds; per comparison, delta and p per seed."""
    kinds, n, m = [p["kind"] for p in heldout], str(args.eval_n), args.compare_m
    correct = correct_mask(heldout)
    names = ["base", *seeds[0]["arms"]]
    table = {}
    for name in names:
        recs = [s["base"] if name == "base" else s["arms"][name] for s in seeds]
        ret = [mass_and_retention(torch.tensor(s["p0"]), torch.tensor(r["probs"]), correct, args.rare_below)
               for s, r in zip(seeds, recs)]
        table[name] = {"lr": recs[0].get("lr"), "gamma": recs[0].get("gamma"),
                       "focal_mean": mean_sd([r.get("focal_mean", 1.0) for r in recs]),
                       "pass@1": mean_sd([r["pass@k"]["1"] for r in recs]),
                       f"pass@{n}": mean_sd([r["pass@k"][n] for r in recs]),
                       f"rare pass@{n}": mean_sd([rare_passk(r, kinds, int(n)) for r in recs]),
                       "correct_mass": mean_sd([x[0] for x in ret]), "m_ret": mean_sd([x[1] for x in ret]),
                       "listed_mass": mean_sd([statistics.fmean(map(sum, r["probs"])) for r in recs])}
        if name != "base" and not name.endswith("_g0"):
            gains = [above_frontier(s, r, r["algo"], correct) for s, r in zip(seeds, recs)]
            table[name]["m_ret_above_g0"] = mean_sd([g for g in gains if g is not None]) if any(
                g is not None for g in gains) else None
    tests = {}
    for key in seeds[0]["compare"]:
        cs = [s["compare"][key] for s in seeds]
        ks = cs[0]["k"]
        tests[key] = {f"delta pass@{k}": mean_sd([c["delta"][i] for c in cs]) for i, k in enumerate(ks)
                      if k in (1, m)}
        tests[key].update({f"p pass@{k} per seed": [c["p"][i] for c in cs] for i, k in enumerate(ks) if k in (1, m)})
    return {"arms": table, "tests": tests}


def markdown(summary, args, wall):
    n, m = args.eval_n, args.compare_m
    f = lambda v: "-" if v is None else f"{v[0]:.3f} ± {v[1]:.3f}"  # noqa: E731
    cols = ["pass@1", f"pass@{n}", f"rare pass@{n}", "listed_mass", "correct_mass", "m_ret", "m_ret_above_g0"]
    lines = [f"### See it happen: {args.steps} steps, N = {args.n}, {args.prompts} prompts/step, "
             f"{args.seeds} seeds (mean ± sd), {args.heldout} held-out problems, eval n = {n}",
             "", "| arm | gamma | lr | focal_mean | " + " | ".join(cols) + " |", "|---" * (4 + len(cols)) + "|"]
    for name, r in summary["arms"].items():
        lr = "-" if r["lr"] is None else f"{r['lr']:.2e}"
        gamma = "-" if r["gamma"] is None else f"{r['gamma']:g}"
        lines.append(f"| {name} | {gamma} | {lr} | {r['focal_mean'][0]:.3f} | " + " | ".join(f(r.get(c)) for c in cols) + " |")
    lines += ["", f"eval.py --compare (B minus A; m = {m}; p per seed):", "",
              f"| A vs B | delta pass@1 | p | delta pass@{m} | p |", "|---|---|---|---|---|"]
    for key, t in summary["tests"].items():
        ps = lambda k: ", ".join(f"{p:.3f}" for p in t[f"p pass@{k} per seed"])  # noqa: E731
        lines.append(f"| {key.replace('_vs_', ' vs ')} | {f(t['delta pass@1'])} | {ps(1)} | "
                     f"{f(t[f'delta pass@{m}'])} | {ps(m)} |")
    lines += ["", f"rare pass@{n}: over the held-out problems whose one answer is rare under the base model. "
              f"listed_mass: the exact probability of the enumerated completions (answer_completions), of which "
              f"correct_mass is the correct part. M_ret: SPEC Sec. 7 over correct answers with pi_0 < {args.rare_below}. m_ret_above_g0: M_ret minus the "
              f"gamma-0 run's M_ret at the same correct mass (its trajectory). Wall time {wall:.0f} s."]
    return "\n".join(lines) + "\n"


def plot(seeds, args, path_passk, path_mass):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: pip install matplotlib to get the plots")
        return
    variants = {"g0": ("gamma 0", "C3"), "F": ("F (paper gamma)", "C0"), "g0_lrscaled": ("gamma 0, lr x focal_mean", "C2")}
    kinds = [None, "rare"]
    fig, axes = plt.subplots(2, len(args.algos), figsize=(4 * len(args.algos), 6.4), squeeze=False)
    for col, algo in enumerate(args.algos):
        for row, kind in enumerate(kinds):
            ax = axes[row][col]
            for name, (label, color) in {"base": ("base model", "k"), **{f"{algo}_{v}": x for v, x in variants.items()}}.items():
                recs = [s["base"] if name == "base" else s["arms"][name] for s in seeds]
                ks = evaluator.powers_of_two(args.eval_n)
                ys = [statistics.fmean(passk_of(r, k, kind, args.heldout_kinds) for r in recs) for k in ks]
                ax.plot(ks, ys, "o-", color=color, label=label, ms=3)
            ax.set_xscale("log", base=2)
            ax.set(title=f"{algo}: {'all held-out' if kind is None else 'rare-answer'} problems", xlabel="k", ylabel="pass@k")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path_passk, dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(3, len(args.algos), figsize=(4 * len(args.algos), 9.6), squeeze=False)
    mass0 = [float((torch.tensor(s["p0"]) * correct_mask(args.heldout_problems)).sum(-1).mean()) for s in seeds]
    for col, algo in enumerate(args.algos):
        for v, (label, color) in variants.items():
            curves = [[(0, m0, 1.0)] + [(c["step"], c["correct_mass"], c["m_ret"]) for c in s["arms"][f"{algo}_{v}"]["curve"]]
                      for s, m0 in zip(seeds, mass0)]
            steps = [x[0] for x in curves[0]]
            for row in (0, 1):  # over steps: mean over seeds, the band from the lowest seed to the highest
                ys = [[x[row + 1] for x in c] for c in curves]
                axes[row][col].plot(steps, [statistics.fmean(y) for y in zip(*ys)], "-", color=color, label=label)
                axes[row][col].fill_between(steps, [min(y) for y in zip(*ys)], [max(y) for y in zip(*ys)],
                                            color=color, alpha=0.15)
            for i, c in enumerate(curves):  # the trade-off itself, one line per seed
                axes[2][col].plot([x[1] for x in c], [x[2] for x in c], ".-", color=color, alpha=0.7,
                                  label=label if i == 0 else None)
        axes[0][col].set(title=f"{algo}: correct mass", xlabel="step")
        axes[1][col].set(title=f"{algo}: M_ret (rare correct answers)", xlabel="step")
        axes[2][col].set(title=f"{algo}: M_ret against correct mass", xlabel="correct mass", ylabel="M_ret")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path_mass, dpi=110)
    plt.close(fig)


def passk_of(rec, k, kind, kinds):
    return statistics.fmean(fgrpo.pass_at_k(n, c, k) for n, c, kd in zip(rec["samples"], rec["correct"], kinds)
                            if kind is None or kd == kind)


def main(argv=None):
    args = parse_args(argv)
    kept = torch.get_num_threads(), fgrpo.verify, sys.modules.get("vllm", main)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TQDM_DISABLE", "1")
    importlib.import_module("transformers.utils.logging").disable_progress_bar()  # per-arm save/load bars
    sys.modules["vllm"] = None  # eval.py's transformers engine: no vLLM start per arm for a tiny model
    fgrpo.verify = answer_set_verify  # training (fgrpo.sample_and_score) and eval.py call it by module name
    try:
        return run(args)
    finally:  # in-process callers (the test) get fgrpo and vLLM back as they were
        torch.set_num_threads(kept[0])
        fgrpo.verify = kept[1]
        sys.modules.pop("vllm") if kept[2] is main else sys.modules.update(vllm=kept[2])


def run(args):
    t0 = time.time()
    heldout = make_problems(args.heldout, random.Random(10_000), args.rare_digits, balanced=True)
    args.heldout_problems, args.heldout_kinds = heldout, [p["kind"] for p in heldout]
    args.work.mkdir(parents=True, exist_ok=True)
    data = args.work / "heldout.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in heldout))
    seeds = [run_seed(s, heldout, data, args) for s in range(args.seeds)]
    wall = time.time() - t0
    summary = summarise(seeds, heldout, args)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("heldout_problems", "heldout_kinds")}
    result = {"config": config, "heldout": heldout, "seeds": seeds, "summary": summary, "wall_s": wall}
    (args.out / f"{args.name}.json").write_text(json.dumps(result))
    (args.out / f"{args.name}.md").write_text(markdown(summary, args, wall))
    plot(seeds, args, args.out / f"{args.name}_passk.png", args.out / f"{args.name}_mass.png")
    print(markdown(summary, args, wall))
    return result


if __name__ == "__main__":
    main()
