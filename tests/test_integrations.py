"""F-GRPO inside verl's and TRL's trainers (integrations/), run by their own code."""
import importlib
import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import fgrpo

ROOT = Path(__file__).resolve().parent.parent  # the repository


# ------------------------------------------------------------------------------------------ verl
# integrations/verl_fgrpo.py run as verl 0.9.1 runs it: in a process of its own, where `import
# verl` imports the estimator through VERL_USE_EXTERNAL_MODULES, and where verl's trainer step
# computes the advantages. verl comes from the scratch folder `make parity-deps` fills
# (FGRPO_PARITY_DEPS); where it is missing these tests are skipped, saying how to add it.
PARITY_DEPS = os.environ.get("FGRPO_PARITY_DEPS", "/tmp/fgrpo-parity-deps")
# packages verl's trainer module imports that this environment lacks: only names there (Ray's
# decorators, a data loader's class, the last five's, which vLLM brings and requirements.txt
# does not), never run by the code tested, so a stand-in does
VERL_STAND_INS = ("ray", "torchdata", "peft", "transfer_queue", "hydra", "PIL", "cachetools",
                  "uvicorn", "fastapi", "aiohttp")
SIZES = (5, 5, 5, 3, 5, 4)  # six groups of uneven sizes, one all right and one all wrong
MAX_LEN, BUFFER, FACTOR = 6, 3, 1.0  # DAPO's response limit, overlong buffer and penalty factor
# where a completion counts as correct (+algorithm.focal_correct_above; None: verl's default, 0)
ABOVE = {"0/1": None, "bonus": 0.5, "continuous": 0.5, "dapo": -0.5}


class _StandIn(type):
    """A class whose every attribute and call is itself; as a decorator it returns what it
    decorates (ray.remote on a class)."""

    def __getattr__(cls, name):
        return _stand_in_attribute(name)

    def __call__(cls, *args, **kwargs):
        decorates = len(args) == 1 and not kwargs and callable(args[0])
        return args[0] if decorates else cls


STAND_IN = _StandIn("StandIn", (), {})


def _stand_in_attribute(name):
    if name.startswith("__"):  # inspect and pickle look for __file__, __spec__, ...
        raise AttributeError(name)
    return STAND_IN


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: one of VERL_STAND_INS that is not installed is a module of stand-ins;
    an installed one, and every other missing package, is found (or missing) as usual."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in VERL_STAND_INS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _stand_in_attribute
        return module

    def exec_module(self, module):
        pass


def verl_process(cases_file, out_file):
    """The verl process (run by `verl_run`): `import verl` runs verl/__init__.py, whose hook
    imports the modules VERL_USE_EXTERNAL_MODULES names; then each case's batch goes through the
    V1 trainer's advantage step (verl/trainer/ppo/v1/trainer_base.py, _compute_advantage): the KL
    penalty into the rewards where use_kl_in_reward, then compute_advantage_for_multi_trajectories,
    which hands every estimator but GRPO to ray_trainer's compute_advantage, with the algorithm
    section of verl's own config plus the case's overrides. Writes {case: advantages (B, T) or
    the error's message} and "hooked": (estimator imported before `import verl`, its module)."""
    saved = list(sys.path)  # omegaconf needs antlr4 4.9.3, from PARITY_DEPS; the rest is ours
    sys.path.insert(0, PARITY_DEPS)
    importlib.import_module("antlr4")
    sys.path[:] = saved + [PARITY_DEPS]
    sys.meta_path.append(_StandInFinder())
    before = "integrations.verl_fgrpo" in sys.modules
    import verl
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
    out = {"hooked": (before, core_algos.get_adv_estimator_fn("fgrpo").__module__)}
    config = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    defaults = OmegaConf.load(config).algorithm
    for name, case in torch.load(cases_file).items():
        algo = OmegaConf.merge(defaults, OmegaConf.from_dotlist(case["overrides"]))
        uid = np.array(case["uid"], dtype=object)  # verl's uid per row: a group's prompt
        data = verl.DataProto.from_dict(tensors=case["tensors"], non_tensors={"uid": uid})
        if algo.use_kl_in_reward:
            kl_ctrl = core_algos.get_kl_controller(algo.kl_ctrl)
            data = apply_kl_penalty(data, kl_ctrl=kl_ctrl, kl_penalty=algo.kl_penalty)[0]
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        try:
            data = compute_advantage_for_multi_trajectories(
                data, batch_keys=case["keys"], adv_estimator=algo.adv_estimator,
                gamma=algo.gamma, lam=algo.lam, num_repeat=max(SIZES),
                norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True), config=algo)
            out[name] = data.batch["advantages"]
        except ValueError as error:
            out[name] = str(error)
    torch.save(out, out_file)


