"""F-GRPO inside verl's and TRL's trainers (integrations/), run by their own code."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fgrpo

ROOT = Path(__file__).resolve().parent.parent  # the repository


# -------------------------------------------------------------- issue 28: verl's and TRL's trainers
# integrations/verl_fgrpo.py and integrations/trl_fgrpo.py, run by verl 0.9.1's and TRL 1.16.0's own
# code: verl from the scratch folder `make parity-deps` fills (FGRPO_PARITY_DEPS), TRL from this
# environment (requirements.txt). Where one is missing its tests are skipped, saying how to add it.
PARITY_DEPS = os.environ.get("FGRPO_PARITY_DEPS", "/tmp/fgrpo-parity-deps")


@pytest.fixture(scope="module")
def verl():
    """verl's core_algos, as bench/parity.py imports it, and integrations.verl_fgrpo beside it."""
    if not (Path(PARITY_DEPS) / "verl").is_dir():
        pytest.skip(f"verl is not in {PARITY_DEPS}: make parity-deps PARITY_DEPS={PARITY_DEPS}")
    from math_verify import parse, verify  # antlr4 4.13 in this process, as in a whole run
    half = parse("$\\frac{1}{2}$")
    sys.path.insert(0, str(ROOT / "bench"))  # bench/parity.py imports bench/common.py
    try:
        import parity
        core_algos = parity.import_verl(PARITY_DEPS)[0]  # omegaconf's antlr4 4.9.3 beside it
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert verify(half, parse("$0.5$"))  # and math-verify's still parses LaTeX
    if not hasattr(sys.modules["ray"], "__path__"):  # parity's stub: out again, verl keeps its name
        del sys.modules["ray"]
    from omegaconf import OmegaConf
    from integrations import verl_fgrpo
    return core_algos, verl_fgrpo, OmegaConf


def _verl_batch(seed, sizes, bonus):
    """verl's inputs for groups of `sizes` rollouts, rows shuffled so that a group's rows lie apart:
    0/1 correctness (+ `bonus` on every row: a format reward), each on its response's last token
    of a ragged mask, and verl's uid per row. -> (token_rewards, mask, index, rows, correct)"""
    gen = torch.Generator().manual_seed(seed)
    rate = torch.tensor([1.0, 0.0] + [0.5] * (len(sizes) - 2))  # one all right, one all wrong
    correct = [(torch.rand(n, generator=gen) < rate[k]).float() for k, n in enumerate(sizes)]
    order = torch.randperm(sum(sizes), generator=gen)  # batch row of the j-th rollout overall
    rows = list(order.split(list(sizes)))
    lengths = torch.randint(1, 7, (sum(sizes),), generator=gen)
    mask = (torch.arange(6) < lengths[:, None]).float()
    token_rewards = torch.zeros_like(mask)
    index = np.empty(sum(sizes), dtype=object)
    for k, (r, c) in enumerate(zip(rows, correct)):
        token_rewards[r, lengths[r] - 1] = c + bonus
        index[r.numpy()] = f"prompt-{k}"
    return token_rewards, mask, index, rows, correct


@pytest.mark.parametrize("std", [True, False])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_verl_fgrpo_estimator_equals_group_advantages(verl, gamma, std):
    core_algos, verl_fgrpo, omegaconf = verl
    estimator = core_algos.get_adv_estimator_fn("fgrpo")  # what verl's trainer looks up
    assert estimator is verl_fgrpo.compute_fgrpo_outcome_advantage
    for bonus, above in ((0.0, None), (0.1, 0.5)):  # 0/1 rewards; a format bonus, correct > 0.5
        token_rewards, mask, index, rows, correct = _verl_batch(0, (5, 5, 5, 3, 5, 4), bonus)
        config = omegaconf.create({"adv_estimator": "fgrpo", "focal_gamma": gamma,
                                   "norm_adv_by_std_in_grpo": std})
        if above is not None:
            config.focal_correct_above = above
        got, returns = estimator(token_rewards, mask, index, config=config)  # as verl calls it
        want = torch.zeros(len(mask))
        for r, c in zip(rows, correct):  # one group at a time, uneven sizes
            a = fgrpo.group_advantages((c + bonus)[None], gamma, correct=c[None])[0]
            want[r] = a if std else a * ((c + bonus).std() + 1e-6)
        assert torch.allclose(got, want[:, None] * mask, atol=1e-6), (bonus, got[:, -1])
        assert torch.equal(got, returns)
        if gamma == 0:  # F-GRPO at gamma 0 is verl's GRPO, bit for bit
            grpo = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, index,
                                                             norm_adv_by_std_in_grpo=std)[0]
            assert torch.equal(got, grpo)
    with pytest.raises(ValueError, match=r"\+algorithm.focal_gamma"):
        estimator(token_rewards, mask, index, config=omegaconf.create({}))


def _accuracy(completions, answer, **kwargs):  # TRL's reward-function signature
    return [float(f"\\boxed{{{a}}}" in c) for c, a in zip(completions, answer)]


