#!/usr/bin/env python3
"""Control-plane integration tests: real coordinator and worker processes on loopback.

Usage: test_control.py SCENARIO   (join | lost | restart | auth | garbage | python-grpc |
                                   schemathesis; the last two need grpcio / schemathesis)

Every wait is bounded polling on an observable (a line of output, a REST answer, a journal
row); nothing sleeps to synchronise. Needs SPOTTRAIN_BIN, and RAWCALL (tests/integration/control/
rawcall.c) for the scenarios that send what no well-behaved client sends.
"""
import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402

BIN = os.environ.get("SPOTTRAIN_BIN", "")
RAWCALL = os.environ.get("RAWCALL", "")
HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "job.yaml")
TOKEN = "t0ken-for-tests"
SRC = os.environ.get("SPOTTRAIN_SRCDIR", os.path.join(HERE, "..", "..", ".."))


def protocol():
    """ST_PROTOCOL of common.h: the control protocol's version a Join must name."""
    import re
    with open(os.path.join(SRC, "common", "common.h")) as f:
        return int(re.search(r"#define ST_PROTOCOL (\d+)", f.read()).group(1))
TIMEOUT = float(os.environ.get("CONTROL_TEST_TIMEOUT", "30"))

procs = []


def fail(msg):
    print("FAIL: " + msg, flush=True)
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
    print("ok - " + msg, flush=True)


