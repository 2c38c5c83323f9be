"""See it happen: F-GRPO against its base algorithm through fgrpo.train itself, on a task with the
paper's structure, where every answer's probability is exact.

The paper's claim (arXiv 2602.06717, Sec. 3-4): with a small group, group-relative RL sharpens onto
the correct solutions it samples; a rare correct solution that goes unsampled loses mass, and pass@k
at large k falls. The focal weight g = (1 - X/N)^gamma is to keep more of it at the same pass@1.

    python experiments/see_it_happen.py           # 2 starts x 10 seeds: ~80 min, 2 cores
    python experiments/see_it_happen.py --quick   # the whole pipeline in miniature
    python experiments/see_it_happen.py --out experiments/results   # replace the committed results
    python experiments/see_it_happen.py --seeds 3 --starts strategy --lrs 1e-4 1e-3 --workers 1

Task. A prompt lists five distinct digits, "(39147)=", and an answer is one digit, "\\boxed{3}".
Two strategies read the answer off the prompt: copy the first digit (common) and copy the last one
(rare); the rest of the mass is spread over all ten digits. A problem is of one of three kinds, with
its mix's shares (MIXES):
    both    the first and the last digit are both accepted     (the majority kind)
    rare    only the last digit is accepted
    common  only the first digit is accepted
A problem's kind is fixed, and its digits do not show it (as a math problem does not show whether a
heuristic works on it): the policy cannot learn it, so a strategy's worth is its share of the
problems. In the "tie" mix the rare-only and common-only kinds are equally common, so neither
pass@1 nor GRPO's exact (infinite-N) objective prefers dropping the rare strategy; the common one is
favoured only by its head start and by what small groups sample. In the "rare" mix the rare strategy
is worth more. docs/why-focal.md derives both objectives; experiments/two_strategy.py simulates it.

Warm starts (WARM_STARTS, --starts): a supervised start towards a target answer distribution.
"strategy" (the main result) targets 3.4 times the mass of one wrong digit for copying the last
digit, and trains on until it holds 2.5 (WARM_MIN_RATIO; 3.2 over 10 seeds): a strategy.
"floor" (the earlier default, kept as the contrast) gives it about 1.2 times: the rare answer is
then mostly the uniform floor, which pass@1 fixes (the 8 wrong digits share 1 - pass@1 / 0.8 in
the tie mix). Both have the same base pass@1. That ratio, the rare
strategy's mass over one wrong digit's (each averaged over the held-out prompts: "rare ratio"), is
reported at the base and at every measurement of every run: it tells whether an arm keeps a
strategy or only the floor.

Arms, all from the same warm-started model per (seed, start), through fgrpo.train (its sampler,
optimiser, losses and checkpoints; --rollout hf): the base algorithm (--algo, DAPO) at every --lrs,
--gammas (0: the base; 1: F) with N = --n, and the exact expected update (every completion of
the answer space, weighted by its probability: the limit N -> infinity) at every --lrs and
--exact-gammas. The lrs reach where the runs break down (the answer space's mass falls below 0.9).

Measured exactly every --measure-every steps on --heldout prompts, from fgrpo.token_logprobs over
the whole answer space (answer_completions): every digit's mass per prompt, hence
pass@k = sum over kinds of share * mean_x [1 - (1 - p_kind(x))^k], rare pass@k (on the rare kind),
the two strategies' masses, one wrong digit's mass, M_ret (SPEC Sec. 7).

Frontiers. A frontier is the most pass@k that any lr's run reaches at pass@1 >= t (runs linear
between measurements). F and the base are compared per seed on their matched range: from the base
model's pass@1 to the top, the lower of the two frontiers' highest pass@1 (over every lr and every
measured step); --levels levels at 1/L, 2/L, ..., 1 of the way (the base point itself, where the
gap is 0 by construction, is left out). The seed is the unit: per level and averaged over levels,
paired differences over seeds, 95% t intervals, paired t and exact Wilcoxon tests
(experiments/paired.py). eval.py's sampled pass@k of one model per seed cross-checks the exact one.

fgrpo internals this touches (all restored after a run): fgrpo.verify is answer_set_verify (the
answer sets are not math-verify's), fgrpo.run_step is wrapped to measure, and, for the exact arms
only, fgrpo.rollout and fgrpo.group_advantages are replaced (exact_update_patches).
"""
import argparse
import contextlib
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
import eval as evaluator  # noqa: E402  (eval.py; the alias keeps the builtin eval)
import fgrpo  # noqa: E402
from paired import paired_summary  # noqa: E402

DIGITS = [str(d) for d in range(10)]
WRONG_DIGITS = 8  # the ten digits but the first and the last (a prompt's digits are distinct)
KINDS = ("both", "rare", "common")
MIXES = {"tie": {"both": 0.6, "rare": 0.2, "common": 0.2},
         "rare": {"both": 0.6, "rare": 0.4, "common": 0.0}}
