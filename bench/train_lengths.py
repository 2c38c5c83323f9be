"""Part 5: one rollout batch's updates at RL-like completion lengths, fgrpo's training step against
the same step with its two savings undone (rollout-order micro-batches, logits at every position).

    python bench/train_lengths.py --side fgrpo --result /tmp/a.json
    python bench/train_lengths.py --side rollout-order --result /tmp/b.json

Completion lengths are log-normal (most of a few dozen to a few hundred tokens, a tail up to
--max-new-tokens), as RL rollouts are, scaled to CPU size; prompts are 32-96 tokens. The model is
a random 2-layer Qwen2 with Qwen's 151,936-token vocabulary. At this width the lm_head is
nearly all of the compute, far more than in a 7B (about 7% of its forward FLOPs), so the time
ratio overstates what response-only logits save there; the padding share (pad_frac) is the
part that carries over. Both sides see the same batch and the same initial weights: one side runs
fgrpo.train_step, the other train_step_as_it_was below, written out of fgrpo's loss and log-probs.
"""
import argparse
import random
from types import SimpleNamespace

import torch
from common import timed, write_result

import fgrpo


def batch(seqs, max_new, seed=0):
    """(prompt_ids, completion_ids) pairs: prompts 32-96 tokens, completions log-normal."""
    rng = random.Random(seed)
    lengths = [min(max_new, max(16, int(rng.lognormvariate(4.6, 0.9)))) for _ in range(seqs)]
    return [([rng.randrange(1000) for _ in range(rng.randint(32, 96))],
             [rng.randrange(1000) for _ in range(n)]) for n in lengths]


def rollout_order(count, per_step, micro_batch):
    """fgrpo.micro_batches without its sort by length: each optimiser step's sequences cut into
    micro-batches in the order the rollout made them."""
    steps = [list(range(i, min(i + per_step, count))) for i in range(0, count, per_step)]
    return [[step[j:j + micro_batch] for j in range(0, len(step), micro_batch)] for step in steps]


def logprobs_everywhere(model, ids, attn, mask, rows, temperature):
    """fgrpo.micro_batch_logprobs with logits at every position, prompt and padding included:
    (log-probs, response mask) of the sequences `rows`, cut to the longest of them."""
    longest = int(attn[rows].sum(-1).max())
    logp = fgrpo.token_logprobs(model, ids[rows, :longest], attn[rows, :longest], temperature)
    return logp, mask[rows, :longest - 1]


def train_step_as_it_was(model, opt, ids, attn, mask, adv, args):
    """fgrpo.train_step before its two savings, on one process: pi_old once, then per optimiser
    step its micro-batches, fgrpo.policy_loss over the step's response tokens, the grad clip and
    the update. Returns the mean loss and the forwards' padding share, as train_step does."""
    lengths = attn.sum(-1).tolist()
    steps = rollout_order(len(lengths), args.mini_batch * args.n, args.micro_batch)
    with torch.no_grad():  # App. L: pi_old is the sampling policy, fixed for all the updates
        old_logp = [[logprobs_everywhere(model, ids, attn, mask, rows, args.temperature)[0]
                     for rows in micro] for micro in steps]
    losses = []
    for micro, old in zip(steps, old_logp):
        num_tokens = sum(float(mask[rows].sum()) for rows in micro)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for rows, old_rows in zip(micro, old):
            logp, response = logprobs_everywhere(model, ids, attn, mask, rows, args.temperature)
            loss, _ = fgrpo.policy_loss(logp, old_rows, adv[rows], response, args.algo,
                                        args.eps_low, args.eps_high, num_tokens, args.dual_clip)
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        losses.append(loss_sum)
    positions = sum(len(rows) * max(lengths[i] for i in rows) for micro in steps for rows in micro)
    return {"loss": sum(losses) / len(losses), "pad_frac": (positions - sum(lengths)) / positions}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=["fgrpo", "rollout-order"], required=True)
    p.add_argument("--prompts", type=int, default=8,
                   help="prompts in the rollout batch (N = 8 each)")
    p.add_argument("--mini-batch", type=int, default=4, help="prompts per optimiser step")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward")
    p.add_argument("--max-new-tokens", type=int, default=256, help="the longest completion")
    p.add_argument("--hidden", type=int, default=64, help="model width (2 layers)")
    p.add_argument("--result", required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=a.hidden,
                                         intermediate_size=4 * a.hidden, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=4096))
    pairs = batch(a.prompts * 8, a.max_new_tokens)
    ids, attn, mask = fgrpo.collate(pairs, 0)
    adv = torch.randn(len(pairs), generator=torch.Generator().manual_seed(1))
    args = SimpleNamespace(mini_batch=a.mini_batch, n=8, micro_batch=a.micro_batch,
                           temperature=1.0, algo="dapo", eps_low=0.2, eps_high=0.28,
                           dual_clip=None, grad_clip=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    step = fgrpo.train_step if a.side == "fgrpo" else train_step_as_it_was
    m, t = timed(step, model, opt, ids, attn, mask, adv, args)
    write_result(a.result, {"time": t, "pad_frac": m["pad_frac"], "loss": m["loss"],
                            "tokens": int(attn.sum()), "response_tokens": int(mask.sum()),
                            "lengths": sorted(len(c) for _, c in pairs)})


if __name__ == "__main__":
    main()
