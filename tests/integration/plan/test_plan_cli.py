#!/usr/bin/env python3
"""test_plan_cli.py: `spottrain plan` on the shipped example and on variants of it.

Checks the JSON plan independently of the planner: each assigned worker must end up holding
exactly its new (stage, replica) state (parameters of its layers and tied extras, its ZeRO-1
shard of the moments) from what it held plus the transfers, with live senders only. Also
walks the error paths: every bad field exits 2 with a message naming the field."""
import copy
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("SPOTTRAIN_SRCDIR", os.path.join(os.path.dirname(__file__), "../../.."))
BIN = os.environ.get("SPOTTRAIN_BIN", os.path.join(SRC, "build", "spottrain"))
EXAMPLE = os.path.join(SRC, "examples", "plan-situation.json")
failures = []
quiet = [False]


def check(cond, what):
    if not cond:
        failures.append(what)
        if not quiet[0]:
            print("FAIL:", what, file=sys.stderr)


def run(sit, *args):
    """Writes the situation to a temporary file (a relative cost.profile is made absolute,
    as it was relative to examples/) and runs `spottrain plan` on it."""
    if not isinstance(sit, str):
        sit = copy.deepcopy(sit)
        prof = (sit.get("cost") or {}).get("profile") if isinstance(sit.get("cost"), dict) else None
        if isinstance(prof, str) and not prof.startswith("/") and "no-such" not in prof:
            sit["cost"]["profile"] = os.path.join(SRC, "examples", prof)
        sit = json.dumps(sit)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "situation.json")
        with open(path, "w") as f:
            f.write(sit)
        return subprocess.run([BIN, "plan", path, *args], capture_output=True, text=True,
                              timeout=60)


def gpt_params(g):
    h = g["hidden"]
    return [g["vocab"] * h + g["seq_len"] * h] + [12 * h * h + 13 * h] * g["layers"] + [2 * h]


