"""The report of experiments/see_it_happen.py: its tables (NAME.md) and figures (NAME.png, the
pass@k curve; NAME_mechanism.png, the rare strategy along the runs and at matched pass@1), from a
run's result (its settings, seeds, summary and times) and trajectories. Nothing here computes a
figure that the summary does not hold, but for the medians a plot draws."""
import statistics

HAND_WRITTEN = "<!-- written by hand above this line; see_it_happen.py writes the rest -->"


# ---------------------------------------------------------------- formatting
def ci(s, digits=3):
    """A paired summary as "mean [lo, hi]"."""
    if s is None:
        return "-"
    if s["lo"] is None:
        return f"{s['mean']:+.{digits}f}"
    return f"{s['mean']:+.{digits}f} [{s['lo']:+.{digits}f}, {s['hi']:+.{digits}f}]"


def tests(s):
    """A paired summary's tests: "p_t / p_Wilcoxon, positive/n"."""
    if s is None or s["p_t"] is None:
        return "-"
    return f"{s['p_t']:.2g} / {s['p_wilcoxon']:.2g}, {s['positive']}/{s['n']}"


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def label(name):
    """A comparison's key, "GAMMA/N", as "gamma 1, N 8" or "gamma 1, exact"."""
    gamma, n = name.split("/")
    return f"gamma {gamma}, " + ("exact" if n == "exact" else f"N {n}")


def ks_of(res):
    """The k of the pass@k curve, as the summary holds them."""
    first = next(iter(res["frontier"].values()))
    return [int(m[5:]) for m in first if m.startswith("pass@")]


def star(k, res):
    return f"**{k}**" if k == res["headline_k"] else str(k)


# ---------------------------------------------------------------- tables
def glance_markdown(summary, args):
    """Per condition: F minus the base algorithm at matched pass@1 at every k, averaged over the
    levels and at the top level, N = --n and exact, and N minus exact over the same levels."""
    lines = [f"## At a glance: F minus {args.algo.upper()} at matched pass@1, the whole curve", "",
             "Each seed on its own matched range, averaged over its levels (mean) and at the top "
             "level; mean [95% t interval] over seeds. Bold: the headline k (the largest k whose "
             "base pass@k is at most 0.9, fixed before the runs). At k = 1 the gap is 0 by "
             "construction.", ""]
    for key, res in summary["conditions"].items():
        names = list(res["frontier"])
        head = ["k"] + [f"{label(x)}: {part}" for x in names for part in ("mean", "top level")]
        head += [f"gamma {g}: N {args.n} minus exact, on the levels all four reach"
                 for g in res["n_minus_exact"]]
        rows = []
        for k in ks_of(res):
            m = f"pass@{k}"
            row = [star(k, res)]
            for x in names:
                c = res["frontier"][x][m]
                row += [ci(c["gap"], 4), ci(c["by_level"][-1] if c["by_level"] else None, 4)]
            rows.append(row + [ci(d.get(m), 4) for d in res["n_minus_exact"].values()])
        lines += [f"### {key}", "", *table(head, rows), ""]
    return lines


def curve_markdown(res, args):
    """Per comparison: the gap at every k (averaged, top level, tests), the matched range, the
    ceilings and which lr makes each frontier; then the gap at every level and k."""
    algo = args.algo.upper()
    lines = []
    for name, by_metric in res["frontier"].items():
        c0 = by_metric["pass@1"]
        span = "none" if not c0["gap"] else \
            f"{c0['level_pass@1'][0]:.3f} to {c0['level_pass@1'][-1]:.3f}"
        picks = "; ".join(f"{who}: " + ", ".join(f"{lr_of(n)} {v}" for n, v in
                                                 lrs["counts"].items()) + margin(lrs)
                          for who, lrs in zip((algo, "F"), res["frontier_lrs"][name]))
        lines += [f"### {label(name)}", "",
                  f"Matched pass@1 (mean over seeds of the first and the top level): {span}; "
                  f"seeds unmatched {c0['unmatched']}. Ceilings (highest pass@1 of any stable "
                  f"run), {algo} / F: {c0['ceilings'][0]:.3f} / {c0['ceilings'][1]:.3f}, F "
                  f"minus {algo} {ci(c0['ceiling'])} ({tests(c0['ceiling'])}). The lr whose run "
                  f"makes the frontier of pass@{res['headline_k']}, in seed-levels: {picks}.", ""]
        rows = [[star(k, res), ci(c["gap"], 4), tests(c["gap"]),
                 ci(c["by_level"][-1] if c["by_level"] else None, 4),
                 tests(c["by_level"][-1] if c["by_level"] else None)]
                for k, c in ((k, by_metric[f"pass@{k}"]) for k in ks_of(res))]
        lines += table(["k", "gain, mean over levels", "tests", "gain at the top level", "tests"],
                       rows)
        lines += ["", f"{label(name)}: the pass@k gain at each level (k = 1: 0).", ""]
        ks = ks_of(res)[1:]
        rows = [[f"{j + 1}/{args.levels}", f"{x:.3f}"] +
                [ci(by_metric[f"pass@{k}"]["by_level"][j], 4) for k in ks]
                for j, x in enumerate(c0["level_pass@1"])]
        lines += table(["level", "pass@1", *(f"pass@{k}" for k in ks)], rows) + [""]
    return lines


