"""F-GRPO among its peers: F-DAPO against its base algorithms and against the methods built for
pass@k, in see_it_happen's toy, at matched pass@1, under experiments/peers_protocol.toml.

Each peer is an advantages function with fgrpo.Hooks.advantages' signature, (0/1 rewards (P, N),
their P * N samples grouped by prompt, fgrpo's args) -> (P, N); its options are read from args
(args.k, args.beta, args.lam), which the protocol's [arms] set. The peers run on DAPO's loss (the
base of F-DAPO), so only the advantages differ between the arms. Two of them look at the sample
itself: the unlikeliness reward (its old log-prob) and DARLING (its answer); sample_for_peers, this
experiment's own sample hook, gives each sample both, so fgrpo.train needs no special case.

The prompt weight. For an advantage that depends only on the group's rewards, the expected update
of a prompt with success probability mu is w(mu) times the gradient of mu, with
w(mu) = N (E[A | the sample is correct] - E[A | it is wrong]): prompt_weight computes it by
enumerating every reward vector of a group. PKPO's is k (1 - mu)^(k-1), the gradient of pass@k;
F-GRPO's is GRPO's scaled down where mu is high.

The run reuses experiments/see_it_happen.py's machinery: its warm starts, its train_arm (an arm here
brings its own hooks and options), its exact measurement and run_jobs, and frontiers.compare for
every gap at matched pass@1. Every finished arm and warm start is cached under --work with its
settings, so a run that stops resumes where it stopped, and a rerun reads the arms again.

    python experiments/peers.py --plan    # the grid's runs and its CPU budget; runs nothing
    python experiments/peers.py           # the protocol's grid (hours): experiments/results/peers.*
    python experiments/peers.py --quick   # every arm and the reading in miniature (minutes)
    python experiments/peers.py --weights-figure experiments/results/prompt_weights.png  # w(mu)
    python experiments/peers.py --amendment  # experiments/peers_amendment.toml's arms (an hour)
    python experiments/peers.py --report  # peers.md and the trade-off figure again, from the JSON

The amendment (experiments/peers_amendment.toml, written after the grid's results were seen and
committed before its runs) runs PKPO and Pass@k Training at k 2, with F-DAPO and DAPO again beside
them, into peers_amendment.json. The page reads both results, and adds what the matched-pass@1
design cannot show: each arm's pass@1 against its pass@k (tradeoff.py).
"""
import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
import fgrpo  # noqa: E402
import see_it_happen as see  # noqa: E402
import see_it_happen_report as report  # noqa: E402
from frontiers import broke_down, ceiling, compare  # noqa: E402
from see_it_happen_figures import pyplot  # noqa: E402
import tradeoff  # noqa: E402

EPS = 1e-6  # the authors' codes' epsilon (verl's), where a std or a mean divides


def choose(counts, k):
    """C(m, k) for each m of an integer tensor; 0 where m < k or m < 0 (scipy's comb)."""
    table = torch.tensor([float(math.comb(m, k)) for m in range(int(counts.max()) + 1)] or [0.0])
    return table[counts.long().clamp(min=0)] * (counts >= 0)

# ---------------------------------------------------------------- the peers' advantages
def pkpo_advantages(rewards, samples, args):
    """PKPO (Walder & Karkhanis 2025, arXiv 2505.15201), its s^(loo-1) at k = args.k <= N."""
    r = rewards.float()
    n = r.shape[-1]
    wrong = (n - r.sum(-1, keepdim=True)).long()
    # Eq. 33, s_i = 1/C(n,k) sum over k-subsets I holding i of (max_I g - max_{I minus i} g): with
    # 0/1 rewards a correct i adds 1 where the other k-1 are all wrong, C(n-c, k-1) subsets; a
    # wrong i never changes a subset's max, so it gets 0
    return r * choose(wrong, args.k - 1) / math.comb(n, args.k)


def passk_training_advantages(rewards, samples, args):
    """Pass@k Training (Chen et al. 2025, arXiv 2508.10751), its analytical advantages at k =
    args.k: the group's k-subsets, each rewarded with its max, normalised as GRPO's groups."""
    r = rewards.float()
    n = r.shape[-1]
    wrong = (n - r.sum(-1, keepdim=True)).long()
    # Eqs. 11-13: the mean pass@k reward over the k-subsets, 1 - C(N_neg, k) / C(N, k), and its
    # std sqrt(mean (1 - mean)) (0/1 rewards)
    mean = 1 - choose(wrong, args.k) / math.comb(n, args.k)
    std = (mean * (1 - mean)).sqrt()
    # Eq. 14: a correct response lies in passing subsets only
    correct = (1 - mean) / (std + EPS)
    # Eq. 15: a wrong one lies in a failing subset with chance C(N_neg-1, k-1) / C(N-1, k-1)
    failing = choose(wrong - 1, args.k - 1) / math.comb(n - 1, args.k - 1)
    return torch.where(r == 1, correct, (1 - mean - failing) / (std + EPS))


def w_reinforce_advantages(rewards, samples, args):
    """W-REINFORCE (Zhu et al. 2025, arXiv 2506.01347) at lambda = args.lam."""
    r = rewards.float()
    # lambda L_PSR + L_NSR: +lambda for a correct sample, -1 for a wrong one, no baseline (the
    # authors' compute_psr_nsr_outcome_advantage, advantage="weighted")
    return args.lam * r - (1 - r)


def maxrl_advantages(rewards, samples, args):
    """MaxRL (Tajwar et al. 2026, arXiv 2602.02710)."""
    r = rewards.float()
    mean = r.mean(-1, keepdim=True)
    # A_i = (r_i - mean) / mean: the group's pass rate in place of GRPO's std (the authors'
    # compute_maxrl_outcome_advantage); a group all wrong gets 0 / EPS = 0
    return (r - mean) / (mean + EPS)


