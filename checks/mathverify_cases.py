"""Math-Verify's own test cases through fgrpo.verify, against verl's math-verify reward.

    git clone https://github.com/huggingface/Math-Verify /tmp/Math-Verify
    python checks/mathverify_cases.py --tests /tmp/Math-Verify/tests --out /tmp/mv_cases.json
    python checks/mathverify_cases.py --tests /tmp/Math-Verify/tests --out /tmp/self.json \\
        --self-check
    git show REV:fgrpo.py > /tmp/old_fgrpo.py          # any earlier fgrpo.verify, e.g. REV=HEAD~1
    python checks/mathverify_cases.py --tests /tmp/Math-Verify/tests --out /tmp/old.json \\
        --fgrpo /tmp/old_fgrpo.py

The (gold, prediction, expected) cases are read statically from Math-Verify's tests/*.py
with `ast` (parametrize tables and literal calls; nothing is imported or executed) and are
never copied into this repository. Each case is scored four ways:
  fgrpo      fgrpo.verify([pred...], [gold...]): all cases in one batched call
  reference  verl's compute_score(pred, gold), serially here: gold wrapped in \\boxed{...},
             gold parsed as LaTeX, prediction as expr+LaTeX, exceptions score 0
  unwrapped  the same, with the gold as the test gives it (isolates the effect of wrapping)
  native     what the test itself computes: both sides parsed with the case's own targets,
             verify() with its precision/strict/set-relation flags (Math-Verify's tests pass
             the gold as given, often "$1$", a full solution or "\\boxed{1}", not wrapped)
fgrpo should equal reference on every case; the test's `expected` is what Math-Verify's
authors want under the test's own configuration, which is often not verl's. Each case is
labelled by how that configuration differs from math-verify's defaults, and grouped as
[default] (parse()/verify() defaults: LaTeX + expr, boxed priority 50, precision 6, strict),
[boxed-first only] (tests/test_all.py's compare_strings() defaults: the same but boxed
priority 0) and [other] (LaTeX-only or expr-only targets, other precision, strict=False...).
A batched call that fails is retried in chunks of 16, then case by case within a failed chunk;
cases that fail alone get no score (they agree with nothing). Each call runs in a forked child.
"""
import argparse
import ast
import importlib.util
import json
import logging
import math
import multiprocessing as mp
import sys
from collections import defaultdict
from pathlib import Path

logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # "did not manage to extract" noise

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify  # noqa: E402
from math_verify.errors import TimeoutException  # noqa: E402
from math_verify.metric import math_metric  # noqa: E402

# compare_strings(gold, pred, match_types, precision, strict, allow_set_relation_comp) in
# tests/test_all.py: its defaults, and the boxed_match_priority=0 its LaTeX target always uses.
HELPER_ARGS = ["gold", "pred", "match_types", "precision", "strict", "allow_set_relation_comp"]
HELPER_DEFAULTS = dict(match_types=["latex", "expr"], precision=6, strict=True,
                       allow_set_relation_comp=False, boxed_priority=0)
# parse()/verify() called directly: Math-Verify's defaults (LaTeX boxed priority 50).
LIBRARY_DEFAULTS = dict(HELPER_DEFAULTS,
                        boxed_priority=LatexExtractionConfig().boxed_match_priority)
VERIFY_KW = {"float_rounding": "precision", "strict": "strict",
             "allow_set_relation_comp": "allow_set_relation_comp"}


class Unsupported(Exception):
    """An argument that is not a literal (a local variable, a sympy object...)."""


def literal(node):
    """The value of a literal node; f-strings may format math.<fn>(literals), nothing else."""
    if isinstance(node, ast.JoinedStr):  # f"{math.sqrt(17):.15f}" in test_float_precision
        return "".join(literal(v) for v in node.values)
    if isinstance(node, ast.FormattedValue) and node.conversion == -1:
        return format(literal(node.value), literal(node.format_spec) if node.format_spec else "")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "math"):
        return getattr(math, node.func.attr)(*map(literal, node.args))
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise Unsupported(ast.unparse(node)[:60]) from None


def comparison(test):
    """(kind, call, expected node) for an assert's test, or None if it compares no gold/pred.

    Forms: compare_strings(...) == E; int(verify(parse(g), parse(p), ...)) == E; bare (E=1)."""
    expected = ast.Constant(1)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, expected = test.operand, ast.Constant(0)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        test, expected = test.left, test.comparators[0]
    if isinstance(test, ast.Call) and getattr(test.func, "id", None) in ("int", "float", "bool"):
        test = test.args[0]
    name = getattr(getattr(test, "func", None), "id", None)
    if name == "compare_strings":
        return "compare_strings", test, expected
    if (name == "verify" and len(test.args) == 2
            and all(isinstance(a, ast.Call) and getattr(a.func, "id", None) == "parse"
                    for a in test.args)):
        return "parse+verify", test, expected
    return None


