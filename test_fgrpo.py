"""Tests for fgrpo.py. Deterministic, CPU only: `make test`.

Expected values are computed by hand or by an independent second method,
never by replaying fgrpo's own output.
"""
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fgrpo

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
def _loss_and_grad(ratios, adv, algo, mask=None):
    """One sequence, old_logp = 0, so r_t = exp(logp_t) = ratios."""
    logp = torch.tensor([ratios]).log().requires_grad_()
    mask = torch.ones_like(logp) if mask is None else torch.tensor([mask])
    loss, stats = fgrpo.policy_loss(logp, torch.zeros_like(logp), torch.tensor([adv]), mask, algo)
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
    p = fgrpo.tail_miss_probability(N, mu_pos, tau)
    assert abs(p - p_hat) < 4 * math.sqrt(max(p * (1 - p), 1e-12) / M) + 1e-9


def test_tail_miss_probability_peak_and_errors():
    probs = {N: fgrpo.tail_miss_probability(N, 0.5, 0.05) for N in range(1, 65)}
    assert max(probs, key=probs.get) == 5
    assert probs[5] == pytest.approx(0.95 ** 5 - 0.45 ** 5 - 0.5 ** 5) and probs[5] == pytest.approx(0.724, abs=1e-3)
    for bad in [(0, 0.5, 0.1), (2.5, 0.5, 0.1), (4, 0.0, 0.0), (4, 1.2, 0.1), (4, 0.5, 0.5), (4, 0.5, 0.0)]:
        with pytest.raises(ValueError):
            fgrpo.tail_miss_probability(*bad)


def test_categorical_simulation_focal_retains_more_positive_mass_at_n8():
    # App. J in miniature (--quick: all 128k actions, T = 300, AdamW 1e-2, 2 seeds). The full
    # T = 1000 grid shows the same at N = 8 (M_ret 0.822 vs 0.691, README "Why focal weights").
    spec = importlib.util.spec_from_file_location("categorical", HERE / "experiments" / "categorical.py")
    cat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cat)
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


# ---------------------------------------------------------------- verify
def test_verify_equivalence_extraction_and_wrong_answers():
    completions = ["So the answer is \\boxed{0.5}.", "We get \\boxed{\\frac{1}{2}}", "\\boxed{\\frac{3}{4}}",
                   "first \\boxed{7}, then finally \\boxed{12}", "no box, just 12", "\\boxed{13}"]
    golds = ["\\frac{1}{2}", "0.5", "\\frac{3}{4}", "12", "12", "12"]
    assert fgrpo.verify(completions, golds) == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]


def test_answer_extraction_matches_braces():
    assert fgrpo._answer("x \\boxed{\\frac{1}{\\sqrt{2}}} y") == "\\boxed{\\frac{1}{\\sqrt{2}}}"
    assert fgrpo._answer("unclosed \\boxed{12") == "unclosed \\boxed{12"  # falls back to the tail


def test_verify_pathological_completions_score_zero_within_timeout():
    bad = ["\\boxed{9^{9^{9^{9^{9}}}}}", "junk " * 20_000, "\\boxed{" + "{" * 50_000]
    start = time.time()
    scores = fgrpo.verify(bad + ["\\boxed{4}"], ["4"] * 4, timeout=2.0)
    elapsed = time.time() - start
    assert scores == [0.0, 0.0, 0.0, 1.0]  # and the pool still works after a kill
    assert elapsed < 2.0 * len(bad) + 10  # each costs at most about the timeout; generous margin


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


@pytest.mark.parametrize("argv,message", [
    (["--gamma", "-1"], "--gamma must be >= 0"),
    (["--algo", "ppo"], "invalid choice: 'ppo'"),
    (["--prompts", "10", "--mini-batch", "4"], "does not divide"),
    (["--n", "1"], "--n must be >= 2"),
])
def test_bad_flags_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        fgrpo.parse_args(["--model", "tiny", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


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
def _run(out, *flags, wait=True):
    cmd = [sys.executable, str(HERE / "fgrpo.py"), "--model", "tiny", "--out", str(out), *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE)
    if wait:
        stdout = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, stdout
        return stdout
    return proc


def _metrics(out):
    return [NOT_TIME(json.loads(line)) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_kill_and_resume_continues_exactly(tmp_path):
    K = 2
    flags = ["--steps", str(2 * K), "--save-every", str(K), "--prompts", "8", "--mini-batch", "2"]
    _run(tmp_path / "straight", *flags)
    proc = _run(tmp_path / "killed", *flags, wait=False)
    while not (tmp_path / "killed" / "latest").exists():
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up
    proc.communicate()
    _run(tmp_path / "killed", *flags, "--resume")
    straight, resumed = _metrics(tmp_path / "straight"), _metrics(tmp_path / "killed")
    assert [m["step"] for m in resumed] == list(range(1, 2 * K + 1))
    assert resumed == straight
    ckpt = tmp_path / "killed" / (tmp_path / "killed" / "latest").read_text()
    assert (ckpt / "model.safetensors").exists() and ckpt.name == f"step_{2 * K:06d}"


def test_demo_learns(tmp_path):
    # The demo's command, cut to 60 of its 150 steps. Measured on 2 cores, seed 0 (the same with
    # 1 or 2 torch threads): reward 0.066 at step 1, mean 0.811 over steps 51-60; held-out pass@1
    # 0.107 -> 0.846. The thresholds leave a margin for platform-level numeric drift.
    stdout = _run(tmp_path, "--algo", "dapo", "--gamma", "1", "--steps", "60")
    rewards = [m["reward"] for m in _metrics(tmp_path)]
    assert rewards[0] <= 0.3
    assert sum(rewards[-10:]) / 10 >= 0.6
    before, after = (float(line.split()[2]) for line in stdout.splitlines() if "held-out pass@1" in line)
    assert before <= 0.3 and after >= 0.6
