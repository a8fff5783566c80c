#!/usr/bin/env python3
"""`spottrain launch` on the gcp and azure providers against loopback fakes built from the
clouds' own definitions (issue 20).

Compute Engine: the fake reads the discovery document compute.v1.json that PyPI
google-api-python-client ships (googleapiclient/discovery_cache/documents/): every method's
path comes from it, every request body is validated against the method's request schema
(unknown keys, types, enums), and every answer is built as the response schema's shape and
validated against it too (Operation, InstanceList). The token endpoint verifies the
service-account JWT's RS256 signature with google-auth (a dependency of that client) against
the key's public half, and answers Google's own invalid_grant error for an expired one.

Azure: the fake validates every virtualMachines create-or-update body against the models of
PyPI azure-mgmt-compute (every key must be a field of the model it sits in, enums must be the
model's values), answers with the ARM long-running-operation protocol (201 +
Azure-AsyncOperation, InProgress then Succeeded), and its token endpoint answers the Microsoft
identity platform's errors (invalid_client, AADSTS7000215) for a wrong secret.

Scenarios (argv[1]):
  gcp-launch       fleet.max instances labelled with the job within 30 s; the first zone's
                   inserts end ZONE_RESOURCE_POOL_EXHAUSTED, so all land in the second; SIGTERM
                   deletes them all and launch exits 0 within 30 s
  gcp-expired-jwt  the token endpoint's clock is 2 h ahead: exit 2 with invalid_grant, nothing
                   created
  gcp-metadata     no key file: the token comes from the metadata server (GCE_METADATA_HOST,
                   Metadata-Flavor: Google); instances created, then deleted on SIGTERM
  azure-launch     as gcp-launch; zone "1" answers SkuNotAvailable
  azure-bad-secret wrong AZURE_CLIENT_SECRET: exit 2 with invalid_client and AADSTS7000215
  dry-run          both providers: METHOD URL lines, JSON bodies, nothing sent, no secret
  azure-imds       no client secret: the managed identity's token from IMDS (Metadata: true)
  no-credentials   gcp without a key file and a metadata server that never answers, azure
                   without a secret and an IMDS that never answers: exit 2 naming the missing
                   credentials (each probe gives up within 1 s)
  insecure-authority  AZURE_AUTHORITY_HOST / token_uri over http:// off loopback: exit 2
  gcp-retry        the first insert and the first list answer 503: retried, the fleet is made
"""
import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SPOTTRAIN = os.environ.get("SPOTTRAIN_BIN") or "spottrain"
DEADLINE = 30.0


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def wait_for(cond, what, timeout=DEADLINE):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out after %.0f s waiting for %s" % (timeout, what))


# ---- a small validator for discovery-document schemas -------------------------------------

class Discovery:
    def __init__(self):
        import googleapiclient
        path = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache",
                            "documents", "compute.v1.json")
        with open(path) as f:
            self.doc = json.load(f)
        self.schemas = self.doc["schemas"]
        self.root = self.doc["rootUrl"].rstrip("/")  # https://compute.googleapis.com
        self.service = self.doc["servicePath"]        # compute/v1/

    def method(self, resource, name):
        return self.doc["resources"][resource]["methods"][name]

    def validate(self, value, schema, path, errs):
        if "$ref" in schema:
            schema = self.schemas[schema["$ref"]]
        t = schema.get("type")
        if t == "object":
            if not isinstance(value, dict):
                errs.append("%s: not an object" % path)
                return
            props = schema.get("properties", {})
            extra = schema.get("additionalProperties")
            for k, v in value.items():
                if k in props:
                    self.validate(v, props[k], path + "." + k, errs)
                elif extra is not None:
                    self.validate(v, extra, path + "." + k, errs)
                else:
                    errs.append("%s.%s: not in the schema" % (path, k))
        elif t == "array":
            if not isinstance(value, list):
                errs.append("%s: not an array" % path)
                return
            for i, v in enumerate(value):
                self.validate(v, schema["items"], "%s[%d]" % (path, i), errs)
        elif t == "string":
            if not isinstance(value, str):
                errs.append("%s: not a string" % path)
            elif "enum" in schema and value not in schema["enum"]:
                errs.append("%s: '%s' is not one of %s" % (path, value, schema["enum"]))
        elif t == "boolean":
            if not isinstance(value, bool):
                errs.append("%s: not a boolean" % path)
        elif t == "integer":
            if not isinstance(value, int) or isinstance(value, bool):
                errs.append("%s: not an integer" % path)
        elif t == "number":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                errs.append("%s: not a number" % path)


def path_regex(template):
    """compute.v1.json's flatPath 'projects/{project}/zones/{zone}/instances' as a regex."""
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template) + "$")


# ---- the Compute Engine fake --------------------------------------------------------------