def holds(layout, n, s, r, layer, kind, tied):
    lo, hi = layout["stage_lo"][s], layout["stage_lo"][s + 1]
    inr = lo <= layer < hi
    if not inr:
        if kind != "param":
            return None
        pp = layout["pp"]
        for t in tied:
            st = pp - 1 if t["stage"] == "last" else 0 if t["stage"] == "first" else t["stage"]
            if st == s and t["layer"] == layer:
                return (0, n[layer])
        return None
    if kind == "param":
        return (0, n[layer])
    dp = layout["dp"]
    return (r * n[layer] // dp, (r + 1) * n[layer] // dp)


def verify_plan(sit, out):
    """Replays the plan on interval sets and checks every assigned worker's state."""
    n = gpt_params(sit["model"]["gpt"])
    tied = sit["model"].get("tied", [{"stage": "last", "layer": 0}])
    cur, new, m = out["current"], out["decision"], out["migration"]
    alive = set(sit.get("survivors", [w["id"] for w in sit["workers"]])) | set(
        sit.get("new_workers", []))
    old = {w["id"]: (w["stage"], w["replica"]) for w in sit["workers"] if w["id"] in alive}
    got = {}  # (id, layer, kind) -> list of (a, b)
    for a in m["assignment"]:
        wid, s, r = a["id"], a["stage"], a["replica"]
        check(wid in alive, f"assigned worker {wid} is alive")
        for layer in range(len(n)):
            for kind in ("param", "adam_m", "adam_v"):
                need = holds(new, n, s, r, layer, kind, tied)
                if need is None:
                    continue
                have = holds(cur, n, *old[wid], layer, kind, tied) if wid in old else None
                if have:
                    lo, hi = max(have[0], need[0]), min(have[1], need[1])
                    if hi > lo:
                        got.setdefault((wid, layer, kind), []).append((lo, hi))
    for t in m["transfers"]:
        check(t["src"] in alive, f"sender {t['src']} alive")
        src = holds(cur, n, *old[t["src"]], t["layer"], t["kind"], tied)
        check(src is not None and src[0] <= t["offset"] and
              t["offset"] + t["count"] <= src[1], f"sender holds {t}")
        check(t["bytes"] == 4 * t["count"], "4 bytes per element")
        got.setdefault((t["dst"], t["layer"], t["kind"]), []).append(
            (t["offset"], t["offset"] + t["count"]))
    for a in m["assignment"]:
        for layer in range(len(n)):
            for kind in ("param", "adam_m", "adam_v"):
                need = holds(new, n, a["stage"], a["replica"], layer, kind, tied)
                iv = sorted(got.pop((a["id"], layer, kind), []))
                at = need[0] if need else None
                for lo, hi in iv:
                    check(need is not None and lo == at, f"{a['id']} layer {layer} {kind} tiles")
                    at = hi
                if need:
                    check(at == need[1], f"{a['id']} layer {layer} {kind} complete")
    check(not got, f"no transfers beyond the needs: {list(got)[:3]}")
    moved = sum(t["bytes"] for t in m["transfers"])
    check(moved == m["bytes_moved"] == sum(m["bytes_by_kind"].values()), "byte counters")
    check(m["bytes_kept"] + m["bytes_moved"] == m["bytes_needed"], "kept + moved = needed")
    check(sum(p["bytes"] for p in m["pairs"]) == moved, "pair bytes")


def main():
    example = json.load(open(EXAMPLE))
    # The variants below start from the example moved to a 2 x 4 shape.
    base = copy.deepcopy(example)
    base["shape"] = {"dp": 2, "pp": 4}
    base["workers"] = [{"id": f"i-{i:02d}", "stage": i // 2, "replica": i % 2} for i in range(8)]

    # The example as shipped: the liveput planner decides.
    r = subprocess.run([BIN, "plan", EXAMPLE], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"example exits 0 ({r.stderr})")
    check("by the liveput planner" in r.stdout and "migration:" in r.stdout, "readable output")
    r = subprocess.run([BIN, "plan", EXAMPLE, "--json"], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, "example --json exits 0")
    out = json.loads(r.stdout)
    check(out["decision"]["source"] == "liveput", "decided by liveput")
    verify_plan(example, out)
    # The checker itself must catch a broken plan.
    broken = copy.deepcopy(out)
    broken["migration"]["transfers"].pop()
    nfail = len(failures)
    quiet[0] = True
    verify_plan(example, broken)
    quiet[0] = False
    caught = len(failures) > nfail
    del failures[nfail:]
    check(caught, "the checker notices a missing transfer")

    # Given targets: same shape (inter-stage: the new worker replaces the noticed one), a dp
    # change, a pp change.
    for target, cls in (({"dp": 2, "pp": 4}, "inter-stage"), ({"dp": 1, "pp": 4}, "intra-stage"),
                        ({"dp": 2, "pp": 3}, "pipeline"), ({"dp": 1, "pp": 8}, "pipeline")):
        sit = copy.deepcopy(base)
        sit["target"] = target
        del sit["cost"]
        r = run(sit, "--json")
        check(r.returncode == 0, f"target {target} exits 0 ({r.stderr})")
        if r.returncode == 0:
            out = json.loads(r.stdout)
            check(out["decision"]["source"] == "target", "source target")
            check(out["migration"]["class"] == cls,
                  f"target {target}: class {out['migration']['class']} want {cls}")
            verify_plan(sit, out)

    # Nothing changes.
    sit = copy.deepcopy(base)
    sit["target"], sit["notices"], sit["new_workers"] = {"dp": 2, "pp": 4}, [], []
    r = run(sit, "--json")
    check(r.returncode == 0 and json.loads(r.stdout)["migration"]["class"] == "none", "none")

    # Both replicas of the last stage die without notice: checkpoint fallback.
    sit = copy.deepcopy(base)
    sit["target"] = {"dp": 2, "pp": 4}
    sit["survivors"] = [s for s in sit["survivors"] if s not in ("i-06", "i-07")]
    r = run(sit, "--json")
    check(r.returncode == 0, "lost stage exits 0")
    out = json.loads(r.stdout)
    check(out["migration"] is None and out["fallback"] == "checkpoint", "fallback")
    check([l["layer"] for l in out["lost_layers"]] == list(range(37, 50)), "lost layers")
    r = run(sit)
    check("fallback: restore the latest checkpoint" in r.stdout, "readable fallback")

    # Input errors: exit 2, message naming the field.
    bad = []

    def variant(field, fn):
        s = copy.deepcopy(base)
        fn(s)
        bad.append((field, s))

    variant("model", lambda s: s.pop("model"))
    variant("model.gpt.hidden", lambda s: s["model"]["gpt"].update(hidden=0))
    variant("model.gpt.heads", lambda s: s["model"]["gpt"].update(heads=7))
    variant("model.layer_params", lambda s: s["model"].update(gpt=None) or s["model"].pop("gpt")
            or s["model"].update(layer_params=[1, "x"]))
    variant("model.tied", lambda s: s["model"].update(tied=[{"stage": "middle", "layer": 0}]))
    variant("shape.pp", lambda s: s["shape"].update(pp=0))
    variant("shape.stage_lo", lambda s: s["shape"].update(stage_lo=[0, 5, 5, 20, 50]))
    variant("workers", lambda s: s.pop("workers"))
    variant("workers[1]", lambda s: s["workers"][1].update(id="i-00"))
    variant("workers[2].replica", lambda s: s["workers"][2].update(replica=9))
    variant("workers[3].replica", lambda s: s["workers"][3].update(replica=0))
    variant("survivors", lambda s: s["survivors"].append("nobody"))
    variant("new_workers", lambda s: s["new_workers"].append("i-00"))
    variant("notices", lambda s: s.update(notices=[{"id": "i-05", "seconds": -1}]))
    variant("target", lambda s: s.pop("cost"))
    variant("target", lambda s: s.update(target={"dp": 4, "pp": 4}))
    variant("target.dp", lambda s: s.update(target={"pp": 4}))
    variant("cost", lambda s: s.update(cost={"profile": "x", "analytic": {}}))
    variant("cost.profile", lambda s: s.update(cost={"profile": "no-such-profile.json"}))
    variant("cost.analytic.gpu_tflops", lambda s: s.update(cost={"analytic": {
        "micro_batch": 1, "global_batch": 8, "gpu_mem_gib": 16, "net_gbps": 10}}))
    variant("forecast", lambda s: s.update(forecast=[3, -1]))
    variant("history", lambda s: s.update(history="8"))
    variant("options.lookahead", lambda s: s.update(options={"lookahead": 0}))
    variant("options.predictor", lambda s: s.update(options={"predictor": "crystal-ball"}))
    for field, s in bad:
        r = run(s)
        check(r.returncode == 2, f"bad {field}: exit {r.returncode} ({r.stderr.strip()})")
        check(f"{field}:" in r.stderr, f"bad {field}: message names it: {r.stderr.strip()}")
    r = run('{"model": ')
    check(r.returncode == 2 and ":1:" in r.stderr, f"bad JSON: {r.stderr.strip()}")
    r = subprocess.run([BIN, "plan"], capture_output=True, text=True)
    check(r.returncode == 2, "no file: exit 2")
    r = subprocess.run([BIN, "plan", "/nonexistent/x.json"], capture_output=True, text=True)
    check(r.returncode == 2 and "cannot read" in r.stderr, "missing file: exit 2")
    r = subprocess.run([BIN, "plan", EXAMPLE, "--bogus"], capture_output=True, text=True)
    check(r.returncode == 2, "unknown option: exit 2")
    r = subprocess.run([BIN, "plan", "--bench", EXAMPLE], capture_output=True, text=True)
    check(r.returncode == 2 and "--bench takes no" in r.stderr, "--bench with a file: exit 2")
    r = subprocess.run([BIN, "plan", EXAMPLE, EXAMPLE], capture_output=True, text=True)
    check(r.returncode == 2 and "only one" in r.stderr, "two files: exit 2")
    r = subprocess.run([BIN, "plan", "--help"], capture_output=True, text=True)
    check(r.returncode == 0 and "SITUATION.json" in r.stdout, "--help")

    if failures:
        print(f"{len(failures)} checks failed", file=sys.stderr)
        return 1
    print("all plan CLI checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
