#!/usr/bin/env python3
"""Checkpoints in Google Cloud Storage (gs://BUCKET/PREFIX) and Azure Blob Storage
(az://ACCOUNT/CONTAINER/PREFIX) against loopback fakes built from the services' own definitions.

GCS: the fake takes every route, query parameter and answer shape from the JSON API's discovery
document storage.v1.json, which PyPI google-api-python-client ships
(googleapiclient/discovery_cache/documents/): objects.insert at the mediaUpload path
(uploadType media, or resumable: a session URI, chunks PUT with Content-Range, 308 until the
last), objects.get (alt=media, Range), objects.list (prefix, delimiter, pageToken: the fake pages
by 3), objects.delete. A query parameter the method does not declare is an error, and every
Object/Objects answer is validated against its schema (test_gcpaz.py's validator). Its token
endpoint verifies the service-account JWT (RS256) with google-auth against the key's public
half and wants the devstorage.read_write scope; a JWT signed with another key gets Google's
invalid_grant.

Azure: the fake speaks Blob REST (Put Blob, Put Block, Put Block List, Get Blob with x-ms-range,
List Blobs with prefix/delimiter/marker: pages of 3, Delete Blob) on an Azurite-style endpoint
http://127.0.0.1:PORT/ACCOUNT. Shapes come from PyPI azure-storage-blob: its generated models
parse every List Blobs answer the fake sends (ListBlobsHierarchySegmentResponse) and every
block list we send (BlockLookupList); a Shared Key signature is recomputed by the SDK's own
SharedKeyCredentialPolicy; x-ms-version must be one the SDK supports. Its token endpoint (the
Microsoft identity platform's v2.0 form) wants scope https://storage.azure.com/.default and
answers invalid_client / AADSTS7000215 for a wrong secret.

Scenarios (argv[1]), each for gs and az:
  {gs,az}-contract  train --local --steps 5 --save to the store and to a directory: the store
                    holds exactly the directory's files, byte-identical; `ckpt diff` gives max_rel
                    0; `ckpt verify` and `ckpt info` read the store copy; the two large layer
                    files went up in pieces (resumable chunks / staged blocks, counted by the
                    fake), the small ones in one request; the manifest was the last object
                    written; the secret/token is never printed
  {gs,az}-torn-prune  a committed step-5; a step-9 whose manifest never arrived; a step-11
                    whose layer upload the fake refuses (GCS: the last chunk, so the session is
                    cancelled; Azure: the Put Block List): train exits 1, no manifest, no object;
                    the restore lookup picks step 5; prune keep 1 with a committed step-7
                    removes step-5 only
  {gs,az}-corrupt   a flipped byte in a layer object: `ckpt verify` exits 1 naming the object
  {gs,az}-resume    `spottrain run` (sim fleet: a 2x1 and a spare) with checkpoint.dir in the
                    store: periodic checkpoints go to checkpoint.dir/JOB-ID; the fake kills both
                    positioned workers when the first manifest arrives (no notice, no copy
                    left), so the job restores from that checkpoint (one checkpoint restore at
                    its step, its manifest and layers read from the store) onto the spare and
                    ends bitwise equal to train --local --dp 1 --pp 1
  gs-bad-key        a key file whose private key is not the service account's: exit 2 with
                    invalid_grant, nothing trained, nothing written; `ckpt verify` exits 2 too
  az-bad-secret     a wrong AZURE_CLIENT_SECRET: exit 2 with invalid_client and AADSTS7000215
  az-shared-key     AZURE_STORAGE_KEY: every request signed with Shared Key (the SDK's policy
                    agrees); a wrong key: exit 2 with AuthenticationFailed
  gs-metadata       no key file: the token comes from a loopback metadata server
                    (GCE_METADATA_HOST, Metadata-Flavor: Google), once per process
  gs-anonymous      an emulator (STORAGE_EMULATOR_HOST) and no credentials at all: every
                    request goes without Authorization, as Google's libraries send them there
  {gs,az}-throttled the first two answers are 429 rateLimitExceeded / 503 ServerBusy: retried,
                    the checkpoint is written; a service that stays busy: 4 tries, then an
                    error naming the service's code
  bad-input         bad URLs, an http:// endpoint off loopback, a key that is not base64, no
                    credentials, an endpoint where nothing listens: `ckpt verify` exits 2 with
                    the reason
  {gs,az}-bad-answers  a listing that is not the API's (an HTML page, JSON for XML): exit 2
                    naming it; a resumable upload answered without a session URI: train exits
                    1 naming it, nothing committed

Every wait is a subprocess with a timeout. Needs SPOTTRAIN_BIN and SPOTTRAIN_S3_TOOL (the
restore lookup / retention helper, s3-ckpt-tool.c, which takes any store URL).
"""
import base64
import email.utils
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_gcpaz  # noqa: E402  (the discovery-schema validator, the service-account key)
from cloudtest import check, fail, run, tool, train, write_ckpt_spec  # noqa: E402
import cloudtest  # noqa: E402

BIN = os.environ["SPOTTRAIN_BIN"]
TOOL = os.environ["SPOTTRAIN_S3_TOOL"]
SCENARIO = sys.argv[1] if len(sys.argv) > 1 else ""
BUCKET = "spottrain-ckpt"
ACCOUNT, CONTAINER = "spottrainacct", "ckpt"
SECRET = "az-s3cr3t-never-printed"
CHUNK = 4 * 1024 * 1024  # GCS chunk / Azure block size the tests set (a multiple of 256 KiB)
PAGE = 3                 # the fakes page listings by 3, so paging is always walked
FAKE_KEY = base64.b64encode(b"spottrain-shared-key-0123456789abcdef" * 2).decode()


# ---- the GCS fake -------------------------------------------------------------------------

class StorageDiscovery(test_gcpaz.Discovery):
    def __init__(self):  # the same validator, on the Cloud Storage document
        import googleapiclient
        path = os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache",
                            "documents", "storage.v1.json")
        with open(path) as f:
            self.doc = json.load(f)
        self.schemas = self.doc["schemas"]
        self.service = "/" + self.doc["servicePath"]  # /storage/v1/


def template_regex(t):
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", t) + "$")


def listing(names, prefix, delim, kind):
    """A delimited listing as both services page it: in name order, (kind, name) for each name
    under prefix, and ("p", common prefix) once in place of the names a delimiter folds."""
    entries = []
    for n in sorted(names):
        if not n.startswith(prefix):
            continue
        rest = n[len(prefix):]
        if delim and delim in rest:
            p = prefix + rest.split(delim)[0] + delim
            if ("p", p) not in entries:
                entries.append(("p", p))
        else:
            entries.append((kind, n))
    return entries


