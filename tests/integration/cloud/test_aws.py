#!/usr/bin/env python3
"""`spottrain launch` and `down` with the aws provider against moto (EC2 on loopback).

Usage: test_aws.py SCENARIO
  train           the boot shim runs each moto instance's user-data as a local worker; one
                  instance is terminated in moto mid-job (no notice): it becomes a loss, a
                  replacement is granted, the job ends bitwise equal to train --local --dp 1 --pp 1
  launch-sigterm  fleet.max spot instances tagged with the job, spread over the zones, within
                  30 s; SIGTERM terminates every one of them and launch exits 0
  keep-down       --keep-fleet + SIGTERM leaves them running; `down` ends them, twice (idempotent)
  adopt           a launch restarted on the same state dir adopts the kept instances, asks for none
  bad-secret      signature checking on: a wrong secret key -> exit 2 naming AuthFailure, no
                  instance; the right key works (down --job)
  credentials     AWS_PROFILE in AWS_SHARED_CREDENTIALS_FILE; a wrong default profile, a missing
                  profile, no credentials, a bad endpoint URL, no fleet.image: exit 2 each
  dry-run         --dry-run prints the requests (user-data decoded, token redacted), no secret,
                  sends nothing
  capacity        a proxy refuses zone us-east-1a with InsufficientInstanceCapacity: all
                  instances come from us-east-1b
  fallback        every zone refuses spot, on_demand_fallback: the fleet comes on-demand
  throttled       a proxy answers RunInstances 503 RequestLimitExceeded twice: backoff, then
                  the fleet is granted
  bad-xml         a proxy answers 200 with a body that is not XML: exit 1, one clear error line
  dead-endpoint   nothing listens: exit 1 naming the endpoint, no hang
  placement       GetSpotPlacementScores (moto: 500, "not offered"; here a proxy answers it):
                  the better-scored zone gets the larger share of the first spread
  spot-price      DescribeSpotPriceHistory: the zone's live price in GET /v1/job, /metrics and
                  the --json summary

moto (PyPI, test-time only) runs in this process (ThreadedMotoServer on 127.0.0.1, port 0).
Every wait is bounded polling on moto's state or on launch's output; nothing sleeps to
synchronise. Needs SPOTTRAIN_BIN.
"""
import collections
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

SCENARIO = sys.argv[1] if len(sys.argv) > 1 else ""
if SCENARIO in ("bad-secret", "credentials"):
    # Signature checking on after the three IAM calls that make the user (read at import).
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"

import boto3  # noqa: E402
import cloudtest  # noqa: E402
from cloudtest import (FAIL_HOOKS, aws_env, check, fail, iam_user, moto_main,  # noqa: E402
                       wait_for)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402

BIN = os.environ["SPOTTRAIN_BIN"]
TIMEOUT = 30.0
JOB = "aws-e2e"
KEY, SECRET = "AKIAEXAMPLEKEY000001", "s3cr3t-VALUE-never-printed"
SESSION = "session-TOKEN-never-printed"
procs = []


def show_procs():  # what launch said, to see why
    for p in procs:
        print("---- %s\n%s" % (" ".join(p.args), output(p)), flush=True)


FAIL_HOOKS.append(show_procs)


def wait_until(pred, what, timeout=TIMEOUT):
    return wait_for(pred, what, timeout, step=0.1)


def ec2(url, key=KEY, secret=SECRET):
    return boto3.client("ec2", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret)


def job_instances(url, **kw):
    """{id: (state, zone, lifecycle)} of every instance tagged spottrain:job=JOB."""
    out = {}
    r = ec2(url, **kw).describe_instances(
        Filters=[{"Name": "tag:spottrain:job", "Values": [JOB]}])
    for res in r["Reservations"]:
        for i in res["Instances"]:
            out[i["InstanceId"]] = (i["State"]["Name"], i["Placement"]["AvailabilityZone"],
                                    i.get("InstanceLifecycle", "on-demand"))
    return out


def running(url, **kw):
    return {k: v for k, v in job_instances(url, **kw).items() if v[0] in ("pending", "running")}


