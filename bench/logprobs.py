"""Part 1: log-probs at Qwen's vocabulary, forward and backward, one side per process.

    python bench/logprobs.py --side ours  --batch 4 --seq 1024 --result /tmp/ours.json
    python bench/logprobs.py --side naive --batch 4 --seq 1024 --result /tmp/naive.json

ours = fgrpo.token_logprobs (chunked lm_head, recomputed in backward); naive = the full
(B, T, vocab) logits, log_softmax, gather. The model is a 2-layer Qwen2 with hidden size 128
and Qwen's 151,936-token vocabulary: the lm_head and the logits dominate, as they do in
the log-prob step of a real run. One process per side, so each peak is its own.
"""
import argparse

import torch

from common import PeakRSS, median, timed, write_result

import fgrpo

QWEN_VOCAB = 151_936  # Qwen2 / Qwen2.5 tokenizers


def qwen_vocab_model(seq, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=QWEN_VOCAB, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=seq, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


def naive_logprobs(model, ids, attn):
    """The textbook version: all logits at once, (B, T, vocab) in float32."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def ours_logprobs(model, ids, attn):
    return fgrpo.token_logprobs(model, ids, attn)


def forward_backward(fn, model, ids, attn):
    model.zero_grad(set_to_none=True)  # every pass allocates its own gradients
    logp = fn(model, ids, attn)
    logp.mean().backward()
    return float(logp.detach().sum())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=["ours", "naive"], required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--iters", type=int, default=3, help="timed passes after one warm-up pass")
    p.add_argument("--result", required=True)
    a = p.parse_args()
    fn = {"ours": ours_logprobs, "naive": naive_logprobs}[a.side]
    model = qwen_vocab_model(a.seq)
    ids = torch.randint(0, QWEN_VOCAB, (a.batch, a.seq), generator=torch.Generator().manual_seed(1))
    attn = torch.ones_like(ids)
    forward_backward(fn, model, ids, attn)  # warm-up: first-call allocations and kernel choice
    model.zero_grad(set_to_none=True)
    with PeakRSS() as mem:
        runs = [timed(forward_backward, fn, model, ids, attn) for _ in range(a.iters)]
    write_result(a.result, {"side": a.side, "batch": a.batch, "seq": a.seq,
                            "times": [t for _, t in runs],
                            "time": median([t for _, t in runs]), "logp_sum": runs[0][0],
                            "threads": torch.get_num_threads(), **mem.as_dict()})


if __name__ == "__main__":
    main()