class GceFake:
    def __init__(self, disco, pubkey_pem, exhausted_zone=None, clock_skew=0.0):
        self.d = disco
        self.pub = pubkey_pem
        self.exhausted = exhausted_zone
        self.skew = clock_skew
        self.lock = threading.Lock()
        self.instances = {}    # name -> Instance
        self.ops = {}          # name -> Operation
        self.errors = []       # validation failures (the test asserts none)
        self.requests = []     # (method, path)
        self.tokens = set()
        self.inserts = 0
        self.metadata_token_calls = 0
        self.fail_next = 0     # the next N Compute calls answer 503
        self.routes = []
        for res, meth in [("instances", "insert"), ("instances", "list"),
                          ("instances", "delete"), ("zoneOperations", "wait")]:
            m = self.d.method(res, meth)
            self.routes.append((m["httpMethod"], path_regex(m["flatPath"]), res + "." + meth, m))

    def check(self, value, ref, what):
        errs = []
        self.d.validate(value, {"$ref": ref}, ref, errs)
        if errs:
            self.errors.append("%s: %s" % (what, "; ".join(errs)))

    def operation(self, zone, project, kind, target, error=None):
        name = "operation-%s" % uuid.uuid4().hex[:16]
        base = "%s/%sprojects/%s/zones/%s" % (self.d.root, self.d.service, project, zone)
        op = {"kind": "compute#operation", "id": str(uuid.uuid4().int % (1 << 63)),
              "name": name, "zone": base, "operationType": kind,
              "targetLink": base + "/instances/" + target, "status": "RUNNING",
              "progress": 0, "selfLink": base + "/operations/" + name,
              "insertTime": time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())}
        self.ops[name] = {"op": op, "error": error}
        self.check(op, "Operation", "our Operation")
        return op

    def finish(self, name):
        entry = self.ops[name]
        op = dict(entry["op"])
        op["status"] = "DONE"
        op["progress"] = 100
        if entry["error"]:
            op["error"] = {"errors": [entry["error"]]}
        self.check(op, "Operation", "our Operation")
        return op

    def token(self, form):
        import google.auth.crypt
        import google.auth.jwt
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return 400, {"error": "unsupported_grant_type",
                         "error_description": "Invalid grant_type: %s" % form.get("grant_type")}
        assertion = form.get("assertion", "")
        try:
            claims = google.auth.jwt.decode(assertion, certs=self.pub, verify=True,
                                            clock_skew_in_seconds=10 ** 6)
        except Exception as e:  # a bad signature is Google's invalid_grant too
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."
                         " (%s)" % e}
        now = time.time() + self.skew
        if not (claims["iat"] - 300 <= now <= claims["exp"]) or claims["exp"] - claims["iat"] > 3600:
            return 400, {"error": "invalid_grant",
                         "error_description": "Invalid JWT: Token must be a short-lived token "
                         "(60 minutes) and in a reasonable timeframe. Check your iat and exp "
                         "values in the JWT claim."}
        if claims.get("scope") != "https://www.googleapis.com/auth/compute":
            return 400, {"error": "invalid_scope", "error_description": "bad scope"}
        tok = "ya29.fake-" + uuid.uuid4().hex
        self.tokens.add(tok)
        return 200, {"access_token": tok, "expires_in": 3599, "token_type": "Bearer"}

    def handle(self, method, path, query, headers, body):
        with self.lock:
            self.requests.append((method, path))
            if path == "/token" and method == "POST":
                return self.token(dict(urllib.parse.parse_qsl(body.decode())))
            if path == "/computeMetadata/v1/instance/service-accounts/default/token":
                if headers.get("Metadata-Flavor") != "Google":
                    return 403, {"error": "Missing Metadata-Flavor:Google header."}
                self.metadata_token_calls += 1
                tok = "ya29.metadata-" + uuid.uuid4().hex
                self.tokens.add(tok)
                return 200, {"access_token": tok, "expires_in": 3599, "token_type": "Bearer"}
            prefix = "/" + self.d.service
            if not path.startswith(prefix):
                return 404, {"error": {"code": 404, "message": "not found: " + path}}
            auth = headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
                return 401, {"error": {"code": 401, "message": "Request had invalid "
                                       "authentication credentials.", "status":
                                       "UNAUTHENTICATED", "errors": [{"reason":
                                                                      "authError"}]}}
            rel = path[len(prefix):]
            if self.fail_next > 0:
                self.fail_next -= 1
                return 503, {"error": {"code": 503, "message": "The service is currently "
                                       "unavailable.", "status": "UNAVAILABLE",
                                       "errors": [{"reason": "backendError"}]}}
            for http, rx, name, m in self.routes:
                mt = rx.match(rel)
                if not mt or http != method:
                    continue
                a = mt.groupdict()
                return getattr(self, name.replace(".", "_"))(a, query, body, m)
            return 404, {"error": {"code": 404, "message": "no method for %s %s" % (method,
                                                                                     rel)}}

    def instances_insert(self, a, query, body, m):
        inst = json.loads(body)
        self.check(inst, m["request"]["$ref"], "instances.insert body")
        self.inserts += 1
        zone = a["zone"]
        if zone == self.exhausted:
            return 200, self.operation(zone, a["project"], "insert", inst["name"], error={
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": "The zone 'projects/%s/zones/%s' does not have enough resources "
                           "available to fulfill the request.  Try a different zone, or try "
                           "again later." % (a["project"], zone)})
        if inst["name"] in self.instances:
            return 409, {"error": {"code": 409, "message": "already exists", "errors": [
                {"reason": "alreadyExists"}]}}
        stored = dict(inst)
        stored.update({"kind": "compute#instance", "status": "RUNNING",
                       "zone": "%s/%sprojects/%s/zones/%s" % (self.d.root, self.d.service,
                                                               a["project"], zone),
                       "id": str(uuid.uuid4().int % (1 << 63))})
        self.check(stored, "Instance", "our Instance")
        self.instances[inst["name"]] = stored
        return 200, self.operation(zone, a["project"], "insert", inst["name"])

    def instances_list(self, a, query, body, m):
        want = {}
        flt = query.get("filter", "")
        for k, v in re.findall(r'labels\.([\w-]+)\s*=\s*"?([^"\s]+)"?', flt):
            want[k] = v
        if flt and not want:
            self.errors.append("instances.list filter '%s' is not a label filter" % flt)
        zone_url = "/zones/%s" % a["zone"]
        items = [i for i in self.instances.values() if i["zone"].endswith(zone_url) and
                 all(i.get("labels", {}).get(k) == v for k, v in want.items())]
        out = {"kind": "compute#instanceList", "id": "projects/%s/zones/%s/instances" %
               (a["project"], a["zone"]), "items": items,
               "selfLink": "%s/%sprojects/%s/zones/%s/instances" % (
                   self.d.root, self.d.service, a["project"], a["zone"])}
        self.check(out, m["response"]["$ref"], "our InstanceList")
        return 200, out

    def instances_delete(self, a, query, body, m):
        if a["instance"] not in self.instances:
            return 404, {"error": {"code": 404, "message": "The resource '%s' was not found" %
                                   a["instance"], "errors": [{"reason": "notFound"}]}}
        del self.instances[a["instance"]]
        return 200, self.operation(a["zone"], a["project"], "delete", a["instance"])

    def zoneOperations_wait(self, a, query, body, m):
        if a["operation"] not in self.ops:
            return 404, {"error": {"code": 404, "message": "no operation"}}
        return 200, self.finish(a["operation"])


