#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""s3_fetch.py - copy a checkpoint out of S3 with boto3, a client we did not
write, so that the tests can check it with the local reader and safetensors.

Usage: s3_fetch.py s3://BUCKET/PREFIX NAME OUTDIR

Credentials and endpoint come from the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION, S3_ENDPOINT as tests/tools/s3_fixture.py
writes them).  Downloads every object under PREFIX/NAME/ into OUTDIR/NAME/
and prints one line:
    objects=N bytes=B work_areas=W uploads=U
where W counts the work areas (.ckpt-work-*) still under PREFIX and U the
multipart uploads still open under PREFIX.  Exit 0, 1 on failure, 2 usage.
"""
import os
import sys

import boto3


def main(argv):
    if len(argv) != 4 or not argv[1].startswith("s3://"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    bucket, _, prefix = argv[1][5:].partition("/")
    name, out = argv[2], argv[3]
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"],
                      region_name=os.environ.get("AWS_REGION", "us-east-1"))
    base = (prefix + "/" if prefix else "")
    objects = total = 0
    dest = os.path.join(out, name)
    os.makedirs(dest, exist_ok=True)
    pages = s3.get_paginator("list_objects_v2")
    for page in pages.paginate(Bucket=bucket, Prefix=base + name + "/"):
        for o in page.get("Contents", []):
            rel = o["Key"][len(base + name) + 1:]
            if "/" in rel or rel in ("", ".", ".."):
                print(f"s3_fetch: unexpected key {o['Key']!r}", file=sys.stderr)
                return 1
            body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            if len(body) != o["Size"]:
                print(f"s3_fetch: {o['Key']}: {len(body)} bytes, listed {o['Size']}",
                      file=sys.stderr)
                return 1
            with open(os.path.join(dest, rel), "wb") as f:
                f.write(body)
            objects += 1
            total += len(body)
    work = set()
    for page in pages.paginate(Bucket=bucket, Prefix=base + ".ckpt-work-"):
        for o in page.get("Contents", []):
            work.add(o["Key"][len(base):].split("/")[0])
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix=base).get("Uploads", [])
    print(f"objects={objects} bytes={total} work_areas={len(work)} uploads={len(uploads)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Exception as e:  # a failed request: say what, without a traceback
        print(f"s3_fetch: {e}", file=sys.stderr)
        sys.exit(1)
