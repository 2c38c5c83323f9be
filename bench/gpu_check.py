"""make gpu-check: fgrpo.py's own code on a GPU, offline, in a few minutes.

    python bench/gpu_check.py                        # on a GPU machine (make gpu-check)
    python bench/gpu_check.py --device cpu --small   # the same code paths on a CPU, at toy sizes

The model is a randomly initialised Qwen2 of Qwen2.5-0.5B's shape (24 layers, hidden 896,
about 0.5B parameters) with Qwen's 151,936-token vocabulary, built in code: nothing is
downloaded. Each part checks something and measures something:
1. log-probs: fgrpo.token_logprobs equals log_softmax(logits).gather at the real vocabulary;
   peak memory of forward + backward against that naive version;
2. training: fgrpo.train_step on a synthetic rollout batch with log-normal completion lengths,
   on the model as fgrpo.train places it: FSDP2 at world size 1, bf16 compute over fp32 masters
   (the loss is finite, the weights move); training tokens/s, model FLOPs utilisation against
   the GPU's bf16 dense peak, pad_frac;
3. rollout: with vLLM where it is installed (fgrpo.start_vllm + sync_weights; vLLM's greedy
   completions must equal transformers' greedy ones on the trained weights), else transformers'
   generate() through fgrpo.rollout, saying so; generated tokens/s.
Peak memory is reported per part. On a node with more GPUs it re-launches itself under torchrun
(fgrpo.relaunched), so FSDP2 trains at that world size and every rank runs its own vLLM engine;
rank 0 reports. On a CPU (--device cpu) a gloo group of one stands in for the GPU's, so the same
FSDP2 path runs (`torchrun --nproc_per_node 2 bench/gpu_check.py --device cpu --small`: two).
Everything goes to bench/gpu_results.json; the exit status is 1
if any check fails. It needs only torch, transformers and tqdm, at whatever versions the machine
has; vLLM and math-verify are optional (no reward is computed here).
"""
import argparse
import importlib.util
import json
import math
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import fgrpo  # noqa: E402

# bf16 dense tensor-core peaks (FLOP/s) from the vendors' data sheets; None: MFU is not reported
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
             num_key_value_heads=1, tie_word_embeddings=True)  # head_dim 64: vLLM's CPU attention takes it


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_mb(device, reset=False):
    """Peak allocated GPU memory since the last reset, in MB (None on a CPU)."""
    if device.type != "cuda":
        return None
    if reset:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def build_model(shape, device, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=151936, max_position_embeddings=8192, pad_token_id=0, eos_token_id=1,
                         bos_token_id=1, **shape)
    return fgrpo.shard(Qwen2ForCausalLM(config), device)  # fgrpo's own placement: FSDP2, as train() does


def local(p):
    """This rank's values of a parameter (FSDP2 holds DTensor shards)."""
    return p.detach().to_local() if hasattr(p, "to_local") else p.detach()


def part_logprobs(model, device, batch, seq):
    """fgrpo.token_logprobs against the naive full-logits version, forward + backward each."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 151936, (batch, seq), generator=gen).to(device)
    attn = torch.ones_like(ids)
    out = {}
    for side in ("naive", "fgrpo"):
        model.zero_grad(set_to_none=True)
        peak_mb(device, reset=True)
        sync(device)
        t0 = time.perf_counter()
        if side == "fgrpo":
            lp = fgrpo.token_logprobs(model, ids, attn)
        else:
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
            lp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        lp.sum().backward()
        sync(device)
        out[side] = {"time_s": time.perf_counter() - t0, "peak_mb": peak_mb(device), "logp": lp.detach()}
        del lp
    diff = (out["fgrpo"].pop("logp") - out["naive"].pop("logp")).abs().max().item()
    model.zero_grad(set_to_none=True)
    ratio = (out["fgrpo"]["peak_mb"] / out["naive"]["peak_mb"]) if device.type == "cuda" else None
    return {"shape": [batch, seq], "max_abs_diff": diff, "memory_ratio": ratio, **out}, diff < 2e-3


def synthetic_batch(prompts, n, max_new, seed=0):
    """(prompt_ids, completion_ids) pairs: 64-192-token prompts, log-normal completion lengths."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(prompts):
        prompt = [rng.randrange(2, 151936) for _ in range(rng.randint(64, 192))]
        for _ in range(n):
            length = min(max_new, max(16, int(rng.lognormvariate(math.log(max_new / 6), 0.9))))
            pairs.append((prompt, [rng.randrange(2, 151936) for _ in range(length)]))
    return pairs