# ---- the Azure fake -----------------------------------------------------------------------

AZ_SKU_MSG = ("The requested size for resource '%s' is currently not available in location "
              "'%s' zones '%s' for subscription '%s'. Please try another size or deploy to a "
              "different location or zones. See https://aka.ms/azureskunotavailable for "
              "details.")


class AzureFake:
    def __init__(self, secret, sku_zone=None):
        import azure.mgmt.compute.models as models
        from azure.mgmt.compute._utils.model_base import Model
        self.models = models
        self.Model = Model
        self.secret = secret
        self.sku_zone = sku_zone
        self.lock = threading.Lock()
        self.vms = {}
        self.ops = {}
        self.errors = []
        self.requests = []
        self.tokens = set()
        self.port = 0
        self.imds_calls = 0

    def check_model(self, inst, raw, path):
        fields = type(inst)._attr_to_rest_field
        by_rest = {f._rest_name: attr for attr, f in fields.items()}
        for k, v in raw.items():
            if k not in by_rest:
                self.errors.append("%s.%s: not a field of %s" % (path, k, type(inst).__name__))
                continue
            val = getattr(inst, by_rest[k])
            if isinstance(val, self.Model):
                if not isinstance(v, dict):
                    self.errors.append("%s.%s: not an object" % (path, k))
                else:
                    self.check_model(val, v, path + "." + k)
            elif isinstance(val, list):
                for i, (x, y) in enumerate(zip(val, v)):
                    if isinstance(x, self.Model):
                        self.check_model(x, y, "%s.%s[%d]" % (path, k, i))

    def check_vm(self, body):
        m = self.models
        vm = m.VirtualMachine(body)
        self.check_model(vm, body, "VirtualMachine")
        p = body.get("properties", {})
        for key, enum in [("priority", m.VirtualMachinePriorityTypes),
                          ("evictionPolicy", m.VirtualMachineEvictionPolicyTypes)]:
            if key in p and p[key] not in [e.value for e in enum]:
                self.errors.append("properties.%s: '%s' is not one of %s" % (
                    key, p[key], [e.value for e in enum]))
        if "location" not in body:
            self.errors.append("VirtualMachine.location is required")

    def handle(self, method, path, query, headers, body):
        with self.lock:
            self.requests.append((method, path))
            mt = re.match(r"^/([^/]+)/oauth2/v2\.0/token$", path)
            if mt and method == "POST":
                form = dict(urllib.parse.parse_qsl(body.decode()))
                if form.get("client_secret") != self.secret:
                    return 401, {
                        "error": "invalid_client",
                        "error_description": "AADSTS7000215: Invalid client secret provided. "
                        "Ensure the secret being sent in the request is the client secret "
                        "value, not the client secret ID, for a secret added to app '%s'. "
                        "Trace ID: 00000000-0000-0000-0000-000000000000" % form.get("client_id"),
                        "error_codes": [7000215], "timestamp": "2024-01-01 00:00:00Z",
                        "trace_id": "00000000-0000-0000-0000-000000000000",
                        "correlation_id": "00000000-0000-0000-0000-000000000000",
                        "error_uri": "https://login.microsoftonline.com/error?code=7000215"}
                if form.get("grant_type") != "client_credentials" or \
                        form.get("scope") != "https://management.azure.com/.default":
                    return 400, {"error": "invalid_request", "error_description": "AADSTS900144"}
                tok = "eyJ0eXAi.fake." + uuid.uuid4().hex
                self.tokens.add(tok)
                return 200, {"token_type": "Bearer", "expires_in": 3599,
                             "ext_expires_in": 3599, "access_token": tok}
            if path == "/metadata/identity/oauth2/token" and method == "GET":
                if headers.get("Metadata") != "true":
                    return 400, {"error": "invalid_request",
                                 "error_description": "Required metadata header not specified"}
                if query.get("resource") != "https://management.azure.com/":
                    return 400, {"error": "invalid_resource",
                                 "error_description": "AADSTS500011: bad resource"}
                self.imds_calls += 1
                tok = "eyJ0eXAi.imds." + uuid.uuid4().hex
                self.tokens.add(tok)
                return 200, {"access_token": tok, "expires_in": "3599", "token_type": "Bearer",
                             "resource": "https://management.azure.com/"}
            auth = headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
                return 401, {"error": {"code": "AuthenticationFailed",
                                       "message": "Authentication failed."}}
            if query.get("api-version") is None:
                return 400, {"error": {"code": "MissingApiVersionParameter",
                                       "message": "The api-version query parameter is required"}}
            mt = re.match(r"^/operations/(\w+)$", path)
            if mt and method == "GET":
                op = self.ops.get(mt.group(1))
                if not op:
                    return 404, {"error": {"code": "NotFound", "message": "no operation"}}
                op["polls"] += 1
                status = "InProgress" if op["polls"] < 2 else "Succeeded"
                if status == "Succeeded" and op["vm"] in self.vms and op["kind"] == "create":
                    self.vms[op["vm"]]["properties"]["provisioningState"] = "Succeeded"
                return 200, {"startTime": op["start"], "status": status, "name": mt.group(1)}
            mt = re.match(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/"
                          r"Microsoft\.Compute/virtualMachines(?:/([^/]+))?$", path)
            if not mt:
                return 404, {"error": {"code": "InvalidResourceType", "message": path}}
            sub, rg, name = mt.groups()
            if name is None and method == "GET":
                return 200, {"value": list(self.vms.values())}
            if method == "PUT":
                vm = json.loads(body)
                self.check_vm(vm)
                zone = (vm.get("zones") or [""])[0]
                if zone == self.sku_zone:
                    return 409, {"error": {"code": "SkuNotAvailable", "message": AZ_SKU_MSG % (
                        vm["properties"]["hardwareProfile"]["vmSize"], vm["location"], zone,
                        sub)}}
                stored = json.loads(body)
                stored.update({"id": path, "name": name,
                               "type": "Microsoft.Compute/virtualMachines"})
                stored["properties"]["provisioningState"] = "Creating"
                stored["properties"]["vmId"] = str(uuid.uuid4())
                stored["properties"]["osProfile"].pop("customData", None)  # never returned
                self.vms[name] = stored
                return 201, stored, {"Azure-AsyncOperation": self.new_op(name, "create")}
            if method == "DELETE":
                if name not in self.vms:
                    return 204, None
                del self.vms[name]
                return 202, None, {"Azure-AsyncOperation": self.new_op(name, "delete")}
            return 405, {"error": {"code": "MethodNotAllowed", "message": method}}

    def new_op(self, vm, kind):
        oid = uuid.uuid4().hex
        self.ops[oid] = {"vm": vm, "kind": kind, "polls": 0,
                         "start": time.strftime("%Y-%m-%dT%H:%M:%S.0000000+00:00", time.gmtime())}
        return "http://127.0.0.1:%d/operations/%s?api-version=2024-03-01" % (self.port, oid)


