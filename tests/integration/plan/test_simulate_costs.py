#!/usr/bin/env python3
"""test_simulate_costs.py: `spottrain simulate --migration-costs FILE --link-gbps G`.

On Parcae's gpt-1.5b trace with live-migration costs of the shape `scripts/bench migration`
writes (fixed stalls well above what the bench measures on the quickstart), policy liveput
reaches >= 0.98 of ideal at a 10 Gb/s link, prints Parcae's accounting of the same policy
beside it (lower), keeps the JSON shape of a run without the file, and a file with larger
fixed parts gives a lower fraction. Bad cost files and flags exit 2 naming the field."""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("SPOTTRAIN_SRCDIR", os.path.join(os.path.dirname(__file__), "../../.."))
BIN = os.environ.get("SPOTTRAIN_BIN", os.path.join(SRC, "build", "spottrain"))
TRACE = os.path.join(SRC, "traces/per-model/gpt-1.5b_p3_gbs128_mbs1.jsonl")
PROFILE = os.path.join(SRC, "traces/parcae-cost-profiles.json")
MODEL = "gpt-1.5b_gbs128_mbs1"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def costs(fixed_s):
    kinds = {k: {"fixed_s": fixed_s, "bytes_per_s": 2.0e9, "raw_bytes_per_s": 2.5e9}
             for k in ("intra-stage", "inter-stage", "pipeline", "dp-resharding")}
    return {"machine": "test", "link_gbps": 20.0, "kinds": kinds}


def simulate(d, doc, *extra, policy="liveput"):
    path = os.path.join(d, "costs.json")
    with open(path, "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
    return subprocess.run([BIN, "simulate", "--trace", TRACE, "--profile", PROFILE, "--model",
                           MODEL, "--migration-costs", path, "--policy", policy, *extra],
                          capture_output=True, text=True, timeout=120)


with tempfile.TemporaryDirectory() as d:
    p = simulate(d, costs(0.5), "--link-gbps", "10", "--json", policy="liveput,ideal")
    check(p.returncode == 0, "simulate with a cost file exits 0: %s" % p.stderr)
    out = json.loads(p.stdout) if p.returncode == 0 else {"policies": []}
    pol = {x["policy"]: x for x in out["policies"]}
    check(set(pol) == {"liveput", "ideal"}, "both policies printed: %s" % list(pol))
    lp = pol.get("liveput", {})
    frac = lp.get("ideal_fraction", 0)
    check(0.98 <= frac <= 1.0, "liveput >= 0.98 of ideal with live migrations: %s" % frac)
    parcae = lp.get("parcae_accounting", {}).get("ideal_fraction", 1)
    check(0.5 < parcae < frac, "Parcae's accounting printed beside, lower: %s" % parcae)
    check(pol.get("ideal", {}).get("ideal_fraction") == 1.0, "ideal is 1")
    check(out.get("migration_costs", {}).get("link_gbps") == 10.0, "link recorded")
    # the JSON shape of a run without a cost file is kept (fields are only added)
    base = subprocess.run([BIN, "simulate", "--trace", TRACE, "--profile", PROFILE, "--model",
                           MODEL, "--policy", "liveput", "--json"],
                          capture_output=True, text=True, timeout=120)
    check(base.returncode == 0, "simulate without a cost file exits 0")
    if base.returncode == 0 and lp:
        b = json.loads(base.stdout)
        check(set(b) <= set(out), "top-level fields kept: %s" % (set(b) - set(out)))
        check(set(b["policies"][0]) <= set(lp), "policy fields kept")
        check(abs(b["policies"][0]["ideal_fraction"] - parcae) < 1e-9,
              "parcae_accounting equals the run without the file")
    # larger fixed parts: lower fraction
    p2 = simulate(d, costs(20.0), "--link-gbps", "10", "--json")
    check(p2.returncode == 0, "simulate with large fixed parts exits 0")
    if p2.returncode == 0:
        f2 = json.loads(p2.stdout)["policies"][0]["ideal_fraction"]
        check(f2 < frac, "larger fixed_s gives a lower fraction: %s vs %s" % (f2, frac))
    # the table prints both figures
    p3 = simulate(d, costs(0.5), "--link-gbps", "10")
    check(p3.returncode == 0 and "parcae" in p3.stdout.splitlines()[2], "table has a parcae column")
    # bad files and flags: exit 2, the field named
    bad = costs(0.5)
    del bad["kinds"]["pipeline"]
    for doc, needle in ((bad, "kinds.pipeline"), ("{\"link_gbps\": 1,", "json"),
                        (dict(costs(0.5), link_gbps=0), "link_gbps")):
        p = simulate(d, doc)
        check(p.returncode == 2 and needle in p.stderr,
              "bad cost file -> exit 2 naming '%s': %d %s" % (needle, p.returncode, p.stderr))
    p = simulate(d, costs(0.5), "--link-gbps", "-3")
    check(p.returncode == 2 and "--link-gbps" in p.stderr, "bad --link-gbps: %s" % p.stderr)
    p = subprocess.run([BIN, "simulate", "--trace", TRACE, "--profile", PROFILE, "--model", MODEL,
                        "--link-gbps", "10"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "--migration-costs" in p.stderr, "--link-gbps alone: %s" % p.stderr)
    p = subprocess.run([BIN, "simulate", "--trace", TRACE, "--profile", PROFILE, "--model", MODEL,
                        "--migration-costs", os.path.join(d, "no-such.json")],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "no-such.json" in p.stderr, "missing file: %s" % p.stderr)

print("%d failures" % len(failures))
sys.exit(1 if failures else 0)
