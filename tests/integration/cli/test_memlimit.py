#!/usr/bin/env python3
"""Commands under an address-space limit (`ulimit -v`): those that do no math never start
OpenBLAS, so they run; one that trains and cannot have OpenBLAS's buffers says so and exits,
instead of spinning in OpenBLAS's allocator (issue 18).

The deadlines are generous bounds for a loaded machine, not timings: a spinning command
never exits, so any bound tells the two apart."""
import os
import resource
import subprocess
import sys
import tempfile

BIN = os.environ["SPOTTRAIN_BIN"]
SRC = os.environ["SPOTTRAIN_SRCDIR"]
LIMIT = 1 << 30  # the issue's `ulimit -v 1048576` (KiB)
failures = []


def check(cond, what):
    print(("ok - " if cond else "not ok - ") + what)
    if not cond:
        failures.append(what)


def limited(args, deadline, limit=LIMIT, env=None):
    def pre():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=deadline,
                           preexec_fn=pre, env=env)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or "", e.stderr or ""


env = dict(os.environ)
# The user's own settings would hide the defect this test is about.
env.pop("OPENBLAS_NUM_THREADS", None)
env.pop("OMP_NUM_THREADS", None)
# ASan reserves terabytes of shadow memory: an address-space limit cannot apply to it.
with open(BIN, "rb") as f:
    asan = b"__asan_init" in f.read()
if asan:
    print("skip: an ASan build cannot run under an address-space limit")
    sys.exit(77)

rc, out, err = limited(["version"], 5, env=env)
check(rc == 0, f"version under a 1 GiB limit exits 0 within 5 s (rc {rc}, stderr {err!r})")
check(out.startswith("spottrain "), f"version prints the version ({out!r})")

rc, out, err = limited(["--help"], 5, env=env)
check(rc == 0 and "Commands:" in out, f"--help under a 1 GiB limit exits 0 (rc {rc})")

rc, out, err = limited(["validate", os.path.join(SRC, "examples", "quickstart.yaml")], 10,
                       env=env)
check(rc == 0, f"validate under a 1 GiB limit exits 0 (rc {rc}, stderr {err!r})")

# 64 threads hold 127 OpenBLAS buffers of 128 MiB: more than 1 GiB on any machine.
with tempfile.TemporaryDirectory() as d:
    spec = os.path.join(d, "job.yaml")
    with open(os.path.join(SRC, "examples", "quickstart.yaml")) as f:
        text = f.read()
    text = text.replace("data/quickstart-markov1.bin", os.path.join(d, "corpus.bin"))
    text = text.replace("tokens: 1000000", "tokens: 20000")
    text = text.replace("traces/quickstart-trace.csv",
                        os.path.join(SRC, "examples", "traces", "quickstart-trace.csv"))
    with open(spec, "w") as f:
        f.write(text)
    rc, out, err = limited(["train", "--local", spec, "--steps", "2", "--threads", "64"], 60,
                           env=env)
    check(rc == 1, f"train --threads 64 under a 1 GiB limit exits 1, not a spin (rc {rc})")
    want = ("spottrain train: not enough memory for OpenBLAS: 64 thread(s) need 127 buffers "
            "of 128 MiB of address space")
    check(want in err, f"and says why ({err.strip()!r})")
    check("step 1" not in out, "and trains nothing")

sys.exit(1 if failures else 0)