def part_train(model, device, prompts, max_new, steps):
    """fgrpo.train_step (4 optimiser steps per call, as in the paper) on a fixed synthetic batch."""
    args = SimpleNamespace(mini_batch=max(fgrpo.WORLD, prompts // 4), n=8, micro_batch=4, temperature=1.0, algo="dapo",
                           eps_low=0.2, eps_high=0.28, dual_clip=None, grad_clip=1.0)
    ids, attn, mask = (x.to(device) for x in fgrpo.collate(synthetic_batch(prompts, 8, max_new), 0))
    adv = torch.randn(len(ids), generator=torch.Generator().manual_seed(2)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    before = [local(p).clone() for p in model.parameters()]
    model.train()
    peak_mb(device, reset=True)
    times, metrics = [], []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        metrics.append(fgrpo.train_step(model, opt, ids, attn, mask, adv, args))
        sync(device)
        times.append(time.perf_counter() - t0)
    model.eval()
    moved = max((a - local(b)).abs().max().item() for a, b in zip(before, model.parameters()))
    params = sum(p.numel() for p in model.parameters())
    tokens = int(attn.sum())
    t = min(times[1:] or times)  # the first call also pays for allocator and kernel warm-up
    # model FLOPs of one call: a no-grad forward for the old log-probs (2 N per token), then
    # forward + backward for the updates (6 N per token); recomputation is not counted
    flops = 8 * params * tokens
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    peak = next((v for k, v in BF16_PEAK.items() if k in name), None)
    finite = all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in metrics)
    result = {"params": params, "sequences": len(ids), "tokens": tokens, "times_s": times,
              "tokens_per_s": tokens / t, "mfu_vs_bf16_peak": flops / t / peak if peak else None,
              "gpu": name, "pad_frac": metrics[-1]["pad_frac"], "losses": [m["loss"] for m in metrics],
              "max_weight_change": moved, "peak_mb": peak_mb(device),
              "master_dtype": str(next(model.parameters()).dtype), "fsdp2_world": fgrpo.WORLD,
              "fsdp2": torch.distributed.is_initialized()}
    return result, finite and moved > 0


def part_rollout(model, device, prompts, n, max_new, tmp):
    """Samples through fgrpo's rollout; with vLLM also its weight sync, checked by greedy decoding."""
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]  # a real Qwen2Tokenizer, built offline (ids < 34)
    texts = [f"max({','.join(str(random.Random(i).randrange(10)) for _ in range(5))})=" for i in range(prompts)]
    args = SimpleNamespace(temperature=1.0, top_p=1.0, max_new_tokens=max_new, gen_batch=prompts * n, seed=0,
                           vllm_mem=0.3, max_prompt_len=64, verbose=False, prompts=prompts, n=n)
    use_vllm = importlib.util.find_spec("vllm") is not None
    out = {"sampler": "vllm" if use_vllm else "transformers generate() (vLLM is not installed)"}
    ok, engine = True, None
    if use_vllm:
        # vLLM starts from a folder, as fgrpo.train does for the demo: rank 0 writes it, every rank reads it
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if fgrpo.RANK == 0:
            model.save_pretrained(tmp, state_dict=full)
            tok.save_pretrained(tmp)
        if fgrpo.WORLD > 1:
            box = [tmp]
            torch.distributed.broadcast_object_list(box, 0)
            tmp = box[0]
            torch.distributed.barrier()
        engine = fgrpo.start_vllm(args, tmp, model)
        with torch.no_grad():  # move the weights, so that the sync has something to carry
            for p in model.parameters():
                local(p).add_(torch.randn_like(local(p)) * 1e-2)
        fgrpo.sync_weights(engine, model)
        ok = greedy_agrees(model, tok, engine, texts[:4], device)
        out["greedy_equal_after_sync"] = ok
    peak_mb(device, reset=True)
    sync(device)
    t0 = time.perf_counter()
    samples = fgrpo.rollout(model, tok, engine, texts, n, args, seed=1)
    sync(device)
    seconds = time.perf_counter() - t0
    generated = sum(len(c) for _, c, _ in samples)
    out.update({"samples": len(samples), "generated_tokens": generated, "seconds": seconds,
                "tokens_per_s": generated / seconds, "peak_mb": peak_mb(device)})
    return out, ok and len(samples) == prompts * n