def margin(lrs):
    if lrs["lowest_margin"] is None:
        return ""
    return f" (the lowest lr adds {lrs['lowest_margin']:+.4f} on average)"


def lr_of(name):
    return "lr " + name.split("_lr")[1].split("_")[0]


def mechanism_markdown(res, args):
    """Per comparison, at each matched level: the rare share (median over seeds of each arm's
    frontier) and the lost fraction, both arms, and F's paired gain."""
    algo = args.algo.upper()
    lines = ["### The mechanism at matched pass@1", "",
             "The rare strategy's share of the correct mass (last / (first + last), median over "
             "prompts) and the fraction of prompts where it is lost (share under "
             f"{res['constants']['lost']:g}): each arm's frontier (the most share, the least lost "
             f"of any stable run at the level), medians over seeds; F minus {algo}, paired over "
             "seeds.", ""]
    for name, by_metric in res["frontier"].items():
        share, lost = by_metric["rare share"], by_metric["rare lost"]
        rows = [[f"{j + 1}/{args.levels}", f"{x:.3f}",
                 *(f"{v:.3f}" for v in share["medians_by_level"][j]), ci(share["by_level"][j]),
                 *(f"{v:.2f}" for v in lost["medians_by_level"][j]), ci(lost["by_level"][j])]
                for j, x in enumerate(share["level_pass@1"])]
        rows.append(["mean", "", "", "", ci(share["gap"]), "", "", ci(lost["gap"])])
        lines += [f"{label(name)}:", ""]
        lines += table(["level", "pass@1", f"share {algo}", "share F", "F minus", f"lost {algo}",
                        "lost F", "F minus"], rows) + [""]
    return lines


def arms_markdown(res, args):
    k, c = res["headline_k"], res["constants"]
    lines = ["### Every arm", "",
             "Over its stable runs (a run breaks down when the answer space holds less than "
             f"{c['broken']:g} of the mass; those seeds are listed and kept out): final pass@1, "
             f"pass@{k}, highest pass@1 (means), final rare share and lost fraction (medians); "
             "tokens clipped (sampled arms only: an exact arm's count is over enumerated "
             "completions, not their probability).", ""]
    rows = [[arm, f"{r['pass@1']:.3f}", f"{r[f'pass@{k}']:.3f}", f"{r['highest pass@1']:.3f}",
             f"{r['rare share']:.3f}", f"{r['rare lost']:.2f}",
             ", ".join(map(str, r["broke down"])) or "none",
             "-" if r["clip_frac"] is None else f"{r['clip_frac']:.2g}"]
            for arm, r in res["arms"].items()]
    lines += table(["arm", "pass@1", f"pass@{k}", "highest pass@1", "rare share", "lost",
                    "seeds broken down", "clip_frac"], rows)
    steps = [0] + [s for s in range(1, args.steps + 1)
                   if s % args.measure_every == 0 or s == args.steps]
    for metric, fmt in (("rare share", "{:.3f}"), ("rare lost", "{:.2f}")):
        lines += ["", f"The {metric.replace('rare ', '')} along every run (median over its stable "
                  "seeds; step 0: the base model).", ""]
        rows = [[arm] + [fmt.format(v) for v in r[f"{metric} by step"]]
                for arm, r in res["arms"].items()]
        lines += table(["arm", *(f"step {s}" for s in steps)], rows)
    return lines + [""]


def base_markdown(key, res):
    b, ks = res["base"], ks_of(res)
    lines = [f"## {key}: {res['about']}", "",
             "Base model, mean ± sd over seeds: " + ", ".join(
                 f"{m} {b[m][0]:.3f} ± {b[m][1]:.3f}" for m in ("pass@1", "rare mass",
                                                                 "wrong mass", "rare ratio",
                                                                 "rare share", "rare lost")),
             f"; warm-start steps per seed: {', '.join(map(str, res['warm_steps']))}.", ""]
    lines += table(["k", *map(str, ks)], [["base pass@k"] + [
        f"{b[f'pass@{k}'][0]:.3f} ± {b[f'pass@{k}'][1]:.3f}" for k in ks]])
    return lines + ["", f"Headline k: {res['headline_k']}.", ""]


