"""Part 2: verification at pass@256 scale, fgrpo.verify against verl's math-verify reward called
one completion at a time (the naive side, and the reference each score must equal).

    python bench/verify.py --problems 200 --samples 256 --reps 2 --result /tmp/verify.json

Both sides score the same synthetic completions in this process, alternating (ours, naive,
ours, naive) after a warm-up of each. Answers are skewed as real samples are: per problem a
few frequent answers (the gold in several LaTeX forms, common wrong answers) drawn with
Zipf weights, a long tail of rare answers of the same kind (integers, fractions, roots,
multiples of pi, pairs, polynomials), and a few completions with no \\boxed{}.
"""
import argparse
import random
from collections import Counter

from common import median, timed, write_result

import fgrpo

TAIL, NO_BOX = 0.15, 0.02  # shares of tail answers and of completions without \boxed{}
# answer kinds (see forms): mostly integers, as in competition math; the rest costs math-verify more
KIND_WEIGHTS = [0.5, 0.15, 0.1, 0.08, 0.07, 0.1]
FILLER = ["Let x be the unknown.", "Substituting {a} gives {b}.", "We factor the expression.",
          "By symmetry the two cases agree.", "So the sum is {a} + {b}.", "Checking {a} works.",
          "Squaring both sides,", "The discriminant is {b}.", "Hence the ratio is {a}:{b}."]


def forms(kind, a, b, k):
    """(equivalent LaTeX forms of one answer, common wrong answers) for an answer kind and its
    parameters; forms[0] is the gold."""
    if kind == 0:
        return ([f"{a * b}", f"{a * b}.0", f"{a * b:,}"],
                [f"{a * b + 1}", f"{a * b - 1}", f"{a + b}", f"{2 * a * b}"])
    if kind == 1:
        return ([f"\\frac{{{a}}}{{{b + a}}}", f"\\dfrac{{{a}}}{{{b + a}}}", f"{a}/{b + a}"],
                [f"\\frac{{{b + a}}}{{{a}}}", f"\\frac{{{a + 1}}}{{{b + a}}}", f"{a}",
                 f"\\frac{{{a}}}{{{b}}}"])
    if kind == 2:
        return ([f"{k}\\sqrt{{{b}}}", f"\\sqrt{{{k * k * b}}}", f"{k} \\sqrt{{{b}}}"],
                [f"{k + 1}\\sqrt{{{b}}}", f"{k}\\sqrt{{{b + 1}}}", f"{k * b}",
                 f"\\sqrt{{{k * b}}}"])
    if kind == 3:
        return ([f"\\frac{{{k}\\pi}}{{{b}}}", f"\\frac{{{k}}}{{{b}}}\\pi", f"{k}\\pi/{b}"],
                [f"\\frac{{\\pi}}{{{b}}}", f"{k}\\pi", f"\\frac{{{k}\\pi}}{{{b + 1}}}",
                 f"\\frac{{{b}\\pi}}{{{k}}}"])
    if kind == 4:
        return ([f"({a}, {b})", f"({a},{b})", f"\\left({a}, {b}\\right)"],
                [f"({b}, {a})", f"[{a}, {b}]", f"({a}, {b + 1})", f"({a})"])
    return ([f"{k}x^2 + {a}", f"{a} + {k}x^2", f"{k}x^{{2}}+{a}"],
            [f"{k}x^2 - {a}", f"{k}x + {a}", f"{k}x^2", f"x^2 + {a}"])


def draw(rng, kind):
    """An answer of this kind with fresh parameters: (forms, wrong answers) as forms() gives
    them."""
    return forms(kind, rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9))


def completion(rng, answer, boxed=True):
    words = " ".join(rng.choice(FILLER).format(a=rng.randint(1, 99), b=rng.randint(1, 99))
                     for _ in range(rng.randint(3, 8)))
    end = f"The final answer is $\\boxed{{{answer}}}$." if boxed else f"so it comes to {answer}"
    return f"{words} {end}"


def synthetic(problems, samples, seed=0):
    """problems x samples (completion, gold) pairs with a skewed answer distribution."""
    rng = random.Random(seed)
    completions, golds = [], []
    for i in range(problems):
        kind = rng.choices(range(len(KIND_WEIGHTS)), KIND_WEIGHTS)[0]
        same, wrong = draw(rng, kind)
        frequent = [x for pair in zip(same, wrong) for x in pair] + wrong[len(same):]
        zipf = [1 / (r + 1) ** 1.2 for r in range(len(frequent))]
        rng.shuffle(frequent)  # the gold is not always the most frequent answer
        for _ in range(samples):
            u = rng.random()
            # the tail: answers of the problem's kind with other numbers, each rarely drawn twice
            answer = rng.choice(draw(rng, kind)[0]) if u < TAIL else rng.choices(frequent, zipf)[0]
            completions.append(completion(rng, answer, boxed=u > NO_BOX))
            golds.append(same[0])
    return completions, golds


def naive_verify(completions, golds):
    """One completion at a time, in this process: verl's compute_score
    (verl/utils/reward_score/math_verify.py) with its math-verify settings and timeouts."""
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    score = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    out = []
    for c, g in zip(completions, golds):
        try:
            out.append(float(score(["\\boxed{" + g + "}"], [c])[0]))
        except Exception:
            out.append(0.0)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=int, default=200)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--reps", type=int, default=2, help="(ours, naive) pairs after the warm-up")
    p.add_argument("--result", required=True)
    a = p.parse_args()
    comps, golds = synthetic(a.problems, a.samples)
    warm = slice(0, 4 * a.samples)
    fgrpo.verify(comps[warm], golds[warm])  # starts the worker pool
    naive_verify(comps[warm], golds[warm])  # compiles math-verify's regexes
    t_ours, t_naive = [], []
    for _ in range(a.reps):  # A B A B: drift of the machine hits both sides alike
        ours, t = timed(fgrpo.verify, comps, golds)
        t_ours.append(t)
        naive, t = timed(naive_verify, comps, golds)
        t_naive.append(t)
    top = [Counter(comps[i:i + a.samples]).most_common(1)[0][1] / a.samples
           for i in range(0, len(comps), a.samples)]
    write_result(a.result, {  # fgrpo.verify scores each distinct (completion, gold) once
        "completions": len(comps), "distinct_pairs": len(set(zip(golds, comps))),
        "top_completion_share": median(top),  # per problem, its most frequent completion's share
        "correct_frac": sum(ours) / len(ours),
        "agree_frac": sum(o == n for o, n in zip(ours, naive)) / len(ours),
        "times_ours": t_ours, "times_naive": t_naive,
        "throughput_ours": len(comps) / median(t_ours),
        "throughput_naive": len(comps) / median(t_naive)})


if __name__ == "__main__":
    main()
