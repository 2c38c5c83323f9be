"""Two strategies on many prompts, every quantity exact: the categorical model of
experiments/see_it_happen.py, and what GRPO's group-normalised update ascends.

    python experiments/two_strategy.py            # 30 seeds, the whole grid: minutes
    python experiments/two_strategy.py --quick    # 4 seeds, 2 lrs

1. The expected update. For a prompt whose completions are correct with probability p, the expected
   GRPO update (Sec. 2's advantage, times the focal weight, at ratio 1) is, at every group size N,
       E[(1/N) sum_j A^F_j grad log pi(o_j)] = w_N(p) grad p,
   because given X correct samples the correct ones are draws from pi restricted to the correct
   answers, whose mean score is grad p / p (the wrong ones: -grad p / (1 - p)). w_N(p) is a binomial
   sum over X of fgrpo.group_advantages (prompt_weight), and as N -> infinity
       w_N(p) -> F'(p) = (1 - p)^gamma / sqrt(p (1 - p)):
   GRPO ascends sum_x F(p_x). An unsampled rare correct answer changes nothing in expectation: N
   moves only the weight w_N(p) each prompt gets. check_expected_update verifies the identity by
   Monte Carlo through fgrpo.group_advantages and autograd; docs/why-focal.md reads it. Off ratio
   1 (a later mini-batch of the same rollout) the identity holds with the gradient taken at the
   current policy, until DAPO's clip drops a term: clipped_expected_update sums it exactly.
   Without the std normalisation (Dr. GRPO), w_N(p) -> (1 - p)^gamma: prompt_weight(std=False).
2. The objective's shape: F(p) = int_0^p F' (objective), against pass@k; on the edge where no
   mass is wrong, the maximiser of each mix's objective (edge_optimum).
3. The simulation: a policy over three outcomes (the first digit, the last, any other), one set of
   logits shared by every prompt (the kinds do not show in the prompt, so no model can do better
   than a shared strategy mix), trained on see_it_happen.py's schedule: --prompts per step, kinds
   drawn with the mix's shares, --n samples each, fgrpo.group_advantages, DAPO's fgrpo.policy_loss
   in --prompts / --mini-batch AdamW steps (weight decay 0.01, clip 1.0 per run), and the exact
   expected update (every outcome, weighted by its probability) beside it. Analysed with
   see_it_happen.py's frontier and paired statistics: 30 seeds per arm.
"""
import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
import fgrpo  # noqa: E402
import see_it_happen as see  # noqa: E402
import see_it_happen_report as see_report  # noqa: E402
from frontiers import FINAL_KEYS, median_path  # noqa: E402
from paired import paired_summary  # noqa: E402

