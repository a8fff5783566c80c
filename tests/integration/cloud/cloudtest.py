"""cloudtest.py: what the cloud integration tests share (test_aws.py, test_s3.py, test_stores.py,
test_gcpaz.py): reporting (check/fail), bounded polling, running `spottrain`, moto on loopback
with its scenario driver, the AWS environment of a child, an IAM user whose keys moto checks,
the job spec of the checkpoint-store tests, and the loopback HTTP server the fakes answer from.

One idea: a test says what it checks and nothing about plumbing; every wait here is bounded
polling on a condition, never a sleep to synchronise. moto and boto3 are imported where they are
used, so the tests whose venv holds only Google's and Azure's packages import this module too,
and test_aws/test_s3 can set moto's INITIAL_NO_AUTH_ACTION_COUNT before moto reads it.
"""
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BIN = os.environ.get("SPOTTRAIN_BIN") or "spottrain"

# Called (no arguments) before a FAIL line: a test that runs long-lived processes prints what
# they said, to see why.
FAIL_HOOKS = []


def fail(msg):
    for hook in FAIL_HOOKS:
        hook()
    print("FAIL: " + msg, flush=True)
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok - " + msg, flush=True)


def wait_for(cond, what, timeout=30.0, step=0.05):
    """cond()'s first true value, polled every step seconds for at most timeout seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(step)
    fail("timed out after %.0f s waiting for %s" % (timeout, what))


def run(args, env=None, timeout=180):
    """`spottrain ARGS...` to completion: (exit code, stdout, stderr)."""
    env = env if env is not None else dict(os.environ)
    r = subprocess.run([BIN, *args], env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


# ---- moto (test_aws.py, test_s3.py) ----------------------------------------------------------

def start_moto():
    """moto's server in this process on 127.0.0.1, a free port: (server, endpoint URL)."""
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    return srv, "http://%s:%d" % (host, port)


def moto_main(script, scenarios, scenario, prefix, finish=None):
    """Runs scenarios[scenario](tmpdir, moto_url) against a fresh moto and prints PASS; finish()
    (may be None) runs before moto stops, pass or fail."""
    if scenario not in scenarios:
        fail("usage: %s {%s}" % (script, "|".join(scenarios)))
    srv, url = start_moto()
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as d:
            scenarios[scenario](d, url)
    finally:
        if finish:
            finish()
        srv.stop()
    print("PASS " + scenario, flush=True)


def iam_user(url):
    """An IAM user allowed everything, made with the calls moto lets through before signature
    checking starts (INITIAL_NO_AUTH_ACTION_COUNT=3): its (access key id, secret key)."""
    import boto3
    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="x")
    iam.create_user(UserName="spottrain")
    iam.put_user_policy(UserName="spottrain", PolicyName="all", PolicyDocument=(
        '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'))
    ak = iam.create_access_key(UserName="spottrain")["AccessKey"]
    return ak["AccessKeyId"], ak["SecretAccessKey"]


def aws_env(url, home, key, secret, **extra):
    """This process's environment without any AWS_ variable, then the endpoint, keys and region
    of moto at url, HOME=home, the instance metadata service off and extra on top."""
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("AWS_"):
            del e[k]
    e.update({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": key,
              "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "us-east-1", "HOME": home,
              # Never the machine's own metadata service, even where the tests run on EC2.
              "AWS_EC2_METADATA_DISABLED": "true"})
    e.update(extra)
    return e


# ---- the checkpoint-store tests' job (test_s3.py, test_stores.py) -----------------------------

CKPT_SPEC = """apiVersion: spottrain/v1
kind: TrainingJob
metadata:
  name: %s
spec:
  model: {layers: 2, hidden: %d, heads: 2, vocab: 64, seq_len: 16}
  data:
    train: %s/data/train.bin
    synth: {kind: markov, tokens: 4096}
  training: {global_batch: 4, micro_batch: 1, steps: 5}
  fleet:
%s
  coordinator: {listen: "127.0.0.1:0", advertise: "10.1.2.3:7070"}
  status: {listen: ""}
  checkpoint: {dir: "%s", interval: 0}
"""


def write_ckpt_spec(d, name, hidden, fleet, ckpt_dir):
    """d/job.yaml: a 5-step job named name whose checkpoints go to ckpt_dir; fleet is the
    fleet section's lines (train --local never contacts the fleet). Returns its path."""
    path = os.path.join(d, "job.yaml")
    with open(path, "w") as f:
        f.write(CKPT_SPEC % (name, hidden, d, "\n".join("    " + l for l in fleet), ckpt_dir))
    return path


def train(spec, save, env):
    """`spottrain train --local --steps 5 --threads 1 --save SAVE SPEC`: (rc, stdout, stderr)."""
    return run(["train", "--local", "--steps", "5", "--threads", "1", "--save", save, spec], env)


def tool(args, env):
    """tests/integration/cloud/s3-ckpt-tool ARGS... (the restore lookup and retention on any
    store URL, from SPOTTRAIN_S3_TOOL): (exit code, stdout, stderr)."""
    r = subprocess.run([os.environ["SPOTTRAIN_S3_TOOL"], *args], env=env, capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


# ---- the fakes' HTTP server (test_gcpaz.py, test_stores.py) -----------------------------------

def serve(answer, http11=False, keep_blank=False):
    """A threaded HTTP server on 127.0.0.1, a free port, answering every GET, POST, PUT and
    DELETE with answer(handler, path, query dict, body) -> (status, bytes, headers dict);
    Content-Length is added. http11: keep-alive (HTTP/1.1) as the real service speaks it;
    keep_blank: query parameters with empty values are kept. Stop with shutdown()."""
    class H(BaseHTTPRequestHandler):
        if http11:
            protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do(self):
            u = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(u.query, keep_blank_values=keep_blank))
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            status, data, headers = answer(self, u.path, q, body)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv
