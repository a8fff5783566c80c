#!/usr/bin/env python3
"""Kubernetes integration tests: `spottrain k8s render` against the API schemas, and the
kubernetes provider against kmock (a Kubernetes API mock server) on loopback.

Usage: test_k8s.py SCENARIO   (render | provider | rbac)

Run through tests/integration/control/venv.sh, which installs kubernetes-validate (render) or
kmock (provider, rbac) from PyPI into a venv of the build directory (skip 77 when pip cannot).
Every wait is bounded polling on an observable; nothing sleeps to synchronise.
"""
import asyncio
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

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


# ---- the provider against kmock ------------------------------------------------------------

TOKEN = "k8s-test-token"
TIMEOUT = 30.0  # the issue's bound for pods to appear and to go


def wait_until(pred, what, timeout=TIMEOUT):
    """Polls pred() (bounded) until it returns a truthy value, which is returned."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out after %.0f s waiting for %s" % (timeout, what))


class Mock:
    """kmock's Kubernetes emulator on a loopback port, run by an asyncio loop in a thread."""

    def __init__(self, port=None):
        import kmock
        self.kmock = kmock
        self.port = port
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(TIMEOUT):
            fail("kmock did not start")

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self):
        kw = {"port": self.port} if self.port else {}
        async with self.kmock.KubernetesEmulator() as k, self.kmock.Server(k, **kw) as srv:
            k.resources["v1/pods"] = {}
            k.resources["v1/configmaps"] = {}
            self.k = k
            self.url = str(srv.url).rstrip("/")
            self.stop_fut = self.loop.create_future()
            self.ready.set()
            await self.stop_fut

    def call(self, fn):
        """Runs fn(k) on the mock's loop and returns its result."""
        async def go():
            return fn(self.k)
        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(TIMEOUT)

    def close(self):
        self.loop.call_soon_threadsafe(lambda: self.stop_fut.done() or
                                       self.stop_fut.set_result(None))
        self.thread.join(TIMEOUT)

    def request(self, method, path, body=None, ctype="application/merge-patch+json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, method=method, data=data,
                                     headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as f:
                return f.status, json.loads(f.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, None

    def pods(self, job=None):
        """{name: pod} of the pods the server holds, optionally only one job's."""
        def get(k):
            out = {}
            for key in list(k.objects):
                res, ns, name = key
                if res.plural != "pods":
                    continue
                obj = k.objects[key]
                if obj.deleted:
                    continue
                raw = obj.raw
                labels = raw.get("metadata", {}).get("labels", {}) or {}
                if job is None or labels.get("spottrain.dev/job") == job:
                    out[name] = json.loads(json.dumps(raw))
            return out
        return self.call(get)

    def count(self, what):
        """Requests for pods so far: 'list' or 'watch'."""
        def get(k):
            n = 0
            for r in list(k):
                if r.resource is not None and r.resource.plural == "pods" and \
                        str(r.action).lower().endswith(what):
                    n += 1
            return n
        return self.call(get)

    def kubeconfig(self, path, token=TOKEN):
        write_kubeconfig(path, self.url, token)


def write_kubeconfig(path, url, token=TOKEN):
    with open(path, "w") as f:
        f.write("apiVersion: v1\nkind: Config\ncurrent-context: test\n"
                "clusters:\n- name: kmock\n  cluster:\n    server: %s\n"
                "users:\n- name: tester\n  user:\n    token: %s\n"
                "contexts:\n- name: test\n  context:\n    cluster: kmock\n"
                "    user: tester\n    namespace: default\n" % (url, token))


class Coordinator:
    def __init__(self, spec, state, kubeconfig, tmp, extra=()):
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        self.err_path = os.path.join(tmp, "coordinator-%d.err" % time.monotonic_ns())
        self.err = open(self.err_path, "w")
        self.p = subprocess.Popen(
            [BIN, "coordinator", "--job", spec, "--train", "--kubeconfig", kubeconfig,
             "--listen", "127.0.0.1:0", "--status-listen", "127.0.0.1:0", "--token-file",
             token_file, "--state-dir", state] + list(extra),
            stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.lines = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        line = wait_until(lambda: next((x for x in self.lines if
                                        x.startswith("coordinator listening")), None) or
                          (self.p.poll() is not None and "exited"), "the listening line")
        if line == "exited":
            fail("coordinator exited %s: %s" % (self.p.returncode, self.stderr()))
        f = dict(kv.split("=", 1) for kv in line.split()[2:])
        self.grpc, self.rest, self.job_id = f["grpc"], f["rest"], f["job"]

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def stderr(self):
        self.err.flush()
        with open(self.err_path) as f:
            return f.read()

    def saw(self, text):
        """The text in an output line or a log line (the loop's events are log lines)."""
        return any(text in x for x in self.lines) or text in self.stderr()

    def post(self, path):
        req = urllib.request.Request("http://%s%s" % (self.rest, path), method="POST",
                                     headers={"Authorization": "Bearer " + TOKEN})
        with urllib.request.urlopen(req, timeout=TIMEOUT) as f:
            return f.status

    def wait(self):
        try:
            rc = self.p.wait(TIMEOUT)
            # The process is gone, but its last lines may still be in the pipe: saw() after
            # wait() must see them (under load the reader thread was behind).
            self.thread.join(TIMEOUT)
            return rc
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            fail("coordinator did not exit within %.0f s" % TIMEOUT)

    def wait_long(self, timeout):
        try:
            rc = self.p.wait(timeout)
            self.thread.join(TIMEOUT)
            return rc
        except subprocess.TimeoutExpired:
            fail("coordinator did not finish within %.0f s" % timeout)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.err.close()


def provider_spec(tmp, image="registry.example/spottrain:test", max_pods=3):
    with open(EXAMPLE) as f:
        text = f.read()
    text = text.replace("    max: 4\n", "    max: %d\n" % max_pods)
    text = text.replace("ghcr.io/example/spottrain:0.1", image)
    text = text.replace("/var/lib/spottrain/data/markov1.bin", os.path.join(tmp, "data.bin"))
    text = text.replace("/var/lib/spottrain/ckpt", os.path.join(tmp, "ckpt"))
    path = os.path.join(tmp, "job.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def scenario_provider():
    tmpdir = tempfile.TemporaryDirectory(prefix="k8s-provider-")
    tmp = tmpdir.name
    mock = Mock()
    coords = []
    try:
        provider_body(mock, tmp, coords)
    finally:
        for c in coords:
            c.kill()
        mock.close()


def provider_body(mock, tmp, coords):
    try:
        provider_steps(mock, tmp, coords)
    except SystemExit:
        for c in coords:
            print("--- coordinator stdout (last 30 lines):\n" + "\n".join(c.lines[-30:]))
            print("--- coordinator stderr (last 3000 chars):\n" + c.stderr()[-3000:])
        raise


def provider_steps(mock, tmp, coords):
    spec = provider_spec(tmp)
    kc = os.path.join(tmp, "kubeconfig")
    mock.kubeconfig(kc)
    state = os.path.join(tmp, "state")
    # Someone else's pods: kmock ignores labelSelector, so only our own filter keeps us off them.
    for name, labels in (("other-w0", {"spottrain.dev/job": "other",
                                       "spottrain.dev/role": "worker"}),
                         ("web-0", {"app": "web"})):
        code, _ = mock.request("POST", "/api/v1/namespaces/default/pods",
                               {"apiVersion": "v1", "kind": "Pod",
                                "metadata": {"name": name, "labels": labels}},
                               "application/json")
        check(code in (200, 201), "seeded foreign pod %s" % name)
    # The first watch answers 410 Gone: the provider must list again, then watch again.
    mock.call(lambda k: k[mock.kmock.action.WATCH, mock.kmock.resource("v1/pods")][:1] << 410)

    t0 = time.monotonic()
    c = Coordinator(spec, state, kc, tmp)
    coords.append(c)
    pods = wait_until(lambda: (lambda p: p if len(p) == 3 else None)(mock.pods("k8s-demo")),
                      "3 worker pods labelled spottrain.dev/job=k8s-demo")
    check(time.monotonic() - t0 < TIMEOUT, "3 pods within 30 s (%.1f s)" % (time.monotonic() - t0))
    check(sorted(pods) == ["k8s-demo-w0", "k8s-demo-w1", "k8s-demo-w2"],
          "pods are named explicitly: %s" % sorted(pods))
    for name, pod in pods.items():
        labels = pod["metadata"]["labels"]
        check(labels["spottrain.dev/job-id"] == c.job_id and
              labels["spottrain.dev/role"] == "worker", "%s carries job and job-id" % name)
        ps = pod["spec"]
        ctr = ps["containers"][0]
        check(ctr["image"] == "registry.example/spottrain:test" and
              ctr["args"][:3] == ["worker", "--coordinator", c.grpc],
              "%s runs the image and dials the coordinator %s" % (name, c.grpc))
        check(ps["nodeSelector"] == {"cloud.google.com/gke-spot": "true"} and
              [t["key"] for t in ps["tolerations"]] ==
              ["cloud.google.com/gke-spot", "kubernetes.azure.com/scalesetpriority"] and
              ctr["resources"]["limits"] == {"nvidia.com/gpu": "1", "cpu": "4",
                                             "memory": "16Gi"} and
              ctr["resources"]["requests"] == ctr["resources"]["limits"],
              "%s has the spec's nodeSelector, tolerations and resources" % name)
        check(ps["restartPolicy"] == "Never" and ps["terminationGracePeriodSeconds"] == 30,
              "%s: restartPolicy Never, grace = fleet.notice (30 s)" % name)
    # kmock assigns no uid, so no ConfigMap owner here; the pod validates as a real one would.
    pod_file = os.path.join(tmp, "pod.yaml")
    with open(pod_file, "w") as f:
        json.dump(pods["k8s-demo-w0"], f)
    rc, text = validate(pod_file, "1.27.0")
    check(rc == 0, "a created worker pod passes kubernetes-validate --strict 1.27\n" + text)

    wait_until(lambda: mock.count("watch") >= 2 and mock.count("list") >= 2,
               "a second list and watch after 410 Gone")
    check(mock.count("list") == 2 and mock.count("watch") == 2,
          "410 Gone on the watch: listed again and watched again, once each (list %d, watch %d)"
          % (mock.count("list"), mock.count("watch")))

    # Running -> granted; DisruptionTarget -> notice; deletion after it -> lost (preempted).
    def patch(name, body):
        code, _ = mock.request("PATCH", "/api/v1/namespaces/default/pods/" + name, body)
        check(code == 200, "patched %s" % name)
    for name in ("k8s-demo-w0", "k8s-demo-w1"):
        patch(name, {"spec": {"nodeName": "node-" + name[-1]}, "status": {"phase": "Running"}})
        wait_until(lambda: c.saw("granted: %s (node-%s)" % (name, name[-1])), "granted " + name)
        check(True, "Running pod %s is granted" % name)
    patch("k8s-demo-w0", {"status": {"conditions": [{"type": "DisruptionTarget",
                                                      "status": "True",
                                                      "reason": "PreemptionByScheduler"}]}})
    wait_until(lambda: c.saw("notice: k8s-demo-w0 (node-0) goes in"), "notice for w0")
    check(True, "DisruptionTarget gives a notice")
    mock.request("DELETE", "/api/v1/namespaces/default/pods/k8s-demo-w0")
    wait_until(lambda: c.saw("lost: k8s-demo-w0 (node-0, preempted)"), "w0 lost (preempted)")
    check(True, "a noticed pod that goes is lost as preempted")
    mock.request("DELETE", "/api/v1/namespaces/default/pods/k8s-demo-w1")
    wait_until(lambda: c.saw("lost: k8s-demo-w1 (node-1, unannounced)"), "w1 lost (unannounced)")
    check(True, "a pod gone without notice is lost as unannounced")
    pods = wait_until(lambda: (lambda p: p if sorted(p) == ["k8s-demo-w2", "k8s-demo-w3",
                                                            "k8s-demo-w4"] else None)(
        mock.pods("k8s-demo")), "two replacement pods")
    check(True, "lost pods are replaced up to fleet.max: %s" % sorted(pods))

    # SIGTERM (the coordinator's pod rescheduled): the workers stay.
    c.p.send_signal(signal.SIGTERM)
    rc = c.wait()
    check(rc == 0, "coordinator exits 0 on SIGTERM")
    check(sorted(mock.pods("k8s-demo")) == ["k8s-demo-w2", "k8s-demo-w3", "k8s-demo-w4"],
          "SIGTERM leaves the worker pods running")

    # A restart on the same state adopts them: same job id, no new pod.
    watches = mock.count("watch")
    c2 = Coordinator(spec, state, kc, tmp)
    coords.append(c2)
    check(c2.job_id == c.job_id, "the restart resumes job %s" % c.job_id)
    wait_until(lambda: mock.count("watch") > watches, "the restarted coordinator's watch")
    check(sorted(mock.pods("k8s-demo")) == ["k8s-demo-w2", "k8s-demo-w3", "k8s-demo-w4"],
          "the restarted coordinator adopts the 3 pods and creates none")
    check("adopting pod 'k8s-demo-w2'" in c2.stderr(), "adoption is logged")

    # POST /v1/job:stop: every worker pod goes within 30 s; foreign pods stay.
    t0 = time.monotonic()
    check(c2.post("/v1/job:stop") == 200, "POST /v1/job:stop answers 200")
    wait_until(lambda: not mock.pods("k8s-demo"), "the job's pods deleted")
    check(time.monotonic() - t0 < TIMEOUT, "job:stop deleted every worker pod in %.1f s" %
          (time.monotonic() - t0))
    rc = c2.wait()
    check(rc == 1 and c2.saw("job stopped"), "a stopped (unfinished) job exits 1 (%d)" % rc)
    check(sorted(mock.pods()) == ["other-w0", "web-0"], "foreign pods untouched: %s" %
          sorted(mock.pods()))
    print("PASS", flush=True)


def scenario_rbac():
    """401 and 403 from the API server: one clear error naming what is missing, exit != 0."""
    tmpdir = tempfile.TemporaryDirectory(prefix="k8s-rbac-")
    tmp = tmpdir.name
    spec = provider_spec(tmp)
    kc = os.path.join(tmp, "kubeconfig")
    cases = [
        ("list", 403, "permission 'list pods' is missing in namespace 'default' (403 Forbidden)"),
        ("list", 401, "refused our credentials (401 Unauthorized) to list pods in namespace "
                      "'default'"),
        ("create", 403, "permission 'create pods' is missing in namespace 'default' "
                        "(403 Forbidden)"),
    ]
    for i, (action, status, want) in enumerate(cases):
        mock = Mock()
        try:
            mock.kubeconfig(kc)
            act = getattr(mock.kmock.action, action.upper())
            mock.call(lambda k: k[act, mock.kmock.resource("v1/pods")] << status <<
                      {"apiVersion": "v1", "kind": "Status", "code": status})
            t0 = time.monotonic()
            token_file = os.path.join(tmp, "token")
            with open(token_file, "w") as f:
                f.write(TOKEN)
            p = subprocess.run([BIN, "coordinator", "--job", spec, "--train", "--kubeconfig", kc,
                                "--listen", "127.0.0.1:0", "--status-listen", "127.0.0.1:0",
                                "--token-file", token_file, "--state-dir",
                                os.path.join(tmp, "state%d" % i)],
                               capture_output=True, text=True, timeout=TIMEOUT)
            check(p.returncode != 0 and time.monotonic() - t0 < TIMEOUT,
                  "%s %d: coordinator exits %d" % (action, status, p.returncode))
            check(p.stderr.count(want) == 1,
                  "%s %d: one clear error: %r\n%s" % (action, status, want, p.stderr))
        finally:
            mock.close()
    print("PASS", flush=True)


def scenario_dead():
    """An API server that is not there yet: the coordinator retries with backoff (said once)
    and creates the pods once it answers."""
    tmpdir = tempfile.TemporaryDirectory(prefix="k8s-dead-")
    tmp = tmpdir.name
    spec = provider_spec(tmp, max_pods=2)
    kc = os.path.join(tmp, "kubeconfig")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connections are refused
    write_kubeconfig(kc, "http://127.0.0.1:%d" % port)
    c = Coordinator(spec, os.path.join(tmp, "state"), kc, tmp)
    mock = None
    try:
        wait_until(lambda: "retrying with backoff" in c.stderr(), "the retry warning")
        check(c.p.poll() is None, "the coordinator keeps running while the API server is down")
        mock = Mock(port=port)
        t0 = time.monotonic()
        wait_until(lambda: len(mock.pods("k8s-demo")) == 2, "2 pods once the server answers")
        check(True, "pods created %.1f s after the API server came up" % (time.monotonic() - t0))
        check(c.stderr().count("retrying with backoff") == 1,
              "the outage is reported once:\n" + c.stderr())
        check(c.post("/v1/job:stop") == 200, "POST /v1/job:stop")
        wait_until(lambda: not mock.pods("k8s-demo"), "pods deleted after the stop")
        rc = c.wait()
        check(rc == 1 and c.saw("job stopped"), "a stopped (unfinished) job exits 1 (%d)" % rc)
    finally:
        c.kill()
        if mock:
            mock.close()
    print("PASS", flush=True)


TRAIN_SPEC = """apiVersion: spottrain/v1
kind: TrainingJob
metadata:
  name: ktrain
spec:
  model: {layers: 2, hidden: 64, heads: 4, vocab: 64, seq_len: 32}  # steps long enough that
  # the eviction's grace (4 s) ends well before the job does
  training:
    micro_batch: 2
    global_batch: 8
    steps: %(steps)d
    seed: 7
    optimizer: {name: adamw, lr: 1e-3, warmup_steps: 5, schedule: cosine, weight_decay: 0.1,
                grad_clip: 1.0}
  data:
    train: data.bin
    synth: {kind: markov, order: 1, seed: 3, tokens: 50000}
  fleet:
    provider: kubernetes
    min: 1
    max: 2
    image: registry.example/spottrain:test
    notice: 4s
  planner: {interval: 60s, dp: {min: 1, max: 2}, pp: 1}
  checkpoint: {dir: %(ckpt)s, interval: 600s, keep: 2}
"""


class Kubelet:
    """Runs each worker pod's command as a local process (paths of the pod's volumes mapped to
    the test's files), reports it Running, and plays the kubelet's part in a deletion: a
    finalizer holds the pod, SIGTERM starts the grace period, SIGKILL ends it, and the pod goes
    once its process has exited. Polls the mock; one thread."""

    def __init__(self, mock, job, spec, token_file, tmp):
        self.mock, self.job, self.spec, self.token_file, self.tmp = mock, job, spec, \
            token_file, tmp
        self.procs = {}   # name -> [Popen, sigterm time or None, grace]
        self.exits = {}   # name -> exit code
        self.stop = threading.Event()
        self.errors = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _patch(self, name, body):
        self.mock.request("PATCH", "/api/v1/namespaces/default/pods/" + name, body)

    def _start(self, name, pod):
        ctr = pod["spec"]["containers"][0]
        args = [BIN] + [{"/var/run/spottrain/token/token": self.token_file,
                         "/etc/spottrain/job.yaml": self.spec}.get(a, a) for a in ctr["args"]]
        d = os.path.join(self.tmp, "pods", name)
        os.makedirs(d, exist_ok=True)
        env = dict(os.environ, SPOTTRAIN_INSTANCE_ID=name)
        grace = pod["spec"]["terminationGracePeriodSeconds"]
        for e in ctr.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
        args += ["--state-dir", os.path.join(d, "state"), "--threads", "1"]
        err = open(os.path.join(d, "stderr"), "w")
        self.procs[name] = [subprocess.Popen(args, cwd=d, env=env, stdout=err, stderr=err),
                            None, grace]
        self._patch(name, {"metadata": {"finalizers": ["test.spottrain.dev/kubelet"]},
                           "spec": {"nodeName": "node-" + name},
                           "status": {"phase": "Running"}})

    def _run(self):
        while not self.stop.is_set():
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))
            time.sleep(0.05)

    def _step(self):
        pods = self.mock.pods(self.job)
        for name, pod in pods.items():
            if name not in self.procs and name not in self.exits and \
                    not pod["metadata"].get("deletionTimestamp"):
                self._start(name, pod)
        for name, entry in list(self.procs.items()):
            p, termed, grace = entry
            pod = pods.get(name)
            if termed is None and (pod is None or pod["metadata"].get("deletionTimestamp")):
                p.send_signal(signal.SIGTERM)
                entry[1] = time.monotonic()
            elif termed is not None and time.monotonic() - termed > grace and p.poll() is None:
                p.kill()
            if p.poll() is not None:
                rc = p.wait()
                self.exits[name] = rc
                del self.procs[name]
                if pod is not None:
                    self._patch(name, {"metadata": {"finalizers": []},
                                       "status": {"phase": "Succeeded" if rc == 0 else
                                                  "Failed"}})

    def close(self):
        self.stop.set()
        self.thread.join(TIMEOUT)
        for p, _, _ in self.procs.values():
            p.kill()
            p.wait()


def scenario_train():
    """A job trains to the end through a pod eviction, bitwise equal to an uninterrupted
    `train --local --dp 1 --pp 1`: the kubelet's SIGTERM and the deletion are the notice, the
    state moves off the evicted pod, and a replacement pod joins."""
    tmpdir = tempfile.TemporaryDirectory(prefix="k8s-train-")
    tmp = tmpdir.name
    steps = 1500
    spec = os.path.join(tmp, "job.yaml")
    with open(spec, "w") as f:
        f.write(TRAIN_SPEC % {"steps": steps, "ckpt": os.path.join(tmp, "ckpt")})
    ref = os.path.join(tmp, "ref")
    p = subprocess.run([BIN, "train", "--local", "--dp", "1", "--pp", "1", "--steps",
                        str(steps), "--save", ref, spec], capture_output=True, text=True,
                       timeout=300)
    check(p.returncode == 0, "reference training (%s)" % p.stderr[-2000:])
    mock = Mock()
    kc = os.path.join(tmp, "kubeconfig")
    mock.kubeconfig(kc)
    token_file = os.path.join(tmp, "token")
    save = os.path.join(tmp, "save")
    c = None
    kubelet = None
    try:
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        kubelet = Kubelet(mock, "ktrain", spec, token_file, tmp)
        c = Coordinator(spec, os.path.join(tmp, "state"), kc, tmp, extra=["--save", save])

        def step():
            try:
                with urllib.request.urlopen("http://%s/v1/job" % c.rest, timeout=5) as f:
                    return json.load(f).get("step", 0)
            except OSError:
                return 0
        wait_until(lambda: step() >= 20, "20 steps on 2 worker pods", timeout=240)
        check(sorted(mock.pods("ktrain")) == ["ktrain-w0", "ktrain-w1"], "two worker pods train")
        # Evict w0 the way Kubernetes does: a deletion with a grace period (the finalizer holds
        # the pod while its process runs), SIGTERM to the process.
        mock.request("DELETE", "/api/v1/namespaces/default/pods/ktrain-w0")
        wait_until(lambda: c.saw("notice: ktrain-w0"), "the eviction as a notice")
        check(True, "the eviction is a notice")
        wait_until(lambda: c.saw("was noticed"), "the state moving off w0")
        check(True, "the coordinator moved the state off the evicted pod")
        # The kubelet ends the process when the grace period (fleet.notice, 4 s) is over.
        wait_until(lambda: "ktrain-w0" in kubelet.exits, "w0's process to end", timeout=60)
        with open(os.path.join(tmp, "pods", "ktrain-w0", "stderr")) as f:
            check("Interruption notice: terminate" in f.read(),
                  "the worker relayed its SIGTERM as a notice")
        wait_until(lambda: c.saw("lost: ktrain-w0"), "w0 lost")
        check(c.saw("lost: ktrain-w0 (node-ktrain-w0, preempted)"), "w0 is lost as preempted")
        rc = c.wait_long(300)
        check(rc == 0 and c.saw("job finished: %d steps" % steps),
              "the job finished all %d steps (exit %d)\n%s" % (steps, rc,
                                                             "\n".join(c.lines[-20:])))
        # The coordinator deletes the pods once every worker acknowledged its Stop, so the
        # kubelet may end w2's process just after the coordinator exits: wait for it.
        wait_until(lambda: "ktrain-w2" in kubelet.exits, "the replacement pod's process to end",
                   timeout=60)
        with open(os.path.join(tmp, "pods", "ktrain-w2", "stderr")) as f:
            check("Joined job 'ktrain'" in f.read(), "a replacement pod ktrain-w2 joined")
        d = subprocess.run([BIN, "ckpt", "diff", ref, save], capture_output=True, text=True,
                           timeout=120)
        check(d.returncode == 0, "bitwise equal to train --local --dp 1 --pp 1:\n" +
              d.stdout[-2000:] + d.stderr[-2000:])
        wait_until(lambda: not mock.pods("ktrain"), "no worker pod left after the job")
        check(not kubelet.errors, "kubelet shim ran clean: %s" % kubelet.errors)
        print("\n".join(x for x in c.stderr().splitlines() if " epoch " in x or "notice:" in x
                        or "lost:" in x or "granted:" in x))
    except SystemExit:
        if c:
            print("--- coordinator stdout:\n" + "\n".join(c.lines[-40:]))
            print("--- coordinator stderr:\n" + c.stderr()[-4000:])
        for n in sorted(os.listdir(os.path.join(tmp, "pods"))) if os.path.isdir(
                os.path.join(tmp, "pods")) else []:
            with open(os.path.join(tmp, "pods", n, "stderr")) as f:
                print("--- %s stderr:\n%s" % (n, f.read()[-2000:]))
        raise
    finally:
        if c:
            c.kill()
        if kubelet:
            kubelet.close()
        mock.close()
    print("PASS", flush=True)


def main():
    if len(sys.argv) != 2:
        fail("usage: test_k8s.py SCENARIO")
    if not BIN:
        fail("SPOTTRAIN_BIN is not set")
    scenarios = {"render": scenario_render, "provider": scenario_provider,
                 "rbac": scenario_rbac, "dead": scenario_dead, "train": scenario_train}
    if sys.argv[1] not in scenarios:
        fail("unknown scenario " + sys.argv[1])
    scenarios[sys.argv[1]]()


if __name__ == "__main__":
    main()