class GcsFake:
    def __init__(self, pub):
        self.disc = StorageDiscovery()
        m = self.disc.doc["resources"]["objects"]["methods"]
        self.methods = {k: m[k] for k in ("insert", "get", "list", "delete")}
        # Uploads go to the mediaUpload path with uploadType, as googleapiclient sends them.
        self.routes = [
            ("POST", template_regex(m["insert"]["mediaUpload"]["protocols"]["simple"]["path"]),
             "insert"),
            ("PUT", template_regex(m["insert"]["mediaUpload"]["protocols"]["simple"]["path"]),
             "session"),
            ("DELETE", template_regex(m["insert"]["mediaUpload"]["protocols"]["simple"]["path"]),
             "cancel"),
            ("GET", template_regex(self.disc.service + m["list"]["path"]), "list"),
            ("GET", template_regex(self.disc.service + m["get"]["path"]), "get"),
            ("DELETE", template_regex(self.disc.service + m["delete"]["path"]), "delete")]
        self.globals = set(self.disc.doc["parameters"])
        self.pub = pub
        self.tokens = set()
        self.objects = {}   # name -> bytes
        self.sessions = {}  # upload_id -> {"name", "size", "data"}
        self.log = []       # (op, name, detail)
        self.errors = []
        self.refuse = None  # a name prefix whose last chunk / media upload answers 503
        self.throttle = 0   # the next N requests answer 429 (rateLimitExceeded)
        self.anonymous_ok = False  # an emulator that takes requests without credentials
        self.anonymous = 0  # requests that came without Authorization
        self.on_put = None  # called with an object's name once it exists (under the lock)
        self.garbage = set()  # answers to break: "no-location" (resumable), "list"
        self.requests = 0   # storage requests (not token requests)
        self.lock = threading.Lock()
        self.gen = 0

    def error(self, code, reason, message):
        return code, {"error": {"code": code, "message": message, "errors": [
            {"message": message, "domain": "global", "reason": reason}]}}

    def resource(self, name):
        self.gen += 1
        data = self.objects[name]
        o = {"kind": "storage#object", "id": "%s/%s/%d" % (BUCKET, name, self.gen),
             "name": name, "bucket": BUCKET, "generation": str(self.gen),
             "metageneration": "1", "contentType": "application/octet-stream",
             "size": str(len(data)), "storageClass": "STANDARD",
             "timeCreated": "2024-01-01T00:00:00.000Z", "updated": "2024-01-01T00:00:00.000Z",
             "etag": "CAE="}
        errs = []
        self.disc.validate(o, {"$ref": "Object"}, "Object", errs)
        self.errors += errs
        return o

    def token(self, form):
        import google.auth.jwt
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return 400, {"error": "unsupported_grant_type"}
        try:
            claims = google.auth.jwt.decode(form.get("assertion", ""), certs=self.pub,
                                            verify=True, clock_skew_in_seconds=10 ** 6)
        except Exception as e:
            return 400, {"error": "invalid_grant",
                         "error_description": "Invalid JWT Signature. (%s)" % e}
        if claims.get("scope") != "https://www.googleapis.com/auth/devstorage.read_write":
            return 400, {"error": "invalid_scope", "error_description": "bad scope %s" %
                         claims.get("scope")}
        tok = "ya29.gcs-" + uuid.uuid4().hex
        self.tokens.add(tok)
        return 200, {"access_token": tok, "expires_in": 3599, "token_type": "Bearer"}

    def metadata_token(self, headers):
        if headers.get("Metadata-Flavor") != "Google":
            return 403, {"error": "missing Metadata-Flavor"}
        tok = "ya29.md-" + uuid.uuid4().hex
        self.tokens.add(tok)
        self.log.append(("metadata-token", "", ""))
        return 200, {"access_token": tok, "expires_in": 3599, "token_type": "Bearer"}

    def params_ok(self, method, query, extra=()):
        declared = set(self.methods[method]["parameters"]) | self.globals | set(extra)
        for k in query:
            if k not in declared:
                self.errors.append("%s: query parameter %r is not in storage.v1.json" %
                                   (method, k))
                return False
        return True

    def handle(self, method, path, query, headers, body):
        with self.lock:
            return self._handle(method, path, query, headers, body)

    def _handle(self, method, path, query, headers, body):
        if path == "/token" and method == "POST":
            return self.token(dict(urllib.parse.parse_qsl(body.decode())))
        if path == "/computeMetadata/v1/instance/service-accounts/default/token":
            return self.metadata_token(headers)
        self.requests += 1
        auth = headers.get("Authorization", "")
        if not auth and self.anonymous_ok:
            self.anonymous += 1
        elif not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
            return self.error(401, "authError", "Invalid Credentials")
        if self.throttle:
            self.throttle -= 1
            self.log.append(("throttled", path, ""))
            return self.error(429, "rateLimitExceeded", "The rate of change requests to the "
                              "object exceeds the rate limit.")
        for verb, rx, op in self.routes:
            m = rx.match(path)
            if verb != method or not m:
                continue
            if urllib.parse.unquote(m.group("bucket")) != BUCKET:
                return self.error(404, "notFound", "The specified bucket does not exist.")
            return getattr(self, "op_" + op)(m, query, headers, body)
        self.errors.append("no storage.v1.json method for %s %s" % (method, path))
        return self.error(404, "notFound", "Not Found")

    def op_insert(self, m, query, headers, body):
        self.params_ok("insert", query)
        name, kind = query.get("name", ""), query.get("uploadType")
        if not name:
            return self.error(400, "required", "Required parameter: name")
        if kind == "media":
            if self.refuse and name.startswith(self.refuse):
                return self.error(503, "backendError", "Backend Error")
            self.objects[name] = body
            self.log.append(("media", name, len(body)))
            if self.on_put:
                self.on_put(name)
            return 200, self.resource(name)
        if kind == "resumable":
            if "no-location" in self.garbage:
                return 200, None
            # The session's metadata: the method's request schema (Object), as JSON.
            if not headers.get("Content-Type", "").startswith("application/json"):
                self.errors.append("resumable initiation with Content-Type %r" %
                                   headers.get("Content-Type"))
            errs = []
            self.disc.validate(json.loads(body or b"{}"), self.methods["insert"]["request"],
                               "Object", errs)
            self.errors += errs
            uid = uuid.uuid4().hex
            size = int(headers.get("X-Upload-Content-Length", "-1"))
            self.sessions[uid] = {"name": name, "size": size, "data": bytearray()}
            self.log.append(("session", name, size))
            loc = "http://%s%s?uploadType=resumable&upload_id=%s" % (
                headers.get("Host"), m.group(0), uid)
            return 200, None, {"Location": loc}
        return self.error(400, "invalid", "Invalid upload type %r" % kind)

    def op_session(self, m, query, headers, body):
        self.params_ok("insert", query, ["upload_id"])
        s = self.sessions.get(query.get("upload_id"))
        if not s:
            return self.error(404, "notFound", "No such upload session")
        cr = re.match(r"^bytes (\d+)-(\d+)/(\d+)$", headers.get("Content-Range", ""))
        if not cr:
            return self.error(400, "invalid", "bad Content-Range %r" %
                              headers.get("Content-Range"))
        a, b, total = int(cr.group(1)), int(cr.group(2)), int(cr.group(3))
        if a != len(s["data"]) or b - a + 1 != len(body) or total != s["size"]:
            self.errors.append("chunk %d-%d/%d of %s does not follow %d bytes" %
                               (a, b, total, s["name"], len(s["data"])))
            return self.error(400, "invalid", "bad chunk")
        last = b + 1 == total
        if not last and len(body) % (256 * 1024):
            self.errors.append("a chunk that is not the last is not a multiple of 256 KiB")
            return self.error(400, "invalid", "bad chunk size")
        if last and self.refuse and s["name"].startswith(self.refuse):
            return self.error(503, "backendError", "Backend Error")
        s["data"] += body
        self.log.append(("chunk", s["name"], len(body)))
        if not last:
            return 308, None, {"Range": "bytes=0-%d" % b}
        self.objects[s["name"]] = bytes(s["data"])
        del self.sessions[query["upload_id"]]
        return 200, self.resource(s["name"])

    def op_cancel(self, m, query, headers, body):
        s = self.sessions.pop(query.get("upload_id"), None)
        self.log.append(("cancel", s["name"] if s else "", ""))
        return 499, None

    def op_get(self, m, query, headers, body):
        self.params_ok("get", query)
        name = urllib.parse.unquote(m.group("object"))
        if query.get("alt") != "media":
            self.errors.append("objects.get without alt=media")
        if name not in self.objects:
            return self.error(404, "notFound", "No such object: %s/%s" % (BUCKET, name))
        data = self.objects[name]
        rg = re.match(r"^bytes=(\d+)-(\d*)$", headers.get("Range", ""))
        self.log.append(("get", name, rg.group(0) if rg else ""))
        if rg:
            a = int(rg.group(1))
            b = min(int(rg.group(2)) if rg.group(2) else len(data) - 1, len(data) - 1)
            return 206, data[a:b + 1], {"Content-Range": "bytes %d-%d/%d" % (a, b, len(data))}
        return 200, data

    def op_list(self, m, query, headers, body):
        self.params_ok("list", query)
        if "list" in self.garbage:
            return 200, b"<html>a proxy's error page</html>", {"Content-Type": "text/html"}
        prefix, delim = query.get("prefix", ""), query.get("delimiter", "")
        entries = listing(self.objects, prefix, delim, "o")
        start = int(query.get("pageToken", "0"))
        page = entries[start:start + PAGE]
        out = {"kind": "storage#objects"}
        items = [self.resource(n) for k, n in page if k == "o"]
        prefixes = [n for k, n in page if k == "p"]
        if items:
            out["items"] = items
        if prefixes:
            out["prefixes"] = prefixes
        if start + PAGE < len(entries):
            out["nextPageToken"] = str(start + PAGE)
        errs = []
        self.disc.validate(out, {"$ref": "Objects"}, "Objects", errs)
        self.errors += errs
        self.log.append(("list", prefix, start))
        return 200, out

    def op_delete(self, m, query, headers, body):
        self.params_ok("delete", query)
        name = urllib.parse.unquote(m.group("object"))
        if name not in self.objects:
            return self.error(404, "notFound", "No such object: %s/%s" % (BUCKET, name))
        del self.objects[name]
        self.log.append(("delete", name, ""))
        return 204, None


