#!/usr/bin/env python3
"""The spottrain command surface: --help everywhere, exit 2 on bad input, version, help."""
import os
import shutil
import subprocess
import sys

BIN = os.environ["SPOTTRAIN_BIN"]
failures = []


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"not ok - {what}")
    else:
        print(f"ok - {what}")


rc, out, err = run("--help")
check(rc == 0 and "Commands:" in out, "--help lists commands")
commands = []
listing = False
for line in out.splitlines():
    if line.startswith("Commands:"):
        listing = True
        continue
    if listing and line.startswith("  ") and line.strip():
        name = line.split()[0]
        if name != "help":
            commands.append(name)
    elif listing and not line.strip():
        break
for must in ["validate", "simulate", "predict", "plan", "train", "ckpt", "data",
             "coordinator", "worker", "status"]:
    check(must in commands, f"'{must}' is listed")

for c in commands:
    rc, out, err = run(c, "--help")
    check(rc == 0 and "Usage: spottrain " + c in out, f"{c} --help exits 0 with usage")
    rc, out, err = run("help", c)
    check(rc == 0 and "Usage: spottrain " + c in out, f"help {c} prints the usage")
    rc, out, err = run(c, "--no-such-flag")
    check(rc == 2 and err.strip() != "", f"{c} --no-such-flag exits 2 with a message")

rc, out, err = run()
check(rc == 2 and "Usage:" in err, "no command: usage on stderr, exit 2")
rc, out, err = run("no-such-command")
check(rc == 2 and "unknown command 'no-such-command'" in err, "unknown command exits 2")
rc, out, err = run("help", "no-such-command")
check(rc == 2, "help of an unknown command exits 2")
rc, out, err = run("help", "--help")
check(rc == 0 and "Commands:" in out, "help --help prints the help")
rc, out, err = run("--version")
check(rc == 0 and out.startswith("spottrain "), "--version")
rc, out, err = run("version")
check(rc == 0 and out.startswith("spottrain "), "version")
rc, out, err = run("version", "extra")
check(rc == 2, "version with an argument exits 2")

# The chaos suite's hooks are armed from the environment: a malformed count is bad input.
import tempfile  # noqa: E402
SPEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples",
                    "quickstart.yaml")
with tempfile.TemporaryDirectory(prefix="st-cli-") as d:
    for var in ("SPOTTRAIN_TEST_CKPT_ENOSPC", "SPOTTRAIN_TEST_DATA_CUT",
                "SPOTTRAIN_TEST_PEER_CUT", "SPOTTRAIN_TEST_STALL_STEP",
                "SPOTTRAIN_TEST_LEAVE_KILLED"):
        for bad in ("x", "-1", "3k"):
            p = subprocess.run([BIN, "worker", "--coordinator", "127.0.0.1:1", "--job", SPEC,
                                "--state-dir", d], capture_output=True, text=True, timeout=30,
                               env=dict(os.environ, **{var: bad}))
            check(p.returncode == 2 and f"invalid {var} '{bad}'" in p.stderr,
                  f"worker with {var}={bad} exits 2 ({p.returncode})")
    # The boundary hold (seconds): not a number, negative, or more than an hour; the tied
    # copies' delay (seconds): the same, or more than a minute.
    for var, bads in (("SPOTTRAIN_TEST_BOUNDARY_DELAY", ("x", "-1", "1e9", "nan")),
                      ("SPOTTRAIN_TEST_TIED_DELAY", ("x", "-1", "61", "nan", "2s"))):
        for bad in bads:
            p = subprocess.run([BIN, "worker", "--coordinator", "127.0.0.1:1", "--job", SPEC,
                                "--state-dir", d], capture_output=True, text=True, timeout=30,
                               env=dict(os.environ, **{var: bad}))
            check(p.returncode == 2 and f"invalid {var} '{bad}'" in p.stderr,
                  f"worker with {var}={bad} exits 2 ({p.returncode})")
    # The sim's workers die with the run (SPOTTRAIN_PARENT_PID): a malformed pid is bad
    # input; a parent already gone before the worker could tie itself to it ends the worker.
    var = "SPOTTRAIN_PARENT_PID"
    for bad in ("x", "1", "-5", "99999999999", "12z"):
        p = subprocess.run([BIN, "worker", "--coordinator", "127.0.0.1:1", "--job", SPEC,
                            "--state-dir", d], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, **{var: bad}))
        check(p.returncode == 2 and f"invalid {var} '{bad}'" in p.stderr,
              f"worker with {var}={bad} exits 2 ({p.returncode})")
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    p = subprocess.run([BIN, "worker", "--coordinator", "127.0.0.1:1", "--job", SPEC,
                        "--state-dir", d], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, **{var: str(gone.pid)}))
    check(p.returncode == 1 and f"the process that started me (pid {gone.pid}) is gone"
          in p.stderr, f"worker whose parent is gone exits 1 ({p.returncode}: {p.stderr!r})")