def _verl_batch(kind, seed=0, turns=1):
    """A batch of one kind of reward, as verl holds it: groups of SIZES rollouts whose rows are
    shuffled through the batch, each score on its response's last token of a ragged mask, verl's
    uid per row, and V1's key per row with `turns` rows a session. kind: "0/1" correctness;
    "bonus": plus a 0.1 format reward on every answer; "continuous": a partial credit in [0, 1],
    right above 0.5; "dapo": verl's DAPO reward, +-1 plus the overlong penalty
    min(-(L - (MAX_LEN - BUFFER)) / BUFFER * FACTOR, 0).
    -> (case for verl_process, rows of each group, scores (B,), correct (B,) 0/1)"""
    gen = torch.Generator().manual_seed(seed)
    rate = torch.tensor([1.0, 0.0] + [0.5] * (len(SIZES) - 2)).repeat_interleave(
        torch.tensor(SIZES))
    correct = (torch.rand(len(rate), generator=gen) < rate).float()
    lengths = torch.randint(1, MAX_LEN + 1, (len(rate),), generator=gen)
    credit = 0.5 * (1 - torch.rand(len(rate), generator=gen))  # in (0, 0.5]
    scores = {"0/1": correct, "bonus": correct + 0.1,
              "continuous": torch.where(correct > 0, 0.5 + credit, 0.5 - credit),
              "dapo": 2 * correct - 1 + (-(lengths - (MAX_LEN - BUFFER)) / BUFFER * FACTOR).clamp(
                  max=0.0)}[kind]
    order = torch.randperm(len(rate), generator=gen)  # batch row of the j-th rollout overall
    mask = (torch.arange(MAX_LEN) < lengths[:, None]).float()
    token_scores = torch.zeros_like(mask)
    token_scores[torch.arange(len(rate)), lengths - 1] = scores
    uid = [""] * len(rate)
    keys = [""] * len(rate)
    rows = list(order.split(list(SIZES)))
    for k, group in enumerate(rows):
        for i, row in enumerate(group.tolist()):
            uid[row] = f"prompt-{k}"
            keys[row] = f"prompt-{k}_{i // turns}_{i % turns}"  # V1's {uid}_{session}_{turn}
    inverse = torch.argsort(order)  # row -> rollout
    tensors = {"token_level_scores": token_scores[inverse], "response_mask": mask[inverse]}
    case = {"tensors": tensors, "uid": uid, "keys": keys, "overrides": []}
    return case, rows, scores[inverse], correct[inverse]


