"""See it happen: F-GRPO against its base algorithm through fgrpo.train itself, on a task with the
paper's structure, where every answer's probability is exact.

The paper's claim (arXiv 2602.06717, Sec. 3-4): with a small group, group-relative RL sharpens onto
the correct solutions it samples; a rare correct solution that goes unsampled loses mass, and pass@k
at large k falls. The focal weight g = (1 - X/N)^gamma is to keep more of it at the same pass@1.

    python experiments/see_it_happen.py             # the exploration: seeds 0-9
    python experiments/see_it_happen.py --confirm   # the confirmation: seeds 10-19, and more
    python experiments/see_it_happen.py --quick     # the whole pipeline in miniature, minutes
    python experiments/see_it_happen.py --out experiments/results --report-only  # tables again

The design, its rules and its endpoints are experiments/see_it_happen_protocol.toml's, which was
committed before the confirmation ran; the defaults and constants below are read from it. A run
is resumable: every finished arm and warm start is cached under --work with its settings.

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
favoured only by its head start and by what small groups sample. docs/why-focal.md derives both
objectives; experiments/two_strategy.py simulates them.

Warm starts (WARM_STARTS, --starts): supervised steps towards a target answer distribution, then 50
more at a time until the stopping rule holds on training prompts (never the held-out ones): the
first digit holds half the mass, and the last digit WARM_MIN_RATIO times one wrong digit's (the
"rare ratio"). "rare" (the main result) makes the rare strategy rare, mass 0.037 ± 0.002 over
10 seeds, yet a strategy (3.6 times a wrong digit): a sharp base, whose pass@k has room to move
up to k 32. "strategy" gives it about 0.12 (3 times a wrong digit too: pass@k saturates early).

Arms, all from the same warm-started model per (seed, start), through fgrpo.train (its sampler,
optimiser, losses, checkpoints; --rollout hf) with fgrpo.Hooks: score = answer_set_verify (the
answer sets are not math-verify's), after_step = the exact measurement. The base algorithm (--algo,
DAPO) at every --lrs and --gammas (0: the base; 1: F) with N = --n, and the exact expected update
(every completion of the answer space weighted by its probability, the limit N -> infinity: the
hooks sample and advantages of exact_update_hooks) at every --lrs and --exact-gammas.

Measured exactly every --measure-every steps on --heldout prompts, from fgrpo.token_logprobs over
the whole answer space: every digit's mass per prompt, hence pass@k = sum over kinds of share *
mean_x [1 - (1 - p_kind(x))^k] for every k in KS = 1, 2, 4, ..., 256; and the mechanism: the rare
strategy's share of the correct mass, last / (first + last), its median over prompts, and the
fraction of prompts where it is lost (share under LOST).

Frontiers (experiments/frontiers.py): broken-down runs are kept out; at a pass@1 level, an arm's
frontier is the best value any of its stable runs has where it crosses the level (so at k = 1 the
gap is 0). Each seed has its own matched range, from its base model's pass@1 to the lower of the
two arms' ceilings, --levels levels of it; the seed is the unit (paired over seeds, 95% t
intervals, t and exact Wilcoxon tests: experiments/paired.py). eval.py's sampler cross-checks the
exact pass@k curve on one model per seed. The headline k: per start, the largest k whose base
pass@k (mean over seeds) is at most HEADLINE_MAX, so that the metric has room to move; every
table gives all of KS.
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
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
import eval as evaluator  # noqa: E402  (eval.py; the alias keeps the builtin eval)
import fgrpo  # noqa: E402
import see_it_happen_figures as figures  # noqa: E402
import see_it_happen_report as report  # noqa: E402
from frontiers import (BROKEN, broke_down, ceiling, compare, final_deltas, finals,  # noqa: E402
                       frontier_at, frontier_lrs, gain_difference, mean_sd, median_path, mix_of,
                       seed_levels, arm_name, bracket, sweep, sweep_of)
from paired import paired_summary  # noqa: E402

PROTOCOL_PATH = ROOT / "experiments" / "see_it_happen_protocol.toml"
PROTOCOL = tomllib.loads(PROTOCOL_PATH.read_text())
DESIGN = PROTOCOL["design"]  # the defaults of the flags below
RULES = PROTOCOL["rules"]
DIGITS = [str(d) for d in range(10)]
WRONG_DIGITS = 8  # the ten digits but the first and the last (a prompt's digits are distinct)
KINDS = ("both", "rare", "common")
MIXES = PROTOCOL["mixes"]
KS = tuple(RULES["ks"])  # pass@k at k = 1, 2, 4, ..., 256
HEADLINE_MAX = RULES["headline_max"]  # the headline k: the largest k with base pass@k at most this
LOST = RULES["lost"]  # the rare strategy is lost on a prompt where its share is under this
# warm-start targets: (first digit, last digit), the rest uniform over the ten digits, and the
# rare ratio its stopping rule asks for
WARM_STARTS = {k: tuple(w["target"]) for k, w in PROTOCOL["warm_starts"].items()
               if isinstance(w, dict)}
WARM_MIN_RATIO = {k: w["min_ratio"] for k, w in PROTOCOL["warm_starts"].items()
                  if isinstance(w, dict)}
RULE_PROMPTS = PROTOCOL["warm_starts"]["rule_prompts"]  # training prompts the stopping rule reads


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_design_flags(p.add_argument)
    add_run_flags(p.add_argument)
    args = p.parse_args(argv)
    if args.confirm:  # the protocol's confirmation: its seeds, and the analyses run on them alone
        args.first_seed, args.seeds = PROTOCOL["seeds"]["confirmation"]
        args.bracket_lrs = PROTOCOL["bracket"]["lrs"]
        args.ceiling_seeds = PROTOCOL["ceilings"]["seeds"]
        args.ceiling_steps = PROTOCOL["ceilings"]["steps"]
    if args.quick:
        quick = dict(seeds=2, starts=["rare", "strategy"], lrs=[1e-4, 1e-3], steps=4, prompts=8,
                     mini_batch=4, warm_steps=40, train_problems=200, heldout=12,
                     measure_every=2, eval_n=16, levels=4, bracket_lrs=[3e-5], ceiling_seeds=1,
                     ceiling_steps=6, work=args.work.with_name(args.work.name + "_quick"))
        vars(args).update(quick)
    args.name = args.name or "see_it_happen_" + ("confirmation" if args.confirm else "exploration")
    args.name += "_quick" * args.quick
    args.out = args.out or args.work / "results"
    check_args(p, args)
    return args


def add_design_flags(a):
    """The design's flags, their defaults the protocol's [design] (the exploration seeds)."""
    d = DESIGN
    a("--seeds", type=int, default=PROTOCOL["seeds"]["exploration"][1],
      help="seeds FIRST..FIRST+S-1 (--first-seed): each its own warm start, data, samples")
    a("--first-seed", type=int, default=PROTOCOL["seeds"]["exploration"][0], help="the first seed")
    a("--starts", nargs="+", default=[d["start"]], choices=list(WARM_STARTS),
      help="warm starts (WARM_STARTS); the first is the main result")
    a("--mixes", nargs="+", default=[d["mix"]], choices=list(MIXES), help="problem mixes (MIXES)")
    a("--algo", default=d["algo"], choices=sorted(fgrpo.PAPER_EPS), help="the base algorithm")
    a("--lrs", type=float, nargs="+", default=d["lrs"], help="AdamW lrs of every arm: each "
      "frontier is taken over these")
    a("--gammas", type=float, nargs="+", default=d["gammas"],
      help="focal exponents at N = --n; 0 (the base algorithm) first")
    a("--exact-gammas", type=float, nargs="*", default=d["exact_gammas"],
      help="focal exponents of the exact expected update (N -> infinity); 0 first, or none")
    a("--steps", type=int, default=d["steps"], help="rollout steps of every arm")
    a("--n", type=int, default=d["n"], help="group size N of the sampled arms")
    a("--prompts", type=int, default=d["prompts"], help="prompts per rollout step")
    a("--mini-batch", type=int, default=d["mini_batch"], help="prompts per optimiser step")
    a("--warm-steps", type=int, default=d["warm_steps"], help="supervised warm-start steps")
    a("--train-problems", type=int, default=d["train_problems"], help="training problems a seed")
    a("--heldout", type=int, default=d["heldout"], help="held-out prompts (exact metrics)")
    a("--measure-every", type=int, default=d["measure_every"], help="exact probabilities every "
      "K steps, and at the last")
    a("--levels", type=int, default=d["levels"], help="matched-pass@1 levels per seed, at 1/L .. "
      "L/L of the way from the base model's pass@1 to the top of the matched range")
    a("--eval-n", type=int, default=d["eval_n"], help="eval.py's samples per held-out problem")
    a("--bracket-lrs", type=float, nargs="*", default=[], help="more lrs of every arm, kept out "
      "of the frontiers above: does a lower lr lift them (the protocol's [bracket])")
    a("--ceiling-seeds", type=int, default=0, help="on the first K seeds, each N-n arm's best "
      "stable run again for --ceiling-steps (the protocol's [ceilings])")
    a("--ceiling-steps", type=int, default=2 * d["steps"], help="steps of those runs")


def add_run_flags(a):
    a("--confirm", action="store_true", help="the protocol's confirmation: its seeds, with "
      "--bracket-lrs and the ceiling runs as it fixes them")
    a("--workers", type=int, default=2, help="processes, one (seed, start) each at a time")
    a("--work", type=Path, default=ROOT / "runs" / "see_it_happen",
      help="models, runs and finished arms: a rerun reuses arms finished with the same settings")
    a("--out", type=Path, help="results folder; default WORK/results, so that a run never "
      "overwrites the committed experiments/results unless told to (--out experiments/results)")
    a("--name", help="prefix of the result files; default see_it_happen_exploration, or "
      "_confirmation with --confirm (and _quick with --quick)")
    a("--quick", action="store_true", help="miniature: 2 seeds, 2 lrs, 4 steps, small batches")
    a("--report-only", action="store_true", help="the summary, tables and figures again from the "
      "runs in OUT/NAME.json (its settings and times), without training")


def check_args(p, args):
    if args.gammas[0] != 0 or len(set(args.gammas)) < 2:
        p.error("--gammas: 0 (the base algorithm) first, then at least one focal gamma")
    if args.exact_gammas and (args.exact_gammas[0] != 0 or len(set(args.exact_gammas)) < 2):
        p.error("--exact-gammas: none, or 0 first and at least one focal gamma")
    if args.prompts % args.mini_batch:
        p.error("--prompts must divide into --mini-batch")
    if args.seeds < 2 or args.levels < 1 or args.eval_n < 2:
        p.error("--seeds >= 2 (the seed is the unit), --levels >= 1, --eval-n >= 2")
    if set(args.bracket_lrs) & set(args.lrs) or args.ceiling_seeds > args.seeds:
        p.error("--bracket-lrs must not repeat --lrs; --ceiling-seeds at most --seeds")

# ---------------------------------------------------------------- the task
def make_digits(count, rng, exclude=()):
    """`count` distinct lists of five distinct digits, none in `exclude`."""
    seen = set(map(tuple, exclude))
    out = []
    while len(out) < count:
        digits = tuple(rng.sample(range(10), 5))
        if digits not in seen:
            seen.add(digits)
            out.append(list(digits))
    return out


def heldout_set(count):  # the held-out prompts every arm is measured on, in every experiment
    return make_digits(count, random.Random(10_000))


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


def answer_set_verify(completions, golds):
    """fgrpo.Hooks.score of this task: 1.0 where the completion's last \\boxed{...} is one of the
    comma-separated answers of its gold, else 0.0 (exact match after strip)."""
    scores = []
    for text, gold in zip(completions, golds):
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
        accepted = {a.strip() for a in gold.split(",")}
        scores.append(float(bool(boxed) and boxed[-1].strip() in accepted))
    return scores


def prompt_ids(tok, digits):  # as fgrpo.rollout tokenises a prompt (tiny's tokenizer: no template)
    return tok(prompt_text(digits), add_special_tokens=False).input_ids

# ---------------------------------------------------------------- the warm start
def warm_start(seed, prior, steps, digit_lists, min_ratio):
    """fgrpo.build_tiny's untrained model and tokenizer, then supervised AdamW steps (lr 2e-3, clip
    1.0) on 16 training prompts each, towards the target answer distribution: `steps`, then 50
    more at a time (up to 4 x steps) until the stopping rule holds on the first RULE_PROMPTS of
    digit_lists, the training prompts. Returns the model, the tokenizer and the steps taken."""
    model, tok, _, _ = fgrpo.build_tiny(seed, warm_steps=0)  # seeds torch: one init per seed
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    answers = [answer_completions(tok, d)[0] for d in DIGITS]
    done = 0
    while done == 0 or (done < 4 * steps
                        and not learnt(model, tok, digit_lists[:RULE_PROMPTS], min_ratio)):
        block = steps if done == 0 else min(50, 4 * steps - done)
        model.train()
        for _ in range(block):
            warm_step(model, tok, opt, answers, [rng.choice(digit_lists) for _ in range(16)],
                      prior)
        done += block
    return model.eval(), tok, done


def warm_step(model, tok, opt, answers, prompts, prior):
    """One step of the cross-entropy against all ten "\\boxed{d}<eos>" (not sampled targets: seeds
    then learn to copy alike): the first digit prior[0], the last prior[1], the rest uniform."""
    target = torch.full((len(prompts), 10), (1 - sum(prior)) / 10)
    for i, digits in enumerate(prompts):
        target[i, digits[0]] += prior[0]
        target[i, digits[-1]] += prior[1]
    pairs = [(prompt_ids(tok, x), a) for x in prompts for a in answers]
    logp = sequence_logprobs(model, tok, pairs).view(len(prompts), 10)
    loss = -(target * logp).sum() / len(prompts)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def learnt(model, tok, digit_lists, min_ratio):
    """The warm start's stopping rule, on the prompts it is given (training ones): the first digit
    holds half the mass, and the last digit min_ratio times one wrong digit's."""
    point = strategy_probs(model.eval(), tok, digit_lists)
    return statistics.fmean(point["first"]) >= 0.5 and rare_ratio(point) >= min_ratio

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


