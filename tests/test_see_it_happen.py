"""Tests of experiments/see_it_happen.py and experiments/two_strategy.py: every reported figure
recomputed by other code, the exact update's advantages by hand."""
import importlib.util
import json
import math
import re
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fgrpo

ROOT = Path(__file__).resolve().parent.parent  # the repository


# ---------------------------------------------------------------- experiments/see_it_happen.py
# Recomputed here by other code than the experiment's: loops, dense sampling of the frontiers,
# scipy's t distribution and a brute-force Wilcoxon over all sign patterns.
def _see_metrics(point, base, shares, k):
    p_kind = {"both": [f + l for f, l in zip(point["first"], point["last"])],
              "rare": point["last"], "common": point["first"]}
    out = {"pass@1": 0.0, f"pass@{k}": 0.0}
    for kind, ps in p_kind.items():
        out["pass@1"] += shares[kind] * sum(ps) / len(ps)
        out[f"pass@{k}"] += shares[kind] * sum(1 - (1 - p) ** k for p in ps) / len(ps)
    out[f"rare pass@{k}"] = sum(1 - (1 - p) ** k for p in point["last"]) / len(point["last"])
    out["rare mass"] = sum(point["last"]) / len(point["last"])
    out["common mass"] = sum(point["first"]) / len(point["first"])
    out["wrong mass"] = sum(point["wrong"]) / len(point["wrong"]) / 8  # 10 digits - first, last
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


def _see_front(paths, t, k):  # dense sampling of every segment: within |dy| / 4000 of exact
    ys = [a[f"pass@{k}"] + s / 4000 * (b[f"pass@{k}"] - a[f"pass@{k}"]) for path in paths
          for a, b in zip(path, path[1:]) for s in range(4001)
          if a["pass@1"] + s / 4000 * (b["pass@1"] - a["pass@1"]) >= t - 1e-12]
    return max(ys)


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


def _see_compare(traj, key, base_arms, arms, want, count, k):
    """One seed at a time: from its base model's pass@1 to the lower of the two ceilings, `count`
    levels (the base point left out); the gaps per level and their mean, paired over seeds."""
    gaps, tops = [], []
    for t, levels_want in zip(traj, want["levels"]):
        a, b = [t[key][x] for x in base_arms], [t[key][x] for x in arms]
        tops.append([max(p["pass@1"] for path in g for p in path) for g in (a, b)])
        lo, hi = a[0][0]["pass@1"], min(tops[-1])
        levels = [lo + (hi - lo) * i / count for i in range(1, count + 1)] if hi > lo else []
        assert np.allclose(levels, levels_want, rtol=0, atol=1e-12)
        assert len(levels_want) in (0, count)
        gaps.append([_see_front(b, x, k) - _see_front(a, x, k) for x in levels])
    assert np.allclose(np.mean(tops, axis=0), want["ceilings"], rtol=0, atol=1e-12)
    _see_paired([b - a for a, b in tops], want["ceiling"])
    matched = [g for g in gaps if g]
    assert want["unmatched"] == len(gaps) - len(matched)
    for j in range(count if matched else 0):
        _see_paired([g[j] for g in matched], want["by_level"][j], tol=1e-4)
    if matched:
        _see_paired([np.mean(g) for g in matched], want["gap"], tol=1e-4)
    return [np.mean(g) for g in matched]


