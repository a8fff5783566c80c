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
  insecure-authority  AZURE_AUTHORITY_HOST / token_uri, and fleet.gcp.endpoint /
                   fleet.azure.endpoint (launch --dry-run, down), over http:// off loopback: exit 2
  gcp-retry        the first insert and the first list answer 503: retried, the fleet is made
  gcp-train, azure-train  the boot shim runs each instance's startup-script / customData as a
                   local worker with its own metadata server; one gets a notice (GCE preempted
                   TRUE, an Azure Preempt event) and is deleted once its worker has left (GCE)
                   or acknowledged the event (Azure: StartRequests with the EventId, after its
                   state moved); the job ends bitwise equal to train --local --dp 1 --pp 1
  azure-train-ack-refused  the same with IMDS refusing the acknowledgement: logged, trained on
  gcp-keep-down, azure-keep-down  --keep-fleet + SIGTERM leaves the 3 instances; down deletes
                   them and not another job's, twice (the second deletes 0); listings paged
  gcp-throttled, azure-throttled  two 429 answers: backed off, retried, the fleet is made
  gcp-forbidden, azure-forbidden  403 on create: exit 2 with one line carrying the cloud's
                   error, nothing created; down refused (403): exit 2
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

import cloudtest
from cloudtest import fail, wait_for
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402

