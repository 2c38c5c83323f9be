"""Tests of experiments/peers.py: each peer's advantages by hand on small groups and against its
own definition enumerated (PKPO's k-subsets, Pass@k Training's bootstrap over every k-subset), the
prompt weight w(mu) against closed forms and its figure, the sample hook that gives two peers what
they read; then the runner: its grid, its plan, Holm's adjustment by hand, the verdict rule, and
--quick (slow) with every arm on its seeds and each peer's verdict read again."""
import importlib.util
import itertools
import json
import math
import re
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import fgrpo

ROOT = Path(__file__).resolve().parent.parent  # the repository
OPTIONS = SimpleNamespace(k=4, beta=0.25, lam=0.1, gamma=1.0)  # the protocol's, as adapted
KS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@pytest.fixture
def peers(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    return importlib.import_module("peers")


def every_vector(n):
    return [list(v) for v in itertools.product((0, 1), repeat=n)]


def sample(answer, mean_logprob=0.0):  # what the two sample-reading peers read of a sample
    return SimpleNamespace(answer=answer, mean_logprob=mean_logprob)

# ---------------------------------------------------------------- against their definitions
def test_pkpo_against_every_k_subset_of_its_eq_33(peers):
    # Eq. 33 written out: s_i = 1/C(n,k) sum over the k-subsets I holding i of
    # (max_I g - max_{I minus i} g), every 0/1 vector of groups of 5 and 8 at several k
    for n, k in ((5, 2), (5, 3), (8, 2), (8, 4), (8, 8)):
        vectors = every_vector(n)
        got = peers.pkpo_advantages(torch.tensor(vectors), None, SimpleNamespace(k=k))
        for g, row in zip(vectors, got.tolist()):
            subsets = list(itertools.combinations(range(n), k))
            want = [sum(max(g[j] for j in s) - max([g[j] for j in s if j != i], default=0)
                        for s in subsets if i in s) / len(subsets) for i in range(n)]
            assert row == pytest.approx(want, abs=1e-6), (n, k, g)


def test_passk_training_against_its_bootstrap_over_every_k_subset(peers):
    # the definition the analytical form replaces: each k-subset rewarded with its max, the
    # subsets' rewards normalised by their mean and std, a response's advantage the mean over the
    # subsets that hold it
    for n, k in ((5, 2), (8, 4), (8, 3)):
        vectors = every_vector(n)
        got = peers.passk_training_advantages(torch.tensor(vectors), None, SimpleNamespace(k=k))
        for g, row in zip(vectors, got.tolist()):
            subsets = list(itertools.combinations(range(n), k))
            rewards = [max(g[j] for j in s) for s in subsets]
            mean = statistics.fmean(rewards)
            std = statistics.pstdev(rewards)
            want = [statistics.fmean((rs - mean) / (std + 1e-6)
                                     for s, rs in zip(subsets, rewards) if i in s)
                    for i in range(n)]
            assert row == pytest.approx(want, abs=1e-4), (n, k, g)

# ---------------------------------------------------------------- by hand
def test_each_peer_by_hand_on_a_group_of_four(peers):
    one = torch.tensor([[1, 0, 0, 0]])
    two = SimpleNamespace(k=2, lam=0.1)
    # PKPO at k 2: the correct one, C(3, 1) / C(4, 2) = 1/2; the wrong ones 0
    assert peers.pkpo_advantages(one, None, two).tolist() == [[0.5, 0, 0, 0]]
    # Pass@k Training at k 2: mean 1 - C(3,2)/C(4,2) = 1/2, std 1/2; correct (1 - 1/2) / (1/2),
    # wrong (1 - 1/2 - C(2,1)/C(3,1)) / (1/2) = -1/3
    got = peers.passk_training_advantages(one, None, two)
    assert got.tolist()[0] == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3], abs=1e-5)
    # W-REINFORCE: +lambda, -1
    got = peers.w_reinforce_advantages(one, None, two)
    assert got.tolist()[0] == pytest.approx([0.1, -1, -1, -1])
    # MaxRL: pass rate 1/4; (1 - 1/4) / (1/4) = 3, (0 - 1/4) / (1/4) = -1 (and the eps 1e-6)
    got = peers.maxrl_advantages(one, None, two)
    assert got.tolist()[0] == pytest.approx([3, -1, -1, -1], abs=1e-4)