@pytest.mark.slow
def test_see_it_happen_quick_figures_match_an_independent_recomputation(tmp_path, monkeypatch):
    # --quick: 2 seeds x 2 warm starts, DAPO at 2 lrs x gamma 0 and 1, N 8 and the exact update,
    # eval.py's cross-check; all through fgrpo.train. Every reported figure is recomputed.
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    see = importlib.import_module("see_it_happen")
    assert see.answer_set_verify(["\\boxed{7}", "\\boxed{3}\\boxed{0}", "7", "\\boxed{ 7 }"],
                                 ["0, 7"] * 4) == [1.0, 1.0, 0.0, 1.0]  # the last box, after strip
    touched = ("verify", "run_step", "rollout", "group_advantages")
    before = [getattr(fgrpo, n) for n in touched], signal.getsignal(signal.SIGTERM)
    vllm = sys.modules.get("vllm", "absent")
    out = tmp_path / "out"
    res = see.main(["--quick", "--workers", "1", "--out", str(out), "--work", str(tmp_path / "w")])
    assert ([getattr(fgrpo, n) for n in touched], signal.getsignal(signal.SIGTERM)) == before
    assert sys.modules.get("vllm", "absent") is vllm  # put back as they were
    saved = json.loads((out / "see_it_happen_quick.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(res["summary"]))
    cfg, seeds, summary = saved["config"], saved["seeds"], saved["summary"]
    shares = {"tie": {"both": 0.6, "rare": 0.2, "common": 0.2},
              "rare": {"both": 0.6, "rare": 0.4, "common": 0.0}}
    traj = [{key: {arm: [{"step": p["step"], **_see_metrics(p, s["base"][key],
                                                            shares[key.split("/")[1]], cfg["k"])}
                         for p in [{"step": 0, **s["base"][key]}] + rec["curve"]]
                   for arm, rec in arms.items()} for key, arms in s["arms"].items()} for s in seeds]
    _see_check_seeds(seeds, cfg)
    assert list(summary["conditions"]) == ["strategy/tie", "floor/tie"]
    for key, want in summary["conditions"].items():
        _see_check_condition(traj, seeds, key, want, cfg)
    _see_report(out, summary, seeds, Path(cfg["work"]), cfg)  # --quick's own work folder
    md = (out / "see_it_happen_quick.md").read_text()
    see.main(["--quick", "--report-only", "--out", str(out)])  # the report again, from the JSON
    assert (out / "see_it_happen_quick.md").read_text() == md


def _see_check_seeds(seeds, cfg):
    steps = [s for s in range(1, cfg["steps"] + 1)
             if s % cfg["measure_every"] == 0 or s == cfg["steps"]]
    for s in seeds:  # the warm start uses the prompt: each digit's mass varies over prompts
        for key, base in s["base"].items():
            assert 0.45 < np.mean(base["first"]) < 0.8 and 0.01 < np.mean(base["last"]) < 0.2
            assert sorted(base["digit_cv"])[5] > 0.5 and base["listed"] > 0.95  # median
            for p in [base] + [p for rec in s["arms"][key].values() for p in rec["curve"]]:
                listed = [f + la + w for f, la, w in zip(p["first"], p["last"], p["wrong"])]
                assert abs(np.mean(listed) - p["listed"]) < 1e-5  # the ten digits, nothing else
            for arm, rec in s["arms"][key].items():
                assert [p["step"] for p in rec["curve"]] == steps and 0 <= rec["clip_frac"] <= 1


def _see_check_condition(traj, seeds, key, want, cfg):
    """One (warm start, mix)'s reported figures against a recomputation from the trajectories."""
    k, lrs, levels = cfg["k"], cfg["lrs"], cfg["levels"]
    name = lambda g, lr, m: f"dapo_g{g:g}_lr{lr:g}_" + (  # noqa: E731
        "exact" if m == "exact" else f"n{m}")
    base = [t[key][name(0.0, lrs[0], cfg["n"])][0] for t in traj]
    for metric, (mean, sd) in want["base"].items():
        assert abs(mean - np.mean([b[metric] for b in base])) < 1e-9, (key, metric)
        assert abs(sd - np.std([b[metric] for b in base], ddof=1)) < 1e-9
    assert set(want["base"]) == {"pass@1", f"pass@{k}", "rare mass", "wrong mass", "rare ratio"}
    arms = [name(g, lr, n) for lr in lrs for n, gs in ((cfg["n"], cfg["gammas"]),
                                                       ("exact", cfg["exact_gammas"])) for g in gs]
    assert list(want["arms"]) == arms
    for arm, row in want["arms"].items():
        paths = [t[key][arm] for t in traj]
        for metric in ("pass@1", f"pass@{k}", "rare mass", "rare ratio"):
            assert abs(row[metric] - np.mean([p[-1][metric] for p in paths])) < 1e-9
        assert abs(row["highest pass@1"] - np.mean([max(x["pass@1"] for x in p) for p in paths])) \
            < 1e-9
        by_step = [np.mean([p[i]["rare ratio"] for p in paths]) for i in range(len(paths[0]))]
        assert np.allclose(row["rare ratio by step"], by_step, rtol=1e-12, atol=0)
        assert row["broke down"] == sum(any(x["listed"] < 0.9 for x in p) for p in paths)
        assert abs(row["clip_frac"] - np.mean([s["arms"][key][arm]["clip_frac"] for s in seeds])) \
            < 1e-12
    gains = {}
    for n, gammas in ((cfg["n"], cfg["gammas"]), ("exact", cfg["exact_gammas"])):
        for g in gammas[1:]:
            sweep = [[name(x, lr, n) for lr in lrs] for x in (0.0, g)]
            gains[g, n] = _see_compare(traj, key, *sweep, want["frontier"][f"{g:g}/{n}"], levels, k)
    for g, s in want["n_minus_exact"].items():
        _see_paired([a - b for a, b in zip(gains[float(g), cfg["n"]], gains[float(g), "exact"])],
                    s, tol=2e-4)
    assert set(want["n_minus_exact"]) == {f"{g:g}" for g in cfg["gammas"][1:]
                                          if g in cfg["exact_gammas"]}


def _see_report(out, summary, seeds, work, cfg):
    k = str(cfg["k"])
    assert len(summary["check"]) == len(seeds)
    for check, s in zip(summary["check"], seeds):  # eval.py's samples against the exact pass@k
        c = s["check"]
        kinds = [json.loads(x)["kind"] for x in (work / f"heldout_{c['mix']}.jsonl").read_text()
                 .splitlines()]
        final = s["arms"][f"{c['start']}/{c['mix']}"][c["arm"]]["curve"][-1]
        ps = [final["last"][i] + final["first"][i] * (kd == "both") if kd != "common" else
              final["first"][i] for i, kd in enumerate(kinds)]
        for kk in ("1", k):
            sampled = np.mean([1 - math.comb(c["n"] - x, int(kk)) / math.comb(c["n"], int(kk))
                               for x in c["correct"]])
            assert abs(check[f"sampled pass@{kk}"] - sampled) < 1e-9
            exact = np.mean([1 - (1 - p) ** int(kk) for p in ps])
            assert abs(check[f"exact pass@{kk}"] - exact) < 1e-9
        se = math.sqrt(np.mean(ps) * (1 - np.mean(ps)) / (c["n"] * len(ps)))
        assert abs(check["sampled pass@1"] - check["exact pass@1"]) < 5 * se + 0.02  # sampling
    md = (out / "see_it_happen_quick.md").read_text()
    cis = re.findall(r"[+-]\d\.\d+ \[[+-]\d\.\d+, [+-]\d\.\d+\]", md)
    assert len(cis) > 20  # every interval the summary holds is in the report, as it rounds it
    for key, res in summary["conditions"].items():
        for c in res["frontier"].values():
            for s in [c["gap"], *c["by_level"]]:
                assert f"{s['mean']:+.4f} [{s['lo']:+.4f}, {s['hi']:+.4f}]" in md
        for arm, row in res["arms"].items():  # the rare ratio along every run, as it rounds it
            assert f"| {arm} | " + " | ".join(f"{r:.2f}" for r in row["rare ratio by step"]) in md
    if importlib.util.find_spec("matplotlib"):
        assert (out / "see_it_happen_quick.png").stat().st_size > 10_000


def test_exact_update_arm_advantages_by_hand(monkeypatch):
    # see_it_happen's N -> infinity arm: every completion of the answer space, advantage
    # scale * pi_old * (1 - p)^gamma * (R - p) / sqrt(p (1 - p)), p from the same probabilities
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    see = importlib.import_module("see_it_happen")
    model, tok, _, _ = fgrpo.build_tiny(0, warm_steps=30)
    patches, group = see.exact_update_patches(tok, 1.0)
    prompts = [see.prompt_text([3, 1, 4, 5, 9]), see.prompt_text([2, 7, 1, 8, 0])]
    samples = patches["rollout"](model, tok, None, prompts, group, None, 0)
    assert len(samples) == 2 * group and group == 30  # 10 digits x ("\\boxed{d}", 2 stutters)
    texts = tok.batch_decode([c for _, c, _ in samples], skip_special_tokens=True)
    assert texts[:3] == ["\\boxed{0}", "\\boxed\\boxed{0}", "\\boxed\\boxed\\boxed{0}"]
    golds = ["3, 9"] * group + ["8"] * group  # both kind, then a gold of neither strategy
    rewards = torch.tensor(see.answer_set_verify(texts, golds)).view(2, -1)
    adv = patches["group_advantages"](rewards, 1.0)
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


# ---------------------------------------------------------------- issue 27: see_it_happen's levels,
# the identity off ratio 1 with DAPO's clip, the focal weight without std normalisation
def test_see_it_happen_matched_levels_per_seed_by_hand(monkeypatch):
    # two arms' paths (pass@1, pass@32) in 3 seeds; each seed on its own range, from its base to
    # the lower ceiling, 2 levels, the base point left out. Frontier values by hand:
    # seed 0: top min(0.7, 0.8) = 0.7, levels 0.6, 0.7; A 0.85, 0.8; B 0.9, 0.875 -> 0.05, 0.075
    # seed 1: top min(0.6, 0.5) = 0.5, levels 0.45, 0.5; A 0.85, 0.8; B 0.89, 0.88 -> 0.04, 0.08
    # seed 2: B never rises above the base: no range, left out of the gaps
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    see = importlib.import_module("see_it_happen")

    def path(*points):
        return [{"pass@1": x, "pass@32": y} for x, y in points]

    traj = [{"s/tie": {"A": path((0.5, 0.9), (0.7, 0.8)),
                       "B": path((0.5, 0.9), (0.6, 0.9), (0.8, 0.85))}},
            {"s/tie": {"A": path((0.4, 0.9), (0.6, 0.7)), "B": path((0.4, 0.9), (0.5, 0.88))}},
            {"s/tie": {"A": path((0.5, 0.9), (0.6, 0.8)), "B": path((0.5, 0.9), (0.45, 0.95))}}]
    c = see.compare(traj, "s/tie", ["A"], ["B"], see.parse_args(["--levels", "2", "--k", "32"]))
    assert c["unmatched"] == 1 and c["levels"][2] == []
    assert np.allclose(c["levels"][:2], [[0.6, 0.7], [0.45, 0.5]], rtol=0, atol=1e-12)
    assert np.allclose(c["level_pass@1"], [0.525, 0.6])
    assert np.allclose([s["mean"] for s in c["by_level"]], [0.045, 0.0775])
    assert np.allclose(c["gaps"], [0.0625, 0.06]) and abs(c["gap"]["mean"] - 0.06125) < 1e-12
    assert np.allclose(c["ceilings"], [(0.7 + 0.6 + 0.6) / 3, (0.8 + 0.5 + 0.5) / 3])
    assert [s["n"] for s in c["by_level"]] == [2, 2] and c["gap"]["positive"] == 2


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
    for gamma, k in ((1.0, 2), (2.0, 3)):  # the limit is the slope of pass@k / k, k = gamma + 1
        h = 1e-6
        slope = ((1 - (1 - 0.7 - h) ** k) - (1 - (1 - 0.7 + h) ** k)) / (2 * h) / k
        assert abs(two.prompt_weight(0.7, None, gamma, std=False) - slope) < 1e-6