SPOTTRAIN = os.environ.get("SPOTTRAIN_BIN") or "spottrain"
DEADLINE = 30.0


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
        self.fail_next = 0     # the next N Compute calls answer fail_status
        self.fail_status = 503
        self.forbid = None     # "METHOD" whose calls answer 403 PERMISSION_DENIED
        self.page_size = 0     # instances.list items per page (nextPageToken); 0 = all
        self.pages = 0         # list answers that carried a nextPageToken
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
                if self.fail_status == 429:
                    return 429, {"error": {"code": 429, "message": "Quota exceeded for quota "
                                           "metric 'Queries' and limit 'Queries per minute'.",
                                           "status": "RESOURCE_EXHAUSTED", "errors": [
                                               {"reason": "rateLimitExceeded"}]}}
                return 503, {"error": {"code": 503, "message": "The service is currently "
                                       "unavailable.", "status": "UNAVAILABLE",
                                       "errors": [{"reason": "backendError"}]}}
            if self.forbid == method:
                return 403, {"error": {"code": 403, "message": "Required 'compute.instances."
                                       "create' permission for 'projects/test-proj'",
                                       "status": "PERMISSION_DENIED", "errors": [
                                           {"reason": "forbidden", "domain": "global",
                                            "message": "Required 'compute.instances.create' "
                                            "permission for 'projects/test-proj'"}]}}
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
        items.sort(key=lambda i: i["name"])
        start = int(query.get("pageToken") or 0)
        page = self.page_size or len(items) or 1
        out = {"kind": "compute#instanceList", "id": "projects/%s/zones/%s/instances" %
               (a["project"], a["zone"]), "items": items[start:start + page],
               "selfLink": "%s/%sprojects/%s/zones/%s/instances" % (
                   self.d.root, self.d.service, a["project"], a["zone"])}
        if start + page < len(items):
            out["nextPageToken"] = str(start + page)
            self.pages += 1
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
        self.custom_data = {}  # VM name -> base64 customData as created
        self.fail_next = 0     # the next N ARM calls answer 429 TooManyRequests
        self.forbid = None     # "METHOD" whose calls answer 403 AuthorizationFailed
        self.page_size = 0     # VMs per list page (nextLink); 0 = all
        self.pages = 0         # list answers that carried a nextLink

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
            if self.fail_next > 0 and not path.startswith("/operations/"):
                self.fail_next -= 1
                return 429, {"error": {"code": "TooManyRequests", "message": "The request is "
                                       "being throttled as the limit has been reached for "
                                       "operation type - Read_ObservationWindow_00:03:00."}}, \
                    {"Retry-After": "0"}
            if self.forbid == method:
                return 403, {"error": {"code": "AuthorizationFailed", "message": "The client "
                                       "'client-1' with object id 'client-1' does not have "
                                       "authorization to perform action 'Microsoft.Compute/"
                                       "virtualMachines/write' over scope '%s' or the scope is "
                                       "invalid." % path}}
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
                vms = sorted(self.vms.values(), key=lambda v: v["name"])
                start = int(query.get("$skiptoken") or 0)
                page = self.page_size or len(vms) or 1
                out = {"value": vms[start:start + page]}
                if start + page < len(vms):
                    out["nextLink"] = "http://127.0.0.1:%d%s?api-version=%s&$skiptoken=%d" % (
                        self.port, path, query["api-version"], start + page)
                    self.pages += 1
                return 200, out
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
                # Never returned by the API; the boot shim reads it as the VM's first boot would.
                self.custom_data[name] = stored["properties"]["osProfile"].pop("customData",
                                                                              None)
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
    def answer(h, path, q, body):
        out = fake.handle(h.command, path, q, h.headers, body)
        status, obj = out[0], out[1]
        headers = {}
        if obj is not None:
            headers["Content-Type"] = "application/json; charset=UTF-8"
        if isinstance(fake, GceFake):
            headers["Metadata-Flavor"] = "Google"
        headers.update(out[2] if len(out) > 2 else {})
        return status, json.dumps(obj).encode() if obj is not None else b"", headers
    return cloudtest.serve(answer)


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
    # The fleet's own endpoint (fleet.gcp.endpoint / fleet.azure.endpoint) likewise, before
    # any request, dry run or not, and for down.
    for name, fleet in (("gcp", gcp_fleet(80, ["us-central1-a"])),
                        ("azure", azure_fleet(80, ["1"]))):
        fleet = [l.replace("http://127.0.0.1:80", "http://10.1.2.3:80/") for l in fleet]
        spec = write_spec(tmp, "demo-ep-" + name, fleet)
        env = clean_env(GOOGLE_APPLICATION_CREDENTIALS=sa) if name == "gcp" else \
            clean_env(AZURE_TENANT_ID="t", AZURE_CLIENT_ID="c", AZURE_CLIENT_SECRET="x")
        want = "%s: fleet.%s.endpoint 'http://10.1.2.3:80/' must be https:// (http:// only " \
            "on loopback)" % (name, name)
        for args in (["launch", spec, "--dry-run"], ["down", spec]):
            p = subprocess.run([SPOTTRAIN] + args, cwd=tmp, env=env, capture_output=True,
                               text=True, timeout=DEADLINE)
            if p.returncode != 2 or want not in p.stderr:
                fail("%s %s: exit %d, want 2 and %r\nstderr:\n%s" % (
                    name, args[0], p.returncode, want, p.stderr))
    print("ok: http:// token and fleet endpoints off loopback are refused")


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



# ---- the boot shim: each fake instance runs its bootstrap here, as a local worker ------------

