"""Categorical simulation of the tail-miss effect (F-GRPO paper App. J, after BroRL).

A softmax policy z over 128,000 actions (10,000 correct, R = +1; the rest
R = -1) takes T optimiser steps, each on N i.i.d. draws, maximising the
group-relative objective in probability space, optionally times the F-GRPO
focal weight (1 - mu_hat)^gamma. Reported per (optimiser, N, gamma, seed):
retained positive mass M_ret (1 = no correct action lost probability) and the
final total correct mass, which can grow while M_ret shrinks.

    python experiments/categorical.py --optim adamw sgd --threads 1
        # full grid, ~12 min per optimiser
    python experiments/categorical.py --lr 1e-3 --threads 1
        # AdamW at BroRL's lr
    python experiments/categorical.py --quick --out /tmp/q
        # 128k actions, T=300, N 8/64/1024

Optimiser: the paper names none. AdamW at lr 1e-2 is our reading, inferred from
BroRL (which used AdamW at 1e-3); torch defaults otherwise (betas 0.9/0.999,
eps 1e-8) except weight decay 0: decoupled decay pulls every logit toward 0
(uniform), which alone would cut each non-anchor correct action's probability
by ~11% over T = 1000 at wd 0.01, a loss unrelated to sampling. SGD lr 5e3 is
the smallest on a 1-2-5 grid whose final correct mass at N = 1024, gamma = 0
(seed 0) reaches AdamW's (>= 0.98); SGD is bistable here: up to 3e3 it barely
moves in T = 1000, from 3.5e3 the anchor runs away (the p^2 feedback of a
probability-space objective) and takes all the mass.
Outcome (experiments/results/): at lr 1e-2 every N >= 128 ends with the anchor
holding ~98% of the probability (M_ret ~0.02); at lr 1e-3 M_ret dips near N = 8
and returns to 1 for N >= 2048, the picture the paper describes.
Sampling is paired: gamma = 0 and gamma = 1 at one (N, seed) use the same
uniform draws (inverse CDF), so their difference is not sampling noise.
"""
import argparse
import json
import time
from pathlib import Path

import torch

DEFAULT_LR = {"adamw": 1e-2, "sgd": 5e3}


def tail_miss_probability(N, mu_pos, tau):
    """Pr(B), Lemma 3.1: the chance that a group of N samples has mixed rewards (so it
    updates the policy, pushing mass onto the correct answers it sampled) yet misses a set E
    of correct answers of mass tau, which then loses mass where the sampled correct answers are
    on average more probable than the sampled wrong ones. mu_pos is the total correct mass,
    0 < tau < mu_pos <= 1. Non-monotonic in N: it peaks near N = 5 at about 0.72 for
    mu_pos 0.5, tau 0.05. High-mu_pos prompts are the ones g(x) down-weights (docs/why-focal.md)."""
    if not (isinstance(N, int) and N >= 1 and 0 < tau < mu_pos <= 1):
        raise ValueError("need an integer N >= 1 and 0 < tau < mu_pos <= 1, "
                         f"got {N!r}, {mu_pos}, {tau}")
    # Lemma 3.1: Pr(no sample in E) - Pr(all correct, none in E) - Pr(all wrong)
    return (1 - tau) ** N - (mu_pos - tau) ** N - (1 - mu_pos) ** N


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--optim", nargs="+", choices=["adamw", "sgd"], default=["adamw"],
        help="optimiser(s) on the logits, run one after the other into one table")
    add("--lr", type=float, default=None,
        help="learning rate for a single --optim (default: adamw 1e-2, sgd 5e3)")
    add("--weight-decay", type=float, default=0.0,
        help="AdamW decoupled weight decay (0: see docstring)")
    add("--steps", type=int, default=1000, help="T, optimiser steps")
    add("--n-actions", type=int, default=128_000, help="number of actions")
    add("--n-correct", type=int, default=10_000, help="number of correct actions (R = +1)")
    add("--n", type=int, nargs="+", default=[2**k for k in range(1, 18)], help="group sizes N")
    add("--gammas", type=float, nargs="+", default=[0.0, 1.0], help="focal exponents")
    add("--seeds", type=int, default=4, help="number of seeds (0, 1, ...)")
    add("--quick", action="store_true",
        help="test grid: T = 300, N in {8, 64, 1024}, 2 seeds (seconds)")
    add("--threads", type=int, default=None,
        help="torch CPU threads (default: torch's); 1 is faster on busy cores")
    add("--out", type=Path, default=Path("experiments/results"), help="output folder")
    args = p.parse_args(argv)
    if not 1 <= args.n_correct < args.n_actions:
        p.error("--n-correct must be between 1 and --n-actions - 1")
    if min(args.n) < 1 or args.seeds < 1 or args.steps < 1:
        p.error("--n values, --seeds and --steps must be at least 1")
    if args.lr is not None and len(args.optim) > 1:
        p.error("--lr applies to one optimiser: give a single --optim with it")
    if args.quick:
        args.steps, args.n, args.seeds = 300, [8, 64, 1024], 2
    return args