def rare_ratio(point):
    """The rare strategy's mass over one wrong digit's, each a mean over the prompts."""
    wrong = statistics.fmean(point["wrong"]) / WRONG_DIGITS
    return statistics.fmean(point["last"]) / max(wrong, 1e-12)


def pass_curve(ps):
    """{k: mean over prompts of 1 - (1 - p)^k} for k in KS, p a prompt's success probability."""
    return {k: statistics.fmean(1 - (1 - p) ** k for p in ps) for k in KS}


def exact_metrics(point, base, mix):
    """pass@k for k in KS (the expectation over the mix's kinds), rare pass@k (the rare kind), the
    two strategies' masses, one wrong digit's, the rare ratio, the rare share (median over prompts
    of last / (first + last)) and the fraction of prompts where it is lost (share under LOST), the
    answer space's mass (listed) and M_ret (1 - lost / initial mass of the accepted answers, each
    weighted by the share of the kinds that accept it; the paper's retention, App. Q)."""
    shares = MIXES[mix]
    curves = {kind: pass_curve(success_probs(point, kind)) for kind in KINDS}
    out = {f"pass@{k}": sum(shares[kind] * curves[kind][k] for kind in KINDS) for k in KS}
    out.update({f"rare pass@{k}": curves["rare"][k] for k in KS})
    out["rare mass"] = statistics.fmean(point["last"])
    out["common mass"] = statistics.fmean(point["first"])
    out["wrong mass"] = statistics.fmean(point["wrong"]) / WRONG_DIGITS
    out["rare ratio"] = rare_ratio(point)
    share = [l / max(f + l, 1e-12) for f, l in zip(point["first"], point["last"])]
    out["rare share"] = statistics.median(share)
    out["rare lost"] = sum(s < LOST for s in share) / len(share)
    out["listed"] = point["listed"]
    w_last, w_first = shares["both"] + shares["rare"], shares["both"] + shares["common"]
    lost = sum(w_last * max(0.0, l0 - l) + w_first * max(0.0, f0 - f) for f0, l0, f, l in
               zip(base["first"], base["last"], point["first"], point["last"]))
    held = sum(w_last * l0 + w_first * f0 for f0, l0 in zip(base["first"], base["last"]))
    out["M_ret"] = 1 - lost / held
    return out
