#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""s3_fixture.py - a moto S3 server on 127.0.0.1 that checks signatures.

Usage: s3_fixture.py start --dir DIR [--bucket NAME]... [--port-file-only]
       s3_fixture.py stop --dir DIR

start: moto_server (beside this Python) on a free port with auth on (see
make_user), the buckets made (default ckpt-test), and a wrong secret proved to
get 403: no test may run with auth silently off.  Writes into DIR: moto.pid,
moto.log, port, and s3.env (sh) and s3.json, both 0600, with S3_ENDPOINT,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, S3_BUCKET (the first
bucket), MOTO_PID.  Prints the endpoint unless --port-file-only.  The server
outlives this script, in its own session: call stop, also when a test fails.
stop: SIGTERM to DIR/moto.pid if that is a moto_server, SIGKILL 5 s later;
removes moto.pid.  Nothing running is no error.
Exit status: 0 success, 1 failure (reason on stderr), 2 usage.
"""
import argparse
import contextlib
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REGION = "us-east-1"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0
PORT_ATTEMPTS = 5


class Fail(Exception):
    pass


def log_tail(d):
    with contextlib.suppress(OSError):
        return "".join(Path(d, "moto.log").read_text(errors="replace").splitlines(True)[-20:])
    return ""


def write_file(d, name, text, mode):
    """Atomic; the temporary file starts 0600, so a secret is never exposed."""
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{name}.")
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, mode)
        f.write(text)
    os.replace(tmp, os.path.join(d, name))


def owns_listener(pid, port):
    """Whether `pid` holds the socket listening on 127.0.0.1:port.  Another
    program may take the port between our probe and moto's bind; connect()
    would reach it (maybe another test's moto, whose free calls we'd spend)."""
    try:
        fds = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        rows = [r.split() for r in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    except OSError:
        return False
    return any(r[1:4:2] == [f"0100007F:{port:04X}", "0A"] and f"socket:[{r[9]}]" in fds
               for r in rows)


def listening(d, proc, port):
    """True once moto listens on `port`, False if it lost the port to
    another program.  connect(), not an HTTP probe: every API request moto
    answers, even a failed one, uses up one of the 3 free calls."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if "Address already in use" in log_tail(d):
                return False
            raise Fail(f"moto_server exited with status {proc.returncode}")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            if owns_listener(proc.pid, port):
                return True
        time.sleep(0.05)
    raise Fail(f"moto_server did not listen on port {port} within {START_TIMEOUT:.0f} s")


def client(service, endpoint, key, secret):
    import boto3
    from botocore.config import Config
    # One attempt: a retry would spend a free call and hide the failure.
    # proxies={}: an HTTP_PROXY from the environment must not see loopback.
    cfg = Config(retries={"total_max_attempts": 1}, proxies={}, connect_timeout=5,
                 read_timeout=60, s3={"addressing_style": "path"})
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=key, aws_secret_access_key=secret, config=cfg)


def make_user(endpoint):
    """Exactly the 3 free calls; moto checks every later request against the
    key made here.  Returns (key id, secret)."""
    iam = client("iam", endpoint, "bootstrap", "bootstrap")
    iam.create_user(UserName="ckpt-test")
    key = iam.create_access_key(UserName="ckpt-test")["AccessKey"]
    policy = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="ckpt-test", PolicyName="allow-all",
                        PolicyDocument=json.dumps(policy))
    return key["AccessKeyId"], key["SecretAccessKey"]


def check_auth_on(endpoint, key, secret, bucket):
    from botocore.exceptions import ClientError
    try:
        client("s3", endpoint, key, "wrong" + secret).list_objects_v2(Bucket=bucket)
    except ClientError as e:
        if e.response["ResponseMetadata"]["HTTPStatusCode"] == 403 and \
                e.response["Error"]["Code"] == "SignatureDoesNotMatch":
            return
        raise Fail(f"a wrong secret: {e}; expected 403 SignatureDoesNotMatch") from None
    raise Fail("moto accepted a wrong secret: signature checking is OFF")


