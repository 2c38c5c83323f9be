"""How often eval.py --compare says p < 0.05 when A and B are equally good, and when B is better:
its default test (the permutation test) and the paper's (--test subsampling, m = n/4).

    python checks/compare_calibration.py                 # n 16, 64, 256, 1024; both tests
    python checks/compare_calibration.py --ns 1024 --repeats 200   # a quick look at the paper's n

Each repeat draws two result folders: every problem's correct count Binomial(n, rate), for A and
for B, and runs --compare's own steps on them (eval.py's pass_at_k_table, subsample_size,
redrawn_deltas and two_sided_p, as compare does; --iters redraws). Under the null (B's rates =
A's) a calibrated two-sided test says p < alpha in a share alpha of the repeats; with B's odds of
a right answer --odds ** sqrt(1024 / n) times A's (1.1 at n 1024, 2.14 at n 16: about the same
number of standard deviations of delta at k = 1 at every n), the share is its power. Each share
comes with its Wilson 95% interval, and each null row with the 95% band of Binomial(repeats,
level) that a calibrated test's count falls in (level: P(p < alpha) of an exact test with
--iters redraws, (iters + 1) alpha rounded up, over iters + 1). Beside them the normal theory:
per problem and model, pass@k from n samples has variance V_n (exact, from the binomial); the
subsampling test's delta* spreads sqrt(sum (V_m - V_n) / sum V_n) times as wide as delta (at
k = 1 sqrt(n/m - 1)), the permutation test's as wide: the theory's share of p < alpha of each,
and of a calibrated z-test; and for the permutation test at k = 1 its exact level (no Monte Carlo:
exact_level_k1). The table is printed and written to --out.
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path
from statistics import NormalDist

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # eval.py lives there
import eval as evaluator  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--ns", default="16,64,256,1024", help="comma-separated samples per problem")
    a("--tests", default="permutation,subsampling", help="eval.py's --test values, m = n/4")
    a("--problems", type=int, default=30, help="problems per folder (AIME's 30)")
    a("--low", type=float, default=5e-4, help="the hardest problem's rate; the rest geometric")
    a("--high", type=float, default=0.9, help="the easiest problem's rate")
    a("--odds", type=float, default=1.1, help="B's odds over A's at n 1024, for power")
    a("--repeats", type=int, default=1000, help="pairs of folders drawn per setting")
    a("--iters", type=int, default=1000, help="--compare's --iters in each repeat")
    a("--alpha", type=float, default=0.05, help="two-sided level")
    a("--seed", type=int, default=0, help="seed of the folders and of the redraws")
    a("--exact-draws", type=int, default=200, help="null draws behind each exact k = 1 level")
    a("--out", default=str(Path(__file__).with_name("compare_calibration.json")), help="JSON")
    return p


def estimate_moments(n, rates, ks):
    """(P, K) mean and variance of the unbiased pass@k from n samples (App. P) at each rate:
    exact sums over the Binomial(n, rate) count c, from log-gammas (not from eval.py)."""
    lg = np.array([math.lgamma(x + 1) for x in range(n + 1)])
    c = np.arange(n + 1)
    values = np.ones((n + 1, len(ks)))  # 1 - C(n-c, k) / C(n, k); 1 where n - c < k
    for j, k in enumerate(ks):
        some = n - c >= k
        log_ratio = (lg[n - c[some]] - lg[k] - lg[n - c[some] - k]) - (lg[n] - lg[k] - lg[n - k])
        values[some, j] = 1 - np.exp(log_ratio)
    r = np.clip(rates, 1e-300, 1 - 1e-16)[:, None]
    pmf = np.exp(lg[n] - lg[c] - lg[n - c] + c * np.log(r) + (n - c) * np.log1p(-r))
    mean = pmf @ values
    return mean, pmf @ values ** 2 - mean ** 2


def theory(n, m, rates_a, rates_b, ks, alpha):
    """Per k: delta's sd (over the binomial draws), the factor by which delta* spreads wider than
    delta, and the normal theory's share of p < alpha of that test and of a calibrated z-test."""
    mean_a, var_na = estimate_moments(n, rates_a, ks)
    mean_b, var_nb = estimate_moments(n, rates_b, ks)
    var_n = (var_na + var_nb).sum(0)
    factor = np.ones(len(ks))
    if m:  # the m-of-n subsample adds V_m - V_n on average (law of total variance)
        var_m = (estimate_moments(m, rates_a, ks)[1] + estimate_moments(m, rates_b, ks)[1]).sum(0)
        factor = np.sqrt(np.maximum(var_m / np.maximum(var_n, 1e-300) - 1, 0))
    big_delta = (mean_b - mean_a).mean(0)
    sigma = np.sqrt(var_n) / len(rates_a)
    shift = big_delta / np.maximum(sigma, 1e-300)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    phi = NormalDist().cdf
    return {"delta": big_delta.tolist(), "sd_delta": sigma.tolist(), "spread_factor":
            factor.tolist(), "predicted": [phi(s - z * f) + phi(-s - z * f)
                                           for s, f in zip(shift, factor)],
            "calibrated_test": [phi(s - z) + phi(-s - z) for s in shift]}