# ---------------------------------------------------------------- one arm: fgrpo.train
def fgrpo_argv(arm, args, seed, data, base_dir, out, group):
    """fgrpo.py's command line of an arm: the tiny model's settings spelled out (--model is a
    folder here, so fgrpo's TINY defaults do not apply), a step per --mini-batch prompts."""
    per_update = args.mini_batch * group
    return ["--model", str(base_dir), "--data", str(data), "--algo", arm["algo"],
            "--gamma", repr(arm["gamma"]), "--lr", repr(arm["lr"]), "--n", str(group),
            "--prompts", str(args.prompts), "--mini-batch", str(args.mini_batch),
            "--micro-batch", str(per_update), "--gen-batch", str(args.prompts * group),
            "--warmup", "0", "--max-new-tokens", str(MAX_NEW), "--steps", str(arm["steps"]),
            "--save-every", str(arm["steps"]), "--seed", str(seed), "--rollout", "hf",
            "--out", str(out)]


def exact_update_hooks(tok):
    """fgrpo.Hooks' sample and advantages for the exact expected update (N -> infinity): every
    prompt's "group" is its whole answer space (answer_completions of all ten digits, K sequences),
    and each completion's advantage is pi_old(o) * A_inf(o), A_inf = g * (R - p) / sqrt(p (1 - p))
    with p the exact success probability, g = (1 - p)^gamma: the N -> infinity limit of Sec. 2's
    advantage. Times the old-policy probability, the token-mean loss's gradient is then
    E_{o ~ pi_old}[A_inf grad log pi(o)] / (canonical completion length): the sampled arms' scale.
    Returns the hooks and K, the arm's --n."""
    seqs = [s for d in DIGITS for s in answer_completions(tok, d)]
    scale = sum(map(len, seqs)) / len(seqs[0])  # tokens per prompt over one completion's tokens
    state = {}

    def sample(model, tok_, engine, prompts, n, args, seed):  # n == len(seqs): see fgrpo_argv
        ids = [tok_(p, add_special_tokens=False).input_ids for p in prompts]
        pairs = [(i, s) for i in ids for s in seqs]
        with torch.no_grad():
            state["probs"] = sequence_probs(model, tok_, pairs).view(len(ids), len(seqs))
        return [fgrpo.Sample(i, s, s[-1] != tok_.eos_token_id) for i, s in pairs]

    def advantages(rewards, samples, args):
        pi, r = state["probs"], rewards.float()
        p = (pi * r).sum(-1, keepdim=True)
        a_inf = (r - p) / (p * (1 - p)).clamp(min=1e-12).sqrt() * (1 - p) ** args.gamma
        return scale * pi * a_inf

    return {"sample": sample, "advantages": advantages}, len(seqs)


