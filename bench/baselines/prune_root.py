#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""prune_root.py - the roots prune-1000 prunes: N committed checkpoints made
from one real checkpoint (saved by ckptd), each a copy of its files with the
manifest's "name", "step" and "time" rewritten.

copies() and manifest_for() are the naming rule, shared with bench/run.py
(which makes the local roots itself, with the standard library only).  Run
as a program, with the test environment's python (scripts/pyenv.sh test:
boto3), it makes and cleans the S3 roots on the S3 scenarios' moto server:
endpoint and credentials from S3_ENDPOINT, S3_BUCKET and the AWS_* variables.
Commands on stdin, one JSON line each on stdout:

  fill PREFIX DIR N THREADS   the files of checkpoint directory DIR uploaded
                              N times, as PREFIX/<name>/<file> for each name
                              of copies(N), manifests last within each copy
                              (a checkpoint is committed once its manifest is
                              there), THREADS PUTs at once; answers
                              {"objects": n, "bytes": b, "seconds": s}
  clean PREFIX                as bench/baselines/s3_objects.py's clean
  quit

Prints {"event": "ready", "boto3": version} first; a failure is {"error":
"..."} and the next command still runs.  Never timed by the benchmark: it
runs outside every measurement's window.
"""
import calendar
import json
import os
import sys
import time

# The newest copy's commit time (the copies are a minute apart, older
# before): a fixed, real date, so that keep_within and the hourly and daily
# buckets see the same root in every run.
NEWEST = "2026-11-01T00:00:00Z"
STEP_GAP = 100


def copies(n):
    """The N copies, oldest first: (name, step, time)."""
    newest = calendar.timegm(time.strptime(NEWEST, "%Y-%m-%dT%H:%M:%SZ"))
    return [("step-%07d" % ((i + 1) * STEP_GAP), (i + 1) * STEP_GAP,
             time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(newest - (n - 1 - i) * 60)))
            for i in range(n)]


def manifest_for(manifest, name, step, when):
    """The template's manifest (a parsed object) as copy `name` has it."""
    m = dict(manifest)
    m["name"], m["step"], m["time"] = name, step, when
    return json.dumps(m, separators=(",", ":")).encode()


def fill(s3, bucket, prefix, src, n, threads):
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(f for f in os.listdir(src) if os.path.isfile(os.path.join(src, f)))
    if "manifest.json" not in names:
        raise RuntimeError("%s holds no manifest.json" % src)
    with open(os.path.join(src, "manifest.json")) as f:
        manifest = json.load(f)
    bodies = {}
    for f in names:
        if f != "manifest.json":
            with open(os.path.join(src, f), "rb") as fh:
                bodies[f] = fh.read()
    t0 = time.monotonic()

    def one(c):
        name, step, when = c
        sent = 0
        for f, body in bodies.items():
            s3.put_object(Bucket=bucket, Key="%s/%s/%s" % (prefix, name, f), Body=body)
            sent += len(body)
        man = manifest_for(manifest, name, step, when)
        s3.put_object(Bucket=bucket, Key="%s/%s/manifest.json" % (prefix, name), Body=man)
        return sent + len(man)

    with ThreadPoolExecutor(max_workers=threads) as ex:
        sent = list(ex.map(one, copies(n)))
    return {"objects": n * len(names), "bytes": sum(sent), "seconds": round(time.monotonic() - t0, 3)}


def main():
    import boto3
    from botocore.config import Config

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import s3_objects

    bucket = os.environ["S3_BUCKET"]
    threads_max = 64
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"],
                      region_name=os.environ.get("AWS_REGION", "us-east-1"),
                      config=Config(retries={"total_max_attempts": 3}, proxies={}, connect_timeout=10,
                                    read_timeout=600, s3={"addressing_style": "path"},
                                    max_pool_connections=threads_max))
    print(json.dumps({"event": "ready", "boto3": boto3.__version__}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words == ["quit"]:
            break
        try:
            if words[0] == "fill" and len(words) == 5:
                n, threads = int(words[3]), int(words[4])
                if not 1 <= n <= 100000 or not 1 <= threads <= threads_max:
                    raise ValueError("fill: N in 1..100000, THREADS in 1..%d" % threads_max)
                out = fill(s3, bucket, words[1], words[2], n, threads)
            elif words[0] == "clean" and len(words) == 2:
                out = s3_objects.clean(s3, bucket, words[1].rstrip("/") + "/")
            else:
                out = {"error": "unknown command %r (fill PREFIX DIR N THREADS, clean PREFIX, "
                                "quit)" % line.strip()}
        except Exception as e:  # noqa: BLE001 - reported, the next command runs
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
