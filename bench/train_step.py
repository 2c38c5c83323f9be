"""Part 3: one full training step on a CPU, fgrpo against TRL's GRPOTrainer, one side per process.

    python bench/train_step.py --side fgrpo --model DIR --steps 5 --result /tmp/fgrpo.json
    python bench/train_step.py --side trl   --model DIR --steps 5 --result /tmp/trl.json

A step is one rollout batch: --prompts prompts x N completions sampled with transformers'
generate(), scored, old log-probs computed once, then prompts / mini-batch optimiser steps
of the DAPO loss. Every setting of the TRL run is derived from fgrpo's own `--model tiny`
arguments (stored in the results), so the two cannot drift apart; UNMATCHED lists what
differs. DIR is the tiny model saved by common.save_tiny.
"""
import argparse
import tempfile
import time

import torch

from common import PeakRSS, median, write_result

import fgrpo

# What cannot be set the same in TRL 1.16; bench/run.py prints these and stores them.
UNMATCHED = [
    "advantage eps: TRL divides by (std + 1e-4), fgrpo by (std + 1e-6)",
    "data order: TRL's RepeatSampler and fgrpo's seeded shuffle draw different prompts of the "
    "same pool",
    "random streams differ, so the sampled completions (and their lengths) differ",
    "TRL shuffles the rollout batch before splitting it into optimiser steps; "
    "fgrpo keeps prompt order",
    "log-probs: TRL uses transformers' fused_lm_head path, fgrpo its chunked token_logprobs",
    "TRL also computes entropies and logging metrics every optimiser step",
]


def fgrpo_args(seed):
    """The demo's settings, with gamma 0 (plain DAPO: TRL has no focal weight) and generate()
    rollouts on both sides (vLLM is row 4's business)."""
    return fgrpo.parse_args(["--model", "tiny", "--algo", "dapo", "--gamma", "0", "--rollout", "hf",
                             "--seed", str(seed)])


def run_fgrpo(model_dir, steps, args):
    """Wall seconds of each fgrpo.run_step and the peak memory of all of them. The optimiser is
    fgrpo.train's; its scheduler is left out: the demo's rate is constant (TINY warmup=0)."""
    problems = fgrpo.build_tiny(args.seed, warm_steps=0)[2]  # the demo's training problems
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model.eval()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999),
                            weight_decay=args.weight_decay)
    times = []
    with PeakRSS() as mem:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            batch = fgrpo.problems_at(problems, args.seed, (step - 1) * args.prompts, args.prompts)
            fgrpo.run_step(model, tok, None, opt, batch, args, step)
            times.append(time.perf_counter() - t0)
    return times, mem


def trl_config(args, steps, out):
    """fgrpo's settings in TRL's terms. TRL counts micro-batches in steps_per_generation and
    optimiser steps in max_steps; fgrpo's mini-batch is in prompts, its micro-batch in sequences."""
    from trl import GRPOConfig
    micro = min(args.micro_batch, args.mini_batch * args.n)
    return GRPOConfig(
        output_dir=out, use_cpu=True, bf16=False, gradient_checkpointing=False, seed=args.seed,
        num_generations=args.n, max_completion_length=args.max_new_tokens,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=args.mini_batch * args.n // micro,
        steps_per_generation=args.prompts * args.n // micro, num_iterations=1,
        max_steps=steps * args.prompts // args.mini_batch,
        loss_type="dapo", beta=0.0, epsilon=args.eps_low, epsilon_high=args.eps_high,
        scale_rewards="group",
        # torch.optim.AdamW as fgrpo builds it (TRL's default is the fused variant); the demo has
        # no warm-up (TINY warmup=0), so the rate is constant on both sides
        optim="adamw_torch", learning_rate=args.lr, weight_decay=args.weight_decay,
        adam_beta1=0.9, adam_beta2=0.999,
        max_grad_norm=args.grad_clip, lr_scheduler_type="constant",
        temperature=args.temperature, top_p=args.top_p, top_k=0,
        report_to="none", save_strategy="no", logging_steps=10**9, disable_tqdm=True)


def run_trl(model_dir, steps, args):
    """Wall seconds of each rollout batch's worth of GRPOTrainer steps, and the peak memory."""
    try:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOTrainer
    except ImportError as e:
        raise SystemExit(f"{e}: pip install trl==1.16.0 (make install does)")
    _, _, problems, _ = fgrpo.build_tiny(args.seed, warm_steps=0)  # the same problems, untrained
    data = Dataset.from_list([{"prompt": p["problem"], "answer": p["answer"]} for p in problems])
    per_step, ends = args.prompts // args.mini_batch, []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):  # once per optimiser step
            ends.append(time.perf_counter())

    # the same verifier as fgrpo's side (row 2 compares those)
    def reward(completions, answer, **_):
        return fgrpo.verify(completions, answer)

    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                              reward_funcs=reward, args=trl_config(args, steps, out),
                              train_dataset=data,
                              processing_class=AutoTokenizer.from_pretrained(model_dir),
                              callbacks=[Clock()])
        with PeakRSS() as mem:
            start = time.perf_counter()
            trainer.train()
    marks = [start] + ends[per_step - 1::per_step]
    return [b - a for a, b in zip(marks, marks[1:])], mem


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=["fgrpo", "trl"], required=True)
    p.add_argument("--model", required=True, help="folder of the tiny model (common.save_tiny)")
    p.add_argument("--steps", type=int, default=5, help="timed steps after --warmup steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", required=True)
    a = p.parse_args()
    args = fgrpo_args(a.seed)
    times, mem = (run_fgrpo if a.side == "fgrpo" else run_trl)(a.model, a.warmup + a.steps, args)
    write_result(a.result, {"side": a.side, "times": times, "time": median(times[a.warmup:]),
                            "settings": {k: getattr(args, k) for k in (
                                "prompts", "n", "mini_batch", "micro_batch", "max_new_tokens",
                                "algo", "gamma", "eps_low", "eps_high", "lr", "weight_decay",
                                "grad_clip", "temperature", "top_p", "gen_batch", "seed")},
                            **mem.as_dict()})


if __name__ == "__main__":
    main()