def own_hooks(arm):
    """What an arm brings of its own beside its command line (another experiment's arms): "hooks",
    fgrpo.Hooks fields, named by their functions (not their module, which is __main__ in one
    process and not in another); "options", set on fgrpo's args for those hooks to read. Both
    enter the arm's cache settings, so that no arm reuses another's run of the same command line."""
    out = {}
    if arm.get("hooks"):
        out["hooks"] = {field: f.__qualname__ for field, f in arm["hooks"].items()}
    if arm.get("options"):
        out["options"] = arm["options"]
    return out


def train_arm(arm, ctx, keep=False):
    """fgrpo.train on the seed's base model, measuring the held-out prompts' exact probabilities
    every --measure-every steps (Hooks.after_step). Cached in WORK/START/seedS/MIX/ARM.json."""
    args, tok = ctx["args"], ctx["tok"]
    out = ctx["dir"] / arm["mix"] / arm["name"]
    swapped = dict(arm.get("hooks", {}))
    group = args.n
    if arm["n"] == "exact":
        swapped, group = exact_update_hooks(tok)
    argv = fgrpo_argv(arm, args, ctx["seed"], ctx["data"][arm["mix"]], ctx["dir"] / "base", out,
                      group)
    settings = {"argv": argv, "base": ctx["base_settings"], "every": args.measure_every,
                **own_hooks(arm)}
    cache = out.parent / (out.name + ".json")
    if cache.exists() and not keep and json.loads(cache.read_text())["settings"] == settings:
        return json.loads(cache.read_text())["record"]
    shutil.rmtree(out, ignore_errors=True)  # fgrpo.train refuses a folder that holds a run
    out.mkdir(parents=True)
    curve = []
    t0 = time.time()
    cpu = time.process_time()

    def measure(model, step, metrics):
        if step % args.measure_every == 0 or step == arm["steps"]:
            curve.append({"step": step, **strategy_probs(model, tok, ctx["heldout"])})

    hooks = fgrpo.Hooks(score=answer_set_verify, after_step=measure, **swapped)
    sigterm = signal.getsignal(signal.SIGTERM)  # fgrpo.train sets its own (save, then exit)
    with open(out / "train.log", "w") as log:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            try:
                fgrpo.train(argparse.Namespace(**{**vars(fgrpo.parse_args(argv)),
                                                  **arm.get("options", {})}), hooks)
            finally:
                signal.signal(signal.SIGTERM, sigterm)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    record = {k: arm[k] for k in ("algo", "gamma", "lr", "n")}
    for key in ("focal_mean", "clip_frac", "grad_norm"):  # exact arms: over enumerated completions
        record[key] = statistics.fmean(r[key] for r in rows)
    record.update(curve=curve, seconds=round(time.time() - t0, 1),
                  cpu_s=round(time.process_time() - cpu, 1))
    write_atomic(cache, {"settings": settings, "record": record})
    if not keep:
        shutil.rmtree(out)
    return record


