#!/usr/bin/env python3
"""Kubernetes integration tests: `spottrain k8s render` against the API schemas, and the
kubernetes provider against kmock (a Kubernetes API mock server) on loopback.

Usage: test_k8s.py SCENARIO   (render | provider | rbac)

Run through tests/integration/control/venv.sh, which installs kubernetes-validate (render) or
kmock (provider, rbac) from PyPI into a venv of the build directory (skip 77 when pip cannot).
Every wait is bounded polling on an observable; nothing sleeps to synchronise.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

BIN = os.environ.get("SPOTTRAIN_BIN", "")
SRC = os.environ.get("SPOTTRAIN_SRCDIR", ".")
EXAMPLE = os.path.join(SRC, "examples", "k8s.yaml")
IMAGE = "registry.example/spottrain:test"


def fail(msg):
    print("FAIL: " + msg, flush=True)
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok - " + msg, flush=True)


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60)


# ---- render -----------------------------------------------------------------------------

def schema_versions():
    """The Kubernetes versions kubernetes-validate ships schemas for, oldest first."""
    import kubernetes_validate
    root = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
    found = set()
    for d in glob.glob(os.path.join(root, "v*-local-strict")):
        m = re.match(r"v(\d+)\.(\d+)\.(\d+)-local-strict$", os.path.basename(d))
        if m:
            found.add(tuple(int(x) for x in m.groups()))
    return sorted(found)


def validate(path, version):
    """kubernetes-validate --strict on a file; returns (exit code, output)."""
    p = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version,
                        path], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def scenario_render():
    import yaml
    tmpdir = tempfile.TemporaryDirectory(prefix="k8s-render-")
    tmp = tmpdir.name

    p = run("k8s", "--help")
    check(p.returncode == 0 and "k8s render JOB.yaml" in p.stdout, "k8s --help prints usage")

    p = run("k8s", "render", EXAMPLE, "--image", IMAGE)
    check(p.returncode == 0, "render examples/k8s.yaml exits 0 (stderr: %r)" % p.stderr)
    docs = list(yaml.safe_load_all(p.stdout))
    kinds = [d["kind"] for d in docs]
    check(kinds == ["ServiceAccount", "Role", "RoleBinding", "Secret", "ConfigMap",
                    "PersistentVolumeClaim", "Deployment", "Service"],
          "render gives exactly the expected objects in order: %s" % kinds)
    by = {d["kind"]: d for d in docs}
    for d in docs:
        check(d["metadata"]["labels"]["spottrain.dev/job"] == "k8s-demo" and
              "namespace" not in d["metadata"],
              "%s is labelled with the job and has no namespace" % d["kind"])
    rules = by["Role"]["rules"]
    check([(r["resources"], r["verbs"]) for r in rules] ==
          [(["pods"], ["get", "list", "watch", "create", "delete", "patch"]),
           (["events"], ["create"]), (["configmaps"], ["get"])],
          "Role grants pods get/list/watch/create/delete/patch, events create, configmaps get")
    check(rules[2]["resourceNames"] == ["spottrain-k8s-demo-spec"],
          "Role reads only the job's own ConfigMap")
    check(not any(d["kind"].startswith("Cluster") for d in docs), "nothing cluster-wide")
    binding = by["RoleBinding"]
    check(binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                 "name": "spottrain-k8s-demo"} and
          binding["subjects"] == [{"kind": "ServiceAccount", "name": "spottrain-k8s-demo"}],
          "RoleBinding binds the Role to the ServiceAccount")
    token = by["Secret"]["stringData"]["token"]
    check(re.fullmatch(r"[0-9a-f]{64}", token) is not None, "Secret holds a 256-bit hex token")
    with open(EXAMPLE) as f:
        check(by["ConfigMap"]["data"]["job.yaml"] == f.read(),
              "ConfigMap holds the spec byte for byte")
    dep = by["Deployment"]["spec"]
    pod = dep["template"]["spec"]
    c = pod["containers"][0]
    check(dep["replicas"] == 1 and dep["strategy"] == {"type": "Recreate"},
          "Deployment: 1 replica, Recreate")
    check(c["image"] == IMAGE and c["args"][:4] == ["coordinator", "--job",
                                                   "/etc/spottrain/job.yaml", "--train"],
          "coordinator container runs `coordinator --job ... --train` from --image")
    check(c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080} and
          c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080},
          "liveness and readiness probe /healthz on the REST port")
    check(pod["serviceAccountName"] == "spottrain-k8s-demo", "coordinator runs as the account")
    vols = {v["name"]: v for v in pod["volumes"]}
    check(vols["state"]["persistentVolumeClaim"]["claimName"] == "spottrain-k8s-demo-state" and
          by["PersistentVolumeClaim"]["metadata"]["name"] == "spottrain-k8s-demo-state",
          "journal on the PersistentVolumeClaim")
    check(vols["token"]["secret"]["secretName"] == "spottrain-k8s-demo-token",
          "token mounted from the rendered Secret")
    svc = by["Service"]["spec"]
    check([(q["name"], q["port"]) for q in svc["ports"]] == [("grpc", 7070), ("http", 8080)],
          "Service exposes gRPC 7070 and REST 8080")
    check(svc["selector"] == dep["selector"]["matchLabels"] ==
          dep["template"]["metadata"]["labels"], "Service and Deployment select the pod")

    p2 = run("k8s", "render", EXAMPLE, "--image", IMAGE)
    token2 = [d for d in yaml.safe_load_all(p2.stdout) if d["kind"] == "Secret"][0]
    check(token2["stringData"]["token"] != token, "each render generates a fresh token")

    out = os.path.join(tmp, "plain.yaml")
    with open(out, "w") as f:
        f.write(p.stdout)
    versions = schema_versions()
    check(len(versions) >= 2, "kubernetes-validate ships schemas: %s .. %s" %
          (versions[0], versions[-1]))
    newest = "%d.%d.%d" % versions[-1]
    # 1.27: the oldest minor GKE, EKS and AKS still offered (extended support) when written.
    for v in (newest, "1.27.0"):
        rc, text = validate(out, v)
        check(rc == 0 and text.count("passed for resource") == 8,
              "render passes kubernetes-validate --strict for %s\n%s" % (v, text))

    # The validator can fail: a misspelt field is refused (so the passes above mean something).
    bad = os.path.join(tmp, "bad.yaml")
    with open(bad, "w") as f:
        f.write(p.stdout.replace("  replicas: 1\n", "  replica: 1\n"))
    rc, text = validate(bad, newest)
    check(rc != 0, "kubernetes-validate --strict refuses an unknown field (control)")

    p = run("k8s", "render", EXAMPLE, "--image", IMAGE, "--namespace", "ml",
            "--token-secret", "my-token")
    check(p.returncode == 0, "render --namespace --token-secret exits 0")
    docs = list(yaml.safe_load_all(p.stdout))
    kinds = [d["kind"] for d in docs]
    check(kinds == ["Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
                    "PersistentVolumeClaim", "Deployment", "Service"],
          "with --namespace a Namespace, with --token-secret no Secret: %s" % kinds)
    check(all(d["metadata"].get("namespace") == "ml" for d in docs[1:]) and
          docs[0]["metadata"]["name"] == "ml", "every object is in namespace ml")
    dep = [d for d in docs if d["kind"] == "Deployment"][0]
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    check(vols["token"]["secret"]["secretName"] == "my-token", "token read from --token-secret")
    out = os.path.join(tmp, "ns.yaml")
    with open(out, "w") as f:
        f.write(p.stdout)
    for v in (newest, "1.27.0"):
        rc, text = validate(out, v)
        check(rc == 0, "namespaced render passes --strict for %s\n%s" % (v, text))

    # Bad input: a clear error on stderr and nothing on stdout, never a half manifest.
    with open(EXAMPLE) as f:
        good = f.read()

    def bad_spec(name, text, args, want, code=2):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        q = run("k8s", "render", path, *args)
        check(q.returncode == code and q.stdout == "" and want in q.stderr,
              "%s: exit %d, no output, stderr says %r (got %d %r)" %
              (name, code, want, q.returncode, q.stderr))

    bad_spec("sim.yaml", good.replace("provider: kubernetes", "provider: sim\n    trace: t.csv"),
             ["--image", IMAGE], "spec.fleet.trace")
    bad_spec("sim2.yaml", good.replace("provider: kubernetes", "provider: aws\n"
                                       "    instance_type: p3.2xlarge"),
             ["--image", IMAGE], "spec.fleet.provider: is 'aws'; a Kubernetes deployment "
                                  "needs 'kubernetes'")
    bad_spec("noimage.yaml", good.replace("    image: ghcr.io/example/spottrain:0.1 # `k8s "
                                          "render --image` overrides it\n", ""),
             [], "spec.fleet.image: missing; give the image there or with --image IMAGE")
    bad_spec("gpu.yaml", good.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: one"),
             ["--image", IMAGE], ":53:25: spec.fleet.kubernetes.resources: invalid quantity "
                                 "'one' for 'nvidia.com/gpu'")
    bad_spec("tol.yaml", good.replace("operator: Equal\n          value: spot",
                                      "operator: Exists\n          value: spot"),
             ["--image", IMAGE], ":48:11: spec.fleet.kubernetes.tolerations[1]: operator "
                                 "Exists takes no value (found 'spot')")
    bad_spec("ns.yaml", good, ["--image", IMAGE, "--namespace", "ML_Team"],
             "invalid --namespace 'ML_Team'")
    print("PASS", flush=True)


def main():
    if len(sys.argv) != 2:
        fail("usage: test_k8s.py SCENARIO")
    if not BIN:
        fail("SPOTTRAIN_BIN is not set")
    scenarios = {"render": scenario_render}
    if sys.argv[1] not in scenarios:
        fail("unknown scenario " + sys.argv[1])
    scenarios[sys.argv[1]]()


if __name__ == "__main__":
    main()
