#!/usr/bin/env python3
"""Checkpoints in S3 (`--save s3://BUCKET/PREFIX`, `checkpoint.dir`) against moto's S3.

Usage: test_s3.py SCENARIO
  contract    train --local --steps 5 --save s3://BUCKET/run, and the same run saved locally:
              `ckpt diff DIR s3://BUCKET/run` gives max_rel 0; `ckpt info` and `ckpt verify`
              read the S3 copy; a layer file larger than the part size went up as a multipart
              upload (its ETag says 2 parts); no staging directory is left behind
  torn-prune  under one root, a committed step-5 and a newer step-9 whose manifest never
              arrived (a torn upload): the restore lookup picks step 5; retention (keep 1)
              with a newer committed step-7 removes step-5's objects and keeps step-9's
  corrupt     one byte of a layer object flipped: `ckpt verify` exits 1 naming the object and
              "checksum mismatch"
  imds-role   signature checking on, no keys in the environment or a credentials file: the
              instance role served by the sim's loopback IMDSv2 server (an IAM user's key
              and secret; moto checks those) signs the checkpoint upload; a role whose secret is
              wrong gives exit 2 naming the S3 error code
  bad-secret  signature checking on: a wrong secret key makes `train --save s3://` exit 2
              before training, naming the S3 error code, with nothing written; `ckpt verify`
              exits 2 the same way; the secret is never printed; the right secret works
              (single and multipart uploads signed as S3 checks them)

moto (PyPI, test-time only) runs in this process (ThreadedMotoServer on 127.0.0.1, port 0);
every wait is a subprocess with a timeout. Needs SPOTTRAIN_BIN and SPOTTRAIN_S3_TOOL.
"""
import os
import subprocess
import sys

SCENARIO = sys.argv[1] if len(sys.argv) > 1 else ""
if SCENARIO in ("bad-secret", "imds-role"):
    # Signature checking on after the three IAM calls that make the user (read at import).
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"

import boto3  # noqa: E402
from cloudtest import (aws_env, check, fail, iam_user, moto_main, run, tool,  # noqa: E402
                       train, write_ckpt_spec)

BIN = os.environ["SPOTTRAIN_BIN"]
TOOL = os.environ["SPOTTRAIN_S3_TOOL"]
KEY, SECRET = "AKIAEXAMPLEKEY000001", "s3cr3t-VALUE-never-printed"
BUCKET = "spottrain-ckpt"
PART = 5 * 1024 * 1024  # S3's minimum part size


def s3(url, key=KEY, secret=SECRET):
    return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret)


def keys(url, prefix, **kw):
    r = s3(url, **kw).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in r.get("Contents", []))


def write_spec(d, hidden=32):
    return write_ckpt_spec(d, "s3-ckpt", hidden, [
        "provider: aws", "instance_type: t3.micro", "image: ami-12c6146b", "zones: [us-east-1a]",
        "max: 1"], "s3://%s/job" % BUCKET)


def env_for(url, d, secret=SECRET, key=KEY):
    return aws_env(url, d, key, secret, TMPDIR=d, SPOTTRAIN_S3_PART_BYTES=str(PART))