def test_darling_by_hand_rewards_the_correct_answer_its_group_rarely_gives(peers):
    # answers 3, 7, 3, 5; 3 and 7 accepted: the others of another class, of 3: 2/3 for each 3,
    # 1 for the 7 and the 5; r * Div = 2/3, 1, 2/3, 0, mean 7/12
    rewards = torch.tensor([[1, 1, 1, 0]])
    samples = [sample(a) for a in "3735"]
    got = peers.darling_advantages(rewards, samples, OPTIONS)
    assert got.tolist()[0] == pytest.approx([1 / 12, 5 / 12, 1 / 12, -7 / 12])
    # the same rewards, one answer only: a correct sample's diversity is the wrong one alone
    got = peers.darling_advantages(rewards, [sample(a) for a in "3335"], OPTIONS)
    assert got.tolist()[0] == pytest.approx([1 / 3 - 1 / 4] * 3 + [-1 / 4])


def test_darling_is_its_authors_norm_in_every_group_of_8(peers):
    # their code floors Div at 0.1, which at N 8 lifts only a Div of 0: a group of one class,
    # whose samples tie. Every group of 8 over answers 0-2, answer 0 correct, against r *
    # max(Div, 0.1) minus its mean, written out with the floor
    for answers in itertools.product("012", repeat=8):
        rewards = torch.tensor([[float(a == "0") for a in answers]])
        div = [max(sum(b != a for b in answers) / 7, 0.1) for a in answers]
        shaped = [float(r) * d for r, d in zip(rewards[0], div)]
        want = [x - statistics.fmean(shaped) for x in shaped]
        got = peers.darling_advantages(rewards, [sample(a) for a in answers], OPTIONS)
        assert got.tolist()[0] == pytest.approx(want, abs=1e-6), answers


def test_unlikeliness_reward_lowers_the_likelier_correct_samples(peers):
    # mean log-probs -0.1, -2.0, -0.5, -0.3: ranks from the least likely 3, 0, 1, 2; the correct
    # ones' rewards 1 - 0.25 * rank / 4 = 0.8125, 1, 0.9375; the wrong one 0; then GRPO's
    # normalisation (unbiased std, as torch.std)
    rewards = torch.tensor([[1, 1, 1, 0]])
    samples = [sample("3", lp) for lp in (-0.1, -2.0, -0.5, -0.3)]
    shaped = [0.8125, 1.0, 0.9375, 0.0]
    mean, std = statistics.fmean(shaped), statistics.stdev(shaped)
    got = peers.unlikeliness_advantages(rewards, samples, OPTIONS).tolist()[0]
    assert got == pytest.approx([(x - mean) / (std + 1e-6) for x in shaped], abs=1e-6)
    assert got[1] > got[2] > got[0] > 0 > got[3]  # the least likely correct sample gains most
    # tied log-probs share their mean rank: the same answer, the same advantage
    tied = [sample("3", lp) for lp in (-0.5, -0.5, -2.0, -0.3)]
    got = peers.unlikeliness_advantages(rewards, tied, OPTIONS).tolist()[0]
    assert got[0] == got[1] and got[2] > got[0]
    # beta 0 is GRPO's advantage
    got = peers.unlikeliness_advantages(rewards, samples, SimpleNamespace(beta=0.0))
    assert got[0].tolist() == pytest.approx(fgrpo.group_advantages(rewards)[0].tolist(), abs=1e-6)


ZERO_WHERE_ALL_EQUAL = ["pkpo", "passk_training", "maxrl", "unlikeliness", "darling"]


