"""F-GRPO in TRL 1.16: FGRPOTrainer, TRL's GRPOTrainer with each group's advantages times g(x).

F-GRPO changes only the advantages (arXiv 2602.06717, Sec. 4, Eq. 13: A^F = g(x) * A), so every
loss_type, scale_rewards ("group", "batch", "none") and process count of TRL works unchanged:

    import sys; sys.path.insert(0, FGRPO)        # this repository's folder
    from integrations.trl_fgrpo import FGRPOTrainer
    trainer = FGRPOTrainer(model=..., reward_funcs=[accuracy, format_bonus], args=GRPOConfig(...),
                           train_dataset=..., focal_gamma=0.5, correct_reward="accuracy",
                           correct_above=0.0)
    trainer.train()                              # accelerate launch / torchrun: as GRPOTrainer

focal_gamma: 0.5 is the paper's for GRPO and DAPO, 1.0 for CISPO; 0 is GRPOTrainer exactly.
correct_reward: the name of the reward function that says whether a completion is correct;
default: the weighted sum of every reward function, as TRL's reward. Name one whenever a format
reward or other shaping is in the sum, or a well-formatted wrong answer counts as correct.
correct_above: T, 0 by default: a completion is correct when that reward is above T (verl's
focal_correct_above). Set T between the lowest right score and the highest wrong one: 0.5 for
0/1 correctness plus a bonus under 0.5; 0 for +-1 scores; -0.5 for +-1 plus DAPO's overlong
penalty while its factor is under 1.5 (a right answer at the length limit scores 1 - factor).
A completion every reward function scored None counts as wrong, whatever T.
"""
import fgrpo
from trl import GRPOTrainer


class FGRPOTrainer(GRPOTrainer):
    def __init__(self, *args, focal_gamma, correct_reward=None, correct_above=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        if focal_gamma < 0:
            raise ValueError(f"FGRPOTrainer: focal_gamma must be >= 0, got {focal_gamma}")
        if correct_reward is not None and correct_reward not in self.reward_func_names:
            raise ValueError(f"FGRPOTrainer: correct_reward={correct_reward!r} is none of the "
                             f"reward functions {self.reward_func_names}")
        self.focal_gamma = focal_gamma
        self.correct_reward = correct_reward
        self.correct_above = float(correct_above)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # (all processes' completions, reward functions), gathered by TRL: a group may be split
        # across processes, and its focal weight needs every member's reward
        self._all_rewards = super()._calculate_rewards(inputs, prompts, completions,
                                                       completion_ids_list)
        return self._all_rewards

    def focal_weights(self, local_size):
        """g(x) of each of this process's `local_size` completions, in TRL's order: the gathered
        batch holds whole groups of num_generations, and this process's share is its slice."""
        rewards = self._all_rewards
        if self.correct_reward is None:
            total = (rewards * self.reward_weights.to(rewards.device)).nansum(-1)
        else:
            total = rewards[:, self.reward_func_names.index(self.correct_reward)]
        unscorable = rewards.isnan().all(-1)  # TRL: every reward function returned None
        correct = ((total > self.correct_above) & ~unscorable).float()
        size = self.num_generations if self.model.training else self.num_generations_eval
        # Sec. 4, Eq. 11-12: g(x) = (1 - #correct / N) ** gamma, one per group of N
        weights = fgrpo.focal_weight(correct.view(-1, size), self.focal_gamma)
        self._metrics["train" if self.model.training else "eval"]["focal_weight"].append(
            weights.mean().item())  # over every group of the batch, as fgrpo.py's focal_mean
        start = self.accelerator.process_index * local_size
        return weights.repeat_interleave(size)[start:start + local_size]

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        advantages = output["advantages"]
        # Sec. 4, Eq. 13: A^F_i = g(x) * A_i, after TRL's mean and std (any scale_rewards)
        output["advantages"] = advantages * self.focal_weights(len(advantages)).to(advantages)
        return output
