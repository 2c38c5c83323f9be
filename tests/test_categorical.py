"""Tests of experiments/categorical.py: Lemma 3.1's tail-miss probability against Monte Carlo,
and the App. J simulation."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent  # the repository
_spec = importlib.util.spec_from_file_location("categorical", ROOT / "experiments" /
                                              "categorical.py")
CATEGORICAL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(CATEGORICAL)


# ---------------------------------------------------------------- the theory (Lemma 3.1)
@pytest.mark.parametrize("N,mu_pos,tau", [(2, 0.5, 0.05), (5, 0.5, 0.05), (8, 0.9, 0.1),
                                          (16, 0.3, 0.02), (3, 1.0, 0.4)])
def test_tail_miss_probability_against_monte_carlo(N, mu_pos, tau):
    # draw 200,000 groups of N answers from {in E, correct not in E, wrong}; B = active and misses E
    M = 200_000
    gen = torch.Generator().manual_seed(N)
    kinds = torch.tensor([tau, mu_pos - tau, 1 - mu_pos])
    draws = torch.multinomial(kinds, M * N, replacement=True, generator=gen).view(M, N)
    hit_e, other, wrong = ((draws == c).any(-1) for c in range(3))
    p_hat = (~hit_e & other & wrong).float().mean().item()
    p = CATEGORICAL.tail_miss_probability(N, mu_pos, tau)
    assert abs(p - p_hat) < 4 * math.sqrt(max(p * (1 - p), 1e-12) / M) + 1e-9


def test_tail_miss_probability_peak_and_errors():
    probs = {N: CATEGORICAL.tail_miss_probability(N, 0.5, 0.05) for N in range(1, 65)}
    assert max(probs, key=probs.get) == 5
    assert probs[5] == pytest.approx(0.95 ** 5 - 0.45 ** 5 - 0.5 ** 5)
    assert probs[5] == pytest.approx(0.724, abs=1e-3)
    for bad in [(0, 0.5, 0.1), (2.5, 0.5, 0.1), (4, 0.0, 0.0), (4, 1.2, 0.1), (4, 0.5, 0.5),
                (4, 0.5, 0.0)]:
        with pytest.raises(ValueError):
            CATEGORICAL.tail_miss_probability(*bad)


def test_categorical_simulation_focal_retains_more_positive_mass_at_n8():
    # App. J in miniature (--quick: all 128k actions, T = 300, AdamW 1e-2, 2 seeds). The full
    # T = 1000 grid shows the same at N = 8 (M_ret 0.822 vs 0.691, docs/why-focal.md, section 7).
    cat = CATEGORICAL
    args = cat.parse_args(["--quick"])
    seeds = list(range(args.seeds))
    res = cat.simulate([8], args.gammas, seeds, args.steps, args.n_actions, args.n_correct)
    assert abs(res["initial_correct_mass"] - 0.63) < 0.01  # App. J: about 0.63
    m = res["m_ret"]
    for s in seeds:  # paired draws: gamma 0 and 1 of one seed share their uniforms
        assert 0 < m[(8, 0.0, s)] < m[(8, 1.0, s)] <= 1
    gap = sum(m[(8, 1.0, s)] - m[(8, 0.0, s)] for s in seeds) / len(seeds)
    assert gap > 0.03  # measured 0.065