@pytest.mark.parametrize("name", [*ZERO_WHERE_ALL_EQUAL, "w_reinforce"])
def test_groups_all_correct_or_all_wrong(peers, name):
    # zero where the method says so; W-REINFORCE has no baseline: +lambda and -1 as they are
    advantages = getattr(peers, f"{name}_advantages")
    rewards = torch.tensor([[1] * 8, [0] * 8])
    samples = [sample("3", -0.1 * i) for i in range(16)]
    got = advantages(rewards, samples, OPTIONS)
    if name in ZERO_WHERE_ALL_EQUAL:
        assert got.abs().max() == 0, got
    else:
        assert got.flatten().tolist() == pytest.approx([0.1] * 8 + [-1.0] * 8)
    if name == "darling":  # all correct with two answers: each is rarer than all-one-answer
        two = [sample(a) for a in "33333377"]
        assert peers.darling_advantages(rewards[:1], two, OPTIONS).abs().max() > 0

# ---------------------------------------------------------------- the prompt weight w(mu)
MUS = (0.02, 0.1, 0.3, 0.5, 0.8, 0.97)


def test_prompt_weight_against_closed_forms(peers):
    # PKPO: k (1 - mu)^(k-1), the gradient of pass@k, at any N >= k (Theorem 2's unbiasedness)
    for n, k in ((4, 2), (4, 4), (6, 3), (8, 2), (8, 4), (8, 8)):
        for mu in MUS:
            got = peers.prompt_weight(peers.pkpo_advantages, mu, n, SimpleNamespace(k=k))
            assert got == pytest.approx(k * (1 - mu) ** (k - 1), rel=1e-5), (n, k, mu)
    for mu in MUS:
        # MaxRL: N (1 - (1 - mu)^(N-1)) / mu = N sum_{j<N} (1-mu)^(j-1), by the binomial identity
        # E[1 / (1 + Bin(N-1, mu))] = (1 - (1 - mu)^N) / (N mu)
        got = peers.prompt_weight(peers.maxrl_advantages, mu, 8, OPTIONS)
        assert got == pytest.approx(8 * (1 - (1 - mu) ** 7) / mu, rel=1e-4)
        # W-REINFORCE: N (lambda + 1), the same weight for every prompt
        got = peers.prompt_weight(peers.w_reinforce_advantages, mu, 8, OPTIONS)
        assert got == pytest.approx(8 * 1.1, rel=1e-6)
        # Dr. GRPO's R_i - mean: N (1 - 1/N) = N - 1
        got = peers.prompt_weight(lambda r, s, a: fgrpo.group_advantages(r, std=False), mu, 8,
                                  OPTIONS)
        assert got == pytest.approx(7, rel=1e-6)


def test_prompt_weight_of_grpo_and_f_grpo_against_the_binomial_sum(peers):
    # GRPO with X correct of N: a correct sample (1 - X/N) / (s_X + eps), a wrong one
    # -(X/N) / (s_X + eps), s_X the unbiased std sqrt(X (N - X) / (N (N - 1))); F times
    # (1 - X/N)^gamma (Eq. 12); the other N - 1 samples hold Bin(N - 1, mu) correct ones
    n = 8

    def a(x, correct, gamma):
        if x in (0, n):
            return 0.0
        s = math.sqrt(x * (n - x) / (n * (n - 1)))
        return (1 - x / n) ** gamma * (int(correct) - x / n) / (s + 1e-6)

    def binom(j, mu):
        return math.comb(n - 1, j) * mu ** j * (1 - mu) ** (n - 1 - j)
    for gamma in (0.0, 0.5, 1.0):
        args = peers.fgrpo_args(gamma=gamma)  # fgrpo's own args: every flag its hook may read
        for mu in MUS:
            want = n * sum(binom(j, mu) * (a(j + 1, True, gamma) - a(j, False, gamma))
                           for j in range(n))
            got = peers.prompt_weight(fgrpo.Hooks().advantages, mu, n, args)
            assert got == pytest.approx(want, rel=1e-5), (gamma, mu)


