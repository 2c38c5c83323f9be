"""Matched-pass@1 frontiers, compared over seeds: the analysis that experiments/see_it_happen.py
and experiments/two_strategy.py share. A run is a path, its metrics at each measurement; a run
breaks down (broke_down) by see_it_happen_protocol.toml's rule; an arm's frontier at a pass@1
level is the best value any of its stable runs has where it crosses the level (frontier_at)."""
import statistics
import tomllib
from pathlib import Path

from paired import paired_summary

BROKEN = tomllib.loads(Path(__file__).with_name("see_it_happen_protocol.toml").read_text())[
    "rules"]["broken"]  # a run has broken down once the answer space holds less of the mass
LOWER_IS_BETTER = {"rare lost"}


def mix_of(key):
    """A condition, "START/MIX" (or a bare mix: experiments/two_strategy.py), -> its mix."""
    return key.rsplit("/", 1)[-1]


def broke_down(path):
    return min(p["listed"] for p in path) < BROKEN


def frontier_at(paths, t, metric):
    """The best `metric` (the most; the least for LOWER_IS_BETTER) of any of the paths where it
    crosses pass@1 = t (linear between measurements); None if none reaches t."""
    values = []
    for path in paths:
        for a, b in zip(path, path[1:]):
            x0, x1 = a["pass@1"], b["pass@1"]
            if x0 == x1 == t:
                values += [a[metric], b[metric]]
            elif min(x0, x1) <= t <= max(x0, x1) and x0 != x1:
                values.append(a[metric] + (b[metric] - a[metric]) * (t - x0) / (x1 - x0))
    if not values:
        return None
    return min(values) if metric in LOWER_IS_BETTER else max(values)


def ceiling(paths):
    """The highest pass@1 of any measurement of any of the paths."""
    return max(p["pass@1"] for path in paths for p in path)


def seed_levels(groups, count):
    """One seed's matched pass@1 levels: 1/count, 2/count, ..., 1 of the way from its base model's
    pass@1 (every path's first point) to the top, the lowest ceiling of the groups of paths; [] if
    a group is empty or none is above the base. The base point itself is not a level."""
    if not all(groups):
        return []
    lo, hi = groups[0][0][0]["pass@1"], min(ceiling(g) for g in groups)
    if hi <= lo:
        return []
    return [lo + (hi - lo) * i / count for i in range(1, count)] + [hi]


def compare(traj, key, base_arms, arms, args, metric, also=()):
    """F (arms) against its base (base_arms), each seed on its own matched range (with the arm
    lists `also`: the range all of them reach) and on its stable runs: `metric`'s gap at each
    level and averaged over the levels, the medians over seeds of both frontiers per level, and
    the ceilings; paired over the seeds."""
    levels, gaps, values, tops = [], [], [], []
    for t in traj:
        a, b = ([p for p in (t[key][n] for n in names) if not broke_down(p)]
                for names in (base_arms, arms))
        others = [[p for p in (t[key][n] for n in names) if not broke_down(p)] for names in also]
        levels.append(seed_levels([a, b, *others], args.levels))
        values.append([(frontier_at(a, x, metric), frontier_at(b, x, metric)) for x in levels[-1]])
        gaps.append([fb - fa for fa, fb in values[-1]])
        tops.append((ceiling(a) if a else None, ceiling(b) if b else None))
    matched = [i for i, lv in enumerate(levels) if lv]
    both = [b - a for a, b in tops if None not in (a, b)]  # seeds where both have a stable run
    out = {"levels": levels, "gaps_by_level": gaps, "unmatched": len(traj) - len(matched),
           "ceiling": paired_summary(both) if both else None,
           "ceilings": [statistics.fmean(x) for x in zip(*[t for t in tops if None not in t])],
           "level_pass@1": [], "by_level": [], "medians_by_level": [], "gaps": [], "gap": None}
    if matched:
        out["level_pass@1"] = [statistics.fmean(levels[i][j] for i in matched)
                               for j in range(args.levels)]
        out["by_level"] = [paired_summary([gaps[i][j] for i in matched])
                           for j in range(args.levels)]
        out["medians_by_level"] = [[statistics.median(values[i][j][side] for i in matched)
                                    for side in (0, 1)] for j in range(args.levels)]
        out["gaps"] = [statistics.fmean(gaps[i]) for i in matched]
        out["gap"] = paired_summary(out["gaps"])
    return out