def write_spec(d, zones=("us-east-1a", "us-east-1b"), fleet_max=3, coord="127.0.0.1:0",
               advertise="10.1.2.3:7070", steps=20, fallback=False, status=""):
    path = os.path.join(d, "job.yaml")
    with open(path, "w") as f:
        f.write("""apiVersion: spottrain/v1
kind: TrainingJob
metadata:
  name: %s
spec:
  model: {layers: 2, hidden: 32, heads: 2, vocab: 64, seq_len: 16}
  data:
    train: %s/data/train.bin
    synth: {kind: markov, tokens: 4096}
  training: {global_batch: 4, micro_batch: 1, steps: %d}
  fleet:
    provider: aws
    instance_type: t3.micro
    image: ami-12c6146b
    zones: [%s]
    max: %d
    on_demand_fallback: %s
  coordinator:
    listen: %s
    advertise: %s
  status:
    listen: "%s"
  checkpoint:
    interval: 0
""" % (JOB, d, steps, ", ".join(zones), fleet_max, "true" if fallback else "false", coord,
       advertise, status))
    return path


def env_for(url, d, secret=SECRET, session=None):
    return aws_env(url, d, KEY, secret, **({"AWS_SESSION_TOKEN": session} if session else {}))


def launch(spec, env, *flags):
    out = open(os.path.join(os.path.dirname(spec), "launch-%d.out" % len(procs)), "w+")
    p = subprocess.Popen([BIN, "launch", *flags, spec], env=env, stdout=out,
                         stderr=subprocess.STDOUT, text=True)
    p.log = out
    procs.append(p)
    return p


def output(p):
    p.log.flush()
    with open(p.log.name) as f:
        return f.read()


def run(args, env, timeout=TIMEOUT):
    return cloudtest.run(args, env, timeout)


def exit_code(p, what):
    """The exit code of launch p, which must exit by itself within TIMEOUT (else FAIL what)."""
    try:
        return p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        fail(what)


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        fail("launch did not exit within %.0f s of SIGTERM" % TIMEOUT)


def granted_fleet(url, p, n=3):
    def ready():
        if p.poll() is not None:
            fail("launch exited (rc %d) before its fleet was granted" % p.returncode)
        r = running(url)
        return len(r) == n and r
    return wait_until(ready, "%d running instances tagged spottrain:job=%s" % (n, JOB))


# ---- a proxy that injects EC2 errors in front of moto ------------------------------------------

class Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True


def start_proxy(upstream, rule):
    """rule(body) -> None (forward) or (status, body) to answer instead."""
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            inj = rule(body.decode())
            if inj is None:
                req = urllib.request.Request(upstream + self.path, data=body, method="POST")
                for k, v in self.headers.items():
                    if k.lower() not in ("host", "content-length", "connection"):
                        req.add_header(k, v)
                try:
                    with urllib.request.urlopen(req, timeout=20) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
            else:
                status, data = inj[0], inj[1].encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = Proxy(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, "http://127.0.0.1:%d" % srv.server_address[1]


def ec2_error(code, msg):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>%s</Code>'
            '<Message>%s</Message></Error></Errors><RequestID>test</RequestID></Response>'
            % (code, msg))


# ---- scenarios -------------------------------------------------------------------------------

def t_launch_sigterm(d, url):
    spec = write_spec(d)
    p = launch(spec, env_for(url, d), "--state-dir", os.path.join(d, "state"))
    t0 = time.monotonic()
    fleet = granted_fleet(url, p)
    check(time.monotonic() - t0 < TIMEOUT, "3 instances within 30 s")
    check(all(v[2] == "spot" for v in fleet.values()), "every instance is spot")
    zones = collections.Counter(v[1] for v in fleet.values())
    check(zones == {"us-east-1a": 2, "us-east-1b": 1}, "spread over the zones: %s" % dict(zones))
    tags = ec2(url).describe_tags(Filters=[{"Name": "resource-id", "Values": list(fleet)}])
    keys = collections.Counter(t["Key"] for t in tags["Tags"])
    check(keys == {"spottrain:job": 3, "spottrain:job-id": 3}, "tags job and job-id on each")
    wait_until(lambda: output(p).count("granted: i-") == 3, "3 granted events")
    rc = stop(p)
    check(rc == 0, "launch exits 0 after SIGTERM (rc %d)" % rc)
    left = running(url)
    check(not left, "no instance of the job left running (%s)" % left)
    states = collections.Counter(v[0] for v in job_instances(url).values())
    check(states == {"terminated": 3}, "the 3 instances are terminated: %s" % dict(states))
    check("launch stopped" in output(p), "launch says it stopped")