def exact_level_k1(n, rates, alpha, draws, rng):
    """The permutation test's level at k = 1 without Monte Carlo noise: given each problem's
    pooled right samples t, A's right ones are Hypergeometric(2n, t, n) (scipy's pmf), their sum
    S by convolution, |delta| = |sum t - 2 S| / (n P), and p(S) = P(|delta*| >= |delta(S)|);
    P(p < alpha) averaged over `draws` null draws of t. delta is on a lattice: ties hold it a
    little below alpha, more so where few samples are right."""
    from scipy.stats import hypergeom
    levels = []
    for _ in range(draws):
        t = rng.binomial(n, rates) + rng.binomial(n, rates)
        pmf = np.array([1.0])
        offset = 0  # the smallest S of the support
        for pooled in t:
            low = max(0, pooled - n)
            offset += low
            support = np.arange(low, min(pooled, n) + 1)
            pmf = np.convolve(pmf, hypergeom.pmf(support, 2 * n, pooled, n))
        distance = np.abs(t.sum() - 2 * (offset + np.arange(len(pmf))))
        values, which = np.unique(distance, return_inverse=True)
        at_least = np.cumsum(np.bincount(which, pmf)[::-1])[::-1]  # P(|X*| >= each value)
        levels.append(pmf[at_least[which] < alpha].sum())
    return float(np.mean(levels))


def wilson(share, repeats, z=NormalDist().inv_cdf(0.975)):
    """The Wilson 95% interval of a share measured over `repeats` (arrays)."""
    shrink = 1 + z * z / repeats
    centre = (share + z * z / (2 * repeats)) / shrink
    half = z * np.sqrt(share * (1 - share) / repeats + z * z / (4 * repeats ** 2)) / shrink
    return np.stack([centre - half, centre + half], 1)


def calibrated_band(repeats, level, inside=0.95):
    """The counts of Binomial(repeats, level) but for 1 - inside of its mass, half each side."""
    pmf = [math.exp(math.lgamma(repeats + 1) - math.lgamma(x + 1) - math.lgamma(repeats - x + 1)
                    + x * math.log(level) + (repeats - x) * math.log1p(-level))
           for x in range(repeats + 1)]
    cdf = np.cumsum(pmf)
    tail = (1 - inside) / 2
    return [int(np.searchsorted(cdf, tail)), int(np.searchsorted(cdf, 1 - tail))]


def measure(n, test, rates_a, rates_b, args, rng):
    """Per k of --compare's curve: the share of repeats with p < alpha, and its Wilson 95%."""
    compare_args = evaluator.build_parser().parse_args(
        ["--compare", "a", "b", "--test", test, "--iters", str(args.iters)])
    m = evaluator.subsample_size(compare_args, n)  # n/4 for subsampling; None: permutation
    ks = evaluator.powers_of_two(m or n)
    table = evaluator.pass_at_k_table(n, tuple(ks))
    below = np.zeros(len(ks))
    for _ in tqdm(range(args.repeats), desc=f"n={n} {test}", leave=False):
        pair = [(n, rng.binomial(n, rates)) for rates in (rates_a, rates_b)]
        delta = table[pair[1][1]].mean(0) - table[pair[0][1]].mean(0)  # as compare computes it
        draws = evaluator.redrawn_deltas(*pair, ks, args.iters, rng, m)
        below += evaluator.two_sided_p(delta, draws, test) < args.alpha
    share = below / args.repeats
    return m, {"k": ks, "measured": share.tolist(),
               "wilson95": wilson(share, args.repeats).round(5).tolist()}


def row(result):
    cells = [f"k={k}: {x:.1%} ({p:.1%}, {c:.0%})" for k, x, p, c in
             zip(result["k"], result["measured"], result["predicted"], result["calibrated_test"])]
    band = result.get("calibrated_band95")
    exact = result.get("exact_level_k1")
    return (f"| {result['n']} | {result['test']} | {result['m'] or '-'} | {result['setting']}"
            f"{f' (band {band[0]}-{band[1]})' if band else ''}"
            f"{f', exact k=1 level {exact:.2%}' if exact else ''} | " + " | ".join(cells) + " |")


def main():
    args = build_parser().parse_args()
    rates = np.geomspace(args.low, args.high, args.problems)
    rng = np.random.default_rng(args.seed)
    # an exact test with --iters redraws: p = (x + 1) / (iters + 1) < alpha for x + 1 below
    # alpha (iters + 1), so P(p < alpha) = ceil(alpha (iters + 1) - 1) / (iters + 1)
    level = math.ceil(args.alpha * (args.iters + 1) - 1) / (args.iters + 1)
    results = []
    start = time.time()
    print("share of p < alpha: measured (normal theory, a calibrated z-test's)")
    for n in map(int, args.ns.split(",")):
        odds = args.odds ** math.sqrt(1024 / n) * rates / (1 - rates)
        for test in args.tests.split(","):
            for setting, rates_b in (("null", rates), ("power", odds / (1 + odds))):
                m, got = measure(n, test, rates, rates_b, args, rng)
                got = {"n": n, "test": test, "m": m, "setting": setting, **got,
                       **theory(n, m, rates, rates_b, got["k"], args.alpha)}
                if setting == "null":
                    got["calibrated_band95"] = calibrated_band(args.repeats, level)
                if setting == "null" and test == "permutation":
                    got["exact_level_k1"] = exact_level_k1(n, rates, args.alpha,
                                                           args.exact_draws, rng)
                results.append(got)
                print(row(got), flush=True)
    seconds = round(time.time() - start)
    print(f"{seconds} s")
    saved = {"settings": {**vars(args), "out": Path(args.out).name}, "exact_level": level,
             "seconds": seconds, "rates_a": rates.tolist(), "results": results}
    Path(args.out).write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