def write_atomic(path, obj):  # a kill leaves the old file or the new one, never half of one
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)

# ---------------------------------------------------------------- a seed: base model, then its arms
def prepare_seed(seed, start, args, heldout):
    """The context of (seed, warm start): its warm-started base model (WORK/START/seedS/base, reused
    if its settings match), its training files (one per mix: the same problems for every start)
    and the held-out masses of the base model, with the warm start's steps and times."""
    from transformers import AutoTokenizer
    root = args.work / start / f"seed{seed}"
    train_digits = make_digits(args.train_problems, random.Random(seed), exclude=heldout)
    min_ratio = 0.0 if args.quick else WARM_MIN_RATIO[start]  # --quick: as fast as it can
    settings = {"prior": list(WARM_STARTS[start]), "warm_steps": args.warm_steps,
                "min_ratio": min_ratio, "rule_prompts": RULE_PROMPTS, "heldout": heldout,
                "train_problems": args.train_problems}
    saved = root / "base" / "settings.json"
    if saved.exists() and json.loads(saved.read_text())["settings"] == settings:
        base = json.loads(saved.read_text())["base"]
        tok = AutoTokenizer.from_pretrained(root / "base")
    else:
        t0 = time.time()
        cpu = time.process_time()
        model, tok, steps = warm_start(seed, WARM_STARTS[start], args.warm_steps, train_digits,
                                       min_ratio)
        model.save_pretrained(root / "base")
        tok.save_pretrained(root / "base")
        base = {**strategy_probs(model, tok, heldout), "warm_steps": steps,
                "seconds": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - cpu, 1)}
        write_atomic(saved, {"settings": settings, "base": base})
    data = {}
    for mix in args.mixes:
        problems = make_problems(train_digits, mix, random.Random(f"{seed}/{mix}"))
        data[mix] = root / f"{mix}.jsonl"
        data[mix].write_text("".join(json.dumps(p) + "\n" for p in problems))
    return {"args": args, "seed": seed, "start": start, "tok": tok, "dir": root,
            "heldout": heldout, "data": data, "base": base, "base_settings": settings}


def arm_specs(args):
    """Every arm of a (seed, start, mix): (gamma, lr, n), N = --n at --gammas and the exact update
    at --exact-gammas, every lr of --lrs and --bracket-lrs."""
    return [(g, lr, n) for lr in args.lrs + args.bracket_lrs
            for n, gammas in ((args.n, args.gammas), ("exact", args.exact_gammas)) for g in gammas]