def _verl_cases():
    """{name: (case, rows, rewards, correct)} for verl_process, expectations computed here."""
    cases = {}
    for kind in ABOVE:
        case, rows, scores, correct = _verl_batch(kind)
        for std in (True, False):
            setting = [f"norm_adv_by_std_in_grpo={std}"]
            for gamma in (0.0, 0.5, 1.0):
                overrides = setting + ["adv_estimator=fgrpo", f"focal_gamma={gamma}"]
                if ABOVE[kind] is not None:
                    overrides.append(f"focal_correct_above={ABOVE[kind]}")
                cases[f"fgrpo {kind} std={std} gamma={gamma}"] = (
                    {**case, "overrides": overrides}, rows, scores, correct)
            cases[f"grpo {kind} std={std}"] = (
                {**case, "overrides": setting + ["adv_estimator=grpo"]}, rows, scores, correct)
    # KL in the reward: verl subtracts kl_coef * (old_log_prob - ref_log_prob) on every token
    case, rows, scores, correct = _verl_batch("0/1", seed=1)
    gen = torch.Generator().manual_seed(1)
    mask = case["tensors"]["response_mask"]
    old, ref = torch.randn(2, *mask.shape, generator=gen)
    kl_coef = 0.001  # verl's default algorithm.kl_ctrl.kl_coef
    token_scores = case["tensors"]["token_level_scores"]
    rewards = (token_scores - kl_coef * ((old - ref) * mask)).sum(-1)  # verl's order of operations
    tensors = {**case["tensors"], "old_log_probs": old, "ref_log_prob": ref}
    for above in (None, 0.5):
        overrides = ["adv_estimator=fgrpo", "focal_gamma=1.0", "use_kl_in_reward=True",
                     f"kl_ctrl.kl_coef={kl_coef}"] + ([] if above is None else
                                                     [f"focal_correct_above={above}"])
        cases[f"kl above={above}"] = ({**case, "tensors": tensors, "overrides": overrides}, rows,
                                      rewards, correct)
    # several turns a session (an agent loop): V1's GRPO uses each session's last turn only
    case, rows, scores, correct = _verl_batch("0/1", seed=2, turns=2)
    for algo in ("fgrpo", "grpo"):
        overrides = [f"adv_estimator={algo}", "focal_gamma=0.0"]
        cases[f"turns {algo}"] = ({**case, "overrides": overrides}, rows, scores, correct)
    cases["no focal_gamma"] = ({**case, "overrides": ["adv_estimator=fgrpo"]}, rows, scores,
                               correct)
    return cases


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory):
    """(the cases of _verl_cases, verl_process's output): one verl process for every case, as a
    user runs it: this repository appended to PYTHONPATH, VERL_USE_EXTERNAL_MODULES set."""
    if not (Path(PARITY_DEPS) / "verl").is_dir():
        pytest.skip(f"verl is not in {PARITY_DEPS}: make parity-deps PARITY_DEPS={PARITY_DEPS}")
    folder = tmp_path_factory.mktemp("verl")
    cases = _verl_cases()
    torch.save({name: c[0] for name, c in cases.items()}, folder / "cases.pt")
    path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "tests"),
                                       os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
           "VERL_USE_EXTERNAL_MODULES": "integrations.verl_fgrpo"}
    code = "import sys, test_integrations as t; t.verl_process(*sys.argv[1:])"
    proc = subprocess.run([sys.executable, "-c", code, folder / "cases.pt", folder / "out.pt"],
                          env=env, cwd=folder, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cases, torch.load(folder / "out.pt")


def _want(rows, rewards, correct, gamma, std):
    """fgrpo.group_advantages one group at a time."""
    want = torch.zeros(len(rewards))
    for r in rows:
        want[r] = fgrpo.group_advantages(rewards[r][None], gamma, correct=correct[r][None],
                                         std=std)[0]
    return want


def test_verl_imports_the_estimator_by_its_hook(verl_run):
    cases, out = verl_run
    assert out["hooked"] == (False, "integrations.verl_fgrpo")  # by `import verl`, not by us
    assert "+algorithm.focal_gamma" in out["no focal_gamma"]  # the one-line error


@pytest.mark.parametrize("std", [True, False])
@pytest.mark.parametrize("kind", list(ABOVE))
def test_verl_compute_advantage_equals_group_advantages(verl_run, kind, std):
    cases, out = verl_run
    for gamma in (0.0, 0.5, 1.0):
        name = f"fgrpo {kind} std={std} gamma={gamma}"
        case, rows, scores, correct = cases[name]
        mask = case["tensors"]["response_mask"]
        want = _want(rows, scores, correct, gamma, std)
        assert torch.allclose(out[name], want[:, None] * mask, atol=1e-6), (name, out[name])
        if gamma == 0:  # single-turn: F-GRPO at gamma 0 is verl's GRPO, bit for bit
            assert torch.equal(out[name], out[f"grpo {kind} std={std}"]), name
    if kind == "dapo":  # right answers at the length limit score 1 - FACTOR = 0, wrong ones -2
        assert ((scores == 0) & (correct == 1)).any() and (scores == -2).any()


def test_verl_kl_in_the_reward_needs_a_threshold(verl_run):
    cases, out = verl_run
    case, rows, rewards, correct = cases["kl above=0.5"]
    mask = case["tensors"]["response_mask"]
    # at 0.5, kl_coef times a few nats moves no answer across: g counts the right answers
    want = _want(rows, rewards, correct, 1.0, True)
    assert torch.allclose(out["kl above=0.5"], want[:, None] * mask, atol=1e-5)
    # at verl's default 0, a wrong answer (score 0) whose KL estimate sums below 0 counts as right
    counted = (rewards > 0).float()
    assert (counted > correct).any()
    want = _want(rows, rewards, counted, 1.0, True)
    assert torch.allclose(out["kl above=None"], want[:, None] * mask, atol=1e-5)


def test_verl_fgrpo_at_gamma_zero_differs_from_grpo_with_several_turns(verl_run):
    cases, out = verl_run
    assert not torch.equal(out["turns fgrpo"], out["turns grpo"])  # docs/integrations.md


def _accuracy(completions, answer, **kwargs):  # TRL's reward-function signature
    return [float(f"\\boxed{{{a}}}" in c) for c, a in zip(completions, answer)]


def _format_bonus(completions, **kwargs):  # a format reward: right or wrong, 0.1 for \boxed{
    return [0.1 * ("\\boxed{" in c) for c in completions]


def _trl_trainer(tiny_saved, out, trainer_class, config=(), **focal):
    """TRL's trainer on the tiny model, on CPU: 4 prompts x 4 rollouts a step, 2 steps, as TRL
    defaults otherwise (loss_type "dapo", scale_rewards "group") where `config` does not say."""
    import datasets
    import trl
    rows = fgrpo.load_problems(tiny_saved / "train.jsonl")[:8]
    data = datasets.Dataset.from_list([{"prompt": p["problem"], "answer": p["answer"]}
                                       for p in rows])
    args = trl.GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, seed=0, max_steps=2,
                          per_device_train_batch_size=16, num_generations=4, learning_rate=1e-3,
                          max_completion_length=6, gradient_checkpointing=False,
                          report_to="none", save_strategy="no", disable_tqdm=True, **dict(config))
    return trainer_class(model=str(tiny_saved / "model"), args=args, train_dataset=data,
                         reward_funcs=[_accuracy, _format_bonus], **focal)


