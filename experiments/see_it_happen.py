"""See it happen: F-GRPO against its base algorithm through fgrpo.train itself, on a task with the
paper's structure, where every answer's probability is exact.

The paper's claim (arXiv 2602.06717, Sec. 3-4): with a small group, group-relative RL sharpens onto
the correct solutions it samples; a rare correct solution that goes unsampled loses mass, and pass@k
at large k falls. The focal weight g = (1 - X/N)^gamma is to keep more of it at the same pass@1.

    python experiments/see_it_happen.py           # 10 seeds x 2 mixes: the README gives the time
    python experiments/see_it_happen.py --quick   # the whole pipeline in miniature
    python experiments/see_it_happen.py --seeds 3 --mixes tie --lrs 1e-4 3e-4 --workers 1

Task. A prompt lists five distinct digits, "(39147)=", and an answer is one digit, "\\boxed{3}".
Two strategies read the answer off the prompt: copy the first digit (common: the warm start gives
it about 0.6) and copy the last one (rare: about 0.05); the rest of the mass is spread over all ten
digits. A problem is of one of three kinds, with its mix's shares (MIXES):
    both    the first and the last digit are both accepted     (the majority kind)
    rare    only the last digit is accepted
    common  only the first digit is accepted
A problem's kind is fixed, and its digits do not show it (as a math problem does not show whether a
heuristic works on it): the policy cannot learn it, so a strategy's worth is its share of the
problems. In the "tie" mix the rare-only and common-only kinds are equally common, so neither
pass@1 nor GRPO's exact (infinite-N) objective prefers dropping the rare strategy; the common one is
favoured only by its head start and by what small groups sample. In the "rare" mix the rare strategy
is worth more. docs/why-focal.md derives both objectives; experiments/two_strategy.py simulates it.

Arms, all from the same warm-started model per seed, through fgrpo.train (its sampler, optimiser,
losses and checkpoints; --rollout hf): the base algorithm (--algo, DAPO) at every --lrs and
--gammas (0: the base; 0.5, 1: F) with N = --n; then at the frontier's best lr (the largest at
which no seed's gamma-0 run breaks down: best_lrs), --exact-gammas with the exact expected update
(every completion of the answer space, weighted by its probability: the limit N -> infinity),
and, in the first mix, the --others algorithms at gamma 0 and their paper gamma.

Measured exactly every --measure-every steps on --heldout prompts, from fgrpo.token_logprobs over
the whole answer space (answer_completions): the first and the last digit's mass per prompt, hence
pass@k = sum over kinds of share * mean_x [1 - (1 - p_kind(x))^k], rare pass@k (on the rare kind),
the rare strategy's mass, M_ret (SPEC Sec. 7). The seed is the unit: paired differences over seeds,
95% t intervals, paired t and exact Wilcoxon tests (experiments/paired.py). eval.py's sampled pass@k
of one model per seed is a cross-check of the exact figures.

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
KINDS = ("both", "rare", "common")
MIXES = {"tie": {"both": 0.6, "rare": 0.2, "common": 0.2},
         "rare": {"both": 0.6, "rare": 0.4, "common": 0.0}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--seeds", type=int, default=10, help="seeds 0..S-1: each its own warm start, data, samples")
    a("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES), help="problem mixes (MIXES)")
    a("--algo", default="dapo", choices=sorted(fgrpo.PAPER_EPS), help="the frontier's algorithm")
    a("--others", nargs="*", default=["grpo", "cispo"], choices=sorted(fgrpo.PAPER_EPS),
      help="algorithms run once at the frontier's best lr, at gamma 0 and their paper gamma")
    a("--lrs", type=float, nargs="+", default=[1e-5, 3e-5, 1e-4, 3e-4],
      help="AdamW lrs of the frontier, from 'barely moves' to 'collapses'")
    a("--gammas", type=float, nargs="+", default=[0.0, 0.5, 1.0], help="focal exponents; 0 first")
    a("--exact-gammas", type=float, nargs="*", default=[0.0, 0.5, 1.0],
      help="gammas of the exact expected update (N -> infinity) at the best lr")
    a("--steps", type=int, default=24, help="rollout steps of every arm")
    a("--n", type=int, default=8, help="group size N of the sampled arms")
    a("--prompts", type=int, default=16, help="prompts per rollout step")
    a("--mini-batch", type=int, default=4, help="prompts per optimiser step (App. L: 4 a rollout)")
    a("--prior", type=float, nargs=2, default=[0.6, 0.02], metavar=("FIRST", "LAST"),
      help="warm-start targets: the first digit, the last digit, else a uniform digit")
    a("--warm-steps", type=int, default=200, help="supervised warm-start steps (16 prompts each)")
    a("--train-problems", type=int, default=2000, help="training problems per seed and mix")
    a("--heldout", type=int, default=48, help="held-out prompts (exact metrics, eval.py's check)")
    a("--k", type=int, default=32, help="the large k of pass@k")
    a("--measure-every", type=int, default=6, help="exact probabilities every K steps, the last")
    a("--levels", type=int, default=11, help="matched-pass@1 levels between the base model and the "
      "lowest ceiling, where frontiers are compared")
    a("--eval-n", type=int, default=64, help="eval.py's samples per held-out problem (cross-check)")
    a("--workers", type=int, default=2, help="processes, one seed each at a time (1 thread each)")
    a("--work", type=Path, default=ROOT / "runs" / "see_it_happen",
      help="models, runs and finished arms: a rerun reuses arms finished with the same settings")
    a("--out", type=Path, default=ROOT / "experiments" / "results", help="results folder")
    a("--name", default="see_it_happen", help="prefix of the result files")
    a("--quick", action="store_true", help="miniature: 3 seeds, 2 lrs, 6 steps, small batches")
    a("--report-only", action="store_true", help="recompute the summary, OUT/NAME.md and .png from "
      "the runs in OUT/NAME.json (its settings and wall time), without training")
    args = p.parse_args(argv)
    if args.quick:
        quick = dict(seeds=3, lrs=[1e-4, 1e-3], gammas=[0.0, 1.0], exact_gammas=[0.0, 1.0], steps=6,
                     prompts=8, mini_batch=4, warm_steps=100, train_problems=200, heldout=12,
                     measure_every=3, eval_n=16, k=8, levels=5,
                     name=args.name + "_quick", work=args.work.with_name(args.work.name + "_quick"))
        vars(args).update(quick)
    if args.gammas[0] != 0 or len(set(args.gammas)) < 2:
        p.error("--gammas: 0 (the base algorithm) first, then at least one focal gamma")
    if args.prompts % args.mini_batch or sum(args.prior) > 1 or min(args.prior) < 0:
        p.error("--prompts must divide into --mini-batch; --prior: two masses >= 0 summing <= 1")
    if args.seeds < 2 or args.k < 2 or args.k > args.eval_n:
        p.error("--seeds >= 2 (the seed is the unit), 2 <= --k <= --eval-n")
    return args


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


def warm_start(seed, prior, steps, digit_lists, heldout):
    """fgrpo.build_tiny's untrained model and tokenizer, then supervised AdamW steps (lr 2e-3, clip
    1.0) on 16 prompts each, towards the target answer distribution: the first digit prior[0],
    the last digit prior[1], and the rest uniform over the ten digits (the cross-entropy against
    all ten "\\boxed{d}<eos>", not sampled targets: seeds then learn to copy alike). `steps`, then
    50 more at a time (up to 4 x steps) until the first digit holds half the held-out mass.
    Returns the model, the tokenizer and the steps taken."""
    model, tok, _, _ = fgrpo.build_tiny(seed, warm_steps=0)  # seeds torch: one init per seed
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    answers = [answer_completions(tok, d)[0] for d in DIGITS]
    done = 0
    while done < steps or (done < 4 * steps and statistics.fmean(
            strategy_probs(model.eval(), tok, heldout)["first"]) < 0.5):
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
    """Per prompt: pi(answer = first digit), pi(answer = last digit); the listed mass (all
    answer_completions of all ten digits; 1 minus it is text outside the answer space), and each
    digit's coefficient of variation over the prompts."""
    per_digit = [answer_completions(tok, d) for d in DIGITS]
    pairs = [(prompt_ids(tok, x), s) for x in digit_lists for seqs in per_digit for s in seqs]
    probs = sequence_probs(model, tok, pairs).view(len(digit_lists), -1)
    digit_of = torch.tensor([d for d, seqs in enumerate(per_digit) for _ in seqs])
    by_digit = torch.zeros(len(digit_lists), 10).index_add_(1, digit_of, probs)
    first = by_digit[torch.arange(len(digit_lists)), [x[0] for x in digit_lists]]
    last = by_digit[torch.arange(len(digit_lists)), [x[-1] for x in digit_lists]]
    cv = by_digit.std(0) / by_digit.mean(0)  # per digit, over prompts: large if the prompt is used
    return {"first": [round(v, 7) for v in first.tolist()],
            "last": [round(v, 7) for v in last.tolist()],
            "listed": round(float(by_digit.sum(-1).mean()), 7),
            "digit_cv": [round(v, 3) for v in cv.tolist()]}