# ---- the Azure Blob fake ------------------------------------------------------------------

def xml_error(status, code, message):
    body = ('<?xml version="1.0" encoding="utf-8"?><Error><Code>%s</Code><Message>%s\n'
            'RequestId:%s\nTime:2024-01-01T00:00:00.0000000Z</Message></Error>' %
            (code, message, uuid.uuid4()))
    return status, body.encode(), {"x-ms-error-code": code, "Content-Type": "application/xml"}


class BlobFake:
    def __init__(self, shared_key=None):
        from azure.storage.blob._serialize import _SUPPORTED_API_VERSIONS
        self.versions = set(_SUPPORTED_API_VERSIONS)
        self.shared_key = shared_key
        self.tokens = set()
        self.blobs = {}    # name -> bytes
        self.staged = {}   # name -> {block id: bytes}
        self.log = []
        self.errors = []
        self.refuse = None  # a name prefix whose Put Block List / Put Blob answers 503
        self.throttle = 0   # the next N requests answer 503 ServerBusy
        self.on_put = None  # called with a blob's name once it exists (under the lock)
        self.garbage = set()  # answers to break: "list"
        self.lock = threading.Lock()
        self.port = 0

    def token(self, form):
        if form.get("client_secret") != SECRET:
            return 401, {"error": "invalid_client",
                         "error_description": "AADSTS7000215: Invalid client secret provided. "
                         "Ensure the secret being sent in the request is the client secret "
                         "value, not the client secret ID, for a secret added to app '%s'." %
                         form.get("client_id"), "error_codes": [7000215]}
        if form.get("grant_type") != "client_credentials" or \
                form.get("scope") != "https://storage.azure.com/.default":
            return 400, {"error": "invalid_scope",
                         "error_description": "AADSTS70011: bad scope %s" % form.get("scope")}
        tok = "eyJ0eXAi.blob." + uuid.uuid4().hex
        self.tokens.add(tok)
        return 200, {"token_type": "Bearer", "expires_in": 3599, "access_token": tok}

    def signature_ok(self, method, raw_path, headers):
        """The SDK's own Shared Key policy, run on the request as it arrived."""
        from azure.core.pipeline import PipelineContext, PipelineRequest
        from azure.core.pipeline.transport import HttpRequest
        from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy
        hdrs = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        req = HttpRequest(method, "http://127.0.0.1:%d%s" % (self.port, raw_path),
                          headers=hdrs)
        SharedKeyCredentialPolicy(ACCOUNT, self.shared_key).on_request(
            PipelineRequest(req, PipelineContext(None)))
        return req.headers["Authorization"] == headers.get("Authorization")

    def handle(self, method, path, query, headers, body, raw_path=""):
        with self.lock:
            return self._handle(method, path, query, headers, body, raw_path)

    def _handle(self, method, path, query, headers, body, raw_path):
        mt = re.match(r"^/([^/]+)/oauth2/v2\.0/token$", path)
        if mt and method == "POST":
            return self.token(dict(urllib.parse.parse_qsl(body.decode())))
        if headers.get("x-ms-version") not in self.versions and \
                headers.get("x-ms-version", "9999") > max(self.versions):
            self.errors.append("x-ms-version %r" % headers.get("x-ms-version"))
            return xml_error(400, "InvalidHeaderValue", "The value for x-ms-version is invalid.")
        if not headers.get("x-ms-date"):
            return xml_error(403, "AuthenticationFailed", "x-ms-date is required.")
        auth = headers.get("Authorization", "")
        if self.shared_key:
            if not auth.startswith("SharedKey %s:" % ACCOUNT) or \
                    not self.signature_ok(method, raw_path, headers):
                return xml_error(403, "AuthenticationFailed", "Server failed to authenticate "
                                 "the request. Make sure the value of Authorization header is "
                                 "formed correctly including the signature.")
        elif not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
            return xml_error(401, "InvalidAuthenticationInfo",
                             "Authentication information is not given in the correct format.")
        if self.throttle:
            self.throttle -= 1
            self.log.append(("throttled", path, ""))
            return xml_error(503, "ServerBusy", "The server is busy.")
        parts = path.split("/", 3)  # "", account, container, blob
        if len(parts) < 3 or parts[1] != ACCOUNT:
            return xml_error(400, "InvalidUri", "The requested URI does not represent any "
                             "resource on the server.")
        if parts[2] != CONTAINER:
            return xml_error(404, "ContainerNotFound", "The specified container does not exist.")
        if len(parts) == 3:
            if method == "GET" and query.get("restype") == "container" and \
                    query.get("comp") == "list":
                return self.list_blobs(query)
            return xml_error(400, "InvalidQueryParameterValue", "unsupported container call")
        name = urllib.parse.unquote(parts[3])
        comp = query.get("comp")
        if method == "PUT" and comp == "block":
            bid = query.get("blockid", "")
            if int(headers.get("Content-Length", "0")) != len(body):
                return xml_error(400, "InvalidHeaderValue", "Content-Length")
            self.staged.setdefault(name, {})[bid] = body
            self.log.append(("block", name, len(body)))
            return 201, b""
        if method == "PUT" and comp == "blocklist":
            from azure.storage.blob._generated.models import BlockLookupList
            ids = BlockLookupList.deserialize(body.decode(), content_type="application/xml").latest
            staged = self.staged.get(name, {})
            if not ids or any(i not in staged for i in ids):
                return xml_error(400, "InvalidBlockList", "The specified block list is invalid.")
            if len({len(i) for i in ids}) != 1:
                return xml_error(400, "InvalidBlockId", "block ids of different lengths")
            if self.refuse and name.startswith(self.refuse):
                return xml_error(503, "ServerBusy", "The server is busy.")
            self.blobs[name] = b"".join(staged[i] for i in ids)
            del self.staged[name]
            self.log.append(("blocklist", name, len(ids)))
            return 201, b""
        if method == "PUT" and comp is None:
            if headers.get("x-ms-blob-type") != "BlockBlob":
                return xml_error(400, "MissingRequiredHeader", "x-ms-blob-type")
            if self.refuse and name.startswith(self.refuse):
                return xml_error(503, "ServerBusy", "The server is busy.")
            self.blobs[name] = body
            self.log.append(("put", name, len(body)))
            if self.on_put:
                self.on_put(name)
            return 201, b""
        if method == "GET" and comp is None:
            if name not in self.blobs:
                return xml_error(404, "BlobNotFound", "The specified blob does not exist.")
            data = self.blobs[name]
            rg = re.match(r"^bytes=(\d+)-(\d*)$", headers.get("x-ms-range", ""))
            self.log.append(("get", name, rg.group(0) if rg else ""))
            if rg:
                a = int(rg.group(1))
                b = min(int(rg.group(2)) if rg.group(2) else len(data) - 1, len(data) - 1)
                return 206, data[a:b + 1], {"Content-Range": "bytes %d-%d/%d" %
                                            (a, b, len(data))}
            return 200, data
        if method == "DELETE" and comp is None:
            if name not in self.blobs:
                return xml_error(404, "BlobNotFound", "The specified blob does not exist.")
            del self.blobs[name]
            self.log.append(("delete", name, ""))
            return 202, b""
        return xml_error(400, "UnsupportedHttpVerb", "%s %s" % (method, path))

    def list_blobs(self, query):
        from azure.storage.blob._generated.models import ListBlobsHierarchySegmentResponse
        if "list" in self.garbage:
            return 200, b'{"not": "xml"}', {"Content-Type": "application/json"}
        prefix, delim = query.get("prefix", ""), query.get("delimiter", "")
        entries = listing(self.blobs, prefix, delim, "b")
        start = int(query.get("marker") or "0")
        page = entries[start:start + PAGE]
        nxt = str(start + PAGE) if start + PAGE < len(entries) else ""
        esc = lambda s: s.replace("&", "&amp;").replace("<", "&lt;")  # noqa: E731
        items = "".join(
            "<Blob><Name>%s</Name><Deleted>false</Deleted><Snapshot></Snapshot><Properties>"
            "<Last-Modified>Mon, 01 Jan 2024 00:00:00 GMT</Last-Modified><Etag>0x8D0</Etag>"
            "<Content-Length>%d</Content-Length><BlobType>BlockBlob</BlobType></Properties>"
            "</Blob>" % (esc(n), len(self.blobs[n])) if k == "b" else
            "<BlobPrefix><Name>%s</Name></BlobPrefix>" % esc(n) for k, n in page)
        xml = ('<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint='
               '"http://127.0.0.1:%d/%s/" ContainerName="%s"><Prefix>%s</Prefix>%s'
               '<Delimiter>%s</Delimiter><Blobs>%s</Blobs><NextMarker>%s</NextMarker>'
               '</EnumerationResults>' % (self.port, ACCOUNT, CONTAINER, esc(prefix),
                                          "<Marker>%s</Marker>" % start if start else "",
                                          esc(delim), items, nxt))
        r = ListBlobsHierarchySegmentResponse.deserialize(xml, content_type="application/xml")
        got = [b.name.content for b in r.segment.blob_items or []] + \
              [p.name.content for p in r.segment.blob_prefixes or []]
        if sorted(got) != sorted(n for _, n in page) or (r.next_marker or "") != nxt:
            self.errors.append("our List Blobs answer does not parse as the SDK's model")
        self.log.append(("list", prefix, start))
        return 200, xml.encode(), {"Content-Type": "application/xml"}