def _trl_train(tiny_saved, out, trainer_class, config=(), **focal):
    """_trl_trainer's 2 steps. -> (per step: the rewards of each reward function, gathered, and
    the advantages scored, then trained on; the final weights; the trainer)"""
    trainer = _trl_trainer(tiny_saved, out, trainer_class, config, **focal)
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


# TRL 1.16 accepts scale_rewards "group" (or True), "batch" and "none" (or False); each is run with
# another way of naming the correct completions, all three of which mean accuracy > 0 here
SCALE_REWARDS = {"group": {"correct_reward": "_accuracy"},
                 "batch": {"correct_above": 0.5},  # the sum: accuracy plus a bonus of 0.1
                 "none": {"correct_reward": "_accuracy", "correct_above": 0.5}}


@pytest.mark.parametrize("scale_rewards", list(SCALE_REWARDS))
def test_trl_fgrpo_trains_on_group_advantages_of_its_rewards(trl_trainers, tiny_saved, tmp_path,
                                                             scale_rewards):
    import trl
    for alias, name in ((True, "group"), (False, "none")):  # TRL's own spelling of the two
        config = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, scale_rewards=alias)
        assert config.scale_rewards == name
    rewards, scored, trained, _, _ = _trl_train(
        tiny_saved, tmp_path, trl_trainers[1], {"scale_rewards": scale_rewards}, focal_gamma=1.0,
        **SCALE_REWARDS[scale_rewards])
    assert len(scored) == 2
    weights = set()
    for step_rewards, adv, adv_trained in zip(rewards, scored, trained):
        accuracy, bonus = step_rewards.view(4, 4, 2).unbind(-1)
        r = accuracy + bonus
        # TRL's std + 1e-4 where verl and fgrpo.py add 1e-6; the focal weight from accuracy alone
        want = fgrpo.group_advantages(r, 1.0, eps=1e-4, correct=accuracy)
        if scale_rewards != "group":  # undo the group's std; "batch": the whole batch's instead
            want = want * (r.std(-1, keepdim=True) + 1e-4)
        if scale_rewards == "batch":
            want = want / (r.std() + 1e-4)
        assert torch.allclose(adv, want.flatten(), atol=1e-6), (step_rewards, adv)
        assert torch.equal(adv_trained.sort().values, adv.sort().values)  # TRL shuffles the rows
        weights |= set(fgrpo.focal_weight(accuracy, 1.0).tolist())
        assert ((bonus > 0) & (accuracy == 0)).any()  # a wrong answer that the sum calls right
    assert weights - {0.0, 1.0}, "no group of mixed outcomes: the focal weight was never seen"