def success_probs(point, kind):
    """Per prompt, the chance that one sample is accepted on a problem of `kind`."""
    if kind == "both":
        return [f + l for f, l in zip(point["first"], point["last"])]
    return point["last"] if kind == "rare" else point["first"]


def exact_metrics(point, base, mix, k):
    """pass@1, pass@k (the expectation over the mix's kinds, 1 - (1 - p)^k per prompt), rare pass@k
    (the rare kind), the two strategies' masses and M_ret (SPEC Sec. 7: 1 - lost / initial mass of
    the accepted answers, each weighted by the share of the kinds that accept it)."""
    shares = MIXES[mix]
    out = {"pass@1": 0.0, f"pass@{k}": 0.0}
    for kind in KINDS:
        ps = success_probs(point, kind)
        out["pass@1"] += shares[kind] * statistics.fmean(ps)
        out[f"pass@{k}"] += shares[kind] * statistics.fmean(1 - (1 - p) ** k for p in ps)
    out[f"rare pass@{k}"] = statistics.fmean(1 - (1 - p) ** k for p in point["last"])
    out["rare mass"] = statistics.fmean(point["last"])
    out["common mass"] = statistics.fmean(point["first"])
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
    --measure-every steps (fgrpo.run_step wrapped). Cached in WORK/seedS/MIX/ARM.json."""
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


def prepare_seed(seed, args, heldout):
    """The seed's context: its warm-started base model (WORK/seedS/base, reused if its settings
    match), its training files (one per mix) and the held-out masses of the base model."""
    from transformers import AutoTokenizer
    root = args.work / f"seed{seed}"
    train_digits = make_digits(args.train_problems, random.Random(seed), exclude=heldout)
    settings = {"prior": args.prior, "warm_steps": args.warm_steps, "heldout": heldout,
                "train_problems": args.train_problems}
    saved = root / "base" / "settings.json"
    if saved.exists() and json.loads(saved.read_text())["settings"] == settings:
        base = json.loads(saved.read_text())["base"]
        tok = AutoTokenizer.from_pretrained(root / "base")
    else:
        model, tok, steps = warm_start(seed, args.prior, args.warm_steps, train_digits, heldout)
        model.save_pretrained(root / "base")
        tok.save_pretrained(root / "base")
        base = {**strategy_probs(model, tok, heldout), "warm_steps": steps}
        saved.write_text(json.dumps({"settings": settings, "base": base}))
    data = {}
    for mix in args.mixes:
        problems = make_problems(train_digits, mix, random.Random(f"{seed}/{mix}"))
        data[mix] = root / f"{mix}.jsonl"
        data[mix].write_text("".join(json.dumps(p) + "\n" for p in problems))
    return {"args": args, "seed": seed, "tok": tok, "dir": root, "heldout": heldout, "data": data,
            "base": base, "base_settings": settings}


def log_arm(ctx, mix, name, record):
    k = ctx["args"].k
    last = exact_metrics(record["curve"][-1], ctx["base"], mix, k)
    print(f"seed {ctx['seed']} {mix:4s} {name:28s} pass@1 {last['pass@1']:.3f} "
          f"pass@{k} {last[f'pass@{k}']:.3f} rare mass {last['rare mass']:.3f} "
          f"({record['seconds']:.0f} s)", flush=True)


def frontier_phase(seed, args, heldout):
    """Phase 1 of a seed: the base algorithm at every lr and gamma, N = --n, in every mix."""
    with experiment_environment():
        ctx = prepare_seed(seed, args, heldout)
        arms = {mix: {} for mix in args.mixes}
        for mix in args.mixes:
            for lr in args.lrs:
                for gamma in args.gammas:
                    arm = {"mix": mix, "algo": args.algo, "gamma": gamma, "lr": lr, "n": args.n,
                           "name": arm_name(args.algo, gamma, lr, args.n)}
                    arms[mix][arm["name"]] = train_arm(arm, ctx)
                    log_arm(ctx, mix, arm["name"], arms[mix][arm["name"]])
    return {"seed": seed, "base": ctx["base"], "arms": arms}


def best_lr_phase(seed, args, heldout, best):
    """Phase 2 of a seed, at each mix's best lr: the exact expected update at --exact-gammas, the
    --others algorithms at gamma 0 and their paper gamma (first mix), eval.py's check of the last.
    """
    with experiment_environment():
        ctx = prepare_seed(seed, args, heldout)
        arms, check = {mix: {} for mix in args.mixes}, None
        for mix in args.mixes:
            specs = [(args.algo, g, "exact") for g in args.exact_gammas]
            if mix == args.mixes[0]:  # the other algorithms once, in the first mix
                specs += [(a, g, args.n) for a in args.others for g in (0.0, fgrpo.PAPER_GAMMA[a])]
            for algo, gamma, n in specs:
                arm = {"mix": mix, "algo": algo, "gamma": gamma, "lr": best[mix], "n": n,
                       "name": arm_name(algo, gamma, best[mix], n)}
                keep = mix == args.mixes[0] and (algo, gamma, n) == specs[-1]  # eval.py's model
                arms[mix][arm["name"]] = record = train_arm(arm, ctx, keep=keep)
                log_arm(ctx, mix, arm["name"], record)
                if keep:
                    check = cross_check(ctx, arm, record)
    return {"seed": seed, "arms": arms, "check": check}


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
    return {"arm": arm["name"], "mix": arm["mix"], "n": args.eval_n, "correct": bench["correct"],
            "sampled": {k: bench["pass@k"][k] for k in ks}, "exact": exact}


def run_seeds(phase, args, *rest):
    """phase(seed, args, *rest) for every seed: in --workers processes (spawned: each imports torch
    afresh with one thread), or here."""
    jobs = [(seed, args, *rest) for seed in range(args.seeds)]
    if args.workers == 1:
        return [phase(*job) for job in jobs]
    pool = multiprocessing.get_context("spawn").Pool(args.workers)
    try:
        return pool.starmap(phase, jobs, chunksize=1)
    finally:
        pool.close()  # the workers finish; terminate() would SIGTERM them mid-write
        pool.join()


def best_lrs(frontier, args):
    """Per mix, the largest lr at which every seed's gamma-0 run stays in the answer space (listed
    mass >= 0.9 at every measurement): the most the base algorithm moves without breaking down."""
    best = {}
    for mix in args.mixes:
        stable = [lr for lr in args.lrs if all(
            min(p["listed"] for p in s["arms"][mix][arm_name(args.algo, 0.0, lr, args.n)]["curve"])
            >= 0.9 for s in frontier)]
        best[mix] = max(stable, default=min(args.lrs))
    return best


# ---------------------------------------------------------------- analysis: frontiers, seeds paired
def trajectories(seeds, args):
    """[seed] -> {mix: {arm: [metrics at step 0 (the base model), then at every measurement]}}."""
    out = []
    for s in seeds:
        out.append({mix: {name: [{"step": p["step"], **exact_metrics(p, s["base"], mix, args.k)}
                                 for p in [{"step": 0, **s["base"]}] + arm["curve"]]
                          for name, arm in arms.items()} for mix, arms in s["arms"].items()})
    return out


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
    return max(p["pass@1"] for path in paths for p in path)


def matched_levels(traj, mix, groups, count):
    """--levels pass@1 values from the highest base-model pass@1 over seeds to the lowest ceiling
    over seeds and groups of arms; [] where they do not overlap."""
    lo = max(t[mix][groups[0][0]][0]["pass@1"] for t in traj)
    hi = min(ceiling([t[mix][n] for n in g]) for t in traj for g in groups)
    return [lo + (hi - lo) * i / (count - 1) for i in range(count)] if hi > lo else []


def gap_per_seed(traj, mix, base_arms, arms, levels, k):
    """Per seed: the frontier of `arms` minus that of `base_arms` in pass@k, mean over levels."""
    gaps = []
    for t in traj:
        a, b = [t[mix][n] for n in base_arms], [t[mix][n] for n in arms]
        gaps.append(statistics.fmean(frontier_at(b, x, k) - frontier_at(a, x, k) for x in levels))
    return gaps


def compare(traj, mix, base_arms, arms, args, groups=None):
    """F (arms) against its base (base_arms) at matched pass@1, and their ceilings: paired stats."""
    levels = matched_levels(traj, mix, groups or [base_arms, arms], args.levels)
    tops = [(ceiling([t[mix][n] for n in base_arms]), ceiling([t[mix][n] for n in arms]))
            for t in traj]
    gaps = gap_per_seed(traj, mix, base_arms, arms, levels, args.k) if levels else None
    return {"levels": levels, "gap": gaps and paired_summary(gaps), "gaps": gaps,
            "ceiling": paired_summary([b - a for a, b in tops]),
            "ceilings": [statistics.fmean(x) for x in zip(*tops)]}  # mean: base's, arms'


FINAL_KEYS = ("pass@1", "pass@{k}", "rare pass@{k}", "rare mass", "M_ret")


def final_deltas(traj, mix, base_name, name, k):
    """Paired over seeds: the arm's final metrics minus the base arm's, at the same lr."""
    out = {}
    for key in (x.format(k=k) for x in FINAL_KEYS):
        diffs = [t[mix][name][-1][key] - t[mix][base_name][-1][key] for t in traj]
        out[key] = paired_summary(diffs)
    return out


def mean_sd(xs):
    return [statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0]


def finals(traj, mix):
    """Mean and sd over seeds of the base model's metrics and of every arm's final ones."""
    first = next(iter(traj[0][mix]))
    rows = {"base": [t[mix][first][0] for t in traj]}
    rows.update({arm: [t[mix][arm][-1] for t in traj] for arm in traj[0][mix]})
    return {arm: {key: mean_sd([r[key] for r in rs]) for key in rs[0] if key != "step"}
            for arm, rs in rows.items()}


def summarise_mix(traj, mix, args, lr):
    """One mix: every arm's final metrics (mean, sd over seeds), F against gamma 0 at matched pass@1
    over the whole lr sweep and at each lr, the exact update against N, the --others."""
    def name(g, lr_, n=args.n, algo=args.algo):
        return arm_name(algo, g, lr_, n)

    def sweep(g):
        return [name(g, x) for x in args.lrs]

    out = {"best_lr": lr, "final": finals(traj, mix), "frontier": {}, "same_lr": {}, "exact": {},
           "others": {}}
    for g in args.gammas[1:]:
        out["frontier"][f"{g:g}"] = compare(traj, mix, sweep(0.0), sweep(g), args)
        for x in args.lrs:
            out["same_lr"][f"{g:g}@{x:g}"] = final_deltas(traj, mix, name(0.0, x), name(g, x),
                                                          args.k)
    if 0.0 in args.exact_gammas:
        for g in [g for g in args.exact_gammas if g in args.gammas and g != 0]:
            out["exact"][f"{g:g}"] = exact_vs_sampled(traj, mix, args, lr, g)
    for algo in args.others if mix == args.mixes[0] else []:
        g = fgrpo.PAPER_GAMMA[algo]
        out["others"][algo] = {
            "gamma": g, "base_vs_" + args.algo: final_deltas(traj, mix, name(0.0, lr),
                                                              name(0.0, lr, algo=algo), args.k),
            "F": compare(traj, mix, [name(0.0, lr, algo=algo)], [name(g, lr, algo=algo)], args),
            args.algo + "_F": compare(traj, mix, [name(0.0, lr)], [name(g, lr)], args)
            if g in args.gammas else None}
    return out


def exact_vs_sampled(traj, mix, args, lr, g):
    """At the best lr: F's gain over gamma 0 at matched pass@1 with N = --n and with the exact
    update (on common levels), their difference, and F at N = --n against the exact gamma 0."""
    g0n, gn = arm_name(args.algo, 0.0, lr, args.n), arm_name(args.algo, g, lr, args.n)
    g0x, gx = arm_name(args.algo, 0.0, lr, "exact"), arm_name(args.algo, g, lr, "exact")
    levels = matched_levels(traj, mix, [[g0n], [gn], [g0x], [gx]], args.levels)
    out = {"levels": levels, "final_exact": final_deltas(traj, mix, g0x, gx, args.k),
           "F_n_vs_exact_base": compare(traj, mix, [g0x], [gn], args)}
    if levels:
        gap_n = gap_per_seed(traj, mix, [g0n], [gn], levels, args.k)
        gap_x = gap_per_seed(traj, mix, [g0x], [gx], levels, args.k)
        out.update(gap_n=paired_summary(gap_n), gap_exact=paired_summary(gap_x),
                   gap_n_minus_exact=paired_summary([a - b for a, b in zip(gap_n, gap_x)]),
                   gaps_n=gap_n, gaps_exact=gap_x)
    return out


def summarise(seeds, args, best):
    traj = trajectories(seeds, args)
    out = {"best_lr": best, "mixes": {m: summarise_mix(traj, m, args, best[m]) for m in args.mixes}}
    for mix, res in out["mixes"].items():  # the share of tokens clipped, mean over steps and seeds
        res["clip_frac"] = {arm: statistics.fmean(s["arms"][mix][arm]["clip_frac"] for s in seeds)
                            for arm in seeds[0]["arms"][mix]}
    checks = [s["check"] for s in seeds if s.get("check")]
    out["check"] = [{"seed": s["seed"], **{f"{w} pass@{k}": s["check"][w][k] for w in
                                            ("sampled", "exact") for k in s["check"]["sampled"]}}
                    for s in seeds if s.get("check")] if checks else []
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
    if s is None:
        return "-"
    return f"{s['p_t']:.2g} / {s['p_wilcoxon']:.2g}, {s['positive']}/{s['n']}"


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def mix_markdown(mix, res, args):
    k, lr = args.k, res["best_lr"]
    shares = ", ".join(f"{kind} {MIXES[mix][kind]:g}" for kind in KINDS)
    lines = [f"## Mix \"{mix}\" ({shares}); best lr {lr:g}", "",
             f"F minus gamma 0 (the {args.algo} lr sweep {args.lrs}): pass@{k} at matched pass@1,",
             "averaged over the matched levels, and the highest pass@1 reached (ceiling). Paired",
             "over seeds: mean [95% t interval]; tests: paired t p / exact Wilcoxon p, seeds > 0.",
             ""]
    rows = [[g, ci(c["gap"], 4), tests(c["gap"]), "{:.3f} / {:.3f}".format(*c["ceilings"]),
             ci(c["ceiling"]), tests(c["ceiling"]),
             f"{c['levels'][0]:.3f}-{c['levels'][-1]:.3f}" if c["levels"] else "none"]
            for g, c in res["frontier"].items()]
    lines += table(["gamma", f"pass@{k} gain", "tests", "ceiling: gamma 0 / F", "ceiling gain",
                    "tests", "levels"], rows)
    lines += ["", f"At lr {lr:g}: F's gain over gamma 0 at matched pass@1 with N = {args.n} and "
              "with the exact expected update (N -> infinity), on common levels; then F at N = "
              f"{args.n} against the exact gamma 0.", ""]
    rows = [[g, ci(e.get("gap_n"), 4), ci(e.get("gap_exact"), 4), ci(e.get("gap_n_minus_exact"), 4),
             tests(e.get("gap_n_minus_exact")), ci(e["F_n_vs_exact_base"]["gap"], 4),
             tests(e["F_n_vs_exact_base"]["gap"])] for g, e in res["exact"].items()]
    lines += table(["gamma", f"gain, N {args.n}", "gain, exact", "difference", "tests",
                    f"F N {args.n} - exact gamma 0", "tests"], rows)
    lines += ["", "Same lr, final step: F minus gamma 0, paired over seeds.", ""]
    keys = [x.format(k=k) for x in FINAL_KEYS]
    rows = [[key_] + [ci(d[x]) for x in keys] for key_, d in res["same_lr"].items()]
    lines += table(["gamma@lr", *keys], rows)
    lines += others_markdown(res, args) + ["", "Final metrics, mean ± sd over seeds.", ""]
    cols = [*keys, "common mass"]
    rows = [[arm] + [f"{v[x][0]:.3f} ± {v[x][1]:.3f}" for x in cols]
            for arm, v in res["final"].items()]
    return lines + table(["arm", *cols], rows) + [""]


def others_markdown(res, args):
    if not res["others"]:
        return []
    k = args.k
    lines = ["", f"The other algorithms at lr {res['best_lr']:g}: gamma 0 minus {args.algo}'s "
             f"gamma 0 (final), and F's gain over gamma 0 at matched pass@1 beside {args.algo}'s.",
             ""]
    rows = []
    for algo in [args.algo, *res["others"]]:
        clipped = res["clip_frac"][arm_name(algo, 0.0, res["best_lr"], args.n)]
        if algo == args.algo:
            rows.append([algo, "", "", "", "", "", "", f"{clipped:.2g}"])
            continue
        o = res["others"][algo]
        vs = o["base_vs_" + args.algo]
        rows.append([algo, f"{o['gamma']:g}", ci(vs["pass@1"]), ci(vs[f"pass@{k}"]),
                     ci(o["F"]["gap"], 4), tests(o["F"]["gap"]),
                     ci((o[args.algo + "_F"] or {}).get("gap"), 4), f"{clipped:.2g}"])
    return lines + table(["algo", "gamma", "Δ pass@1", f"Δ pass@{k}", "F gain (its own)", "tests",
                          f"F gain ({args.algo})", "clip_frac, gamma 0"], rows)


def markdown(summary, args, wall):
    lines = [f"# See it happen: {args.seeds} seeds, {args.steps} steps, N = {args.n}, "
             f"{args.prompts} prompts per step", "",
             f"`python experiments/see_it_happen.py{' --quick' if args.quick else ''}`: "
             f"{wall / 60:.1f} min on 2 shared cores ({args.workers} workers). Every figure is "
             f"exact over {args.heldout} held-out prompts (see the module docstring); "
             f"pass@{args.k} of a mix is the expectation over its kinds.", ""]
    for mix, res in summary["mixes"].items():
        lines += mix_markdown(mix, res, args)
    if summary["check"]:
        k = args.k
        lines += ["## eval.py cross-check (sampled, n = {}) against the exact figures".format(
            args.eval_n), ""]
        rows = [[c["seed"]] + [f"{c[f'{w} pass@{x}']:.3f}" for x in ("1", str(k))
                               for w in ("sampled", "exact")] for c in summary["check"]]
        lines += table(["seed", "sampled pass@1", "exact pass@1", f"sampled pass@{k}",
                        f"exact pass@{k}"], rows)
    return "\n".join(lines) + "\n"


def median_path(paths, keys):
    """The step-by-step median over seeds of trajectories measured at the same steps (a run that
    breaks down in one seed does not drag the line)."""
    return [[statistics.median(p[i][key] for p in paths) for i in range(len(paths[0]))]
            for key in keys]


def plot(traj, summary, args, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: pip install matplotlib to get the plot")
        return
    k, mixes = args.k, args.mixes
    colors = {g: f"C{i}" for i, g in enumerate(args.gammas)}
    fig, axes = plt.subplots(3, len(mixes), figsize=(6.5 * len(mixes), 15), squeeze=False)
    for col, mix in enumerate(mixes):
        lr = summary["mixes"][mix]["best_lr"]
        for g in args.gammas:
            for n, style in ((args.n, "-"), ("exact", "--")):
                lrs = args.lrs if n == args.n else [lr]
                for x in [x for x in lrs if arm_name(args.algo, g, x, n) in traj[0][mix]]:
                    p1, pk, rare = median_path([t[mix][arm_name(args.algo, g, x, n)] for t in traj],
                                               ["pass@1", f"pass@{k}", "rare mass"])
                    label = f"gamma {g:g}, " + (f"exact, lr {x:g}" if n == "exact" else
                                                f"N {n}, every lr")
                    look = dict(linestyle=style, marker=".", color=colors[g], alpha=0.5, lw=1)
                    axes[0][col].plot(p1, pk, label=label if x == lrs[0] else None, **look)
                    axes[1][col].plot(p1, rare, **look)
            plot_mean_frontier(axes[0][col], traj, mix, g, args, colors[g])
        axes[0][col].set(title=f"{mix} mix: runs (median over seeds); thick: mean frontier",
                         xlabel="pass@1", ylabel=f"pass@{k}")
        axes[1][col].set(title=f"{mix} mix: the rare strategy's mass (median over seeds)",
                         xlabel="pass@1", ylabel="rare mass")
        axes[0][col].legend(fontsize=7)
        plot_gaps(axes[2][col], summary["mixes"][mix], args)
        axes[2][col].set_title(f"{mix} mix: F minus gamma 0, pass@{k} at matched pass@1")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_mean_frontier(ax, traj, mix, g, args, color):
    names = [arm_name(args.algo, g, x, args.n) for x in args.lrs]
    lo = min(t[mix][names[0]][0]["pass@1"] for t in traj)
    hi = min(ceiling([t[mix][n] for n in names]) for t in traj)
    xs = [lo + (hi - lo) * i / 40 for i in range(41)]
    ys = [[frontier_at([t[mix][n] for n in names], x, args.k) for t in traj] for x in xs]
    pts = [(x, statistics.fmean(y)) for x, y in zip(xs, ys) if None not in y]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, lw=2.5)


def plot_gaps(ax, res, args):
    """Each comparison's per-seed gap at matched pass@1 (dots) with its mean and 95% interval."""
    rows = [(f"F {g} sweep", c["gaps"], c["gap"]) for g, c in res["frontier"].items()]
    for g, e in res["exact"].items():
        rows += [(f"F {g} N {args.n}", e.get("gaps_n"), e.get("gap_n")),
                 (f"F {g} exact", e.get("gaps_exact"), e.get("gap_exact"))]
    rows = [r for r in rows if r[1]]
    for i, (label, gaps, s) in enumerate(rows):
        ax.plot([i] * len(gaps), gaps, "o", color="C0", alpha=0.5, ms=4)
        if s["lo"] is not None:
            err = [[s["mean"] - s["lo"]], [s["hi"] - s["mean"]]]
            ax.errorbar([i + 0.15], [s["mean"]], yerr=err, fmt="s", color="k", capsize=3)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.set(ylabel=f"pass@{args.k} gain (dots: seeds; squares: mean, 95% CI)")