# The GPU machine's scripts: --help, and device-check without the pack device-pack makes
# says so and exits 2 (a copy of it in a tree that has none).
SRC = os.environ["SPOTTRAIN_SRCDIR"]
for script in ("device-pack", "device-check"):
    p = subprocess.run([os.path.join(SRC, "scripts", script), "--help"], capture_output=True,
                       text=True, timeout=30)
    check(p.returncode == 0 and "Usage: scripts/" + script in p.stdout, f"{script} --help")
with tempfile.TemporaryDirectory() as d:
    os.mkdir(os.path.join(d, "scripts"))
    shutil.copy(os.path.join(SRC, "scripts", "device-check"), os.path.join(d, "scripts"))
    p = subprocess.run([os.path.join(d, "scripts", "device-check")], capture_output=True,
                       text=True, timeout=30)
    check(p.returncode == 2 and "no .devpack (run scripts/device-pack)" in p.stderr,
          f"device-check without a pack exits 2 ({p.returncode}: {p.stderr!r})")

# scripts/soak (the suite again and again under load): --help, and each bad argument refused
# with exit 2 and why, before anything is cloned; outside a git checkout it says so.
SOAK = os.path.join(SRC, "scripts", "soak")
p = subprocess.run([SOAK, "--help"], capture_output=True, text=True, timeout=30)
check(p.returncode == 0 and "Usage: scripts/soak" in p.stdout, "soak --help")
for args, why in ((["--runs", "0"], "--runs wants a positive integer"),
                  (["--runs", "x"], "--runs wants a positive integer"),
                  (["--load", "-1"], "--load wants an integer >= 0"),
                  (["--runs"], "--runs wants a value"),
                  (["--dir"], "--dir wants a value"),
                  (["--bogus"], "unknown argument '--bogus'")):
    p = subprocess.run([SOAK] + args, capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and why in p.stderr, f"soak {args}: {p.returncode} {p.stderr!r}")
with tempfile.TemporaryDirectory() as d:
    os.mkdir(os.path.join(d, "scripts"))
    shutil.copy(SOAK, os.path.join(d, "scripts"))
    p = subprocess.run([os.path.join(d, "scripts", "soak"), "--runs", "1"], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, GIT_CEILING_DIRECTORIES=d))
    check(p.returncode == 2 and "not a git checkout" in p.stderr,
          f"soak outside a checkout exits 2 ({p.returncode}: {p.stderr!r})")
    check(not os.path.exists(os.path.join(d, "build-soak")), "soak made nothing there")