# ---- HTTP plumbing ------------------------------------------------------------------------

def serve(fake):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do(self):
            u = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(u.query))
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            out = fake.handle(self.command, u.path, q, self.headers, body)
            status, obj = out[0], out[1]
            extra = out[2] if len(out) > 2 else {}
            data = json.dumps(obj).encode() if obj is not None else b""
            self.send_response(status)
            if obj is not None:
                self.send_header("Content-Type", "application/json; charset=UTF-8")
            if isinstance(fake, GceFake):
                self.send_header("Metadata-Flavor", "Google")
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


SPEC = """apiVersion: spottrain/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  model: {{layers: 2, hidden: 8, heads: 2, vocab: 16, seq_len: 8}}
  data:
    train: train.bin
    synth: {{tokens: 10000}}
  training: {{global_batch: 8, steps: 10}}
  fleet:
{fleet}
  coordinator: {{listen: "127.0.0.1:0"}}
  status: {{listen: "127.0.0.1:0"}}
"""


def write_spec(tmp, name, fleet):
    p = os.path.join(tmp, name + ".yaml")
    with open(p, "w") as f:
        f.write(SPEC.format(name=name, fleet="\n".join("    " + l for l in fleet)))
    return p


def gcp_fleet(port, zones):
    return ["provider: gcp", "project: test-proj", "zones: [%s]" % ", ".join(zones),
            "image: projects/debian-cloud/global/images/family/debian-12",
            "instance_type: n1-standard-4", "max: 3",
            "gcp: {endpoint: 'http://127.0.0.1:%d'}" % port]


