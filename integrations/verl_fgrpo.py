"""F-GRPO in verl 0.9.1: an advantage estimator "fgrpo", verl's GRPO times the focal weight.

F-GRPO changes only the advantages (arXiv 2602.06717, Sec. 4, Eq. 13: A^F = g(x) * A), so verl's
own losses (vanilla, CISPO, ...) and token-mean stay as they are. verl computes advantages in its
trainer process, a Ray actor: the import must happen there, which verl's own hook does for every
process that imports verl. From a verl checkout, with this repository at FGRPO:

    export PYTHONPATH=FGRPO VERL_USE_EXTERNAL_MODULES=integrations.verl_fgrpo
    python -m verl.trainer.main_ppo algorithm.adv_estimator=fgrpo \\
        +algorithm.focal_gamma=0.5 ...        # the paper: 0.5 for GRPO and DAPO, 1.0 for CISPO

A completion counts as correct when its reward is above 0 (+algorithm.focal_correct_above=T to
change it): set T whenever rewards are shaped (a format bonus, DAPO's length penalty) or hold
the KL term (algorithm.use_kl_in_reward=True); docs/integrations.md says which T.
algorithm.norm_adv_by_std_in_grpo=False (Dr. GRPO) is respected, as in verl's GRPO. On a Ray
cluster started by hand, give both variables to every node's `ray start` as well.
"""
from collections import defaultdict

import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

import fgrpo


def focal_weights(correct, index, gamma):
    """One focal weight per completion: correct (B,) 0/1, index (B,) verl's group ids (a group's
    rows may lie anywhere in the batch, its size may differ from others') -> g (B,)."""
    rows = defaultdict(list)
    for i, uid in enumerate(index):
        rows[uid].append(i)
    weights = torch.ones(len(index))
    for members in rows.values():
        # Sec. 4, Eq. 11-12: g(x) = (1 - #correct / N) ** gamma over the N rollouts of one prompt
        weights[members] = fgrpo.focal_weight(correct[members][None], gamma)
    return weights


@register_adv_est("fgrpo")
def compute_fgrpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
                                    norm_adv_by_std_in_grpo=True, config=None):
    """verl's GRPO signature; (advantages, returns), both (B, T). verl passes a custom estimator
    only `config` (its algorithm section): gamma and the std switch are read from it."""
    if config is None or config.get("focal_gamma") is None:
        raise ValueError("adv_estimator=fgrpo needs +algorithm.focal_gamma=G (the paper: 0.5 "
                         "for GRPO and DAPO, 1.0 for CISPO; 0 is verl's GRPO)")
    norm = config.get("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    advantages, _ = compute_grpo_outcome_advantage(token_level_rewards, response_mask, index,
                                                   epsilon, norm)
    scores = token_level_rewards.sum(-1)  # verl's outcome reward: one per sequence
    correct = (scores > config.get("focal_correct_above", 0.0)).float()
    weights = focal_weights(correct, index, float(config["focal_gamma"]))
    # Sec. 4, Eq. 13: A^F_i = g(x) * A_i, after GRPO's std normalisation
    advantages = advantages * weights.to(advantages)[:, None]
    return advantages, advantages
