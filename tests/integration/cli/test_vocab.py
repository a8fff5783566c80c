#!/usr/bin/env python3
"""test_vocab.py: one predictor vocabulary. For every forecaster name (and a few that are not),
`spottrain validate` accepts it in planner.predictor exactly when `spottrain simulate
--predictor NAME` and `spottrain predict --predictor NAME` do; an unknown name makes validate
exit 2 with the list of known names, at the field's line and column.

Usage: test_vocab.py (env SPOTTRAIN_BIN, SPOTTRAIN_SRCDIR). Exit 0 pass, 1 fail.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ.get("SPOTTRAIN_BIN", "build/spottrain")
SRC = os.environ.get("SPOTTRAIN_SRCDIR", ".")
KNOWN = ["last-value", "arima", "damped", "notice"]

SPEC = """apiVersion: spottrain/v1
kind: TrainingJob
metadata:
  name: vocab
spec:
  model: {{layers: 2, hidden: 32, heads: 2, vocab: 64, seq_len: 16}}
  training: {{micro_batch: 2, global_batch: 8, steps: 10}}
  data: {{train: data.bin, synth: {{kind: markov, order: 1, seed: 3, tokens: 5000}}}}
  fleet: {{provider: sim, max: 4, trace: trace.csv}}
  planner:
    predictor: {pred}
"""

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL: " + what)


def run(*args):
    p = subprocess.run([BIN] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def main():
    d = tempfile.mkdtemp(prefix="st-vocab-")
    try:
        return check_vocab(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def check_vocab(d):
    trace = os.path.join(d, "trace.csv")
    with open(trace, "w") as f:
        f.write("".join("%d,%d\n" % (60 * i, 2 + (i * 7) % 5) for i in range(40)))
    profile = os.path.join(SRC, "traces", "parcae-cost-profiles.json")
    # The planner's own list, from `simulate --predictor bogus`'s message.
    rc, out, err = run("simulate", "--trace", trace, "--profile", profile, "--model",
                       "gpt-1.5b_gbs128_mbs1", "--predictor", "bogus", "--policy", "liveput")
    m = re.search(r"one of: ([a-z, -]+)", err)
    check(rc == 2 and m, "simulate --predictor bogus exits 2 listing the names: %d %r" % (rc, err))
    names = [n.strip() for n in m.group(1).split(",")] if m else []
    check(names == KNOWN, "the planner's names: %r" % names)
    for name in names + ["bogus", "ensemble", "Notice", "last_value"]:
        job = os.path.join(d, "job.yaml")
        with open(job, "w") as f:
            f.write(SPEC.format(pred=name))
        v, _, verr = run("validate", job)
        s, _, serr = run("simulate", "--trace", trace, "--profile", profile, "--model",
                         "gpt-1.5b_gbs128_mbs1", "--predictor", name, "--policy", "liveput", "--json")
        p, _, perr = run("predict", "--trace", trace, "--predictor", name)
        ok = name in KNOWN
        check(v == (0 if ok else 2), "validate %s: exit %d %s" % (name, v, verr[-300:]))
        check(s == (0 if ok else 2), "simulate --predictor %s: exit %d %s" % (name, s, serr[-300:]))
        check(p == (0 if ok else 2), "predict --predictor %s: exit %d %s" % (name, p, perr[-300:]))
        if not ok:
            want = "job.yaml:11:16: spec.planner.predictor: invalid value '%s' (expected one " \
                   "of: %s)" % (name, ", ".join(KNOWN))
            check(want in verr, "validate names the field and the known names: %r" % verr)
    print("%d failed" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
