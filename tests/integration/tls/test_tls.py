#!/usr/bin/env python3
"""TLS on the control plane (spec.coordinator.tls, --tls-* flags): real processes on loopback.

Usage: test_tls.py SCENARIO   (server | mutual | bad-input)

A throwaway CA, a server certificate (SAN IP:127.0.0.1, DNS:localhost), a client certificate
and an unrelated second CA are made with openssl in a temporary directory; skip (77) when
openssl is missing. Reuses the process helpers of tests/integration/control/test_control.py.
Every wait is bounded polling; the "is rejected" checks watch a fixed window in which a
rejected worker must not get a command and the journal must not change.
"""
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "control"))
import test_control as tc  # noqa: E402  (Proc, wait_until, check, journal_snapshot, ...)

check, fail, wait_until, Proc = tc.check, tc.fail, tc.wait_until, tc.Proc
BIN = tc.BIN
REJECT_WINDOW = 3.0  # seconds a rejected worker is given to (wrongly) get in


def sh(*args):
    r = subprocess.run(args, cwd=tc.tmp, capture_output=True, text=True)
    if r.returncode != 0:
        fail("%s: %s" % (" ".join(args), r.stderr))


def make_certs():
    """ca.pem, server.{pem,key}, client.{pem,key}, other-ca.pem (a CA nobody trusts),
    client-other.{pem,key} (signed by the other CA), garbage.pem."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        sh("openssl", "req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem",
           "-days", "2", "-subj", "/CN=spottrain-test-" + ca)
    with open(os.path.join(tc.tmp, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    with open(os.path.join(tc.tmp, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for name, ca, ext in (("server", "ca", "server.ext"), ("client", "ca", "client.ext"),
                          ("client-other", "other-ca", "client.ext")):
        sh("openssl", "req", *ec, "-keyout", name + ".key", "-out", name + ".csr",
           "-subj", "/CN=spottrain-test-" + name)
        sh("openssl", "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
           ca + ".key", "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", ext)
    with open(os.path.join(tc.tmp, "garbage.pem"), "w") as f:
        f.write("this is not a certificate\n")


def p(name):
    return os.path.join(tc.tmp, name)


def write_job(tls, name="job-tls.yaml"):
    """A copy of the control tests' job with spec.coordinator.tls set (paths relative to the
    spec file, as users write them)."""
    shutil.copy(os.path.join(HERE, "..", "control", "trace.csv"), p("trace.csv"))
    with open(os.path.join(HERE, "..", "control", "job.yaml")) as f:
        text = f.read()
    old = '  coordinator: {listen: "127.0.0.1:0", heartbeat_deadline: 3s}'
    if old not in text:
        fail("control job.yaml changed: cannot add coordinator.tls")
    text = text.replace(old, '  coordinator:\n    listen: "127.0.0.1:0"\n'
                        '    heartbeat_deadline: 3s\n    tls: {%s}' % tls)
    with open(p(name), "w") as f:
        f.write(text)
    return p(name)


class TlsCoord:
    def __init__(self, state, job, flags=()):
        args = [BIN, "coordinator", "--job", job, "--state-dir", state, "--listen",
                "127.0.0.1:0", "--status-listen", "127.0.0.1:0", "--token-file",
                tc.token_file] + list(flags)
        self.proc = Proc(args, "coord")
        line = wait_until(self._line, "the coordinator's listening line")
        f = dict(kv.split("=", 1) for kv in line.split()[2:])
        self.grpc, self.rest = f["grpc"], f["rest"]

    def _line(self):
        if self.proc.p.poll() is not None:
            fail("coordinator exited early: " + open(self.proc.err_path).read())
        for line in self.proc.text().splitlines():
            if line.startswith("coordinator listening "):
                return line
        return None

    def ctx(self, client=None):
        c = ssl.create_default_context(cafile=p("ca.pem"))
        if client:
            c.load_cert_chain(p(client + ".pem"), p(client + ".key"))
        return c

    def get(self, path, client=None):
        """(status, JSON body) of GET https://REST/path."""
        req = urllib.request.Request("https://" + self.rest + path)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.ctx(client)) as r:
                return r.status, json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode())

    def workers(self, client=None):
        code, body = self.get("/v1/workers", client)
        if code != 200:
            fail("GET /v1/workers: %d %s" % (code, body))
        return {w["id"]: w for w in body["workers"]}


def worker(c, name, flags=()):
    args = [BIN, "worker", "--coordinator", c.grpc, "--state-dir", p(name), "--token-file",
            tc.token_file] + list(flags)
    w = Proc(args, name)
    line = wait_until(lambda: w.lines("worker id="), name + " start line")
    w.id = line[0].split()[1].split("=", 1)[1]
    return w


