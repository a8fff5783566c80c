#!/usr/bin/env python3
"""test_feasible.py: a job no shape can run is an error, not a silent wait (issue 19).

  validate    `spottrain validate` exits 2 on specs no (dp, pp) shape satisfies, with one line
              file:line:col: field: message naming the field and the nearest workable shapes;
              `spottrain run` refuses the same spec before starting anything
  wait        a fleet too small for the smallest allowed shape: GET /v1/job says why the job
              waits (waiting_reason), /metrics has spottrain_waiting 1, and after
              planner.wait_limit the job stops with that error in its summary

Usage: test_feasible.py NAME  (env SPOTTRAIN_BIN). Exit 0 pass, 1 fail.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN = os.environ.get("SPOTTRAIN_BIN", "build/spottrain")

# Line numbers matter: the expected positions below count from the first line.
SPEC = """apiVersion: spottrain/v1
kind: TrainingJob
metadata:
  name: feasible
spec:
  model: {{layers: 2, hidden: 32, heads: 2, vocab: 64, seq_len: 16}}
  training:
    micro_batch: 2
    global_batch: 16
    steps: 50
  data:
    train: data.bin
    synth: {{kind: markov, order: 1, seed: 3, tokens: 20000}}
  fleet:
    provider: sim
    max: {max}
    trace: trace.csv
    time_scale: {scale}
    gpu_memory: {mem}
  planner:
    interval: 60s
    dp: {dp}
    pp: {pp}
    wait_limit: {wait}
  checkpoint: {{interval: 0s}}
  status: {{listen: "127.0.0.1:0"}}