def azure_fleet(port, zones):
    sub = "00000000-1111-2222-3333-444444444444"
    return ["provider: azure", "subscription: " + sub, "resource_group: rg-test",
            "location: westeurope", "zones: [%s]" % ", ".join('"%s"' % z for z in zones),
            "image: Canonical:ubuntu-24_04-lts:server:latest",
            "instance_type: Standard_NC4as_T4_v3", "max: 3",
            "azure: {subnet: '/subscriptions/%s/resourceGroups/rg-test/providers/"
            "Microsoft.Network/virtualNetworks/vnet/subnets/default', "
            "endpoint: 'http://127.0.0.1:%d'}" % (sub, port)]


def make_key(tmp, token_port):
    key = os.path.join(tmp, "sa.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                    "rsa_keygen_bits:2048", "-out", key], check=True, capture_output=True)
    pub = subprocess.run(["openssl", "pkey", "-in", key, "-pubout"], check=True,
                         capture_output=True).stdout
    with open(key) as f:
        pem = f.read()
    sa = os.path.join(tmp, "sa.json")
    with open(sa, "w") as f:
        json.dump({"type": "service_account", "project_id": "test-proj",
                   "private_key_id": "0123456789abcdef", "private_key": pem,
                   "client_email": "spottrain@test-proj.iam.gserviceaccount.com",
                   "client_id": "1", "token_uri": "http://127.0.0.1:%d/token" % token_port}, f)
    return sa, pub


def clean_env(**kw):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOOGLE_", "GCE_", "AZURE_"))}
    env.update(kw)
    return env


def launch(spec, tmp, env, *extra):
    state = os.path.join(tmp, "state-" + os.path.basename(spec))  # one job per directory
    return subprocess.Popen([SPOTTRAIN, "launch", spec, "--state-dir", state] + list(extra),
                            cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=DEADLINE):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        fail("launch did not exit within %.0f s\nstdout:\n%s\nstderr:\n%s" % (timeout, out, err))
    return proc.returncode, out, err


def launch_and_stop(fake, spec, tmp, env, count, label_of, zone_of, want_zone):
    """Starts launch, waits for `count` instances of the job, SIGTERMs it, checks they are all
    deleted. Returns the instances seen."""
    t0 = time.monotonic()
    proc = launch(spec, tmp, env)

    def have():
        if proc.poll() is not None:
            out, err = proc.communicate()
            fail("launch exited %d early\nstdout:\n%s\nstderr:\n%s" % (proc.returncode, out, err))
        with fake.lock:
            return len(fake_instances(fake)) == count and dict(fake_instances(fake))
    insts = wait_for(have, "%d instances" % count)
    took = time.monotonic() - t0
    print("created %d instances in %.1f s" % (count, took))
    for name, inst in insts.items():
        job, job_id = label_of(inst)
        if job != "demo-" + ("gcp" if isinstance(fake, GceFake) else "az") or \
                not re.match(r"^[0-9a-f-]{36}$", job_id):
            fail("instance %s carries job=%r job-id=%r" % (name, job, job_id))
        if zone_of(inst) != want_zone:
            fail("instance %s in zone %r, want %r (the other zone had no capacity)" % (
                name, zone_of(inst), want_zone))
    if len({label_of(i)[1] for i in insts.values()}) != 1:
        fail("instances carry different job ids")
    # A preemption: the cloud deletes one instance (instanceTerminationAction / evictionPolicy
    # Delete). The next listing shows it gone; launch replaces it in the zone with capacity.
    victim = sorted(insts)[0]
    with fake.lock:
        (fake.instances if isinstance(fake, GceFake) else fake.vms).pop(victim)

    def replaced():
        if proc.poll() is not None:
            fail("launch exited %d after the preemption" % proc.returncode)
        with fake.lock:
            now = dict(fake_instances(fake))
        return len(now) == count and victim not in now and now
    after = wait_for(replaced, "a replacement for the preempted %s" % victim)
    new = sorted(set(after) - set(insts))
    if len(new) != 1 or zone_of(after[new[0]]) != want_zone:
        fail("after the preemption: new %s" % new)
    print("preempted %s, replaced by %s" % (victim, new[0]))
    t1 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    print("SIGTERM to exit: %.1f s" % (time.monotonic() - t1))
    if code != 0:
        fail("launch exited %d after SIGTERM\nstdout:\n%s\nstderr:\n%s" % (code, out, err))
    with fake.lock:
        left = dict(fake_instances(fake))
    if left:
        fail("instances left after SIGTERM: %s" % sorted(left))
    if "every instance of the job was terminated" not in out:
        fail("launch did not say it terminated the fleet:\n" + out)
    if fake.errors:
        fail("requests did not validate against the definitions:\n" + "\n".join(fake.errors))
    return insts


def fake_instances(fake):
    return fake.instances.items() if isinstance(fake, GceFake) else fake.vms.items()


def gce_labels(i):
    return i["labels"].get("spottrain-job"), i["labels"].get("spottrain-job-id")


def gce_zone(i):
    return i["zone"].rsplit("/", 1)[1]


def az_tags(v):
    return v["tags"].get("spottrain-job"), v["tags"].get("spottrain-job-id")


def az_zone(v):
    return (v.get("zones") or [""])[0]


def gcp_launch(tmp, metadata=False):
    disco = Discovery()
    fake = GceFake(disco, None, exhausted_zone="us-central1-a")
    srv = serve(fake)
    port = srv.server_address[1]
    sa, pub = make_key(tmp, port)
    fake.pub = pub
    spec = write_spec(tmp, "demo-gcp", gcp_fleet(port, ["us-central1-a", "us-central1-b"]))
    env = clean_env(GCE_METADATA_HOST="127.0.0.1:%d" % port) if metadata else \
        clean_env(GOOGLE_APPLICATION_CREDENTIALS=sa)
    insts = launch_and_stop(fake, spec, tmp, env, 3, gce_labels, gce_zone, "us-central1-b")
    for name, i in insts.items():
        s = i["scheduling"]
        if s.get("provisioningModel") != "SPOT" or s.get("instanceTerminationAction") != "DELETE":
            fail("instance %s scheduling %s" % (name, s))
        script = {m["key"]: m["value"] for m in i["metadata"]["items"]}["startup-script"]
        if "exec spottrain worker --coordinator 127.0.0.1:" not in script or \
                "<redacted>" in script:
            fail("startup-script of %s does not start the worker with the token:\n%s" % (
                name, script))
    exhausted = [p for p in fake.requests if "/zones/us-central1-a/instances" in p[1] and
                 p[0] == "POST"]
    if not exhausted:
        fail("no insert was tried in the exhausted zone first")
    if metadata and fake.metadata_token_calls < 1:
        fail("the metadata server's token was never asked for")
    if not metadata and fake.metadata_token_calls:
        fail("the metadata server was asked although a key file was given")
    print("ok: gcp launch (%s), %d inserts in the exhausted zone moved to the next" % (
        "metadata server" if metadata else "service-account key", len(exhausted)))


def gcp_expired(tmp):
    disco = Discovery()
    fake = GceFake(disco, None, clock_skew=7200.0)
    srv = serve(fake)
    port = srv.server_address[1]
    sa, pub = make_key(tmp, port)
    fake.pub = pub
    spec = write_spec(tmp, "demo-gcp", gcp_fleet(port, ["us-central1-a"]))
    code, out, err = finish(launch(spec, tmp, clean_env(GOOGLE_APPLICATION_CREDENTIALS=sa)))
    if code != 2:
        fail("launch exited %d, want 2\nstdout:\n%s\nstderr:\n%s" % (code, out, err))
    if "invalid_grant" not in err or "Invalid JWT: Token must be a short-lived token" not in err:
        fail("stderr does not carry Google's error:\n" + err)
    if fake.instances or fake.inserts:
        fail("instances were asked for without a token")
    print("ok: expired JWT -> exit 2 with Google's error")


def azure_launch(tmp, imds=False):
    fake = AzureFake("right-secret", sku_zone="1")
    srv = serve(fake)
    port = srv.server_address[1]
    fake.port = port
    spec = write_spec(tmp, "demo-az", azure_fleet(port, ["1", "2"]))
    env = clean_env(AZURE_TENANT_ID="tenant-1", AZURE_CLIENT_ID="client-1",
                    AZURE_CLIENT_SECRET="right-secret",
                    AZURE_AUTHORITY_HOST="http://127.0.0.1:%d" % port)
    if imds:
        env = clean_env(AZURE_POD_IDENTITY_AUTHORITY_HOST="http://127.0.0.1:%d" % port)
    insts = launch_and_stop(fake, spec, tmp, env, 3, az_tags, az_zone, "2")
    for name, v in insts.items():
        p = v["properties"]
        if p.get("priority") != "Spot" or p.get("evictionPolicy") != "Delete" or \
                "maxPrice" not in p.get("billingProfile", {}):
            fail("vm %s: priority/evictionPolicy/billingProfile %s" % (name, p))
        nic = p["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
        if not nic["ipConfigurations"][0]["properties"]["subnet"]["id"].endswith(
                "/subnets/default"):
            fail("vm %s NIC not on fleet.azure.subnet" % name)
    polled = [r for r in fake.requests if r[1].startswith("/operations/")]
    if not polled:
        fail("no Azure-AsyncOperation was polled")
    skus = [r for r in fake.requests if r[0] == "PUT"]
    if len(skus) <= 3:
        fail("zone 1 (SkuNotAvailable) was never tried")
    if imds and fake.imds_calls < 1:
        fail("IMDS was never asked for a token")
    print("ok: azure launch (%s), %d creates, %d operation polls" % (
        "IMDS" if imds else "client secret", len(skus), len(polled)))


def azure_bad_secret(tmp):
    fake = AzureFake("right-secret")
    srv = serve(fake)
    port = srv.server_address[1]
    fake.port = port
    spec = write_spec(tmp, "demo-az", azure_fleet(port, ["1"]))
    env = clean_env(AZURE_TENANT_ID="tenant-1", AZURE_CLIENT_ID="client-1",
                    AZURE_CLIENT_SECRET="wrong-secret",
                    AZURE_AUTHORITY_HOST="http://127.0.0.1:%d" % port)
    code, out, err = finish(launch(spec, tmp, env))
    if code != 2:
        fail("launch exited %d, want 2\nstdout:\n%s\nstderr:\n%s" % (code, out, err))
    if "invalid_client" not in err or "AADSTS7000215" not in err:
        fail("stderr does not carry the token endpoint's error:\n" + err)
    if "wrong-secret" in out + err:
        fail("the client secret was printed")
    if fake.vms:
        fail("VMs were created without a token")
    print("ok: wrong client secret -> exit 2 with invalid_client / AADSTS7000215")


def dry_run(tmp):
    gce = GceFake(Discovery(), None)
    az = AzureFake("s3cr3t-value")
    s1, s2 = serve(gce), serve(az)
    az.port = s2.server_address[1]
    for name, fleet, body_key in [
            ("demo-gcp", gcp_fleet(s1.server_address[1], ["us-central1-a", "us-central1-b"]),
             "POST"),
            ("demo-az", azure_fleet(s2.server_address[1], ["1", "2"]), "PUT")]:
        spec = write_spec(tmp, name, fleet)
        env = clean_env(AZURE_TENANT_ID="t", AZURE_CLIENT_ID="c", AZURE_CLIENT_SECRET="s3cr3t-value",
                        AZURE_AUTHORITY_HOST="http://127.0.0.1:%d" % s2.server_address[1])
        p = subprocess.run([SPOTTRAIN, "launch", "--dry-run", spec], cwd=tmp, env=env,
                           capture_output=True, text=True, timeout=DEADLINE)
        if p.returncode != 0:
            fail("%s dry run exited %d: %s" % (name, p.returncode, p.stderr))
        lines = p.stdout.split("\n")
        reqs = [l for l in lines if re.match(r"^(GET|POST|PUT|DELETE) http://127\.0\.0\.1:\d+/", l)]
        creates = [i for i, l in enumerate(lines) if l.startswith(body_key + " ")]
        if len(creates) != 3:
            fail("%s: %d create requests shown, want 3:\n%s" % (name, len(creates), p.stdout))
        # Each create is followed by its JSON body.
        for i in creates:
            j = i + 1
            depth, text = 0, []
            while j < len(lines):
                text.append(lines[j])
                depth += lines[j].count("{") - lines[j].count("}")
                j += 1
                if depth == 0:
                    break
            body = json.loads("\n".join(text))
            if name == "demo-gcp":
                errs = []
                gce.d.validate(body, {"$ref": "Instance"}, "Instance", errs)
                if errs:
                    fail("dry-run body does not validate: %s" % errs)
            else:
                az.check_vm(body)
        for secret in ["s3cr3t-value"]:
            if secret in p.stdout + p.stderr:
                fail("a secret was printed")
        if "<redacted>" not in p.stdout and name == "demo-gcp":
            fail("the join token is not shown redacted")
        print("ok: %s dry run, %d requests shown" % (name, len(reqs)))
    for name, fleet, want in [
            ("demo-gcp", gcp_fleet(1, ["z"]), "spec.fleet.image (the image URL) is required"),
            ("demo-az", azure_fleet(1, ["1"]), "spec.fleet.image (the image id or "
             "PUBLISHER:OFFER:SKU:VERSION) is required")]:
        spec = write_spec(tmp, name, [l for l in fleet if not l.startswith("image:")])
        p = subprocess.run([SPOTTRAIN, "launch", "--dry-run", spec], cwd=tmp, env=clean_env(),
                           capture_output=True, text=True, timeout=DEADLINE)
        if p.returncode != 2 or want not in p.stderr:
            fail("%s without an image: exit %d: %s" % (name, p.returncode, p.stderr))
    if gce.requests or az.requests:
        fail("a dry run sent requests: %s %s" % (gce.requests, az.requests))
    if az.errors:
        fail("azure dry-run bodies: %s" % az.errors)


def silent_server():
    """A socket that accepts connections and never answers: a metadata server that hangs."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def no_credentials(tmp):
    hang = silent_server()
    port = hang.getsockname()[1]
    cases = [("demo-gcp", gcp_fleet(1, ["us-central1-a"]),
              clean_env(GCE_METADATA_HOST="127.0.0.1:%d" % port),
              "GOOGLE_APPLICATION_CREDENTIALS is not set and the metadata server"),
             ("demo-az", azure_fleet(1, ["1"]),
              clean_env(AZURE_POD_IDENTITY_AUTHORITY_HOST="http://127.0.0.1:%d" % port),
              "AZURE_CLIENT_SECRET are not all set and IMDS")]
    for name, fleet, env, want in cases:
        spec = write_spec(tmp, name, fleet)
        t0 = time.monotonic()
        code, out, err = finish(launch(spec, tmp, env))
        took = time.monotonic() - t0
        if code != 2 or want not in err:
            fail("%s: exit %d, want 2 with '%s'\nstderr:\n%s" % (name, code, want, err))
        # The probe's own limit is 1 s; a launch that waited for curl's default would take
        # minutes. The bound is generous for a loaded machine.
        if took > 20:
            fail("%s: the credential probe took %.1f s" % (name, took))
        print("ok: %s without credentials -> exit 2 (%.1f s)" % (name, took))
    hang.close()


def insecure_authority(tmp):
    spec = write_spec(tmp, "demo-az", azure_fleet(1, ["1"]))
    env = clean_env(AZURE_TENANT_ID="t", AZURE_CLIENT_ID="c", AZURE_CLIENT_SECRET="x",
                    AZURE_AUTHORITY_HOST="http://login.example.com")
    code, out, err = finish(launch(spec, tmp, env))
    if code != 2 or "must be https:// (http:// only on loopback)" not in err:
        fail("azure: exit %d\nstderr:\n%s" % (code, err))
    sa = os.path.join(tmp, "sa.json")
    with open(sa, "w") as f:
        json.dump({"type": "service_account", "client_email": "a@b", "private_key": "x",
                   "token_uri": "http://oauth2.example.com/token"}, f)
    spec = write_spec(tmp, "demo-gcp", gcp_fleet(1, ["us-central1-a"]))
    code, out, err = finish(launch(spec, tmp, clean_env(GOOGLE_APPLICATION_CREDENTIALS=sa)))
    if code != 2 or "must be https:// (http:// only on loopback)" not in err:
        fail("gcp: exit %d\nstderr:\n%s" % (code, err))
    print("ok: http:// token endpoints off loopback are refused")


def gcp_retry(tmp):
    fake = GceFake(Discovery(), None)
    srv = serve(fake)
    port = srv.server_address[1]
    sa, pub = make_key(tmp, port)
    fake.pub = pub
    fake.fail_next = 2
    spec = write_spec(tmp, "demo-gcp", gcp_fleet(port, ["us-central1-a"]))
    launch_and_stop(fake, spec, tmp, clean_env(GOOGLE_APPLICATION_CREDENTIALS=sa), 3,
                    gce_labels, gce_zone, "us-central1-a")
    if fake.fail_next != 0:
        fail("the 503 answers were not all consumed")
    print("ok: 503 answers retried")


def main():
    scenario = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="spottrain-gcpaz-") as tmp:
        {"gcp-launch": lambda: gcp_launch(tmp),
         "gcp-metadata": lambda: gcp_launch(tmp, metadata=True),
         "gcp-expired-jwt": lambda: gcp_expired(tmp),
         "azure-launch": lambda: azure_launch(tmp),
         "azure-bad-secret": lambda: azure_bad_secret(tmp),
         "dry-run": lambda: dry_run(tmp),
         "azure-imds": lambda: azure_launch(tmp, imds=True),
         "no-credentials": lambda: no_credentials(tmp),
         "insecure-authority": lambda: insecure_authority(tmp),
         "gcp-retry": lambda: gcp_retry(tmp)}[scenario]()


if __name__ == "__main__":
    main()