def rejected(c, state, name, flags, client=None):
    """Starts a worker that must not get in: within the window it gets no command, the
    coordinator does not list it, and the journal does not change. Then stops it."""
    before = tc.journal_snapshot(state)
    w = worker(c, name, flags)
    time.sleep(REJECT_WINDOW)  # a fixed window: we are checking that nothing happens
    ok = (not w.lines("worker command") and w.id not in c.workers(client) and
          tc.journal_snapshot(state) == before)
    rc = w.stop()
    if rc != 0:  # a sanitizer report or a crash while refused
        fail("%s exited %d after SIGTERM: %s" % (name, rc, open(w.err_path).read()[-2000:]))
    return ok


def status(c, *flags):
    r = subprocess.run([BIN, "status", "--endpoint", "https://" + c.rest, "--json"] +
                       list(flags), capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout, r.stderr


def scenario_server():
    """Server TLS from command-line flags: a worker trusting the CA joins; plaintext and
    wrong-CA workers are refused in the handshake and change nothing; REST is https only."""
    make_certs()
    state = p("state")
    c = TlsCoord(state, tc.JOB, ["--tls-cert", p("server.pem"), "--tls-key", p("server.key")])
    check(rejected(c, state, "w-plain", []), "a plaintext worker is refused, journal unchanged")
    check(rejected(c, state, "w-wrongca", ["--tls-ca", p("other-ca.pem")]),
          "a worker trusting another CA is refused, journal unchanged")
    w = worker(c, "w-good", ["--tls-ca", p("ca.pem")])
    w2 = worker(c, "w-good2", ["--tls-ca", p("ca.pem")])  # the job pins pp=2
    check(" tls=on" in w.lines("worker id=")[0], "the worker says it uses TLS")
    wait_until(lambda: w.lines("kind=configure") and w2.lines("kind=configure"),
               "Configure over TLS")
    check(w.id in c.workers() and w2.id in c.workers(),
          "the TLS workers are in /v1/workers (over https)")
    code, body = c.get("/healthz")
    check(code == 200, "GET https /healthz with the CA: 200")
    code, body = c.get("/v1/job")
    check(code == 200 and body["name"] == "control-test", "GET https /v1/job")
    try:
        urllib.request.urlopen("http://" + c.rest + "/healthz", timeout=5).read()
        fail("plain http to the TLS port answered")
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        check(True, "plain http to the TLS port fails (%s)" % type(e).__name__)
    try:
        urllib.request.urlopen("https://" + c.rest + "/healthz", timeout=5,
                               context=ssl.create_default_context(cafile=p("other-ca.pem")))
        fail("https with another CA was accepted")
    except (urllib.error.URLError, ssl.SSLError) as e:
        check(True, "https trusting another CA fails verification (%s)" % type(e).__name__)
    rc, out, err = status(c, "--tls-ca", p("ca.pem"))
    check(rc == 0 and json.loads(out)["job"]["name"] == "control-test" and
          w.id in out, "spottrain status over https with --tls-ca")
    rc, out, err = status(c, "--tls-ca", p("other-ca.pem"))
    check(rc == 1 and "certificate" in err.lower(), "status with the wrong CA: exit 1 (%s)" %
          err.strip().splitlines()[0] if err.strip() else "")
    check(w.stop() == 0 and w2.stop() == 0, "the TLS workers exit 0 on SIGTERM")
    check(c.proc.stop() == 0, "clean shutdown")


def scenario_mutual():
    """TLS with a client CA from the spec: gRPC and REST need a client certificate signed
    by that CA."""
    make_certs()
    job = write_job("cert: server.pem, key: server.key, client_ca: ca.pem")
    state = p("state")
    c = TlsCoord(state, job)
    check(rejected(c, state, "w-nocert", ["--tls-ca", p("ca.pem")], client="client"),
          "a worker without a client certificate is refused, journal unchanged")
    check(rejected(c, state, "w-othercert", ["--tls-ca", p("ca.pem"), "--tls-cert",
                                             p("client-other.pem"), "--tls-key",
                                             p("client-other.key")], client="client"),
          "a client certificate from another CA is refused, journal unchanged")
    mtls = ["--tls-ca", p("ca.pem"), "--tls-cert", p("client.pem"), "--tls-key",
            p("client.key")]
    w = worker(c, "w-good", mtls)
    w2 = worker(c, "w-good2", mtls)  # the job pins pp=2
    wait_until(lambda: w.lines("kind=configure") and w2.lines("kind=configure"),
               "Configure over mutual TLS")
    code, body = c.get("/v1/job", client="client")
    check(code == 200 and body["name"] == "control-test", "REST with a client cert: 200")
    code, body = c.get("/v1/job", client="client-other")
    check(code == 403 and body["code"] == "client_certificate_required",
          "REST with a client cert from another CA: 403")
    code, body = c.get("/v1/job")
    check(code == 403 and body["code"] == "client_certificate_required",
          "REST without a client cert: 403")
    rc, out, err = status(c, "--tls-ca", p("ca.pem"))
    check(rc == 1, "status without a client certificate: exit 1")
    rc, out, err = status(c, "--tls-ca", p("ca.pem"), "--tls-cert", p("client.pem"),
                          "--tls-key", p("client.key"))
    check(rc == 0 and w.id in out, "status with --tls-cert/--tls-key: exit 0")
    check(w.stop() == 0 and w2.stop() == 0, "the TLS workers exit 0 on SIGTERM")
    check(c.proc.stop() == 0, "clean shutdown")


def run(*args):
    r = subprocess.run([BIN] + list(args), capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def scenario_bad_input():
    """Every refusal of a TLS flag or file exits 2 and names the input; nothing listens."""
    make_certs()
    st = ["--state-dir", p("state"), "--listen", "127.0.0.1:0", "--status-listen", "127.0.0.1:0"]
    co = ["coordinator", "--job", tc.JOB] + st
    cases = [
        (co + ["--tls-cert", p("server.pem")], "--tls-cert and --tls-key go together"),
        (co + ["--tls-key", p("server.key")], "--tls-cert and --tls-key go together"),
        (co + ["--tls-cert", p("nope.pem"), "--tls-key", p("server.key")], "nope.pem"),
        (co + ["--tls-cert", p("server.pem"), "--tls-key", p("server.key"), "--tls-client-ca",
               p("nope.pem")], "nope.pem"),
        (co + ["--tls-cert", p("garbage.pem"), "--tls-key", p("server.key")], "is not PEM"),
        (co + ["--tls-client-ca", p("ca.pem")], "needs the server's certificate"),
        (["coordinator", "--job", write_job("cert: server.pem", "j1.yaml")] + st,
         "spec.coordinator.tls: missing required key 'key'"),
        (["coordinator", "--job", write_job("cert: server.pem, key: missing.key", "j2.yaml")] + st,
         "spec.coordinator.tls.key: cannot access"),
        (["worker", "--coordinator", "127.0.0.1:1", "--tls-cert", p("client.pem"),
          "--tls-key", p("client.key")], "--tls-cert needs --tls-ca"),
        (["worker", "--coordinator", "127.0.0.1:1", "--tls-ca", p("ca.pem"), "--tls-cert",
          p("client.pem")], "--tls-cert and --tls-key go together"),
        (["worker", "--coordinator", "127.0.0.1:1", "--tls-ca", p("nope.pem")], "nope.pem"),
        (["worker", "--coordinator", "127.0.0.1:1", "--state-dir", p("wg"), "--tls-ca",
          p("garbage.pem")], "is not PEM"),
        (["status", "--endpoint", "http://127.0.0.1:1", "--tls-ca", p("ca.pem")],
         "need an https:// --endpoint"),
        (["status", "--endpoint", "https://127.0.0.1:1", "--tls-ca", p("nope.pem")], "nope.pem"),
        (["status", "--endpoint", "https://127.0.0.1:1", "--tls-cert", p("client.pem")],
         "--tls-cert and --tls-key go together"),
        (["status", "--endpoint", "ftp://127.0.0.1:1"], "bad --endpoint"),
    ]
    for args, want in cases:
        rc, out = run(*args)
        check(rc == 2 and want in out, "%s -> exit 2, '%s' (got %d: %s)" %
              (" ".join(a.replace(tc.tmp + "/", "") for a in args[:1] + args[3:] if a),
               want, rc, out.strip().splitlines()[-1] if out.strip() else ""))
    rc, out = run("status", "--endpoint", "https://127.0.0.1:1", "--tls-ca", p("ca.pem"))
    check(rc == 1, "status over https to a closed port: exit 1")
    rc, out = run(*co, "--tls-cert", p("server.pem"), "--tls-key", p("client.key"))
    check(rc == 1 and "TLS certificate and key that do not match" in out,
          "a certificate with another key's PEM: exit 1, says why")


SCENARIOS = ("server", "mutual", "bad-input")


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        print(__doc__)
        return 2
    if not BIN or not os.path.exists(BIN):
        print("SPOTTRAIN_BIN not set or missing")
        return 1
    if not shutil.which("openssl"):
        print("SKIP: openssl not installed (scripts/install-deps installs it)")
        return 77
    tc.tmp = tempfile.mkdtemp(prefix="tls-%s-" % sys.argv[1])
    tc.token_file = os.path.join(tc.tmp, "token")
    with open(tc.token_file, "w") as f:
        f.write(tc.TOKEN + "\n")
    try:
        globals()["scenario_" + sys.argv[1].replace("-", "_")]()
    except SystemExit as e:
        tc.cleanup()
        for pr in tc.procs:
            sys.stdout.write("---- %s stderr (tail)\n" % pr.name)
            sys.stdout.write("".join(open(pr.err_path).readlines()[-15:]))
        return e.code
    finally:
        tc.cleanup()
    subprocess.run(["rm", "-rf", tc.tmp])
    return 0


if __name__ == "__main__":
    sys.exit(main())