def wait_until(pred, what, timeout=TIMEOUT):
    """Polls pred() (bounded) until it returns a truthy value, which is returned."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = pred()
        except (OSError, ValueError, KeyError, sqlite3.Error):
            last = None
        if last:
            return last
        time.sleep(0.05)
    fail("timed out waiting for " + what)


class Proc:
    def __init__(self, args, name):
        self.name = name
        self.out_path = os.path.join(tmp, name + ".out")
        self.err_path = os.path.join(tmp, name + ".err")
        self.out = open(self.out_path, "w")
        self.err = open(self.err_path, "w")
        self.p = subprocess.Popen(args, stdout=self.out, stderr=self.err)
        procs.append(self)

    def text(self):
        with open(self.out_path) as f:
            return f.read()

    def lines(self, needle):
        return [l for l in self.text().splitlines() if needle in l]

    def stop(self, sig=signal.SIGTERM, timeout=TIMEOUT):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            fail(self.name + " did not exit after signal %d" % sig)


def cleanup():
    for pr in procs:
        if pr.p.poll() is None:
            try:
                pr.p.send_signal(signal.SIGCONT)
                pr.p.kill()
            except OSError:
                pass
            pr.p.wait()


class Coord:
    def __init__(self, state, listen="127.0.0.1:0", rest="127.0.0.1:0", token=True,
                 deadline=None, name="coord"):
        args = [BIN, "coordinator", "--job", JOB, "--state-dir", state, "--listen", listen,
                "--status-listen", rest]
        if token:
            args += ["--token-file", token_file]
        if deadline:
            args += ["--heartbeat-deadline", deadline]
        self.proc = Proc(args, name)
        line = wait_until(lambda: self._line(), "the coordinator's listening line")
        f = dict(kv.split("=", 1) for kv in line.split()[2:])
        self.grpc, self.rest, self.job_id = f["grpc"], f["rest"], f["job"]
        self.epoch_at_start = int(f["epoch"])

    def _line(self):
        if self.proc.p.poll() is not None:
            fail("coordinator exited early: " + open(self.proc.err_path).read())
        for l in self.proc.text().splitlines():
            if l.startswith("coordinator listening "):
                return l
        return None

    def get(self, path, headers=None):
        req = urllib.request.Request("http://" + self.rest + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read().decode()
            return json.loads(body) if path != "/metrics" else body

    def post(self, path, token=None):
        h = {"Authorization": "Bearer " + token} if token else {}
        req = urllib.request.Request("http://" + self.rest + path, data=b"", headers=h,
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode())

    def workers(self):
        return {w["id"]: w for w in self.get("/v1/workers")["workers"]}

    def events(self, kind=None):
        ev = self.get("/v1/events?since=0&limit=1000")["events"]
        return [e for e in ev if kind is None or e["kind"] == kind]

    def metric(self, name):
        for l in self.get("/metrics").splitlines():
            if l.startswith(name + " "):
                return float(l.split()[1])
        fail("metric %s missing" % name)


def worker(c, name, token=True, extra=()):
    args = [BIN, "worker", "--coordinator", c.grpc, "--state-dir", os.path.join(tmp, name),
            "--data-addr", "127.0.0.1:%d" % (9000 + len(procs))] + list(extra)
    if token:
        args += ["--token-file", token_file]
    w = Proc(args, name)
    line = wait_until(lambda: w.lines("worker id="), name + " start line")
    w.id = line[0].split()[1].split("=", 1)[1]
    return w


def journal_snapshot(state):
    db = sqlite3.connect("file:%s/journal.db?mode=ro" % state, uri=True, timeout=5)
    try:
        snap = {}
        for t in ("job", "workers", "epochs", "commands", "events"):
            snap[t] = db.execute("SELECT * FROM %s ORDER BY 1" % t).fetchall()
        return snap
    finally:
        db.close()


def settled_snapshot(c, state):
    """journal_snapshot once every event REST shows is in the file (events wait for the
    coordinator's next commit or tick: docs/control-plane.md, Journal)."""
    def settled():
        snap = journal_snapshot(state)
        return snap if len(snap["events"]) == len(c.events()) else None
    return wait_until(settled, "the journal file holding every event")


def pb_field(tag, data):
    """A length-delimited protobuf field (wire type 2)."""
    if isinstance(data, str):
        data = data.encode()
    n, v = len(data), b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            v += bytes([b | 0x80])
        else:
            v += bytes([b])
            break
    return bytes([(tag << 3) | 2]) + v + data


def rawcall(c, method, payload=None, token=None, size=None, empty=False):
    args = [RAWCALL, c.grpc, "/spottrain.v1.Coordinator/" + method]
    if token:
        args += ["--token", token]
    path = None
    if payload is not None:
        path = os.path.join(tmp, "payload.bin")
        with open(path, "wb") as f:
            f.write(payload)
        args += ["--file", path]
    elif size is not None:
        args += ["--size", str(size)]
    elif empty:
        args += ["--empty"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT)
    if out.returncode != 0:
        fail("rawcall failed: " + out.stderr)
    f = out.stdout.split()
    return int(f[0].split("=")[1]), out.stdout.strip()


def configured(c, n):
    def pred():
        ws = c.workers()
        act = [w for w in ws.values() if w["state"] == "active"]
        return ws if len(act) == n and all(w["watching"] for w in act) else None
    return wait_until(pred, "%d active watching workers" % n)


# ---- scenarios ----------------------------------------------------------------------------

def scenario_join():
    c = Coord(os.path.join(tmp, "state"))
    check(c.epoch_at_start == 0, "a new job starts at epoch 0")
    w1, w2 = worker(c, "w1"), worker(c, "w2")
    ws = configured(c, 2)
    roles = sorted((w["stage"], w["replica"], w["layer_begin"], w["layer_end"])
                   for w in ws.values())
    check(roles == [(0, 0, 0, 2), (1, 0, 2, 4)], "two workers get stages 0 and 1 of pp=2")
    job = c.get("/v1/job")
    check(job["epoch"] == 1 and job["shape"] == {"dp": 1, "pp": 2} and job["state"] == "running",
          "job runs epoch 1 with shape dp=1 pp=2")
    for w in (w1, w2):
        wait_until(lambda: w.lines("kind=configure"), w.name + " prints its Configure")
        check(len(w.lines("kind=configure epoch")) == 0 and
              "epoch=1 kind=configure dp=1 pp=2" in w.lines("kind=configure")[0],
              w.name + " applied Configure of epoch 1")
    wait_until(lambda: all(w["acked_command"] >= 1 for w in c.workers().values()),
               "both Configures acknowledged")
    r0 = c.metric("spottrain_reports_total")
    wait_until(lambda: c.metric("spottrain_reports_total") >= r0 + 4, "heartbeats arriving")
    check(all(w["last_seen_seconds_ago"] < 3.0 for w in c.workers().values()),
          "heartbeats keep last_seen under the deadline")
    w3 = worker(c, "w3")
    wait_until(lambda: c.workers().get(w3.id, {}).get("state") == "spare",
               "a third worker becomes a spare (dp stays 1)")
    w4 = worker(c, "w4")
    wait_until(lambda: c.get("/v1/job")["epoch"] == 2, "a fourth worker opens epoch 2")
    ws = configured(c, 4)
    check(c.get("/v1/job")["shape"] == {"dp": 2, "pp": 2}, "epoch 2 has shape dp=2 pp=2")
    plan = c.get("/v1/plan")
    check(plan["epoch"] == 2 and len(plan["assignments"]) == 4, "/v1/plan lists 4 assignments")
    for w in (w1, w2, w3, w4):
        wait_until(lambda: w.lines("epoch=2 kind=configure"), w.name + " got epoch 2")
    st = subprocess.run([BIN, "status", "--endpoint", "http://" + c.rest], capture_output=True,
                        text=True, timeout=TIMEOUT)
    check(st.returncode == 0 and "shape dp=2 pp=2" in st.stdout and w4.id in st.stdout,
          "spottrain status shows the shape and the workers")
    st = subprocess.run([BIN, "status", "--endpoint", "http://" + c.rest, "--json"],
                        capture_output=True, text=True, timeout=TIMEOUT)
    check(st.returncode == 0 and json.loads(st.stdout)["job"]["epoch"] == 2,
          "spottrain status --json is JSON")
    code, body = c.post("/v1/job:stop", TOKEN)
    check(code == 200 and body["state"] in ("stopping", "stopped"), "POST /v1/job:stop stops")
    for w in (w1, w2, w3, w4):
        check(w.p.wait(TIMEOUT) == 0, w.name + " exits 0 after Stop")
    wait_until(lambda: c.get("/v1/job")["state"] == "stopped", "job stopped")
    check(c.proc.stop() == 0 and "coordinator stopped" in c.proc.text(),
          "SIGTERM: clean coordinator shutdown")


def scenario_lost():
    c = Coord(os.path.join(tmp, "state"), deadline="2s")
    w1, w2 = worker(c, "w1"), worker(c, "w2")
    configured(c, 2)
    w1.p.send_signal(signal.SIGSTOP)
    ev = wait_until(lambda: [e for e in c.events("worker_lost") if e["worker_id"] == w1.id],
                    "worker_lost event for the silent worker")
    check("silent" in ev[0]["message"], "worker_lost event says why")
    check(c.workers()[w1.id]["state"] == "lost", "silent worker is marked lost")
    check(c.workers()[w2.id]["state"] in ("active", "spare"), "the other worker is not lost")
    check(c.metric('spottrain_workers{state="lost"}') == 1, "/metrics counts one lost worker")
    w1.p.send_signal(signal.SIGCONT)
    wait_until(lambda: [e for e in c.events("worker_returned") if e["worker_id"] == w1.id],
               "the worker comes back after SIGCONT")
    configured(c, 2)
    check(c.get("/v1/job")["epoch"] >= 2, "its return re-configures the job")
    check(c.proc.stop() == 0, "clean shutdown")


def scenario_restart():
    state = os.path.join(tmp, "state")
    gport, rport = free_port(), free_port()
    listen, rest = "127.0.0.1:%d" % gport, "127.0.0.1:%d" % rport
    # A 10 s deadline, not job.yaml's 3 s: a worker retries a lost coordinator with a backoff
    # of up to 2 s x 1.5 (jitter), and the restarted coordinator must hear it back before
    # the deadline, or it declares the worker lost and starts a new epoch.
    c = Coord(state, listen, rest, deadline="10s")
    w1, w2 = worker(c, "w1"), worker(c, "w2")
    configured(c, 2)
    wait_until(lambda: all(w["acked_command"] >= 1 for w in c.workers().values()),
               "Configures acknowledged")
    # Acks and events reach the disk with the coordinator's next commit or tick
    # (docs/control-plane.md, Journal): what the kill must not lose is what the journal holds.
    def durable():
        snap = journal_snapshot(state)
        ev = c.events()
        acked = all(row[12] >= 1 for row in snap["workers"]) and len(snap["workers"]) == 2
        return (ev, snap) if acked and len(snap["events"]) == len(ev) else None
    before_ev, before = wait_until(durable, "the acks and events in the journal file")
    roles = {i: (w["stage"], w["replica"]) for i, w in c.workers().items()}
    c.proc.stop(signal.SIGKILL)
    check(True, "coordinator killed with SIGKILL")
    c2 = Coord(state, listen, rest, deadline="10s", name="coord2")
    check(c2.job_id == c.job_id, "restart resumes the same job id")
    check(c2.epoch_at_start == 1, "epoch 1 preserved across kill -9")
    ws = configured(c2, 2)
    check({i: (w["stage"], w["replica"]) for i, w in ws.items()} == roles,
          "workers reattach with the same ids and roles")
    check(c2.get("/v1/job")["epoch"] == 1, "no new epoch after reattaching")
    after_ev = c2.events()
    check(after_ev[:len(before_ev)] == before_ev, "no committed event lost")
    seqs = [e["seq"] for e in after_ev]
    check(seqs == sorted(set(seqs)), "event sequence numbers stay unique and increasing")
    check(any(e["kind"] == "job_resumed" for e in after_ev[len(before_ev):]),
          "a job_resumed event is recorded")
    after = journal_snapshot(state)
    check(after["epochs"] == before["epochs"], "epochs table unchanged")
    check(after["commands"] == before["commands"], "no command repeated or lost")
    for w in (w1, w2):
        check(len(w.lines("kind=configure")) == 1, w.name + " applied its Configure once")
    # A worker process restart gets its current role back (the last Configure again).
    w1.stop(signal.SIGKILL)
    w1b = worker(c2, "w1", extra=())
    check(w1b.id == w1.id, "a restarted worker keeps its UUID from its state dir")
    wait_until(lambda: w1b.lines("kind=configure"), "restarted worker gets its role")
    st, rp = roles[w1.id]
    check(("stage=%d replica=%d" % (st, rp)) in w1b.lines("kind=configure")[0] and
          "epoch=1" in w1b.lines("kind=configure")[0], "... the same role in epoch 1")
    check(c2.get("/v1/job")["epoch"] == 1, "still epoch 1")
    check(c2.proc.stop() == 0, "clean shutdown after restart")
    check(journal_snapshot(state)["epochs"] == before["epochs"], "journal consistent at exit")


def pb_uint(tag, v):
    """A varint protobuf field (wire type 0) of a small value."""
    assert 0 <= v < 128
    return bytes([tag << 3, v])


def join_payload(wid):
    return pb_field(1, wid) + pb_field(6, "127.0.0.1:7000") + pb_uint(7, protocol())


def scenario_auth():
    state = os.path.join(tmp, "state")
    c = Coord(state)
    wid = "0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab"
    before = settled_snapshot(c, state)
    for method, payload in (("Join", join_payload(wid)), ("Watch", pb_field(1, wid)),
                            ("Report", pb_field(1, wid))):
        code, out = rawcall(c, method, join_payload(wid) if method == "Join" else payload)
        check(code == 16, "%s without a token: UNAUTHENTICATED (%s)" % (method, out))
        code, out = rawcall(c, method, payload, token="wrong-token")
        check(code == 16, "%s with a wrong token: UNAUTHENTICATED (%s)" % (method, out))
    code, body = c.post("/v1/job:stop")
    check(code == 401 and body["code"] == "unauthenticated", "REST stop without token: 401")
    code, body = c.post("/v1/job:stop", "wrong-token")
    check(code == 401, "REST stop with a wrong token: 401")
    bad = os.path.join(tmp, "bad-token")
    with open(bad, "w") as f:
        f.write("not-the-token\n")
    w = Proc([BIN, "worker", "--coordinator", c.grpc, "--token-file", bad, "--state-dir",
              os.path.join(tmp, "wbad")], "wbad")
    rc = w.p.wait(TIMEOUT)
    check(rc == 1 and "rejected the token" in open(w.err_path).read(),
          "a worker with a wrong token exits 1 and says why")
    check(c.workers() == {} and c.get("/v1/job")["state"] == "pending",
          "no worker, job untouched")
    check(journal_snapshot(state) == before, "journal unchanged by rejected calls")
    check(c.metric('spottrain_rpc_rejected_total{reason="unauthenticated"}') >= 7,
          "rejections counted in /metrics")
    code, out = rawcall(c, "Join", join_payload(wid), token=TOKEN)
    check(code == 0 and wid in c.workers(), "the same Join with the token is accepted")
    check(journal_snapshot(state) != before, "... and that one is journaled")
    check(c.proc.stop() == 0, "clean shutdown")


def scenario_garbage():
    state = os.path.join(tmp, "state")
    c = Coord(state)
    before = settled_snapshot(c, state)
    code, out = rawcall(c, "Join", size=100, token=TOKEN)
    check(code == 3, "garbage Join: INVALID_ARGUMENT (%s)" % out)
    code, out = rawcall(c, "Report", size=64, token=TOKEN)
    check(code == 3, "garbage Report: INVALID_ARGUMENT (%s)" % out)
    code, out = rawcall(c, "Watch", size=10, token=TOKEN)
    check(code == 3, "garbage Watch: INVALID_ARGUMENT (%s)" % out)
    code, out = rawcall(c, "Join", size=5 << 20, token=TOKEN)
    check(code == 8, "oversized Join (5 MiB): RESOURCE_EXHAUSTED (%s)" % out)
    code, out = rawcall(c, "Join", pb_field(1, "not-a-uuid") + pb_uint(7, protocol()),
                        token=TOKEN)
    check(code == 3 and "worker_id" in out, "Join with a bad worker id: INVALID_ARGUMENT")
    # A worker of a release before the protocol's version (no field 7), and one of a later
    # release: refused, each told both versions.
    wid = "0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab"
    for v in (None, protocol() + 1):
        payload = pb_field(1, wid) + pb_field(6, "127.0.0.1:7000")
        if v is not None:
            payload += pb_uint(7, v)
        code, out = rawcall(c, "Join", payload, token=TOKEN)
        want = "control protocol %d, this coordinator %d" % (v or 0, protocol())
        check(code == 3 and want in out, "Join speaking protocol %s: INVALID_ARGUMENT, '%s' (%s)"
              % (v or 0, want, out))
    code, out = rawcall(c, "Join", join_payload("0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab") +
                        pb_field(6, "no-port"), token=TOKEN)
    check(code == 3 and "data_addr" in out, "Join with a bad data_addr: INVALID_ARGUMENT")
    code, out = rawcall(c, "Report", empty=True, token=TOKEN)
    check(code == 3, "empty Report: INVALID_ARGUMENT (%s)" % out)
    code, out = rawcall(c, "Report", pb_field(1, "0b8c3f4e-1a2b-4c3d-8e9f-0123456789ab"),
                        token=TOKEN)
    check(code == 5, "Report of an unknown worker: NOT_FOUND (%s)" % out)
    code, out = rawcall(c, "Nope", size=1, token=TOKEN)
    check(code == 12, "unknown method: UNIMPLEMENTED (%s)" % out)
    check(journal_snapshot(state) == before, "journal unchanged by rejected messages")
    check(c.metric('spottrain_rpc_rejected_total{reason="invalid_argument"}') >= 6,
          "invalid messages counted")
    w1, w2 = worker(c, "w1"), worker(c, "w2")
    configured(c, 2)
    check(True, "the coordinator keeps serving real workers afterwards")
    code, _ = rawcall(c, "Join", size=5 << 20, token=TOKEN)
    check(code == 8 and len(configured(c, 2)) == 2, "oversized message beside live workers")
    check(c.proc.stop() == 0, "clean shutdown")


def scenario_python_grpc():
    """A client nobody here wrote: grpcio stubs generated from proto/control.proto."""
    import threading
    import grpc
    from grpc_tools import protoc
    src = os.path.join(os.environ.get("SPOTTRAIN_SRCDIR", os.path.join(HERE, "..", "..", "..")),
                       "proto")
    gen = os.path.join(tmp, "gen")
    os.makedirs(gen)
    rc = protoc.main(["grpc_tools.protoc", "-I" + src, "--python_out=" + gen,
                      "--grpc_python_out=" + gen, os.path.join(src, "control.proto")])
    check(rc == 0, "grpc_tools.protoc generates stubs from proto/control.proto")
    sys.path.insert(0, gen)
    import control_pb2 as pb
    import control_pb2_grpc as pbg
    c = Coord(os.path.join(tmp, "state"))
    md = [("authorization", "Bearer " + TOKEN)]
    ch = grpc.insecure_channel(c.grpc)
    stub = pbg.CoordinatorStub(ch)
    ids = ["6f1c2d3e-4b5a-4c6d-9e8f-00000000000%d" % i for i in (1, 2)]
    for i, wid in enumerate(ids):
        r = stub.Join(pb.JoinRequest(worker_id=wid, zone="z%d" % i, gpus=1,
                                     data_addr="127.0.0.1:%d" % (7100 + i),
                                     protocol=protocol()),
                      metadata=md, timeout=10)
        check(r.job_id == c.job_id and r.heartbeat_deadline > 0 and not r.rejoined,
              "Join %d answered with the job id and the heartbeat deadline" % i)
    try:
        stub.Join(pb.JoinRequest(worker_id=ids[0]), timeout=10)
        fail("Join without a token was accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAUTHENTICATED, "Join without a token: UNAUTHENTICATED")
    stop = threading.Event()

    def beat():  # keep both alive while the test reads the stream
        while not stop.wait(0.2):
            for wid in ids:
                try:
                    stub.Report(pb.ReportRequest(worker_id=wid), metadata=md, timeout=5)
                except grpc.RpcError:
                    pass
    t = threading.Thread(target=beat)
    t.start()
    try:
        stream = stub.Watch(pb.WatchRequest(worker_id=ids[0]), metadata=md, timeout=60)
        cmd = next(stream)
        check(cmd.WhichOneof("body") == "configure" and cmd.epoch == 1 and cmd.id == 1,
              "Watch streams a Configure of epoch 1")
        cf = cmd.configure
        check(cf.shape.pp == 2 and cf.shape.dp == 1 and len(cf.peers) == 2 and
              sorted(p.data_addr for p in cf.peers) == ["127.0.0.1:7100", "127.0.0.1:7101"],
              "Configure carries the shape and every peer's data-plane address")
        r = stub.Report(pb.ReportRequest(worker_id=ids[0], epoch=1, step=3, loss=2.5, samples=24,
                                         step_seconds=0.1, state="configured",
                                         acks=[pb.CommandAck(id=cmd.id, ok=True)],
                                         notices=[pb.Notice(kind="rebalance", at=1.0e9)]),
                        metadata=md, timeout=10)
        check(r.epoch == 1 and not r.stop, "Report with an ack answered with the epoch")
        stream.cancel()
    finally:
        stop.set()
        t.join()
    w = c.workers()[ids[0]]
    check(w["acked_command"] == 1 and w["step"] == 3, "the ack and the step are recorded")
    job = c.get("/v1/job")
    check(job["step"] == 3 and job["samples"] == 24 and abs(job["loss"] - 2.5) < 1e-9,
          "job progress comes from Reports")
    check(any(e["kind"] == "notice" and e["worker_id"] == ids[0] for e in c.events()),
          "a relayed notice becomes an event")
    ch.close()
    check(c.proc.stop() == 0, "clean shutdown")


def scenario_schemathesis():
    """schemathesis against docs/openapi.yaml on a running coordinator."""
    src = os.environ.get("SPOTTRAIN_SRCDIR", os.path.join(HERE, "..", "..", ".."))
    c = Coord(os.path.join(tmp, "state"))
    w1, w2 = worker(c, "w1"), worker(c, "w2")
    configured(c, 2)
    st = os.path.join(os.path.dirname(sys.executable), "st")
    args = [st, "run", os.path.join(src, "docs", "openapi.yaml"), "--url", "http://" + c.rest,
            "--checks", "not_a_server_error,response_schema_conformance",
            "--max-examples", os.environ.get("SCHEMATHESIS_EXAMPLES", "30"),
            "--no-color"]
    env = dict(os.environ, SCHEMATHESIS_HOOKS="", HYPOTHESIS_STORAGE_DIRECTORY=tmp)
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=tmp)
    print(out.stdout[-4000:])
    print(out.stderr[-2000:])
    check(out.returncode == 0, "schemathesis: zero failures without the token")
    out = subprocess.run(args + ["-H", "Authorization: Bearer " + TOKEN], capture_output=True,
                         text=True, timeout=600, env=env, cwd=tmp)
    print(out.stdout[-4000:])
    check(out.returncode == 0, "schemathesis: zero failures with the token (job:stop allowed)")
    check(c.proc.p.poll() is None and c.get("/healthz")["status"] == "ok",
          "the coordinator still serves")
    check(c.proc.stop() == 0, "clean shutdown")


def run(args, timeout=TIMEOUT):
    return subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout)