class Metadata:
    """One instance's metadata server on loopback: GCE's (Metadata-Flavor: Google; instance/name,
    instance/preempted) or Azure's IMDS (Metadata: true; compute/name, Scheduled Events, whose
    StartRequests it records)."""

    def __init__(self, cloud, name):
        self.cloud, self.name = cloud, name
        self.lock = threading.Lock()
        self.preempted = False
        self.events = []       # Azure Scheduled Events
        self.incarnation = 1
        self.acks = []         # Azure StartRequests bodies, as JSON
        self.ack_status = 200  # what a StartRequests is answered
        self.errors = []
        self.told = threading.Event()  # a preemption was served to the worker
        md = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, status, body, ctype="text/plain"):
                data = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                if md.cloud == "gcp":
                    self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                u = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(u.query))
                if md.cloud == "gcp":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self.reply(403, "Missing Metadata-Flavor:Google header.")
                    with md.lock:
                        v = {"/computeMetadata/v1/instance/name": md.name,
                             "/computeMetadata/v1/instance/preempted":
                                 "TRUE" if md.preempted else "FALSE",
                             "/computeMetadata/v1/instance/maintenance-event": "NONE"}.get(u.path)
                    if v is None:
                        return self.reply(404, "")
                    self.reply(200, v)
                    if v == "TRUE":
                        md.told.set()
                    return None
                if self.headers.get("Metadata") != "true":
                    return self.reply(400, '{"error":"Bad request. Required metadata header not '
                                      'specified"}', "application/json")
                if u.path == "/metadata/instance/compute/name" and q.get("format") == "text":
                    return self.reply(200, md.name)
                if u.path == "/metadata/scheduledevents" and q.get("api-version"):
                    with md.lock:
                        doc = {"DocumentIncarnation": md.incarnation, "Events": list(md.events)}
                    self.reply(200, json.dumps(doc), "application/json")
                    if doc["Events"]:
                        md.told.set()
                    return None
                self.reply(404, "")

            def do_POST(self):
                u = urllib.parse.urlsplit(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if md.cloud != "azure" or u.path != "/metadata/scheduledevents" or \
                        self.headers.get("Metadata") != "true":
                    return self.reply(404, "")
                try:
                    doc = json.loads(body)
                except ValueError:
                    with md.lock:
                        md.errors.append("StartRequests body is not JSON: %r" % body)
                    return self.reply(400, "")
                with md.lock:
                    md.acks.append(doc)
                    status = md.ack_status
                self.reply(status, "" if status == 200 else '{"error":"Bad request. '
                           'StartRequests has an unknown EventId"}', "application/json")

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.srv.handle_error = lambda *a: None  # a worker killed mid-request is expected
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.port = self.srv.server_address[1]

    def preempt(self, not_before):
        """GCE: instance/preempted reads TRUE. Azure: a Preempt event naming the VM."""
        with self.lock:
            if self.cloud == "gcp":
                self.preempted = True
                return None
            eid = str(uuid.uuid4()).upper()
            self.events.append({"EventId": eid, "EventType": "Preempt",
                                "ResourceType": "VirtualMachine", "Resources": [self.name],
                                "EventStatus": "Scheduled", "NotBefore": time.strftime(
                                    "%a, %d %b %Y %H:%M:%S GMT", time.gmtime(not_before)),
                                "Description": "", "EventSource": "Platform",
                                "DurationInSeconds": -1})
            self.incarnation += 1
            return eid


class BootShim:
    """Watches the fake's instances; runs each new one's startup-script (GCE metadata) or
    customData (Azure) with the image's paths mapped into a folder of its own and `spottrain`
    = the binary under test, with its own metadata server; kills the worker of an instance the
    fake no longer holds (the cloud deleted it)."""

    def __init__(self, fake, tmp):
        self.fake, self.tmp = fake, tmp
        self.gcp = isinstance(fake, GceFake)
        self.workers = {}  # name -> (Popen, Metadata, log path)
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def script_of(self, name, inst):
        if self.gcp:
            return {m["key"]: m["value"] for m in inst["metadata"]["items"]}["startup-script"]
        return base64.b64decode(self.fake.custom_data[name]).decode()

    def boot(self, name, inst):
        home = os.path.join(self.tmp, "inst-" + name)
        script = self.script_of(name, inst).replace("/var/lib/spottrain", home).replace(
            "exec spottrain ", "exec %s " % SPOTTRAIN)
        md = Metadata("gcp" if self.gcp else "azure", name)
        env = clean_env()
        if self.gcp:
            env["GCE_METADATA_HOST"] = "127.0.0.1:%d" % md.port
        else:
            env["AZURE_POD_IDENTITY_AUTHORITY_HOST"] = "http://127.0.0.1:%d" % md.port
        log = home + ".log"
        with open(log, "w") as f:
            p = subprocess.Popen(["sh", "-c", script], env=env, stdout=f,
                                 stderr=subprocess.STDOUT)
        self.workers[name] = (p, md, log)

    def loop(self):
        while not self.stop:
            with self.fake.lock:
                now = {k: json.loads(json.dumps(v)) for k, v in fake_instances(self.fake)}
            for name, inst in now.items():
                if name not in self.workers:
                    self.boot(name, inst)
            for name, (p, _, _) in self.workers.items():
                if name not in now and p.poll() is None:
                    p.kill()
            time.sleep(0.1)

    def close(self):
        self.stop = True
        self.t.join()
        for p, md, _ in self.workers.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            md.srv.shutdown()


TRAIN_SPEC = """apiVersion: spottrain/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  model: {{layers: 2, hidden: 32, heads: 2, vocab: 64, seq_len: 16}}
  data:
    train: {tmp}/data/train.bin
    synth: {{kind: markov, tokens: 4096}}
  training: {{global_batch: 4, micro_batch: 1, steps: {steps}}}
  fleet:
{fleet}
  coordinator: {{listen: "{coord}", advertise: "{coord}"}}
  status: {{listen: "{status}"}}
  checkpoint: {{interval: 0}}
"""


def job_events(status):
    """The messages of every event the job recorded so far (REST /v1/events, first page)."""
    import urllib.request
    try:
        with urllib.request.urlopen("http://%s/v1/events?since=0&limit=500" % status,
                                    timeout=5) as r:
            return [e.get("message", "") for e in json.loads(r.read())["events"]]
    except (OSError, ValueError):
        return []


def train(tmp, cloud, refuse_ack=False):
    """Launch trains through one preemption with notice to the end; bitwise equal to the
    local single-worker run."""
    # The survivor is frozen from the preemption until the coordinator has the notice, so
    # the job cannot end first however fast the machine; 4000 steps leave room after it.
    steps = 4000
    if cloud == "gcp":
        fake = GceFake(Discovery(), None)
        srv = serve(fake)
        port = srv.server_address[1]
        sa, pub = make_key(tmp, port)
        fake.pub = pub
        fleet = gcp_fleet(port, ["us-central1-a"])
        env = clean_env(GOOGLE_APPLICATION_CREDENTIALS=sa)
        name = "demo-gcp"
    else:
        fake = AzureFake("right-secret")
        srv = serve(fake)
        port = srv.server_address[1]
        fake.port = port
        fleet = azure_fleet(port, ["1"])
        env = clean_env(AZURE_TENANT_ID="tenant-1", AZURE_CLIENT_ID="client-1",
                        AZURE_CLIENT_SECRET="right-secret",
                        AZURE_AUTHORITY_HOST="http://127.0.0.1:%d" % port)
        name = "demo-az"
    fleet = [l if not l.startswith("max:") else "max: 2" for l in fleet]
    coord = "127.0.0.1:%d" % free_port()
    status = "127.0.0.1:%d" % free_port()
    spec = os.path.join(tmp, name + ".yaml")
    with open(spec, "w") as f:
        f.write(TRAIN_SPEC.format(name=name, tmp=tmp, steps=steps, coord=coord, status=status,
                                  fleet="\n".join("    " + l for l in fleet)))
    ref = os.path.join(tmp, "ref")
    p = subprocess.run([SPOTTRAIN, "train", "--local", "--dp", "1", "--pp", "1", "--save", ref,
                        spec], cwd=tmp, env=clean_env(), capture_output=True, text=True,
                       timeout=240)
    if p.returncode != 0:
        fail("reference run exited %d: %s" % (p.returncode, p.stderr[-400:]))
    shim = BootShim(fake, tmp)
    out_dir = os.path.join(tmp, "out")
    log = open(os.path.join(tmp, "launch.out"), "w+")
    proc = subprocess.Popen([SPOTTRAIN, "launch", spec, "--state-dir",
                             os.path.join(tmp, "state"), "--save", out_dir], cwd=tmp, env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True)

    def output():
        log.flush()
        with open(log.name) as f:
            return f.read()

    def failx(msg):
        for n, (_, _, wl) in shim.workers.items():
            with open(wl) as f:
                print("---- worker %s\n%s" % (n, f.read()[-3000:]))
        print("---- launch\n" + output()[-6000:])
        fail(msg)
    try:
        def step():
            if proc.poll() is not None:
                failx("launch exited %d early" % proc.returncode)
            m = re.findall(r"^progress: step (\d+)/", output(), re.M)
            return int(m[-1]) if m else 0
        wait_for(lambda: step() >= 10, "training past step 10", timeout=120)
        victim, survivor = sorted(shim.workers)
        wproc, md, wlog = shim.workers[victim]
        if refuse_ack:
            md.ack_status = 400
        eid = md.preempt(time.time() + 30)
        print("preempted %s (event %s)" % (victim, eid), flush=True)
        # Once the victim's worker has read the notice (its runner polls between steps), freeze
        # the survivor (its `sh -c` exec'd the worker: same pid) until the coordinator has
        # recorded the notice: no step is taken meanwhile, however fast the machine. The
        # victim's agent relays the notice with its next report (2.5 s at most) and the
        # coordinator decides epoch 2 for a step ahead, well inside the 10 s heartbeat deadline
        # the frozen one must meet.
        if not md.told.wait(60):
            failx("the victim's worker did not read its notice in 60 s")
        spid = shim.workers[survivor][0].pid
        os.kill(spid, signal.SIGSTOP)
        print("holding %s until the coordinator has decided on the notice" % survivor,
              flush=True)
        try:
            end = time.monotonic() + 8
            while not any(m.startswith("epoch 2: ") for m in job_events(status)):
                if time.monotonic() > end:
                    failx("no decision on %s's notice in 8 s; events: %s" % (
                        victim, job_events(status)[-12:]))
                time.sleep(0.05)
        finally:
            os.kill(spid, signal.SIGCONT)
        # The cloud deletes the instance when the notice runs out; on Azure the worker's
        # acknowledgement lets it go at once. The worker exits once its state has moved and the
        # coordinator stops it: the instance is deleted then (or after the 30 s of notice).
        if cloud == "azure":
            def acked():
                with md.lock:
                    return list(md.acks)
            wait_for(acked, "the worker's StartRequests for event %s" % eid, timeout=90)
            with md.lock:
                if md.acks != [{"StartRequests": [{"EventId": eid}]}] or md.errors:
                    failx("acknowledgements %s, errors %s" % (md.acks, md.errors))
            said = ("Cannot acknowledge event '%s': " % eid) if refuse_ack else \
                ("State left: acknowledged event '%s'" % eid)
            def told():
                with open(wlog) as f:
                    return said in f.read()
            wait_for(told, "the worker's line '%s'" % said)
            print("ok: the worker acknowledged its Preempt event %s%s" % (
                eid, " (refused: it logged it and went on)" if refuse_ack else ""), flush=True)
        else:
            end = time.monotonic() + 30
            while wproc.poll() is None and time.monotonic() < end:
                time.sleep(0.1)
        # The launch may have released it first: the noticed worker left, or the job ended
        # and the fleet was released (a 4000-step job of this tiny model takes a few seconds).
        with fake.lock:
            gone = (fake.instances if cloud == "gcp" else fake.vms).pop(victim, None) is None
        print("%s %s" % ("the launch had already deleted" if gone else "deleted", victim),
              flush=True)
        try:
            rc = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            failx("launch did not finish the job")
        out = output()
        if rc != 0:
            failx("launch exited %d" % rc)
        if "  steps              %d\n  samples committed  %d\n" % (steps, steps * 4) not in out:
            failx("the job did not commit %d steps and %d samples" % (steps, steps * 4))
        if "notices relayed    1 " not in out:
            failx("want exactly one notice relayed")
        # The noticed worker's state moved live to the survivor: one intra-stage migration
        # (2x1 -> 1x1), nothing restored, nothing lost.
        migs = re.findall(r"^epoch \d+: (.*), because .* was noticed$", out, re.M)
        if len(migs) != 1 or not migs[0].startswith("intra-stage migration 2x1 -> 1x1 at step "):
            failx("want one intra-stage migration 2x1 -> 1x1 for the notice: %s" % migs)
        if "  restores           0 from peer copies, 0 from checkpoints (0 and 0 steps " \
                "replayed), 0 fresh starts\n" not in out:
            failx("want no restore")
        print("\n".join(l for l in out.splitlines() if not l.startswith("progress")),
              flush=True)
        with fake.lock:
            if fake_instances(fake):
                failx("instances left after the job: %s" % [k for k, _ in
                                                             fake_instances(fake)])
        if fake.errors:
            failx("requests did not validate: %s" % fake.errors)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shim.close()
    p = subprocess.run([SPOTTRAIN, "ckpt", "diff", ref, out_dir], capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 0:
        fail("the launch's final state differs from train --local --dp 1 --pp 1: %s" % (
            p.stdout + p.stderr)[-600:])
    print("ok: %s launch trained %d steps through a preemption, bitwise equal to the local "
          "run" % (cloud, steps))


# ---- down, throttling, refusals -----------------------------------------------------------

def fake_for(tmp, cloud):
    """A fake with one zone, its spec and the environment with good credentials."""
    if cloud == "gcp":
        fake = GceFake(Discovery(), None)
        srv = serve(fake)
        port = srv.server_address[1]
        sa, pub = make_key(tmp, port)
        fake.pub = pub
        spec = write_spec(tmp, "demo-gcp", gcp_fleet(port, ["us-central1-a"]))
        return fake, spec, clean_env(GOOGLE_APPLICATION_CREDENTIALS=sa), "us-central1-a"
    fake = AzureFake("right-secret")
    srv = serve(fake)
    port = srv.server_address[1]
    fake.port = port
    spec = write_spec(tmp, "demo-az", azure_fleet(port, ["1"]))
    return fake, spec, clean_env(AZURE_TENANT_ID="tenant-1", AZURE_CLIENT_ID="client-1",
                                 AZURE_CLIENT_SECRET="right-secret",
                                 AZURE_AUTHORITY_HOST="http://127.0.0.1:%d" % port), "1"


def add_foreign(fake):
    """An instance of another job in the same zone: down must leave it."""
    if isinstance(fake, GceFake):
        base = "%s/%sprojects/test-proj/zones/us-central1-a" % (fake.d.root, fake.d.service)
        fake.instances["other-1"] = {"kind": "compute#instance", "name": "other-1",
                                     "status": "RUNNING", "zone": base, "id": "1",
                                     "labels": {"spottrain-job": "other",
                                                "spottrain-job-id": str(uuid.uuid4())}}
    else:
        fake.vms["other-1"] = {"name": "other-1", "id": "/x/other-1", "location": "westeurope",
                               "zones": ["1"], "tags": {"spottrain-job": "other",
                                                        "spottrain-job-id": str(uuid.uuid4())},
                               "properties": {"provisioningState": "Succeeded"}}


def down(spec, tmp, env):
    p = subprocess.run([SPOTTRAIN, "down", spec], cwd=tmp, env=env, capture_output=True,
                       text=True, timeout=DEADLINE)
    return p.returncode, p.stdout, p.stderr


def keep_down(tmp, cloud):
    fake, spec, env, _ = fake_for(tmp, cloud)
    fake.page_size = 2  # 3 instances of the job: every listing takes two pages
    add_foreign(fake)
    job = "demo-gcp" if cloud == "gcp" else "demo-az"
    proc = launch(spec, tmp, env, "--keep-fleet")

    def ours():
        with fake.lock:
            return sorted(k for k, _ in fake_instances(fake) if k != "other-1")
    def three():
        if proc.poll() is not None:
            out, err = proc.communicate()
            fail("launch exited %d early\n%s\n%s" % (proc.returncode, out, err))
        return len(ours()) == 3
    wait_for(three, "3 instances of the job")
    kept = ours()
    proc.send_signal(signal.SIGTERM)
    code, out, err = finish(proc)
    if code != 0 or ours() != kept:
        fail("launch --keep-fleet: exit %d, instances %s, want %s\n%s%s" % (code, ours(), kept,
                                                                           out, err))
    code, out, err = down(spec, tmp, env)
    if code != 0 or out != "down: job '%s': 3 instance(s) terminated\n" % job:
        fail("down: exit %d\nstdout:\n%s\nstderr:\n%s" % (code, out, err))
    with fake.lock:
        left = sorted(k for k, _ in fake_instances(fake))
    if left != ["other-1"]:
        fail("after down: %s, want only the other job's instance" % left)
    code, out, err = down(spec, tmp, env)
    if code != 0 or out != "down: job '%s': 0 instance(s) terminated\n" % job:
        fail("a second down: exit %d\nstdout:\n%s\nstderr:\n%s" % (code, out, err))
    if fake.pages == 0:
        fail("no listing was paged")
    if fake.errors:
        fail("requests did not validate: %s" % fake.errors)
    print("ok: %s --keep-fleet then down (twice), %d paged listings" % (cloud, fake.pages))


def throttled(tmp, cloud):
    fake, spec, env, zone = fake_for(tmp, cloud)
    fake.fail_next = 2
    fake.fail_status = 429
    launch_and_stop(fake, spec, tmp, env, 3, gce_labels if cloud == "gcp" else az_tags,
                    gce_zone if cloud == "gcp" else az_zone, zone)
    if fake.fail_next != 0:
        fail("the 429 answers were not all consumed")
    print("ok: %s: two 429 answers backed off and retried, the fleet is made" % cloud)


def forbidden(tmp, cloud):
    fake, spec, env, _ = fake_for(tmp, cloud)
    fake.forbid = "POST" if cloud == "gcp" else "PUT"
    t0 = time.monotonic()
    code, out, err = finish(launch(spec, tmp, env))
    want = ("refused (HTTP 403): forbidden: Required 'compute.instances.create' permission"
            if cloud == "gcp" else "refused (HTTP 403): AuthorizationFailed: The client "
            "'client-1'")
    lines = [l for l in err.splitlines() if "HTTP 403" in l]
    if code != 2 or len(lines) != 1 or want not in lines[0]:
        fail("%s: exit %d, want 2 and one line with '%s'\nstdout:\n%s\nstderr:\n%s" % (
            cloud, code, want, out, err))
    with fake.lock:
        if list(fake_instances(fake)):
            fail("instances exist after a refusal")
    print("ok: %s: 403 on create -> exit 2 in %.1f s: %s" % (cloud, time.monotonic() - t0,
                                                            lines[0].strip()))
    fake.forbid = "GET"
    code, out, err = down(spec, tmp, env)
    lines = [l for l in err.splitlines() if "HTTP 403" in l]
    if code != 2 or len(lines) != 1:
        fail("%s down refused: exit %d\nstdout:\n%s\nstderr:\n%s" % (cloud, code, out, err))
    print("ok: %s: down refused -> exit 2" % cloud)



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
         "gcp-retry": lambda: gcp_retry(tmp),
         "gcp-train": lambda: train(tmp, "gcp"),
         "azure-train": lambda: train(tmp, "azure"),
         "azure-train-ack-refused": lambda: train(tmp, "azure", refuse_ack=True),
         "gcp-keep-down": lambda: keep_down(tmp, "gcp"),
         "azure-keep-down": lambda: keep_down(tmp, "azure"),
         "gcp-throttled": lambda: throttled(tmp, "gcp"),
         "azure-throttled": lambda: throttled(tmp, "azure"),
         "gcp-forbidden": lambda: forbidden(tmp, "gcp"),
         "azure-forbidden": lambda: forbidden(tmp, "azure")}[scenario]()


if __name__ == "__main__":
    main()