def run_job(seed, start, args, heldout):
    """One (seed, warm start), on one torch thread: its base model and every arm in every mix; in
    the main start's first mix, eval.py's cross-check of F's sampled arm at the first lr, and on
    the first --ceiling-seeds seeds the ceiling runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import transformers.utils.logging as hf_logging
    hf_logging.disable_progress_bar()  # no checkpoint progress bars in the log
    try:
        ctx = prepare_seed(seed, start, args, heldout)
        arms = {mix: {} for mix in args.mixes}
        check = None
        ceilings = {}
        main_start = start == args.starts[0]
        for mix in args.mixes:
            for gamma, lr, n in arm_specs(args):
                arm = {"mix": mix, "algo": args.algo, "gamma": gamma, "lr": lr, "n": n,
                       "name": arm_name(args.algo, gamma, lr, n), "steps": args.steps}
                keep = main_start and (mix, gamma, lr, n) == (args.mixes[0], args.gammas[-1],
                                                              args.lrs[0], args.n)
                arms[mix][arm["name"]] = record = train_arm(arm, ctx, keep=keep)
                report_arm(ctx, arm, record)
                if keep:
                    check = cross_check(ctx, arm, record)
            if main_start and seed - args.first_seed < args.ceiling_seeds:
                ceilings[f"{start}/{mix}"] = ceiling_runs(ctx, mix, arms[mix])
    finally:
        torch.set_num_threads(threads)
    return {"seed": seed, "start": start, "base": ctx["base"], "arms": arms, "check": check,
            "ceilings": ceilings}


def report_arm(ctx, arm, record):
    last = exact_metrics(record["curve"][-1], ctx["base"], arm["mix"])
    print(f"seed {ctx['seed']} {ctx['start']}/{arm['mix']} {arm['name']:26s} pass@1 "
          f"{last['pass@1']:.3f} rare share {last['rare share']:.3f} ({record['seconds']:.0f} s)",
          flush=True)


def ceiling_runs(ctx, mix, arms):
    """Per N = --n arm (gamma), its best stable run of --lrs on this seed (the highest pass@1 of
    any measurement) again for --ceiling-steps: {"GAMMA/N": its record, with the lr it took}."""
    args = ctx["args"]
    out = {}
    for gamma in args.gammas:
        paths = {name: [exact_metrics(p, ctx["base"], mix) for p in arms[name]["curve"]]
                 for name in sweep(args, gamma, args.n)}
        stable = [name for name, path in paths.items() if not broke_down(path)]
        if not stable:
            continue
        best = max(stable, key=lambda name: ceiling([paths[name]]))
        arm = {"mix": mix, "algo": args.algo, "gamma": gamma, "lr": arms[best]["lr"],
               "n": args.n, "name": f"{best}_steps{args.ceiling_steps}",
               "steps": args.ceiling_steps}
        out[f"{gamma:g}/{args.n}"] = record = train_arm(arm, ctx)
        report_arm(ctx, arm, record)
    return out


def cross_check(ctx, arm, record):
    """eval.py's transformers sampler (fgrpo.rollout) draws --eval-n completions per held-out
    problem from the arm's final checkpoint (OUT/step_K); answer_set_verify scores them and
    eval.pass_at_k counts pass@k; beside it, the exact pass@k of the same problems."""
    args, out = ctx["args"], ctx["dir"] / arm["mix"] / arm["name"]
    data = args.work / f"heldout_{arm['mix']}.jsonl"
    problems = [json.loads(line) for line in data.read_text().splitlines()]
    eval_args = evaluator.build_parser().parse_args([
        "--model", str(out / f"step_{args.steps:06d}"), "--n", str(args.eval_n),
        "--seed", str(ctx["seed"]), "--max-new-tokens", str(MAX_NEW), "--rollout", "hf"])
    sample, tok = evaluator.transformers_sampler(eval_args)
    texts = sample([fgrpo.format_prompt(tok, p["problem"]) for p in problems],
                   [ctx["seed"] * 1_000_003 + i for i in range(len(problems))])
    correct = [int(sum(answer_set_verify(ts, [p["answer"]] * len(ts))))
               for ts, p in zip(texts, problems)]
    final = record["curve"][-1]
    ps = [success_probs(final, p["kind"])[i] for i, p in enumerate(problems)]
    ks = evaluator.powers_of_two(args.eval_n)
    shutil.rmtree(out)
    return {"arm": arm["name"], "start": ctx["start"], "mix": arm["mix"], "n": args.eval_n,
            "correct": correct, "exact": {str(k): statistics.fmean(1 - (1 - p) ** k for p in ps)
                                          for k in ks},
            "sampled": {str(k): float(evaluator.pass_at_k([args.eval_n] * len(correct), correct,
                                                          k).mean()) for k in ks}}


def run_jobs(args, heldout, job=run_job):
    """`job` (run_job's form and result; another experiment may bring its own arms) for every
    (seed, start), in --workers processes (spawned: each imports torch afresh with one thread), or
    here; then per seed, its conditions "START/MIX" side by side."""
    jobs = [(seed, start, args, heldout) for start in args.starts for seed in seed_range(args)]
    if args.workers == 1:
        done = [job(*spec) for spec in jobs]
    else:
        pool = multiprocessing.get_context("spawn").Pool(args.workers)
        try:
            done = pool.starmap(job, jobs, chunksize=1)
        finally:
            pool.close()  # the workers finish; terminate() would SIGTERM them mid-write
            pool.join()
    seeds = [{"seed": seed, "base": {}, "arms": {}, "check": None, "ceilings": {}}
             for seed in seed_range(args)]
    for finished in done:
        s = seeds[finished["seed"] - args.first_seed]
        for mix, arms in finished["arms"].items():
            s["base"][f"{finished['start']}/{mix}"] = finished["base"]
            s["arms"][f"{finished['start']}/{mix}"] = arms
        s["check"] = s["check"] or finished["check"]
        s["ceilings"].update(finished["ceilings"])
    return seeds


def seed_range(args):
    return range(args.first_seed, args.first_seed + args.seeds)
# ---------------------------------------------------------------- analysis: frontiers, seeds paired
MECHANISM = ("rare share", "rare lost")


def trajectories(seeds):
    """[seed] -> {condition: {arm: [metrics at step 0 (the base model), then every measurement]}};
    a seed is {"base": {condition: masses}, "arms": {condition: {arm: {"curve": [...]}}}}."""
    def path(base, curve, mix):
        return [{"step": p["step"], **exact_metrics(p, base, mix)}
                for p in [{"step": 0, **base}] + curve]

    return [{key: {name: path(s["base"][key], arm["curve"], mix_of(key)) for name, arm in
                   arms.items()} for key, arms in s["arms"].items()} for s in seeds]


def arm_rows(traj, seeds, key, headline):
    """Per arm, over its stable runs: means of the final pass@1 and pass@headline and of the
    highest pass@1; medians of the final rare share and lost fraction, and of both at every
    measurement; the share of tokens clipped (sampled arms: the exact arms' counts enumerated
    completions, not probability); and the seeds whose run broke down."""
    rows = {}
    for name in traj[0][key]:
        paths = [t[key][name] for t in traj]
        stable = [p for p in paths if not broke_down(p)] or paths  # all broke: shown, marked
        row = {m: statistics.fmean(p[-1][m] for p in stable)
               for m in ("pass@1", f"pass@{headline}")}
        row.update({m: statistics.median(p[-1][m] for p in stable) for m in MECHANISM})
        row["highest pass@1"] = statistics.fmean(ceiling([p]) for p in stable)
        row.update({f"{m} by step": median_path(stable, [m])[0] for m in MECHANISM})
        row["broke down"] = [i for i, p in enumerate(paths) if broke_down(p)]
        exact = name.endswith("_exact")
        row["clip_frac"] = None if exact else statistics.fmean(
            s["arms"][key][name]["clip_frac"] for s in seeds)
        rows[name] = row
    return rows


def headline_k(base):
    """The largest k in KS whose base pass@k (mean over seeds) is at most HEADLINE_MAX."""
    return max([k for k in KS if base[f"pass@{k}"][0] <= HEADLINE_MAX], default=1)


KS_METRICS = tuple(f"pass@{k}" for k in KS)
CURVE = KS_METRICS + MECHANISM


def summarise_condition(traj, seeds, key, args):
    """One (warm start, mix): the base model, every arm, F minus the base algorithm at matched
    pass@1 for every metric of CURVE (N = --n and exact), which lr makes each frontier, and F's
    gain at N = --n minus its gain with the exact update over the same levels."""
    base = [t[key][sweep(args, 0.0, args.n)[0]][0] for t in traj]
    keys = [*CURVE, "rare mass", "wrong mass", "rare ratio"]
    out = {"base": {m: mean_sd([b[m] for b in base]) for m in keys},
           "warm_steps": [s["base"][key]["warm_steps"] for s in seeds], "frontier": {},
           "frontier_lrs": {}, "n_minus_exact": {}, "about": describe(key),
           "constants": {"broken": BROKEN, "lost": LOST, "headline_max": HEADLINE_MAX}}
    out["headline_k"] = k = headline_k(out["base"])
    out["arms"] = arm_rows(traj, seeds, key, k)
    for n, gammas in ((args.n, args.gammas), ("exact", args.exact_gammas)):
        for g in gammas[1:]:
            pair = sweep(args, 0.0, n), sweep(args, g, n)
            res = {m: compare(traj, key, *pair, args, m) for m in CURVE}
            out["frontier"][f"{g:g}/{n}"] = res
            out["frontier_lrs"][f"{g:g}/{n}"] = [
                frontier_lrs(traj, key, names, res[f"pass@{k}"]["levels"], f"pass@{k}")
                for names in pair]
    out["versus_exact"] = {f"{b} - {a}": {m: compare(traj, key, sweep_of(args, a),
                                                       sweep_of(args, b), args, m) for m in CURVE}
                           for a, b in PROTOCOL["versus_exact"]["pairs"] if args.exact_gammas}
    if args.bracket_lrs:
        out["bracket"] = bracket(traj, key, args, KS_METRICS)
    for g in [g for g in args.gammas[1:] if g in args.exact_gammas]:
        groups = [sweep(args, x, n) for n in (args.n, "exact") for x in (0.0, g)]
        out["n_minus_exact"][f"{g:g}"] = {m: gain_difference(traj, key, groups, args, m)
                                          for m in CURVE}
    return out


def ceiling_summary(seeds, key, args):
    """The ceiling runs (--ceiling-seeds), per arm "GAMMA/N" and seed: its lr, the highest pass@1
    in --steps (the grid's run, "grid top") and in --ceiling-steps, its step, every metric of
    CURVE there; their means, and paired over seeds F minus the base arm there, and F's top
    minus the base arm's grid top."""
    runs = {}
    for s in seeds:
        for arm, record in s["ceilings"].get(key, {}).items():
            grid = s["arms"][key][arm_name(args.algo, record["gamma"], record["lr"], args.n)]
            path = trajectories([{**s, "arms": {key: {"long": record, "grid": grid}}}])[0][key]
            top = max(path["long"], key=lambda p: p["pass@1"])
            runs.setdefault(arm, {})[s["seed"]] = {
                "lr": record["lr"], "broke down": broke_down(path["long"]),
                "grid top": ceiling([path["grid"]]), **{m: top[m] for m in ("step", *CURVE)}}
    metrics = ("grid top", "step", *CURVE)
    out = {"runs": runs, "means": {arm: {m: statistics.fmean(r[m] for r in rs.values())
                                         for m in metrics} for arm, rs in runs.items()}}
    base = runs.get(f"0/{args.n}", {})
    for arm in [a for a in runs if a != f"0/{args.n}" and base]:
        pairs = [(base[seed], r) for seed, r in runs[arm].items() if seed in base]
        out[f"{arm} minus base"] = {m: paired_summary([b[m] - a[m] for a, b in pairs])
                                    for m in ("pass@1", *CURVE)}
        out[f"{arm} top minus base grid top"] = paired_summary(
            [b["pass@1"] - a["grid top"] for a, b in pairs])
    return out


def describe(key):
    start, mix = key.split("/")
    first, last = WARM_STARTS[start]
    shares = ", ".join(f"{kind} {MIXES[mix][kind]:g}" for kind in KINDS)
    return (f"warm start \"{start}\" (targets: first digit {first:g}, last {last:g}, the rest "
            f"uniform), mix \"{mix}\" ({shares})")


def summarise(seeds, args):
    traj = trajectories(seeds)
    out = {"conditions": {key: summarise_condition(traj, seeds, key, args)
                          for key in seeds[0]["arms"]}}
    for key, res in out["conditions"].items():
        if any(s.get("ceilings", {}).get(key) for s in seeds):
            res["ceilings"] = ceiling_summary(seeds, key, args)
    out["check"] = [{"seed": s["seed"], **{f"{w} pass@{k}": s["check"][w][k] for w in
                                            ("sampled", "exact") for k in s["check"]["sampled"]}}
                    for s in seeds if s.get("check")]
    return out, traj

# ---------------------------------------------------------------- main
def write_results(result, traj, args):
    """OUT/NAME.json, and the report: OUT/NAME.md, OUT/NAME.png, OUT/NAME_mechanism.png."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result))
    report.write(args.out / f"{args.name}.md", report.markdown(result, args))
    figures.draw(result, traj, args)
    names = [f"see_it_happen_{x}" + "_quick" * args.quick for x in ("confirmation", "exploration")]
    report.write_page(args.out, PROTOCOL, names)
    print(f"results: {args.out / args.name}.json, .md, .png, _mechanism.png", flush=True)


def config_of(args):
    """The settings for a results file; folders in the repository relative to it (no machine's)."""
    return {k: str(v.resolve().relative_to(ROOT) if v.resolve().is_relative_to(ROOT) else v)
            if isinstance(v, Path) else v for k, v in vars(args).items()}


def report_only(args):
    """The summary, tables and figures again from a finished run's JSON, with its settings."""
    source = args.out / f"{args.name}.json"
    if not source.exists():
        sys.exit(f"--report-only: no {source} (--out names the folder of a finished run)")
    saved = json.loads(source.read_text())
    ran = argparse.Namespace(**{**vars(parse_args([])), **saved["config"], "out": args.out,
                                "work": ROOT / saved["config"]["work"], "name": args.name})
    saved["summary"], traj = summarise(saved["seeds"], ran)
    write_results(saved, traj, ran)
    return saved


def main(argv=None):
    args = parse_args(argv)
    if args.report_only:
        return report_only(args)
    t0 = time.time()
    cpu = os.times()
    load = os.getloadavg()[0]
    heldout = heldout_set(args.heldout)
    args.work.mkdir(parents=True, exist_ok=True)
    for mix in args.mixes:  # eval.py's file: the held-out prompts with kinds in the mix's shares
        problems = make_problems(heldout, mix, None, exact_shares=True)
        text = "".join(json.dumps(p) + "\n" for p in problems)
        (args.work / f"heldout_{mix}.jsonl").write_text(text)
    seeds = run_jobs(args, heldout)
    summary, traj = summarise(seeds, args)
    now = os.times()
    spent = sum(now[i] - cpu[i] for i in range(4))  # this process and its workers, user + system
    times = {"wall_s": time.time() - t0, "cpu_s": spent, "load": [load, os.getloadavg()[0]],
             "cores": os.cpu_count()}
    result = {"config": config_of(args), "heldout": heldout, "seeds": seeds, "summary": summary,
              "times": times, "protocol_commit": report.committed(PROTOCOL_PATH)}
    write_results(result, traj, args)
    return result


if __name__ == "__main__":
    main()