def t_spot_price(d, url):
    import json
    port = free_port()
    spec = write_spec(d, zones=("us-east-1a",), fleet_max=2, status="127.0.0.1:%d" % port)
    hist = ec2(url).describe_spot_price_history(
        InstanceTypes=["t3.micro"], ProductDescriptions=["Linux/UNIX"],
        Filters=[{"Name": "availability-zone", "Values": ["us-east-1a"]}])["SpotPriceHistory"]
    check(hist, "moto has a t3.micro spot price history in us-east-1a")
    price = float(max(hist, key=lambda h: h["Timestamp"])["SpotPrice"])
    p = launch(spec, env_for(url, d), "--state-dir", os.path.join(d, "state"), "--json",
               os.path.join(d, "sum.json"))
    granted_fleet(url, p, n=2)
    base = "http://127.0.0.1:%d" % port

    def job():
        try:
            with urllib.request.urlopen(base + "/v1/job", timeout=5) as r:
                j = json.load(r)
        except OSError:
            return None
        return j if j.get("spot_price_live") else None
    j = wait_until(job, "GET /v1/job with the live spot price")
    check(j["spot_price_per_hour"] == price, "GET /v1/job spot_price_per_hour is the zone's "
          "live price: %r" % j["spot_price_per_hour"])
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        m = r.read().decode()
    check("\nspottrain_spot_price_dollars_per_hour %.6f\n" % price in m,
          "/metrics spottrain_spot_price_dollars_per_hour is the live price")
    rc = stop(p)
    check(rc == 0, "launch exits 0 after SIGTERM (rc %d)" % rc)
    with open(os.path.join(d, "sum.json")) as f:
        summary = json.load(f)
    check(summary["spot_price_live"] == price, "the --json summary holds the live price: %r"
          % summary["spot_price_live"])


def t_placement(d, url):
    try:
        ec2(url).get_spot_placement_scores(InstanceTypes=["t3.micro"], TargetCapacity=3,
                                           SingleAvailabilityZone=True,
                                           RegionNames=["us-east-1"])
        fail("moto answered GetSpotPlacementScores: the other scenarios no longer cover "
             "'not offered'")
    except Exception as e:  # botocore ClientError with moto's 500
        check("500" in str(e) or "InternalError" in str(e) or "Internal" in str(e),
              "moto does not offer GetSpotPlacementScores (%s): every other launch scenario "
              "runs with it not offered" % str(e)[:80])
    ids = {z["ZoneName"]: z["ZoneId"] for z in
           ec2(url).describe_availability_zones()["AvailabilityZones"]}
    asked = {"n": 0}

    def rule(body):
        if "Action=GetSpotPlacementScores" not in body:
            return None
        asked["n"] += 1
        return (200, '<?xml version="1.0" encoding="UTF-8"?>\n<GetSpotPlacementScoresResponse '
                'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>t</requestId>'
                '<spotPlacementScoreSet>'
                '<item><region>us-east-1</region><availabilityZoneId>%s</availabilityZoneId>'
                '<score>2</score></item>'
                '<item><region>us-east-1</region><availabilityZoneId>%s</availabilityZoneId>'
                '<score>9</score></item>'
                '</spotPlacementScoreSet></GetSpotPlacementScoresResponse>'
                % (ids["us-east-1a"], ids["us-east-1b"]))
    srv, purl = start_proxy(url, rule)
    spec = write_spec(d)  # zones [us-east-1a, us-east-1b], 3 instances
    p = launch(spec, env_for(purl, d), "--state-dir", os.path.join(d, "state"))
    fleet = granted_fleet(url, p)
    zones = collections.Counter(v[1] for v in fleet.values())
    check(asked["n"] == 1, "GetSpotPlacementScores asked once")
    check(zones == {"us-east-1b": 2, "us-east-1a": 1}, "the better-scored zone us-east-1b gets "
          "the larger share (without scores: 1a 2, 1b 1): %s" % dict(zones))
    check(stop(p) == 0 and not running(url), "SIGTERM ends the fleet")
    srv.shutdown()