def initial_logits(rows, n_actions, n_correct):
    """(rows, n_actions) logits; actions [0, n_correct) are correct, action 0 the anchor."""
    # App. J: anchor z = 5, other correct z = 3, incorrect z = 0 (correct mass ~0.63)
    z = torch.zeros(rows, n_actions)
    z[:, :n_correct] = 3.0
    z[:, 0] = 5.0
    return z


def sample_actions(p, n_values, gens, n_gammas):
    """N i.i.d. draws from each row of p (G, A); rows ordered (N, gamma, seed).

    Returns (rows, actions), each (S,) with S = sum of N over rows. gens[i][s] drives
    (n_values[i], seed s) and is shared across gammas, so gamma runs are paired."""
    cdf = p.detach().cumsum(-1)
    rows, actions, start = [], [], 0
    for n, g_row in zip(n_values, gens):
        u = torch.stack([torch.rand(n, generator=g) for g in g_row]).repeat(n_gammas, 1)
        block = slice(start, start + u.shape[0])
        idx = torch.searchsorted(cdf[block], u * cdf[block, -1:])
        actions.append(idx.clamp_(max=p.shape[1] - 1).flatten())  # u * total can round past the end
        rows.append(torch.arange(block.start, block.stop).repeat_interleave(n))
        start = block.stop
    return torch.cat(rows), torch.cat(actions)


def focal_pg_loss(p, rows, actions, reward, n, gamma):
    """Minus the App. J objective, summed over independent rows.

    p: (G, A) softmax(z) with grad; rows, actions: (S,) the draws; reward: (A,) +-1;
    n: (G,) group size N; gamma: (G,) focal exponent."""
    r = reward[actions]
    mu_hat = torch.zeros_like(n).index_add_(0, rows, (r > 0).to(n.dtype)) / n
    adv = r - (2 * mu_hat - 1)[rows]  # mean_j R_j = 2 mu_hat - 1 for R in {+1, -1}
    # App. J: L = (1/N) sum_j (R_j - mean_j R_j) * p_{a_j}, probabilities not log-probs
    objective = torch.zeros_like(n).index_add(0, rows, adv * p[rows, actions]) / n
    # F-GRPO focal weight (1 - mu_hat)^gamma, a constant: mu_hat comes from the draws
    return -((1 - mu_hat) ** gamma * objective).sum()


def retained_mass(pi0, pi_t, correct):
    """(G,) retained positive mass; pi0, pi_t: (G, A) policies before/after; correct: (A,) bool."""
    # App. J: M_ret = 1 - sum_{a correct} max(0, pi0(a) - piT(a)) / sum_{a correct} pi0(a)
    lost = (pi0 - pi_t).clamp(min=0)[:, correct].sum(-1)
    return 1 - lost / pi0[:, correct].sum(-1)


def simulate(n_values, gammas, seeds, steps, n_actions, n_correct, optim="adamw", lr=None,
             weight_decay=0.0):
    """Train every (N, gamma, seed) cell at once, one row of a (cells, n_actions) logit tensor.

    Returns {"m_ret": {(N, gamma, seed): M_ret}, "correct_mass": {same keys: final correct
    mass}, "initial_correct_mass": float, "lr": float}."""
    lr = DEFAULT_LR[optim] if lr is None else lr
    keys = [(n, g, s) for n in n_values for g in gammas for s in seeds]
    n = torch.tensor([k[0] for k in keys], dtype=torch.float32)
    gamma = torch.tensor([k[1] for k in keys], dtype=torch.float32)
    # one stream per (N, seed): a cell's draws do not depend on which other cells run
    gens = [[torch.Generator().manual_seed(s * 10**7 + nv) for s in seeds] for nv in n_values]
    reward = torch.full((n_actions,), -1.0)
    reward[:n_correct] = 1.0
    z = torch.nn.Parameter(initial_logits(len(keys), n_actions, n_correct))
    opt = (torch.optim.AdamW([z], lr=lr, weight_decay=weight_decay, fused=True) if optim == "adamw"
           else torch.optim.SGD([z], lr=lr))
    pi0 = torch.softmax(z.detach().double(), -1)
    for _ in range(steps):
        p = torch.softmax(z, -1)
        rows, actions = sample_actions(p, n_values, gens, len(gammas))
        opt.zero_grad(set_to_none=True)
        focal_pg_loss(p, rows, actions, reward, n, gamma).backward()
        opt.step()
    pi_t = torch.softmax(z.detach().double(), -1)
    correct = reward > 0
    m_ret, mass = retained_mass(pi0, pi_t, correct), pi_t[:, correct].sum(-1)
    return {"m_ret": dict(zip(keys, m_ret.tolist())),
            "correct_mass": dict(zip(keys, mass.tolist())),
            "initial_correct_mass": pi0[0, correct].sum().item(), "lr": lr}