# ---- the server, the spec, the runs -------------------------------------------------------

def serve(fake):
    def answer(h, path, q, body):
        if isinstance(fake, BlobFake):
            out = fake.handle(h.command, path, q, h.headers, body, h.path)
        else:
            out = fake.handle(h.command, path, q, h.headers, body)
        status, obj = out[0], out[1]
        extra = out[2] if len(out) > 2 else {}
        if isinstance(obj, (dict, list)):
            data, ctype = json.dumps(obj).encode(), "application/json; charset=UTF-8"
        else:
            data, ctype = obj or b"", "application/octet-stream"
        headers = {}
        if "Content-Type" not in extra and data:
            headers["Content-Type"] = ctype
        if h.path.startswith("/computeMetadata/"):
            headers["Metadata-Flavor"] = "Google"
        headers.update(extra)
        return status, data, headers

    srv = cloudtest.serve(answer, http11=True, keep_blank=True)
    if isinstance(fake, BlobFake):
        fake.port = srv.server_address[1]
    return srv


def write_spec(d, url, hidden=32):
    # The fleet of the store's own cloud (train --local never contacts it).
    fleet = test_gcpaz.gcp_fleet(1, ["us-central1-a"]) if url.startswith("gs://") else \
        test_gcpaz.azure_fleet(1, ["1"])
    return write_ckpt_spec(d, "store-ckpt", hidden, fleet, url)