FINAL_KEYS = ("pass@1", "pass@{k}", "rare pass@{k}", "rare mass", "M_ret")


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


def frontier_lrs(traj, key, names, levels, metric):
    """Which lr makes an arm's frontier of `metric` (the more the better): the seed-levels at
    which each lr's run is the best, and the lowest lr's margin, the mean over seed-levels of the
    frontier minus the best of the other lrs (what a still lower lr might add)."""
    counts = {n: 0 for n in names}
    margins = []
    for t, seed_levels_ in zip(traj, levels):
        stable = [n for n in names if not broke_down(t[key][n])]
        for x in seed_levels_:
            values = {n: frontier_at([t[key][n]], x, metric) for n in stable}
            values = {n: v for n, v in values.items() if v is not None}
            best = max(values, key=values.get)
            counts[best] += 1
            others = [v for n, v in values.items() if n != names[0]]
            if others:
                margins.append(values[best] - max(others))
    return {"counts": counts, "lowest_margin": statistics.fmean(margins) if margins else None}


def gain_difference(traj, key, groups, args, metric):
    """F's gain at N (groups[1] over groups[0]) minus its gain with the exact update (groups[3]
    over groups[2]), each seed over the same levels, the range all four arms reach; None where a
    seed has none."""
    at_n = compare(traj, key, *groups[:2], args, metric, also=groups[2:])
    at_exact = compare(traj, key, *groups[2:], args, metric, also=groups[:2])
    if not at_n["gaps"] or at_n["unmatched"]:
        return None
    return paired_summary([a - b for a, b in zip(at_n["gaps"], at_exact["gaps"])])


def median_path(paths, keys):
    """The step-by-step median over seeds of trajectories measured at the same steps (a run that
    breaks down in one seed does not drag the line)."""
    return [[statistics.median(p[i][key] for p in paths) for i in range(len(paths[0]))]
            for key in keys]


# ---------------------------------------------------------------- arms by name, their lrs
def arm_name(algo, gamma, lr, n):
    return f"{algo}_g{gamma:g}_lr{lr:g}_" + ("exact" if n == "exact" else f"n{n}")


def sweep(args, gamma, n, lrs=None):
    """An arm's runs at every lr of --lrs (or of `lrs`), by name."""
    return [arm_name(args.algo, gamma, lr, n) for lr in lrs or args.lrs]


def sweep_of(args, key, lrs=None):
    """sweep() of an arm named "GAMMA/N" (N a group size or "exact")."""
    gamma, n = key.split("/")
    return sweep(args, float(gamma), n if n == "exact" else int(n), lrs)


def bracket(traj, key, args, metrics):
    """With --bracket-lrs: {"lifted": each arm's ("GAMMA/N") frontier over every lr minus over
    --lrs alone, how much the lower lrs lift it (>= 0); "every lr": F's gain over every lr}."""
    every = sorted(args.lrs + args.bracket_lrs)
    arms = [f"{g:g}/{n}" for n, gs in ((args.n, args.gammas), ("exact", args.exact_gammas))
            for g in gs]
    out = {"lifted": {}, "every lr": {}}
    for arm in arms:
        out["lifted"][arm] = {m: compare(traj, key, sweep_of(args, arm),
                                         sweep_of(args, arm, every), args, m) for m in metrics}
        base = "0/" + arm.split("/")[1]
        if arm != base:
            out["every lr"][arm] = {m: compare(traj, key, sweep_of(args, base, every),
                                               sweep_of(args, arm, every), args, m)
                                    for m in metrics}
    return out