def start(args):
    from botocore.exceptions import BotoCoreError, ClientError
    d, exe = args.dir, os.path.join(os.path.dirname(sys.executable), "moto_server")
    os.makedirs(d, exist_ok=True)
    old = read_pid(d)
    if old and is_moto(old):
        raise Fail(f"moto_server pid {old} already runs for {d}: stop it first")
    buckets = list(dict.fromkeys(args.bucket or ["ckpt-test"]))
    proc = None
    try:
        for _ in range(PORT_ATTEMPTS):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            # moto sets MOTO_PORT, which it builds URLs to itself from, only if unset.
            env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3", MOTO_PORT=str(port))
            with open(os.path.join(d, "moto.log"), "wb") as log:
                proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], env=env,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        start_new_session=True)
            write_file(d, "moto.pid", f"{proc.pid}\n", 0o644)
            if listening(d, proc, port):
                break
        else:
            raise Fail(f"lost the port to another program {PORT_ATTEMPTS} times")
        endpoint = f"http://127.0.0.1:{port}"
        try:
            key, secret = make_user(endpoint)
            s3 = client("s3", endpoint, key, secret)
            for b in buckets:
                s3.create_bucket(Bucket=b)
            check_auth_on(endpoint, key, secret, buckets[0])
        except (BotoCoreError, ClientError) as e:
            raise Fail(f"setting up {endpoint}: {e}") from None
        env = {"S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": key,
               "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": REGION,
               "S3_BUCKET": buckets[0], "MOTO_PID": str(proc.pid)}
        write_file(d, "s3.env", "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()), 0o600)
        write_file(d, "s3.json", json.dumps(env, indent=1) + "\n", 0o600)
        write_file(d, "port", f"{port}\n", 0o644)
    except BaseException as e:
        # Never leave a server behind, least of all one with auth off.
        if proc:
            proc.kill()  # a no-op once poll() has reaped it
            proc.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(d, "moto.pid"))
        if isinstance(e, Fail) and log_tail(d):
            raise Fail(f"{e}\n--- last lines of {d}/moto.log:\n{log_tail(d)}") from None
        raise
    if not args.port_file_only:
        print(endpoint)


def read_pid(d):
    try:
        text = Path(d, "moto.pid").read_text().strip()
    except FileNotFoundError:
        return None
    if not text.isdigit() or int(text) <= 1:
        raise Fail(f"{d}/moto.pid holds {text!r}, not a PID")
    return int(text)


def is_moto(pid):
    with contextlib.suppress(OSError):  # a zombie's cmdline is empty: not running
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return any(os.path.basename(a) == b"moto_server" for a in argv[:2])
    return False


def ended(pidfd, sig):
    """Send `sig`; whether the process exits within STOP_TIMEOUT (a pidfd is
    readable at exit, reaped or not: moto is not our child to wait() for)."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, sig)
    return bool(select.select([pidfd], [], [], STOP_TIMEOUT)[0])


def stop(args):
    pid = read_pid(args.dir)
    if pid is None:
        return
    # Opened before the cmdline check, the pidfd pins that process: if it
    # dies and its PID is reused, signals through it reach no newcomer.
    with contextlib.suppress(ProcessLookupError):
        pidfd = os.pidfd_open(pid)
        try:
            if is_moto(pid) and not (ended(pidfd, signal.SIGTERM) or ended(pidfd, signal.SIGKILL)):
                raise Fail(f"moto_server pid {pid} survived SIGKILL")
        finally:
            os.close(pidfd)
    os.unlink(os.path.join(args.dir, "moto.pid"))


def main():
    p = argparse.ArgumentParser(prog="s3_fixture.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--dir", required=True)
    s.add_argument("--bucket", action="append")
    s.add_argument("--port-file-only", action="store_true")
    sub.add_parser("stop").add_argument("--dir", required=True)
    args = p.parse_args()  # bad usage: message and exit 2
    # A test runner's timeout sends SIGTERM: unwind, so start kills its server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        (start if args.cmd == "start" else stop)(args)
    except (Fail, OSError, ImportError) as e:
        hint = ": use the python of scripts/pyenv.sh test" if isinstance(e, ImportError) else ""
        print(f"s3_fixture.py {args.cmd}: {str(e).rstrip()}{hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