class Cloud:
    """What a scenario needs of one store: its URL, its environment, its objects."""

    def __init__(self, kind, d, shared_key=False, metadata=False, wrong=False):
        self.kind, self.d = kind, d
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GOOGLE_", "GCE_", "AZURE_", "STORAGE_", "AWS_"))}
        env.update({"HOME": d, "TMPDIR": d, "SPOTTRAIN_GS_CHUNK_BYTES": str(CHUNK),
                    "SPOTTRAIN_AZ_BLOCK_BYTES": str(CHUNK)})
        if kind == "gs":
            key, pub = test_gcpaz.make_key(d, 0)  # token_uri fixed below
            self.fake = GcsFake(pub)
            self.srv = serve(self.fake)
            port = self.srv.server_address[1]
            with open(key) as f:
                sa = json.load(f)
            sa["token_uri"] = "http://127.0.0.1:%d/token" % port
            if wrong:  # a private key that is not the service account's
                other = os.path.join(d, "other.pem")
                subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                                "rsa_keygen_bits:2048", "-out", other], check=True,
                               capture_output=True)
                with open(other) as f:
                    sa["private_key"] = f.read()
            with open(key, "w") as f:
                json.dump(sa, f)
            env["STORAGE_EMULATOR_HOST"] = "127.0.0.1:%d" % port
            if metadata:
                env["GCE_METADATA_HOST"] = "127.0.0.1:%d" % port
            else:
                env["GOOGLE_APPLICATION_CREDENTIALS"] = key
            self.root = "gs://%s" % BUCKET
        else:
            self.fake = BlobFake(FAKE_KEY if shared_key else None)
            self.srv = serve(self.fake)
            port = self.srv.server_address[1]
            env["AZURE_STORAGE_ENDPOINT"] = "http://127.0.0.1:%d/%s" % (port, ACCOUNT)
            if shared_key:
                env["AZURE_STORAGE_KEY"] = FAKE_KEY if not wrong else \
                    base64.b64encode(b"not-the-account-key-0123456789").decode()
            else:
                env.update({"AZURE_TENANT_ID": "tenant-1", "AZURE_CLIENT_ID": "client-1",
                            "AZURE_CLIENT_SECRET": SECRET + ("-wrong" if wrong else ""),
                            "AZURE_AUTHORITY_HOST": "http://127.0.0.1:%d" % port,
                            # never the machine's own IMDS
                            "AZURE_POD_IDENTITY_AUTHORITY_HOST": "http://127.0.0.1:1"})
            self.root = "az://%s/%s" % (ACCOUNT, CONTAINER)
        self.env = env

    def url(self, prefix):
        return self.root + "/" + prefix

    def store(self):
        return self.fake.objects if self.kind == "gs" else self.fake.blobs

    def keys(self, prefix):
        with self.fake.lock:
            return sorted(k for k in self.store() if k.startswith(prefix))

    def put_dir(self, src, dst, skip=()):
        with self.fake.lock:
            for n in sorted(os.listdir(src)):
                if n not in skip:
                    with open(os.path.join(src, n), "rb") as f:
                        self.store()[dst + "/" + n] = f.read()

    def stop(self):
        self.srv.shutdown()
        check(not self.fake.errors, "the fake saw only requests its definitions allow: %s" %
              self.fake.errors[:5])


def t_contract(c):
    d = c.d
    spec = write_spec(d, c.url("job"), hidden=256)  # two layer files of ~9.5 MB: 3 pieces
    local = os.path.join(d, "local")
    rc, o, e = train(spec, local, c.env)
    check(rc == 0, "train --save DIR (%s)" % e.strip()[-300:])
    rc, o, e = train(spec, c.url("run"), c.env)
    check(rc == 0 and "saved checkpoint %s (step 5)" % c.url("run") in o,
          "train --local --steps 5 --save %s (%s)" % (c.url("run"), e.strip()[-300:]))
    names = sorted(os.listdir(local))
    check(c.keys("run/") == ["run/" + n for n in names],
          "the store holds exactly the local directory's files: %s" % c.keys("run/"))
    for n in names:
        with open(os.path.join(local, n), "rb") as f:
            check(f.read() == c.store()["run/" + n],
                  "object run/%s is byte-identical to the local file" % n)
    sizes = {n: os.path.getsize(os.path.join(local, n)) for n in names}
    big = sorted(n for n in names if sizes[n] > CHUNK)
    check(len(big) == 2, "two layer files are larger than a chunk: %s" % big)
    log = [x for x in c.fake.log if x[1].startswith("run/")]
    piece = "chunk" if c.kind == "gs" else "block"
    whole = "media" if c.kind == "gs" else "put"
    for n in names:
        want = (sizes[n] + CHUNK - 1) // CHUNK
        pieces = [x for x in log if x[0] == piece and x[1] == "run/" + n]
        wholes = [x for x in log if x[0] == whole and x[1] == "run/" + n]
        if n in big:
            check(len(pieces) == want and not wholes and
                  [x[2] for x in pieces] == [CHUNK] * (want - 1) + [sizes[n] - CHUNK * (want - 1)],
                  "run/%s went up in %d pieces of %d bytes" % (n, want, CHUNK))
        else:
            check(len(wholes) == 1 and not pieces, "run/%s went up in one request" % n)
    if c.kind == "az":
        commits = [x for x in log if x[0] == "blocklist"]
        check(sorted(x[1] for x in commits) == ["run/" + n for n in big],
              "each large file was committed by one Put Block List: %s" % commits)
    done = [x[1] for x in log if x[0] in ("media", "put", "blocklist") or
            (x[0] == "chunk" and c.store().get(x[1]) is not None)]
    check(done[-1] == "run/manifest.json", "the manifest was the last object written: %s" %
          done[-3:])
    check(not [n for n in os.listdir(d) if n.startswith("spottrain-ckpt-")],
          "no staging directory is left behind")
    rc, o, e = run(["ckpt", "diff", local, c.url("run")], c.env)
    check(rc == 0 and "max_rel 0," in o, "ckpt diff DIR %s: max_rel 0 (%s%s)" %
          (c.url("run"), o, e))
    rc, o, e = run(["ckpt", "verify", c.url("run")], c.env)
    check(rc == 0 and o.startswith("ok: %s: 4 layers, every checksum matches" % c.url("run")),
          "ckpt verify %s: %s%s" % (c.url("run"), o, e))
    rc, o, e = run(["ckpt", "info", c.url("run")], c.env)
    lrc, lo, le = run(["ckpt", "info", local], c.env)
    check(rc == 0 and lrc == 0 and o.replace(c.url("run"), "X") == lo.replace(local, "X"),
          "ckpt info reads the same from the store as from the directory")
    secrets = [t for t in getattr(c.fake, "tokens", ())] + [SECRET, FAKE_KEY]
    check(not [s for s in secrets if s in o + e], "no token, secret or key is printed")
    other = c.url("run").replace(BUCKET if c.kind == "gs" else CONTAINER, "nosuch")
    word = "notFound: The specified bucket does not exist." if c.kind == "gs" else \
        "ContainerNotFound: The specified container does not exist."
    rc, o, e = run(["ckpt", "verify", other], c.env)
    check(rc == 2 and word in e and "No such device or address" in e,
          "ckpt verify of a bucket/container that does not exist: exit 2 with %r (%s)" %
          (word, e.strip()[-300:]))


