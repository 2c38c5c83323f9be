"""Paired statistics over seeds, the unit of an experiment: mean difference, 95% t interval,
paired t test and the exact Wilcoxon signed-rank test. Standard library only.

    from paired import paired_summary
    paired_summary([0.02, 0.01, 0.03])  # {"n", "mean", "lo", "hi", "p_t", "p_wilcoxon", "positive"}
"""
import functools
import math
import statistics


def t_density(u, df):
    """Student's t density with df degrees of freedom."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(u * u / df))


def t_cdf(t, df, intervals=4000):
    """P(T <= t), by Simpson's rule on the density from 0 to |t| (error far below 1e-8 here)."""
    x = min(abs(t), 1e3)
    h = x / intervals
    weights = [1] + [4 if i % 2 else 2 for i in range(1, intervals)] + [1]
    area = h / 3 * sum(w * t_density(i * h, df) for i, w in enumerate(weights))
    return 0.5 + math.copysign(area, t)


@functools.lru_cache(maxsize=None)  # one bisection per (q, df): a summary asks for few
def t_quantile(q, df):
    """The q-quantile of Student's t (0.5 < q < 1), by bisection on t_cdf."""
    lo, hi = 0.0, 1e3
    for _ in range(60):
        mid = (lo + hi) / 2
        if t_cdf(mid, df, 2000) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def wilcoxon_p(diffs):
    """Exact two-sided p of the Wilcoxon signed-rank test: zeros dropped, tied |d| get average
    ranks, the null distribution of W+ counted over all 2^n sign patterns by dynamic programming."""
    d = [x for x in diffs if x != 0]
    if not d:
        return 1.0
    order = sorted(range(len(d)), key=lambda i: abs(d[i]))
    doubled = [0] * len(d)  # twice the average rank, an integer
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            doubled[order[k]] = i + j + 2
        i = j + 1
    counts = {0: 1}  # number of sign patterns per doubled W+
    for r in doubled:
        step = dict(counts)
        for w, c in counts.items():
            step[w + r] = step.get(w + r, 0) + c
        counts = step
    w_plus = sum(r for r, x in zip(doubled, d) if x > 0)
    total = 2 ** len(d)
    low = sum(c for w, c in counts.items() if w <= w_plus) / total
    high = sum(c for w, c in counts.items() if w >= w_plus) / total
    return min(1.0, 2 * min(low, high))


def paired_summary(diffs, level=0.95):
    """Per-seed differences -> mean, t interval (lo, hi), paired t p, Wilcoxon p, seeds above 0."""
    n = len(diffs)
    mean = statistics.fmean(diffs)
    out = {"n": n, "mean": mean, "lo": None, "hi": None, "p_t": None,
           "p_wilcoxon": wilcoxon_p(diffs), "positive": sum(x > 0 for x in diffs)}
    if n < 2:
        return out
    se = statistics.stdev(diffs) / math.sqrt(n)
    half = t_quantile(0.5 + level / 2, n - 1) * se
    out.update(lo=mean - half, hi=mean + half)
    if se == 0:
        out["p_t"] = 1.0 if mean == 0 else 0.0
    else:
        out["p_t"] = 2 * (1 - t_cdf(abs(mean / se), n - 1))
    return out