def test_prompt_weight_of_passk_training_is_zero_where_n_minus_k_always_pass(peers):
    # at mu near 1 nearly every group has under k wrong, where every advantage is 0: w -> 0; a
    # prompt it weighs less than GRPO's everywhere above mu 1/2 here
    for mu in (0.6, 0.8, 0.95):
        got = peers.prompt_weight(peers.passk_training_advantages, mu, 8, OPTIONS)
        grpo = peers.prompt_weight(fgrpo.Hooks().advantages, mu, 8, peers.fgrpo_args(gamma=0.0))
        assert 0 < got < grpo
    assert peers.prompt_weight(peers.passk_training_advantages, 0.999, 8, OPTIONS) < 1e-3

def test_weights_figure_draws_prompt_weight_itself(peers, tmp_path, monkeypatch):
    # each line is prompt_weight at its x-data, with the protocol's options; arms with one
    # advantages function and one gamma share a line; the two sample-reading peers have none
    grpo = fgrpo.Hooks().advantages
    arms = {"dapo, grpo, cispo": (grpo, 0.0), "f_dapo, f_cispo": (grpo, 1.0), "f_grpo": (grpo, 0.5),
            "pkpo": (peers.pkpo_advantages, 0.0),
            "w_reinforce": (peers.w_reinforce_advantages, 0.0),
            "passk_training": (peers.passk_training_advantages, 0.0),
            "maxrl": (peers.maxrl_advantages, 0.0)}
    mus = [0.03, 0.5, 0.9]
    want = {label: [peers.prompt_weight(adv, mu, 8, peers.fgrpo_args(k=4, lam=0.1, gamma=gamma))
                    for mu in mus] for label, (adv, gamma) in arms.items()}
    assert peers.weight_curves(mus) == want
    marks = peers.toy_mus()  # the confirmation's base models: rare near 0, the others near 1
    assert marks["rare"] < 0.1 and 0.8 < marks["common"] < marks["both"] < 1
    monkeypatch.setattr(peers, "WEIGHT_MUS", mus)
    figure = peers.weights_figure(tmp_path / "w.png", marks)
    if importlib.util.find_spec("matplotlib") is None:
        assert figure is None
        return
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    assert {label: list(lines[label].get_ydata()) for label in want} == want
    assert all(list(lines[label].get_xdata()) == mus for label in want)
    assert figure.axes[0].get_yscale() == "log" and (tmp_path / "w.png").stat().st_size > 0

# ---------------------------------------------------------------- the sample hook
def test_sample_for_peers_gives_the_old_mean_logprob_and_the_answer(peers):
    model, tok, _, _ = fgrpo.build_tiny(0, warm_steps=0)
    model.eval()
    args = fgrpo.parse_args(["--model", "tiny", "--max-new-tokens", "6"])
    prompts = ["(39147)=", "(52860)="]
    samples = peers.sample_for_peers(model, tok, None, prompts, 3, args, seed=1)
    assert len(samples) == 6 and samples[0].prompt_ids == samples[2].prompt_ids
    for s in samples:  # one (prompt, completion) at a time, a plain forward: log_softmax
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logp = model(ids).logits[0, :-1].log_softmax(-1)
        rows = range(len(s.prompt_ids) - 1, ids.shape[1] - 1)
        want = statistics.fmean(float(logp[t, ids[0, t + 1]]) for t in rows)
        assert s.mean_logprob == pytest.approx(want, abs=1e-4)
        text = tok.decode(s.completion_ids, skip_special_tokens=True)
        assert s.answer == peers.answer_of(text)
    assert peers.answer_of("\\boxed\\boxed{7}") == "7" and peers.answer_of("no box ") == "no box"