def t_torn_prune(c):
    d = c.d
    spec = write_spec(d, c.url("job"), hidden=256)
    rc, o, e = train(spec, c.url("root/step-5"), c.env)
    check(rc == 0, "train --save %s (%s)" % (c.url("root/step-5"), e.strip()[-300:]))
    src = os.path.join(d, "src")
    rc, o, e = train(spec, src, c.env)
    check(rc == 0, "train --save DIR")
    c.put_dir(src, "root/step-9", skip=("manifest.json",))  # an upload that was cut short
    # A real torn upload: the service refuses the end of one layer file of step-11 (GCS: its
    # last chunk, Azure: its Put Block List) on every try.
    c.fake.refuse = "root/step-11/layer-0001"
    rc, o, e = train(spec, c.url("root/step-11"), c.env)
    c.fake.refuse = None
    check(rc == 1 and "saved checkpoint" not in o,
          "train --save whose upload the store refuses exits 1 (rc %d: %s)" % (rc, e.strip()[-300:]))
    check("root/step-11/layer-0001.bin" not in c.store() and
          "root/step-11/manifest.json" not in c.store(),
          "the refused file and the manifest do not exist: %s" % c.keys("root/step-11/"))
    if c.kind == "gs":
        check([x for x in c.fake.log if x[0] == "cancel" and
               x[1] == "root/step-11/layer-0001.bin"] and not c.fake.sessions,
              "the resumable session was cancelled")
    rc, o, e = tool(["latest", c.url("root")], c.env)
    check(rc == 0 and o == "latest 5 %s\n" % c.url("root/step-5"),
          "the restore lookup skips the torn step-9 and step-11 and picks step 5: %r %s" %
          (o, e.strip()[-300:]))
    check("manifest.json missing" in e, "and says why the torn ones were skipped")
    rc, o, e = tool(["latest", c.url("nothing")], c.env)
    check(rc == 0 and o.startswith("latest none ("), "an empty prefix has no latest: %r" % o)
    c.put_dir(src, "root/step-7")
    rc, o, e = tool(["prune", c.url("root"), "1"], c.env)
    check(rc == 0 and o == "pruned 1\n", "prune keep 1 removes one: %r %s" %
          (o, e.strip()[-300:]))
    left = c.keys("root/")
    n = len(os.listdir(src))
    torn11 = len(c.keys("root/step-11/"))
    check(len(left) == 2 * n - 1 + torn11 and not [k for k in left if k.startswith("root/step-5/")],
          "step-5 is gone; step-7 (committed), step-9 and step-11 (maybe uploading) stay: %s"
          % left)
    rc, o, e = tool(["latest", c.url("root")], c.env)
    check(o == "latest 5 %s\n" % c.url("root/step-7"), "latest is now step-7: %r" % o)


