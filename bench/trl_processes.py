"""FGRPOTrainer on several processes: each process's advantages against fgrpo's on all rewards.

    torchrun --nproc_per_node 2 bench/trl_processes.py        # loss_type dapo, scale_rewards group
    torchrun --nproc_per_node 2 bench/trl_processes.py --loss-type cispo --scale-rewards batch

TRL 1.16.0's GRPOTrainer on CPU (gloo), the tiny model untrained, 3 steps of 6 completions per
process in groups of 4, so a group lies on two processes every step. "Correct" is an odd digit
in the completion (about half of them), plus a 0.1 format bonus for every completion, with
correct_reward naming the first. Each rank prints one JSON line: how far its advantages are from
fgrpo.group_advantages (TRL's eps 1e-4) on the gathered rewards, rescaled as scale_rewards
does; exit status 1 if more than 1e-6. About 25 s on 2 cores. Not part of make test.
"""
import argparse
import json
import sys
import warnings

from common import ROOT  # noqa: F401  (puts the repository root on sys.path)
import fgrpo

PER_PROCESS, N = 6, 4


def odd_digit(completions, **kwargs):
    return [float(any(d in c for d in "13579")) for c in completions]


def format_bonus(completions, **kwargs):
    return [0.1] * len(completions)


def train(args):
    """(this rank, [(gathered rewards, this rank's advantages)] per step)."""
    import datasets
    import trl
    from integrations.trl_fgrpo import FGRPOTrainer
    model, tok, problems, _ = fgrpo.build_tiny(0, warm_steps=0)
    data = datasets.Dataset.from_list([{"prompt": p["problem"]} for p in problems[:36]])
    config = trl.GRPOConfig(output_dir="/tmp/fgrpo-trl-processes", use_cpu=True, bf16=False,
                            seed=0, max_steps=3, per_device_train_batch_size=PER_PROCESS,
                            num_generations=N, max_completion_length=6, report_to="none",
                            gradient_checkpointing=False, save_strategy="no", disable_tqdm=True,
                            loss_type=args.loss_type, scale_rewards=args.scale_rewards)
    trainer = FGRPOTrainer(model=model, processing_class=tok, args=config, train_dataset=data,
                           reward_funcs=[odd_digit, format_bonus], focal_gamma=1.0,
                           correct_reward="odd_digit")
    rewards, steps = [], []  # TRL calls both through self: the instance's, recording
    calculate, score = trainer._calculate_rewards, trainer._generate_and_score_completions
    trainer._calculate_rewards = lambda *a: rewards.append(calculate(*a)) or rewards[-1]
    trainer._generate_and_score_completions = lambda x: steps.append(score(x)) or steps[-1]
    trainer.train()
    return trainer.accelerator.process_index, list(zip(rewards, steps))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loss-type", default="dapo", help="GRPOConfig.loss_type")
    p.add_argument("--scale-rewards", default="group", choices=["group", "batch", "none"],
                   help="GRPOConfig.scale_rewards")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    rank, steps = train(args)
    worst, split_mixed = 0.0, 0
    for rewards, out in steps:
        correct, bonus = rewards.view(-1, N, 2).unbind(-1)
        r = correct + bonus
        want = fgrpo.group_advantages(r, 1.0, eps=1e-4, correct=correct)  # scale_rewards group
        if args.scale_rewards != "group":  # undo the group std; "batch": the batch's instead
            want = want * (r.std(-1, keepdim=True) + 1e-4)
        if args.scale_rewards == "batch":
            want = want / (r.std() + 1e-4)
        mine = want.flatten()[rank * PER_PROCESS:(rank + 1) * PER_PROCESS]
        worst = max(worst, float((out["advantages"] - mine).abs().max()))
        split_mixed += int(0 < correct[1].sum() < N)  # group 1: rows 4-7, on processes 0 and 1
    print(json.dumps({"rank": rank, **vars(args), "steps": len(steps), "max_abs_diff": worst,
                      "split_group_mixed_in_steps": split_mixed}), flush=True)
    sys.exit(int(worst > 1e-6))


if __name__ == "__main__":
    main()