# ---------------------------------------------------------------- the runner and its reading
def test_holm_by_hand(peers):
    # m = 4: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04; then the
    # running maximum 0.02, 0.03, 0.06, 0.06, each back in its place
    assert peers.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # 0.01, 0.02, 0.03: 0.03, 0.04, 0.04, all under 0.05 (Bonferroni's 0.03, 0.06, 0.09 are not)
    assert peers.holm([0.03, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    # capped at 1; a test not made (None) counts as p = 1 and stays in the family: m is 3
    assert peers.holm([0.3, None, 0.001]) == pytest.approx([0.6, 1.0, 0.003])
    assert peers.holm([0.02, 0.02]) == pytest.approx([0.04, 0.04]) and peers.holm([]) == []


def test_verdict_is_the_protocols_rule_as_amended(peers):
    assert peers.PROTOCOL["primary"]["verdicts"] == ["F above", "P above", "no difference shown"]
    assert peers.AMENDMENT["primary"]["verdicts"][:3] == peers.PROTOCOL["primary"]["verdicts"]
    assert peers.verdict({"mean": -0.01, "n": 10}, 0.01, 0.05) == "F above"
    assert peers.verdict({"mean": 0.02, "n": 9}, 0.05, 0.05) == "P above"  # rejects at p <= alpha
    assert peers.verdict({"mean": 0.02, "n": 10}, 0.051, 0.05) == "no difference shown"
    assert peers.verdict({"mean": -0.3, "n": 2}, 0.2, 0.05) == "no difference shown"  # any mean
    # no seed matched, or one (no test): no comparison happened; the frozen rule's text said "no
    # difference shown" here, the amendment's says so
    assert peers.verdict(None, 1.0, 0.05) == "not comparable at matched pass@1"
    assert peers.verdict({"mean": 0.1, "n": 1}, 1.0, 0.05) == "not comparable at matched pass@1"


def test_the_protocols_design_is_see_it_happens_or_it_refuses_to_run(peers, monkeypatch):
    see = importlib.import_module("see_it_happen")
    assert peers.design_differences(peers.DESIGN, see.DESIGN) == []
    peers.check_protocol()
    monkeypatch.setitem(peers.DESIGN, "steps", 48)
    assert peers.design_differences(peers.DESIGN, see.DESIGN) == ["steps"]
    with pytest.raises(SystemExit, match="steps differ"):
        peers.check_protocol()
    monkeypatch.setitem(peers.DESIGN, "steps", see.DESIGN["steps"])
    monkeypatch.setitem(peers.ARMS, "new", {"algo": "dapo", "gamma": 0.0, "peer": "ds_grpo"})
    with pytest.raises(SystemExit, match="ds_grpo"):
        peers.check_protocol()


def test_each_seed_runs_its_arms_at_every_lr_a_peer_with_its_hooks(peers, tmp_path):
    toy = peers.toy_args(peers.parse_args(["--work", str(tmp_path)]))
    for key in set(peers.DESIGN) - {"start", "mix", "protocol"}:  # the protocol's design
        assert getattr(toy, key) == peers.DESIGN[key], key
    assert toy.seed_sets == {"all": list(range(20, 30)), "base": list(range(20, 25))}
    assert peers.seed_arms(24, toy) == list(peers.ARMS)
    base_only = {"grpo", "f_grpo", "cispo", "f_cispo"}
    assert peers.seed_arms(25, toy) == [a for a in peers.ARMS if a not in base_only]
    runs = peers.arm_runs("unlikeliness", peers.ARMS["unlikeliness"], toy)
    assert [r["lr"] for r in runs] == peers.DESIGN["lrs"]
    assert runs[0]["name"] == "unlikeliness_lr3e-05"
    assert runs[0]["hooks"] == {"sample": peers.sample_for_peers,
                                "advantages": peers.unlikeliness_advantages}
    assert runs[0]["options"] == {"peer": "unlikeliness", "beta": 0.25}
    f_grpo = peers.arm_runs("f_grpo", peers.ARMS["f_grpo"], toy)[1]
    assert (f_grpo["algo"], f_grpo["gamma"], f_grpo["hooks"], f_grpo["options"]) == ("grpo", 0.5,
                                                                                      {}, {})
    assert peers.f_pairs() == [("grpo", "f_grpo"), ("cispo", "f_cispo")]


def test_plan_counts_the_protocols_runs_and_runs_nothing(peers, tmp_path, capsys):
    assert peers.main(["--plan", "--work", str(tmp_path / "w")]) is None
    printed = capsys.readouterr().out
    assert not (tmp_path / "w").exists()
    assert peers.PROTOCOL["budget"]["runs"] == 8 * 4 * 10 + 4 * 4 * 5  # [budget]'s own count
    assert "400 runs of 96 steps and 10 warm starts" in printed and "166 CPU-min" in printed
    toy = peers.toy_args(peers.parse_args(["--quick", "--work", str(tmp_path)]))
    assert peers.plan(toy)[1] == 8 * 2 * 3 + 4 * 2 * 2 and toy.quick and toy.steps == 4


def test_the_amendment_runs_its_own_arms_and_refuses_to_change_the_grids(peers, tmp_path,
                                                                         monkeypatch):
    toy = peers.toy_args(peers.parse_args(["--amendment", "--work", str(tmp_path)]))
    assert toy.arms == peers.AMENDMENT["arms"] and toy.seed_sets["all"] == list(range(20, 30))
    assert set(toy.arms) == {"pkpo_k2", "passk_training_k2", "f_dapo", "dapo"}
    assert peers.plan(toy)[1] == peers.AMENDMENT["budget"]["runs"] == 4 * 4 * 10
    assert [r["options"] for r in peers.arm_runs("pkpo_k2", toy.arms["pkpo_k2"], toy)] == [
        {"peer": "pkpo", "k": 2}] * 4
    assert peers.seed_arms(29, toy) == list(peers.AMENDMENT["arms"])
    with pytest.raises(SystemExit, match="peers.json is missing"):
        peers.main(["--amendment", "--work", str(tmp_path), "--out", str(tmp_path / "none")])
    monkeypatch.setitem(peers.AMENDMENT["arms"], "f_dapo", {**peers.ARMS["f_dapo"], "gamma": 0.5})
    with pytest.raises(SystemExit, match="f_dapo differ"):
        peers.check_protocol()


def test_the_committed_page_is_its_results_files_read_again(peers):
    # experiments/results/peers.md is a function of peers.json and peers_amendment.json alone
    results = ROOT / "experiments" / "results"
    grid, amendment = (json.loads(p.read_text()) for p in peers.result_paths(results, False))
    figure = "peers_tradeoff.png"
    assert peers.markdown(grid, amendment, figure) == (results / "peers.md").read_text()
    assert (results / figure).exists()


def test_quick_never_writes_into_experiments_results(peers):
    with pytest.raises(SystemExit):
        peers.parse_args(["--quick", "--out", str(ROOT / "experiments" / "results")])
    args = peers.parse_args(["--quick", "--work", "/tmp/x"])
    assert args.out == Path("/tmp/x_quick/results")
    assert peers.parse_args([]).out == ROOT / "experiments" / "results"  # a real run's page


@pytest.mark.slow
def test_peers_quick_holds_every_arm_on_its_seeds_and_a_verdict_per_peer(peers, tmp_path):
    # --quick: every arm of the protocol on its seeds (3 and 2 here), see_it_happen's miniature
    # sizes, the whole reading; then again, which reads every arm from its cache
    committed = sorted((ROOT / "experiments" / "results").iterdir())
    hooks = fgrpo.Hooks()
    argv = ["--quick", "--workers", "1", "--work", str(tmp_path / "w")]
    first = peers.main(argv)
    out = tmp_path / "w_quick" / "results"
    saved = json.loads((out / "peers_quick.json").read_text())
    assert fgrpo.Hooks() == hooks
    assert sorted((ROOT / "experiments" / "results").iterdir()) == committed
    sets, lrs = saved["seed_sets"], saved["config"]["lrs"]
    assert sets == {"all": [20, 21, 22], "base": [20, 21]} and len(lrs) == 2
    for s in saved["seeds"]:
        want = {f"{arm}_lr{lr:g}" for arm, spec in peers.ARMS.items()
                if s["seed"] in sets[spec["seeds"]] for lr in lrs}
        assert set(s["arms"]["rare/tie"]) == want, s["seed"]
        for record in s["arms"]["rare/tie"].values():
            assert [p["step"] for p in record["curve"]] == [2, 4]  # every 2 steps, and the last
    cached = tmp_path / "w_quick" / "rare" / "seed21" / "tie" / "passk_training_lr0.001.json"
    assert json.loads(cached.read_text())["settings"]["options"] == {"peer": "passk_training",
                                                                     "k": 4}
    _peers_reading(peers, saved["summary"], (out / "peers_quick.md").read_text())
    again = peers.main(argv)  # resumed: nothing trains, the same records (their times too)
    assert json.loads(json.dumps(again["seeds"])) == saved["seeds"]
    # the amendment: its own arms, F-DAPO's and DAPO's read from the cache the grid left (the
    # same settings), its base models the grid's; then the page from both files, and --report
    # writes the same page again from the JSON alone
    amended = peers.main(argv + ["--amendment"])
    assert set(amended["seeds"][0]["arms"]["rare/tie"]) == {
        f"{arm}_lr{lr:g}" for arm in peers.AMENDMENT["arms"] for lr in lrs}
    assert set(amended["summary"]["base_vs_grid"].values()) == {0.0}
    assert list(amended["summary"]["primary"]) == peers.AMENDMENT["primary"]["peers"]
    page = (out / "peers_quick.md").read_text()
    for title in ("The amendment's primary endpoint", "pass@1 against pass@k"):
        assert f"## {title}" in page
    assert "| pkpo_k2 vs f_dapo (amendment) | 16 |" in page
    for arm in ("pkpo_k2", "passk_training_k2", "f_dapo (amendment)", "dapo (amendment)"):
        assert re.search(rf"^\| {re.escape(arm)} \| \d+ \| [0-9.]+ \|", page, re.M), arm
    (out / "peers_quick.md").unlink()
    assert peers.main(argv + ["--report"]) is None
    assert (out / "peers_quick.md").read_text() == page


def _peers_reading(peers, summary, page):
    """Every peer's verdict by the step-down form of Holm's rule, written independently of
    peers.holm: reject in order of p while p_(j) <= alpha / (m - j + 1); and every table."""
    primary, alpha = summary["primary"], peers.PROTOCOL["primary"]["alpha"]
    assert list(primary) == peers.PROTOCOL["primary"]["peers"]
    ps = {p: 1.0 if (r["gap"] or {}).get("p_t") is None else r["gap"]["p_t"]
          for p, r in primary.items()}
    rejected = set()
    for j, p in enumerate(sorted(ps, key=ps.get)):
        if ps[p] > alpha / (len(ps) - j):
            break
        rejected.add(p)
    for p, r in primary.items():
        mean = r["gap"]["mean"] if r["gap"] else 0.0
        want = ("P above" if mean > 0 else "F above") if p in rejected else "no difference shown"
        if r["gap"] is None or r["gap"]["n"] < 2:  # no comparison happened
            want = "not comparable at matched pass@1"
        assert r["verdict"] == want and f"| {p} |" in page and f"**{want}**" in page
    others = [a for a in peers.ARMS if a != "dapo"]
    assert list(summary["minus_dapo"]) == others and list(summary["top_pass1"]) == list(peers.ARMS)
    assert all(list(g) == [f"pass@{k}" for k in KS] for g in summary["minus_dapo"].values())
    assert list(summary["f_minus_base"]) == ["f_grpo - grpo", "f_cispo - cispo"]
    assert list(summary["mechanism"]) == ["dapo", "f_dapo"]
    assert set(summary["prompt_weight"]["w"]) == set(peers.ARMS) - {"unlikeliness", "darling"}
    for title in ("The primary endpoint", "Every arm minus DAPO", "Top pass@1", "The mechanism",
                  "F minus base", "The prompt weight"):
        assert f"## {title}" in page


# ---------------------------------------------------------------- pass@1 against pass@k
@pytest.fixture
def tradeoff(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    return importlib.import_module("tradeoff")


def path(*points, listed=1.0):  # a run: step 0 (the base model), then (pass@1, pass@16) points
    start = {"pass@1": 0.0, "pass@16": 1.0, "listed": 1.0}  # never a frontier point
    return [start] + [{"pass@1": x, "pass@16": v, "listed": listed} for x, v in points]


def test_frontier_is_the_best_pass_k_at_pass_1_at_least_p(tradeoff):
    pts = tradeoff.arm_points([path((0.5, 0.9), (0.6, 0.8)), path((0.7, 0.85)),
                               path((0.9, 0.99), listed=0.5)], "pass@16")  # broken: left out
    assert pts == [(0.5, 0.9), (0.6, 0.8), (0.7, 0.85)]  # step 0 is the base model, left out
    assert [tradeoff.frontier(pts, p) for p in (0.4, 0.5, 0.55, 0.65, 0.7, 0.71)] == [
        0.9, 0.9, 0.85, 0.85, 0.85, None]
    assert tradeoff.reach(pts) == (0.5, 0.7) and tradeoff.reach([]) is None
    assert tradeoff.ended([[path((0.5, 0.9), (0.6, 0.8)), path((0.7, 0.85))], []],
                          "pass@16") == pytest.approx(0.825)  # the last steps, seeds that ran


def test_pair_by_hand_where_ranges_overlap_and_where_they_do_not(tradeoff):
    a = [[(0.60, 0.90), (0.70, 0.85)], [(0.5, 0.7)], [(0.6, 0.8), (0.7, 0.7)], []]
    b = [[(0.65, 0.95), (0.75, 0.80)], [(0.8, 0.9)], [(0.6, 0.9), (0.7, 0.75)], [(0.6, 0.9)]]
    # seed 1: shared 0.65-0.70; B's frontier is 0.95 at 0.65, 0.80 above it; A's 0.85 throughout:
    # +0.10 at one point of 11, -0.05 at ten. Seed 2: B's range lies above A's. Seed 3: shared
    # 0.6-0.7, +0.1 at 0.6 and +0.05 above it, B at least A everywhere. Seed 4: A never ran.
    assert tradeoff.shared_levels(a[0], b[0])[0] == 0.65 and len(
        tradeoff.shared_levels(a[0], b[0])) == tradeoff.SHARED == 11
    r = tradeoff.pair(a, b)
    gaps = [(0.10 - 10 * 0.05) / 11, (0.10 + 10 * 0.05) / 11]
    assert r["overlap"] == 2 and r["gap"]["mean"] == pytest.approx(statistics.fmean(gaps))
    assert (r["b_at_least_a"], r["a_at_least_b"], r["b_range_above"], r["a_range_above"]) == (
        1, 0, 1, 0)
    swapped = tradeoff.pair(b, a)
    assert swapped["gap"]["mean"] == pytest.approx(-r["gap"]["mean"])
    assert (swapped["a_at_least_b"], swapped["a_range_above"]) == (1, 1)


def test_mean_frontier_only_where_every_seed_has_one(tradeoff):
    seeds = [[(0.50, 0.9), (0.60, 0.8)], [(0.55, 0.7), (0.58, 0.6)], []]
    curve = tradeoff.mean_frontier(seeds)
    assert min(curve) == 0.5 and max(curve) == 0.58  # from the lowest visited to the lowest top
    assert curve[0.5]["mean"] == pytest.approx((0.9 + 0.7) / 2) and curve[0.5]["n"] == 2
    assert curve[0.56]["mean"] == pytest.approx((0.8 + 0.6) / 2)
    # the t interval of two values a, b: mean -/+ t(0.975, 1) |a - b| / 2 (t = 12.706)
    assert curve[0.56]["hi"] - curve[0.56]["mean"] == pytest.approx(12.706 * 0.1, rel=1e-4)
    assert tradeoff.summary(seeds) == pytest.approx(
        {"seeds": 2, "low": 0.525, "top": 0.59, "best": 0.8})
