"""The figures of experiments/see_it_happen.py's report: NAME.png (the base model's pass@k, F's
gain against k and by level) and NAME_mechanism.png (the rare strategy along the runs and at
matched pass@1), drawn from a run's summary and trajectories, nothing computed anew but the
medians a line draws."""
from frontiers import median_path
from see_it_happen_report import ks_of, label

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


def draw(result, traj, args):
    """OUT/NAME.png and OUT/NAME_mechanism.png."""
    plot_curve(result["summary"], args, args.out / f"{args.name}.png")
    plot_mechanism(result, traj, args, args.out / f"{args.name}_mechanism.png")