def rows(func):
    """[(line, {argname: node})] from func's parametrize table, or [(None, {})] without one."""
    for dec in func.decorator_list:
        if isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("mark.parametrize"):
            names = literal(dec.args[0])
            names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
            out = []
            for row in dec.args[1].elts:
                if isinstance(row, ast.Call):  # pytest.param(gold, pred, ..., id=...)
                    row = ast.Tuple(elts=row.args, lineno=row.lineno)
                values = row.elts if len(names) > 1 else [row]
                out.append((row.lineno, dict(zip(names, values))))
            return out
    return [(None, {})]


def case_of(kind, call, expected, bound):
    """One case from a comparison call with its parametrize row bound: gold, pred, expected,
    config."""
    val = lambda node: literal(bound.get(node.id, node) if isinstance(node, ast.Name) else node)
    if kind == "compare_strings":
        args = dict(zip(HELPER_ARGS, call.args)) | {k.arg: k.value for k in call.keywords}
        config = dict(HELPER_DEFAULTS) | {k: val(v) for k, v in args.items()
                                          if k not in ("gold", "pred")}
        gold, pred = val(args["gold"]), val(args["pred"])
    else:  # verify(parse(gold), parse(pred), **kw): parse's default targets, verify's defaults
        if any(a.keywords or len(a.args) != 1 for a in call.args):
            raise Unsupported("parse() with a custom configuration")
        config = dict(LIBRARY_DEFAULTS) | {VERIFY_KW[k.arg]: val(k.value) for k in call.keywords}
        gold, pred = val(call.args[0].args[0]), val(call.args[1].args[0])
    return dict(gold=gold, pred=pred, expected=float(val(expected)), config=config)


def label(config):
    """How a case's configuration differs from math-verify's defaults ("default" if it doesn't)."""
    parts = ([] if set(config["match_types"]) == {"latex", "expr"}
             else ["+".join(config["match_types"]) + " only"])
    if ("latex" in config["match_types"]
            and config["boxed_priority"] != LIBRARY_DEFAULTS["boxed_priority"]):
        parts.append("boxed-first")
    parts += [f"{k}={config[k]}" for k in ("precision", "strict", "allow_set_relation_comp")
              if config[k] != LIBRARY_DEFAULTS[k]]
    return ", ".join(parts) or "default"


def extract(tests_dir):
    """(cases, skipped) from every tests/*.py: skipped lists what could not be read literally."""
    cases, skipped = [], []
    for path in sorted(Path(tests_dir).glob("*.py")):
        for func in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(func, ast.FunctionDef) and func.name.startswith("test_")):
                continue
            for node in (n for n in ast.walk(func) if isinstance(n, ast.Assert)):
                found = comparison(node.test)
                if found is None:  # parse-only, timeout, mocking tests: no (gold, pred) pair
                    continue
                for line, bound in rows(func):
                    where = dict(file=path.name, line=line or node.lineno, test=func.name)
                    try:
                        case = case_of(*found, bound)
                    except (Unsupported, KeyError) as e:
                        skipped.append(dict(where, reason=f"{type(e).__name__}: {e}"))
                        continue
                    cases.append(dict(where, **case, label=label(case["config"])))
    return cases, skipped


