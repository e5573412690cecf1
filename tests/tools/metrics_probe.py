#!/usr/bin/env python3
"""metrics_probe.py - reads and pokes ckptd's Prometheus endpoint (metrics.sh).

  metrics_probe.py samples URL|FILE   the exposition text parsed with
                                      prometheus_client's own parser, checked
                                      (HELP and TYPE on every family, histogram
                                      buckets cumulative and ending in +Inf =
                                      _count), printed as JSON:
                                      {"content_type": ..., "types": {family: type},
                                       "samples": [[name, {labels}, value], ...]}
  metrics_probe.py raw HOST PORT CASE one hand-made request; prints the status
                                      line, the headers and the body's length
                                      as JSON
  metrics_probe.py hostile HOST PORT  opens what a hostile local user could
                                      (100 KB of garbage, idle connections past
                                      the cap, a request never finished), then
                                      scrapes while they are all still open;
                                      prints what the scrape got

Exit status 0, or 1 with the reason on stderr.
"""
import json
import socket
import sys
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def fail(msg):
    print("metrics_probe: " + msg, file=sys.stderr)
    sys.exit(1)


def fetch(source):
    if source.startswith("http://"):
        with urllib.request.urlopen(source, timeout=10) as r:
            return r.read().decode("utf-8"), r.headers.get("Content-Type")
    with open(source, encoding="utf-8") as f:
        return f.read(), None


def samples(source):
    text, ctype = fetch(source)
    # Every family the text declares has both lines, before its samples.
    helps = {l.split(" ")[2] for l in text.splitlines() if l.startswith("# HELP ")}
    types = {}
    for l in text.splitlines():
        if l.startswith("# TYPE "):
            _, _, name, kind = l.split(" ", 3)
            types[name] = kind
    if helps != set(types):
        fail("HELP and TYPE lines differ: %s" % sorted(helps ^ set(types)))
    if not text.endswith("\n"):
        fail("the text does not end with a newline")
    out = []
    for fam in text_string_to_metric_families(text):
        buckets = {}
        for s in fam.samples:
            out.append([s.name, s.labels, s.value])
            if fam.type == "histogram":
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                b = buckets.setdefault(key, {"le": [], "count": None})
                if s.name.endswith("_bucket"):
                    b["le"].append((s.labels["le"], s.value))
                elif s.name.endswith("_count"):
                    b["count"] = s.value
        for key, b in buckets.items():
            les = b["le"]
            if not les or les[-1][0] != "+Inf":
                fail("%s%s: buckets do not end in +Inf" % (fam.name, key))
            bounds = [float(le) for le, _ in les]
            if bounds != sorted(bounds):
                fail("%s%s: bucket bounds out of order" % (fam.name, key))
            counts = [v for _, v in les]
            if counts != sorted(counts):
                fail("%s%s: buckets not cumulative: %s" % (fam.name, key, counts))
            if counts[-1] != b["count"]:
                fail("%s%s: +Inf %s != _count %s" % (fam.name, key, counts[-1], b["count"]))
    print(json.dumps({"content_type": ctype, "types": types, "samples": out}))


def exchange(host, port, data, shut=True):
    """Sends data, reads the answer to its end (the server closes)."""
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
    return got


def parse_answer(got):
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    return {"status": lines[0], "headers": headers, "body_len": len(body),
            "body": body[:200].decode("latin-1")}


CASES = {
    "get": b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    "query": b"GET /metrics?x=1 HTTP/1.0\r\n\r\n",
    "head": b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    "notfound": b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
    "root": b"GET / HTTP/1.1\r\n\r\n",
    "post": b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    "delete": b"DELETE /metrics HTTP/1.1\r\n\r\n",
    "garbage": b"\x00\x01\x02 not http at all\r\n\r\n",
    "http2": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "lowercase": b"get /metrics HTTP/1.1\r\n\r\n",
    "nospace": b"GET/metrics HTTP/1.1\r\n\r\n",
    "version": b"GET /metrics HTTP/9.9\r\n\r\n",
    "bighead": b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 9000 + b"\r\n\r\n",
    "nolf": b"G" * 9000,
}


def raw(host, port, case):
    print(json.dumps(parse_answer(exchange(host, int(port), CASES[case]))))


def hostile(host, port):
    port = int(port)
    held = []
    # 100 KB of garbage, no newline: the server answers 400 after 8 KiB and
    # stops reading; this client never reads the answer.
    g = socket.create_connection((host, port), timeout=10)
    g.setblocking(False)
    sent = 0
    blob = b"\xff" * (100 << 10)
    deadline = time.monotonic() + 5
    while sent < len(blob) and time.monotonic() < deadline:
        try:
            sent += g.send(blob[sent:])
        except (BlockingIOError, InterruptedError):
            time.sleep(0.01)
        except OSError:
            break  # closed on us: as good
    held.append(g)
    # Idle connections, more than the server's cap (16), and a request
    # head that never ends.
    for _ in range(20):
        held.append(socket.create_connection((host, port), timeout=10))
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
    held.append(s)
    # All of them still open: a scrape must be answered.
    got = exchange(host, port, CASES["get"], shut=False)
    ans = parse_answer(got)
    print(json.dumps({"status": ans["status"], "body_len": ans["body_len"],
                      "held": len(held), "saves": "ckptd_saves_total" in got.decode("latin-1")}))
    for h in held:
        h.close()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "samples":
        samples(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "raw":
        raw(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "hostile":
        hostile(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    try:
        main()
    except (OSError, urllib.error.URLError, ValueError) as e:
        fail("%s: %s" % (type(e).__name__, e))