# warm-start targets: (first digit, last digit), the rest uniform over the ten digits. One wrong
# digit gets 0.037 or 0.038 of the mass (pass@1 within 0.01), the last digit 0.127 or 0.058
WARM_STARTS = {"strategy": (0.54, 0.09), "floor": (0.6, 0.02)}
# and the rare ratio a start's warm start trains on for (in 50-step blocks): at 200 steps 2 of 10
# "strategy" seeds had copied only the first digit (ratio 1.0 and 1.05; 3.06 at 300 steps)
WARM_MIN_RATIO = {"strategy": 2.5, "floor": 0.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--seeds", type=int, default=10, help="seeds 0..S-1: each its own warm start, data, samples")
    a("--starts", nargs="+", default=list(WARM_STARTS), choices=list(WARM_STARTS),
      help="warm starts (WARM_STARTS); the first is the main result")
    a("--mixes", nargs="+", default=["tie"], choices=list(MIXES), help="problem mixes (MIXES)")
    a("--algo", default="dapo", choices=sorted(fgrpo.PAPER_EPS), help="the frontier's algorithm")
    a("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3],
      help="AdamW lrs of every frontier, from 'moves slowly' to 'breaks down'")
    a("--gammas", type=float, nargs="+", default=[0.0, 1.0],
      help="focal exponents at N = --n; 0 (the base algorithm) first")
    a("--exact-gammas", type=float, nargs="*", default=[0.0, 1.0],
      help="focal exponents of the exact expected update (N -> infinity); 0 first, or none")
    a("--steps", type=int, default=48, help="rollout steps of every arm")
    a("--n", type=int, default=8, help="group size N of the sampled arms")
    a("--prompts", type=int, default=16, help="prompts per rollout step")
    a("--mini-batch", type=int, default=4, help="prompts per optimiser step (App. L: 4 a rollout)")
    a("--warm-steps", type=int, default=200, help="supervised warm-start steps (16 prompts each)")
    a("--train-problems", type=int, default=2000, help="training problems per seed and mix")
    a("--heldout", type=int, default=48, help="held-out prompts (exact metrics, eval.py's check)")
    a("--k", type=int, default=32, help="the large k of pass@k")
    a("--measure-every", type=int, default=8, help="exact probabilities every K steps, the last")
    a("--levels", type=int, default=10, help="matched-pass@1 levels per seed, at 1/L .. L/L of "
      "the way from the base model's pass@1 to the top of the matched range")
    a("--eval-n", type=int, default=64, help="eval.py's samples per held-out problem (cross-check)")
    a("--workers", type=int, default=2, help="processes, one (seed, start) each at a time")
    a("--work", type=Path, default=ROOT / "runs" / "see_it_happen",
      help="models, runs and finished arms: a rerun reuses arms finished with the same settings")
    a("--out", type=Path, help="results folder; default WORK/results, so that a run never "
      "overwrites the committed experiments/results unless told to (--out experiments/results)")
    a("--name", default="see_it_happen", help="prefix of the result files")
    a("--quick", action="store_true", help="miniature: 2 seeds, 2 lrs, 4 steps, small batches")
    a("--report-only", action="store_true", help="recompute the summary, OUT/NAME.md and .png from "
      "the runs in OUT/NAME.json (its settings and times), without training")
    args = p.parse_args(argv)
    if args.quick:
        quick = dict(seeds=2, lrs=[1e-4, 1e-3], gammas=[0.0, 1.0], exact_gammas=[0.0, 1.0],
                     steps=4, prompts=8, mini_batch=4, warm_steps=40, train_problems=200,
                     heldout=12, measure_every=2, eval_n=16, k=8, levels=4,
                     name=args.name + "_quick", work=args.work.with_name(args.work.name + "_quick"))
        vars(args).update(quick)
    args.out = args.out or args.work / "results"
    check_args(p, args)
    return args


def check_args(p, args):
    if args.gammas[0] != 0 or len(set(args.gammas)) < 2:
        p.error("--gammas: 0 (the base algorithm) first, then at least one focal gamma")
    if args.exact_gammas and (args.exact_gammas[0] != 0 or len(set(args.exact_gammas)) < 2):
        p.error("--exact-gammas: none, or 0 first and at least one focal gamma")
    if args.prompts % args.mini_batch:
        p.error("--prompts must divide into --mini-batch")
    if args.seeds < 2 or args.k < 2 or args.k > args.eval_n or args.levels < 1:
        p.error("--seeds >= 2 (the seed is the unit), 2 <= --k <= --eval-n, --levels >= 1")

# ---------------------------------------------------------------- the task
def make_digits(count, rng, exclude=()):
    """`count` distinct lists of five distinct digits, none in `exclude`."""
    seen, out = set(map(tuple, exclude)), []
    while len(out) < count:
        digits = tuple(rng.sample(range(10), 5))
        if digits not in seen:
            seen.add(digits)
            out.append(list(digits))
    return out


def make_problems(digit_lists, mix, rng, exact_shares=False):
    """[{problem, answer, kind}]; kinds drawn with the mix's shares, or (exact_shares, the held-out
    file) in proportion, rounded. The answer is the accepted set, written "3, 7"."""
    shares = MIXES[mix]
    if exact_shares:
        counts = [round(shares[k] * len(digit_lists)) for k in KINDS]
        counts[0] = len(digit_lists) - sum(counts[1:])
        kinds = [k for k, c in zip(KINDS, counts) for _ in range(c)]
    else:
        kinds = rng.choices(KINDS, [shares[k] for k in KINDS], k=len(digit_lists))
    out = []
    for digits, kind in zip(digit_lists, kinds):
        accepted = {"both": [digits[0], digits[-1]], "rare": [digits[-1]],
                    "common": [digits[0]]}[kind]
        out.append({"problem": prompt_text(digits), "answer": ", ".join(map(str, accepted)),
                    "kind": kind})
    return out


def prompt_text(digits):
    return "(" + "".join(map(str, digits)) + ")="


def answer_set_verify(completions, golds, timeout=None):
    """Stands in for fgrpo.verify: 1.0 where the completion's last \\boxed{...} is one of the
    comma-separated answers of its gold, else 0.0 (exact match after strip)."""
    scores = []
    for text, gold in zip(completions, golds):
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
        accepted = {a.strip() for a in gold.split(",")}
        scores.append(float(bool(boxed) and boxed[-1].strip() in accepted))
    return scores


def prompt_ids(tok, digits):  # as fgrpo.rollout tokenises a prompt (tiny's tokenizer: no template)
    return tok(prompt_text(digits), add_special_tokens=False).input_ids


def warm_start(seed, prior, steps, digit_lists, heldout, min_ratio=0.0):
    """fgrpo.build_tiny's untrained model and tokenizer, then supervised AdamW steps (lr 2e-3, clip
    1.0) on 16 prompts each, towards the target answer distribution: the first digit prior[0],
    the last digit prior[1], and the rest uniform over the ten digits (the cross-entropy against
    all ten "\\boxed{d}<eos>", not sampled targets: seeds then learn to copy alike). `steps`, then
    50 more at a time (up to 4 x steps) until the first digit holds half the held-out mass and
    the rare ratio is at least min_ratio. Returns the model, the tokenizer and the steps taken."""
    model, tok, _, _ = fgrpo.build_tiny(seed, warm_steps=0)  # seeds torch: one init per seed
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    answers = [answer_completions(tok, d)[0] for d in DIGITS]
    done = 0
    while done < steps or (done < 4 * steps and not learnt(model, tok, heldout, min_ratio)):
        block = steps if done == 0 else 50
        model.train()
        for _ in range(block):
            prompts = [rng.choice(digit_lists) for _ in range(16)]
            target = torch.full((16, 10), (1 - sum(prior)) / 10)
            for i, digits in enumerate(prompts):
                target[i, digits[0]] += prior[0]
                target[i, digits[-1]] += prior[1]
            pairs = [(prompt_ids(tok, x), a) for x in prompts for a in answers]
            logp = (sequence_logprobs(model, tok, pairs)).view(16, 10)
            loss = -(target * logp).sum() / 16
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        done += block
    return model.eval(), tok, done


def learnt(model, tok, heldout, min_ratio):
    """The warm start's stopping rule: the first digit holds half the held-out mass, and the last
    digit min_ratio times one wrong digit's (tie mix: the base's metrics)."""
    point = strategy_probs(model.eval(), tok, heldout)
    ratio = exact_metrics(point, point, "tie", 2)["rare ratio"]
    return statistics.fmean(point["first"]) >= 0.5 and ratio >= min_ratio


# ---------------------------------------------------------------- exact measurement
MAX_NEW = fgrpo.TINY["max_new_tokens"]  # --max-new-tokens of every arm: completions are short


def answer_completions(tok, digit):
    """The completions, as sampled under MAX_NEW tokens, whose answer is `digit`: "\\boxed{d}" and
    the stutters "\\boxed\\boxed{d}", ... that a trained policy samples, each then <eos>, and the
    longest cut at the cap without <eos>. Disjoint token sequences, so their probabilities add."""
    seqs = []
    for repeats in range(1, MAX_NEW):
        ids = tok("\\boxed" * repeats + f"{{{digit}}}", add_special_tokens=False).input_ids
        if len(ids) > MAX_NEW:
            break
        seqs.append(ids + [tok.eos_token_id] if len(ids) < MAX_NEW else ids)
    return seqs


def sequence_logprobs(model, tok, pairs):
    """log pi(completion | prompt) of (prompt, completion) id pairs, by fgrpo.token_logprobs."""
    ids, attn, mask = fgrpo.collate(pairs, tok.pad_token_id)
    return (fgrpo.token_logprobs(model, ids, attn, mask=mask) * mask).sum(-1)


def sequence_probs(model, tok, pairs):
    return sequence_logprobs(model, tok, pairs).exp()


@torch.no_grad()
def strategy_probs(model, tok, digit_lists):
    """Per prompt: pi(answer = first digit), pi(answer = last digit), pi(answer = one of the 8
    others: "wrong"); the listed mass (all answer_completions of all ten digits; 1 minus it is text
    outside the answer space), and each digit's coefficient of variation over the prompts."""
    per_digit = [answer_completions(tok, d) for d in DIGITS]
    pairs = [(prompt_ids(tok, x), s) for x in digit_lists for seqs in per_digit for s in seqs]
    probs = sequence_probs(model, tok, pairs).view(len(digit_lists), -1)
    digit_of = torch.tensor([d for d, seqs in enumerate(per_digit) for _ in seqs])
    by_digit = torch.zeros(len(digit_lists), 10).index_add_(1, digit_of, probs)
    rows = torch.arange(len(digit_lists))
    first = by_digit[rows, [x[0] for x in digit_lists]]
    last = by_digit[rows, [x[-1] for x in digit_lists]]
    cv = by_digit.std(0) / by_digit.mean(0)  # per digit, over prompts: large if the prompt is used
    return {"first": [round(v, 7) for v in first.tolist()],
            "last": [round(v, 7) for v in last.tolist()],
            "wrong": [round(v, 7) for v in (by_digit.sum(-1) - first - last).tolist()],
            "listed": round(float(by_digit.sum(-1).mean()), 7),
            "digit_cv": [round(v, 3) for v in cv.tolist()]}


def success_probs(point, kind):
    """Per prompt, the chance that one sample is accepted on a problem of `kind`."""
    if kind == "both":
        return [f + l for f, l in zip(point["first"], point["last"])]
    return point["last"] if kind == "rare" else point["first"]


def exact_metrics(point, base, mix, k):
    """pass@1, pass@k (the expectation over the mix's kinds, 1 - (1 - p)^k per prompt), rare pass@k
    (the rare kind), the two strategies' masses, one wrong digit's mass, the rare ratio (the rare
    strategy's mass over one wrong digit's, each a mean over prompts), the answer space's mass
    (listed) and M_ret (SPEC Sec. 7: 1 - lost / initial mass of the accepted answers, each weighted
    by the share of the kinds that accept it)."""
    shares = MIXES[mix]
    out = {"pass@1": 0.0, f"pass@{k}": 0.0}
    for kind in KINDS:
        ps = success_probs(point, kind)
        out["pass@1"] += shares[kind] * statistics.fmean(ps)
        out[f"pass@{k}"] += shares[kind] * statistics.fmean(1 - (1 - p) ** k for p in ps)
    out[f"rare pass@{k}"] = statistics.fmean(1 - (1 - p) ** k for p in point["last"])
    out["rare mass"] = statistics.fmean(point["last"])
    out["common mass"] = statistics.fmean(point["first"])
    out["wrong mass"] = statistics.fmean(point["wrong"]) / WRONG_DIGITS
    out["rare ratio"] = out["rare mass"] / max(out["wrong mass"], 1e-12)
    out["listed"] = point["listed"]
    w_last, w_first = shares["both"] + shares["rare"], shares["both"] + shares["common"]
    lost = sum(w_last * max(0.0, l0 - l) + w_first * max(0.0, f0 - f) for f0, l0, f, l in
               zip(base["first"], base["last"], point["first"], point["last"]))
    held = sum(w_last * l0 + w_first * f0 for f0, l0 in zip(base["first"], base["last"]))
    out["M_ret"] = 1 - lost / held
    return out
# ---------------------------------------------------------------- one arm: fgrpo.train
def arm_name(algo, gamma, lr, n):
    return f"{algo}_g{gamma:g}_lr{lr:g}_" + ("exact" if n == "exact" else f"n{n}")


def fgrpo_argv(arm, args, seed, data, base_dir, out, group):
    """fgrpo.py's command line of an arm: the tiny model's settings spelled out (--model is a
    folder here, so fgrpo's TINY defaults do not apply), a step per --mini-batch prompts."""
    per_update = args.mini_batch * group
    return ["--model", str(base_dir), "--data", str(data), "--algo", arm["algo"],
            "--gamma", repr(arm["gamma"]), "--lr", repr(arm["lr"]), "--n", str(group),
            "--prompts", str(args.prompts), "--mini-batch", str(args.mini_batch),
            "--micro-batch", str(per_update), "--gen-batch", str(args.prompts * group),
            "--warmup", "0", "--max-new-tokens", str(MAX_NEW), "--steps", str(args.steps),
            "--save-every", str(args.steps), "--seed", str(seed), "--rollout", "hf",
            "--out", str(out)]


def exact_update_patches(tok, gamma):
    """fgrpo.rollout and fgrpo.group_advantages for the exact expected update (N -> infinity): every
    prompt's "group" is its whole answer space (answer_completions of all ten digits, K sequences),
    and each completion's advantage is pi_old(o) * A_inf(o), A_inf = g * (R - p) / sqrt(p (1 - p))
    with p the exact success probability, g = (1 - p)^gamma: the N -> infinity limit of Sec. 2's
    advantage. Times the old-policy probability, the token-mean loss's gradient is then
    E_{o ~ pi_old}[A_inf grad log pi(o)] / (canonical completion length): the sampled arms' scale.
    """
    seqs = [s for d in DIGITS for s in answer_completions(tok, d)]
    scale = sum(map(len, seqs)) / len(seqs[0])  # tokens per prompt over one completion's tokens
    state = {}

    def rollout(model, tok_, engine, prompts, n, args, seed):  # n == len(seqs): see fgrpo_argv
        ids = [tok_(p, add_special_tokens=False).input_ids for p in prompts]
        pairs = [(i, s) for i in ids for s in seqs]
        with torch.no_grad():
            state["probs"] = sequence_probs(model, tok_, pairs).view(len(ids), len(seqs))
        return [fgrpo.Sample(i, s, s[-1] != tok_.eos_token_id) for i, s in pairs]

    def group_advantages(rewards, gamma_=0.0, eps=1e-6, correct=None):
        pi, r = state["probs"], rewards.float()
        p = (pi * r).sum(-1, keepdim=True)
        a_inf = (r - p) / (p * (1 - p)).clamp(min=1e-12).sqrt() * (1 - p) ** gamma
        return scale * pi * a_inf

    return {"rollout": rollout, "group_advantages": group_advantages}, len(seqs)


@contextlib.contextmanager
def patched(module, **attrs):
    saved = {k: getattr(module, k) for k in attrs}
    vars(module).update(attrs)
    try:
        yield
    finally:
        vars(module).update(saved)


def train_arm(arm, ctx, keep=False):
    """fgrpo.train on the seed's base model; the exact probabilities of the held-out prompts every
    --measure-every steps (fgrpo.run_step wrapped). Cached in WORK/START/seedS/MIX/ARM.json."""
    args, tok = ctx["args"], ctx["tok"]
    out = ctx["dir"] / arm["mix"] / arm["name"]
    patches, group = {}, args.n
    if arm["n"] == "exact":
        patches, group = exact_update_patches(tok, arm["gamma"])
    data = ctx["data"][arm["mix"]]
    argv = fgrpo_argv(arm, args, ctx["seed"], data, ctx["dir"] / "base", out, group)
    settings = {"argv": argv, "base": ctx["base_settings"], "every": args.measure_every}
    cache = out.parent / (out.name + ".json")
    if cache.exists() and not keep and json.loads(cache.read_text())["settings"] == settings:
        return json.loads(cache.read_text())["record"]
    shutil.rmtree(out, ignore_errors=True)  # fgrpo.train refuses a folder that holds a run
    out.mkdir(parents=True)
    curve, run_step, t0 = [], fgrpo.run_step, time.time()

    def measured_step(model, *rest):  # fgrpo.run_step(model, tok, engine, opt, next, args, step)
        metrics = run_step(model, *rest)
        step, targs = rest[-1], rest[-2]
        if step % args.measure_every == 0 or step == targs.steps:
            curve.append({"step": step, **strategy_probs(model, tok, ctx["heldout"])})
        return metrics

    sigterm = signal.getsignal(signal.SIGTERM)  # fgrpo.train sets its own (save, then exit)
    with patched(fgrpo, run_step=measured_step, **patches), open(out / "train.log", "w") as log:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            try:
                fgrpo.train(fgrpo.parse_args(argv))
            finally:
                signal.signal(signal.SIGTERM, sigterm)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    record = {k: arm[k] for k in ("algo", "gamma", "lr", "n")}
    for key in ("focal_mean", "clip_frac", "grad_norm"):  # (focal_mean counts completions, exact)
        record[key] = statistics.fmean(r[key] for r in rows)
    record.update(curve=curve, seconds=round(time.time() - t0, 1))
    cache.write_text(json.dumps({"settings": settings, "record": record}))
    if not keep:
        shutil.rmtree(out)
    return record


# ---------------------------------------------------------------- a seed: base model, then its arms
@contextlib.contextmanager
def experiment_environment():
    """What every arm runs under, restored after: one torch thread, answer_set_verify as
    fgrpo.verify (training and eval.py call it by module name), vLLM hidden from eval.py (a tiny
    model needs no engine start per run), no checkpoint progress bars."""
    threads, vllm = torch.get_num_threads(), sys.modules.get("vllm", patched)
    torch.set_num_threads(1)
    sys.modules["vllm"] = None
    import transformers.utils.logging as hf_logging
    hf_logging.disable_progress_bar()
    try:
        with patched(fgrpo, verify=answer_set_verify):
            yield
    finally:
        torch.set_num_threads(threads)
        if vllm is patched:
            sys.modules.pop("vllm")
        else:
            sys.modules["vllm"] = vllm


def prepare_seed(seed, start, args, heldout):
    """The context of (seed, warm start): its warm-started base model (WORK/START/seedS/base, reused
    if its settings match), its training files (one per mix: the same problems for every start)
    and the held-out masses of the base model."""
    from transformers import AutoTokenizer
    root = args.work / start / f"seed{seed}"
    train_digits = make_digits(args.train_problems, random.Random(seed), exclude=heldout)
    settings = {"prior": list(WARM_STARTS[start]), "warm_steps": args.warm_steps,
                "heldout": heldout, "train_problems": args.train_problems}
    saved = root / "base" / "settings.json"
    if saved.exists() and json.loads(saved.read_text())["settings"] == settings:
        base = json.loads(saved.read_text())["base"]
        tok = AutoTokenizer.from_pretrained(root / "base")
    else:
        min_ratio = 0.0 if args.quick else WARM_MIN_RATIO[start]  # --quick: as fast as it can
        model, tok, steps = warm_start(seed, WARM_STARTS[start], args.warm_steps, train_digits,
                                       heldout, min_ratio)
        model.save_pretrained(root / "base")
        tok.save_pretrained(root / "base")
        base = {**strategy_probs(model, tok, heldout), "warm_steps": steps}
        saved.write_text(json.dumps({"settings": settings, "base": base}))
    data = {}
    for mix in args.mixes:
        problems = make_problems(train_digits, mix, random.Random(f"{seed}/{mix}"))
        data[mix] = root / f"{mix}.jsonl"
        data[mix].write_text("".join(json.dumps(p) + "\n" for p in problems))
    return {"args": args, "seed": seed, "start": start, "tok": tok, "dir": root,
            "heldout": heldout, "data": data, "base": base, "base_settings": settings}


def log_arm(ctx, mix, name, record):
    k = ctx["args"].k
    last = exact_metrics(record["curve"][-1], ctx["base"], mix, k)
    print(f"seed {ctx['seed']} {ctx['start']}/{mix} {name:24s} pass@1 {last['pass@1']:.3f} "
          f"pass@{k} {last[f'pass@{k}']:.3f} rare ratio {last['rare ratio']:5.2f} "
          f"({record['seconds']:.0f} s)", flush=True)


def arm_specs(args):
    """Every arm of a (seed, start, mix): (gamma, lr, n), N = --n at --gammas and the exact update
    at --exact-gammas, every lr."""
    return [(g, lr, n) for lr in args.lrs for n, gammas in ((args.n, args.gammas),
                                                           ("exact", args.exact_gammas))
            for g in gammas]


def run_job(seed, start, args, heldout):
    """One (seed, warm start): its base model and every arm in every mix; in the main start's first
    mix, eval.py's cross-check of F's sampled arm at the first lr (kept for eval.py, then removed).
    Returns its CPU seconds too."""
    cpu = time.process_time()
    with experiment_environment():
        ctx = prepare_seed(seed, start, args, heldout)
        arms, check = {mix: {} for mix in args.mixes}, None
        for mix in args.mixes:
            for gamma, lr, n in arm_specs(args):
                arm = {"mix": mix, "algo": args.algo, "gamma": gamma, "lr": lr, "n": n,
                       "name": arm_name(args.algo, gamma, lr, n)}
                keep = (start, mix, gamma, lr, n) == (args.starts[0], args.mixes[0],
                                                      args.gammas[-1], args.lrs[0], args.n)
                arms[mix][arm["name"]] = record = train_arm(arm, ctx, keep=keep)
                log_arm(ctx, mix, arm["name"], record)
                if keep:
                    check = cross_check(ctx, arm, record)
    return {"seed": seed, "start": start, "base": ctx["base"], "arms": arms, "check": check,
            "cpu_s": time.process_time() - cpu}


def cross_check(ctx, arm, record):
    """eval.py (its CLI, in-process) samples --eval-n completions per held-out problem from the
    arm's final checkpoint (OUT/step_K); beside it, the exact pass@k of the same problems."""
    args, out = ctx["args"], ctx["dir"] / arm["mix"] / arm["name"]
    data = args.work / f"heldout_{arm['mix']}.jsonl"
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        res = evaluator.main(["--model", str(out / f"step_{args.steps:06d}"), "--data", str(data),
                              "--out", str(out / "eval"), "--n", str(args.eval_n),
                              "--seed", str(ctx["seed"]), "--max-new-tokens", str(MAX_NEW)])
    bench = res["benchmarks"][data.stem]
    kinds = [json.loads(line)["kind"] for line in data.read_text().splitlines()]
    final = record["curve"][-1]
    ps = [success_probs(final, kind)[i] for i, kind in enumerate(kinds)]
    ks = ("1", str(args.k))
    exact = {k: statistics.fmean(1 - (1 - p) ** int(k) for p in ps) for k in ks}
    shutil.rmtree(out)
    return {"arm": arm["name"], "start": ctx["start"], "mix": arm["mix"], "n": args.eval_n,
            "correct": bench["correct"], "sampled": {k: bench["pass@k"][k] for k in ks},
            "exact": exact}


def run_jobs(args, heldout):
    """run_job for every (seed, start), in --workers processes (spawned: each imports torch afresh
    with one thread), or here; then per seed, its conditions "START/MIX" side by side."""
    jobs = [(seed, start, args, heldout) for start in args.starts for seed in range(args.seeds)]
    if args.workers == 1:
        done = [run_job(*job) for job in jobs]
    else:
        pool = multiprocessing.get_context("spawn").Pool(args.workers)
        try:
            done = pool.starmap(run_job, jobs, chunksize=1)
        finally:
            pool.close()  # the workers finish; terminate() would SIGTERM them mid-write
            pool.join()
    seeds = [{"seed": seed, "base": {}, "arms": {}, "check": None} for seed in range(args.seeds)]
    for job in done:
        s = seeds[job["seed"]]
        for mix, arms in job["arms"].items():
            s["base"][f"{job['start']}/{mix}"] = job["base"]
            s["arms"][f"{job['start']}/{mix}"] = arms
        s["check"] = s["check"] or job["check"]
    return seeds, sum(job["cpu_s"] for job in done)
# ---------------------------------------------------------------- analysis: frontiers, seeds paired
BROKEN = 0.9  # a run has broken down once the answer space holds less than this of the mass


def mix_of(key):
    """A condition, "START/MIX" (or a bare mix: experiments/two_strategy.py), -> its mix."""
    return key.rsplit("/", 1)[-1]


def trajectories(seeds, args):
    """[seed] -> {condition: {arm: [metrics at step 0 (the base model), then every measurement]}};
    a seed is {"base": {condition: masses}, "arms": {condition: {arm: {"curve": [...]}}}}."""
    def path(base, curve, mix):
        return [{"step": p["step"], **exact_metrics(p, base, mix, args.k)}
                for p in [{"step": 0, **base}] + curve]

    return [{key: {name: path(s["base"][key], arm["curve"], mix_of(key)) for name, arm in
                   arms.items()} for key, arms in s["arms"].items()} for s in seeds]


def frontier_at(paths, t, k):
    """The most pass@k that any of the paths (trajectories, linear between measurements in the
    (pass@1, pass@k) plane) reaches with pass@1 >= t; None if none reaches t."""
    best = None
    for path in paths:
        for a, b in zip(path, path[1:]):
            (x0, y0), (x1, y1) = (a["pass@1"], a[f"pass@{k}"]), (b["pass@1"], b[f"pass@{k}"])
            ys = [y for x, y in ((x0, y0), (x1, y1)) if x >= t]
            if min(x0, x1) < t <= max(x0, x1):
                ys.append(y0 + (y1 - y0) * (t - x0) / (x1 - x0))
            best = max([y for y in [best, *ys] if y is not None], default=None)
    return best


def ceiling(paths):
    """The highest pass@1 of any measurement of any of the paths."""
    return max(p["pass@1"] for path in paths for p in path)


def seed_levels(groups, count):
    """One seed's matched pass@1 levels: 1/count, 2/count, ..., 1 of the way from its base model's
    pass@1 (every path's first point) to the top, the lowest ceiling of the groups of paths; [] if
    none is above the base. The base point itself, a gap of 0 by construction, is not a level."""
    lo, hi = groups[0][0][0]["pass@1"], min(ceiling(g) for g in groups)
    if hi <= lo:
        return []
    return [lo + (hi - lo) * i / count for i in range(1, count)] + [hi]


def compare(traj, key, base_arms, arms, args):
    """F (arms) against its base (base_arms), each seed on its own matched range: the pass@k gap at
    each level and averaged over the levels, and the ceilings; paired over the seeds."""
    levels, gaps, tops = [], [], []
    for t in traj:
        a, b = [t[key][n] for n in base_arms], [t[key][n] for n in arms]
        levels.append(seed_levels([a, b], args.levels))
        gaps.append([frontier_at(b, x, args.k) - frontier_at(a, x, args.k) for x in levels[-1]])
        tops.append((ceiling(a), ceiling(b)))
    matched = [i for i, lv in enumerate(levels) if lv]
    out = {"levels": levels, "gaps_by_level": gaps, "unmatched": len(traj) - len(matched),
           "ceiling": paired_summary([b - a for a, b in tops]),
           "ceilings": [statistics.fmean(x) for x in zip(*tops)],  # mean: base's, arms'
           "level_pass@1": [], "by_level": [], "gaps": [], "gap": None}
    if matched:
        out["level_pass@1"] = [statistics.fmean(levels[i][j] for i in matched)
                               for j in range(args.levels)]
        out["by_level"] = [paired_summary([gaps[i][j] for i in matched])
                           for j in range(args.levels)]
        out["gaps"] = [statistics.fmean(gaps[i]) for i in matched]
        out["gap"] = paired_summary(out["gaps"])
    return out


FINAL_KEYS = ("pass@1", "pass@{k}", "rare pass@{k}", "rare mass", "M_ret")
BASE_KEYS = ("pass@1", "pass@{k}", "rare mass", "wrong mass", "rare ratio")


def final_deltas(traj, key, base_name, name, k):
    """Paired over seeds: the arm's final metrics minus the base arm's, at the same lr."""
    out = {}
    for metric in (x.format(k=k) for x in FINAL_KEYS):
        diffs = [t[key][name][-1][metric] - t[key][base_name][-1][metric] for t in traj]
        out[metric] = paired_summary(diffs)
    return out


def mean_sd(xs):
    return [statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0]


def finals(traj, key):
    """Mean and sd over seeds of the base model's metrics and of every arm's final ones."""
    first = next(iter(traj[0][key]))
    rows = {"base": [t[key][first][0] for t in traj]}
    rows.update({arm: [t[key][arm][-1] for t in traj] for arm in traj[0][key]})
    return {arm: {m: mean_sd([r[m] for r in rs]) for m in rs[0] if m != "step"}
            for arm, rs in rows.items()}


def arm_rows(traj, seeds, key, k):
    """Per arm, means over seeds: final pass@1, pass@k, rare mass and rare ratio, the highest
    pass@1 reached, the rare ratio at every measurement, the share of tokens clipped; and the
    seeds whose run broke down (BROKEN) at some measurement."""
    rows = {}
    for name in traj[0][key]:
        paths = [t[key][name] for t in traj]
        row = {m: statistics.fmean(p[-1][m] for p in paths)
               for m in ("pass@1", f"pass@{k}", "rare mass", "rare ratio")}
        row["highest pass@1"] = statistics.fmean(ceiling([p]) for p in paths)
        row["rare ratio by step"] = [statistics.fmean(p[i]["rare ratio"] for p in paths)
                                     for i in range(len(paths[0]))]
        row["broke down"] = sum(min(x["listed"] for x in p) < BROKEN for p in paths)
        row["clip_frac"] = statistics.fmean(s["arms"][key][name]["clip_frac"] for s in seeds)
        rows[name] = row
    return rows


def sweep(args, gamma, n):
    return [arm_name(args.algo, gamma, lr, n) for lr in args.lrs]


def summarise_condition(traj, seeds, key, args):
    """One (warm start, mix): the base model, every arm, F minus the base algorithm at matched
    pass@1 (N = --n and exact), and F's gain at N = --n minus its gain with the exact update."""
    base = [t[key][sweep(args, 0.0, args.n)[0]][0] for t in traj]
    out = {"base": {m: mean_sd([b[m] for b in base]) for m in (x.format(k=args.k)
                                                                for x in BASE_KEYS)},
           "arms": arm_rows(traj, seeds, key, args.k), "frontier": {}, "n_minus_exact": {}}
    for n, gammas in ((args.n, args.gammas), ("exact", args.exact_gammas)):
        for g in gammas[1:]:
            out["frontier"][f"{g:g}/{n}"] = compare(traj, key, sweep(args, 0.0, n),
                                                    sweep(args, g, n), args)
    for g in [g for g in args.gammas[1:] if g in args.exact_gammas]:
        sampled, exact = (out["frontier"][f"{g:g}/{n}"] for n in (args.n, "exact"))
        if not sampled["unmatched"] and not exact["unmatched"]:
            diffs = [a - b for a, b in zip(sampled["gaps"], exact["gaps"])]
            out["n_minus_exact"][f"{g:g}"] = paired_summary(diffs)
    return out


def summarise(seeds, args):
    traj = trajectories(seeds, args)
    out = {"conditions": {key: summarise_condition(traj, seeds, key, args)
                          for key in seeds[0]["arms"]}}
    out["check"] = [{"seed": s["seed"], **{f"{w} pass@{k}": s["check"][w][k] for w in
                                            ("sampled", "exact") for k in s["check"]["sampled"]}}
                    for s in seeds if s.get("check")]
    return out
# ---------------------------------------------------------------- the report
def ci(s, digits=3):
    """A paired summary as "mean [lo, hi]"."""
    if s is None:
        return "-"
    if s["lo"] is None:
        return f"{s['mean']:+.{digits}f}"
    return f"{s['mean']:+.{digits}f} [{s['lo']:+.{digits}f}, {s['hi']:+.{digits}f}]"


def tests(s):
    """A paired summary's tests: "p_t / p_Wilcoxon, positive/n"."""
    if s is None or s["p_t"] is None:
        return "-"
    return f"{s['p_t']:.2g} / {s['p_wilcoxon']:.2g}, {s['positive']}/{s['n']}"


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def comparison_label(name, args):
    gamma, n = name.split("/")
    return f"gamma {gamma}, " + ("exact" if n == "exact" else f"N {n}")


def describe(key):
    start, mix = key.split("/")
    first, last = WARM_STARTS[start]
    shares = ", ".join(f"{kind} {MIXES[mix][kind]:g}" for kind in KINDS)
    return (f"warm start \"{start}\" (targets: first digit {first:g}, last {last:g}, the rest "
            f"uniform), mix \"{mix}\" ({shares})")


def glance_markdown(summary, args):
    """Every condition in one table: the base's rare ratio, F's gain averaged over levels and at
    the top level."""
    names = list(next(iter(summary["conditions"].values()))["frontier"])
    head = ["condition", "base rare ratio"] + [f"{comparison_label(x, args)}: {part}"
                                               for x in names for part in ("mean", "top level")]
    rows = []
    for key, res in summary["conditions"].items():
        ratio = res["base"]["rare ratio"]
        row = [key, f"{ratio[0]:.2f} ± {ratio[1]:.2f}"]
        for x in names:
            c = res["frontier"][x]
            row += [ci(c["gap"], 4), ci(c["by_level"][-1] if c["by_level"] else None, 4)]
        rows.append(row)
    return ["## At a glance: F minus " + args.algo.upper() + f", pass@{args.k} at matched pass@1",
            "", f"Per seed on its matched range, averaged over the {args.levels} levels (mean) "
            "and at the top level; mean [95% t interval] over seeds. Rare ratio: the last digit's "
            "mass over one wrong digit's at the base model, mean ± sd over seeds.", "",
            *table(head, rows), ""]


def frontier_markdown(res, args):
    k, algo = args.k, args.algo.upper()
    lines = [f"F minus {algo}, pass@{k} at matched pass@1. Each seed has its own range: from its "
             "base model's pass@1 to the top, the lower of the two frontiers' ceilings (a "
             "ceiling: the highest pass@1 of any lr at any measured step); its levels are 1/L, "
             f"..., L/L of the way (L = {args.levels}; the base point is left out). The gain is "
             "averaged over the levels; the range's pass@1 is the mean over seeds of the lowest "
             "and the top level. Paired over seeds: mean [95% t interval]; tests: paired t p / "
             "exact Wilcoxon p, seeds > 0.", ""]
    rows = []
    for name, c in res["frontier"].items():
        span = f"{c['level_pass@1'][0]:.3f}-{c['level_pass@1'][-1]:.3f}" if c["gap"] else "none"
        rows.append([comparison_label(name, args), ci(c["gap"], 4), tests(c["gap"]), span,
                     "{:.3f} / {:.3f}".format(*c["ceilings"]), ci(c["ceiling"]),
                     tests(c["ceiling"]), c["unmatched"]])
    lines += table(["comparison", f"pass@{k} gain", "tests", "matched pass@1",
                    f"ceiling: {algo} / F", "ceiling gain", "tests", "seeds unmatched"], rows)
    for name, c in res["frontier"].items():
        lines += ["", f"{comparison_label(name, args)}: the gap at each level.", ""]
        rows = [[f"{j + 1}/{args.levels}", f"{x:.3f}", ci(s, 4), tests(s)]
                for j, (x, s) in enumerate(zip(c["level_pass@1"], c["by_level"]))]
        lines += table(["level", "pass@1 (mean)", f"pass@{k} gain", "tests"], rows)
    if res["n_minus_exact"]:
        lines += ["", f"F's gain at N {args.n} minus its gain with the exact update (each averaged "
                  "over its own levels), paired over seeds.", ""]
        rows = [[g, ci(s, 4), tests(s)] for g, s in res["n_minus_exact"].items()]
        lines += table(["gamma", "difference", "tests"], rows)
    return lines


def arms_markdown(res, args):
    k = args.k
    lines = ["", "Every arm, mean over seeds: final metrics, the highest pass@1 reached, the seeds "
             f"whose run broke down (answer space under {BROKEN} of the mass), tokens clipped.", ""]
    rows = [[arm, *(f"{r[m]:.3f}" for m in ("pass@1", f"pass@{k}", "rare mass")),
             f"{r['rare ratio']:.2f}", f"{r['highest pass@1']:.3f}", r["broke down"],
             f"{r['clip_frac']:.2g}"] for arm, r in res["arms"].items()]
    lines += table(["arm", "pass@1", f"pass@{k}", "rare mass", "rare ratio", "highest pass@1",
                    "broke down", "clip_frac"], rows)
    steps = [0] + [s for s in range(1, args.steps + 1)
                   if s % args.measure_every == 0 or s == args.steps]
    lines += ["", "The rare ratio along every run (mean over seeds; step 0: the base model).", ""]
    rows = [[arm] + [f"{v:.2f}" for v in r["rare ratio by step"]] for arm, r in res["arms"].items()]
    return lines + table(["arm", *(f"step {s}" for s in steps)], rows)


def markdown(summary, args, times):
    lines = [f"# See it happen: {len(args.starts)} warm starts x {args.seeds} seeds, {args.steps} "
             f"steps, N = {args.n}, {args.prompts} prompts per step", "",
             f"`python experiments/see_it_happen.py{' --quick' if args.quick else ''}`: "
             f"{times['wall_s'] / 60:.1f} min wall, {times['cpu_s'] / 60:.1f} CPU-min in "
             f"{args.workers} worker(s); load average {times['load'][0]:.1f} at the start, "
             f"{times['load'][1]:.1f} at the end (above {args.workers}: the cores were shared). "
             f"Every figure is exact over {args.heldout} held-out prompts (see the module "
             f"docstring); pass@{args.k} of a mix is the expectation over its kinds.", ""]
    lines += glance_markdown(summary, args)
    for key, res in summary["conditions"].items():
        base = res["base"]
        lines += [f"## {key}: {describe(key)}", "", "Base model, mean ± sd over seeds: " +
                  ", ".join(f"{m} {v[0]:.3f} ± {v[1]:.3f}" for m, v in base.items()), ""]
        lines += frontier_markdown(res, args) + arms_markdown(res, args) + [""]
    if summary["check"]:
        k = args.k
        lines += [f"## eval.py cross-check (sampled, n = {args.eval_n}) against the exact figures",
                  ""]
        rows = [[c["seed"]] + [f"{c[f'{w} pass@{x}']:.3f}" for x in ("1", str(k))
                               for w in ("sampled", "exact")] for c in summary["check"]]
        lines += table(["seed", "sampled pass@1", "exact pass@1", f"sampled pass@{k}",
                        f"exact pass@{k}"], rows)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the plot
def median_path(paths, keys):
    """The step-by-step median over seeds of trajectories measured at the same steps (a run that
    breaks down in one seed does not drag the line)."""
    return [[statistics.median(p[i][key] for p in paths) for i in range(len(paths[0]))]
            for key in keys]


def plot(traj, summary, args, path):
    """Per condition (a column): every run and the mean frontiers; the rare ratio along every run;
    F's gap at each matched level with its 95% interval."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: pip install matplotlib to get the plot")
        return
    keys = list(summary["conditions"])
    fig, axes = plt.subplots(3, len(keys), figsize=(6.5 * len(keys), 15), squeeze=False)
    for col, key in enumerate(keys):
        plot_runs(axes[0][col], axes[1][col], traj, key, args)
        plot_levels(axes[2][col], summary["conditions"][key], args)
        axes[0][col].set_title(f"{key}: runs (median over seeds); thick: mean frontier")
        axes[1][col].set_title(f"{key}: last digit's mass / one wrong digit's")
        axes[2][col].set_title(f"{key}: F minus {args.algo.upper()} at each matched level")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_runs(ax_front, ax_ratio, traj, key, args):
    """Every run's median path in (pass@1, pass@k) and (pass@1, rare ratio), and the mean frontiers;
    the axes show pass@1 from the base model up (a run that broke down falls off to the left)."""
    colors = {g: f"C{i}" for i, g in enumerate(sorted(set(args.gammas + args.exact_gammas)))}
    shown = []
    for n, gammas, style in ((args.n, args.gammas, "-"), ("exact", args.exact_gammas, "--")):
        for g in gammas:
            for lr in args.lrs:
                runs = [t[key][arm_name(args.algo, g, lr, n)] for t in traj]
                p1, pk, ratio = median_path(runs, ["pass@1", f"pass@{args.k}", "rare ratio"])
                label = f"gamma {g:g}, " + ("exact" if n == "exact" else f"N {n}")
                look = dict(linestyle=style, marker=".", color=colors[g], alpha=0.45, lw=1)
                ax_front.plot(p1, pk, **look)
                ax_ratio.plot(p1, ratio, label=label if lr == args.lrs[0] else None, **look)
                shown += list(zip(p1, pk, ratio))
            plot_mean_frontier(ax_front, traj, key, sweep(args, g, n), args, colors[g], style)
    lo = min(t[key][sweep(args, 0.0, args.n)[0]][0]["pass@1"] for t in traj) - 0.01
    inside = [(y, r) for x, y, r in shown if x >= lo]
    ys, ratios = [y for y, _ in inside], [r for _, r in inside]
    xlim = (lo, max(shown)[0] + 0.01)
    ax_front.set(xlabel="pass@1", ylabel=f"pass@{args.k}", xlim=xlim,
                 ylim=(min(ys) - 0.01, max(ys) + 0.005))
    ax_ratio.axhline(1, color="grey", lw=0.8)
    ax_ratio.set(xlabel="pass@1", ylabel="rare ratio (1: the uniform floor)", yscale="log",
                 xlim=xlim, ylim=(min(ratios + [1.0]) / 1.3, max(ratios) * 1.3))
    ax_ratio.legend(fontsize=7)


def plot_mean_frontier(ax, traj, key, names, args, color, style):
    lo = min(t[key][names[0]][0]["pass@1"] for t in traj)
    hi = min(ceiling([t[key][n] for n in names]) for t in traj)
    xs = [lo + (hi - lo) * i / 40 for i in range(41)]
    ys = [[frontier_at([t[key][n] for n in names], x, args.k) for t in traj] for x in xs]
    pts = [(x, statistics.fmean(y)) for x, y in zip(xs, ys) if None not in y]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, lw=2.5)


def plot_levels(ax, res, args):
    """Each comparison's gap at each level, at the level's mean pass@1: mean and 95% interval."""
    for i, (name, c) in enumerate(res["frontier"].items()):
        if not c["by_level"]:
            continue
        xs = [x + 0.0015 * i for x in c["level_pass@1"]]
        means = [s["mean"] for s in c["by_level"]]
        err = [[s["mean"] - (s["lo"] if s["lo"] is not None else s["mean"]) for s in c["by_level"]],
               [(s["hi"] if s["hi"] is not None else s["mean"]) - s["mean"] for s in c["by_level"]]]
        ax.errorbar(xs, means, yerr=err, fmt="o-", ms=3, capsize=2, lw=1, color=f"C{i}",
                    label=comparison_label(name, args))
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="pass@1 of the level (mean over seeds)",
           ylabel=f"pass@{args.k} gain, mean and 95% t interval over seeds")
    ax.legend(fontsize=7)


# ---------------------------------------------------------------- main
HAND_WRITTEN = "<!-- written by hand above this line; see_it_happen.py writes the rest -->"


def write_results(result, args):
    """OUT/NAME.json, .md and .png from a run's seeds, settings and times. The part of an existing
    OUT/NAME.md above HAND_WRITTEN (a reading of the results) is kept."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result))
    md = args.out / f"{args.name}.md"
    old = md.read_text() if md.exists() else ""
    kept = old[:old.index(HAND_WRITTEN)] + HAND_WRITTEN + "\n\n" if HAND_WRITTEN in old else ""
    md.write_text(kept + markdown(result["summary"], args, result["times"]))
    plot(trajectories(result["seeds"], args), result["summary"], args,
         args.out / f"{args.name}.png")
    print(f"results: {args.out / args.name}.json, .md, .png", flush=True)


def report_only(args):
    """The summary, tables and plot again from a finished run's JSON, with its settings."""
    source = args.out / f"{args.name}.json"
    if not source.exists():
        sys.exit(f"--report-only: no {source} (--out names the folder of a finished run)")
    saved = json.loads(source.read_text())
    ran = argparse.Namespace(**{**saved["config"], "work": Path(saved["config"]["work"]),
                                "out": args.out})
    saved["summary"] = summarise(saved["seeds"], ran)
    write_results(saved, ran)
    return saved


def main(argv=None):
    args = parse_args(argv)
    if args.report_only:
        return report_only(args)
    t0, load = time.time(), os.getloadavg()[0]
    heldout = make_digits(args.heldout, random.Random(10_000))
    args.work.mkdir(parents=True, exist_ok=True)
    for mix in args.mixes:  # eval.py's file: the held-out prompts with kinds in the mix's shares
        problems = make_problems(heldout, mix, None, exact_shares=True)
        text = "".join(json.dumps(p) + "\n" for p in problems)
        (args.work / f"heldout_{mix}.jsonl").write_text(text)
    seeds, cpu = run_jobs(args, heldout)
    summary = summarise(seeds, args)
    times = {"wall_s": time.time() - t0, "cpu_s": cpu, "load": [load, os.getloadavg()[0]]}
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {"config": config, "heldout": heldout, "seeds": seeds, "summary": summary,
              "times": times}
    write_results(result, args)
    print(markdown(summary, args, times))
    return result


if __name__ == "__main__":
    main()