"""


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def write(d, trace="seconds,N\n0,1\n6000,1\n", max=8, scale=0.01, mem="16GiB",
          dp="{min: 1, max: 8}", pp="{min: 1, max: 2}", wait="30m"):
    with open(os.path.join(d, "trace.csv"), "w") as f:
        f.write(trace)
    path = os.path.join(d, "job.yaml")
    with open(path, "w") as f:
        f.write(SPEC.format(max=max, scale=scale, mem=mem, dp=dp, pp=pp, wait=wait))
    return path


def sh(args, timeout):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def test_validate():
    d = tempfile.mkdtemp(prefix="st-feas-")
    try:
        cases = [
            # The example: dp pinned to 64 with global_batch 16 and 8 instances.
            (dict(dp="64"), "22:9: spec.planner.dp: no (dp, pp) shape can run with dp pinned "
             "to 64 (dp x micro_batch 2 must divide global_batch 16 and dp x pp fit 8 workers); "
             "nearest workable shapes (dp x pp): 8x1, 4x1, 4x2, 2x1"),
            # dp bounds that global_batch cannot split.
            (dict(dp="{min: 9, max: 12}"), "22:9: spec.planner.dp: no (dp, pp) shape can run "
             "with dp in 9..12 (dp x micro_batch 2 must divide global_batch 16 and dp x pp fit 8 "
             "workers); nearest workable shapes (dp x pp): 8x1, 4x1, 4x2, 2x1"),
            # pp: at least 3 stages on 2 instances.
            (dict(max=2, pp="{min: 3}"), "23:9: spec.planner.pp: no (dp, pp) shape can run with "
             "pp >= 3 (the pipeline has 4 layers and dp x pp must fit 2 workers); nearest "
             "workable shapes (dp x pp): 1x2, 1x1, 2x1"),
            # fleet: in 500 KiB only 3 or more stages fit, and 2 instances hold 2.
            (dict(max=2, mem="500KiB", pp="{min: 1}"), "16:10: spec.fleet.max: fleet.max x "
             "gpus_per_instance = 2 workers, fewer than any allowed (dp, pp) shape needs (the "
             "smallest needs 3); nearest workable shapes (dp x pp): 1x3, 2x3, 4x3, 4x4"),
            # memory: nothing fits in 32 KiB.
            (dict(mem="32KiB"), "19:17: spec.fleet.gpu_memory: no allowed (dp, pp) shape's "
             "fullest stage fits in 2.747e-05 GiB (90% of fleet.gpu_memory; the smallest needs "
             "0.0005474 GiB); nearest workable shapes (dp x pp): 1x1, 2x1, 4x1, 8x1"),
        ]
        for kw, want in cases:
            job = write(d, **kw)
            rc, out, err = sh([BIN, "validate", job], 30)
            check(rc == 2, "validate %s exited %d, expected 2: %s" % (kw, rc, out + err))
            check(err == job + ":" + want + "\n", "validate %s:\n got: %s\nwant: %s:%s" % (
                kw, err, job, want))
        # run refuses it the same way, before any worker starts.
        job = write(d, dp="64")
        rc, out, err = sh([BIN, "run", job, "--state-dir", os.path.join(d, "state")], 30)
        check(rc == 2, "run exited %d, expected 2: %s" % (rc, err))
        check(job + ":22:9: spec.planner.dp: no (dp, pp) shape" in err, "run: " + err)
        check(not os.path.exists(os.path.join(d, "state")), "run started a job")
        # A workable spec still validates.
        job = write(d)
        rc, out, err = sh([BIN, "validate", job], 30)
        check(rc == 0, "validate of a workable spec exited %d: %s" % (rc, err))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def test_wait():
    d = tempfile.mkdtemp(prefix="st-feas-")
    proc = None
    try:
        # dp pinned to 2 on one instance: the smallest allowed shape (2x1) needs 2 workers.
        # wait_limit 30 minutes of trace time at 0.01 s per trace second = 18 s of wall time.
        job = write(d, dp="2", wait="30m")
        summ = os.path.join(d, "summary.json")
        errf = open(os.path.join(d, "stderr"), "w")
        proc = subprocess.Popen([BIN, "run", job, "--json-summary", summ, "--state-dir",
                                 os.path.join(d, "state")], stdout=subprocess.PIPE,
                                stderr=errf, text=True)
        want = "the smallest shape the spec allows needs 2 workers, 1 alive"
        rest, seen, metric = None, None, None
        deadline = time.time() + 60
        # Before the one worker joins the reason says 0 alive: wait for the settled state.
        while time.time() < deadline and proc.poll() is None and seen != want:
            if rest is None:
                with open(os.path.join(d, "stderr")) as f:
                    for w in f.read().split():
                        if w.startswith("rest=http://"):
                            rest = w[len("rest="):]
            else:
                j = json.loads(get(rest + "/v1/job"))
                seen = j["waiting_reason"]
                if seen == want:
                    metric = [l for l in get(rest + "/metrics").splitlines()
                              if l.startswith("spottrain_waiting ")]
            time.sleep(0.1)
        check(seen == want, "waiting_reason %r, expected %r" % (seen, want))
        check(metric == ["spottrain_waiting 1"], "metric: %s" % metric)
        out, _ = proc.communicate(timeout=120)
        sys.stdout.write(out[-3000:])
        check(proc.returncode == 1, "run exited %d, expected 1" % proc.returncode)
        check("waiting: " + want + "\n" in out, "no waiting event in the output")
        with open(summ) as f:
            s = json.load(f)
        err = ("no fleet could host a shape the spec allows for 1800s (planner.wait_limit): "
               + want)
        check(s["error"] == err, "summary error %r" % s.get("error"))
        check(s["steps"] == 0 and not s["finished"], "steps %d finished %s" % (
            s["steps"], s["finished"]))
        check("  error              " + err + "\n" in out, "no error line in the summary")
    finally:
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(d, ignore_errors=True)


TESTS = {"validate": test_validate, "wait": test_wait}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in TESTS:
        print("usage: test_feasible.py %s" % "|".join(TESTS))
        sys.exit(2)
    try:
        TESTS[name]()
    except Fail as e:
        print("FAIL %s: %s" % (name, e))
        sys.exit(1)
    except subprocess.TimeoutExpired as e:
        print("FAIL %s: timed out: %s" % (name, e))
        sys.exit(1)
    print("ok %s" % name)
    sys.exit(0)