def t_keep_down(d, url):
    spec = write_spec(d)
    env = env_for(url, d)
    p = launch(spec, env, "--keep-fleet", "--state-dir", os.path.join(d, "state"))
    fleet = granted_fleet(url, p)
    wait_until(lambda: output(p).count("granted: i-") == 3, "3 granted events")
    rc = stop(p)
    check(rc == 0, "launch --keep-fleet exits 0 after SIGTERM")
    check(running(url) == fleet, "the 3 instances are still running")
    rc, out, err = run(["down", spec], env)
    check(rc == 0, "down exits 0 (%s)" % err.strip())
    check("down: job '%s': 3 instance(s) terminated" % JOB in out, "down names 3: " + out.strip())
    check(not running(url), "no running instance tagged with the job after down")
    rc, out, err = run(["down", "--job", JOB], env)
    check(rc == 0 and "0 instance(s) terminated" in out, "a second down is a no-op: " + out)


def t_adopt(d, url):
    spec = write_spec(d)
    env = env_for(url, d)
    state = os.path.join(d, "state")
    p = launch(spec, env, "--keep-fleet", "--state-dir", state)
    fleet = granted_fleet(url, p)
    wait_until(lambda: output(p).count("granted: i-") == 3, "3 granted events")
    check(stop(p) == 0, "first launch kept its fleet")
    p2 = launch(spec, env, "--state-dir", state)
    wait_until(lambda: output(p2).count("granted: i-") == 3, "the restart's 3 granted events")
    got = sorted(l.split()[1] for l in output(p2).splitlines() if l.startswith("granted: i-"))
    check(got == sorted(fleet), "the restart adopted the same 3 instances")
    check(stop(p2) == 0, "restarted launch exits 0 after SIGTERM")
    allinst = job_instances(url)
    check(len(allinst) == 3, "no instance was asked for beyond the 3 adopted (%d)" % len(allinst))
    check(not running(url), "the restart terminated the adopted fleet")


def t_bad_secret(d, url):
    key, secret = iam_user(url)
    spec = write_spec(d)
    env = env_for(url, d, secret=secret + "-wrong")
    env["AWS_ACCESS_KEY_ID"] = key
    p = launch(spec, env, "--state-dir", os.path.join(d, "state"))
    rc = exit_code(p, "launch with a wrong secret did not exit")
    out = output(p)
    check(rc == 2, "launch exits 2 with a wrong secret (rc %d)" % rc)
    auth = [l for l in out.splitlines() if "AuthFailure" in l]
    check(len(auth) == 1 and "DescribeInstances refused: AuthFailure: " in auth[0],
          "one error line names the AWS error code: " + " | ".join(auth))
    check(secret not in out, "the secret is not printed")
    check(not job_instances(url, key=key, secret=secret), "moto holds no instance")
    env["AWS_SECRET_ACCESS_KEY"] = secret
    rc, o, e = run(["down", "--job", JOB], env)
    check(rc == 0 and "0 instance(s)" in o, "the right secret is accepted (signing works): %s%s"
          % (o, e))


def t_credentials(d, url):
    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                       aws_access_key_id="x", aws_secret_access_key="x")
    iam.create_user(UserName="spottrain")
    iam.put_user_policy(UserName="spottrain", PolicyName="all", PolicyDocument=(
        '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'))
    k = iam.create_access_key(UserName="spottrain")["AccessKey"]
    creds = os.path.join(d, "creds")
    with open(creds, "w") as f:
        f.write("[default]\naws_access_key_id = %s\naws_secret_access_key = wrong\n\n"
                "# the job's profile\n[ spot ]\naws_access_key_id=%s\n"
                "aws_secret_access_key = %s\n" % (k["AccessKeyId"], k["AccessKeyId"],
                                                   k["SecretAccessKey"]))
    env = env_for(url, d)
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]
    env["AWS_SHARED_CREDENTIALS_FILE"] = creds
    env["AWS_PROFILE"] = "spot"
    rc, o, e = run(["down", "--job", JOB], env)
    check(rc == 0 and "0 instance(s)" in o, "AWS_PROFILE's keys from the shared file: %s%s"
          % (o, e))
    del env["AWS_PROFILE"]
    rc, o, e = run(["down", "--job", JOB], env)
    check(rc == 2 and "AuthFailure" in e, "the default profile's wrong secret: exit 2 (%d)" % rc)
    check(k["SecretAccessKey"] not in o + e, "no secret printed")
    env["AWS_PROFILE"] = "missing"
    rc, o, e = run(["down", "--job", JOB], env)
    check(rc == 2 and "profile 'missing' in '%s' (no such profile there)" % creds in e,
          "a missing profile: exit 2 naming it: " + e.strip().splitlines()[0])
    del env["AWS_SHARED_CREDENTIALS_FILE"], env["AWS_PROFILE"]
    rc, o, e = run(["down", "--job", JOB], env)  # HOME=d has no .aws/credentials
    check(rc == 2 and "no AWS credentials" in e, "no credentials anywhere: exit 2")
    env["AWS_ENDPOINT_URL"] = "ftp://127.0.0.1:1"
    env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = KEY, SECRET
    rc, o, e = run(["down", "--job", JOB], env)
    check(rc == 2 and "bad EC2 endpoint 'ftp://127.0.0.1:1'" in e, "a bad endpoint URL: exit 2")
    spec = write_spec(d)
    with open(spec) as f:
        text = f.read()
    with open(spec, "w") as f:
        f.write(text.replace("    image: ami-12c6146b\n", ""))
    rc, o, e = run(["launch", "--dry-run", spec], env_for(url, d))
    check(rc == 2 and "spec.fleet.image (the AMI id) is required" in e, "no image: exit 2")