# ---------------------------------------------------------------- main
def report_only(args):
    """The tables and the plot again from a finished run's JSON, with the settings it ran with."""
    saved = json.loads((args.out / f"{args.name}.json").read_text())
    ran = argparse.Namespace(**{**saved["config"], "work": Path(saved["config"]["work"]),
                                "out": args.out})
    saved["summary"] = summary = summarise(saved["seeds"], ran, saved["summary"]["best_lr"])
    (args.out / f"{args.name}.json").write_text(json.dumps(saved))
    (args.out / f"{args.name}.md").write_text(markdown(summary, ran, saved["wall_s"]))
    plot(trajectories(saved["seeds"], ran), summary, ran, args.out / f"{args.name}.png")
    return saved


def main(argv=None):
    args = parse_args(argv)
    if args.report_only:
        return report_only(args)
    t0 = time.time()
    heldout = make_digits(args.heldout, random.Random(10_000))
    args.work.mkdir(parents=True, exist_ok=True)
    for mix in args.mixes:  # eval.py's file: the held-out prompts with kinds in the mix's shares
        problems = make_problems(heldout, mix, None, exact_shares=True)
        text = "".join(json.dumps(p) + "\n" for p in problems)
        (args.work / f"heldout_{mix}.jsonl").write_text(text)
    frontier = run_seeds(frontier_phase, args, heldout)
    best = best_lrs(frontier, args)
    print(f"best lr per mix: {best}", flush=True)
    extra = run_seeds(best_lr_phase, args, heldout, best)
    seeds = [{"seed": f["seed"], "base": f["base"], "check": e["check"],
              "arms": {m: {**f["arms"][m], **e["arms"][m]} for m in args.mixes}}
             for f, e in zip(frontier, extra)]
    summary = summarise(seeds, args, best)
    wall = time.time() - t0
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {"config": config, "heldout": heldout, "seeds": seeds, "summary": summary,
              "wall_s": wall}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result))
    (args.out / f"{args.name}.md").write_text(markdown(summary, args, wall))
    plot(trajectories(seeds, args), summary, args, args.out / f"{args.name}.png")
    print(markdown(summary, args, wall))
    return result


if __name__ == "__main__":
    main()