OUTCOMES = ("first", "last", "other")
CORRECT = {"both": (1.0, 1.0, 0.0), "rare": (0.0, 1.0, 0.0), "common": (1.0, 0.0, 0.0)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--seeds", type=int, default=30, help="seeds per arm")
    a("--mixes", nargs="+", default=list(see.MIXES), choices=list(see.MIXES), help="problem mixes")
    a("--optims", nargs="+", default=["adamw", "sgd"], choices=["adamw", "sgd"],
      help="optimisers on the logits, each its own grid: AdamW (fgrpo's, per-logit step sizes) and "
      "SGD (the gradient flow, where a logit moves in proportion to its probability)")
    a("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2, 3e-2, 1e-1],
      help="AdamW lrs on the three logits, from 'barely moves' to 'collapses'")
    a("--sgd-lrs", type=float, nargs="+", default=[0.03, 0.1, 0.3, 1.0, 3.0], help="SGD's lrs")
    a("--gammas", type=float, nargs="+", default=[0.0, 0.5, 1.0], help="focal exponents; 0 first")
    a("--init", type=float, nargs=2, default=[0.63, 0.04], metavar=("FIRST", "LAST"),
      help="initial mass of the two strategies (the warm starts' typical values)")
    a("--steps", type=int, default=24, help="rollout steps")
    a("--n", type=int, default=8, help="group size N of the sampled arms")
    a("--prompts", type=int, default=16, help="prompts per rollout step")
    a("--mini-batch", type=int, default=4, help="prompts per optimiser step")
    a("--k", type=int, default=32, help="the large k of pass@k")
    a("--measure-every", type=int, default=6, help="metrics every K steps (and the last)")
    a("--levels", type=int, default=10, help="matched-pass@1 levels per seed (see_it_happen)")
    a("--out", type=Path, default=ROOT / "experiments" / "results", help="results folder")
    a("--name", default="two_strategy", help="prefix of the result files")
    a("--quick", action="store_true", help="4 seeds, 2 lrs")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.lrs, args.sgd_lrs = 4, [1e-2, 1e-1], [0.3, 3.0]
        args.name += "_quick"
    if args.gammas[0] != 0 or args.seeds < 2 or args.prompts % args.mini_batch:
        p.error("--gammas starts at 0, --seeds >= 2, --prompts divides into --mini-batch")
    args.algo = "dapo"  # the arms' names, as see_it_happen.arm_name writes them
    return args


# ---------------------------------------------------------------- 1. the expected update
def prompt_weight(p, n, gamma, std=True):
    """w_N(p): E[update] = w_N(p) grad p for GRPO with group size n (None: the limit). Exact:
    sum over X ~ Binomial(n, p) of X * A_correct(X) * g(X) / (n p (1 - p)), with A from
    fgrpo.group_advantages on a group of X ones and n - X zeros. std=False: without the std
    normalisation (Dr. GRPO; TRL's scale_rewards="none", verl's norm_adv_by_std_in_grpo=False),
    A = (R - mean R) * g(X), whose limit is (1 - p)^gamma."""
    if n is None:
        return (1 - p) ** gamma / (math.sqrt(p * (1 - p)) if std else 1.0)
    groups = torch.tensor([[1.0] * x + [0.0] * (n - x) for x in range(n + 1)], dtype=torch.float64)
    a_correct = fgrpo.group_advantages(groups, gamma, std=std)[:, 0].tolist()  # row x: X = x
    total = 0.0
    for x in range(1, n):
        log_pmf = (math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
                   + x * math.log(p) + (n - x) * math.log1p(-p))
        total += math.exp(log_pmf) * x * a_correct[x]
    return total / (n * p * (1 - p))


def check_expected_update(p_first, p_last, kind, n, gamma, groups=200_000, seed=0):
    """Monte Carlo of the update on a three-outcome softmax, through fgrpo.group_advantages and
    autograd: mean over `groups` groups of grad (1/N) sum_j A_j log pi(o_j), against w_N(p) grad p.
    Returns (monte carlo (3,), prediction (3,), standard error (3,))."""
    z = torch.tensor([p_first, p_last, 1 - p_first - p_last], dtype=torch.float64).log()
    z.requires_grad_(True)
    pi = torch.softmax(z, 0)
    correct = torch.tensor(CORRECT[kind], dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(pi.detach(), groups * n, replacement=True, generator=gen)
    rewards = correct[draws].view(groups, n)
    adv = fgrpo.group_advantages(rewards, gamma).double()
    # per group: (1/N) sum_j A_j grad log pi(o_j) = (1/N) sum_j A_j (e_{o_j} - pi), by outcome
    counts = torch.zeros(groups, 3, dtype=torch.float64).scatter_add_(1, draws.view(groups, n), adv)
    per_group = counts / n - adv.sum(-1, keepdim=True) / n * pi.detach()
    p = float((pi.detach() * correct).sum())
    (grad_p,) = torch.autograd.grad((pi * correct).sum(), z)
    prediction = prompt_weight(p, n, gamma) * grad_p
    se = per_group.std(0) / math.sqrt(groups)
    return per_group.mean(0), prediction, se


def clipped_expected_update(pi_old, pi, kind, n, gamma, eps=fgrpo.PAPER_EPS["dapo"]):
    """Section 2's identity off ratio 1, exact: the gradient in the logits of the expected DAPO
    surrogate E[(1/N) sum_j min(r_j A_j, clip(r_j, 1 - eps_low, 1 + eps_high) A_j)], groups drawn
    from pi_old, r = pi / pi_old (an answer is one token). Given X correct, an outcome's expected
    count is X pi_old(o) / p_old (correct) or (N - X) pi_old(o) / (1 - p_old) (wrong), and the clip
    drops o's term where its ratio is past the bound on its advantage's side. Returns the gradients
    (3,) with the clip and without it; without it they equal w_N(p_old) grad p at pi."""
    z = torch.tensor(pi, dtype=torch.float64).log().requires_grad_(True)
    old = torch.tensor(pi_old, dtype=torch.float64)
    correct = torch.tensor(CORRECT[kind], dtype=torch.float64)
    p_old = float((old * correct).sum())
    groups = torch.tensor([[1.0] * x + [0.0] * (n - x) for x in range(n + 1)], dtype=torch.float64)
    a_correct = fgrpo.group_advantages(groups, gamma)[:, 0].double()  # row x: X = x
    pmf = torch.tensor([math.comb(n, x) * p_old ** x * (1 - p_old) ** (n - x)
                        for x in range(n + 1)], dtype=torch.float64)
    push = float((pmf * torch.arange(n + 1) * a_correct).sum()) / n  # E[X A_+] / N
    # = -E[(N - X) A_-] / N: a group's advantages sum to 0
    coef = torch.where(correct > 0, push * old / p_old, -push * old / (1 - p_old))
    ratio = torch.softmax(z, 0) / old
    inside = torch.where(correct > 0, ratio <= 1 + eps[1], ratio >= 1 - eps[0]).double()
    (clipped,) = torch.autograd.grad((coef * ratio * inside).sum(), z, retain_graph=True)
    (unclipped,) = torch.autograd.grad((coef * ratio).sum(), z)
    return clipped, unclipped


def objective(p, gamma, steps=2000):
    """F(p) = int_0^p (1 - t)^gamma / sqrt(t (1 - t)) dt, with t = sin^2(phi): the integrand becomes
    2 cos^(2 gamma)(phi), smooth (Simpson's rule). gamma 0: 2 arcsin(sqrt p); 0.5: 2 sqrt p;
    1: arcsin(sqrt p) + sqrt(p (1 - p))."""
    top = math.asin(math.sqrt(p))
    h = top / steps
    weights = [1] + [4 if i % 2 else 2 for i in range(1, steps)] + [1]
    return h / 3 * sum(w * 2 * math.cos(i * h) ** (2 * gamma) for i, w in enumerate(weights))


def edge_optimum(mix, gamma=None, k=None):
    """With no wrong mass (first = 1 - b, last = b), the b that maximises GRPO's limit objective
    sum_kind share * F(p_kind) at gamma, or pass@k: share_rare F(b) + share_common F(1 - b) + const.
    gamma > 0: (b / (1 - b))^gamma = share_rare / share_common; pass@k: the same with gamma = k - 1.
    gamma 0 (and pass@1): F(b) + F(1 - b) is constant, so an end unless the shares tie (flat)."""
    w_rare, w_common = see.MIXES[mix]["rare"], see.MIXES[mix]["common"]
    power = gamma if k is None else k - 1
    if w_common == 0:
        return 1.0
    if power == 0:
        return None if w_rare == w_common else float(w_rare > w_common)
    return 1 / (1 + (w_common / w_rare) ** (1 / power))


# ---------------------------------------------------------------- 3. the simulation
def make_cells(args):
    """Every run as a row: (mix, n or "exact", gamma, lr, seed), grouped by lr (AdamW's groups)."""
    return [(mix, n, g, lr, s) for lr in args.lrs for mix in args.mixes for n in (args.n, "exact")
            for g in args.gammas for s in range(args.seeds)]


def draws(args, mix, seed, step):
    """The prompts' kinds (P,) and uniforms (P, N) of a step, shared by every arm of (mix, seed)."""
    gen = torch.Generator().manual_seed((seed * 1000 + step) * 10 + list(see.MIXES).index(mix))
    shares = torch.tensor([see.MIXES[mix][k] for k in see.KINDS])
    kinds = torch.multinomial(shares, args.prompts, replacement=True, generator=gen)
    return kinds, torch.rand(args.prompts, args.n, generator=gen, dtype=torch.float64)


def rollout(pi, cells, args, step):
    """Per cell: outcomes (C, P, G), rewards (C, P, G) and advantages (C, P, G); G = N sampled
    (fgrpo.group_advantages) or G = 3 for the exact update (pi_old(o) * A_inf(o) * 3, as
    see_it_happen.exact_update_patches: the sampled arms' scale)."""
    table = torch.tensor([CORRECT[k] for k in see.KINDS], dtype=torch.float64)  # (kind, outcome)
    per = {(m, s): draws(args, m, s, step) for m in args.mixes for s in range(args.seeds)}
    kinds = torch.stack([per[c[0], c[4]][0] for c in cells])  # (C, P)
    cdf = pi.detach().cumsum(-1)
    out = {}
    for mode in (args.n, "exact"):
        rows = torch.tensor([i for i, c in enumerate(cells) if c[1] == mode])
        if mode == "exact":
            outcomes = torch.arange(3).expand(len(rows), args.prompts, 3)
        else:
            u = torch.stack([per[cells[i][0], cells[i][4]][1] for i in rows.tolist()])
            cdfs = cdf[rows][:, None, :].expand(-1, args.prompts, -1).contiguous()
            outcomes = torch.searchsorted(cdfs, u).clamp(max=2)
        rewards = table[kinds[rows]].gather(-1, outcomes)
        gammas = torch.tensor([cells[i][2] for i in rows.tolist()], dtype=torch.float64)
        adv = torch.zeros_like(rewards)
        for g in gammas.unique().tolist():
            sel = gammas == g
            if mode == "exact":
                adv[sel] = exact_advantages(pi.detach()[rows[sel]], rewards[sel], g)
            else:
                adv[sel] = fgrpo.group_advantages(rewards[sel].flatten(0, 1), g).view_as(
                    rewards[sel]).double()
        out[mode] = (rows, outcomes, adv)
    return out


def exact_advantages(pi, rewards, gamma):
    """pi (R, 3), rewards (R, P, 3) -> 3 * pi(o) * (1 - p)^gamma (R(o) - p) / sqrt(p (1 - p))."""
    p = (pi[:, None, :] * rewards).sum(-1, keepdim=True)
    a_inf = (rewards - p) / (p * (1 - p)).clamp(min=1e-12).sqrt() * (1 - p) ** gamma
    return 3 * pi[:, None, :] * a_inf


def optimiser_step(logits, opt, batch, chunk, old, args):
    """One AdamW step on prompts `chunk` of the rollout: DAPO's fgrpo.policy_loss per cell (its
    token-mean over the cell's own samples), each cell's gradient clipped to norm 1 (as fgrpo)."""
    opt.zero_grad(set_to_none=True)
    logp_all = torch.log_softmax(torch.cat(logits), -1)
    loss = 0.0
    for mode, (rows, outcomes, adv) in batch.items():
        o = outcomes[:, chunk]
        logp = logp_all[rows][:, None, :].expand(-1, o.shape[1], -1).gather(-1, o)
        mask = torch.ones_like(logp).flatten()[:, None]
        part, _ = fgrpo.policy_loss(logp.flatten()[:, None], old[mode][:, chunk].flatten()[:, None],
                                    adv[:, chunk].flatten(), mask, "dapo",
                                    *fgrpo.PAPER_EPS["dapo"], num_tokens=o.shape[1] * o.shape[2])
        loss = loss + part
    loss.backward()
    for z in logits:  # per-row clip, as torch.nn.utils.clip_grad_norm_(max_norm=1.0) per run
        norm = z.grad.norm(dim=-1, keepdim=True)
        z.grad.mul_((1.0 / (norm + 1e-6)).clamp(max=1.0))
    opt.step()


def simulate(args, optim):
    """Every cell's curve: [{"step", "first": [pi_first], "last": [pi_last]}] every K steps."""
    cells = make_cells(args)
    init = torch.tensor([*args.init, 1 - sum(args.init)], dtype=torch.float64).log()
    logits = [torch.nn.Parameter(init.repeat(sum(c[3] == lr for c in cells), 1)) for lr in args.lrs]
    groups = [{"params": [z], "lr": lr} for z, lr in zip(logits, args.lrs)]
    if optim == "adamw":  # fgrpo's optimiser (App. L)
        opt = torch.optim.AdamW(groups, betas=(0.9, 0.999), weight_decay=0.01)
    else:
        opt = torch.optim.SGD(groups)
    curves = [[] for _ in cells]
    for step in range(1, args.steps + 1):
        pi = torch.softmax(torch.cat(logits).detach(), -1)
        batch = rollout(pi, cells, args, step)
        logp = torch.log(pi)
        old = {mode: logp[rows][:, None, :].expand(-1, o.shape[1], -1).gather(-1, o)
               for mode, (rows, o, _) in batch.items()}
        for start in range(0, args.prompts, args.mini_batch):
            optimiser_step(logits, opt, batch, slice(start, start + args.mini_batch), old, args)
        if step % args.measure_every == 0 or step == args.steps:
            pi = torch.softmax(torch.cat(logits).detach(), -1).tolist()
            for curve, row in zip(curves, pi):
                curve.append({"step": step, **masses(row)})
    return cells, curves


def masses(pi):
    """A policy (first, last, other) as see_it_happen measures one: per prompt (here one, shared)
    the two strategies' and the wrong digits' masses; all of it is in the answer space."""
    return {"first": [pi[0]], "last": [pi[1]], "wrong": [pi[2]], "listed": 1.0}


def as_seeds(cells, curves, args):
    """The runs in see_it_happen's layout, so that its frontier and paired analysis apply."""
    base = masses([*args.init, 1 - sum(args.init)])
    seeds = [{"seed": s, "base": {m: base for m in args.mixes}, "arms": {m: {} for m in args.mixes}}
             for s in range(args.seeds)]
    for (mix, n, g, lr, s), curve in zip(cells, curves):
        seeds[s]["arms"][mix][see.arm_name(args.algo, g, lr, n)] = {"curve": curve}
    return seeds


def summarise_mix(traj, mix, args):
    """F against gamma 0 over the lr sweep, sampled (N) and exact (each seed on its matched range:
    see_it_happen.compare), and their difference over the same levels; F at N against the exact
    gamma 0; F minus gamma 0 at each lr; final metrics."""
    def sweep(g, n):
        return [see.arm_name(args.algo, g, lr, n) for lr in args.lrs]

    out = {"final": see.finals(traj, mix), "sampled": {}, "exact": {}, "difference": {},
           "F_n_vs_exact_base": {}, "same_lr": {}}
    for g in args.gammas[1:]:
        key = f"{g:g}"
        passk = f"pass@{args.k}"
        sampled = [sweep(0.0, args.n), sweep(g, args.n)]
        exact = [sweep(0.0, "exact"), sweep(g, "exact")]
        out["sampled"][key] = see.compare(traj, mix, *sampled, args, passk)
        out["exact"][key] = see.compare(traj, mix, *exact, args, passk)
        at_n = see.compare(traj, mix, *sampled, args, passk, also=exact)  # the same levels
        at_exact = see.compare(traj, mix, *exact, args, passk, also=sampled)
        if not at_n["unmatched"]:
            diffs = [a - b for a, b in zip(at_n["gaps"], at_exact["gaps"])]
            out["difference"][key] = paired_summary(diffs)
        out["F_n_vs_exact_base"][key] = see.compare(traj, mix, sweep(0.0, "exact"),
                                                    sweep(g, args.n), args, passk)
        for lr in args.lrs:
            for n in (args.n, "exact"):
                base_arm, arm = (see.arm_name(args.algo, x, lr, n) for x in (0.0, g))
                out["same_lr"][f"{key}@{lr:g}/{n}"] = see.final_deltas(traj, mix, base_arm, arm,
                                                                        args.k)
    return out


def weight_ratios(gammas, std):
    """w_N(p) / its N -> infinity limit, with or without the std normalisation."""
    def ratios(p, g):
        return {str(n): prompt_weight(p, n, g, std) / prompt_weight(p, None, g, std)
                for n in (2, 4, 8, 16, 64, 256, 1024)}

    return {f"{g:g}": {f"{p:g}": ratios(p, g) for p in (0.05, 0.3, 0.7, 0.95)} for g in gammas}


def clip_example(args):
    """clipped_expected_update at the --init policy after a step that raised the rare answer's
    logit until its ratio is 1.61 (past DAPO's 1 + 0.28), at N = --n."""
    old = [*args.init, 1 - sum(args.init)]
    raised = math.log(1.61 * (1 - old[1]) / (1 - 1.61 * old[1]))  # pi_last / pi_old_last = 1.61
    z = torch.tensor(old, dtype=torch.float64).log() + torch.tensor([0.0, raised, 0.0])
    pi = torch.softmax(z, 0).tolist()
    rows = []
    for kind in ("both", "rare"):
        for g in (0.0, 1.0):
            clipped, unclipped = clipped_expected_update(old, pi, kind, args.n, g)
            rows.append({"kind": kind, "gamma": g, "ratios": [a / b for a, b in zip(pi, old)],
                         "clipped": clipped.tolist(), "unclipped": unclipped.tolist()})
    return rows


def derivation(args):
    """Part 1 and 2 as numbers: w_N / w_inf (with the std and without), the Monte Carlo check,
    the identity off ratio 1 with DAPO's clip and without, the edge optima."""
    weights = weight_ratios(args.gammas, std=True)
    checks = []
    for kind in ("both", "rare"):
        for g in (0.0, 1.0):
            mc, pred, se = check_expected_update(*args.init, kind, args.n, g)
            checks.append({"kind": kind, "gamma": g, "monte_carlo": mc.tolist(),
                           "prediction": pred.tolist(), "se": se.tolist()})
    optima = {mix: {**{f"gamma {g:g}": edge_optimum(mix, gamma=g) for g in args.gammas},
                    **{f"pass@{k}": edge_optimum(mix, k=k) for k in (1, 2, args.k)}}
              for mix in args.mixes}
    return {"weight_ratio": weights, "weight_ratio_no_std": weight_ratios(args.gammas, std=False),
            "checks": checks, "clip": clip_example(args), "edge_optimum": optima}


# ---------------------------------------------------------------- report
def markdown(res, args, wall, cores=None):
    """The results page, from the results file: res its runs and derivation, args its config."""
    machine = f" on {cores} cores" if cores else ""
    lines = [f"# Two strategies, many prompts: {args.seeds} seeds, {args.steps} steps, "
             f"N = {args.n}",
             "", f"`python experiments/two_strategy.py{' --quick' if args.quick else ''}`: "
             f"{wall:.0f} s{machine}. docs/why-focal.md reads these numbers.", ""]
    lines += derivation_markdown(res["derivation"], args)
    for optim, run in res["runs"].items():
        lines += mix_markdown(optim, run, args)
    return "\n".join(lines) + "\n"


def page(saved):
    """The results page of a results file (its JSON), as main writes it."""
    args = argparse.Namespace(**{**vars(parse_args([])), **saved["config"]})
    res = {"derivation": saved["derivation"], "runs": saved["runs"]}
    return markdown(res, args, saved["wall_s"], saved.get("cores"))


def weight_table(ratios):
    ns = list(next(iter(next(iter(ratios.values())).values())))
    rows = [[g, p] + [f"{v[n]:.3f}" for n in ns] for g, ps in ratios.items() for p, v in ps.items()]
    return see_report.table(["gamma", "p", *(f"N {n}" for n in ns)], rows)


def derivation_markdown(d, args):
    table = see_report.table
    lines = ["## w_N(p) / F'(p): the weight of a prompt solved with probability p at group size N,",
             "relative to the N -> infinity limit (binomial sums of fgrpo.group_advantages)", ""]
    lines += weight_table(d["weight_ratio"])
    lines += ["", "## Without the std normalisation (Dr. GRPO): w_N(p) / (1 - p)^gamma, the limit",
              "(prompt_weight(std=False); at gamma 0 it is (N - 1) / N at every p)", ""]
    lines += weight_table(d["weight_ratio_no_std"])
    lines += ["", f"## E[update] = w_N(p) grad p: Monte Carlo (200,000 groups of N = {args.n}, "
              "fgrpo.group_advantages, autograd) against the prediction, per logit", ""]
    rows = [[c["kind"], f"{c['gamma']:g}"] + [f"{m:+.5f} / {p:+.5f} ({s:.5f})" for m, p, s in
                                               zip(c["monte_carlo"], c["prediction"], c["se"])]
            for c in d["checks"]]
    lines += table(["kind", "gamma", *(f"{o}: MC / predicted (se)" for o in OUTCOMES)], rows)
    ratios = ", ".join(f"{o} {r:.3f}" for o, r in zip(OUTCOMES, d["clip"][0]["ratios"]))
    lines += ["", "## Off ratio 1: E[update] of DAPO's surrogate (clipped_expected_update), groups "
              f"of N = {args.n} drawn from the initial policy, after a step to ratios {ratios}",
              "(without the clip it equals w_N(p_old) grad p; the clip drops the rare answer's "
              "push)", ""]
    rows = [[c["kind"], f"{c['gamma']:g}"] + [f"{u:+.5f} / {x:+.5f}" for u, x in
                                               zip(c["unclipped"], c["clipped"])]
            for c in d["clip"]]
    lines += table(["kind", "gamma", *(f"{o}: unclipped / clipped" for o in OUTCOMES)], rows)
    lines += ["", "## The rare strategy's mass b that maximises each objective, no mass wrong",
              "(none: the objective is flat in b)", ""]
    keys = list(next(iter(d["edge_optimum"].values())))
    rows = [[mix] + ["none" if v[x] is None else f"{v[x]:.3f}" for x in keys]
            for mix, v in d["edge_optimum"].items()]
    return lines + table(["mix", *keys], rows)


def mix_markdown(optim, run, args):
    ci, tests, table = see_report.ci, see_report.tests, see_report.table
    lines = []
    for mix, r in run["mixes"].items():
        lines += ["", f"## {optim}, mix \"{mix}\": F minus gamma 0, pass@{args.k} at matched "
                  f"pass@1 (where the runs cross each level) over the lr sweep {run['lrs']} "
                  f"({run['seconds']:.0f} s); mean [95% t interval], tests p_t / p_Wilcoxon, "
                  "seeds above 0; N minus exact over the levels of the range all four reach", ""]
        rows = []
        for g in r["sampled"]:
            s, x = r["sampled"][g], r["exact"][g]
            diff, f_vs = r["difference"].get(g), r["F_n_vs_exact_base"][g]
            rows.append([g, ci(s["gap"], 4), tests(s["gap"]), ci(x["gap"], 4), tests(x["gap"]),
                         ci(diff, 4), ci(f_vs["gap"], 4), ci(s["ceiling"]), ci(x["ceiling"])])
        lines += table(["gamma", f"N {args.n}", "tests", "exact", "tests", f"N {args.n} - exact",
                        f"F N {args.n} - exact gamma 0", f"ceiling, N {args.n}", "ceiling, exact"],
                       rows)
        lines += ["", "Final metrics at each lr, mean over seeds:", ""]
        keys = [x.format(k=args.k) for x in FINAL_KEYS]
        rows = [[arm] + [f"{v[x][0]:.3f}" for x in keys] for arm, v in r["final"].items()]
        lines += table(["arm", *keys], rows)
    return lines


def plot(trajs, args, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: pip install matplotlib to get the plot")
        return
    fig, axes = plt.subplots(1 + len(trajs), 3, figsize=(16, 4.8 * (1 + len(trajs))), squeeze=False)
    ps = [i / 400 for i in range(1, 400)]
    for i, g in enumerate([0.0, 0.5, 1.0, 2.0]):
        top = objective(1.0, g)
        axes[0][0].plot(ps, [objective(p, g, 200) / top for p in ps], color=f"C{i}",
                        label=f"F, gamma {g:g}")
        weight = [prompt_weight(p, None, g) / prompt_weight(0.5, None, g) for p in ps]
        axes[0][1].plot(ps, weight, color=f"C{i}", label=f"F', gamma {g:g}")
        if g <= 1:
            w8 = [prompt_weight(p, args.n, g) / prompt_weight(0.5, None, g) for p in ps[::8]]
            axes[0][1].plot(ps[::8], w8, ":", color=f"C{i}", label=f"w_{args.n}, gamma {g:g}")
    no_std = [prompt_weight(p, args.n, 1.0, std=False) / 0.5 for p in ps[::8]]  # limit: 1 - p
    axes[0][1].plot(ps[::8], no_std, "x", ms=3, color="C2",
                    label=f"w_{args.n} without std (Dr. GRPO), gamma 1")
    for j, k in enumerate((1, 2, args.k)):
        axes[0][0].plot(ps, [1 - (1 - p) ** k for p in ps], "--", color=f"C{4 + j}",
                        label=f"pass@{k}")
        axes[0][1].plot(ps, [(1 - p) ** (k - 1) / 0.5 ** (k - 1) for p in ps], "--",
                        color=f"C{4 + j}", label=f"d pass@{k} / dp")
    axes[0][0].set(title="objective per prompt, F(p) / F(1)", xlabel="p (prompt solved)")
    axes[0][1].set(title="weight of a prompt (relative to p = 0.5)", xlabel="p", yscale="log",
                   ylim=(1e-2, 1e2))
    plot_edge(axes[0][2], args)
    for row, (optim, traj) in enumerate(trajs.items(), 1):
        sub = argparse.Namespace(**vars(args))
        sub.lrs = args.lrs if optim == "adamw" else args.sgd_lrs
        for col, mix in enumerate(args.mixes[:2]):
            plot_frontiers(axes[row][col], traj, mix, sub, optim)
        plot_rare_mass(axes[row][2], traj, args.mixes[0], sub, optim)
    for ax in (axes[0][0], axes[0][1], axes[0][2]):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_edge(ax, args):
    """Each mix's objective on the edge first = 1 - b, last = b (no wrong mass), min-max scaled."""
    def pass_k(p):
        return 1 - (1 - p) ** args.k

    values = {f"gamma {g:g}": functools.partial(objective, gamma=g, steps=200) for g in args.gammas}
    values[f"pass@{args.k}"] = pass_k
    bs = [i / 200 for i in range(1, 200)]
    for i, mix in enumerate(args.mixes):
        w = see.MIXES[mix]
        for j, (label, value) in enumerate(values.items()):
            ys = [w["rare"] * value(b) + w["common"] * value(1 - b) for b in bs]
            span = max(ys) - min(ys)
            flat = span < 1e-6 * max(map(abs, ys))  # F(b) + F(1 - b) is constant at gamma 0
            ax.plot(bs, [0.5 if flat else (y - min(ys)) / span for y in ys], ["-", "--"][i],
                    color=f"C{j}", label=f"{mix}: {label}" + (" (flat)" if flat else ""))
    ax.set(title="objective along the edge (no wrong mass), scaled to [0, 1]",
           xlabel="b, the rare strategy's mass (first = 1 - b)")


def plot_rare_mass(ax, traj, mix, args, optim):
    for i, g in enumerate(args.gammas):
        for n, style in ((args.n, "-"), ("exact", "--")):
            for lr in args.lrs:
                path = [t[mix][see.arm_name(args.algo, g, lr, n)] for t in traj]
                p1, rare = median_path(path, ["pass@1", "rare mass"])
                ax.plot(p1, rare, style, color=f"C{i}", alpha=0.6, lw=1,
                        label=f"gamma {g:g}, {n}" if lr == args.lrs[0] else None)
    ax.set(title=f"{optim}, {mix}: the rare strategy's mass, every lr (median, seeds)",
           xlabel="pass@1", ylabel="rare mass")
    ax.legend(fontsize=7)


def plot_frontiers(ax, traj, mix, args, optim):
    for i, g in enumerate(args.gammas):
        for n, style in ((args.n, "-"), ("exact", "--")):
            names = [see.arm_name(args.algo, g, lr, n) for lr in args.lrs]
            lo = min(t[mix][names[0]][0]["pass@1"] for t in traj)
            hi = min(see.ceiling([t[mix][x] for x in names]) for t in traj)
            xs = [lo + (hi - lo) * j / 60 for j in range(61)]
            ys = [[see.frontier_at([t[mix][a] for a in names], x, f"pass@{args.k}") for t in traj]
                  for x in xs]
            pts = [(x, statistics.fmean(y)) for x, y in zip(xs, ys) if None not in y]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{i}",
                    label=f"gamma {g:g}, " + (f"N {n}" if n != "exact" else "exact"))
    ax.set(title=f"{optim}, {mix}: mean frontier over {args.seeds} seeds", xlabel="pass@1",
           ylabel=f"pass@{args.k}")
    ax.legend(fontsize=7)


def run_optimiser(args, optim):
    """The simulation and its analysis with one optimiser, on its own lr grid."""
    sub = argparse.Namespace(**vars(args))
    sub.lrs = args.lrs if optim == "adamw" else args.sgd_lrs
    t0 = time.time()
    cells, curves = simulate(sub, optim)
    seeds = as_seeds(cells, curves, sub)
    traj = see.trajectories(seeds)
    summary = {mix: summarise_mix(traj, mix, sub) for mix in args.mixes}
    return {"lrs": sub.lrs, "mixes": summary, "seeds": seeds, "seconds": time.time() - t0}, traj


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    runs, trajs = {}, {}
    for optim in args.optims:
        runs[optim], trajs[optim] = run_optimiser(args, optim)
    res = {"derivation": derivation(args), "runs": runs}
    wall = time.time() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    saved = {"config": see.config_of(args), **res, "wall_s": wall, "cores": os.cpu_count()}
    (args.out / f"{args.name}.json").write_text(json.dumps(saved))
    (args.out / f"{args.name}.md").write_text(page(saved))
    plot(trajs, args, args.out / f"{args.name}.png")
    print(page(saved))
    return res


if __name__ == "__main__":
    main()