def _format_bonus(completions, **kwargs):  # a format reward: right or wrong, 0.1 for \boxed{
    return [0.1 * ("\\boxed{" in c) for c in completions]


def _trl_train(tiny_saved, out, trainer_class, **focal):
    """2 steps of TRL's trainer on the tiny model, on CPU: 4 prompts x 4 rollouts a step, as TRL
    defaults otherwise (loss_type "dapo", scale_rewards "group"). -> (per step: the rewards of each
    reward function, gathered, and the advantages scored, then trained on; the final weights)"""
    import datasets
    import trl
    rows = fgrpo.load_problems(tiny_saved / "train.jsonl")[:8]
    data = datasets.Dataset.from_list([{"prompt": p["problem"], "answer": p["answer"]}
                                       for p in rows])
    args = trl.GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, seed=0, max_steps=2,
                          per_device_train_batch_size=16, num_generations=4, learning_rate=1e-3,
                          max_completion_length=6, gradient_checkpointing=False,
                          report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = trainer_class(model=str(tiny_saved / "model"), args=args, train_dataset=data,
                            reward_funcs=[_accuracy, _format_bonus], **focal)
    rewards, scored, trained = [], [], []
    calculate, score, loss = (trainer._calculate_rewards, trainer._generate_and_score_completions,
                              trainer._compute_loss)
    # the instance's methods, recording: TRL calls them through self
    trainer._calculate_rewards = lambda *a: rewards.append(calculate(*a)) or rewards[-1]
    trainer._generate_and_score_completions = lambda x: scored.append(score(x)) or scored[-1]
    trainer._compute_loss = lambda model, inputs: trained.append(inputs) or loss(model, inputs)
    trainer.train()
    advantages = [[step["advantages"] for step in steps] for steps in (scored, trained)]
    return rewards, *advantages, [p.detach().clone() for p in trainer.model.parameters()], trainer


@pytest.fixture(scope="session")  # session: skipped before the session's tiny_saved is built
def trl_trainers():
    pytest.importorskip("trl", reason="TRL is missing: make install (requirements.txt)")
    import warnings
    with warnings.catch_warnings():  # TRL looks at this environment's vLLM, never used here
        warnings.filterwarnings("ignore", "TRL currently supports vLLM versions")
        from trl import GRPOTrainer
        from integrations.trl_fgrpo import FGRPOTrainer
    return GRPOTrainer, FGRPOTrainer


def test_trl_fgrpo_trains_on_group_advantages_of_its_rewards(trl_trainers, tiny_saved, tmp_path):
    rewards, scored, trained, _, trainer = _trl_train(
        tiny_saved, tmp_path, trl_trainers[1], focal_gamma=1.0, correct_reward="_accuracy")
    assert len(scored) == 2
    weights = set()
    for step_rewards, adv, adv_trained in zip(rewards, scored, trained):
        accuracy, bonus = step_rewards.view(4, 4, 2).unbind(-1)
        # TRL's std + 1e-4 where verl and fgrpo.py add 1e-6; the focal weight from accuracy alone
        want = fgrpo.group_advantages(accuracy + bonus, 1.0, eps=1e-4, correct=accuracy)
        assert torch.allclose(adv, want.flatten(), atol=1e-6), (step_rewards, adv)
        assert torch.equal(adv_trained.sort().values, adv.sort().values)  # TRL shuffles the rows
        weights |= set(fgrpo.focal_weight(accuracy, 1.0).tolist())
        assert (bonus > 0).any()  # else correct_reward would not be needed
    assert weights - {0.0, 1.0}, "no group of mixed outcomes: the focal weight was never seen"
    # a group split across processes: 3 groups of 4 on 2 processes of 6 completions each, so
    # rows 4-7 (group 1) lie on both; by hand, 1, 3 and 0 of 4 right: g = 3/4, 1/4, 1
    from types import SimpleNamespace
    accuracy = torch.tensor([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0.0])
    trainer._all_rewards = torch.stack([accuracy, torch.full((12,), 0.1)], -1)  # as TRL gathers
    trainer.accelerator = SimpleNamespace(process_index=1)  # the second process
    assert trainer.focal_weights(6).tolist() == [0.25, 0.25, 1.0, 1.0, 1.0, 1.0]
    trainer.accelerator = SimpleNamespace(process_index=0)
    assert trainer.focal_weights(6).tolist() == [0.75] * 4 + [0.25] * 2


def test_trl_fgrpo_at_gamma_zero_is_grpo_trainer_bit_for_bit(trl_trainers, tiny_saved, tmp_path):
    plain = _trl_train(tiny_saved, tmp_path / "grpo", trl_trainers[0])
    focal = _trl_train(tiny_saved, tmp_path / "fgrpo", trl_trainers[1], focal_gamma=0.0)
    for a, b in zip(plain[:4], focal[:4]):  # rewards, advantages scored and trained on, weights
        assert len(a) == len(b) > 0 and all(torch.equal(x, y) for x, y in zip(a, b))
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(tiny_saved / "model").parameters()
    assert not all(torch.equal(p, q) for p, q in zip(base, plain[3])), "the 2 steps changed nothing"