def markdown_table(runs, n_values, gammas, seeds):
    """M_ret (mean +- std over seeds) and mean final correct mass, one row per N."""
    cols = [(name, g) for name in runs for g in gammas]
    head = " | ".join(f"M_ret {name} g={g:g} | mass {name} g={g:g}" for name, g in cols)
    lines = [f"| N | {head} |", "|---" * (1 + 2 * len(cols)) + "|"]
    for nv in n_values:
        cells = []
        for name, g in cols:
            m = torch.tensor([runs[name]["m_ret"][(nv, g, s)] for s in seeds], dtype=torch.float64)
            c = torch.tensor([runs[name]["correct_mass"][(nv, g, s)] for s in seeds],
                             dtype=torch.float64)
            std = m.std().item() if len(seeds) > 1 else 0.0
            cells += [f"{m.mean():.3f} +- {std:.3f}", f"{c.mean():.3f}"]
        lines.append(f"| {nv} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs, n_values, gammas, seeds, title, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: pip install matplotlib")
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name in runs:
        for g in gammas:
            m = torch.tensor([[runs[name]["m_ret"][(nv, g, s)] for s in seeds] for nv in n_values],
                             dtype=torch.float64)
            err = m.std(1) if len(seeds) > 1 else None
            ax.errorbar(n_values, m.mean(1), yerr=err, marker="o", capsize=2,
                        label=f"{name}, gamma={g:g}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="N (draws per step)", ylabel="retained positive mass M_ret", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(args, runs, walls, seeds):
    """JSON of every (run, N, gamma, seed), its page (a markdown table) and, with matplotlib, a
    PNG."""
    tag = "_".join(["categorical"] + [n.replace(" lr=", "_lr") for n in runs]
                   + ["quick"] * args.quick)
    rows = [{"optim": n, "n": k[0], "gamma": k[1], "seed": k[2], "m_ret": v,
             "correct_mass": r["correct_mass"][k]}
            for n, r in runs.items() for k, v in r["m_ret"].items()]
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings.update(lr={n: r["lr"] for n, r in runs.items()}, wall_s=walls,
                    initial_correct_mass=next(iter(runs.values()))["initial_correct_mass"])
    saved = {"settings": settings, "runs": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{tag}.json").write_text(json.dumps(saved, indent=1))
    (args.out / f"{tag}.md").write_text(page(saved))
    print(page(saved))
    plot(runs, args.n, args.gammas, seeds, title(saved["settings"]), args.out / f"{tag}.png")


def title(settings):
    return (f"T={settings['steps']}, {settings['n_actions']} actions ({settings['n_correct']} "
            f"correct), {settings['seeds']} seeds")


def page(saved):
    """The results page of a results file (its JSON): M_ret and final correct mass by N."""
    s = saved["settings"]
    runs = {}
    for row in saved["runs"]:
        run = runs.setdefault(row["optim"], {"m_ret": {}, "correct_mass": {}})
        key = (row["n"], row["gamma"], row["seed"])
        run["m_ret"][key], run["correct_mass"][key] = row["m_ret"], row["correct_mass"]
    table = markdown_table(runs, s["n"], s["gammas"], list(range(s["seeds"])))
    notes = "".join(f"- {n}: wd={s['weight_decay']:g} (AdamW only), initial correct mass "
                    f"{s['initial_correct_mass']:.4f}, wall {s['wall_s'][n]:.0f} s\n"
                    for n in runs)
    return f"### M_ret and final correct mass; {title(s)}\n\n{table}\n{notes}"


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    seeds, runs, walls = list(range(args.seeds)), {}, {}
    for optim in args.optim:
        t0 = time.time()
        res = simulate(args.n, args.gammas, seeds, args.steps, args.n_actions, args.n_correct,
                       optim, args.lr, args.weight_decay)
        name = f"{optim} lr={res['lr']:g}"
        runs[name], walls[name] = res, time.time() - t0
        print(f"{name}: initial correct mass {res['initial_correct_mass']:.4f}, "
              f"wall {walls[name]:.0f} s", flush=True)
    write_results(args, runs, walls, seeds)


if __name__ == "__main__":
    main()
