#!/usr/bin/env python3
"""test_page.py: the coordinator's status page and the data behind it, on a running
`spottrain run examples/quickstart.yaml` (issue 17, and the loss of issue 18).

  api      GET / and its icon without a token: 200, text/html, nothing that points at another
           origin; /v1/history answers 401 without the token and, with it, every series
           (instances, shapes, loss, migrations, cost) in the documented shape, non-empty once
           the run made a migration; every `spottrain status --json` sample of job.loss taken
           after step 50 is finite and > 0; `status --watch` redraws in place.
  browser  headless Chromium (DevTools over --remote-debugging-pipe, stdlib only) loads the
           page: the 401 message shows without a token; with the token the charts show the
           migrations, no request leaves the coordinator's origin, the console has no error;
           a screenshot is left in the build directory.

Every wait polls an observable with a generous bounded deadline; nothing sleeps to synchronise.
Usage: test_page.py api|browser  (env SPOTTRAIN_BIN, SPOTTRAIN_SRCDIR, SPOTTRAIN_BUILDDIR).
Exit 0 pass, 1 fail, 77 skip (no chromium for `browser`).
"""
import base64
import html.parser
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

BIN = os.environ.get("SPOTTRAIN_BIN", "build/spottrain")
SRC = os.environ.get("SPOTTRAIN_SRCDIR",
                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
BUILD = os.environ.get("SPOTTRAIN_BUILDDIR", tempfile.gettempdir())
DEADLINE = 240  # seconds for the run to reach what a check waits on, on a loaded 2-core box


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)
    print("ok - " + msg, flush=True)