def times_line(result, args):
    t, seeds = result["times"], result["seeds"]
    runs = [a for s in seeds for arms in s["arms"].values() for a in arms.values()]
    bases = [b for s in seeds for b in s["base"].values()]
    wall = sum(a["seconds"] for a in runs) + sum(b.get("seconds", 0) for b in bases)
    cpu = sum(a.get("cpu_s", 0) for a in runs) + sum(b.get("cpu_s", 0) for b in bases)
    return (f"`python experiments/see_it_happen.py{' --quick' if args.quick else ''}` (this "
            f"invocation): {t['wall_s'] / 60:.1f} min wall, {t['cpu_s'] / 60:.1f} CPU-min, "
            f"{args.workers} worker(s), load average {t['load'][0]:.1f} at the start and "
            f"{t['load'][1]:.1f} at the end (2 cores, shared). The warm starts and arms it reports "
            f"took {wall / 60:.1f} worker-min wall and {cpu / 60:.1f} CPU-min when they ran "
            "(cached ones in an earlier invocation). Every figure is exact over "
            f"{args.heldout} held-out prompts (see the module docstring).")


def markdown(result, args):
    summary = result["summary"]
    lines = [f"# See it happen: {', '.join(args.starts)} x {args.seeds} seeds, {args.steps} "
             f"steps, N = {args.n}, lrs {', '.join(f'{x:g}' for x in args.lrs)}", "",
             times_line(result, args), ""]
    lines += glance_markdown(summary, args)
    for key, res in summary["conditions"].items():
        lines += base_markdown(key, res) + curve_markdown(res, args)
        lines += mechanism_markdown(res, args) + arms_markdown(res, args)
    if summary["check"]:
        ks = [x[len("sampled pass@"):] for x in summary["check"][0] if x.startswith("sampled")]
        lines += [f"## eval.py cross-check: sampled (n = {args.eval_n}, eval.pass_at_k) / exact",
                  ""]
        rows = [[c["seed"]] + [f"{c[f'sampled pass@{k}']:.3f} / {c[f'exact pass@{k}']:.3f}"
                               for k in ks] for c in summary["check"]]
        lines += table(["seed", *(f"pass@{k}" for k in ks)], rows)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- figures
def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: pip install matplotlib to get the figures")
        return None
    return plt


