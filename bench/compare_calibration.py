"""How often eval.py --compare says p < 0.05 when A and B are equally good, and when B is better.

    python bench/compare_calibration.py           # n = 1024, m = 128 to 768, 30 problems (75 s)
    python bench/compare_calibration.py --repeats 200 --ms 256   # a quick look at the paper's m

Each repeat draws two result folders: every problem's correct count Binomial(n, rate), for A and
for B, and runs --compare's own subsample_deltas and two_sided_p on them (as eval.py's compare
does, --iters draws). Under the null (B's rates = A's) a calibrated two-sided test says p < alpha
in a share alpha of the repeats; with B's odds of a right answer --odds times A's, the share is
its power. Beside each measured share stands the normal theory's: per problem and model, the
pass@k estimate from n samples has variance V_n (exact, from the binomial), the m-of-n subsample
given the data adds V_m - V_n on average (law of total variance), so p < alpha when
|delta| > z * sqrt(sum (V_m - V_n) / sum V_n) * sd(delta); at k = 1 that factor is sqrt(n/m - 1):
above 1 (conservative) for m < n/2, 1 at m = n/2, below 1 for m > n/2. Also the power of a
calibrated alpha-level test (the factor 1). The table is printed and written to --out.
"""
import argparse
import functools
import json
import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
from tqdm import tqdm

from common import ROOT  # noqa: F401  (puts the repository root, where eval.py lives, on sys.path)
import eval as evaluator
import fgrpo


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--n", type=int, default=1024, help="samples per problem (the paper's 1024)")
    a("--ms", default="128,256,512,768", help="comma-separated m of --compare (the paper's 256)")
    a("--power-m", type=int, default=256, help="the m at which the power is measured")
    a("--problems", type=int, default=30, help="problems per folder (AIME's 30)")
    a("--low", type=float, default=5e-4, help="the hardest problem's rate; the rest geometric")
    a("--high", type=float, default=0.9, help="the easiest problem's rate")
    a("--odds", type=float, default=1.1, help="B's odds of a right answer over A's, for power")
    a("--repeats", type=int, default=1000, help="pairs of folders drawn per setting")
    a("--iters", type=int, default=1000, help="--compare's --iters in each repeat")
    a("--alpha", type=float, default=0.05, help="two-sided level")
    a("--seed", type=int, default=0, help="seed of the folders and of the subsampling")
    a("--out", default=str(Path(__file__).with_name("compare_calibration.json")), help="JSON")
    return p


def estimate_moments(n, rates, ks):
    """(P, K) mean and variance of the unbiased pass@k from n samples (App. P) at each rate:
    exact sums over the Binomial(n, rate) count c, from log-gammas (not from fgrpo)."""
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


def theory(n, m, rates_a, rates_b, ks, alpha, iters):
    """Per k: delta's sd, the normal theory's share of p < alpha, and a calibrated test's. The
    add-one smoothing of p = 2 (fewer + 1) / (iters + 1) makes p < alpha a tail share below
    (alpha (iters + 1) / 2 - 1) / iters (Monte Carlo noise left out)."""
    mean_a, var_na = estimate_moments(n, rates_a, ks)
    mean_b, var_nb = estimate_moments(n, rates_b, ks)
    var_m = estimate_moments(m, rates_a, ks)[1] + estimate_moments(m, rates_b, ks)[1]
    var_n = var_na + var_nb
    big_delta = (mean_b - mean_a).mean(0)
    sigma = np.sqrt(var_n.sum(0)) / len(rates_a)
    factor = np.sqrt(np.maximum(var_m.sum(0) / np.maximum(var_n.sum(0), 1e-300) - 1, 0))
    z = NormalDist().inv_cdf(1 - alpha / 2)
    phi = NormalDist().cdf
    shift = big_delta / np.maximum(sigma, 1e-300)
    smoothed = NormalDist().inv_cdf(1 - (alpha * (iters + 1) / 2 - 1) / iters)
    share = [phi(s - smoothed * f) + phi(-s - smoothed * f) for s, f in zip(shift, factor)]
    calibrated = [phi(s - z) + phi(-s - z) for s in shift]
    return {"delta": big_delta.tolist(), "sd_delta": sigma.tolist(), "spread_factor":
            factor.tolist(), "predicted": share, "calibrated_test": calibrated}


def measure(n, m, rates_a, rates_b, args, rng):
    """Per k of --compare's curve: the share of repeats with p < alpha, and its Wilson 95%."""
    ks = evaluator.powers_of_two(m)
    samples = np.full(len(rates_a), n)
    below = np.zeros(len(ks))
    for _ in tqdm(range(args.repeats), desc=f"m={m}", leave=False):
        a = (samples, rng.binomial(n, rates_a))
        b = (samples, rng.binomial(n, rates_b))
        deltas = evaluator.subsample_deltas(a, b, m, ks, args.iters, rng)
        below += evaluator.two_sided_p(deltas) < args.alpha
    share = below / args.repeats
    z = NormalDist().inv_cdf(0.975)
    centre = (share + z * z / (2 * args.repeats)) / (1 + z * z / args.repeats)
    half = z * np.sqrt(share * (1 - share) / args.repeats + z * z / (4 * args.repeats ** 2))
    half /= 1 + z * z / args.repeats
    return {"k": ks, "measured": share.tolist(),
            "wilson95": np.stack([centre - half, centre + half], 1).round(5).tolist()}


def row(label, m, result):
    cells = [f"{x:.1%} ({p:.2%}, {c:.0%})" for x, p, c in
             zip(result["measured"], result["predicted"], result["calibrated_test"])]
    return f"| {label} | {m} | " + " | ".join(f"k={k}: {cell}" for k, cell in
                                             zip(result["k"], cells)) + " |"


def main():
    args = build_parser().parse_args()
    # the table of pass@k(m, j, k) that subsample_deltas builds: the same values, computed once
    fgrpo.pass_at_k = functools.lru_cache(maxsize=None)(fgrpo.pass_at_k)
    rates = np.geomspace(args.low, args.high, args.problems)
    odds = args.odds * rates / (1 - rates)
    better = odds / (1 + odds)
    rng = np.random.default_rng(args.seed)
    settings = [("null", m, rates) for m in map(int, args.ms.split(","))]
    settings.append(("power", args.power_m, better))
    results = []
    print("share of p < alpha: measured (normal theory, a calibrated test's)")
    for label, m, rates_b in settings:
        got = measure(args.n, m, rates, rates_b, args, rng)
        got.update(theory(args.n, m, rates, rates_b, got["k"], args.alpha, args.iters))
        results.append({"setting": label, "m": m, **got})
        print(row(label, m, got), flush=True)
    saved = {"settings": vars(args), "rates_a": rates.tolist(), "rates_b_power": better.tolist(),
             "results": results}
    Path(args.out).write_text(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