def likelihood_ranks(logprobs):
    """(P, N) -> each sample's rank by likelihood within its group, 0 the least likely; tied
    samples share their mean rank (in the toy, samples of one answer tie)."""
    below = (logprobs[:, None, :] < logprobs[:, :, None]).sum(-1)
    tied = (logprobs[:, None, :] == logprobs[:, :, None]).sum(-1) - 1
    return below + tied / 2


def unlikeliness_advantages(rewards, samples, args):
    """The unlikeliness reward (He et al. 2025, arXiv 2506.02355) at beta = args.beta, then GRPO's
    normalisation. Needs each sample's mean_logprob (sample_for_peers)."""
    r = rewards.float()
    n = r.shape[-1]
    logprobs = torch.tensor([s.mean_logprob for s in samples]).view_as(r)
    # R_i (1 - beta rank_i / G), rank_i ascending in the old policy's mean token log-prob (the
    # authors' _compute_advantages): the likelier a correct sample, the less its reward
    shaped = r * (1 - args.beta * likelihood_ranks(logprobs) / n)
    # Sec. 2 (GRPO): (r - mean) / (std + eps), unbiased std as the authors' torch.std
    adv = (shaped - shaped.mean(-1, keepdim=True)) / (shaped.std(-1, keepdim=True) + EPS)
    # groups all correct or all wrong are left out, as the authors' run (advantage_threshold)
    return adv * (r.std(-1, keepdim=True) > 0)


def darling_advantages(rewards, samples, args):
    """DARLING (Li et al. 2025, arXiv 2509.02534), with answers as their own classes (exact in the
    toy). Needs each sample's answer (sample_for_peers)."""
    r = rewards.float()
    n = r.shape[-1]
    groups = [[s.answer for s in samples[i:i + n]] for i in range(0, len(samples), n)]
    same = torch.tensor([[[a == b for b in group] for a in group] for group in groups])  # (P,N,N)
    # Div(y_i): the fraction of the other N-1 responses in another class than y_i's
    diversity = (n - same.sum(-1)) / (n - 1)
    # r_darling = r * Norm(Div): the authors' code (facebookresearch/darling, reward_score/
    # partition_reward_vllm_serve.py) takes Div as it is, floored at 0.1; below N 12 the floor
    # lifts only a group of one class, whose samples tie, so it is left out (test_peers.py)
    shaped = r * diversity
    # GRPO's group-relative advantage without the std normalisation, as DARLING's objective
    return shaped - shaped.mean(-1, keepdim=True)

# ---------------------------------------------------------------- what the samples carry
class PeerSample(NamedTuple):
    """fgrpo.Sample and what two peers read of it: the old policy's mean token log-prob (the
    unlikeliness reward's ranking) and the answer, the last \\boxed{...} or else the text."""
    prompt_ids: list
    completion_ids: list
    truncated: bool
    mean_logprob: float
    answer: str


def answer_of(text):
    start = text.rfind("\\boxed{")
    end = text.find("}", start)
    if start < 0 or end < 0:
        return text.strip()
    return text[start + len("\\boxed{"):end].strip()