def verl_score(pred, gold, wrap=True):
    """verl.utils.reward_score.math_verify.compute_score, verbatim but for the `wrap` switch."""
    verify_func = math_metric(
        gold_extraction_target=(LatexExtractionConfig(),),
        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    try:
        return float(verify_func(["\\boxed{" + gold + "}" if wrap else gold], [pred])[0])
    except (TimeoutException, Exception):  # verl: timeout -> timeout_score (0), error -> 0
        return 0.0


def native_score(case):
    """What the Math-Verify test computes: compare_strings(), or verify(parse(), parse())."""
    c = case["config"]
    targets = [LatexExtractionConfig(boxed_match_priority=c["boxed_priority"]) if t == "latex"
               else ExprExtractionConfig() for t in c["match_types"]]
    try:
        return float(verify(parse(case["gold"], targets), parse(case["pred"], targets),
                            float_rounding=c["precision"], strict=c["strict"],
                            allow_set_relation_comp=c["allow_set_relation_comp"]))
    except Exception:
        return 0.0


def in_child(fn, limit):
    """fn() in a forked child: (result, "") or (None, why) if it raised, died or ran past `limit` s.
    fgrpo.verify never runs in this process, so a crash cannot leave a broken worker pool here."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def target():
        try:
            send.send((fn(), ""))
        except BaseException as e:
            send.send((None, f"{type(e).__name__}: {e}"[:200]))
    child = ctx.Process(target=target)
    child.start()
    send.close()
    try:
        result = recv.recv() if recv.poll(limit) else (None, f"no answer in {limit:.0f}s")
    except EOFError:
        result = (None, "the child process died")
    child.join(30)
    if child.is_alive():
        child.kill()
        child.join()
    return result


def score_all(verify_fn, preds, golds, kw, limit, chunk=16):
    """verify_fn(preds, golds) as one batch. If that fails: chunks of `chunk` cases, then each case
    of a failed chunk alone, so one bad case costs only its own score. (scores, errors, why)."""
    run = lambda idx, limit: in_child(lambda: [float(s) for s in verify_fn(
        [preds[i] for i in idx], [golds[i] for i in idx], **kw)], limit)
    scores, why = run(range(len(preds)), limit)
    if scores is not None:
        return scores, [""] * len(preds), ""
    print(f"the batched call failed ({why}); retrying in chunks of {chunk}, then alone",
          file=sys.stderr)
    scores, errors = [None] * len(preds), [""] * len(preds)
    for start in range(0, len(preds), chunk):
        idx = range(start, min(start + chunk, len(preds)))
        got, _ = run(idx, 300)
        for k, i in enumerate(idx):
            if got is not None:
                scores[i] = got[k]
            else:  # this chunk failed: its cases one by one
                one, errors[i] = run([i], 120)
                scores[i] = one[0] if one else None
    return scores, errors, why


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tests", required=True,
                   help="folder holding Math-Verify's tests/*.py (a clone's tests/)")
    p.add_argument("--out", required=True, help="JSON file for the per-case results")
    p.add_argument("--fgrpo", metavar="FILE", help="import fgrpo from this file (e.g. an older "
                   "version, from `git show REV:fgrpo.py`) instead of the repository's fgrpo.py")
    p.add_argument("--timeout", type=float,
                   help="timeout passed to fgrpo.verify (None: its own default)")
    p.add_argument("--batch-limit", type=float, default=1800,
                   help="seconds the batched fgrpo.verify call may take before it counts as failed")
    p.add_argument("--self-check", action="store_true",
                   help="score the 'fgrpo' column with the serial reference instead of "
                        "fgrpo.verify, to check the harness itself (every fgrpo-vs-reference row "
                        "must read 100%%)")
    p.add_argument("--show", type=int, default=10,
                   help="print this many fgrpo-vs-reference disagreements")
    return p.parse_args()


def load_verify(args):
    """The function that scores the 'fgrpo' column: fgrpo.verify, or the serial reference."""
    if args.self_check:
        return lambda preds, golds, **_: [verl_score(pr, g) for pr, g in zip(preds, golds)]
    spec = importlib.util.spec_from_file_location(
        "fgrpo", args.fgrpo or Path(__file__).resolve().parent.parent / "fgrpo.py")
    sys.modules["fgrpo"] = fgrpo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fgrpo)
    return fgrpo.verify


def report(cases, skipped, errors, batch_error, args):
    """One row per configuration label (and the three groups), columns = agreement rates."""
    pairs = {"fgrpo~ref": ("fgrpo", "reference"), "fgrpo~expected": ("fgrpo", "expected"),
             "ref~expected": ("reference", "expected"), "unwrapped~exp": ("unwrapped", "expected"),
             "native~exp": ("native", "expected")}
    group = lambda c: ("default" if c["label"] == "default" else "boxed-first only"
                       if c["label"] == "boxed-first" else "other")
    rows_of = defaultdict(list)
    for c in cases:
        rows_of["  " + c["label"]].append(c)
        rows_of["[" + group(c) + "]"].append(c)
        rows_of["ALL"].append(c)
    print(f"{len(cases)} cases from {args.tests}; {len(skipped)} skipped (non-literal)"
          + (" -- SELF-CHECK: 'fgrpo' is the serial reference" if args.self_check else ""))
    if batch_error:
        print(f"the batched fgrpo.verify call FAILED: {batch_error}\n"
              f"rescored in chunks, then alone: {sum(map(bool, errors))} cases failed alone too")
    print(f"{'agreement (a~b: cases where a == b)':<56}{'n':>4}"
          + "".join(f"{h:>15}" for h in pairs))
    for name in sorted(rows_of, key=lambda k: (k == "ALL", not k.startswith("["), k)):
        rs = rows_of[name]
        print(f"{name:<56}{len(rs):>4}" + "".join(
            f"{sum(r[a] == r[b] for r in rs):>11}/{len(rs):<3}" for a, b in pairs.values()))
    bad = [c for c in cases if c["fgrpo"] != c["reference"]]
    for c in bad[:args.show]:
        print(f"  {c['file']}:{c['line']} gold={c['gold'][:40]!r} pred={c['pred'][-50:]!r} "
              f"fgrpo={c['fgrpo_error'] or c['fgrpo']} reference={c['reference']:.0f} "
              f"expected={c['expected']:.0f}")


def main():
    args = parse_args()
    cases, skipped = extract(args.tests)
    if not cases:
        sys.exit(f"error: no cases found in {args.tests}/*.py")
    verify_fn = load_verify(args)
    kw = {} if args.timeout is None else {"timeout": args.timeout}
    ours, errors, batch_error = score_all(verify_fn, [c["pred"] for c in cases],
                                          [c["gold"] for c in cases], kw, args.batch_limit)
    for case, score, error in zip(cases, ours, errors):
        case.update(fgrpo=score, fgrpo_error=error,
                    reference=verl_score(case["pred"], case["gold"]),
                    unwrapped=verl_score(case["pred"], case["gold"], wrap=False),
                    native=native_score(case))
    report(cases, skipped, errors, batch_error, args)
    source = "self-check" if args.self_check else str(args.fgrpo or "fgrpo.py")
    Path(args.out).write_text(json.dumps(dict(fgrpo=source, batch_error=batch_error, cases=cases,
                                              skipped=skipped), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