def scenario_cli():
    """Bad input to the three commands: a clear error, exit 2 (1 for runtime failures)."""
    r = run(["coordinator"])
    check(r.returncode == 2 and "--job" in r.stderr, "coordinator without --job: exit 2")
    r = run(["coordinator", "--job", os.path.join(tmp, "missing.yaml")])
    check(r.returncode == 2 and "missing.yaml" in r.stderr, "missing spec file: exit 2, named")
    r = run(["coordinator", "--job", JOB, "--bogus"])
    check(r.returncode == 2 and "--bogus" in r.stderr, "unknown flag: exit 2")
    r = run(["coordinator", "--job", JOB, "--heartbeat-deadline", "soon"])
    check(r.returncode == 2 and "soon" in r.stderr, "bad --heartbeat-deadline: exit 2")
    empty = os.path.join(tmp, "empty-token")
    open(empty, "w").close()
    r = run(["coordinator", "--job", JOB, "--token-file", empty, "--state-dir",
             os.path.join(tmp, "s1")])
    check(r.returncode == 2 and "empty" in r.stderr, "empty token file: exit 2")
    r = run(["coordinator", "--job", JOB, "--listen", "nonsense", "--state-dir",
             os.path.join(tmp, "s2"), "--token-file", token_file])
    check(r.returncode == 2, "bad --listen: exit 2")
    notdir = os.path.join(tmp, "a-file")
    open(notdir, "w").close()
    r = run(["coordinator", "--job", JOB, "--state-dir", notdir, "--token-file", token_file])
    check(r.returncode == 2 and "a-file" in r.stderr, "state dir that is a file: exit 2")
    junk = os.path.join(tmp, "junk")
    os.makedirs(junk)
    with open(os.path.join(junk, "journal.db"), "wb") as f:
        f.write(b"not a database at all" * 10)
    r = run(["coordinator", "--job", JOB, "--state-dir", junk, "--token-file", token_file])
    check(r.returncode != 0 and "corrupt" in r.stderr, "corrupt journal: refused, says corrupt")
    # A state dir of another job.
    other = os.path.join(tmp, "other.yaml")
    with open(JOB) as f:
        text = f.read().replace("name: control-test", "name: another-job")
    with open(other, "w") as f:
        f.write(text)
    for name in ("trace.csv",):
        with open(os.path.join(HERE, name)) as src, open(os.path.join(tmp, name), "w") as dst:
            dst.write(src.read())
    c = Coord(os.path.join(tmp, "state"))
    busy = run(["coordinator", "--job", JOB, "--listen", c.grpc, "--status-listen", "",
                "--state-dir", os.path.join(tmp, "s3"), "--token-file", token_file])
    check(busy.returncode == 1 and "listen" in busy.stderr, "gRPC port in use: exit 1")
    check(c.proc.stop() == 0, "first coordinator stops")
    r = run(["coordinator", "--job", other, "--state-dir", os.path.join(tmp, "state"),
             "--token-file", token_file])
    check(r.returncode == 2 and "control-test" in r.stderr,
          "state dir holding another job: exit 2, names it")
    r = run(["worker"])
    check(r.returncode == 2 and "--coordinator" in r.stderr, "worker without --coordinator")
    r = run(["worker", "--coordinator", "x:1", "--id", "nope"])
    check(r.returncode == 2 and "nope" in r.stderr, "worker --id not a UUID: exit 2")
    r = run(["worker", "--coordinator", "x:1", "--gpus", "-3"])
    check(r.returncode == 2, "worker --gpus -3: exit 2")
    r = run(["worker", "--coordinator", "x:1", "--token-file", os.path.join(tmp, "nofile")])
    check(r.returncode == 2 and "nofile" in r.stderr, "worker missing token file: exit 2")
    wd = os.path.join(tmp, "wid")
    os.makedirs(wd)
    with open(os.path.join(wd, "worker-id"), "w") as f:
        f.write("garbage\n")
    r = run(["worker", "--coordinator", "x:1", "--state-dir", wd])
    check(r.returncode == 2 and "worker id" in r.stderr, "corrupt worker-id file: exit 2")
    r = run(["status", "--endpoint", "ftp://x"])
    check(r.returncode == 2 and "ftp://x" in r.stderr, "status bad endpoint: exit 2")
    r = run(["status", "--endpoint", "http://127.0.0.1:%d" % free_port()])
    check(r.returncode == 1 and "cannot read" in r.stderr, "status, nobody listening: exit 1")
    # A coordinator that takes the connection and never answers (the kernel's backlog
    # accepts it): the wait ends at --timeout with a line that names it.
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)
    r = run(["status", "--endpoint", "http://127.0.0.1:%d" % mute.getsockname()[1],
             "--timeout", "0.5"])
    mute.close()
    check(r.returncode == 1 and "no answer within 0.5 s (--timeout)" in r.stderr,
          "status, a peer that never answers: exit 1 at --timeout: %r" % r.stderr)
    for bad in ("0", "abc", "-1", "4000"):
        r = run(["status", "--timeout", bad])
        check(r.returncode == 2 and "--timeout" in r.stderr, "status --timeout %s: exit 2" % bad)
    for cmd in ("coordinator", "worker", "status"):
        r = run([cmd, "--help"])
        check(r.returncode == 0 and r.stdout.startswith("Usage: spottrain " + cmd),
              cmd + " --help")