@torch.no_grad()
def sample_for_peers(model, tok, engine, prompts, n, args, seed):
    """fgrpo.rollout, then each sample's mean token log-prob under the model that sampled it (the
    old policy) and its answer."""
    samples = fgrpo.rollout(model, tok, engine, prompts, n, args, seed)
    device = next(model.parameters()).device
    pairs = [(s.prompt_ids, s.completion_ids) for s in samples]
    ids, attn, mask = (x.to(device) for x in fgrpo.collate(pairs, tok.pad_token_id))
    logp = fgrpo.token_logprobs(model, ids, attn, temperature=args.temperature, mask=mask)
    mean = ((logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    texts = tok.batch_decode([s.completion_ids for s in samples], skip_special_tokens=True)
    return [PeerSample(*s, m, answer_of(t)) for s, m, t in zip(samples, mean, texts)]

# each peer's fgrpo.Hooks fields: the two that read the samples sample with sample_for_peers
PEER_HOOKS = {"pkpo": {"advantages": pkpo_advantages},
              "passk_training": {"advantages": passk_training_advantages},
              "unlikeliness": {"sample": sample_for_peers, "advantages": unlikeliness_advantages},
              "w_reinforce": {"advantages": w_reinforce_advantages},
              "maxrl": {"advantages": maxrl_advantages},
              "darling": {"sample": sample_for_peers, "advantages": darling_advantages}}

# ---------------------------------------------------------------- the prompt weight w(mu)
def prompt_weight(advantages, mu, n, args):
    """w(mu) = N (E[A_1 | R_1 = 1] - E[A_1 | R_1 = 0]) of a rewards-only advantages function at
    group size n: every one of the 2^n reward vectors, weighted by its binomial probability."""
    vectors = torch.tensor(list(itertools.product((0, 1), repeat=n)), dtype=torch.float64)
    adv = advantages(vectors, None, args).double()[:, 0]
    correct = vectors.sum(-1)
    prob = mu ** correct * (1 - mu) ** (n - correct)
    first = vectors[:, 0] == 1
    given_correct = (prob * adv)[first].sum() / mu
    given_wrong = (prob * adv)[~first].sum() / (1 - mu)
    return float(n * (given_correct - given_wrong))

# ---------------------------------------------------------------- the protocol and its grid
PROTOCOL_PATH = ROOT / "experiments" / "peers_protocol.toml"
PROTOCOL = tomllib.loads(PROTOCOL_PATH.read_text())
DESIGN = PROTOCOL["design"]
ARMS = PROTOCOL["arms"]
PRIMARY = PROTOCOL["primary"]
AMENDMENT_PATH = ROOT / "experiments" / "peers_amendment.toml"
AMENDMENT = tomllib.loads(AMENDMENT_PATH.read_text())
# the amendment's rule adds a fourth verdict, where no seed matched and no test could be made
F_ABOVE, P_ABOVE, NONE_SHOWN, NOT_COMPARABLE = AMENDMENT["primary"]["verdicts"]
TRADEOFF_KS = (16, 256)  # pass@1 against pass@k at the headline k and at the largest k
KEY = f"{DESIGN['start']}/{DESIGN['mix']}"  # see_it_happen's condition, START/MIX
QUICK_SEEDS = {"all": 3, "base": 2}  # --quick: the first seeds of each set
OPTIONS = ("peer", "k", "beta", "lam")  # an arm's options of [arms], set on fgrpo's args
MUS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)  # w(mu)'s table
WEIGHT_MUS = [i / 100 for i in range(1, 100)]  # w(mu)'s figure
# the toy's base models, whose mu the figure marks: see_it_happen's confirmation
CONFIRMATION = ROOT / "experiments" / "results" / "see_it_happen_confirmation.json"


def design_differences(design, toy_design):
    """The keys of this protocol's [design] whose value differs from see_it_happen's [design]
    (its "protocol" key names that file; it is not a setting)."""
    return [k for k in design if k != "protocol" and toy_design.get(k) != design[k]]


def check_protocol():
    """Refuse, in one sentence, to run a protocol that says what this runner cannot do: a [design]
    unlike see_it_happen's, a peer without an advantages function, a primary peer not an arm."""
    named = {DESIGN["protocol"], PROTOCOL["rules"]["same_as"]}
    if named != {str(see.PROTOCOL_PATH.relative_to(ROOT))}:
        sys.exit(f"{PROTOCOL_PATH.name}: [design] protocol and [rules] same_as must both name "
                 f"{see.PROTOCOL_PATH.relative_to(ROOT)}, whose rules see_it_happen.py applies")
    differ = design_differences(DESIGN, see.DESIGN)
    if differ:
        sys.exit(f"{PROTOCOL_PATH.name}: [design] {', '.join(differ)} differ from "
                 f"{DESIGN['protocol']}'s [design], which the protocol says it keeps unchanged")
    for path, protocol in ((PROTOCOL_PATH, PROTOCOL), (AMENDMENT_PATH, AMENDMENT)):
        arms, rule = protocol["arms"], protocol["primary"]
        unknown = [a["peer"] for a in arms.values() if a.get("peer") not in (None, *PEER_HOOKS)]
        if unknown or not set(rule["peers"]) <= set(arms) or rule["adjust"] != "holm":
            sys.exit(f"{path.name}: a peer of [arms] without an advantages function here "
                     f"({', '.join(unknown) or 'none'}), a [primary] peer not in [arms], or an "
                     "adjustment other than holm")
    changed = [a for a, spec in AMENDMENT["arms"].items() if ARMS.get(a, spec) != spec]
    if changed or AMENDMENT["design"]["same_as"] != str(PROTOCOL_PATH.relative_to(ROOT)):
        sys.exit(f"{AMENDMENT_PATH.name}: [design] same_as must name {PROTOCOL_PATH.name}, and an "
                 f"arm of both files must be the same arm ({', '.join(changed) or 'none'} differ)")


def seed_sets(quick):
    """{"all": seeds, "base": seeds} of [seeds]; --quick: the first QUICK_SEEDS of each."""
    out = {}
    for name, (first, count) in PROTOCOL["seeds"].items():
        out[name] = list(range(first, first + (QUICK_SEEDS[name] if quick else count)))
    return out


def toy_args(args):
    """see_it_happen's arguments of this run: [design] (--quick: see_it_happen's miniature of it,
    its lrs, steps, batches and warm start), the seeds of [seeds], --work and --workers."""
    toy = see.parse_args(["--quick"] * args.quick)  # its defaults: its [design], as this one's
    sets = seed_sets(args.quick)
    protocol = AMENDMENT if args.amendment else PROTOCOL
    vars(toy).update(starts=[DESIGN["start"]], mixes=[DESIGN["mix"]], first_seed=sets["all"][0],
                     seeds=len(sets["all"]), seed_sets=sets, work=args.work, workers=args.workers,
                     arms=protocol["arms"], budget=protocol["budget"])
    return toy


def arm_runs(name, spec, toy):
    """An arm of [arms] as see_it_happen.train_arm's runs, one per lr; a peer brings its hooks and
    its options."""
    options = {k: spec[k] for k in OPTIONS if k in spec}
    return [{"mix": DESIGN["mix"], "algo": spec["algo"], "gamma": spec["gamma"], "lr": lr,
             "n": toy.n, "name": run_name(name, lr), "steps": toy.steps,
             "hooks": PEER_HOOKS.get(spec.get("peer"), {}), "options": options}
            for lr in toy.lrs]


def run_name(arm, lr):
    return f"{arm}_lr{lr:g}"


def sweep(arm, toy):
    """An arm's runs at every lr, by name: the runs its frontier is taken over."""
    return [run_name(arm, lr) for lr in toy.lrs]


def seed_arms(seed, toy):
    """The arms of this run's [arms] that run on `seed` (seeds = "all" or "base")."""
    return [name for name, spec in toy.arms.items() if seed in toy.seed_sets[spec["seeds"]]]


def run_seed(seed, start, toy, heldout):
    """see_it_happen.run_jobs' job: a seed's warm start, then its arms, on one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    import transformers.utils.logging as hf_logging
    hf_logging.disable_progress_bar()
    try:
        ctx = see.prepare_seed(seed, start, toy, heldout)
        arms = {}
        for name in seed_arms(seed, toy):
            for arm in arm_runs(name, toy.arms[name], toy):
                arms[arm["name"]] = record = see.train_arm(arm, ctx)
                see.report_arm(ctx, arm, record)
    finally:
        torch.set_num_threads(threads)
    return {"seed": seed, "start": start, "base": ctx["base"], "arms": {DESIGN["mix"]: arms},
            "check": None, "ceilings": {}}


def plan(toy):
    """The grid, one line an arm, its runs and the [budget]'s CPU-minutes and wall time."""
    budget = toy.budget
    lines = []
    runs = 0
    for name, spec in toy.arms.items():
        seeds = toy.seed_sets[spec["seeds"]]
        count = len(seeds) * len(toy.lrs)
        runs += count
        said = ", ".join(f"{k} {spec[k]}" for k in OPTIONS if k in spec)
        lines.append(f"{name:17s} {spec['algo']:5s} gamma {spec['gamma']:<4g} {said:28s} seeds "
                     f"{seeds[0]}-{seeds[-1]} x {len(toy.lrs)} lrs = {count} runs")
    lines.append(f"{runs} runs of {toy.steps} steps and {toy.seeds} warm starts")
    if not toy.quick:
        cpu_min = runs * budget["cpu_s_per_run"] / 60
        hours = runs * budget["wall_s_per_run_in_pool"] / budget["workers"] / 3600
        lines.append(f"budget ([budget], {budget['cpu_s_per_run']} CPU-s a "
                     f"run): {cpu_min:.0f} CPU-min for the runs, plus the warm starts; about "
                     f"{hours:.1f} h of wall time with {budget['workers']} workers on 2 cores")
    return lines, runs

# ---------------------------------------------------------------- the reading
def holm(pvalues):
    """Holm's step-down adjustment (Holm 1979) of a family of p-values, in their order: the i-th
    smallest of m times m - i + 1 (i from 1), then the running maximum, at most 1. A test that
    could not be made (None: under two matched seeds) counts as p = 1, and stays in the family."""
    ps = [1.0 if p is None else p for p in pvalues]
    adjusted = [1.0] * len(ps)
    running = 0.0
    for i, at in enumerate(sorted(range(len(ps)), key=ps.__getitem__)):
        running = max(running, min(1.0, (len(ps) - i) * ps[at]))
        adjusted[at] = running
    return adjusted


def verdict(gap, p_adjusted, alpha):
    """[primary]'s verdict on P minus F: where the adjusted test rejects, the mean's sign says
    which is above; where under two seeds matched, no comparison happened (the amendment's rule:
    the frozen one said "no difference shown" there too)."""
    if gap is None or gap["n"] < 2:
        return NOT_COMPARABLE
    if p_adjusted > alpha:
        return NONE_SHOWN
    return P_ABOVE if gap["mean"] > 0 else F_ABOVE


def on_seeds(traj, names):
    """The seeds that ran every one of `names` (the base algorithms' arms: seeds "base" only)."""
    return [t for t in traj if all(n in t[KEY] for n in names)]


def versus(traj, toy, base, arm, metric):
    """`arm` minus `base` (arms of [arms]) at matched pass@1, on the seeds both ran:
    frontiers.compare over each arm's runs at every lr."""
    names = sweep(base, toy), sweep(arm, toy)
    return compare(on_seeds(traj, names[0] + names[1]), KEY, *names, toy, metric)


def headline_k(traj, toy):
    """[rules]' headline k, from DAPO's base models (step 0 of its runs) over the seeds."""
    first = sweep("dapo", toy)[0]
    base = {m: [statistics.fmean(t[KEY][first][0][m] for t in traj)] for m in see.KS_METRICS}
    return see.headline_k(base)


def primary(traj, toy, k, rule):
    """[primary] of a protocol (`rule`): per peer, P minus F-DAPO at pass@k, mean over levels and
    seeds with its 95% t interval and paired t test, Holm-adjusted over the peers, the verdict."""
    by_peer = {p: versus(traj, toy, rule["comparator"], p, f"pass@{k}") for p in rule["peers"]}
    p_values = [(c["gap"] or {}).get("p_t") for c in by_peer.values()]  # None: no test made
    adjusted = holm(p_values)
    return {p: {"gap": c["gap"], "unmatched": c["unmatched"], "p_holm": a,
                "verdict": verdict(c["gap"], a, rule["alpha"])}
            for (p, c), a in zip(by_peer.items(), adjusted)}


def gaps(traj, toy, base, arm, metrics):
    """{metric: {"gap": the paired summary over seeds, "unmatched": seeds left out}}."""
    out = {}
    for m in metrics:
        c = versus(traj, toy, base, arm, m)
        out[m] = {"gap": c["gap"], "unmatched": c["unmatched"]}
    return out


def top_pass1(traj, toy, arm):
    """An arm's top pass@1 (the highest of any stable run in its steps), mean over the seeds where
    it has one, and minus DAPO's paired over the seeds both have one (compare's ceiling)."""
    tops = []
    for t in on_seeds(traj, sweep(arm, toy)):
        stable = [t[KEY][n] for n in sweep(arm, toy) if not broke_down(t[KEY][n])]
        if stable:
            tops.append(ceiling(stable))
    minus = versus(traj, toy, "dapo", arm, "pass@1")["ceiling"] if arm != "dapo" else None
    return {"mean": statistics.fmean(tops) if tops else None, "seeds": len(tops),
            "minus dapo": minus}


def f_pairs():
    """[arms]' base algorithms with their F: (gamma 0, gamma > 0) of one algo on seeds "base"."""
    base = {n: a for n, a in ARMS.items() if a["seeds"] == "base"}
    return [(a, b) for a in base for b in base
            if base[a]["algo"] == base[b]["algo"] and base[a]["gamma"] == 0 < base[b]["gamma"]]


def fgrpo_args(**options):
    """fgrpo's own args, as a hook gets them (every flag a hook may read), with `options` set."""
    args = fgrpo.parse_args(["--model", "tiny", "--rollout", "hf"])
    vars(args).update(options)
    return args


def prompt_weights(mus=MUS):
    """w(mu) at `mus` of every arm that reads only rewards (no sample hook of its own)."""
    out = {}
    for name, spec in ARMS.items():
        hooks = PEER_HOOKS.get(spec.get("peer"), {})
        if "sample" in hooks:
            continue
        advantages = hooks.get("advantages", fgrpo.Hooks().advantages)
        options = fgrpo_args(gamma=spec["gamma"], **{k: spec[k] for k in OPTIONS if k in spec})
        out[name] = [prompt_weight(advantages, mu, DESIGN["n"], options) for mu in mus]
    return out


def weight_curves(mus):
    """prompt_weights at `mus`, the arms whose weights agree at every mu (one advantages function,
    one gamma: DAPO's, GRPO's and CISPO's) on one curve named for all of them."""
    arms = {}
    for name, w in prompt_weights(mus).items():
        arms.setdefault(tuple(w), []).append(name)
    return {", ".join(names): list(w) for w, names in arms.items()}


def toy_mus(path=CONFIRMATION):
    """Each problem kind's mu under the base models of see_it_happen's results at `path` (its
    confirmation's seeds start as this grid's do), mean over the held-out prompts and the seeds."""
    bases = [s["base"][KEY] for s in json.loads(path.read_text())["seeds"]]
    return {kind: statistics.fmean(statistics.fmean(see.success_probs(b, kind)) for b in bases)
            for kind in see.KINDS}


def weights_figure(path, marks):
    """w(mu) of weight_curves at groups of [design]'s n over WEIGHT_MUS, on a log y axis (a
    constant factor, which AdamW's steps ignore, is a shift), a dotted line at each mu of `marks`
    ({label: mu}); written to `path` and returned, or None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="tight")
    for label, w in weight_curves(WEIGHT_MUS).items():
        ax.plot(WEIGHT_MUS, w, label=label)
    for label, mu in marks.items():
        ax.axvline(mu, color="grey", lw=0.8, ls=":")
        ax.annotate(label, (mu, 0.02), xycoords=("data", "axes fraction"), rotation=90,
                    va="bottom", ha="right", color="grey", fontsize=8)
    ax.set(yscale="log", xlim=(0, 1), xlabel="mu, the prompt's success probability",
           ylabel="w(mu) = N (E[A | correct] - E[A | wrong])",
           title=f"The prompt weight of each arm that reads only rewards, groups of {DESIGN['n']}")
    ax.legend(title="arms of the protocol", fontsize=8, title_fontsize=8)
    fig.savefig(path, dpi=120)
    return fig


def readings(traj, toy, rule):
    """A protocol's [primary] (`rule`) and the [secondary] analyses it shares with the other, over
    this run's arms: every arm minus DAPO, the top pass@1, the mechanism."""
    k = headline_k(traj, toy) if rule["metric"] == "headline" else int(rule["metric"][5:])
    others = [a for a in toy.arms if a != "dapo"]
    return {"headline_k": k, "primary": primary(traj, toy, k, rule),
            "minus_dapo": {a: gaps(traj, toy, "dapo", a, see.KS_METRICS) for a in others},
            "top_pass1": {a: top_pass1(traj, toy, a) for a in toy.arms},
            "mechanism": {base: {a: gaps(traj, toy, base, a, see.MECHANISM)
                                 for a in toy.arms if a != base}
                          for base in ("dapo", rule["comparator"])}}


def summarise(seeds, toy):
    """The protocol's reading of the runs: [primary], then every analysis of [secondary]."""
    traj = see.trajectories(seeds)
    return {**readings(traj, toy, PRIMARY),
            "f_minus_base": {f"{b} - {a}": gaps(traj, toy, a, b, see.KS_METRICS)
                             for a, b in f_pairs()},
            "prompt_weight": {"mu": list(MUS), "n": DESIGN["n"], "w": prompt_weights()}}


def base_differences(seeds, grid):
    """Per seed, the largest difference of any held-out mass between this run's base model and
    the grid's (`grid`: its results), rebuilt from the same seed."""
    masses = ("first", "last", "wrong")
    grid_bases = {s["seed"]: s["base"][KEY] for s in grid["seeds"]}
    return {s["seed"]: max(abs(a - b) for m in masses
                           for a, b in zip(s["base"][KEY][m], grid_bases[s["seed"]][m]))
            for s in seeds}


def summarise_amendment(seeds, toy, grid):
    """The amendment's reading: its [primary] and [secondary], and its base models against the
    grid's."""
    traj = see.trajectories(seeds)
    return {**readings(traj, toy, AMENDMENT["primary"]),
            "base_vs_grid": base_differences(seeds, grid)}

# ---------------------------------------------------------------- the page
def primary_markdown(summary, rule, title, about):
    """A protocol's [primary] as a table; the verdict by verdict(), the rule as amended."""
    k = summary["headline_k"]
    comparator = rule["comparator"]
    rows = [[peer, report.ci(r["gap"], 4), report.tests(r["gap"]), f"{r['p_holm']:.2g}",
             r["unmatched"], f"**{verdict(r['gap'], r['p_holm'], rule['alpha'])}**"]
            for peer, r in summary["primary"].items()]
    return [f"## {title}", "",
            f"Each peer P minus {comparator} at pass@{k}{about}, each seed's gap at matched "
            "pass@1 averaged over its levels; mean [95% t interval] over seeds; the paired t "
            f"test's p, Holm-adjusted over the {len(rows)} peers at alpha {rule['alpha']:g}.", "",
            *report.table(["P", f"P minus {comparator}", "p_t / p_Wilcoxon, seeds above 0",
                           "p_t, Holm", "seeds unmatched", "verdict"], rows), ""]


def grid_primary_markdown(summary):
    """The frozen [primary], and where its rule's text gave a verdict to no comparison."""
    lines = primary_markdown(summary, PRIMARY, "The primary endpoint",
                             " (the headline k by the rule)")
    lines += ["A seed is unmatched, and left out, where either arm has no stable run or either "
              "arm's top pass@1 is not above the base model's: the rule of the code that ran "
              "(frontiers.seed_levels); the protocol's [rules] say \"neither\".", ""]
    renamed = [p for p, r in summary["primary"].items()
               if verdict(r["gap"], r["p_holm"], PRIMARY["alpha"]) != r["verdict"]]
    if renamed:
        lines += [f"Read after the results were seen: no seed of {', '.join(renamed)} matched, so "
                  f"no comparison happened; the frozen rule's text gave \"{NONE_SHOWN}\" there, "
                  f"and this page says \"{NOT_COMPARABLE}\" ({AMENDMENT_PATH.name}'s rule).", ""]
    return lines


def every_k_markdown(title, about, by_arm):
    """Rows k, a column per comparison: the gap at matched pass@1, mean over levels."""
    names = list(by_arm)
    rows = [[k] + [report.ci(by_arm[n][f"pass@{k}"]["gap"], 4) for n in names] for k in see.KS]
    return [f"## {title}", "", about, "", *report.table(["k", *names], rows), ""]


def top_markdown(summary, title="## Top pass@1: what each arm costs pass@1"):
    rows = [[arm, "-" if r["mean"] is None else f"{r['mean']:.3f}", r["seeds"],
             report.ci(r["minus dapo"], 4)] for arm, r in summary["top_pass1"].items()]
    return [title, "",
            "The highest pass@1 of any stable run in its steps, mean over seeds; minus DAPO's, "
            "paired over the seeds both have one. Step 0, the base model, is one of the steps: "
            "an arm whose top is the base model's pass@1 never rose above it.", "",
            *report.table(["arm", "top pass@1", "seeds", "minus DAPO"], rows), ""]


def mechanism_markdown(summary):
    head = ["arm"] + [f"{m} minus {base}" for base in summary["mechanism"] for m in see.MECHANISM]
    arms = [a for a in summary["top_pass1"]
            if all(a in by for by in summary["mechanism"].values())]
    rows = [[a] + [report.ci(by[a][m]["gap"]) for by in summary["mechanism"].values()
                   for m in see.MECHANISM] for a in arms]
    return ["## The mechanism at matched pass@1", "",
            "The rare strategy's share of the correct mass and the fraction of prompts where it is "
            "lost (each arm's frontier at a level: the most share, the least lost), arm minus "
            "DAPO and minus F-DAPO, mean over levels and seeds.", "", *report.table(head, rows), ""]


def weight_markdown(summary):
    w = summary["prompt_weight"]
    rows = [[f"{mu:g}"] + [f"{w['w'][a][i]:.3g}" for a in w["w"]] for i, mu in enumerate(w["mu"])]
    return [f"## The prompt weight w(mu), groups of {w['n']}", "",
            "w(mu) = N (E[A | correct] - E[A | wrong]) of every arm that reads only rewards, "
            "computed from its advantages function (peers.prompt_weight): in expectation such an "
            "arm updates a prompt of success probability mu by w(mu) times the gradient of mu.",
            "", *report.table(["mu", *w["w"]], rows), ""]


def times_line(result, flag):
    t = result["times"]
    return (f"`python experiments/peers.py{flag}`: {t['wall_s'] / 60:.1f} min wall, "
            f"{t['cpu_s'] / 60:.1f} CPU-min this invocation; the warm starts and runs took "
            f"{t['runs_cpu_s'] / 60:.1f} CPU-min when they ran.")


def amendment_markdown(amendment, quick):
    """The amendment's [primary] and its arms' top pass@1 and gaps to DAPO."""
    summary = amendment["summary"]
    rule = AMENDMENT["primary"]
    worst = max(summary["base_vs_grid"].values())
    new = [a for a in AMENDMENT["arms"] if a not in ARMS]
    lines = [f"## The amendment: {' and '.join(new)} (added after the results were seen)", "",
             f"experiments/{AMENDMENT_PATH.name}, committed at "
             f"{amendment['protocol_commit']}, before its runs; its [why] says why. "
             + times_line(amendment, " --amendment" + " --quick" * quick) + " F-DAPO and DAPO "
             "ran again beside the new arms, from base models rebuilt on the same seeds: these "
             f"differ from the grid's by at most {worst:.3f} in any held-out mass.", ""]
    lines += primary_markdown(summary, rule, "The amendment's primary endpoint", "")
    lines += top_markdown(summary, "### The amendment's top pass@1")
    lines += every_k_markdown("The amendment's arms minus DAPO, every k", "As the grid's, "
                              "against the DAPO run beside them.",
                              {a: summary["minus_dapo"][a] for a in new})
    return lines


def arm_paths(result):
    """{arm: per seed of `result`, the arm's runs at every lr ([] on a seed it did not run)}."""
    traj = see.trajectories(result["seeds"])
    out = {}
    for arm in result["config"]["arms"]:
        names = [run_name(arm, lr) for lr in result["config"]["lrs"]]
        out[arm] = [[t[KEY][n] for n in names] if names[0] in t[KEY] else [] for t in traj]
    return out


def tradeoff_arms(grid, amendment):
    """{label: per seed, the arm's runs} of every arm of the grid, then the amendment's."""
    arms = arm_paths(grid)
    if amendment:
        arms.update({f"{a} (amendment)" if a in arms else a: paths
                     for a, paths in arm_paths(amendment).items()})
    return arms


def points(paths, k):
    return [tradeoff.arm_points(p, f"pass@{k}") for p in paths]


def fmt(x):
    return "-" if x is None else f"{x:.3f}"


def tradeoff_rows(arms, base):
    """A row an arm: where its runs ended, its pass@1 range, its best pass@k at any pass@1."""
    ks = TRADEOFF_KS
    rows = [["base model", "-", fmt(base["pass@1"]), fmt(base[f"pass@{ks[0]}"]),
             fmt(base["rare share"]), "-", "-", fmt(base[f"pass@{ks[0]}"]),
             fmt(base[f"pass@{ks[1]}"])]]
    for name, paths in arms.items():
        reach = tradeoff.summary(points(paths, ks[0]))
        rows.append([name, reach["seeds"], *(fmt(tradeoff.ended(paths, m)) for m in
                                              ("pass@1", f"pass@{ks[0]}", "rare share")),
                     fmt(reach["low"]), fmt(reach["top"]), fmt(reach["best"]),
                     fmt(tradeoff.summary(points(paths, ks[1]))["best"])])
    return rows


def tradeoff_pairs(arms):
    """The pairs the trade-off table compares: every arm against F-DAPO (the amendment's against
    its own), and DARLING against the two pass@k methods."""
    pairs = [("f_dapo", a) for a in arms if a != "f_dapo" and "amendment" not in a
             and a in ARMS]
    pairs += [("pkpo", "darling"), ("passk_training", "darling"), ("pkpo", "passk_training")]
    new = [a for a in AMENDMENT["arms"] if a not in ARMS and a in arms]
    return pairs + [(f"{base} (amendment)", a) for base in ("f_dapo", "dapo") for a in new]


def pair_rows(arms):
    rows = []
    for k in TRADEOFF_KS:
        for a, b in tradeoff_pairs(arms):
            r = tradeoff.pair(points(arms[a], k), points(arms[b], k))
            rows.append([f"{b} vs {a}", k, r["overlap"], report.ci(r["gap"]),
                         f"{r['b_at_least_a']} / {r['a_at_least_b']}",
                         f"{r['b_range_above']} / {r['a_range_above']}"])
    return rows


def base_point(arms):
    """The base model's metrics, mean over the seeds (step 0 of DAPO's first run in `arms`, the
    grid's)."""
    starts = [paths[0][0] for paths in arms["dapo"]]
    return {m: statistics.fmean(s[m] for s in starts) for m in starts[0] if m != "step"}


def tradeoff_markdown(arms, base, figure, steps):
    head = ["arm", "seeds", "ended: pass@1", f"pass@{TRADEOFF_KS[0]}", "rare share",
            "pass@1 from", "to", *(f"best pass@{k}" for k in TRADEOFF_KS)]
    return ["## pass@1 against pass@k (added after the results were seen)", "",
            f"Each arm's runs where they ended (step {steps}, the mean over its stable runs, then "
            "over seeds); the range of pass@1 its measurements visited (each seed's lowest and "
            "highest, mean over seeds); its best pass@k at any pass@1 (mean over seeds). The "
            "amendment's arms ran on rebuilt base models (above).", "",
            *report.table(head, tradeoff_rows(arms, base)), "",
            f"![each arm's frontier of pass@k against pass@1, mean and 95% t interval over seeds]"
            f"({figure})", "",
            "Pairs, B vs A: on each seed, B's frontier (its best pass@k at pass@1 at least p) "
            f"minus A's at {tradeoff.SHARED} points of the pass@1 range both visited, averaged; "
            "mean [95% t interval] over the seeds where the ranges overlap; on how many of "
            "those B's frontier is at least A's at every point, and A's at least B's; on the "
            "seeds where they do not overlap, on how many B's range lies above A's, and A's "
            "above B's.", "",
            *report.table(["B vs A", "k", "seeds overlapping", "B minus A", "B >= A / A >= B",
                           "apart: B above / A above"], pair_rows(arms)), ""]


def tradeoff_figure(path, arms, base):
    """Each arm's mean frontier of pass@k against pass@1 with its 95% t interval over seeds, a
    panel per k of TRADEOFF_KS, the base model marked; written to `path` and returned, or None
    without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(TRADEOFF_KS), figsize=(14, 5), layout="constrained")
    colors = plt.get_cmap("tab20").colors
    for ax, k in zip(axes, TRADEOFF_KS):
        for color, (name, paths) in zip(colors, arms.items()):
            curve = tradeoff.mean_frontier(points(paths, k))
            style = "--" if name not in ARMS else "-"  # the amendment's runs
            ax.plot(list(curve), [s["mean"] for s in curve.values()], style, color=color,
                    label=name)
            band = [(s["lo"], s["hi"]) for s in curve.values() if s["lo"] is not None]
            if band and len(band) == len(curve):  # no curve, or one seed: no interval
                ax.fill_between(list(curve), *zip(*band), color=color, alpha=0.15, lw=0)
        ax.plot(base["pass@1"], base[f"pass@{k}"], "k*", markersize=12, label="base model")
        ax.set(xlabel="pass@1", ylabel=f"best pass@{k} at pass@1 at least x",
               title=f"pass@{k} against pass@1, mean over seeds")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right center", fontsize=8)
    fig.savefig(path, dpi=110)
    return fig


def markdown(result, amendment=None, figure="peers_tradeoff.png"):
    """The page: the grid's [primary], the amendment's, the trade-off, then the grid's
    [secondary]."""
    summary = result["summary"]
    quick = result["config"]["quick"]
    sets = {name: f"{seeds[0]}-{seeds[-1]}" for name, seeds in result["seed_sets"].items()}
    lines = [f"# F-GRPO among its peers: {KEY}, seeds {sets['all']} (GRPO, CISPO: "
             f"{sets['base']})", "", f"The protocol, experiments/{PROTOCOL_PATH.name}, was "
             f"committed at {result['protocol_commit']}. "
             + times_line(result, " --quick" * quick), ""]
    lines += grid_primary_markdown(summary)
    if amendment:
        lines += amendment_markdown(amendment, quick)
    arms = tradeoff_arms(result, amendment)
    lines += tradeoff_markdown(arms, base_point(arms), figure, result["config"]["steps"])
    lines += every_k_markdown("Every arm minus DAPO, every k", "At matched pass@1 on the seeds "
                              "both ran, mean over levels [95% t interval] over seeds.",
                              summary["minus_dapo"])
    lines += top_markdown(summary) + mechanism_markdown(summary)
    lines += every_k_markdown("F minus base for GRPO and CISPO, every k", f"Seeds {sets['base']}; "
                              "as above.", summary["f_minus_base"])
    return "\n".join(lines + weight_markdown(summary)) + "\n"

# ---------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "peers", help="warm starts and "
                   "finished arms: a rerun reuses those finished with the same settings")
    p.add_argument("--out", type=Path, help="results folder (peers.json, peers.md); default "
                   "experiments/results, or WORK/results with --quick")
    p.add_argument("--workers", type=int, default=2, help="processes, one seed each at a time")
    p.add_argument("--quick", action="store_true", help="miniature: see_it_happen's --quick "
                   f"sizes, seeds {QUICK_SEEDS} of each set; WORK is WORK_quick")
    p.add_argument("--plan", action="store_true", help="print the grid and its budget, run nothing")
    p.add_argument("--weights-figure", type=Path, metavar="PATH", help="draw w(mu) of the arms "
                   "that read only rewards to PATH (a PNG), run nothing")
    p.add_argument("--amendment", action="store_true", help="run the arms of "
                   f"{AMENDMENT_PATH.name} (after the grid: OUT's peers.json must exist)")
    p.add_argument("--report", action="store_true", help="write OUT's peers.md and the trade-off "
                   "figure again from its JSON results, run nothing")
    args = p.parse_args(argv)
    if args.quick:
        args.work = args.work.with_name(args.work.name + "_quick")
    args.out = args.out or (args.work / "results" if args.quick else ROOT / "experiments" /
                            "results")
    results = (ROOT / "experiments" / "results").resolve()
    if args.quick and args.out.resolve().is_relative_to(results):
        p.error("--quick writes under its own --out, never into experiments/results")
    return args


def main(argv=None):
    args = parse_args(argv)
    check_protocol()
    toy = toy_args(args)
    if args.plan:
        print("\n".join(plan(toy)[0]))
        return None
    if args.weights_figure:
        marks = {f'"{kind}" problems, base model': mu for kind, mu in toy_mus().items()}
        if weights_figure(args.weights_figure, marks) is not None:
            print(f"figure: {args.weights_figure}", flush=True)
        return None
    if not args.report:
        result = run(args, toy)
    write_page(args.out, args.quick)
    return None if args.report else result


def result_paths(out, quick):
    """The grid's results and the amendment's in `out` (--quick: their miniatures)."""
    tail = "_quick" * quick
    return out / f"peers{tail}.json", out / f"peers_amendment{tail}.json"


def run(args, toy):
    """This run's arms on their seeds, its reading, its results file; returns the results."""
    grid_path, amendment_path = result_paths(args.out, args.quick)
    if args.amendment and not grid_path.exists():
        sys.exit(f"--amendment: {grid_path} is missing; the amendment reads the grid's results")
    t0 = time.time()
    cpu = os.times()
    heldout = see.heldout_set(toy.heldout)
    toy.work.mkdir(parents=True, exist_ok=True)
    seeds = see.run_jobs(toy, heldout, job=run_seed)
    if args.amendment:
        summary = summarise_amendment(seeds, toy, json.loads(grid_path.read_text()))
    else:
        summary = summarise(seeds, toy)
    now = os.times()
    runs = [r for s in seeds for r in [*s["base"].values(), *s["arms"][KEY].values()]]
    times = {"wall_s": time.time() - t0, "cpu_s": sum(now[i] - cpu[i] for i in range(4)),
             "runs_cpu_s": sum(r.get("cpu_s", 0) for r in runs), "load": os.getloadavg()[0]}
    config = {"quick": args.quick, "workers": args.workers, "lrs": toy.lrs, "steps": toy.steps,
              "levels": toy.levels, "arms": toy.arms}
    protocol = AMENDMENT_PATH if args.amendment else PROTOCOL_PATH
    result = {"config": config, "seed_sets": toy.seed_sets, "heldout": heldout, "seeds": seeds,
              "summary": summary, "times": times, "protocol_commit": report.committed(protocol)}
    path = amendment_path if args.amendment else grid_path
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    print(f"results: {path}", flush=True)
    return result


def write_page(out, quick):
    """OUT/peers.md (--quick: peers_quick.md) from the grid's results and the amendment's, where
    they are there."""
    grid_path, amendment_path = result_paths(out, quick)
    grid = json.loads(grid_path.read_text())
    amendment = json.loads(amendment_path.read_text()) if amendment_path.exists() else None
    page = grid_path.with_suffix(".md")
    figure = page.with_name(page.stem + "_tradeoff.png")
    report.write(page, markdown(grid, amendment, figure.name))  # keeps a reading by hand above
    arms = tradeoff_arms(grid, amendment)
    if tradeoff_figure(figure, arms, base_point(arms)) is not None:
        print(f"figure: {figure}", flush=True)
    print(f"page: {page}", flush=True)


if __name__ == "__main__":
    main()