def wait_until(pred, what, timeout=DEADLINE, run=None):
    """Polls pred() until it returns a truthy value (returned); fails after timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if run is not None and run.poll() is not None:
            raise Fail("spottrain run exited (%s) before: %s" % (run.returncode, what))
        v = pred()
        if v:
            return v
        time.sleep(0.2)  # polling period, not synchronisation
    raise Fail("timed out waiting for: " + what)


class Run:
    """`spottrain run examples/quickstart.yaml` in a temporary state directory."""

    def __init__(self, d):
        self.state = os.path.join(d, "state")
        # The quickstart as a user runs it; the checkpoint dir moved into the test's directory
        # so parallel runs do not share /tmp/spottrain-quickstart.
        with open(os.path.join(SRC, "examples", "quickstart.yaml")) as f:
            spec = f.read()
        spec = spec.replace("/tmp/spottrain-quickstart/ckpt", os.path.join(d, "ckpt"))
        spec = spec.replace("data/quickstart-markov1.bin", os.path.join(d, "qs.bin"))
        spec = spec.replace("traces/quickstart-trace.csv",
                            os.path.join(SRC, "examples", "traces", "quickstart-trace.csv"))
        self.job = os.path.join(d, "quickstart.yaml")
        with open(self.job, "w") as f:
            f.write(spec)
        self.err = open(os.path.join(d, "run.err"), "w+")
        self.p = subprocess.Popen([BIN, "run", self.job, "--state-dir", self.state],
                                  stdout=subprocess.DEVNULL, stderr=self.err)
        self.rest = wait_until(self._rest, "the REST address on run's stderr", run=self.p)
        self.token = wait_until(self._token, "the token file", run=self.p)

    def _rest(self):
        self.err.seek(0)
        m = re.search(r"coordinator grpc=\S+ rest=(\S+)", self.err.read())
        return m.group(1) if m else None

    def _token(self):
        try:
            with open(os.path.join(self.state, "token")) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def get(self, path, token=None):
        """(status, headers, body bytes) of GET path."""
        req = urllib.request.Request(self.rest + path)
        if token:
            req.add_header("Authorization", "Bearer " + token)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def json(self, path):
        st, _, body = self.get(path, self.token)
        if st != 200:
            raise Fail("GET %s: %d %s" % (path, st, body[:200]))
        return json.loads(body)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.err.seek(0)
        tail = self.err.read()[-3000:]
        self.err.close()
        return tail


class Refs(html.parser.HTMLParser):
    """Every URL the page would load: src/href/action attributes, CSS url(), JS fetch/import."""

    def __init__(self):
        super().__init__()
        self.urls = []
        self.text = []

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("src", "href", "action", "data", "poster", "srcset") and v is not None:
                self.urls.append(v)

    def handle_data(self, data):
        self.text.append(data)


def strip_comments(s):
    s = re.sub(r"<!--.*?-->", "", s, flags=re.S)
    s = re.sub(r"/\*.*?\*/", "", s, flags=re.S)
    return s


def foreign(url):
    """True when url names another origin (scheme or authority), or an origin-less scheme."""
    u = urllib.parse.urlsplit(url.strip())
    return bool(u.scheme or u.netloc or url.strip().startswith("//"))


def check_page_static(run):
    st, hdr, body = run.get("/")
    check(st == 200, "GET / without a token: 200")
    check(hdr.get("Content-Type", "").split(";")[0] == "text/html",
          "GET / is text/html (got %r)" % hdr.get("Content-Type"))
    check("connect-src 'self'" in hdr.get("Content-Security-Policy", ""),
          "GET / carries a same-origin Content-Security-Policy")
    page = body.decode()
    code = strip_comments(page)
    refs = Refs()
    refs.feed(code)
    check(refs.urls == ["/favicon.svg"], "the page's only src/href is its own icon: %s" % refs.urls)
    css_urls = re.findall(r"url\(\s*['\"]?([^'\")]+)", code)
    # The page fetches through one helper, api(PATH); fetch() itself only takes its argument.
    js_urls = re.findall(r"\b(?:fetch|import|api)\s*\(\s*['\"`]([^'\"`]+)", code)
    fetches = re.findall(r"\b(?:fetch|import)\s*\(\s*([^,)]*)", code)
    check(css_urls == [], "no CSS url()")
    check(fetches == ["path"], "fetch() only in the api() helper: %s" % fetches)
    check(sorted(set(u.split("?")[0] for u in js_urls)) ==
          ["v1/events", "v1/history", "v1/job"] and not any(foreign(u) for u in js_urls),
          "the page requests v1/job, v1/events, v1/history by relative path: %s" % js_urls)
    check(not re.search(r"https?://|wss?://", code),
          "no absolute URL outside comments in the page")
    check(not re.search(r"<script[^>]*\ssrc=|<link[^>]*stylesheet", code),
          "no external script or stylesheet")
    st, hdr, body = run.get("/favicon.svg")
    check(st == 200 and hdr.get("Content-Type") == "image/svg+xml" and body.startswith(b"<svg"),
          "GET /favicon.svg without a token: 200 image/svg+xml")
    st, _, _ = run.get("/healthz")
    check(st == 200, "/healthz open")


def check_history_shape(h):
    check(set(h) == {"now", "max_points", "instances", "shapes", "loss", "migrations", "cost"},
          "history has exactly its documented keys: %s" % sorted(h))
    check(h["max_points"] == 1024, "max_points 1024")
    want = {"instances": {"t", "alive", "noticed", "forecast"},
            "shapes": {"t", "epoch", "dp", "pp", "step"},
            "loss": {"t", "step", "loss", "samples_per_second"},
            "migrations": {"t", "epoch", "step", "dp", "pp", "kind", "bytes", "stall_seconds"},
            "cost": {"t", "spot_dollars", "on_demand_dollars"}}
    for k, keys in want.items():
        check(0 < len(h[k]) <= 1024, "%s has 1..1024 points (%d)" % (k, len(h[k])))
        check(all(set(p) == keys for p in h[k]), "%s points have keys %s" % (k, sorted(keys)))
        ts = [p["t"] for p in h[k]]
        check(ts == sorted(ts) and ts[-1] <= h["now"] + 1e-6, "%s is in time order" % k)
    # Which kinds happen depends on the machine (on a loaded one a migration may fail into a
    # restore); how they are named does not.
    names = ("intra_stage", "inter_stage", "pipeline", "checkpoint_restore", "peer_restore",
             "fresh_start")
    kinds = sorted({p["kind"] for p in h["migrations"]})
    check(all(k in names for k in kinds), "migration kinds are the /metrics names: %s" % kinds)
    check(all(p["stall_seconds"] >= 0 and p["dp"] >= 1 and p["pp"] >= 2
              for p in h["migrations"]), "migrations carry stall and the shape (pp >= 2)")
    bad = [p for p in h["loss"] if not (math.isfinite(p["loss"]) and p["loss"] > 0 and
                                        p["samples_per_second"] > 0)]
    check(not bad, "every loss point is finite, > 0, with samples/s > 0: %s" % bad[:5])
    check(all(1 <= p["dp"] <= 8 and 2 <= p["pp"] <= 4 for p in h["shapes"]),
          "shapes within the spec's dp 1..8, pp 2..4")
    spot = [p["spot_dollars"] for p in h["cost"]]
    check(spot == sorted(spot) and spot[-1] > 0, "spend grows and is > 0")
    check(all(abs(p["on_demand_dollars"] - p["spot_dollars"] * 3.06 / 0.918) < 1e-6 *
              max(1.0, p["on_demand_dollars"]) for p in h["cost"]),
          "on-demand dollars are the same hours at 3.06 instead of 0.918 $/h")


def status_json(run):
    tok = os.path.join(run.state, "token")
    p = subprocess.run([BIN, "status", "--json", "--endpoint", run.rest, "--token-file", tok],
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise Fail("status --json exited %d: %s" % (p.returncode, p.stderr))
    return json.loads(p.stdout)


def test_api(d):
    run = Run(d)
    try:
        check_page_static(run)
        st, hdr, body = run.get("/v1/history")
        check(st == 401 and json.loads(body)["code"] == "unauthenticated" and
              hdr.get("WWW-Authenticate") == "Bearer", "/v1/history without the token: 401")
        st, _, _ = run.get("/v1/history", "not-the-token")
        check(st == 401, "/v1/history with a wrong token: 401")

        # The loss of issue 18: every sample after step 50 is the last stage's, never 0.
        samples = []

        def loss_samples():
            j = status_json(run)["job"]
            if j["step"] > 50:
                samples.append(j["loss"])
            return len(samples) >= 12

        wait_until(loss_samples, "12 status samples after step 50", run=run.p)
        check(all(math.isfinite(v) and v > 0 for v in samples),
              "job.loss finite and > 0 in every sample after step 50: %s" % samples)
        job = run.json("/v1/job")
        check(job["loss_step"] > 0 and job["samples_per_second"] > 0,
              "/v1/job has loss_step and samples_per_second")
        metrics = run.get("/metrics")[2].decode()
        m = re.search(r"^spottrain_loss (\S+)$", metrics, re.M)
        check(m and float(m.group(1)) > 0, "/metrics spottrain_loss > 0")
        m = re.search(r"^spottrain_samples_per_second (\S+)$", metrics, re.M)
        check(m and float(m.group(1)) > 0, "/metrics spottrain_samples_per_second > 0")

        h = wait_until(lambda: (lambda h: h if h["migrations"] else None)(
            run.json("/v1/history")), "a migration in /v1/history", run=run.p)
        check_history_shape(h)

        # status --watch on a terminal: the picture redrawn in place (cursor home + clear).
        watch_check(run)
    finally:
        tail = run.stop()
        sys.stdout.write(tail[-1500:])


def watch_check(run):
    import pty
    tok = os.path.join(run.state, "token")
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(BIN, [BIN, "status", "--watch", "--interval", "0.5", "--endpoint", run.rest,
                       "--token-file", tok])
    out = b""
    end = time.monotonic() + 60
    try:
        while time.monotonic() < end and out.count(b"\x1b[H") < 3:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.kill(pid, signal.SIGINT)
        try:
            while True:
                if not os.read(fd, 65536):
                    break
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    # Frames between two cursor-homes are complete (each ends by clearing below itself).
    frames = text.split("\x1b[H")[1:-1]
    check(len(frames) >= 2 and all(f.endswith("\x1b[J") for f in frames),
          "status --watch redrew the screen in place twice")
    last = frames[-1]
    for word in ("instances", "shape", "loss", "samples/s", "migrations", "spent"):
        check(word in last, "status --watch shows '%s'" % word)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
          "status --watch exits 0 on SIGINT")


# ---- the browser ---------------------------------------------------------------------------

class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4)."""

    def __init__(self, exe, d):
        r_cmd, w_cmd = os.pipe()   # we write commands -> chromium reads fd 3
        r_ev, w_ev = os.pipe()     # chromium writes fd 4 -> we read
        self.profile = os.path.join(d, "profile")
        args = [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
                "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--disable-features=Translate,MediaRouter",
                "--user-data-dir=" + self.profile, "--window-size=1400,1150", "about:blank"]
        # The shell puts our pipe ends on fds 3 and 4, where --remote-debugging-pipe wants them.
        self.errlog = os.path.join(d, "chromium.err")
        self.p = subprocess.Popen(
            ["/bin/sh", "-c", 'exec "$@" 3<&%d 4>&%d%s' % (
                r_cmd, w_ev, "".join(" %d>&-" % f for f in (r_cmd, w_ev) if f > 4)),
             "sh"] + args,
            pass_fds=(r_cmd, w_ev), stdout=subprocess.DEVNULL,
            stderr=open(self.errlog, "w"))
        os.close(r_cmd)
        os.close(w_ev)
        self.w, self.r = w_cmd, r_ev
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def _read_msg(self, timeout):
        import select
        end = time.monotonic() + timeout
        while b"\0" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise Fail("chromium did not answer in %.0f s" % timeout)
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                with open(self.errlog) as f:
                    raise Fail("chromium closed its DevTools pipe: " + f.read()[-2000:])
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=True, timeout=60):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        try:
            os.write(self.w, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            with open(self.errlog) as f:
                raise Fail("chromium exited: " + f.read()[-2000:])
        while True:
            m = self._read_msg(timeout)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise Fail("%s: %s" % (method, m["error"]))
                return m.get("result", {})
            self.events.append(m)

    def pump(self):
        """Reads the events chromium sent meanwhile (non-blocking)."""
        import select
        while select.select([self.r], [], [], 0)[0] or b"\0" in self.buf:
            self.events.append(self._read_msg(5))

    def eval(self, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        if "exceptionDetails" in r:
            raise Fail("page script failed: %s" % r["exceptionDetails"])
        return r["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=10)
        except Fail:
            pass
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        os.close(self.w)
        os.close(self.r)


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def test_browser(d):
    exe = find_chromium()
    if not exe:
        print("SKIP: no chromium (scripts/install-deps installs Debian's chromium)")
        return 77
    run = Run(d)
    b = None
    try:
        b = Browser(exe, d)
        target = b.call("Target.createTarget", {"url": "about:blank"}, session=False)
        b.session = b.call("Target.attachToTarget", {"targetId": target["targetId"],
                                                      "flatten": True},
                           session=False)["sessionId"]
        for dom in ("Page", "Runtime", "Network", "Log"):
            b.call(dom + ".enable")
        origin = run.rest.rstrip("/")
        b.call("Page.navigate", {"url": origin + "/"})

        # Without a token: the page says so, once, and asks.
        wait_until(lambda: b.eval("(() => { const a = document.getElementById('auth');"
                                  " return !!a && getComputedStyle(a).display !== 'none'; })()"),
                   "the token request on the page")
        msg = b.eval("document.getElementById('auth').innerText")
        check("bearer token" in msg, "the page shows the 401 message: %r" % msg[:80])
        check(b.eval("location.href").rstrip("/") == origin, "no token in the URL")

        # The token goes into the form; the page keeps it in sessionStorage only.
        b.eval("document.getElementById('auth-token').value = %s;"
               "document.getElementById('auth-form').requestSubmit(); true"
               % json.dumps(run.token))
        check(b.eval("sessionStorage.getItem('spottrain-token')") == run.token,
              "the token is kept in sessionStorage")
        # A fresh load of the tab: from here on no 401, no console error, no foreign request.
        b.pump()
        b.events.clear()
        b.call("Page.reload")
        shown = wait_until(lambda: b.eval(
            "(() => { const c = document.getElementById('c-shape');"
            " return !!c && +(c.dataset.migrations || 0) > 0 &&"
            " document.querySelectorAll('#c-shape g.migration').length; })()"),
            "the shape chart to show a migration", run=run.p)
        check(shown >= 1, "the shape chart marks %d migration(s)" % shown)
        check(b.eval("getComputedStyle(document.getElementById('auth')).display") == "none",
              "no token request once the token is known")
        for cid in ("c-instances", "c-loss", "c-cost"):
            wait_until(lambda: b.eval("!!document.querySelector('#%s svg path')" % cid),
                       "a line in #" + cid, run=run.p)
        check(True, "instances, loss and cost charts drawn")
        kinds = b.eval("[...document.querySelectorAll('#c-shape g.migration')]"
                       ".map(g => g.dataset.kind + ': ' + g.querySelector('title').textContent)")
        check(all(re.search(r"\d+ ms stall", k) for k in kinds),
              "each migration mark names its kind and stall: %s" % kinds[:3])
        png = base64.b64decode(b.call("Page.captureScreenshot", {"format": "png"})["data"])
        shot = os.path.join(BUILD, "page-screenshot.png")
        with open(shot, "wb") as f:
            f.write(png)
        check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000, "screenshot in " + shot)

        b.pump()
        urls = [e["params"]["request"]["url"] for e in b.events
                if e.get("method") == "Network.requestWillBeSent"]
        check(urls and all(u.startswith(origin + "/") or u == origin for u in urls),
              "every request (%d) goes to %s: %s" % (len(urls), origin,
                                                     sorted({u.split("?")[0] for u in urls})))
        statuses = [(e["params"]["response"]["url"], e["params"]["response"]["status"])
                    for e in b.events if e.get("method") == "Network.responseReceived"]
        check(statuses and all(s == 200 for _, s in statuses),
              "every response 200 (no 401 once the token is known)")
        errors = [e["params"] for e in b.events
                  if (e.get("method") == "Runtime.consoleAPICalled" and
                      e["params"]["type"] in ("error", "assert")) or
                  e.get("method") == "Runtime.exceptionThrown" or
                  (e.get("method") == "Log.entryAdded" and
                   e["params"]["entry"]["level"] == "error")]
        check(errors == [], "no console errors: %s" % errors[:3])
    finally:
        if b:
            b.close()
        tail = run.stop()
        sys.stdout.write(tail[-1500:])
    return 0


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("api", "browser"):
        print(__doc__)
        return 2
    d = tempfile.mkdtemp(prefix="spottrain-page-")
    try:
        rc = (test_api if sys.argv[1] == "api" else test_browser)(d)
        return rc or 0
    except Fail as e:
        print("FAIL: %s" % e, flush=True)
        return 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