def t_dry_run(d, url):
    spec = write_spec(d)
    env = env_for(url, d, session=SESSION)
    rc, out, err = run(["launch", "--dry-run", spec], env)
    check(rc == 0, "dry run exits 0 (%s)" % err.strip())
    lines = out.splitlines()
    posts = [l for l in lines if l.startswith("POST ")]
    check([l.split("Action=")[1].split("&")[0] for l in posts] ==
          ["DescribeInstances", "RunInstances", "RunInstances"],
          "one DescribeInstances and a RunInstances per zone")
    check(all(l.startswith("POST %s Action=" % url) for l in posts), "POST ENDPOINT Action=...")
    run1 = posts[1]
    for kv in ("ImageId=ami-12c6146b", "InstanceType=t3.micro", "MinCount=2", "MaxCount=2",
               "Placement.AvailabilityZone=us-east-1a", "InstanceMarketOptions.MarketType=spot",
               "TagSpecification.1.Tag.1.Key=spottrain%3Ajob",
               "TagSpecification.1.Tag.1.Value=" + JOB):
        check(kv in run1.split("&") or kv in run1.split(" ")[2].split("&"), "request has " + kv)
    check(any("exec spottrain worker --coordinator 10.1.2.3:7070 --job-id " in l for l in lines),
          "the user-data is shown decoded, dialing coordinator.advertise")
    check(any("exec spottrain worker " in l and " --cloud aws " in l for l in lines),
          "the worker is told --cloud aws, so it polls IMDSv2 for its notice")
    check(any("'<redacted>'" in l for l in lines), "the join token is redacted")
    for s in (SECRET, SESSION, KEY):
        check(s not in out + err, "no credential printed (%s...)" % s[:4])
    check(not job_instances(url), "nothing was sent: moto holds no instance")


def t_capacity(d, url):
    def rule(body):
        if "Action=RunInstances" in body and "Placement.AvailabilityZone=us-east-1a" in body:
            return (400, ec2_error("InsufficientInstanceCapacity",
                                   "We currently do not have sufficient capacity"))
        return None
    srv, purl = start_proxy(url, rule)
    spec = write_spec(d)
    p = launch(spec, env_for(purl, d), "--state-dir", os.path.join(d, "state"))
    fleet = granted_fleet(url, p)
    zones = collections.Counter(v[1] for v in fleet.values())
    check(zones == {"us-east-1b": 3}, "the refused zone's share went to us-east-1b: %s"
          % dict(zones))
    check("InsufficientInstanceCapacity" in output(p), "the capacity error is reported")
    check(stop(p) == 0 and not running(url), "SIGTERM ends the fleet")
    srv.shutdown()


