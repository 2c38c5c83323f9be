"""The report of experiments/see_it_happen.py: its tables (NAME.md) and figures (NAME.png, the
pass@k curve; NAME_mechanism.png, the rare strategy along the runs and at matched pass@1), from a
run's result (its settings, seeds, summary and times) and trajectories. Nothing here computes a
figure that the summary does not hold, but for the medians a plot draws."""
import json
import statistics
import subprocess

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


def arms_markdown(res, args, seeds):  # seeds: the seed numbers the runs' indices stand for
    k, c = res["headline_k"], res["constants"]
    lines = ["### Every arm", "",
             "Over its stable runs (a run breaks down when the answer space holds less than "
             f"{c['broken']:g} of the mass; those seeds are listed and kept out): final pass@1, "
             f"pass@{k}, highest pass@1 (means), final rare share and lost fraction (medians); "
             "tokens clipped (sampled arms only: an exact arm's count is over enumerated "
             "completions, not their probability).", ""]
    rows = [[arm, f"{r['pass@1']:.3f}", f"{r[f'pass@{k}']:.3f}", f"{r['highest pass@1']:.3f}",
             f"{r['rare share']:.3f}", f"{r['rare lost']:.2f}",
             ", ".join(str(seeds[i]) for i in r["broke down"]) or "none",
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


def cores(times):  # the machine's cores, where the run recorded them
    return f" ({times['cores']} cores)" if "cores" in times else ""


def times_line(result, args):
    t, seeds = result["times"], result["seeds"]
    runs = [a for s in seeds for arms in s["arms"].values() for a in arms.values()]
    bases = [b for s in seeds for b in s["base"].values()]
    wall = sum(a["seconds"] for a in runs) + sum(b.get("seconds", 0) for b in bases)
    cpu = sum(a.get("cpu_s", 0) for a in runs) + sum(b.get("cpu_s", 0) for b in bases)
    flags = " --confirm" * args.confirm + " --quick" * args.quick
    return (f"`python experiments/see_it_happen.py{flags}` (this "
            f"invocation): {t['wall_s'] / 60:.1f} min wall, {t['cpu_s'] / 60:.1f} CPU-min, "
            f"{args.workers} worker(s), load average {t['load'][0]:.1f} at the start and "
            f"{t['load'][1]:.1f} at the end{cores(t)}. The warm starts and arms it reports "
            f"took {wall / 60:.1f} worker-min wall and {cpu / 60:.1f} CPU-min when they ran "
            "(cached ones in an earlier invocation). Every figure is exact over "
            f"{args.heldout} held-out prompts (see the module docstring).")


def markdown(result, args):
    summary = result["summary"]
    seeds = [s["seed"] for s in result["seeds"]]
    lines = [f"# See it happen: {', '.join(args.starts)}, seeds {seeds[0]}-{seeds[-1]}, "
             f"{args.steps} steps, N = {args.n}, lrs {', '.join(f'{x:g}' for x in args.lrs)}", "",
             times_line(result, args), ""]
    lines += glance_markdown(summary, args)
    for key, res in summary["conditions"].items():
        lines += base_markdown(key, res) + curve_markdown(res, args)
        lines += mechanism_markdown(res, args) + arms_markdown(res, args, seeds)
    if summary["check"]:
        ks = [x[len("sampled pass@"):] for x in summary["check"][0] if x.startswith("sampled")]
        lines += [f"## eval.py cross-check: sampled (n = {args.eval_n}, eval.pass_at_k) / exact",
                  ""]
        rows = [[c["seed"]] + [f"{c[f'sampled pass@{k}']:.3f} / {c[f'exact pass@{k}']:.3f}"
                               for k in ks] for c in summary["check"]]
        lines += table(["seed", *(f"pass@{k}" for k in ks)], rows)
    return "\n".join(lines) + "\n"


def write(path, text):
    """`text` into `path`, with the part of `path` above HAND_WRITTEN (a reading, by hand) kept."""
    old = path.read_text() if path.exists() else ""
    kept = old[:old.index(HAND_WRITTEN)] + HAND_WRITTEN + "\n\n" if HAND_WRITTEN in old else ""
    path.write_text(kept + text)


# ---------------------------------------------------------------- the results page
def primary(res, protocol):
    """The protocol's primary endpoint of a condition: (its paired summary, its k, confirmed)."""
    rule = protocol["primary"]
    k = res["headline_k"] if rule["metric"] == "headline" else int(rule["metric"])
    gap = res["frontier"][rule["comparison"]][f"pass@{k}"]["gap"]
    return gap, k, gap is not None and gap["lo"] is not None and gap["lo"] > 0


def page_markdown(confirm, explore, protocol, names):
    """The results page: the confirmation's primary endpoint as the protocol reads it, then the
    confirmation beside the exploration at every k, then the secondary analyses. names: the two
    runs' pages, without .md."""
    key = next(iter(confirm["summary"]["conditions"]))
    res = confirm["summary"]["conditions"][key]
    old = explore["summary"]["conditions"][key]
    gap, k, confirmed = primary(res, protocol)
    seeds = [f"seeds {r['seeds'][0]['seed']}-{r['seeds'][-1]['seed']}" for r in (confirm, explore)]
    verdict = "**confirmed**" if confirmed else "**not confirmed**"
    lines = [f"# See it happen: the confirmation ({seeds[0]}) and the exploration ({seeds[1]})",
             "", f"The protocol, experiments/see_it_happen_protocol.toml, was committed at "
             f"{confirm.get('protocol_commit', 'a commit this run did not record')}, before the "
             f"confirmation ran. {key}. Each run's own tables: [the confirmation]({names[0]}.md), "
             f"[the exploration]({names[1]}.md), on which the design was shaped; their reading: "
             "[docs/why-focal.md](../../docs/why-focal.md), section 6.", "",
             "## The primary endpoint",
             "", f"F minus DAPO at N {protocol['design']['n']}, pass@{k} (the headline k by the "
             f"rule), each seed's gap at matched pass@1 averaged over its levels, mean over the "
             f"{gap['n']} confirmation seeds: {ci(gap, 4)} (p {tests(gap)}). The protocol's rule "
             f"({protocol['primary']['confirmed_when']}): {verdict}. On the exploration seeds, "
             f"which shaped the design: {ci(primary(old, protocol)[0], 4)}.", ""]
    lines += side_by_side(res, old, seeds)
    for part in (bracket_markdown, ceilings_markdown):
        lines += part(res, protocol)
    return "\n".join(lines + versus_exact_markdown(res, old, seeds)) + "\n"


def side_by_side(res, old, seeds):
    """F minus the base algorithm at every k, mean over levels, on both seed sets."""
    names = list(res["frontier"])
    head = ["k"] + [f"{label(x)}: {s}" for x in names for s in seeds]
    head += [f"N minus exact: {s}" for s in seeds]
    rows = []
    for k in ks_of(res):
        m = f"pass@{k}"
        row = [star(k, res)]
        row += [ci(r["frontier"][x][m]["gap"], 4) for x in names for r in (res, old)]
        rows.append(row + [ci(next(iter(r["n_minus_exact"].values()), {}).get(m), 4)
                           for r in (res, old)])
    return ["## Every k, both seed sets", "", "Mean over levels [95% t interval] over seeds; "
            "bold: the headline k.", "", *table(head, rows), ""]


def bracket_markdown(res, protocol):
    """How much the protocol's lower lrs lift each frontier, and F's gain over every lr."""
    if "bracket" not in res:
        return []
    lifted, every = res["bracket"]["lifted"], res["bracket"]["every lr"]
    head = ["k", *(f"{label(a)}: lifted" for a in lifted), *(f"{label(a)}: F's gain, every lr"
                                                             for a in every)]
    rows = [[star(k, res), *(ci(c[f"pass@{k}"]["gap"], 4) for c in [*lifted.values(),
                                                                     *every.values()])]
            for k in ks_of(res)]
    lrs = ", ".join(f"{x:g}" for x in protocol["bracket"]["lrs"])
    return [f"## Bracketing from below: lr {lrs} added (confirmation seeds)", "",
            "Each arm's frontier over every lr minus over the protocol's lrs alone (0 where the "
            "lower lr never makes the frontier), mean over levels; then F minus DAPO with every "
            "lr.", "", *table(head, rows), ""]


def ceilings_markdown(res, protocol):
    """The ceiling runs: each N-8 arm's best stable lr run again for more steps."""
    if "ceilings" not in res:
        return []
    c = res["ceilings"]
    k = res["headline_k"]
    steps = [protocol["design"]["steps"], protocol["ceilings"]["steps"]]
    rows = [[label(arm), ", ".join(f"{r['lr']:g}" for r in c["runs"][arm].values()),
             f"{m['grid top']:.3f}", f"{m['pass@1']:.3f}", f"{m['step']:.0f}",
             f"{m[f'pass@{k}']:.3f}", f"{m['rare share']:.3f}", f"{m['rare lost']:.2f}",
             ", ".join(str(s) for s, r in c["runs"][arm].items() if r["broke down"]) or "none"]
            for arm, m in c["means"].items()]
    head = ["arm", "lr per seed", f"top pass@1 in {steps[0]} steps", f"in {steps[1]} steps",
            "at step", f"pass@{k} there", "rare share there", "lost there", "broke down"]
    said = [f"{'F top minus DAPO grid top' if 'top' in name else 'F minus DAPO'} "
            f"{ci(s if 'top' in name else s['pass@1'])}"
            for name, s in c.items() if "minus" in name]
    return [f"## The ceilings: each N-8 arm's best stable run again for {steps[1]} steps", "",
            f"Means over the first {protocol['ceilings']['seeds']} confirmation seeds; rare "
            "share and lost are medians over prompts at the top.", "", *table(head, rows), "",
            f"Paired over those seeds, pass@1 at the top ({steps[1]} steps; DAPO's \"grid top\" "
            f"in {steps[0]}): {'; '.join(said)}.", ""]


def versus_exact_markdown(res, old, seeds):
    """At matched pass@1, every k: F at N 8, and DAPO at N 8, against DAPO's exact update."""
    names = list(res["versus_exact"])
    head = ["k"] + [f"{x}: {s}" for x in names for s in seeds]
    rows = [[star(k, res)] + [ci(r["versus_exact"][x][f"pass@{k}"]["gap"], 4)
                              for x in names for r in (res, old)] for k in ks_of(res)]
    return ["## Without increasing group size: against DAPO's exact update (N -> infinity)", "",
            "At matched pass@1, mean over levels; \"1/8 - 0/exact\" is F at N 8 minus DAPO's exact "
            "update, \"0/8 - 0/exact\" what groups of 8 cost DAPO.", "", *table(head, rows), ""]


def write_page(out, protocol, names):
    """OUT/see_it_happen.md from OUT/NAME.json of both runs (names: confirmation, exploration);
    nothing where either run is missing."""
    paths = [out / f"{name}.json" for name in names]
    if all(p.exists() for p in paths):
        runs = [json.loads(p.read_text()) for p in paths]
        write(out / "see_it_happen.md", page_markdown(*runs, protocol, names))


def committed(path):
    """The commit that added `path`, with its date, as git names it."""
    log = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h (%cs)", "--", path.name],
                         cwd=path.parent, capture_output=True, text=True).stdout.split("\n")
    return [x for x in log if x][-1] if any(log) else "a commit git cannot name here"
