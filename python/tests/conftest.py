# SPDX-License-Identifier: MIT
"""Fixtures of the Python tests: a real ckptd per test (or per module),
started on a private socket under the test's own directory and stopped by
PID.  Run through tests/integration/python.sh (make test), or by hand:

    CKPT_BUILD_DIR=build python -m pytest python/tests
"""
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
BUILD = os.path.abspath(os.environ.get("CKPT_BUILD_DIR") or os.path.join(REPO, "build"))
os.environ.setdefault("CKPT_BUILD_DIR", BUILD)
if os.environ.get("CKPTD_LIBCKPT") is None and not os.path.exists(
        os.path.join(REPO, "python", "ckptd", "_lib", "libckpt.so.0")):
    os.environ["CKPTD_LIBCKPT"] = os.path.join(BUILD, "libckpt.so")


def wait_for(cond, what, timeout=120.0):
    """Waits (bounded, generously: CI machines are slow and busy) until
    cond() is true; fails naming `what` otherwise."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            pytest.fail("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(0.02)


class Daemon:
    """A ckptd of this test: .sock, .root (its one allowed root), .log,
    .proc; start(), stop() (SIGTERM, then SIGKILL), kill() (SIGKILL)."""

    def __init__(self, base, extra_conf="", env=None):
        self.base = str(base)
        self.sock = os.path.join(self.base, "ckptd.sock")
        self.root = os.path.join(self.base, "ckpt")
        self.state = os.path.join(self.base, "state")
        self.conf = os.path.join(self.base, "ckptd.conf")
        self.log = os.path.join(self.base, "ckptd.log")
        self.env = env
        self.proc = None
        os.makedirs(self.root, exist_ok=True)
        with open(self.conf, "w") as f:
            f.write("socket = %s\nroot = %s\nstate_dir = %s\narena_max = 4G\n"
                    "commit_deadline = 2m\n%s" % (self.sock, self.root, self.state, extra_conf))

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        env = dict(os.environ)
        env.update(self.env or {})
        with open(self.log, "ab") as lf:
            self.proc = subprocess.Popen([os.path.join(BUILD, "ckptd"), "-c", self.conf, "-v"],
                                         stdout=lf, stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: os.path.exists(self.sock) or self.proc.poll() is not None,
                 "ckptd to listen on %s" % self.sock)
        if self.proc.poll() is not None:
            pytest.fail("ckptd exited with %s; its log:\n%s" % (self.proc.returncode,
                                                               open(self.log).read()))
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def env_for_child(self):
        """Environment for a trainer subprocess using this daemon."""
        env = dict(os.environ)
        env["CKPTD_SOCKET"] = self.sock
        env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
        return env


@pytest.fixture
def daemon(tmp_path):
    """A running ckptd of this test; the package is pointed at it."""
    import ckptd
    d = Daemon(tmp_path / "d").start()
    # A small arena: each test connects anew, and the arena is touched
    # whole at connect (slow on these machines).  Larger saves still work
    # (staging waits for the daemon to drain).
    ckptd.configure(socket=d.sock, arena_bytes="64M")
    os.environ["CKPTD_SOCKET"] = d.sock
    yield d
    d.stop()


def pytest_report_header(config):
    return "ckptd build: %s" % BUILD