def plot_curve(summary, args, path):
    """Per condition (two rows of two): the base model's pass@k; F minus the base algorithm at
    matched pass@1 against k (mean over levels, 95% interval); the gap at each level and k, N and
    exact."""
    plt = pyplot()
    if plt is None:
        return
    keys = list(summary["conditions"])
    fig, axes = plt.subplots(2 * len(keys), 2, figsize=(13, 10 * len(keys)), squeeze=False)
    for i, key in enumerate(keys):
        res = summary["conditions"][key]
        ks = ks_of(res)
        base = [res["base"][f"pass@{k}"] for k in ks]
        ax = axes[2 * i][0]
        ax.errorbar(ks, [b[0] for b in base], yerr=[b[1] for b in base], fmt="o-", ms=3)
        ax.axhline(res["constants"]["headline_max"], color="grey", lw=0.8)
        ax.axvline(res["headline_k"], color="grey", lw=0.8, ls=":")
        ax.set(xscale="log", xlabel="k", ylabel="pass@k",
               title=f"{key}: base model, mean ± sd over seeds (dotted: the headline k)")
        plot_gap_curve(axes[2 * i][1], res, args)
        for ax, name in zip(axes[2 * i + 1], res["frontier"]):
            plot_heatmap(fig, ax, res["frontier"][name], ks, f"{key}: {label(name)}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_gap_curve(ax, res, args):
    ks = ks_of(res)
    curves = {label(n): [c[f"pass@{k}"]["gap"] for k in ks] for n, c in res["frontier"].items()}
    for g, d in res["n_minus_exact"].items():
        curves[f"gamma {g}: N {args.n} minus exact (the levels all four reach)"] = [
            d.get(f"pass@{k}") for k in ks]
    for i, (name, gaps) in enumerate(curves.items()):
        pts = [(k * 1.04 ** i, s) for k, s in zip(ks, gaps) if s is not None]
        err = [[s["mean"] - (s["lo"] if s["lo"] is not None else s["mean"]) for _, s in pts],
               [(s["hi"] if s["hi"] is not None else s["mean"]) - s["mean"] for _, s in pts]]
        ax.errorbar([k for k, _ in pts], [s["mean"] for _, s in pts], yerr=err, fmt="o-", ms=3,
                    capsize=2, lw=1, color=f"C{i}", label=name)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(res["headline_k"], color="grey", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="k", ylabel="pass@k gain at matched pass@1",
           title=f"F minus {args.algo.upper()}, mean over levels, 95% t interval")
    ax.legend(fontsize=7)


def plot_heatmap(fig, ax, by_metric, ks, title):
    """The mean gap over seeds at each level (rows) and k (columns), 0 white."""
    grid = [[by_metric[f"pass@{k}"]["by_level"][j]["mean"] for k in ks]
            for j in range(len(by_metric["pass@1"]["by_level"]))]
    if not grid:
        return
    top = max(abs(v) for row in grid for v in row) or 1.0
    image = ax.imshow(grid, cmap="RdBu", vmin=-top, vmax=top, aspect="auto", origin="lower")
    ax.set_xticks(range(len(ks)), [str(k) for k in ks])
    levels = by_metric["pass@1"]["level_pass@1"]
    ax.set_yticks(range(len(levels)), [f"{x:.3f}" for x in levels])
    ax.set(xlabel="k", ylabel="level: pass@1 (mean over seeds)",
           title=f"{title}: pass@k gain by level (blue: F above)")
    fig.colorbar(image, ax=ax)


def plot_mechanism(result, traj, args, path):
    """Per condition (two rows of two): every arm's median path over its stable seeds in (pass@1,
    rare share) and (pass@1, lost fraction), each lr's at its end; both at matched pass@1."""
    plt = pyplot()
    if plt is None:
        return
    keys = list(result["summary"]["conditions"])
    fig, axes = plt.subplots(2 * len(keys), 2, figsize=(13, 10 * len(keys)), squeeze=False)
    for i, key in enumerate(keys):
        res = result["summary"]["conditions"][key]
        kinds = []
        for name, arm in result["seeds"][0]["arms"][key].items():
            broken = res["arms"][name]["broke down"]
            stable = [t[key][name] for j, t in enumerate(traj) if j not in broken]
            kind = label(f"{arm['gamma']:g}/{arm['n']}")
            kinds += [kind] if kind not in kinds else []
            if stable:  # an arm whose every run broke down is in the tables only
                plot_median_run(axes[2 * i], stable, arm, f"C{kinds.index(kind)}", kind)
        for ax, metric in zip(axes[2 * i], ("rare share", "rare lost")):
            ax.set(xlabel="pass@1 (median over stable seeds)", ylabel=metric,
                   title=f"{key}: {metric} along every run (its lr at its end)")
            ax.legend(fontsize=7)
        for ax, metric in zip(axes[2 * i + 1], ("rare share", "rare lost")):
            plot_matched(ax, res, metric, args)
        for ax in (axes[2 * i][0], axes[2 * i + 1][0]):  # shares from 0.001 to 1
            ax.set_yscale("symlog", linthresh=0.01)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_median_run(axes, stable, arm, color, kind):
    p1, share, lost = median_path(stable, ["pass@1", "rare share", "rare lost"])
    first_lr = kind not in [h.get_label() for h in axes[0].get_lines()]
    for ax, ys in zip(axes, (share, lost)):
        ax.plot(p1, ys, linestyle="--" if arm["n"] == "exact" else "-", marker=".", lw=1,
                alpha=0.7, color=color, label=kind if first_lr else None)
        ax.annotate(f"{arm['lr']:g}", (p1[-1], ys[-1]), fontsize=6, color=color)


def median_path(paths, keys):
    """The step-by-step median over seeds of trajectories measured at the same steps (a run that
    breaks down in one seed does not drag the line)."""
    return [[statistics.median(p[i][key] for p in paths) for i in range(len(paths[0]))]
            for key in keys]


def plot_matched(ax, res, metric, args):
    """Each arm's frontier of `metric` at each matched level, median over seeds."""
    for i, (name, by_metric) in enumerate(res["frontier"].items()):
        c = by_metric[metric]
        if not c["medians_by_level"]:
            continue
        for side, style in ((0, ":"), (1, "-")):
            who = args.algo.upper() if side == 0 else "F"
            ax.plot(c["level_pass@1"], [m[side] for m in c["medians_by_level"]], style,
                    marker="o", ms=3, color=f"C{i}", label=f"{label(name)}: {who}")
    ax.set(xlabel="matched pass@1 level (mean over seeds)", ylabel=f"{metric} (median frontier)",
           title=f"{metric} at matched pass@1 (dotted: {args.algo.upper()}, solid: F)")
    ax.legend(fontsize=7)


def write(result, traj, args):
    """OUT/NAME.md (its part above HAND_WRITTEN, a reading of the results, kept), the figures."""
    md = args.out / f"{args.name}.md"
    old = md.read_text() if md.exists() else ""
    kept = old[:old.index(HAND_WRITTEN)] + HAND_WRITTEN + "\n\n" if HAND_WRITTEN in old else ""
    md.write_text(kept + markdown(result, args))
    plot_curve(result["summary"], args, args.out / f"{args.name}.png")
    plot_mechanism(result, traj, args, args.out / f"{args.name}_mechanism.png")
