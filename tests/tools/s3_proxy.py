#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""s3_proxy.py - an S3 proxy for tests: checks checksums as S3 does, injects faults,
damages answers.

Usage:
  s3_proxy.py --listen-port-file FILE (--upstream http://127.0.0.1:PORT | --sink)
              [--seed N] [--rate R] [--faults LIST] [--fault-methods LIST]
              [--fault-kinds LIST]
              [--stall-s S] [--access-key K --secret-key S]
              [--pid-file F] [--log-file F]

Listens on 127.0.0.1, on a port the kernel picks (written to FILE by
write-then-rename once listening), HTTP/1.1 with keep-alive.  Requests go to
the upstream (moto) byte for byte, Host included: SigV4 signs it.  moto
checks no checksums, so each body is read whole (Content-Length only: like
S3, chunked is 411) and checked first as S3 does: x-amz-checksum-crc32c,
-crc32, -sha1, -sha256, Content-MD5 (not x-amz-checksum-* on a Complete: they
describe the object) must match it, else 400 BadDigest; not base64 of the
right size: 400 InvalidRequest (InvalidDigest for MD5, as S3 says).  An
UploadPart without x-amz-checksum-crc32c in an upload created with
x-amz-checksum-algorithm CRC32C: 400 InvalidRequest.  aws-chunked bodies
(boto3 sends them only over https): 501, as we cannot check them.

Faults: a request whose method is in --fault-methods (default all) and
whose kind is in --fault-kinds (default all: create, part, complete, abort,
put, delete, delete-objects, post, read, other) gets,
with probability --rate (default 0), one of the --faults (default all) that
apply to it:
  500, 503        500 InternalError / 503 SlowDown, not forwarded
  reset-request   read part of the body, RST the client connection
  reset-response  forward; send the status line and part of the rest; RST
  stall           read part of the body, send nothing for --stall-s (30) s,
                  close (a RST if body bytes are left unread: the kernel's)
  truncate        forward; send the whole head and part of the body, close;
                  with no body, the head without its final blank line
  flip            XOR a byte of the body before the checks: flip_caught when
                  refused, flip_missed when forwarded (no checksum: a bug)
  complete-error  on CompleteMultipartUpload only: 200 with an <Error> body
  drop-response   forward; RST the client connection before any byte of the
                  answer (libcurl then sends the request again by itself on
                  a reused connection); only when named, never in "all"
Reproducible whatever the interleaving: a request's RNG is seeded with
(--seed, method, path, query but uploadId, times that request was seen).

Damaged answers (set through /__proxy/config only): a 200 answer to a GET
whose path (decoded, bucket included) matches the regex answer_match is
forwarded with one byte of its body changed, the stored object, the headers
and the length untouched: what a client must catch with the checksum
stored with the object.  The first answer_skip such answers pass whole,
then answer_times are damaged (-1: every one after the skipped).
answer_how says which byte: "byte" XORs a random byte with a random
non-zero value; "digit" makes the body's last digit that follows another
digit a different digit (JSON stays JSON, a number stays a number: only a
checksum tells).  Bodies framed by Content-Length only (moto's).  Counted
in stats "answers_damaged"; the log's "fault" says "answer-<how>".

--sink: no upstream; answers like S3, storing nothing: Create (UploadIds
with '+', '/', '='), UploadPart (checked; ETag, echoes the CRC32C), Complete,
PutObject, Abort/DELETE (204), DeleteObjects, GET/HEAD (404 NoSuchKey).  With
--access-key/--secret-key it verifies SigV4 as S3 does (no clock check): 403
SignatureDoesNotMatch / InvalidAccessKeyId, 400 XAmzContentSHA256Mismatch.

Control API on the same port (never forwarded), JSON:
  GET  /__proxy/stats   {"requests", "forwarded", "faults": {kind: n},
                         "baddigest", "invalid", "flip_caught",
                         "flip_missed", "bytes_in", "upstream_errors",
                         "held_now", "answers_damaged"}
  GET  /__proxy/config  the settings
  POST /__proxy/config  {"rate": R, "faults": [..] | "a,b" | "all", "seed": N,
                         "fault_methods": [..] | "PUT,POST",
                         "fault_kinds": [..] | "part,complete", "stall_s": S,
                         "fail_all": bool, "hold": bool,
                         "answer_match": REGEX ("" off), "answer_skip": N,
                         "answer_times": N (-1 all), "answer_how": HOW,
                         "fault_path": S, "fault_limit": N,
                         "reset": true}: all or nothing
                        (400 {"error"}); answers the settings.  fail_all:
                        each request of fault_methods and fault_kinds
                        gets 503 SlowDown; hold: each such request
                        waits, its body unread, until hold is cleared
                        (stats "held_now" counts them), and then gets
                        fail_all's 503 if that is set by then;
                        answer_*: see above (setting any of them starts
                        the skip and times counts over);
                        fault_path: only requests whose path (query
                        left out) contains S get faults, fail_all or
                        hold ("": every path); fault_limit: at most N
                        more random faults from now on (-1: no limit)
                        (neither is on the command line);
                        reset: zero counters, log and draw history
  GET  /__proxy/log     last 1000 requests, in arrival order: {"method",
                        "path" (with query), "status" (null: not sent, yet or
                        ever), "fault", "bytes"}
--log-file: the same records as JSON lines, once answered.  SIGTERM/SIGINT:
exits at once.
Exit 2: bad usage; 1: cannot listen or write its files.
"""
import argparse
import base64
import binascii
import collections
import contextlib
import functools
import hashlib
import hmac
import html
import http
import json
import os
import random
import re
import signal
import socket
import struct
import sys
import threading
import traceback
import uuid
import zlib
from urllib.parse import quote, unquote, urlsplit

import crc32c

FAULTS = ("500", "503", "reset-request", "reset-response", "stall",
          "truncate", "flip", "complete-error")
EXTRA_FAULTS = ("drop-response",)   # named only: "all" is FAULTS
METHODS = ("PUT", "POST", "GET", "HEAD", "DELETE")
ANSWER_HOW = ("byte", "digit")
KINDS = ("create", "part", "complete", "abort", "put", "delete", "delete-objects", "post",
         "read", "other")
MAX_HEAD = 64 << 10          # request heads; longer is answered 431
MAX_BODY = 5 << 30           # S3's own limit for one PUT
MAX_CONNECTIONS = 1024
MAX_UPLOADS = 100000         # CRC32C uploads remembered (oldest forgotten)
MAX_DRAW_KEYS = 1 << 20      # draw history entries before it starts over
HOLD_MAX_S = 600             # a held request goes on after this anyway
LOG_KEEP = 1000
COPY_BUF = 1 << 20
KEEP_BODY_BUF = 64 << 20     # a connection keeps a body buffer up to this
UPSTREAM_TIMEOUT = 600       # moto's Complete of 1 GiB takes ~11 s


class Bad(argparse.ArgumentTypeError):
    """A bad setting (command line or /__proxy/config); the text says why."""


class HttpError(Exception):
    """A request we cannot parse: answered `status`, then the connection closes."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class UpstreamError(Exception):
    """The upstream could not be reached or gave no usable answer."""


# --- settings: one validator per key, shared by the CLI and /__proxy/config
def _names(value, allowed, what, fold=str, every=None):
    if isinstance(value, str):
        value = value.split(",") if value.strip() else []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Bad(f"{what}: a list or a comma-separated string")
    if [v.strip() for v in value] == ["all"]:
        return list(every or allowed)
    value = [fold(v.strip()) for v in value]
    unknown = [v for v in value if v not in allowed]
    if unknown:
        raise Bad(f"{what}: unknown '{unknown[0]}' (known: {','.join(allowed)})")
    return value


def _number(value, kind, lo, hi, what):
    try:
        if isinstance(value, bool):
            raise ValueError
        n = kind(value)
        if lo <= n <= hi:
            return n
    except (TypeError, ValueError):
        pass
    raise Bad(f"{what}: a number from {lo} to {hi}")


v_rate = functools.partial(_number, kind=float, lo=0.0, hi=1.0, what="rate")
v_seed = functools.partial(_number, kind=int, lo=-(1 << 63), hi=(1 << 63) - 1, what="seed")
v_stall = functools.partial(_number, kind=float, lo=0.0, hi=86400.0, what="stall-s")
v_limit = functools.partial(_number, kind=int, lo=-1, hi=(1 << 62), what="fault_limit")
v_faults = functools.partial(_names, allowed=FAULTS + EXTRA_FAULTS, what="faults", every=FAULTS)
v_methods = functools.partial(_names, allowed=METHODS, what="fault methods", fold=str.upper)
v_kinds = functools.partial(_names, allowed=KINDS, what="fault kinds", fold=str.lower)


def v_bool(value):
    if not isinstance(value, bool):
        raise Bad("true or false")
    return value


def v_regex(value):
    if not isinstance(value, str):
        raise Bad("answer_match: a regular expression (\"\" for none)")
    try:
        re.compile(value)
    except re.error as e:
        raise Bad(f"answer_match: {e}") from None
    return value


def v_how(value):
    if value not in ANSWER_HOW:
        raise Bad(f"answer_how: one of {','.join(ANSWER_HOW)}")
    return value


v_skip = functools.partial(_number, kind=int, lo=0, hi=1 << 31, what="answer_skip")
v_times = functools.partial(_number, kind=int, lo=-1, hi=1 << 31, what="answer_times")


def v_path(value):
    if not isinstance(value, str) or len(value) > 1024:
        raise Bad("fault_path: a string of at most 1024 characters")
    return value


# JSON key -> (setting, validator); the CLI's spellings work too
CONFIG_KEYS = {
    "rate": ("rate", v_rate), "faults": ("faults", v_faults), "seed": ("seed", v_seed),
    "fault_methods": ("fault_methods", v_methods), "fault-methods": ("fault_methods", v_methods),
    "fault_kinds": ("fault_kinds", v_kinds), "fault-kinds": ("fault_kinds", v_kinds),
    "stall_s": ("stall_s", v_stall), "stall-s": ("stall_s", v_stall),
    "fail_all": ("fail_all", v_bool), "hold": ("hold", v_bool),
    "answer_match": ("answer_match", v_regex), "answer_skip": ("answer_skip", v_skip),
    "answer_times": ("answer_times", v_times), "answer_how": ("answer_how", v_how),
    "fault_path": ("fault_path", v_path), "fault_limit": ("fault_limit", v_limit),
}


# --- the checksums S3 checks on a body: header -> (name in S3's messages,
# digest of a body, digest size).  All of them release the GIL on large
# buffers, so connections check in parallel.
DIGESTS = {
    "x-amz-checksum-crc32c": ("CRC32C", lambda b: crc32c.crc32c(b).to_bytes(4, "big"), 4),
    "x-amz-checksum-crc32": ("CRC32", lambda b: zlib.crc32(b).to_bytes(4, "big"), 4),
    "x-amz-checksum-sha1": ("SHA1", lambda b: hashlib.sha1(b).digest(), 20),
    "x-amz-checksum-sha256": ("SHA256", lambda b: hashlib.sha256(b).digest(), 32),
    "content-md5": ("Content-MD5", lambda b: hashlib.md5(b).digest(), 16),
}


# --- HTTP
class Stream:
    """A socket with read-ahead: heads are read in 64 KiB gulps, and the
    part of a body that came with its head is handed out before the socket
    is read again (straight into the caller's buffer: no copy per chunk)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _until(self, sep):
        start = 0
        while True:
            i = self.buf.find(sep, start)
            if i >= 0:
                out = bytes(self.buf[:i + len(sep)])
                del self.buf[:i + len(sep)]
                return out
            if len(self.buf) > MAX_HEAD:
                raise HttpError(431, "head too long")
            start = max(0, len(self.buf) - len(sep) + 1)
            data = self.sock.recv(65536)
            if not data:
                if self.buf:
                    raise EOFError("connection closed inside a head")
                return None
            self.buf += data

    def read_head(self):
        """The next head through its blank line; None on EOF between messages."""
        return self._until(b"\r\n\r\n")

    def read_line(self):
        line = self._until(b"\r\n")
        if line is None:
            raise EOFError("connection closed inside a body")
        return line

    def read_some(self, mv):
        """Read at most len(mv) bytes into mv; 0 only at EOF."""
        if self.buf:
            n = min(len(self.buf), len(mv))
            mv[:n] = self.buf[:n]
            del self.buf[:n]
            return n
        return self.sock.recv_into(mv)

    def read_into(self, mv):
        """Fill mv exactly, or raise EOFError."""
        got = 0
        while got < len(mv):
            n = self.read_some(mv[got:])
            if n == 0:
                raise EOFError("connection closed inside a body")
            got += n


def parse_headers(lines):
    """{lowercase name: value}; a repeated header's values joined with ','
    (the form SigV4's canonical headers use)."""
    headers = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"bad header line {line[:80]!r}")
        name, value = name.lower(), value.strip(" \t")
        headers[name] = headers[name] + "," + value if name in headers else value
    return headers


def tokens(value):
    return {t.strip().lower() for t in (value or "").split(",")}


class Request:
    """One parsed request head; `head` stays raw to be forwarded unchanged."""

    def __init__(self, head):
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise HttpError(400, f"bad request line {lines[0][:80]!r}")
        self.head = head
        self.method, self.target, version = parts
        self.path, _, self.query = self.target.partition("?")
        self.headers = parse_headers(lines[1:])
        self.params = {}
        for item in filter(None, self.query.split("&")):
            name, _, value = item.partition("=")
            self.params[unquote(name)] = unquote(value)
        conn = tokens(self.headers.get("connection"))
        self.close = "close" in conn or (version == "HTTP/1.0" and "keep-alive" not in conn)
        cl = self.headers.get("content-length", "0")
        if not cl.isdigit():
            raise HttpError(400, "bad Content-Length")
        self.length = int(cl)
        p, m = self.params, self.method
        if m == "POST":
            self.kind = ("create" if "uploads" in p else "complete" if "uploadId" in p
                         else "delete-objects" if "delete" in p else "post")
        elif m == "PUT":
            self.kind = "part" if "partNumber" in p and "uploadId" in p else "put"
        elif m == "DELETE":
            self.kind = "abort" if "uploadId" in p else "delete"
        else:
            self.kind = "read" if m in ("GET", "HEAD") else "other"


def response(status, headers=(), body=b"", close=False, head_only=False):
    """A whole response.  head_only (answering a HEAD): no body, length 0."""
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}"] + [f"{k}: {v}" for k, v in headers]
    body = b"" if head_only else body
    if status != 204:
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def s3_error(req, status, code, message, close=False):
    rid = uuid.uuid4().hex[:16].upper()
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{html.escape(message, False)}</Message>"
            f"<Resource>{html.escape(req.path, False)}</Resource><RequestId>{rid}</RequestId></Error>")
    return response(status, [("Content-Type", "application/xml"), ("x-amz-request-id", rid)],
                    body.encode(), close, head_only=req.method == "HEAD")


def client_head(head, close):
    """An upstream response head as the client gets it.  Connection and
    Keep-Alive are hop-by-hop, so ours to set: moto closes after every
    answer, and the client's connection must stay open all the same."""
    lines = [line for line in head[:-4].split(b"\r\n")
             if line.split(b":", 1)[0].strip().lower() not in (b"connection", b"keep-alive")]
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def body_framing(method, status, headers):
    """How a response body ends: ("none"|"length"|"chunked"|"close", length)."""
    if method == "HEAD" or status in (204, 304) or status < 200:
        return "none", 0
    if "chunked" in tokens(headers.get("transfer-encoding")):
        return "chunked", 0
    cl = headers.get("content-length")
    if cl is None:
        return "close", 0
    if not cl.isdigit():
        raise UpstreamError("bad Content-Length from upstream")
    return "length", int(cl)


def damage_body(body, how, rng):
    """body with one byte changed as answer_how says (see the docstring)."""
    b = bytearray(body)
    if how == "digit":
        for i in range(len(b) - 1, 0, -1):
            if 48 <= b[i] <= 57 and 48 <= b[i - 1] <= 57:
                b[i] = 48 + (b[i] - 48 + 1) % 10
                return bytes(b)
    if b:               # "byte", or no digit that follows a digit
        b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
    return bytes(b)


def rst_close(sock):
    """Close with SO_LINGER 0: the peer gets a RST, not a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# --- SigV4 (sink mode)
def _uri_encode(s):
    return quote(unquote(s), safe="-_.~")


def canonical_path(path):
    # Segment by segment, so that an encoded '/' (%2F) stays encoded.
    return "/".join(_uri_encode(seg) for seg in (path or "/").split("/"))


def canonical_query(query):
    pairs = sorted((_uri_encode(n), _uri_encode(v)) for n, _, v in
                   (item.partition("=") for item in filter(None, query.split("&"))))
    return "&".join(f"{n}={v}" for n, v in pairs)


AUTH_RE = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^,\s]+),\s*"
                     r"SignedHeaders=([^,\s]+),\s*Signature=([0-9a-f]{64})")


def verify_sigv4(req, body, access_key, secret_key):
    """None if the request is signed right, else (status, code, message).
    The canonical request is rebuilt from what arrived, re-encoded and
    sorted as S3 does, so a client that signed something other than what it
    sent (curl 7.88 signs the query as written) is refused here too."""
    auth = req.headers.get("authorization")
    if auth is None:
        return 403, "AccessDenied", "Anonymous access is not allowed here."
    m = AUTH_RE.fullmatch(auth.strip())
    scope = m.group(1).split("/") if m else []
    if len(scope) != 5 or scope[4] != "aws4_request":
        return 400, "AuthorizationHeaderMalformed", "The authorization header is malformed."
    if scope[0] != access_key:
        return 403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
    payload = req.headers.get("x-amz-content-sha256")
    if payload is None:
        return 400, "InvalidRequest", "Missing required header for this request: x-amz-content-sha256"
    if re.fullmatch(r"[0-9a-f]{64}", payload) and hashlib.sha256(body).hexdigest() != payload:
        return 400, "XAmzContentSHA256Mismatch", "The provided x-amz-content-sha256 header does not match what was computed."
    amz_date, signed = req.headers.get("x-amz-date", ""), m.group(2)
    names = signed.split(";")
    canonical_headers = "".join(f"{n}:{' '.join(req.headers.get(n, '').split())}\n" for n in names)
    creq = "\n".join([req.method, canonical_path(req.path), canonical_query(req.query),
                      canonical_headers, signed, payload])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, "/".join(scope[1:]),
                         hashlib.sha256(creq.encode()).hexdigest()])
    key = ("AWS4" + secret_key).encode()
    for part in scope[1:]:
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    want = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if "host" not in names or not amz_date.startswith(scope[1]) or not hmac.compare_digest(want, m.group(3)):
        return 403, "SignatureDoesNotMatch", ("The request signature we calculated does not match the "
                                              "signature you provided. Check your key and signing method.")
    return None


# --- state shared by all connections
class Proxy:
    """Settings, counters, the log and the CRC32C uploads, under `lock`."""

    def __init__(self, args):
        self.upstream, self.sink = args.upstream, args.sink
        self.creds = (args.access_key, args.secret_key) if args.access_key else None
        self.cfg = {"rate": args.rate, "faults": args.faults, "seed": args.seed,
                    "fault_methods": args.fault_methods, "fault_kinds": args.fault_kinds,
                    "stall_s": args.stall_s, "fail_all": False, "hold": False,
                    "answer_match": "", "answer_skip": 0, "answer_times": 0,
                    "answer_how": "byte", "fault_path": "", "fault_limit": -1}
        self.lock = threading.Lock()
        self.unheld = threading.Condition(self.lock)
        self.crc_uploads = {}            # uploadId -> None, oldest first
        self.logfile = open(args.log_file, "a", buffering=1) if args.log_file else None
        self.reset()

    def reset(self):
        with self.lock:
            # held_now is a gauge of requests waiting now, not a counter
            held = self.stats["held_now"] if hasattr(self, "stats") else 0
            self.stats = {"requests": 0, "forwarded": 0,
                          "faults": dict.fromkeys(FAULTS + EXTRA_FAULTS + ("fail_all",), 0),
                          "baddigest": 0, "invalid": 0, "flip_caught": 0, "flip_missed": 0,
                          "bytes_in": 0, "upstream_errors": 0, "held_now": held,
                          "answers_damaged": 0}
            self.log = collections.deque(maxlen=LOG_KEEP)
            self.seen = {}
            self.answers_seen = self.answers_hit = 0

    def count(self, name, n=1):
        with self.lock:
            self.stats[name] += n

    def configure(self, changes):
        """Apply a /__proxy/config object: all of it, or nothing (raises Bad)."""
        if not isinstance(changes, dict):
            raise Bad("a JSON object")
        new = {}
        for key, value in changes.items():
            if key == "reset":
                continue
            if key not in CONFIG_KEYS:
                raise Bad(f"unknown key '{key}' (known: {', '.join(CONFIG_KEYS)}, reset)")
            name, check = CONFIG_KEYS[key]
            new[name] = check(value)
        if changes.get("reset"):
            self.reset()
        with self.lock:
            if "seed" in new:
                self.seen = {}          # a new seed replays from the first try
            if any(k.startswith("answer_") for k in new):
                self.answers_seen = self.answers_hit = 0
            self.cfg.update(new)
            self.unheld.notify_all()
            return dict(self.cfg)

    def hold(self, req, fault, entry):
        """While "hold" is set, a request of fault_methods and fault_kinds
        waits here (its body unread) until it is cleared.  Released into a
        fail_all set meanwhile, it fails as the requests that come now do
        (an outage that begins while parts wait).  Returns its fault."""
        with self.lock:
            def held():
                c = self.cfg
                return c["hold"] and req.method in c["fault_methods"] \
                    and req.kind in c["fault_kinds"] and c["fault_path"] in req.path
            if not held():
                return fault
            self.stats["held_now"] += 1
            self.unheld.wait_for(lambda: not held(), timeout=HOLD_MAX_S)
            self.stats["held_now"] -= 1
            c = self.cfg
            if fault is None and c["fail_all"] and req.method in c["fault_methods"] \
                    and req.kind in c["fault_kinds"]:
                fault = entry["fault"] = "fail_all"
                self.stats["faults"][fault] += 1
            return fault

    def draw(self, req):
        """(fault or None, the request's own RNG, the settings it runs under,
        its log entry).  Logged and counted now, in arrival order, so that a
        stall shows at once; the entry's status is filled in when answered."""
        with self.lock:
            cfg = dict(self.cfg)
            self.stats["requests"] += 1
            key = "%s %s?%s" % (req.method, req.path, "&".join(
                sorted(f"{k}={v}" for k, v in req.params.items() if k != "uploadId")))
            if len(self.seen) >= MAX_DRAW_KEYS:
                self.seen = {}
            nth = self.seen[key] = self.seen.get(key, 0) + 1
        rng = random.Random(f"{cfg['seed']}|{key}|{nth}")
        fault = None
        if req.method not in cfg["fault_methods"] or req.kind not in cfg["fault_kinds"] \
                or cfg["fault_path"] not in req.path:
            pass
        elif cfg["fail_all"]:
            fault = "fail_all"
        elif rng.random() < cfg["rate"]:
            kinds = [k for k in cfg["faults"]
                     if (k != "complete-error" or req.kind == "complete")
                     and (k != "flip" or req.length > 0)
                     and (k != "truncate" or req.method != "HEAD")]
            fault = rng.choice(kinds) if kinds else None
        with self.lock:
            # The limit is taken under the lock: two requests drawn at once
            # never both spend its last fault.
            if fault and fault != "fail_all" and self.cfg["fault_limit"] >= 0:
                if self.cfg["fault_limit"] == 0:
                    fault = None
                else:
                    self.cfg["fault_limit"] -= 1
            entry = {"method": req.method, "path": req.target, "status": None,
                     "fault": fault, "bytes": req.length}
            if fault:
                self.stats["faults"][fault] += 1
            self.log.append(entry)
        return fault, rng, cfg, entry

    def damage_answer(self, req, status, framing):
        """How to damage this answer ("byte", "digit"), or None."""
        with self.lock:
            c = self.cfg
            if not c["answer_match"] or c["answer_times"] == 0 or req.method != "GET" \
                    or status != 200 or framing != "length" \
                    or not re.search(c["answer_match"], unquote(req.path)):
                return None
            self.answers_seen += 1
            if self.answers_seen <= c["answer_skip"] or \
                    0 <= c["answer_times"] <= self.answers_hit:
                return None
            self.answers_hit += 1
            self.stats["answers_damaged"] += 1
            return c["answer_how"]

    def done(self, entry):
        if self.logfile:
            with self.lock:
                self.logfile.write(json.dumps(entry) + "\n")

    def wants_crc32c(self, upload_id):
        with self.lock:
            return upload_id in self.crc_uploads

    def track_crc32c(self, upload_id, keep):
        with self.lock:
            if keep:
                self.crc_uploads[upload_id] = None
                if len(self.crc_uploads) > MAX_UPLOADS:
                    del self.crc_uploads[next(iter(self.crc_uploads))]
            else:
                self.crc_uploads.pop(upload_id, None)


# --- one client connection
class Connection:
    """Serves one client connection in its own thread, request after request,
    with its own upstream connection (reopened whenever moto closes it)."""

    def __init__(self, proxy, sock):
        self.p = proxy
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client = Stream(sock)
        self.up = None
        self.body_buf = bytearray()
        self.copy_buf = memoryview(bytearray(COPY_BUF))

    def run(self):
        try:
            while self.serve_one():
                pass
        except HttpError as e:
            with contextlib.suppress(OSError):
                self.send(response(e.status, body=str(e).encode(), close=True))
        except (EOFError, OSError):
            pass        # the client went away, or we cut it on purpose
        except Exception:
            traceback.print_exc()
        finally:
            self.drop_upstream()
            self.client.sock.close()

    def send(self, data):
        self.client.sock.sendall(data)

    def drop_upstream(self):
        if self.up:
            self.up.sock.close()
            self.up = None

    def read_body(self, n):
        """The next n body bytes, as a view of this connection's buffer valid
        until the next call: reusing it spares the page faults of a fresh
        64 MiB bytearray per part."""
        if len(self.body_buf) < n:
            self.body_buf = bytearray(n)
        mv = memoryview(self.body_buf)[:n]
        self.client.read_into(mv)
        if len(self.body_buf) > KEEP_BODY_BUF:
            self.body_buf = bytearray()     # mv holds the big one while it is used
        return mv

    def serve_one(self):
        """Serve one request; False when the connection must close."""
        head = self.client.read_head()
        if head is None:
            return False
        req = Request(head)
        if req.path.startswith("/__proxy/"):
            return self.control(req)
        fault, rng, cfg, entry = self.p.draw(req)
        fault = self.p.hold(req, fault, entry)
        try:
            return self.handle(req, fault, rng, cfg, entry)
        finally:
            self.p.done(entry)

    def answer(self, entry, req, status, code, message, close=False):
        entry["status"] = status
        close = close or req.close
        self.send(s3_error(req, status, code, message, close))
        return not close

    def handle(self, req, fault, rng, cfg, entry):
        if "chunked" in tokens(req.headers.get("transfer-encoding")):
            return self.answer(entry, req, 411, "MissingContentLength",
                               "You must provide the Content-Length HTTP header.", close=True)
        if req.length > MAX_BODY:
            return self.answer(entry, req, 400, "EntityTooLarge",
                               "Your proposed upload exceeds the maximum allowed size", close=True)
        # The body is held here before it goes on, so the 100 Continue is
        # ours (moto's own, which it sends twice, is skipped).
        if req.length and "100-continue" in tokens(req.headers.get("expect")):
            self.send(b"HTTP/1.1 100 Continue\r\n\r\n")

        if fault in ("reset-request", "stall"):
            part = rng.randrange(req.length) if req.length else 0
            self.read_body(part)
            self.p.count("bytes_in", part)
            if fault == "stall":
                threading.Event().wait(cfg["stall_s"])
            else:
                rst_close(self.client.sock)
            return False

        body = self.read_body(req.length)
        self.p.count("bytes_in", req.length)
        if fault == "flip":
            body[rng.randrange(req.length)] ^= rng.randrange(1, 256)
        if self.p.sink and self.p.creds:
            err = verify_sigv4(req, body, *self.p.creds)
            if err:
                return self.answer(entry, req, *err)
        if "aws-chunked" in tokens(req.headers.get("content-encoding")):
            return self.answer(entry, req, 501, "NotImplemented", "s3_proxy does not decode aws-chunked bodies.")
        if fault == "500":
            return self.answer(entry, req, 500, "InternalError", "We encountered an internal error. Please try again.")
        if fault in ("503", "fail_all"):
            return self.answer(entry, req, 503, "SlowDown", "Please reduce your request rate.")
        if fault == "complete-error":
            # Real S3 can fail a Complete after it has sent its 200 head.
            return self.answer(entry, req, 200, "InternalError", "We encountered an internal error. Please try again.")

        err = self.check_body(req, body)
        if err:
            self.p.count("baddigest" if err[1] == "BadDigest" else "invalid")
            if fault == "flip":
                self.p.count("flip_caught")
            return self.answer(entry, req, *err)
        if fault == "flip":
            self.p.count("flip_missed")
        self.p.count("forwarded")
        if self.p.sink:
            status, head, rbody = self.sink_answer(req, body)
            self.learn(req, status, rbody)
            return self.deliver(req, status, head, rbody, fault, rng, entry, req.close)
        return self.forward(req, body, fault, rng, entry)

    def check_body(self, req, body):
        """None if the body matches its checksum headers, else the S3 error."""
        h = req.headers
        present = [name for name in DIGESTS if name in h]
        for name in present:
            if req.kind == "complete" and name != "content-md5":
                continue        # a full-object checksum, not the XML's
            label, digest, size = DIGESTS[name]
            try:
                want = base64.b64decode(h[name], validate=True)
            except binascii.Error:
                want = b""
            md5 = name == "content-md5"
            if len(want) != size:
                if md5:
                    return 400, "InvalidDigest", "The Content-MD5 you specified was invalid."
                return 400, "InvalidRequest", f"Value for {name} header is invalid."
            if digest(body) != want:
                return 400, "BadDigest", ("The Content-MD5 you specified did not match what we received."
                                          if md5 else f"The {label} you specified did not match the calculated checksum.")
        if req.kind == "part" and "x-amz-checksum-crc32c" not in h and self.p.wants_crc32c(req.params["uploadId"]):
            sent = next((DIGESTS[n][0].lower() for n in present if n != "content-md5"), "null")
            return 400, "InvalidRequest", ("Checksum Type mismatch occurred, expected checksum "
                                           f"Type: crc32c, actual checksum Type: {sent}")
        return None

    def learn(self, req, status, rbody):
        """Track the uploads created with CRC32C; rbody: a Create's answer."""
        if req.kind == "create" and status == 200 \
                and req.headers.get("x-amz-checksum-algorithm", "").upper() == "CRC32C":
            m = re.search(rb"<UploadId>([^<]+)</UploadId>", rbody)
            if m:
                self.p.track_crc32c(html.unescape(m.group(1).decode()), True)
        elif req.kind in ("complete", "abort") and 200 <= status < 300:
            self.p.track_crc32c(req.params["uploadId"], False)

    # -- upstream

    def exchange(self, req, body):
        """Send the request upstream; (status, head) of its final answer, with
        the body still to be read.  A kept-alive connection that the upstream
        closed meanwhile gets one retry on a fresh one."""
        for _ in range(2):
            reused = self.up is not None
            try:
                if not reused:
                    self.up = Stream(socket.create_connection(self.p.upstream, timeout=UPSTREAM_TIMEOUT))
                    self.up.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if len(body) <= 65536:
                    self.up.sock.sendall(req.head + body)
                else:
                    self.up.sock.sendall(req.head)
                    self.up.sock.sendall(body)
                while (head := self.up.read_head()) is not None:
                    if not head.startswith(b"HTTP/1.") or not head[9:12].isdigit():
                        raise UpstreamError("bad status line")
                    if int(head[9:12]) >= 200:          # 1xx: skipped
                        return int(head[9:12]), head
            except (OSError, EOFError, HttpError) as e:
                self.drop_upstream()
                raise UpstreamError(e) from None
            self.drop_upstream()
            if not reused:
                break
        raise UpstreamError("closed without answering")

    def copy_body(self, framing, length, out):
        """Pass a response body from upstream to out(bytes-like), as framed."""
        mv = self.copy_buf

        def copy(n):
            while n:
                k = self.up.read_some(mv[:min(n, len(mv))])
                if k == 0:
                    raise EOFError("upstream closed inside a body")
                out(mv[:k])
                n -= k

        if framing == "length":
            copy(length)
        elif framing == "chunked":
            while True:
                line = self.up.read_line()
                out(line)
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    break
                copy(size + 2)
            while (line := self.up.read_line()) != b"\r\n":    # trailers
                out(line)
            out(line)
        elif framing == "close":
            while k := self.up.read_some(mv):
                out(mv[:k])

    def forward(self, req, body, fault, rng, entry):
        try:
            status, head = self.exchange(req, body)
            headers = parse_headers(head[:-4].decode("latin-1").split("\r\n")[1:])
            framing, length = body_framing(req.method, status, headers)
        except (UpstreamError, HttpError) as e:
            self.p.count("upstream_errors")
            self.drop_upstream()
            return self.answer(entry, req, 502, "BadGateway", f"s3_proxy: upstream: {e}")
        up_close = framing == "close" or "close" in tokens(headers.get("connection"))
        close = req.close or framing == "close"
        damage = self.p.damage_answer(req, status, framing)
        try:
            if (fault in ("reset-response", "truncate", "drop-response")
                    or req.kind == "create" or damage):
                rbody = bytearray()
                self.copy_body(framing, length, rbody.extend)
                self.learn(req, status, rbody)
                if damage:
                    rbody = damage_body(rbody, damage, rng)
                    entry["fault"] = f"{entry['fault']},answer-{damage}" if entry["fault"] \
                        else f"answer-{damage}"
                return self.deliver(req, status, head, bytes(rbody), fault, rng, entry, close)
            entry["status"] = status
            self.send(client_head(head, close))
            self.copy_body(framing, length, self.send)
            self.learn(req, status, None)
            return not close
        except (OSError, EOFError, ValueError, HttpError) as e:
            # Either side broke mid-answer: neither connection is in step now.
            up_close = True
            raise EOFError(e) from None
        finally:
            if up_close:
                self.drop_upstream()

    def deliver(self, req, status, head, rbody, fault, rng, entry, close):
        """Send a buffered answer whole, or broken as the fault says."""
        entry["status"] = status
        head = client_head(head, close or fault == "truncate")
        if fault == "drop-response":
            rst_close(self.client.sock)
            return False
        if fault == "reset-response":
            whole = head + rbody
            self.send(whole[:rng.randrange(head.index(b"\r\n") + 2, len(whole))])
            rst_close(self.client.sock)
            return False
        if fault == "truncate":
            self.send(head + rbody[:rng.randrange(len(rbody))] if rbody else head[:-2])
            return False
        self.send(head + rbody)
        return not close

    # -- sink

    def sink_answer(self, req, body):
        """(status, head, body) of what S3 would answer; nothing is stored."""
        bucket, _, key = unquote(req.path).lstrip("/").partition("/")
        bucket, key = html.escape(bucket, False), html.escape(key, False)
        etag = f'"{uuid.uuid4().hex}"'
        rid = [("x-amz-request-id", uuid.uuid4().hex[:16].upper())]
        xml = [("Content-Type", "application/xml")] + rid
        top = '<?xml version="1.0" encoding="UTF-8"?>\n'
        if req.kind == "create":
            # 32 random bytes in base64: '+', '/' and '=' test the client's encoding
            upload_id = base64.b64encode(os.urandom(32)).decode()
            data = response(200, xml, (f"{top}<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket>"
                                       f"<Key>{key}</Key><UploadId>{upload_id}</UploadId>"
                                       "</InitiateMultipartUploadResult>").encode())
        elif req.kind in ("part", "put"):
            crc = [("x-amz-checksum-crc32c", req.headers["x-amz-checksum-crc32c"])] \
                if "x-amz-checksum-crc32c" in req.headers else []
            data = response(200, [("ETag", etag)] + crc + rid)
        elif req.kind == "complete":
            parts = bytes(body).count(b"<Part>")
            data = response(200, xml, (f"{top}<CompleteMultipartUploadResult><Location>/{bucket}/{key}"
                                       f"</Location><Bucket>{bucket}</Bucket><Key>{key}</Key>"
                                       f"<ETag>{etag[:-1]}-{parts}\"</ETag></CompleteMultipartUploadResult>").encode())
        elif req.kind in ("abort", "delete"):
            data = response(204, rid)
        elif req.kind == "delete-objects":
            data = response(200, xml, f"{top}<DeleteResult></DeleteResult>".encode())
        elif req.kind == "read":
            data = s3_error(req, 404, "NoSuchKey", "The specified key does not exist.")
        else:
            data = s3_error(req, 405, "MethodNotAllowed", "The sink does not do that.")
        i = data.index(b"\r\n\r\n") + 4
        return int(data[9:12]), data[:i], data[i:]

    # -- control API

    def control(self, req):
        if req.length > MAX_HEAD:           # settings are small
            raise HttpError(413, "control body too large")
        body = bytes(self.read_body(req.length))
        p, status = self.p, 200
        reads = {"/__proxy/stats": lambda: dict(p.stats, faults=dict(p.stats["faults"])),
                 "/__proxy/log": lambda: [dict(e) for e in p.log], "/__proxy/config": lambda: dict(p.cfg)}
        if req.method == "GET" and req.path in reads:
            with p.lock:
                data = reads[req.path]()
        elif (req.method, req.path) == ("POST", "/__proxy/config"):
            try:
                data = p.configure(json.loads(body or b"{}"))
            except (ValueError, Bad) as e:
                status, data = 400, {"error": str(e)}
        else:
            status, data = 404, {"error": f"no {req.method} {req.path}"}
        self.send(response(status, [("Content-Type", "application/json")],
                           json.dumps(data).encode(), req.close))
        return not req.close


# --- main
def upstream_addr(url):
    parts = urlsplit(url)
    port = parts.port           # a ValueError if out of range: argparse says so
    if parts.scheme != "http" or not parts.hostname or not port \
            or parts.path not in ("", "/") or parts.query:
        raise Bad("upstream: http://HOST:PORT")
    return parts.hostname, port


def write_atomic(path, text):
    """Readers never see a half-written file: they poll for it to appear."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="s3_proxy.py",
                                 description="S3 test proxy: checksum checks and fault injection.")
    ap.add_argument("--listen-port-file", required=True, metavar="FILE")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--upstream", type=upstream_addr, metavar="http://127.0.0.1:PORT")
    where.add_argument("--sink", action="store_true")
    ap.add_argument("--seed", type=v_seed, default=0)
    ap.add_argument("--rate", type=v_rate, default=0.0)
    ap.add_argument("--faults", type=v_faults, default=list(FAULTS), metavar="LIST")
    ap.add_argument("--fault-methods", type=v_methods, default=list(METHODS), metavar="LIST")
    ap.add_argument("--fault-kinds", type=v_kinds, default=list(KINDS), metavar="LIST")
    ap.add_argument("--stall-s", type=v_stall, default=30.0, metavar="S")
    ap.add_argument("--access-key", metavar="K")
    ap.add_argument("--secret-key", metavar="S")
    ap.add_argument("--pid-file", metavar="F")
    ap.add_argument("--log-file", metavar="F")
    args = ap.parse_args(argv)
    if (args.access_key is None) != (args.secret_key is None):
        ap.error("--access-key and --secret-key go together")
    if args.access_key and not args.sink:
        ap.error("--access-key/--secret-key need --sink (moto checks signatures itself)")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        proxy = Proxy(args)
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(256)
        if args.pid_file:
            write_atomic(args.pid_file, f"{os.getpid()}\n")
        # Last: a test that sees the port may connect at once.
        write_atomic(args.listen_port_file, f"{lsock.getsockname()[1]}\n")
    except OSError as e:
        print(f"s3_proxy.py: {e}", file=sys.stderr)
        return 1

    def stop(signum, frame):
        # Exit now, not after the connection threads: one may sit in a
        # stall or a long upstream read, and a test's teardown must not wait.
        if proxy.logfile:
            proxy.logfile.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def serve(sock):
        try:
            Connection(proxy, sock).run()
        finally:
            slots.release()

    while True:
        sock, _ = lsock.accept()
        if not slots.acquire(blocking=False):
            sock.close()
            continue
        threading.Thread(target=serve, args=(sock,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
