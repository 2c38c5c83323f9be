"""Part 5: one rollout batch's updates at RL-like completion lengths, fgrpo's training step against
itself with the two savings undone (rollout-order micro-batches, logits at every position).

    python bench/train_lengths.py --side fgrpo --result /tmp/a.json
    python bench/train_lengths.py --side rollout-order --result /tmp/b.json

Completion lengths are log-normal (most of a few dozen to a few hundred tokens, a tail up to
--max-new-tokens), as RL rollouts are, scaled to CPU size; prompts are 32-96 tokens. The model is
a random 2-layer Qwen2 with Qwen's 151,936-token vocabulary. At this width the lm_head is
nearly all of the compute, far more than in a 7B (about 7% of its forward FLOPs), so the time
ratio overstates what response-only logits save there; the padding share (pad_frac) is the
part that carries over. Both sides see the same batch, the same initial weights and fgrpo.train_step's own code.
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=["fgrpo", "rollout-order"], required=True)
    p.add_argument("--prompts", type=int, default=8, help="prompts in the rollout batch (N = 8 each)")
    p.add_argument("--mini-batch", type=int, default=4, help="prompts per optimiser step")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward")
    p.add_argument("--max-new-tokens", type=int, default=256, help="the longest completion")
    p.add_argument("--hidden", type=int, default=64, help="model width (2 layers)")
    p.add_argument("--result", required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=a.hidden, intermediate_size=4 * a.hidden,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=4096))
    if a.side == "rollout-order":  # the step as it was: micro-batches in rollout order, logits everywhere
        fgrpo.micro_batches = lambda lengths, per, micro: [
            [list(range(j, min(j + micro, i + per))) for j in range(i, i + per, micro)]
            for i in range(0, len(lengths), per)]
        full = fgrpo.token_logprobs
        fgrpo.token_logprobs = lambda *args, mask=None, **kw: full(*args, **kw)
    pairs = batch(a.prompts * 8, a.max_new_tokens)
    ids, attn, mask = fgrpo.collate(pairs, 0)
    adv = torch.randn(len(pairs), generator=torch.Generator().manual_seed(1))
    args = SimpleNamespace(mini_batch=a.mini_batch, n=8, micro_batch=a.micro_batch, temperature=1.0,
                           algo="dapo", eps_low=0.2, eps_high=0.28, dual_clip=None, grad_clip=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    m, t = timed(fgrpo.train_step, model, opt, ids, attn, mask, adv, args)
    write_result(a.result, {"time": t, "pad_frac": m["pad_frac"], "loss": m["loss"],
                            "tokens": int(attn.sum()), "response_tokens": int(mask.sum()),
                            "lengths": sorted(len(c) for _, c in pairs)})


if __name__ == "__main__":
    main()