def t_fallback(d, url):
    def rule(body):
        if "Action=RunInstances" in body and "InstanceMarketOptions.MarketType=spot" in body:
            return (400, ec2_error("InsufficientInstanceCapacity", "No spot capacity"))
        return None
    srv, purl = start_proxy(url, rule)
    spec = write_spec(d, fallback=True)
    p = launch(spec, env_for(purl, d), "--state-dir", os.path.join(d, "state"))
    fleet = granted_fleet(url, p)
    kinds = collections.Counter((v[1], v[2]) for v in fleet.values())
    check(kinds == {("us-east-1a", "on-demand"): 2, ("us-east-1b", "on-demand"): 1},
          "every zone refused spot: on-demand, spread the same way: %s" % dict(kinds))
    check("spot refused for 3 instance(s); asking on-demand" in output(p), "the fallback is said")
    check(stop(p) == 0 and not running(url), "SIGTERM ends the fleet")
    srv.shutdown()


def t_throttled(d, url):
    count = {"n": 0}

    def rule(body):
        if "Action=RunInstances" in body and count["n"] < 2:
            count["n"] += 1
            return (503, ec2_error("RequestLimitExceeded", "Request limit exceeded."))
        return None
    srv, purl = start_proxy(url, rule)
    spec = write_spec(d, zones=("us-east-1a",))
    p = launch(spec, env_for(purl, d), "--state-dir", os.path.join(d, "state"))
    fleet = granted_fleet(url, p)
    check(count["n"] == 2 and len(fleet) == 3, "granted after 2 throttled answers")
    check(output(p).count("RequestLimitExceeded") == 2, "each throttled answer logged once")
    check(stop(p) == 0 and not running(url), "SIGTERM ends the fleet")
    srv.shutdown()


def t_bad_xml(d, url):
    srv, purl = start_proxy(url, lambda body: (200, "this is <not xml"))
    spec = write_spec(d)
    p = launch(spec, env_for(purl, d), "--state-dir", os.path.join(d, "state"))
    rc = exit_code(p, "launch did not exit on a malformed answer")
    out = output(p)
    check(rc == 1, "launch exits 1 on a malformed answer (rc %d)" % rc)
    check("DescribeInstances: %s answered HTTP 200 with a body that is not EC2 XML" % purl in out,
          "one clear error line")
    check(not job_instances(url), "no instance")
    srv.shutdown()


def t_dead_endpoint(d, url):
    dead = "http://127.0.0.1:%d" % free_port()
    spec = write_spec(d)
    p = launch(spec, env_for(dead, d), "--state-dir", os.path.join(d, "state"))
    rc = exit_code(p, "launch did not exit on a dead endpoint")
    out = output(p)
    check(rc == 1, "launch exits 1 on a dead endpoint (rc %d)" % rc)
    check("DescribeInstances: %s: Couldn't connect to server" % dead in out,
          "the endpoint is named: " + out.strip().splitlines()[-1])


# ---- the boot shim: moto's instances run their user-data here, as local worker processes ------

