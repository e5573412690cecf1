#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""s3_objects.py - the S3 scenarios' housekeeper: lists and removes what a
measurement left in the bucket, so that every save and every `aws s3 cp`
lands in an empty prefix and moto's memory and temp files stay bounded.

Run by bench/run.py with the test environment's python (scripts/pyenv.sh
test: boto3), endpoint and credentials from S3_ENDPOINT, S3_BUCKET and the
AWS_* variables.  Commands on stdin, one JSON line each on stdout:

  clean PREFIX   every object under PREFIX (ListObjectsV2, all pages) and
                 every multipart upload open under it: removed (DeleteObjects,
                 AbortMultipartUpload); answers {"objects": n, "bytes": b,
                 "sizes": {key: size} (the first 50 keys), "uploads": u}
  quit

Prints {"event": "ready", "boto3": version} first; a failure is
{"error": "..."} and the next command still runs.  Never timed: it runs
outside every measurement's window (and outside the server's CPU window).
"""
import json
import os
import sys

import boto3
from botocore.config import Config

KEEP_SIZES = 50


def client():
    cfg = Config(retries={"total_max_attempts": 3}, proxies={}, connect_timeout=10, read_timeout=600,
                 s3={"addressing_style": "path"})
    return boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"],
                        region_name=os.environ.get("AWS_REGION", "us-east-1"), config=cfg)


def clean(s3, bucket, prefix):
    objects, total, sizes, uploads = 0, 0, {}, 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = page.get("Contents", [])
        for o in keys:
            objects += 1
            total += o["Size"]
            if len(sizes) < KEEP_SIZES:
                sizes[o["Key"]] = o["Size"]
        for i in range(0, len(keys), 1000):
            r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": o["Key"]} for o in
                                                                    keys[i:i + 1000]], "Quiet": True})
            if r.get("Errors"):
                raise RuntimeError("DeleteObjects: %s" % r["Errors"][0])
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        for u in page.get("Uploads", []):
            s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
            uploads += 1
    return {"objects": objects, "bytes": total, "sizes": sizes, "uploads": uploads}


def main():
    bucket = os.environ["S3_BUCKET"]
    s3 = client()
    print(json.dumps({"event": "ready", "boto3": boto3.__version__}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words == ["quit"]:
            break
        try:
            if words[0] == "clean" and len(words) == 2:
                out = clean(s3, bucket, words[1])
            else:
                out = {"error": "unknown command %r (clean PREFIX, quit)" % line.strip()}
        except Exception as e:  # noqa: BLE001 - reported, the next command runs
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
