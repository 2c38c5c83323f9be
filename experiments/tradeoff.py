"""pass@1 against pass@k: each arm's upper frontier over all its stable runs and measured steps,
the seed the unit. Where the matched-pass@1 design (frontiers.py) asks "at the same pass@1, which
arm keeps more pass@k?", and so cannot place an arm whose pass@1 never rises above the base
model's, this asks what each arm reached at all, and compares two arms only where both went.

A seed's frontier of an arm at a pass@1 p is the best pass@k of any of its points (every stable
run, every measured step after the start) with pass@1 at least p: defined for p up to the arm's
top pass@1 on that seed. An arm's pass@1 range on a seed runs from the lowest pass@1 any of those
points has to the highest. Two arms are compared on a seed over the range both visited (SHARED
points, evenly spaced, ends included); a seed where the ranges do not overlap says which arm's
range lies above the other's instead.
"""
import statistics

from frontiers import broke_down
from paired import paired_summary

SHARED = 11  # points of a seed's shared pass@1 range that a pair is compared at
GRID = [i / 200 for i in range(201)]  # the figure's pass@1 axis: 0, 0.005, ..., 1


def arm_points(paths, metric):
    """(pass@1, metric) of every measured step after the start (the base model) of the stable
    paths."""
    return [(p["pass@1"], p[metric]) for path in paths if not broke_down(path) for p in path[1:]]


def ended(paths_by_seed, metric):
    """Where an arm's runs ended: each seed's mean of `metric` at the last step of its stable
    runs, then the mean over the seeds that have one."""
    means = []
    for paths in paths_by_seed:
        stable = [path[-1][metric] for path in paths if not broke_down(path)]
        if stable:
            means.append(statistics.fmean(stable))
    return statistics.fmean(means) if means else None


def frontier(points, p):
    """The best value of the points whose pass@1 is at least p; None if none is."""
    values = [v for x, v in points if x >= p]
    return max(values) if values else None


def reach(points):
    """(lowest, highest) pass@1 of the points; None without points."""
    if not points:
        return None
    xs = [x for x, _ in points]
    return min(xs), max(xs)


def shared_levels(a, b):
    """SHARED evenly spaced pass@1 values over the range both point sets visited; [] if they do
    not overlap."""
    lo = max(reach(a)[0], reach(b)[0])
    hi = min(reach(a)[1], reach(b)[1])
    if hi < lo:
        return []
    return [lo + (hi - lo) * i / (SHARED - 1) for i in range(SHARED - 1)] + [hi]  # hi exactly


def pair(points_a, points_b):
    """B against A over seeds (each a list of per-seed point sets, in the same seed order): on the
    seeds where their ranges overlap, B's frontier minus A's averaged over the shared levels
    (paired over seeds) and on how many seeds B's is at least A's at every shared level, or A's at
    least B's; on the others, on how many B's range lies above A's."""
    gaps, b_above, a_above, b_higher, a_higher = [], 0, 0, 0, 0
    for a, b in zip(points_a, points_b):
        if not a or not b:
            continue
        levels = shared_levels(a, b)
        if not levels:
            b_higher += reach(b)[0] > reach(a)[1]
            a_higher += reach(a)[0] > reach(b)[1]
            continue
        diffs = [frontier(b, p) - frontier(a, p) for p in levels]
        gaps.append(statistics.fmean(diffs))
        b_above += all(d >= 0 for d in diffs)
        a_above += all(d <= 0 for d in diffs)
    return {"gap": paired_summary(gaps) if gaps else None, "overlap": len(gaps),
            "b_at_least_a": b_above, "a_at_least_b": a_above,
            "b_range_above": b_higher, "a_range_above": a_higher}


def mean_frontier(points_by_seed):
    """{pass@1: the frontier's mean over seeds with its 95% t interval (paired.paired_summary)} on
    GRID, from the lowest pass@1 any seed visited up to the lowest of the seeds' top pass@1 (where
    every seed has a frontier)."""
    seeds = [pts for pts in points_by_seed if pts]
    if not seeds:
        return {}
    lo = min(reach(pts)[0] for pts in seeds)
    hi = min(reach(pts)[1] for pts in seeds)
    return {p: paired_summary([frontier(pts, p) for pts in seeds]) for p in GRID if lo <= p <= hi}


def summary(points_by_seed):
    """An arm's reach over seeds: mean lowest and highest pass@1, and the mean of each seed's best
    value at any pass@1."""
    seeds = [pts for pts in points_by_seed if pts]
    return {"seeds": len(seeds),
            "low": statistics.fmean(reach(pts)[0] for pts in seeds) if seeds else None,
            "top": statistics.fmean(reach(pts)[1] for pts in seeds) if seeds else None,
            "best": statistics.fmean(max(v for _, v in pts) for pts in seeds) if seeds else None}