def greedy_agrees(model, tok, engine, texts, device):
    """vLLM's greedy completions equal transformers' greedy ones (16 tokens, float32 on a CPU)."""
    from vllm import SamplingParams
    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    outs = engine.generate([{"prompt_token_ids": i} for i in ids], SamplingParams(temperature=0, max_tokens=16),
                           use_tqdm=False)
    theirs = [list(o.outputs[0].token_ids) for o in outs]
    ours = []
    with torch.no_grad():
        for i in ids:
            seq = model.generate(torch.tensor([i], device=device), do_sample=False, max_new_tokens=16,
                                 eos_token_id=1, pad_token_id=0, synced_gpus=fgrpo.WORLD > 1)[0, len(i):].tolist()
            ours.append(seq[:seq.index(1) + 1] if 1 in seq else seq)
    # bf16 vLLM against an fp32 trainer on a GPU may part ways after a near-tie: compare the first tokens
    k = 16 if device.type == "cpu" else 4
    return all(a[:k] == b[:k] for a, b in zip(ours, theirs))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run of the same code")
    p.add_argument("--small", action="store_true", help="a 2-layer, hidden-64 model and toy sizes")
    p.add_argument("--out", default=str(ROOT / "bench" / "gpu_results.json"), help="the JSON results")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no GPU visible; `python bench/gpu_check.py --device cpu --small` runs the same code on a CPU")
    if a.device == "cuda" and fgrpo.relaunched():  # more than one GPU: this script again, a rank per GPU
        return 0
    if a.device == "cpu" and fgrpo.WORLD == 1:  # a gloo group of one: FSDP2 as on one GPU
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    device = fgrpo.init_distributed() if a.device == "cuda" or fgrpo.WORLD > 1 else torch.device("cpu")
    sizes = dict(lp=(1, 64), prompts=4, max_new=64, steps=1, r_prompts=4, r_n=2, r_new=16) if a.small else \
        dict(lp=(4, 4096), prompts=16, max_new=2048, steps=3, r_prompts=32, r_n=8, r_new=512)
    model = build_model(SMALL if a.small else QWEN25_05B, device)
    results, checks = {"device": a.device, "small": a.small, "torch": torch.__version__,
                       "gpus": torch.cuda.device_count(), "vllm": importlib.util.find_spec("vllm") is not None}, {}
    for name, run in [("logprobs", lambda: part_logprobs(model, device, *sizes["lp"])),
                      ("train", lambda: part_train(model, device, sizes["prompts"], sizes["max_new"], sizes["steps"])),
                      ("rollout", lambda: part_rollout(model, device, sizes["r_prompts"], sizes["r_n"],
                                                       sizes["r_new"], tempfile.mkdtemp()))]:
        if fgrpo.RANK == 0:
            print(f"[{name}]", flush=True)
        try:
            results[name], checks[name] = run()
        except Exception as e:  # a failed part is reported; the others still run
            results[name], checks[name] = {"error": f"{type(e).__name__}: {e}"}, False
        shown = {k: v for k, v in results[name].items() if not isinstance(v, (list, dict))}
        if fgrpo.RANK == 0 or not checks[name]:  # a failure on any rank is shown
            print(f"  {'ok' if checks[name] else f'FAILED on rank {fgrpo.RANK}'}: {shown}", flush=True)
    results["checks"] = checks
    results["world"] = fgrpo.WORLD  # each rank ran every part on the same data; rank 0's figures
    if fgrpo.RANK == 0:
        Path(a.out).write_text(json.dumps(results, indent=1, default=str))
        print(f"written to {a.out}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
