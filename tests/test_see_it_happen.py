"""Tests of experiments/see_it_happen.py (with see_it_happen_report.py) and
experiments/two_strategy.py: every reported figure recomputed by other code, the exact update's
advantages by hand."""
import importlib
import importlib.util
import json
import math
import random
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

import fgrpo

ROOT = Path(__file__).resolve().parent.parent  # the repository
SHARES = {"tie": {"both": 0.6, "rare": 0.2, "common": 0.2},
          "rare": {"both": 0.6, "rare": 0.4, "common": 0.0}}
KS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@pytest.fixture
def see(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    return importlib.import_module("see_it_happen")


# ---------------------------------------------------------------- experiments/see_it_happen.py
def test_exact_pass_curve_against_eval_pass_at_k_on_sampled_counts(see):
    # 40 prompts of made-up masses, some without the rare strategy, 1% outside the answer space:
    # the exact curve (the mix's expectation over kinds of 1 - (1 - p)^k) against eval.py's
    # unbiased pass@k of 4,096 samples per prompt and kind
    evaluator = importlib.import_module("eval")
    rng = np.random.default_rng(0)
    first = rng.uniform(0.3, 0.9, 40)
    last = rng.uniform(0.0, 0.05, 40) * (rng.random(40) < 0.8)
    wrong = (1 - first - last) * 0.99
    point = {"first": first.tolist(), "last": last.tolist(), "wrong": wrong.tolist(),
             "listed": float(np.mean(first + last + wrong))}
    exact = see.exact_metrics(point, point, "tie")
    assert list(see.KS) == KS
    n = 4096
    counts = {kind: rng.binomial(n, p) for kind, p in
              (("both", first + last), ("rare", last), ("common", first))}
    for k in KS:
        sampled = {kind: evaluator.pass_at_k([n] * 40, c, k).mean() for kind, c in counts.items()}
        mix = sum(SHARES["tie"][kind] * v for kind, v in sampled.items())
        assert abs(exact[f"pass@{k}"] - mix) < 0.01, (k, exact[f"pass@{k}"], mix)
        assert abs(exact[f"rare pass@{k}"] - sampled["rare"]) < 0.02, k
    assert abs(exact["pass@1"] - 0.8 * np.mean(first + last)) < 1e-12  # 0.6 (f + l) + 0.2 (l + f)


def test_rare_share_and_lost_fraction_on_a_hand_made_mass_table(see):
    # five prompts; the rare strategy's share of the correct mass, last / (first + last): 0.5,
    # 0.1, 0.017 / 0.9 = 0.0189 (lost: under 0.02), 0 (lost), 0.03 / 0.63 = 0.0476
    point = {"first": [0.45, 0.72, 0.883, 0.9, 0.6], "last": [0.45, 0.08, 0.017, 0.0, 0.03],
             "wrong": [0.1, 0.2, 0.1, 0.1, 0.37], "listed": 1.0}
    m = see.exact_metrics(point, point, "tie")
    assert see.LOST == 0.02 and m["rare lost"] == 2 / 5
    assert abs(m["rare share"] - 0.03 / 0.63) < 1e-12  # the median over prompts
    assert abs(m["rare mass"] - 0.577 / 5) < 1e-12 and abs(m["wrong mass"] - 0.87 / 5 / 8) < 1e-12
    assert abs(m["rare ratio"] - 0.577 / (0.87 / 8)) < 1e-9  # means over prompts, then the ratio
    point["last"][2] = 0.0181  # 0.0181 / 0.9011 = 0.02009: kept
    assert see.exact_metrics(point, point, "tie")["rare lost"] == 1 / 5


def test_matched_levels_and_frontiers_by_hand(see):
    # F's arms B, C, D against A, pass@32, 3 seeds, 2 levels each from the base to the lower
    # ceiling of the stable runs; a frontier is the best value where a run crosses the level:
    # seed 0: top min(0.7, 0.8) = 0.7, levels 0.6, 0.7; A 0.85, 0.8; B 0.9, 0.875 -> 0.05, 0.075
    # seed 1: D breaks down (listed 0.5; it would lift F's ceiling to 0.7): top min(0.6, 0.5),
    #         levels 0.45, 0.5; A 0.85, 0.8; B 0.89, 0.88 and C 0.925, 0.95 -> 0.075, 0.15
    #         (C at 0.45 is 0.925 where it crosses, not the 0.95 it reaches above the level)
    # seed 2: F never rises above the base: no range, left out of the gaps
    def path(*points):
        return [{"pass@1": x, "pass@32": y, "listed": 1.0} for x, y in points]

    flat = path((0.5, 0.9), (0.5, 0.9))
    broken = path((0.4, 0.9), (0.7, 1.0))
    broken[1]["listed"] = 0.5
    traj = [{"s/tie": {"A": path((0.5, 0.9), (0.7, 0.8)),
                       "B": path((0.5, 0.9), (0.6, 0.9), (0.8, 0.85)), "C": flat, "D": flat}},
            {"s/tie": {"A": path((0.4, 0.9), (0.6, 0.7)), "B": path((0.4, 0.9), (0.5, 0.88)),
                       "C": path((0.4, 0.9), (0.5, 0.95)), "D": broken}},
            {"s/tie": {"A": path((0.5, 0.9), (0.6, 0.8)), "B": path((0.5, 0.9), (0.45, 0.95)),
                       "C": flat, "D": flat}}]
    args = see.parse_args(["--levels", "2"])
    c = see.compare(traj, "s/tie", ["A"], ["B", "C", "D"], args, "pass@32")
    assert c["unmatched"] == 1 and c["levels"][2] == []
    assert np.allclose(c["levels"][:2], [[0.6, 0.7], [0.45, 0.5]], rtol=0, atol=1e-12)
    assert np.allclose(c["level_pass@1"], [0.525, 0.6])
    assert np.allclose([s["mean"] for s in c["by_level"]], [0.0625, 0.1125])
    assert np.allclose(c["gaps"], [0.0625, 0.1125]) and abs(c["gap"]["mean"] - 0.0875) < 1e-12
    assert np.allclose(c["medians_by_level"], [[0.85, 0.9125], [0.8, 0.9125]])
    assert np.allclose(c["ceilings"], [(0.7 + 0.6 + 0.6) / 3, (0.8 + 0.5 + 0.5) / 3])
    assert [s["n"] for s in c["by_level"]] == [2, 2] and c["gap"]["positive"] == 2
    lost = [[{"pass@1": 0.4, "rare lost": 0.5}, {"pass@1": 0.6, "rare lost": 0.1}],
            [{"pass@1": 0.4, "rare lost": 0.2}, {"pass@1": 0.6, "rare lost": 0.6}]]
    assert abs(see.frontier_at(lost, 0.5, "rare lost") - 0.3) < 1e-12  # the least lost: 0.3, 0.4
    assert see.frontier_at(lost, 0.65, "rare lost") is None
    for t in traj:  # every run of F broken down, on every seed: no seed matched, no ceiling gap
        t["s/tie"].update(B=broken, C=broken, D=broken)
    c = see.compare(traj, "s/tie", ["A"], ["B", "C", "D"], args, "pass@32")
    assert c["unmatched"] == 3 and c["gap"] is None and c["ceiling"] is None
    assert c["ceilings"] == []


def test_warm_start_stopping_rule_reads_training_prompts_only(see, monkeypatch, tmp_path):
    # every probability the warm start reads (its stopping rule) comes from training prompts;
    # the held-out prompts are measured once, after it, for the base model's figures
    args = see.parse_args(["--work", str(tmp_path), "--warm-steps", "2", "--heldout", "12",
                           "--train-problems", "100"])
    heldout = see.make_digits(12, random.Random(10_000))
    read = []
    measure = see.strategy_probs
    monkeypatch.setattr(see, "strategy_probs",
                        lambda model, tok, digits: read.append(digits) or measure(model, tok,
                                                                                     digits))
    ctx = see.prepare_seed(0, "rare", args, heldout)
    train = see.make_digits(100, random.Random(0), exclude=heldout)
    assert len(read) >= 2 and read[-1] == heldout  # the rule at least once, then the base
    held = set(map(tuple, heldout))
    for digits in read[:-1]:
        assert digits == train[:see.RULE_PROMPTS] and not held & set(map(tuple, digits))
    assert ctx["base"]["warm_steps"] == 8  # the rule never held: 2 steps, then up to 4 x 2


def test_exact_update_hooks_advantages_by_hand(see):
    # fgrpo.Hooks' sample and advantages of the N -> infinity arm: every completion of the answer
    # space, advantage scale * pi_old * (1 - p)^gamma * (R - p) / sqrt(p (1 - p))
    model, tok, _, _ = fgrpo.build_tiny(0, warm_steps=30)
    hooks, group = see.exact_update_hooks(tok)
    prompts = [see.prompt_text([3, 1, 4, 5, 9]), see.prompt_text([2, 7, 1, 8, 0])]
    samples = hooks["sample"](model, tok, None, prompts, group, None, 0)
    assert len(samples) == 2 * group and group == 30  # 10 digits x ("\\boxed{d}", 2 stutters)
    texts = tok.batch_decode([c for _, c, _ in samples], skip_special_tokens=True)
    assert texts[:3] == ["\\boxed{0}", "\\boxed\\boxed{0}", "\\boxed\\boxed\\boxed{0}"]
    golds = ["3, 9"] * group + ["8"] * group  # both kind, then a gold of neither strategy
    rewards = torch.tensor(see.answer_set_verify(texts, golds)).view(2, -1)
    args = fgrpo.parse_args(["--model", "tiny", "--rollout", "hf", "--gamma", "1"])
    adv = hooks["advantages"](rewards, samples, args)  # as fgrpo.run_step calls it
    with torch.no_grad():
        logp = [(fgrpo.token_logprobs(model, *fgrpo.collate([(p, c)], 0)[:2])[0, len(p) - 1:]).sum()
                for p, c, _ in samples]
    pi = torch.stack(logp).exp().view(2, -1)
    lengths = [len(c) for _, c, _ in samples[:group]]
    for i in range(2):
        p = float((pi[i] * rewards[i]).sum())
        for j in range(group):
            want = sum(lengths) / lengths[0] * pi[i, j] * (1 - p) * (rewards[i, j] - p) / math.sqrt(
                p * (1 - p))
            assert abs(float(adv[i, j]) - float(want)) < 1e-5 * (1 + abs(float(want)))
    assert see.answer_set_verify(["\\boxed{7}", "\\boxed{3}\\boxed{0}", "7", "\\boxed{ 7 }"],
                                 ["0, 7"] * 4) == [1.0, 1.0, 0.0, 1.0]  # the last box, after strip


def test_train_arm_an_arms_own_hooks_and_options_reach_fgrpo_and_name_its_cache(see, monkeypatch,
                                                                                 tmp_path):
    # another experiment's arm (experiments/peers.py) brings fgrpo.Hooks fields and options set on
    # fgrpo's args: they reach fgrpo.train, and they are the arm's identity in its cache, so that
    # an arm of the same name and command line with other hooks or options trains anew
    trained = []

    def fake_train(args, hooks):  # what train_arm reads of fgrpo.train's run: metrics.jsonl
        trained.append((vars(args), hooks))
        row = {"focal_mean": 1.0, "clip_frac": 0.0, "grad_norm": 0.0}
        (Path(args.out) / "metrics.jsonl").write_text(json.dumps(row) + "\n")

    def own_advantages(rewards, samples, args):
        return rewards * args.k

    monkeypatch.setattr(see.fgrpo, "train", fake_train)
    ctx = {"args": see.parse_args(["--work", str(tmp_path)]), "tok": None, "dir": tmp_path,
           "seed": 0, "data": {"tie": tmp_path / "tie.jsonl"}, "base_settings": {}}
    arm = {"mix": "tie", "algo": "dapo", "gamma": 0.0, "lr": 1e-4, "n": 8, "name": "x", "steps": 4}
    peer = {**arm, "hooks": {"advantages": own_advantages}, "options": {"k": 4}}
    for spec in (arm, arm, peer, peer, {**peer, "options": {"k": 2}}, arm):
        see.train_arm(spec, ctx)
    assert len(trained) == 4  # each second call of the same arm read its cache
    plain, own, other, again = trained
    assert plain[1].advantages is fgrpo.Hooks().advantages and again[0] == plain[0]
    assert own[1].advantages is own_advantages and own[1].score is see.answer_set_verify
    assert own[0] == {**plain[0], "k": 4} and other[0]["k"] == 2
    settings = json.loads((tmp_path / "tie" / "x.json").read_text())["settings"]
    assert set(settings) == {"argv", "base", "every"}  # this file's arms: their caches as before


# Recomputed by other code than the experiment's: loops, numpy's interpolation and medians,
# scipy's t distribution and a brute-force Wilcoxon over all sign patterns.
def _see_metrics(point, base, shares):
    p_kind = {"both": [f + l for f, l in zip(point["first"], point["last"])],
              "rare": point["last"], "common": point["first"]}
    out = {}
    for k in KS:
        out[f"pass@{k}"] = sum(shares[kind] * np.mean([1 - (1 - p) ** k for p in ps])
                               for kind, ps in p_kind.items())
        out[f"rare pass@{k}"] = np.mean([1 - (1 - p) ** k for p in point["last"]])
    share = np.array([l / (f + l) if f + l > 0 else 0.0
                      for f, l in zip(point["first"], point["last"])])
    out["rare share"], out["rare lost"] = float(np.median(share)), float(np.mean(share < 0.02))
    out["rare mass"] = np.mean(point["last"])
    out["wrong mass"] = np.mean(point["wrong"]) / 8  # 10 digits - first, last
    out["rare ratio"] = out["rare mass"] / out["wrong mass"]
    out["listed"] = point["listed"]
    w_last, w_first = shares["both"] + shares["rare"], shares["both"] + shares["common"]
    lost, held = 0.0, 0.0
    for i in range(len(base["first"])):
        lost += w_last * max(0.0, base["last"][i] - point["last"][i])
        lost += w_first * max(0.0, base["first"][i] - point["first"][i])
        held += w_last * base["last"][i] + w_first * base["first"][i]
    out["M_ret"] = 1 - lost / held
    return out


def _see_front(paths, t, metric):  # numpy's interpolation on every segment that holds t
    ys = []
    for path in paths:
        for a, b in zip(path, path[1:]):
            (x0, y0), (x1, y1) = sorted([(a["pass@1"], a[metric]), (b["pass@1"], b[metric])])
            if x0 - 1e-12 <= t <= x1 + 1e-12:  # (levels from the experiment's own sums)
                ys += [y0, y1] if x0 == x1 else [float(np.interp(t, [x0, x1], [y0, y1]))]
    return (min if metric == "rare lost" else max)(ys)


def _see_paired(diffs, want, tol=1e-9):  # tol: how far diffs may be from the experiment's
    from scipy import stats
    d = np.array(diffs)
    n, mean = len(d), d.mean()
    assert want["n"] == n and abs(want["mean"] - mean) <= tol + 1e-12, (want, mean)
    if n > 1 and d.std() > 1e-6:  # a t test of identical differences is undefined in scipy
        half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
        assert abs(want["hi"] - want["lo"] - 2 * half) <= 4 * tol + 1e-6
        assert abs(want["p_t"] - stats.ttest_1samp(d, 0).pvalue) <= (1e-6 if tol < 1e-6 else 0.05)
    gaps = np.diff(np.sort(np.abs(d)))
    if np.abs(d).min() > 10 * tol and (gaps.min() if n > 1 else 1) > 10 * tol:  # ranks settled
        assert want["positive"] == int((d > 0).sum())
        ranks = stats.rankdata(np.abs(d))
        observed = ranks[d > 0].sum()
        patterns = [sum(r for r, bit in zip(ranks, f"{m:0{n}b}") if bit == "1")
                    for m in range(2 ** n)]
        low = sum(w <= observed + 1e-9 for w in patterns) / len(patterns)
        high = sum(w >= observed - 1e-9 for w in patterns) / len(patterns)
        assert abs(want["p_wilcoxon"] - min(1.0, 2 * min(low, high))) < 1e-9


def _stable(paths):
    return [p for p in paths if min(x["listed"] for x in p) >= 0.9]


def _see_compare(traj, key, groups, want, count, metric):
    """One seed at a time, on its stable runs: from its base model's pass@1 to the lowest ceiling
    of the groups (F's arms, its base's, and any others that share the range), `count` levels
    (the base point left out); the gaps of groups[1] over groups[0] per level and their mean."""
    gaps, tops, values = [], [], []
    for t, levels_want in zip(traj, want["levels"]):
        paths = [_stable([t[key][x] for x in names]) for names in groups]
        top = [max((p["pass@1"] for path in g for p in path), default=None) for g in paths]
        tops.append(top[:2])
        levels = []
        if None not in top and min(top) > paths[0][0][0]["pass@1"]:  # a group's runs all broke
            lo = paths[0][0][0]["pass@1"]
            levels = [lo + (min(top) - lo) * i / count for i in range(1, count + 1)]
        assert np.allclose(levels, levels_want, rtol=0, atol=1e-12)
        values.append([[_see_front(g, x, metric) for g in paths[:2]] for x in levels])
        gaps.append([b - a for a, b in values[-1]])
    tops = [top for top in tops if None not in top]
    assert np.allclose(np.mean(tops, axis=0), want["ceilings"], rtol=0, atol=1e-12)
    _see_paired([b - a for a, b in tops], want["ceiling"])
    matched = [i for i, g in enumerate(gaps) if g]
    assert want["unmatched"] == len(gaps) - len(matched)
    for j in range(count if matched else 0):
        _see_paired([gaps[i][j] for i in matched], want["by_level"][j], tol=1e-6)
        medians = np.median([values[i][j] for i in matched], axis=0)
        assert np.allclose(medians, want["medians_by_level"][j], rtol=0, atol=1e-6)
    if matched:
        _see_paired([np.mean(gaps[i]) for i in matched], want["gap"], tol=1e-6)
    return [np.mean(gaps[i]) for i in matched]


@pytest.mark.slow
def test_see_it_happen_quick_figures_match_an_independent_recomputation(see, tmp_path):
    # --quick --confirm: the protocol's confirmation seeds (10, 11 here), 2 warm starts, DAPO at 2
    # lrs and a bracketing lower one x gamma 0 and 1, N 8 and the exact update, the ceiling runs,
    # eval.py's cross-check; all through fgrpo.train and its Hooks. Every reported figure is
    # recomputed, and fgrpo is left as it was: the experiment swaps parts through Hooks only.
    touched = ("verify", "run_step", "rollout", "group_advantages", "train", "Hooks")
    before = [getattr(fgrpo, n) for n in touched], signal.getsignal(signal.SIGTERM)
    hooks, threads = fgrpo.Hooks(), torch.get_num_threads()
    out = tmp_path / "out"
    res = see.main(["--quick", "--confirm", "--workers", "1", "--out", str(out), "--work",
                    str(tmp_path / "w")])
    assert ([getattr(fgrpo, n) for n in touched], signal.getsignal(signal.SIGTERM)) == before
    assert fgrpo.Hooks() == hooks and torch.get_num_threads() == threads
    saved = json.loads((out / "see_it_happen_confirmation_quick.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(res["summary"]))
    cfg, seeds, summary = saved["config"], saved["seeds"], saved["summary"]
    traj = [{key: {arm: [{"step": p["step"], **_see_metrics(p, s["base"][key],
                                                            SHARES[key.split("/")[1]])}
                         for p in [{"step": 0, **s["base"][key]}] + rec["curve"]]
                   for arm, rec in arms.items()} for key, arms in s["arms"].items()} for s in seeds]
    _see_check_seeds(seeds, cfg)
    assert [s["seed"] for s in seeds] == [10, 11] and cfg["bracket_lrs"] == [3e-5]
    assert list(summary["conditions"]) == ["rare/tie", "strategy/tie"]
    for key, want in summary["conditions"].items():
        _see_check_condition(traj, seeds, key, want, cfg)
    _see_check_new_analyses(traj, seeds, "rare/tie", summary["conditions"]["rare/tie"], cfg)
    assert "ceilings" not in summary["conditions"]["strategy/tie"]  # the main start's alone
    _see_report(out, summary, seeds, Path(cfg["work"]), cfg)  # --quick's own work folder
    md = (out / "see_it_happen_confirmation_quick.md").read_text()
    # the results page, with the same run standing in for the exploration's: the protocol's
    # primary endpoint and its rule read from the protocol file
    (out / "see_it_happen_exploration_quick.json").write_text(
        (out / "see_it_happen_confirmation_quick.json").read_text())
    see.main(["--quick", "--confirm", "--report-only", "--out", str(out)])  # again, from JSON
    assert (out / "see_it_happen_confirmation_quick.md").read_text() == md
    _see_page(out, summary["conditions"]["rare/tie"])


def _see_page(out, res):
    import tomllib
    protocol = tomllib.loads((ROOT / "experiments" / "see_it_happen_protocol.toml").read_text())
    assert protocol["primary"] == {"comparison": "1/8", "metric": "headline",
                                   "confirmed_when": "lower end of the 95% t interval > 0"}
    gap = res["frontier"]["1/8"][f"pass@{res['headline_k']}"]["gap"]
    page = (out / "see_it_happen.md").read_text()
    said = f"{gap['mean']:+.4f}"  # one seed matched (--quick): no interval, not confirmed
    if gap["lo"] is not None:
        said += f" [{gap['lo']:+.4f}, {gap['hi']:+.4f}]"
    verdict = "**confirmed**" if gap["lo"] is not None and gap["lo"] > 0 else "**not confirmed**"
    assert f"pass@{res['headline_k']} (the headline k by the rule)" in page
    assert said in page and f"{protocol['primary']['confirmed_when']}): {verdict}" in page


def _see_check_seeds(seeds, cfg):
    steps = [s for s in range(1, cfg["steps"] + 1)
             if s % cfg["measure_every"] == 0 or s == cfg["steps"]]
    for s in seeds:  # the warm start uses the prompt: each digit's mass varies over prompts
        for key, base in s["base"].items():
            assert 0.45 < np.mean(base["first"]) < 0.95 and 0.005 < np.mean(base["last"]) < 0.2
            assert sorted(base["digit_cv"])[5] > 0.5 and base["listed"] > 0.9  # median
            assert base["warm_steps"] >= cfg["warm_steps"]
            for p in [base] + [p for rec in s["arms"][key].values() for p in rec["curve"]]:
                listed = [f + la + w for f, la, w in zip(p["first"], p["last"], p["wrong"])]
                assert abs(np.mean(listed) - p["listed"]) < 1e-5  # the ten digits, nothing else
            for arm, rec in s["arms"][key].items():
                assert [p["step"] for p in rec["curve"]] == steps and 0 <= rec["clip_frac"] <= 1


def _see_check_condition(traj, seeds, key, want, cfg):
    """One (warm start, mix)'s reported figures against a recomputation from the trajectories."""
    lrs = cfg["lrs"]
    name = lambda g, lr, m: f"dapo_g{g:g}_lr{lr:g}_" + (  # noqa: E731
        "exact" if m == "exact" else f"n{m}")
    base = [t[key][name(0.0, lrs[0], cfg["n"])][0] for t in traj]
    curve = [f"pass@{k}" for k in KS] + ["rare share", "rare lost"]
    assert set(want["base"]) == set(curve) | {"rare mass", "wrong mass", "rare ratio"}
    for metric, (mean, sd) in want["base"].items():
        assert abs(mean - np.mean([b[metric] for b in base])) < 1e-9, (key, metric)
        assert abs(sd - np.std([b[metric] for b in base], ddof=1)) < 1e-9
    headline = max([k for k in KS if np.mean([b[f"pass@{k}"] for b in base]) <= 0.9], default=1)
    assert want["headline_k"] == headline
    assert want["warm_steps"] == [s["base"][key]["warm_steps"] for s in seeds]
    _see_check_arms(traj, seeds, key, want, cfg, headline)
    sweeps = {(g, n): [name(g, lr, n) for lr in lrs] for n in (cfg["n"], "exact") for g in
              (cfg["gammas"] if n != "exact" else cfg["exact_gammas"])}
    for n, gammas in ((cfg["n"], cfg["gammas"]), ("exact", cfg["exact_gammas"])):
        for g in gammas[1:]:
            pair = [sweeps[0.0, n], sweeps[g, n]]
            got = want["frontier"][f"{g:g}/{n}"]
            assert list(got) == curve
            for metric in curve:
                _see_compare(traj, key, pair, got[metric], cfg["levels"], metric)
            levels = got[f"pass@{headline}"]["levels"]
            for names, lrs in zip(pair, want["frontier_lrs"][f"{g:g}/{n}"]):
                counts, margins = _see_frontier_lrs(traj, key, names, levels, f"pass@{headline}")
                assert lrs["counts"] == counts
                if margins:
                    assert abs(lrs["lowest_margin"] - np.mean(margins)) < 1e-9
                else:
                    assert lrs["lowest_margin"] is None
    for g, by_metric in want["n_minus_exact"].items():
        sampled = [sweeps[0.0, cfg["n"]], sweeps[float(g), cfg["n"]]]
        exact = [sweeps[0.0, "exact"], sweeps[float(g), "exact"]]
        for metric in curve:  # both gains over the levels of the range all four arms reach
            at_n = _see_gains(traj, key, sampled + exact, cfg["levels"], metric)
            at_exact = _see_gains(traj, key, exact + sampled, cfg["levels"], metric)
            if at_n is None:
                assert by_metric.get(metric) is None
            else:
                _see_paired([a - b for a, b in zip(at_n, at_exact)], by_metric[metric], tol=1e-6)


def _see_check_new_analyses(traj, seeds, key, want, cfg):
    """The confirmation's analyses: against DAPO's exact update, the lower lrs' bracket, the
    ceiling runs (each seed's best stable lr again for more steps)."""
    def names(arm, lrs):
        g, n = arm.split("/")
        return [f"dapo_g{float(g):g}_lr{lr:g}_" + ("exact" if n == "exact" else f"n{n}")
                for lr in lrs]
    curve = [f"pass@{k}" for k in KS] + ["rare share", "rare lost"]
    for name, by_metric in want["versus_exact"].items():  # "1/8 - 0/exact": B minus A
        b, a = name.split(" - ")
        for metric in curve:
            _see_compare(traj, key, [names(a, cfg["lrs"]), names(b, cfg["lrs"])],
                         by_metric[metric], cfg["levels"], metric)
    every = sorted(cfg["lrs"] + cfg["bracket_lrs"])
    for arm, by_metric in want["bracket"]["lifted"].items():
        for k in KS:
            _see_compare(traj, key, [names(arm, cfg["lrs"]), names(arm, every)],
                         by_metric[f"pass@{k}"], cfg["levels"], f"pass@{k}")
    for arm, by_metric in want["bracket"]["every lr"].items():
        base = "0/" + arm.split("/")[1]
        for k in KS:
            _see_compare(traj, key, [names(base, every), names(arm, every)],
                         by_metric[f"pass@{k}"], cfg["levels"], f"pass@{k}")
    _see_check_ceilings(traj, seeds, key, want["ceilings"], cfg)


def _see_check_ceilings(traj, seeds, key, want, cfg):
    shares = SHARES[key.split("/")[1]]
    tops = {}
    for t, s in zip(traj, seeds):
        for arm, record in s["ceilings"].get(key, {}).items():
            g = arm.split("/")[0]
            grids = {lr: t[key][f"dapo_g{float(g):g}_lr{lr:g}_n{cfg['n']}"] for lr in cfg["lrs"]}
            stable = {lr: p for lr, p in grids.items() if min(x["listed"] for x in p) >= 0.9}
            best = max(stable, key=lambda lr: max(x["pass@1"] for x in stable[lr]))
            assert record["lr"] == best  # the stable run that reached the highest pass@1
            path = [_see_metrics(p, s["base"][key], shares) for p in record["curve"]]
            assert [p["step"] for p in record["curve"]][-1] == cfg["ceiling_steps"]
            top = max(range(len(path)), key=lambda i: path[i]["pass@1"])
            got = want["runs"][arm][str(s["seed"])]
            assert got["step"] == record["curve"][top]["step"]
            for metric in ("pass@1", f"pass@{KS[-1]}", "rare share"):
                assert abs(got[metric] - path[top][metric]) < 1e-9, metric
            assert abs(got["grid top"] - max(x["pass@1"] for x in grids[best])) < 1e-12
            tops.setdefault(arm, {})[s["seed"]] = (path[top]["pass@1"], got["grid top"])
    for arm, by_seed in tops.items():
        assert abs(want["means"][arm]["pass@1"] - np.mean([v[0] for v in by_seed.values()])) < 1e-9
    base = tops.get(f"0/{cfg['n']}", {})
    for arm in [a for a in tops if not a.startswith("0/")]:
        seeds_both = [x for x in tops[arm] if x in base]
        _see_paired([tops[arm][x][0] - base[x][0] for x in seeds_both],
                    want[f"{arm} minus base"]["pass@1"])
        _see_paired([tops[arm][x][0] - base[x][1] for x in seeds_both],
                    want[f"{arm} top minus base grid top"])


def _see_gains(traj, key, groups, count, metric):
    """Per seed, groups[1]'s gain over groups[0] averaged over the levels of the range that all
    the groups reach (stable runs); None if a seed has no such range."""
    out = []
    for t in traj:
        paths = [_stable([t[key][x] for x in names]) for names in groups]
        if not all(paths):
            return None
        lo = paths[0][0][0]["pass@1"]
        hi = min(max(p["pass@1"] for path in g for p in path) for g in paths)
        if hi <= lo:
            return None
        levels = [lo + (hi - lo) * i / count for i in range(1, count + 1)]
        out.append(np.mean([_see_front(paths[1], x, metric) - _see_front(paths[0], x, metric)
                            for x in levels]))
    return out


def _see_frontier_lrs(traj, key, names, levels, metric):
    counts = {n: 0 for n in names}
    margins = []
    for t, seed_levels in zip(traj, levels):
        for x in seed_levels:
            vals = {n: _see_front([t[key][n]], x, metric) for n in names
                    if min(p["listed"] for p in t[key][n]) >= 0.9
                    and min(p["pass@1"] for p in t[key][n]) - 1e-12 <= x
                    <= max(p["pass@1"] for p in t[key][n]) + 1e-12}
            counts[max(vals, key=vals.get)] += 1
            if set(vals) - {names[0]}:
                margins.append(max(vals.values()) - max(v for n, v in vals.items()
                                                        if n != names[0]))
    return counts, margins


def _see_check_arms(traj, seeds, key, want, cfg, headline):
    name = lambda g, lr, m: f"dapo_g{g:g}_lr{lr:g}_" + (  # noqa: E731
        "exact" if m == "exact" else f"n{m}")
    arms = [name(g, lr, n) for lr in cfg["lrs"] + cfg["bracket_lrs"]
            for n, gs in ((cfg["n"], cfg["gammas"]), ("exact", cfg["exact_gammas"])) for g in gs]
    assert list(want["arms"]) == arms
    for arm, row in want["arms"].items():
        paths = [t[key][arm] for t in traj]
        broken = [i for i, p in enumerate(paths) if min(x["listed"] for x in p) < 0.9]
        assert row["broke down"] == broken
        stable = [p for i, p in enumerate(paths) if i not in broken] or paths
        for metric in ("pass@1", f"pass@{headline}"):
            assert abs(row[metric] - np.mean([p[-1][metric] for p in stable])) < 1e-9
        for metric in ("rare share", "rare lost"):
            assert abs(row[metric] - np.median([p[-1][metric] for p in stable])) < 1e-9
            by_step = np.median([[x[metric] for x in p] for p in stable], axis=0)
            assert np.allclose(row[f"{metric} by step"], by_step, rtol=0, atol=1e-12)
        highest = np.mean([max(x["pass@1"] for x in p) for p in stable])
        assert abs(row["highest pass@1"] - highest) < 1e-9
        clip = np.mean([s["arms"][key][arm]["clip_frac"] for s in seeds])
        assert row["clip_frac"] is None if arm.endswith("exact") else abs(row["clip_frac"] - clip) \
            < 1e-12


def _see_report(out, summary, seeds, work, cfg):
    assert len(summary["check"]) == len(seeds)
    for check, s in zip(summary["check"], seeds):  # eval.py's samples against the exact pass@k
        c = s["check"]
        kinds = [json.loads(x)["kind"] for x in (work / f"heldout_{c['mix']}.jsonl").read_text()
                 .splitlines()]
        final = s["arms"][f"{c['start']}/{c['mix']}"][c["arm"]]["curve"][-1]
        ps = [final["last"][i] + final["first"][i] * (kd == "both") if kd != "common" else
              final["first"][i] for i, kd in enumerate(kinds)]
        ks = [k for k in KS if k < c["n"]] + [c["n"]]
        assert list(c["sampled"]) == [str(k) for k in ks]
        for k in ks:
            sampled = np.mean([1 - math.comb(c["n"] - x, k) / math.comb(c["n"], k)
                               for x in c["correct"]])
            assert abs(check[f"sampled pass@{k}"] - sampled) < 1e-9
            exact = np.mean([1 - (1 - p) ** k for p in ps])
            assert abs(check[f"exact pass@{k}"] - exact) < 1e-9
        se = math.sqrt(np.mean(ps) * (1 - np.mean(ps)) / (c["n"] * len(ps)))
        assert abs(check["sampled pass@1"] - check["exact pass@1"]) < 5 * se + 0.02  # sampling
    md = (out / "see_it_happen_confirmation_quick.md").read_text()
    assert len(re.findall(r"[+-]\d\.\d+ \[[+-]\d\.\d+, [+-]\d\.\d+\]", md)) > 100
    for key, res in summary["conditions"].items():
        for by_metric in res["frontier"].values():
            for metric, c in list(by_metric.items())[1:]:  # pass@1: 0 by construction
                digits = 4 if metric.startswith("pass@") else 3
                for s in [c["gap"], *c["by_level"]]:  # None: no seed matched (--quick)
                    if s is not None and s["lo"] is not None:
                        assert f"{s['mean']:+.{digits}f} [{s['lo']:+.{digits}f}, " \
                               f"{s['hi']:+.{digits}f}]" in md, (key, metric)
        for arm, row in res["arms"].items():  # the rare share along every run, as it rounds it
            assert f"| {arm} | " + " | ".join(f"{r:.3f}" for r in row["rare share by step"]) in md
    if importlib.util.find_spec("matplotlib"):
        for suffix in ("", "_mechanism"):
            assert (out / f"see_it_happen_confirmation_quick{suffix}.png").stat().st_size > 10_000


def test_two_strategy_expected_update_and_objective(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    two = importlib.import_module("two_strategy")
    for n, p, gamma in ((6, 0.3, 0.0), (6, 0.8, 1.0), (5, 0.5, 0.5)):  # all 2^n reward patterns
        total = 0.0
        for m in range(2 ** n):
            r = [(m >> j) & 1 for j in range(n)]
            x = sum(r)
            if 0 < x < n:
                std = math.sqrt((x * (n - x) / n) / (n - 1))  # unbiased, as verl
                a_plus = (1 - x / n) / (std + 1e-6) * (1 - x / n) ** gamma
                total += p ** x * (1 - p) ** (n - x) * a_plus * x  # each correct sample's share
        assert abs(two.prompt_weight(p, n, gamma) / (total / (n * p * (1 - p))) - 1) < 1e-6  # fp32
    assert abs(two.prompt_weight(0.3, 4096, 1.0) / two.prompt_weight(0.3, None, 1.0) - 1) < 2e-3
    for p in (0.1, 0.5, 0.9):
        assert abs(two.objective(p, 0.0) - 2 * math.asin(math.sqrt(p))) < 1e-9
        assert abs(two.objective(p, 0.5) - 2 * math.sqrt(p)) < 1e-9
        assert abs(two.objective(p, 1.0) - math.asin(math.sqrt(p)) - math.sqrt(p * (1 - p))) < 1e-9
    assert two.edge_optimum("tie", gamma=0.0) is None and two.edge_optimum("rare", gamma=0.0) == 1.0
    grid = [i / 1000 for i in range(1, 1000)]
    for gamma in (0.5, 1.0):  # a grid search of the tie mix's edge: the rare mass b it keeps
        best = max(grid, key=lambda b: two.objective(b, gamma) + two.objective(1 - b, gamma))
        assert abs(best - two.edge_optimum("tie", gamma=gamma)) < 2e-3
    mc, pred, se = two.check_expected_update(0.63, 0.04, "both", 8, 1.0, groups=20_000)
    assert ((mc - pred).abs() < 5 * se).all()  # E[update] = w_N(p) grad p, by Monte Carlo


# ---------------------------------------------------------------- experiments/two_strategy.py:
# the identity off ratio 1 with DAPO's clip, the focal weight without std normalisation
def test_expected_update_off_ratio_one_with_dapo_clip_by_monte_carlo(monkeypatch):
    # clipped_expected_update (an exact sum) against groups drawn from pi_old, scored by
    # fgrpo.group_advantages and fgrpo.policy_loss (DAPO's clip) and differentiated by autograd
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    two = importlib.import_module("two_strategy")
    old = torch.tensor([0.63, 0.04, 0.33], dtype=torch.float64)
    pi = torch.tensor([0.614, 0.0644, 0.3216], dtype=torch.float64)  # last's ratio 1.61 > 1.28
    gen = torch.Generator().manual_seed(0)
    for kind, gamma in (("both", 1.0), ("rare", 0.0)):
        clipped, unclipped = two.clipped_expected_update(old.tolist(), pi.tolist(), kind, 8, gamma)
        correct = torch.tensor(two.CORRECT[kind], dtype=torch.float64)
        p_old = float((old * correct).sum())
        z = pi.log().requires_grad_(True)
        (grad_p,) = torch.autograd.grad((torch.softmax(z, 0) * correct).sum(), z)
        assert torch.allclose(unclipped, two.prompt_weight(p_old, 8, gamma) * grad_p, atol=1e-9)
        batches = []
        for _ in range(20):  # 20 batches of 5,000 groups: the mean and its standard error
            draws = torch.multinomial(old, 5000 * 8, replacement=True, generator=gen)
            adv = fgrpo.group_advantages(correct[draws].view(5000, 8), gamma).double().flatten()
            z = pi.log().requires_grad_(True)
            logp = torch.log_softmax(z, 0)[draws][:, None]
            loss, _ = fgrpo.policy_loss(logp, old.log()[draws][:, None], adv,
                                        torch.ones_like(logp), "dapo", *fgrpo.PAPER_EPS["dapo"])
            batches.append(-torch.autograd.grad(loss, z)[0])
        mc = torch.stack(batches)
        se = mc.std(0) / math.sqrt(len(batches))
        assert ((mc.mean(0) - clipped).abs() < 5 * se + 1e-7).all(), (mc.mean(0), clipped, se)
        assert clipped[1] < unclipped[1] / 10  # the clip takes the rare answer's push away


def test_prompt_weight_without_std_normalisation(monkeypatch):
    # Dr. GRPO's advantage (R - mean R) * g(X): all 2^n reward patterns by hand; at gamma 0 the
    # weight is (N - 1) / N at every p; as N grows it tends to (1 - p)^gamma, whose integral is
    # pass@(gamma + 1) / (gamma + 1)
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    two = importlib.import_module("two_strategy")
    for n, p, gamma in ((6, 0.3, 0.0), (6, 0.8, 1.0), (5, 0.5, 0.5)):
        total = 0.0
        for m in range(2 ** n):
            x = sum((m >> j) & 1 for j in range(n))
            total += p ** x * (1 - p) ** (n - x) * x * (1 - x / n) * (1 - x / n) ** gamma
        want = total / (n * p * (1 - p))
        assert abs(two.prompt_weight(p, n, gamma, std=False) / want - 1) < 1e-6  # fp32
    for p in (0.05, 0.5, 0.95):
        assert abs(two.prompt_weight(p, 8, 0.0, std=False) - 7 / 8) < 1e-6
        for gamma in (0.5, 1.0):
            limit = two.prompt_weight(p, None, gamma, std=False)
            assert limit == (1 - p) ** gamma
            assert abs(two.prompt_weight(p, 1024, gamma, std=False) / limit - 1) < 0.02
    for n in (3, 4, 8, 16):  # gamma 1 at finite N: (N - 1) / N^2 [(N - 2)(1 - p) + 1], a positive
        for p in (0.05, 0.5, 0.9):  # mix of the slopes of pass@2 / 2 (1 - p) and pass@1 (1)
            want = (n - 1) / n ** 2 * ((n - 2) * (1 - p) + 1)
            assert abs(two.prompt_weight(p, n, 1.0, std=False) / want - 1) < 1e-6
    qs = np.linspace(0.05, 0.95, 7)  # gamma 2, N 8: a polynomial in q = 1 - p, 7/512 + 63/256 q
    ws = [two.prompt_weight(1 - q, 8, 2.0, std=False) for q in qs]  # + 105/256 q^2
    assert np.allclose(np.polyfit(qs, ws, 2)[::-1], [7 / 512, 63 / 256, 105 / 256], atol=1e-5)
    for gamma, k in ((1.0, 2), (2.0, 3)):  # the limit is the slope of pass@k / k, k = gamma + 1
        h = 1e-6
        slope = ((1 - (1 - 0.7 - h) ** k) - (1 - (1 - 0.7 + h) ** k)) / (2 * h) / k
        assert abs(two.prompt_weight(0.7, None, gamma, std=False) - slope) < 1e-6