# A --save that cannot be written is bad input, found before any training: `run` used to
# start its workers, fail each of them at the final save and restart the job for ever. `run`
# checks it after making its temporary state directory, which must not be left behind.
SAVE_SPEC = """apiVersion: spottrain/v1
kind: TrainingJob
metadata: {name: save-check}
spec:
  model: {layers: 2, hidden: 32, heads: 2, vocab: 64, seq_len: 16}
  training: {micro_batch: 2, global_batch: 4, steps: 5}
  data:
    train: data.bin
    synth: {kind: markov, order: 1, seed: 3, tokens: 20000}
  fleet: {provider: sim, min: 1, max: 2, trace: trace.csv, time_scale: 0.01}
"""
with tempfile.TemporaryDirectory(prefix="st-cli-save-") as d:
    tmp = os.path.join(d, "tmp")
    os.mkdir(tmp)
    with open(os.path.join(d, "job.yaml"), "w") as f:
        f.write(SAVE_SPEC)
    with open(os.path.join(d, "trace.csv"), "w") as f:
        f.write("0,2\n")
    with open(os.path.join(d, "file"), "w") as f:
        f.write("a file, not a directory\n")
    # ENOTDIR, for root too: under a file, and the file itself (mkdir -p used to accept a file
    # that was there already, and the final save failed on it)
    for bad in (os.path.join(d, "file", "save"), os.path.join(d, "file")):
        for cmd in (["run"], ["train", "--local"]):
            p = subprocess.run([BIN] + cmd + [os.path.join(d, "job.yaml"), "--save", bad],
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, TMPDIR=tmp))
            want = f"spottrain {cmd[0]}: cannot use --save '{bad}': Not a directory"
            check(p.returncode == 2 and want in p.stderr,
                  f"{' '.join(cmd)} --save {bad} exits 2 ({p.returncode}: {p.stderr[-300:]!r})")
            check("step 1" not in p.stdout and "step 1" not in p.stderr,
                  f"{' '.join(cmd)} trained nothing before refusing the --save")
    # A --state-dir that is a file, or under one.
    for sd in (os.path.join(d, "file"), os.path.join(d, "file", "state")):
        p = subprocess.run([BIN, "run", os.path.join(d, "job.yaml"), "--state-dir", sd],
                           capture_output=True, text=True, timeout=60)
        want = f"spottrain run: cannot create --state-dir '{sd}': Not a directory"
        check(p.returncode == 2 and want in p.stderr,
              f"run --state-dir {sd} exits 2 ({p.returncode}: {p.stderr[-300:]!r})")
    check(os.listdir(tmp) == [], f"run left its state directory behind: {os.listdir(tmp)}")
    # The same for the summary file: refused before the job starts, not lost after it ran.
    # launch checks it (and a store --save) before it asks its cloud for any instance: this
    # spec's fleet has no endpoint and no credentials, and nothing may try to reach one.
    summ = os.path.join(d, "file", "summary.json")
    with open(os.path.join(d, "launch.yaml"), "w") as f:
        f.write(SAVE_SPEC.replace("metadata: {name: save-check}", "metadata: {name: launch-check}")
                .replace("fleet: {provider: sim, min: 1, max: 2, trace: trace.csv, time_scale: 0.01}",
                         "fleet: {provider: aws, instance_type: t3.micro, image: ami-12c6146b, "
                         "zones: [us-east-1a], max: 1}\n"
                         "  coordinator: {listen: \"127.0.0.1:0\", advertise: \"127.0.0.1:1\"}"))
    # --save-costs (the migration costs the job fitted) is checked the same way.
    for flag, out in (("--json-summary", summ), ("--save-costs", os.path.join(d, "file", "c.json"))):
        for cmd, job in ((["run"], "job.yaml"),
                         (["launch", "--state-dir", os.path.join(d, "ls")], "launch.yaml")):
            p = subprocess.run([BIN] + cmd + [os.path.join(d, job), flag, out],
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, TMPDIR=tmp,
                                        AWS_ENDPOINT_URL="http://127.0.0.1:1"))
            want = f"spottrain {cmd[0]}: cannot write {flag} '{out}': Not a directory"
            check(p.returncode == 2 and want in p.stderr,
                  f"{cmd[0]} {flag} under a file exits 2 ({p.returncode}: {p.stderr[-300:]!r})")
    p = subprocess.run([BIN, "run", os.path.join(d, "job.yaml"), "--json-summary", d],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, TMPDIR=tmp))
    check(p.returncode == 2 and
          f"spottrain run: cannot write --json-summary '{d}': Is a directory" in p.stderr,
          f"run --json-summary DIR exits 2 ({p.returncode}: {p.stderr[-300:]!r})")
    check(os.listdir(tmp) == [], f"run left its state directory behind: {os.listdir(tmp)}")
    # A job that measured no live migration (one shape all along) has no costs to write, says
    # so, and leaves the --save-costs file as it was.
    costs = os.path.join(d, "costs.json")
    p = subprocess.run([BIN, "run", os.path.join(d, "job.yaml"), "--steps", "2", "--save-costs",
                        costs, "--state-dir", os.path.join(d, "st-costs")],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0 and
          f"costs: no live migration was measured; '{costs}' left as it was" in p.stdout and
          not os.path.exists(costs),
          f"a run without migrations writes no costs ({p.returncode}: {p.stdout[-300:]!r} "
          f"{p.stderr[-300:]!r})")
    # A --save-costs whose directory is gone by the end (checked when the job started): the
    # job's work stands, the costs are lost, and run says so and exits 1. A forced 1x1 -> 2x1
    # gives it a live migration to write; the directory goes once the coordinator is up.
    sub = os.path.join(d, "gone")
    os.mkdir(sub)
    costs = os.path.join(sub, "costs.json")
    job = subprocess.Popen([BIN, "run", os.path.join(d, "job.yaml"), "--steps", "40", "--shapes",
                            "0:1x1,5:2x1", "--save-costs", costs, "--state-dir",
                            os.path.join(d, "st-gone")], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    line = job.stderr.readline()
    while line and "coordinator grpc=" not in line:  # the coordinator is up: the check passed
        line = job.stderr.readline()
    check("coordinator grpc=" in line, "run never started its coordinator")
    os.rmdir(sub)
    out, err = job.communicate(timeout=300)
    check(job.returncode == 1 and
          f"spottrain run: cannot write --save-costs '{costs}': No such file or directory" in err
          and "final loss" in out,
          f"a --save-costs directory gone by the end exits 1 ({job.returncode}: "
          f"{out[-300:]!r} {err[-300:]!r})")
    # A directory that does not exist yet is made, as the final save would make it.
    good = os.path.join(d, "out", "final")
    p = subprocess.run([BIN, "train", "--local", os.path.join(d, "job.yaml"), "--steps", "1",
                        "--save", good], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and os.path.isfile(os.path.join(good, "manifest.json")),
          f"train --local --save into a new directory ({p.returncode}: {p.stderr[-300:]!r})")

# `data synth` to a place that cannot take the file: bad input, said in the command's words.
with tempfile.TemporaryDirectory(prefix="st-cli-synth-") as d:
    with open(os.path.join(d, "file"), "w") as f:
        f.write("x\n")
    bad = os.path.join(d, "file", "corpus.bin")
    p = subprocess.run([BIN, "data", "synth", "--out", bad, "--tokens", "1000"],
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and p.stderr == f"spottrain data: cannot write '{bad}': Not a directory\n",
          f"data synth --out under a file exits 2 ({p.returncode}: {p.stderr!r})")

# One coordinator per state directory: a second `run` on the one a running job uses is refused
# (it used to take the job over beside the first, launch its own workers and fail after 20 s).
with tempfile.TemporaryDirectory(prefix="st-cli-lock-") as d:
    with open(os.path.join(d, "job.yaml"), "w") as f:
        f.write(SAVE_SPEC)
    with open(os.path.join(d, "trace.csv"), "w") as f:
        f.write("0,1\n")
    sd = os.path.join(d, "state")
    err = open(os.path.join(d, "first.err"), "w+")
    first = subprocess.Popen([BIN, "run", os.path.join(d, "job.yaml"), "--steps", "100000000",
                              "--state-dir", sd], stdout=subprocess.DEVNULL, stderr=err)
    try:
        import time
        deadline = time.time() + 60
        while time.time() < deadline and first.poll() is None:
            err.seek(0)
            if "coordinator grpc=" in err.read():  # its journal is open
                break
            time.sleep(0.05)
        p = subprocess.run([BIN, "run", os.path.join(d, "job.yaml"), "--steps", "5",
                            "--state-dir", sd], capture_output=True, text=True, timeout=60)
        want = f"State directory '{sd}/journal' is in use: another coordinator holds its journal"
        check(p.returncode == 1 and want in p.stderr and first.poll() is None,
              f"a second run on a state directory in use exits 1 ({p.returncode}: "
              f"{p.stderr[-400:]!r}), the first runs on")
    finally:
        first.terminate()
        check(first.wait(timeout=60) is not None, "the first run stops on SIGTERM")
        err.close()

# A trace that does not parse: validate used to call the spec valid and run found it only
# after making the corpus (and said "Invalid argument" after the parser's line). Both now
# print the parser's message and exit 2, run before it makes anything.
with tempfile.TemporaryDirectory(prefix="st-cli-trace-") as d:
    tmp = os.path.join(d, "tmp")
    os.mkdir(tmp)
    with open(os.path.join(d, "job.yaml"), "w") as f:
        f.write(SAVE_SPEC)
    trace = os.path.join(d, "trace.csv")
    for text, why in (("garbage\n1,2,3\n", f"{trace}:1:1: header: unknown header 'garbage'"),
                      ("", f"{trace}: trace: no events in trace")):
        with open(trace, "w") as f:
            f.write(text)
        for cmd in ("validate", "run"):
            p = subprocess.run([BIN, cmd, os.path.join(d, "job.yaml")], capture_output=True,
                               text=True, timeout=60, env=dict(os.environ, TMPDIR=tmp))
            check(p.returncode == 2 and f"spottrain {cmd}: {why}" in p.stderr and
                  "Invalid argument" not in p.stderr,
                  f"{cmd} with the trace {text!r} exits 2 ({p.returncode}: {p.stderr[-300:]!r})")
    check(not os.path.exists(os.path.join(d, "data.bin")) and os.listdir(tmp) == [],
          f"run made nothing before refusing the trace: {os.listdir(d)} {os.listdir(tmp)}")

print(f"{len(failures) == 0 and 'all' or len(failures)} {'passed' if not failures else 'failed'}")
sys.exit(1 if failures else 0)