def t_contract(d, url):
    s3(url).create_bucket(Bucket=BUCKET)
    spec = write_spec(d, hidden=256)  # a block's layer file is ~9.5 MB: 2 parts of 5 MiB
    env = env_for(url, d)
    local = os.path.join(d, "local")
    rc, o, e = train(spec, local, env)
    check(rc == 0, "train --save DIR (%s)" % e.strip()[-300:])
    rc, o, e = train(spec, "s3://%s/run" % BUCKET, env)
    check(rc == 0 and "saved checkpoint s3://%s/run (step 5)" % BUCKET in o,
          "train --local --steps 5 --save s3://BUCKET/run (%s)" % e.strip()[-300:])
    names = sorted(os.listdir(local))
    check(keys(url, "run/") == ["run/" + n for n in names],
          "S3 holds exactly the local directory's files: %s" % keys(url, "run/"))
    for n in names:
        body = s3(url).get_object(Bucket=BUCKET, Key="run/" + n)["Body"].read()
        with open(os.path.join(local, n), "rb") as f:
            check(f.read() == body, "object run/%s is byte-identical to the local file" % n)
    sizes = {n: os.path.getsize(os.path.join(local, n)) for n in names}
    big = [n for n in names if sizes[n] > PART]
    check(len(big) == 2, "two layer files are larger than a part: %s" % big)
    for n in big:
        etag = s3(url).head_object(Bucket=BUCKET, Key="run/" + n)["ETag"].strip('"')
        want = "-%d" % ((sizes[n] + PART - 1) // PART)
        check(etag.endswith(want), "run/%s went up in %s parts (ETag %s)" % (n, want[1:], etag))
    check(os.listdir(d).count("local") == 1 and
          not [n for n in os.listdir(d) if n.startswith("spottrain-ckpt-")],
          "no staging directory is left behind")
    rc, o, e = run(["ckpt", "diff", local, "s3://%s/run" % BUCKET], env)
    check(rc == 0 and "max_rel 0," in o, "ckpt diff DIR s3://BUCKET/run: max_rel 0 (%s%s)"
          % (o, e))
    rc, o, e = run(["ckpt", "verify", "s3://%s/run" % BUCKET], env)
    check(rc == 0 and o.startswith("ok: s3://%s/run: 4 layers, every checksum matches" % BUCKET),
          "ckpt verify s3://: %s%s" % (o, e))
    rc, o, e = run(["ckpt", "info", "s3://%s/run" % BUCKET], env)
    lrc, lo, le = run(["ckpt", "info", local], env)
    check(rc == 0 and lrc == 0 and o.replace("s3://%s/run" % BUCKET, "X") ==
          lo.replace(local, "X"), "ckpt info reads the same from S3 as from the directory")
    check(SECRET not in o + e, "the secret is not printed")


def put_ckpt(url, src, dst, skip=()):
    for n in sorted(os.listdir(src)):
        if n not in skip:
            with open(os.path.join(src, n), "rb") as f:
                s3(url).put_object(Bucket=BUCKET, Key=dst + "/" + n, Body=f.read())


def t_torn_prune(d, url):
    s3(url).create_bucket(Bucket=BUCKET)
    spec = write_spec(d)
    env = env_for(url, d)
    rc, o, e = train(spec, "s3://%s/root/step-5" % BUCKET, env)
    check(rc == 0, "train --save s3://BUCKET/root/step-5 (%s)" % e.strip()[-300:])
    rc, o, e = train(spec, os.path.join(d, "src"), env)
    check(rc == 0, "train --save DIR")
    src = os.path.join(d, "src")
    put_ckpt(url, src, "root/step-9", skip=("manifest.json",))  # the upload that was cut short
    rc, o, e = tool(["latest", "s3://%s/root" % BUCKET], env)
    check(rc == 0 and o == "latest 5 s3://%s/root/step-5\n" % BUCKET,
          "the restore lookup skips the torn step-9 and picks step 5: %r %s" %
          (o, e.strip()[-300:]))
    check("manifest.json missing" in e, "and says why step-9 was skipped")
    rc, o, e = tool(["latest", "s3://%s/nothing" % BUCKET], env)
    check(rc == 0 and o.startswith("latest none ("),
          "an empty prefix has no latest checkpoint: %r" % o)
    put_ckpt(url, src, "root/step-7")
    rc, o, e = tool(["prune", "s3://%s/root" % BUCKET, "1"], env)
    check(rc == 0 and o == "pruned 1\n", "prune keep 1 removes one: %r %s" %
          (o, e.strip()[-300:]))
    left = keys(url, "root/")
    n = len(os.listdir(src))
    check(len(left) == 2 * n - 1 and not [k for k in left if k.startswith("root/step-5/")],
          "step-5 is gone, step-7 (committed) and step-9 (maybe still uploading) stay: %s" %
          left)
    rc, o, e = tool(["latest", "s3://%s/root" % BUCKET], env)
    check(o == "latest 5 s3://%s/root/step-7\n" % BUCKET, "latest is now step-7: %r" % o)


def t_corrupt(d, url):
    s3(url).create_bucket(Bucket=BUCKET)
    spec = write_spec(d)
    env = env_for(url, d)
    rc, o, e = train(spec, "s3://%s/run" % BUCKET, env)
    check(rc == 0, "train --save s3:// (%s)" % e.strip()[-300:])
    k = "run/layer-0001.bin"
    body = bytearray(s3(url).get_object(Bucket=BUCKET, Key=k)["Body"].read())
    body[len(body) // 2] ^= 0x40
    s3(url).put_object(Bucket=BUCKET, Key=k, Body=bytes(body))
    rc, o, e = run(["ckpt", "verify", "s3://%s/run" % BUCKET], env)
    lines = [l for l in e.splitlines() if "checksum mismatch" in l]
    check(rc == 1 and len(lines) == 1 and
          "'s3://%s/%s': checksum mismatch: file says" % (BUCKET, k) in lines[0],
          "ckpt verify exits 1 naming the object and the failed check: rc %d, %s" % (rc, e))


def t_bad_secret(d, url):
    key, secret = iam_user(url)
    s3(url, key=key, secret=secret).create_bucket(Bucket=BUCKET)
    spec = write_spec(d, hidden=256)  # multipart too, so its query strings are signed right
    env = env_for(url, d, key=key, secret=secret + "-wrong")
    rc, o, e = train(spec, "s3://%s/run" % BUCKET, env)
    lines = [l for l in e.splitlines() if "SignatureDoesNotMatch" in l]
    check(rc == 2, "train --save s3:// with a wrong secret exits 2 (rc %d: %s)" % (rc, e))
    check(len(lines) == 1 and "refused: SignatureDoesNotMatch" in lines[0],
          "one error line names the S3 error code: %s" % e)
    check("step 1/" not in o, "nothing was trained")
    check(secret not in o + e, "the secret is not printed")
    check(keys(url, "", key=key, secret=secret) == [], "nothing was written")
    rc, o, e = run(["ckpt", "verify", "s3://%s/run" % BUCKET], env)
    check(rc == 2 and "SignatureDoesNotMatch" in e, "ckpt verify exits 2 too: %s" % e)
    env["AWS_SECRET_ACCESS_KEY"] = secret
    rc, o, e = train(spec, "s3://%s/run" % BUCKET, env)
    check(rc == 0, "the right secret is accepted (signing works): %s" % e.strip()[-300:])
    rc, o, e = run(["ckpt", "verify", "s3://%s/run" % BUCKET], env)
    check(rc == 0, "and the checkpoint verifies: %s%s" % (o, e))


def imds(key, secret, token):
    p = subprocess.Popen([TOOL, "imds", key, secret, token], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    if len(line) != 2 or line[0] != "imds":
        p.kill()
        fail("the IMDS helper did not start: %r" % line)
    return p, line[1]


def imds_stop(p):
    p.stdin.close()
    out = p.stdout.read()
    p.wait(timeout=30)
    return out


def t_imds_role(d, url):
    key, secret = iam_user(url)
    # The role serves the IAM user's key and secret: moto checks signatures against IAM
    # users' keys, and its STS AssumeRole answers 500 with signature checking on, so the
    # document's Token is empty here (real roles carry one; it travels as
    # X-Amz-Security-Token exactly as AWS_SESSION_TOKEN does).
    st = {"AccessKeyId": key, "SecretAccessKey": secret, "SessionToken": ""}
    s3(url, key=key, secret=secret).create_bucket(Bucket=BUCKET)
    spec = write_spec(d)
    env = env_for(url, d)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        del env[k]
    rc, o, e = train(spec, "s3://%s/run" % BUCKET, env)
    check(rc == 2 and "no AWS credentials" in e, "no keys and no IMDS: exit 2 (%s)" % e.strip())
    del env["AWS_EC2_METADATA_DISABLED"]
    p, ep = imds(st["AccessKeyId"], st["SecretAccessKey"], st["SessionToken"])
    env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = ep
    rc, o, e = train(spec, "s3://%s/run" % BUCKET, env)
    check(rc == 0, "train --save s3:// signs with the instance role (%s)" % e.strip()[-300:])
    rc, o, e = run(["ckpt", "verify", "s3://%s/run" % BUCKET], env)
    check(rc == 0, "ckpt verify reads with the instance role: %s%s" % (o, e))
    check(st["SecretAccessKey"] not in o + e, "the role's secret is not printed")
    served = imds_stop(p)
    # One lookup per process (train's ranks inherit it across fork; ckpt verify makes its
    # own): a token PUT, then the role list and the role's document.
    check(served == "served 2 token PUTs, 4 GETs\n",
          "the credentials came from IMDSv2 with a token, once per process: %r" % served)
    p, ep = imds(st["AccessKeyId"], st["SecretAccessKey"] + "-wrong", st["SessionToken"])
    env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = ep
    rc, o, e = train(spec, "s3://%s/run2" % BUCKET, env)
    imds_stop(p)
    check(rc == 2 and "refused: SignatureDoesNotMatch" in e,
          "a role with a wrong secret: exit 2 naming the S3 error code (%s)" % e.strip())


SCENARIOS = {"imds-role": t_imds_role, "contract": t_contract, "torn-prune": t_torn_prune, "corrupt": t_corrupt,
             "bad-secret": t_bad_secret}


def main():
    moto_main("test_s3.py", SCENARIOS, SCENARIO, "spottrain-s3-")


if __name__ == "__main__":
    main()
