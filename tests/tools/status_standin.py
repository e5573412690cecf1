#!/usr/bin/env python3
"""status_standin.py - a stand-in ckptd that answers `ckptctl status` with
reports the test wrote, so exact figures can be checked (rates between two
reports, ETAs, fields of other daemon versions, hostile strings).

    status_standin.py SOCKET REPORTS.json

REPORTS.json holds a JSON array; each element is the report for one
connection, in order (a string element is sent as the report's text as it
is, to test reports that are not JSON objects).  After the last one it
closes and removes the socket and exits 0, as a daemon that went away.
Prints "ready" once it listens.  The protocol's magic, version and message
types are read from shm/proto.h, so they follow the C code.  Standard
library only (the system python3).
"""
import json
import os
import re
import socket
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HDR = struct.Struct("<IHHII")


def proto_constants():
    text = open(os.path.join(HERE, "..", "..", "shm", "proto.h")).read()
    magic = int(re.search(r"#define PROTO_MAGIC\s+(0x[0-9a-fA-F]+)u?", text).group(1), 16)
    version = int(re.search(r"#define PROTO_VERSION\s+(\d+)u?", text).group(1))
    types = {m.group(1): int(m.group(2))
             for m in re.finditer(r"\bPROTO_([A-Z_]+)\s*=\s*(\d+)", text)}
    return magic, version, types


def main():
    path, reports_file = sys.argv[1], sys.argv[2]
    reports = json.load(open(reports_file))
    magic, version, t = proto_constants()

    def msg(kind, body):
        return HDR.pack(magic, version, kind, HDR.size + len(body), 0) + body

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(8)
    print("ready", flush=True)
    for rep in reports:
        conn, _ = srv.accept()
        with conn:
            hello = conn.recv(4096)
            if len(hello) < HDR.size or HDR.unpack_from(hello)[2] != t["HELLO"]:
                sys.exit("standin: not a HELLO")
            # struct proto_hello_ok: arena_bytes, slot_bytes, client_id,
            # reserved, spill_dir[512]
            conn.send(msg(t["HELLO_OK"], struct.pack("<QQII512s", 0, 0, 7, 0, b"")))
            req = conn.recv(4096)
            if len(req) < HDR.size or HDR.unpack_from(req)[2] != t["STATUS_REQ"]:
                sys.exit("standin: not a STATUS_REQ")
            data = (rep if isinstance(rep, str) else json.dumps(rep)).encode()
            fd = os.memfd_create("status")
            os.write(fd, data)
            socket.send_fds(conn, [msg(t["STATUS_REPLY"], struct.pack("<Q", len(data)))], [fd])
            os.close(fd)
            conn.recv(16)  # until ckptctl hangs up
    srv.close()
    os.unlink(path)


if __name__ == "__main__":
    main()