def test_trl_fgrpo_focal_weights_by_hand(trl_trainers, tiny_saved, tmp_path):
    from types import SimpleNamespace
    trainer = _trl_trainer(tiny_saved, tmp_path, trl_trainers[1], {"reward_weights": [1.0, 0.5]},
                           focal_gamma=1.0, correct_above=0.5)
    nan = float("nan")
    # 2 groups of 4, rows (accuracy, format); TRL's reward: the weighted sum, NaN (None) as 0
    # unless every function gave None: 1.05, 0.4 (0.8 halved), 1 (format None), None | 0, 0.05,
    # 1.05, 0.05. Above 0.5: 2 of 4 and 1 of 4 right, g = 1/2 and 3/4
    trainer._all_rewards = torch.tensor([[1, 0.1], [0, 0.8], [1, nan], [nan, nan],
                                         [0, 0], [0, 0.1], [1, 0.1], [0, 0.1]])
    assert trainer.focal_weights(8).tolist() == [0.5] * 4 + [0.75] * 4
    trainer.correct_above = -0.5  # now all right but the unscorable one: g = 1/4 and 0
    assert trainer.focal_weights(8).tolist() == [0.25] * 4 + [0.0] * 4
    trainer.correct_above = 0.5
    trainer.model.eval()  # evaluation: groups of num_generations_eval, here 2
    trainer.num_generations_eval = 2  # 1, 1, 0, 1 of 2 right: g = 1/2, 1/2, 1, 1/2
    assert trainer.focal_weights(8).tolist() == [0.5] * 4 + [1.0] * 2 + [0.5] * 2
    trainer.model.train()
    # a group split across processes: 3 groups of 4 on 2 processes of 6 completions each, so
    # rows 4-7 (group 1) lie on both; by hand, 1, 3 and 0 of 4 right: g = 3/4, 1/4, 1
    trainer.correct_reward = "_accuracy"
    accuracy = torch.tensor([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0.0])
    trainer._all_rewards = torch.stack([accuracy, torch.full((12,), 0.1)], -1)  # as TRL gathers
    trainer.accelerator = SimpleNamespace(process_index=1)  # the second process
    assert trainer.focal_weights(6).tolist() == [0.25, 0.25, 1.0, 1.0, 1.0, 1.0]
    trainer.accelerator = SimpleNamespace(process_index=0)
    assert trainer.focal_weights(6).tolist() == [0.75] * 4 + [0.25] * 2
    with pytest.raises(ValueError, match="correct_reward='accuracy' is none of"):
        _trl_trainer(tiny_saved, tmp_path, trl_trainers[1], focal_gamma=1.0,
                     correct_reward="accuracy")


def test_trl_fgrpo_at_gamma_zero_is_grpo_trainer_bit_for_bit(trl_trainers, tiny_saved, tmp_path):
    plain = _trl_train(tiny_saved, tmp_path / "grpo", trl_trainers[0])
    focal = _trl_train(tiny_saved, tmp_path / "fgrpo", trl_trainers[1], focal_gamma=0.0)
    for a, b in zip(plain[:4], focal[:4]):  # rewards, advantages scored and trained on, weights
        assert len(a) == len(b) > 0 and all(torch.equal(x, y) for x, y in zip(a, b))
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(tiny_saved / "model").parameters()
    assert not all(torch.equal(p, q) for p, q in zip(base, plain[3])), "the 2 steps changed nothing"