def t_corrupt(c):
    spec = write_spec(c.d, c.url("job"))
    rc, o, e = train(spec, c.url("run"), c.env)
    check(rc == 0, "train --save %s (%s)" % (c.url("run"), e.strip()[-300:]))
    k = "run/layer-0001.bin"
    with c.fake.lock:
        body = bytearray(c.store()[k])
        body[len(body) // 2] ^= 0x40
        c.store()[k] = bytes(body)
    rc, o, e = run(["ckpt", "verify", c.url("run")], c.env)
    lines = [l for l in e.splitlines() if "checksum mismatch" in l]
    check(rc == 1 and len(lines) == 1 and
          "'%s': checksum mismatch: file says" % c.url(k) in lines[0],
          "ckpt verify exits 1 naming the object and the failed check: rc %d, %s" % (rc, e))


def t_refused(c, code_words, secret):
    spec = write_spec(c.d, c.url("job"))
    rc, o, e = train(spec, c.url("run"), c.env)
    check(rc == 2, "train --save %s with bad credentials exits 2 (rc %d: %s)" %
          (c.url("run"), rc, e.strip()[-400:]))
    lines = [l for l in e.splitlines() if all(w in l for w in code_words)]
    check(len(lines) == 1, "one error line carries the service's error %s: %s" %
          (code_words, e.strip()[-600:]))
    check("step 1/" not in o, "nothing was trained")
    check(not c.store(), "nothing was written")
    check(not secret or secret not in o + e, "the secret is not printed")
    rc, o, e = run(["ckpt", "verify", c.url("run")], c.env)
    check(rc == 2 and all(w in e for w in code_words), "ckpt verify exits 2 too: %s" %
          e.strip()[-300:])


def t_gs_bad_key(c):
    t_refused(c, ["invalid_grant", "Invalid JWT Signature"], None)


def t_az_bad_secret(c):
    t_refused(c, ["invalid_client", "AADSTS7000215"], SECRET + "-wrong")


def t_az_shared_key(d):
    c = Cloud("az", d, shared_key=True)
    try:
        spec = write_spec(d, c.url("job"), hidden=256)  # Put Block and Put Block List too
        rc, o, e = train(spec, c.url("run"), c.env)
        check(rc == 0, "train --save az:// signed with Shared Key (%s)" % e.strip()[-300:])
        ops = sorted({x[0] for x in c.fake.log})
        check(ops == ["block", "blocklist", "get", "list", "put"], "List Blobs and Get Blob "
              "(the checks before training), Put Blob, Put Block and Put Block List were all "
              "signed as the SDK signs them: %s" % ops)
        rc, o, e = run(["ckpt", "verify", c.url("run")], c.env)
        check(rc == 0, "ckpt verify reads with Shared Key: %s%s" % (o, e))
        del c.fake.log[:]
        rc, o, e = run(["ckpt", "info", c.url("run")], c.env)
        ranged = sorted(x[1] for x in c.fake.log if x[0] == "get" and x[2])
        check(rc == 0 and ranged == ["run/layer-%04d.bin" % i for i in range(4)],
              "ckpt info reads each layer's header with a signed x-ms-range: %s %s" %
              (ranged, e.strip()[-300:]))
        check(FAKE_KEY not in o + e, "the key is not printed")
    finally:
        c.stop()
    c = Cloud("az", os.path.join(d, "wrong"), shared_key=True, wrong=True)
    try:
        t_refused(c, ["refused: AuthenticationFailed", "HTTP 403"], c.env["AZURE_STORAGE_KEY"])
    finally:
        c.stop()


def t_gs_metadata(c):
    spec = write_spec(c.d, c.url("job"))
    rc, o, e = train(spec, c.url("run"), c.env)
    check(rc == 0, "train --save gs:// with the metadata server's token (%s)" %
          e.strip()[-300:])
    rc, o, e = run(["ckpt", "verify", c.url("run")], c.env)
    check(rc == 0, "ckpt verify: %s%s" % (o, e))
    asked = len([x for x in c.fake.log if x[0] == "metadata-token"])
    check(asked == 2, "one token per process (train, verify): %d" % asked)


def t_throttled(c):
    spec = write_spec(c.d, c.url("job"))
    c.fake.throttle = 2
    rc, o, e = train(spec, c.url("run"), c.env)
    check(rc == 0, "train --save with the first two answers throttled (%s)" % e.strip()[-300:])
    check(len([x for x in c.fake.log if x[0] == "throttled"]) == 2 and c.fake.throttle == 0,
          "both throttled answers were retried")
    rc, o, e = run(["ckpt", "verify", c.url("run")], c.env)
    check(rc == 0, "and the checkpoint verifies: %s%s" % (o, e))
    c.fake.throttle = 10 ** 6  # never recovers: the tries run out
    rc, o, e = run(["ckpt", "verify", c.url("run")], c.env)
    word = "rateLimitExceeded" if c.kind == "gs" else "ServerBusy"
    check(rc == 2 and word in e, "a service that stays busy: ckpt verify exits 2 naming %s "
          "(rc %d: %s)" % (word, rc, e.strip()[-300:]))
    tries = len([x for x in c.fake.log if x[0] == "throttled"]) - 2
    check(tries == 4, "after 4 tries of the one request: %d" % tries)
    c.fake.throttle = 0


def t_bad_answers(c):
    """Answers that are not what the API defines: refused with a clear error, nothing
    committed."""
    spec = write_spec(c.d, c.url("job"), hidden=256)
    c.fake.garbage = {"list"}
    rc, o, e = run(["ckpt", "verify", c.url("run")], c.env)
    want = ("GCS objects.list of '%s': the answer is not an Objects resource" if c.kind == "gs"
            else "Azure List Blobs of '%s': the answer is not an EnumerationResults") % c.url("run")
    check(rc == 2 and want in e, "a listing that does not parse: exit 2 with %r (%s)" %
          (want, e.strip()[-300:]))
    c.fake.garbage = set()
    if c.kind == "gs":
        c.fake.garbage = {"no-location"}
        rc, o, e = train(spec, c.url("run"), c.env)
        want = "GCS resumable upload of '%s/layer-0001.bin': no session URI (Location)" % \
            c.url("run")
        check(rc == 1 and want in e and "run/manifest.json" not in c.store(),
              "a resumable upload without a session URI: train fails naming it, no manifest "
              "(rc %d: %s)" % (rc, e.strip()[-300:]))
        c.fake.garbage = set()


def t_bad_input(d):
    """Bad URLs and settings: exit 2 before any request, with the reason."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("GOOGLE_", "GCE_", "AZURE_", "STORAGE_", "AWS_"))}
    # No credentials lookup may leave loopback.
    base.update({"GCE_METADATA_HOST": "127.0.0.1:1",
                 "AZURE_POD_IDENTITY_AUTHORITY_HOST": "http://127.0.0.1:1"})
    cases = [
        ("gs://ab/run", {}, "Bad GCS URL 'gs://ab/run': the bucket name must have 3 to 222"),
        ("gs://%s/run" % BUCKET, {"STORAGE_EMULATOR_HOST": "http://gcs.example.com:9000"},
         "Bad STORAGE_EMULATOR_HOST 'http://gcs.example.com:9000'"),
        ("gs://%s/run" % BUCKET, {}, "Cannot reach 'gs://%s/run': no credentials: "
         "GOOGLE_APPLICATION_CREDENTIALS is not set and the metadata server" % BUCKET),
        ("az://%s" % ACCOUNT, {}, "Bad Azure URL 'az://%s' (want az://ACCOUNT/CONTAINER/PREFIX"
         % ACCOUNT),
        ("az://%s/%s/run" % (ACCOUNT, CONTAINER),
         {"AZURE_STORAGE_ENDPOINT": "http://blob.example.com/%s" % ACCOUNT},
         "Bad AZURE_STORAGE_ENDPOINT 'http://blob.example.com/%s'" % ACCOUNT),
        ("az://%s/%s/run" % (ACCOUNT, CONTAINER), {"AZURE_STORAGE_KEY": "not*base64"},
         "AZURE_STORAGE_KEY is not a base64 account key"),
        ("gs://%s/run" % BUCKET, {"STORAGE_EMULATOR_HOST": "127.0.0.1:1"},
         "GCS GET http://127.0.0.1:1/storage/v1/b/%s/o?delimiter=%%2F&prefix=run%%2F: "
         "Couldn't connect to server" % BUCKET),
        ("az://%s/%s/run" % (ACCOUNT, CONTAINER),
         {"AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:1/%s" % ACCOUNT,
          "AZURE_STORAGE_KEY": FAKE_KEY}, "Azure GET http://127.0.0.1:1/%s/%s?comp=list"
         % (ACCOUNT, CONTAINER)),
        ("az://%s/%s/run" % (ACCOUNT, CONTAINER), {}, "Cannot reach 'az://%s/%s/run': no "
         "credentials: AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET are not all "
         "set and IMDS" % (ACCOUNT, CONTAINER)),
    ]
    for url, extra, want in cases:
        rc, o, e = run(["ckpt", "verify", url], dict(base, **extra), timeout=60)
        check(rc == 2 and want in e, "ckpt verify %s with %s set: exit 2 with %r (rc %d: %s)" %
              (url, sorted(extra) or "nothing", want, rc, e.strip()[-300:]))


def t_gs_anonymous(c):
    """An emulator and no credentials at all: requests go without Authorization, as Google's
    libraries send them to an emulator."""
    c.fake.anonymous_ok = True
    spec = write_spec(c.d, c.url("job"))
    rc, o, e = train(spec, c.url("run"), c.env)
    check(rc == 0, "train --save gs:// to an emulator without credentials (%s)" %
          e.strip()[-300:])
    check(c.fake.anonymous == c.fake.requests and c.fake.requests >= 6 and not c.fake.tokens,
          "every request went without credentials: %d of %d" % (c.fake.anonymous,
                                                                 c.fake.requests))


RUN_SPEC = """apiVersion: spottrain/v1
kind: TrainingJob
metadata:
  name: store-resume
spec:
  model: {layers: 2, hidden: 32, heads: 2, vocab: 64, seq_len: 16}
  training:
    micro_batch: 2
    global_batch: 8
    steps: %d
    seed: 7
  data:
    train: data.bin
    synth: {kind: markov, order: 1, seed: 3, tokens: 50000}
  fleet:
    provider: sim
    min: 1
    max: 8
    trace: trace.csv
    time_scale: 0.02
    unannounced: 1
  planner: {interval: 60s, dp: {min: 1, max: 2}, pp: 1}
  checkpoint: {dir: "%s", interval: 30s, keep: 2}
"""


def sim_worker_pids(d):
    """{instance id: pid} of the sim's worker processes of the job in directory d (as
    tests/integration/run/test_run.py finds them)."""
    pids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "worker" in args and "--instance-id" in args and any(d in a for a in args):
            pids[args[args.index("--instance-id") + 1]] = int(p)
    return pids


def t_resume(c):
    """`spottrain run` on the sim fleet (a 2x1 and a spare) with checkpoint.dir in the store:
    once a checkpoint is committed there, both positioned workers are killed together (no
    notice, no surviving copy), so the job must restore from the store onto the spare; it
    ends with the bits of the uninterrupted run."""
    import signal
    d, steps = c.d, 4000  # long enough that the kill comes well before the end
    with open(os.path.join(d, "trace.csv"), "w") as f:
        f.write("seconds,N\n0,3\n")
    job = os.path.join(d, "job.yaml")
    with open(job, "w") as f:
        f.write(RUN_SPEC % (steps, c.url("job")))
    ref = os.path.join(d, "ref")
    rc, o, e = run(["train", "--local", "--dp", "1", "--pp", "1", "--steps", str(steps),
                    "--save", ref, job], c.env)
    check(rc == 0, "the uninterrupted reference run (%s)" % e.strip()[-300:])
    save, summ = os.path.join(d, "save"), os.path.join(d, "summary.json")
    killed = []

    def on_put(name):
        # The first checkpoint committed (its manifest now exists): kill the 2x1's two workers
        # right here, before the coordinator hears that its PUT succeeded. Its loop is inside
        # this commit, so the job cannot have ended (a checkpoint's step is short of the last
        # one). Exactly once.
        if killed or not re.match(r"^job/[0-9a-f-]{36}/step-\d+/manifest\.json$", name):
            return
        pids = sim_worker_pids(d)
        for iid in ("i-00000000000000001", "i-00000000000000002"):  # the 2x1's positions
            if iid in pids:
                os.kill(pids[iid], signal.SIGKILL)
        killed.append((name, sorted(pids)))
        del c.fake.log[:]
    c.fake.on_put = on_put
    proc = subprocess.Popen([BIN, "run", job, "--steps", str(steps), "--save", save,
                             "--json-summary", summ, "--state-dir", os.path.join(d, "state")],
                            env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    check(len(killed) == 1 and killed[0][1] == ["i-00000000000000001", "i-00000000000000002",
                                                "i-00000000000000003"],
          "the two positioned workers (of three) were killed at the first commit: %s" % killed)
    first = [killed[0][0]]
    check(proc.returncode == 0, "spottrain run exited %d: %s" % (proc.returncode,
                                                                 err.strip()[-600:]))
    with open(summ) as f:
        sm = json.load(f)
    m = sm["migrations"]
    check(sm["finished"] and sm["steps"] == steps, "the job finished all %d steps" % steps)
    check(m["checkpoint-restore"]["count"] == 1 and m["fresh-start"]["count"] == 0 and
          m["peer-restore"]["count"] == 0, "one restore, from the checkpoint: %r" %
          {k: m[k]["count"] for k in ("checkpoint-restore", "peer-restore", "fresh-start")})
    ck = first[0].rsplit("/", 1)[0]  # job/JOB-ID/step-N: checkpoint.dir/JOB-ID/step-N
    at = int(ck.rsplit("-", 1)[1])
    recs = [r for r in sm["reconfigurations"] if r["ok"] and r["kind"] == "checkpoint-restore"]
    check(len(recs) == 1 and recs[0]["at_step"] == at,
          "the restore resumed from the step of the committed checkpoint, %d: %s" %
          (at, [(r["kind"], r["at_step"]) for r in recs]))
    # Whole reads (no range): the restore loads each layer whole (commits of later checkpoints
    # read their own layers to check them, never this one's).
    read = sorted({x[1] for x in c.fake.log if x[0] == "get" and x[1].startswith(ck + "/") and
                   not x[2]})
    check(read == [ck + "/layer-%04d.bin" % i for i in range(4)] + [ck + "/manifest.json"],
          "the restore read that checkpoint's manifest and its 4 layers from the store: %s"
          % read)
    rc, o, e = run(["ckpt", "diff", ref, save], c.env)
    check(rc == 0 and "max_rel 0," in o, "the run ends with the bits of the uninterrupted "
          "run: %s%s" % (o.strip()[-300:], e.strip()[-300:]))


def main():
    plain = {"contract": t_contract, "torn-prune": t_torn_prune, "corrupt": t_corrupt,
             "throttled": t_throttled, "resume": t_resume, "bad-answers": t_bad_answers}
    kind, _, what = SCENARIO.partition("-")
    with tempfile.TemporaryDirectory(prefix="spottrain-stores-") as d:
        os.makedirs(os.path.join(d, "wrong"))
        if SCENARIO == "az-shared-key":
            t_az_shared_key(d)
        elif SCENARIO == "bad-input":
            t_bad_input(d)
        elif kind in ("gs", "az") and what in plain:
            c = Cloud(kind, d)
            try:
                plain[what](c)
            finally:
                c.stop()
        elif SCENARIO in ("gs-bad-key", "az-bad-secret", "gs-metadata", "gs-anonymous"):
            c = Cloud(kind, d, wrong=SCENARIO in ("gs-bad-key", "az-bad-secret"),
                      metadata=SCENARIO in ("gs-metadata", "gs-anonymous"))
            if SCENARIO == "gs-anonymous":  # the metadata server does not exist either
                c.env["GCE_METADATA_HOST"] = "127.0.0.1:1"
            try:
                {"gs-bad-key": t_gs_bad_key, "az-bad-secret": t_az_bad_secret,
                 "gs-metadata": t_gs_metadata, "gs-anonymous": t_gs_anonymous}[SCENARIO](c)
            finally:
                c.stop()
        else:
            fail("unknown scenario %r" % SCENARIO)
    print("PASS " + SCENARIO, flush=True)


if __name__ == "__main__":
    main()