class Imds(http.server.ThreadingHTTPServer):
    """A minimal IMDSv2 for one instance: token, instance-id; no spot notice (404)."""
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a worker killed mid-request (its instance terminated) is expected here

    def __init__(self, iid):
        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, status, body=b""):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                ok = self.path == "/latest/api/token"
                self.reply(200 if ok else 404, b"imds-token" if ok else b"")

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != "imds-token":
                    return self.reply(401)
                if self.path == "/latest/meta-data/instance-id":
                    return self.reply(200, iid.encode())
                self.reply(404)
        super().__init__(("127.0.0.1", 0), H)
        threading.Thread(target=self.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server_address[1]


class BootShim:
    """Watches DescribeInstances; runs each new running instance's user-data (the image's
    paths mapped into a folder of its own, `spottrain` = the binary under test) with its own
    IMDS; kills the worker of an instance moto shows terminated (the cloud took it away)."""

    def __init__(self, url, d):
        self.url, self.d = url, d
        self.workers = {}  # id -> (Popen, Imds)
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def boot(self, iid):
        import base64
        ud = ec2(self.url).describe_instance_attribute(InstanceId=iid, Attribute="userData")
        script = base64.b64decode(ud["UserData"]["Value"]).decode()
        home = os.path.join(self.d, "inst-" + iid)
        script = script.replace("/var/lib/spottrain", home).replace(
            "exec spottrain ", "exec %s " % BIN)
        imds = Imds(iid)
        env = dict(os.environ, AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.url)
        log = open(home + ".log", "w")
        p = subprocess.Popen(["sh", "-c", script], env=env, stdout=log, stderr=subprocess.STDOUT)
        self.workers[iid] = (p, imds)

    def loop(self):
        while not self.stop:
            try:
                for iid, (state, _, _) in job_instances(self.url).items():
                    if state == "running" and iid not in self.workers:
                        self.boot(iid)
                    elif state in ("shutting-down", "terminated") and iid in self.workers:
                        p = self.workers[iid][0]
                        if p.poll() is None:
                            p.kill()
            except Exception as e:  # noqa: BLE001 - moto going away at the end
                print("shim: %s" % e, flush=True)
            time.sleep(0.2)

    def close(self):
        self.stop = True
        self.t.join()
        for p, imds in self.workers.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            imds.shutdown()


def t_train(d, url):
    coord = "127.0.0.1:%d" % free_port()
    # Enough steps that the loss lands mid-job: this tiny model runs ~350 steps/s here, the
    # launch prints progress every 0.5 s when not on a terminal, and the shim needs a moment
    # to see the termination (600 steps once all ran before it did).
    spec = write_spec(d, fleet_max=2, coord=coord, advertise=coord, steps=3000)
    ref = os.path.join(d, "ref")
    rc, o, e = run(["train", "--local", "--dp", "1", "--pp", "1", "--save", ref, spec], None,
                   timeout=120)
    check(rc == 0, "reference run: train --local --dp 1 --pp 1 (%s)" % e.strip()[-200:])
    shim = BootShim(url, d)
    try:
        out_dir = os.path.join(d, "out")
        p = launch(spec, env_for(url, d), "--state-dir", os.path.join(d, "state"), "--save",
                   out_dir)
        fleet = granted_fleet(url, p, n=2)
        def step():
            import re
            m = re.findall(r"^progress: step (\d+)/", output(p), re.M)
            return int(m[-1]) if m else 0
        wait_until(lambda: step() >= 1, "training under way", timeout=90)
        victim = sorted(fleet)[0]
        # The survivor is frozen from the termination until the launch says the victim was
        # lost and a replacement was granted: DescribeInstances runs every 5 s, and a quiet
        # machine could train the rest of the job before it sees the loss (well inside the
        # 10 s heartbeat deadline either way).
        survivor = shim.workers[sorted(fleet)[1]][0]
        survivor.send_signal(signal.SIGSTOP)
        try:
            ec2(url).terminate_instances(InstanceIds=[victim])  # unannounced: no notice first
            print("terminated %s without notice" % victim, flush=True)
            t0 = time.time()
            wait_until(lambda: "lost: %s" % victim in output(p), "the loss", timeout=60)
            print("the launch saw the loss %.1f s after the termination" % (time.time() - t0))
        finally:
            survivor.send_signal(signal.SIGCONT)
        try:
            rc = p.wait(timeout=150)
        except subprocess.TimeoutExpired:
            fail("launch did not finish the job")
        check(rc == 0, "launch trains to the end (rc %d)" % rc)
        out = output(p)
        check("lost: %s" % victim in out, "the terminated instance became a loss")
        # How many epochs the loss costs depends on whether the data plane or DescribeInstances
        # sees it first; what the job commits does not.
        check("  steps              3000\n  samples committed  12000\n" in out,
              "3000 steps, 12000 samples committed: none lost or repeated")
        grants = [l for l in out.splitlines() if l.startswith("granted: i-")]
        check(len(grants) == 3, "a replacement was granted after the loss: %d grants" %
              len(grants))
        print("\n".join(l for l in out.splitlines() if not l.startswith("progress")),
              flush=True)
        check(not running(url), "no instance left running after the job")
    finally:
        shim.close()
    rc, o, e = run(["ckpt", "diff", ref, out_dir], None)
    check(rc == 0, "the launch's final state equals train --local --dp 1 --pp 1: %s" %
          (o + e).strip()[-300:])


SCENARIOS = {"spot-price": t_spot_price, "placement": t_placement, "train": t_train, "launch-sigterm": t_launch_sigterm, "keep-down": t_keep_down, "adopt": t_adopt,
             "bad-secret": t_bad_secret, "credentials": t_credentials, "dry-run": t_dry_run, "capacity": t_capacity, "fallback": t_fallback,
             "throttled": t_throttled, "bad-xml": t_bad_xml, "dead-endpoint": t_dead_endpoint}


def kill_procs():
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def main():
    moto_main("test_aws.py", SCENARIOS, SCENARIO, "spottrain-aws-", finish=kill_procs)


if __name__ == "__main__":
    main()