def scenario_rest_errors():
    c = Coord(os.path.join(tmp, "state"))
    def status_of(method, path, body=None, headers=None):
        req = urllib.request.Request("http://" + c.rest + path, data=body, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode(), r.headers
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), e.headers
    code, body, _ = status_of("GET", "/nope")
    check(code == 404 and json.loads(body)["code"] == "not_found", "unknown path: 404 JSON")
    code, body, h = status_of("DELETE", "/v1/job")
    check(code == 405 and "GET" in h["Allow"], "DELETE /v1/job: 405 with Allow")
    code, body, h = status_of("GET", "/v1/job:stop")
    check(code == 405 and h["Allow"] == "POST", "GET /v1/job:stop: 405")
    code, body, _ = status_of("GET", "/v1/events?since=abc")
    check(code == 400 and json.loads(body)["code"] == "invalid_argument", "since=abc: 400")
    code, body, _ = status_of("GET", "/v1/events?limit=0")
    check(code == 400, "limit=0: 400")
    code, body, _ = status_of("POST", "/v1/job:stop", body=b"x" * 100000,
                              headers={"Authorization": "Bearer " + TOKEN})
    check(code == 413, "oversized body: 413")
    check(c.get("/v1/job")["state"] == "pending", "... and the job was not stopped")
    ev = c.get("/v1/events?since=0&limit=1")
    check(len(ev["events"]) == 1 and ev["next"] == ev["events"][0]["seq"], "events paging")
    ev2 = c.get("/v1/events?since=%d" % ev["next"])
    check(all(e["seq"] > ev["next"] for e in ev2["events"]), "since= skips seen events")
    m = c.get("/metrics")
    for name in ("spottrain_steps_total", "spottrain_samples_total", "spottrain_loss",
                 'spottrain_workers{state="active"}', 'spottrain_migrations_total{kind="pipeline"}',
                 "spottrain_stall_seconds_total", "spottrain_instances_predicted",
                 "spottrain_instances_actual", "spottrain_spend_dollars_total"):
        check(("\n" + name + " ") in m, "/metrics has " + name)
    check(c.proc.stop() == 0, "clean shutdown")


SCENARIOS = ("join", "lost", "restart", "auth", "garbage", "cli", "rest-errors", "python-grpc", "schemathesis")


def main():
    global tmp, token_file
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        print(__doc__)
        return 2
    if not BIN or not os.path.exists(BIN):
        print("SPOTTRAIN_BIN not set or missing")
        return 1
    tmp = tempfile.mkdtemp(prefix="control-%s-" % sys.argv[1])
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    try:
        globals()["scenario_" + sys.argv[1].replace("-", "_")]()
    except SystemExit as e:
        cleanup()
        for pr in procs:
            sys.stdout.write("---- %s stderr (tail)\n" % pr.name)
            sys.stdout.write("".join(open(pr.err_path).readlines()[-15:]))
        return e.code
    finally:
        cleanup()
    subprocess.run(["rm", "-rf", tmp])
    return 0


if __name__ == "__main__":
    sys.exit(main())
