# SPDX-License-Identifier: MIT
"""How the ckptd wheel is built (its metadata is in pyproject.toml).

The package is pure Python over ctypes, but it carries libckpt: the wheel
is platform-specific (py3-none-linux_x86_64: any CPython >= 3.10, this
architecture) and ckptd/_lib/ holds libckpt.so.0 with the libraries it
brings along (the Makefile's `python-lib` target says which, and why).

Where that directory comes from, first match wins:
  1. $CKPTD_LIBCKPT_BUNDLE: a directory made by `make python-lib`
     (<build>/python/lib); `make wheel` sets it;
  2. a source checkout (python/ inside the repository, as
     `pip install ./python` sees it): `make python-lib` is run there, in the
     build directory $BUILD (default build/, the one `make` uses: what is
     already built is reused, the rest compiled);
  3. anything else (an sdist, a copy of python/ alone) fails, saying so.

setuptools' own build directory is <build>/python/setuptools in a checkout
($CKPTD_SETUP_BUILD where set, as `make wheel` does), so nothing is written
under python/.
"""
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 makes wheels itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _checkout():
    return (os.path.isfile(os.path.join(REPO, "Makefile")) and
            os.path.isfile(os.path.join(REPO, "include", "ckpt.h")) and
            os.path.isdir(os.path.join(REPO, "client")))


def _build_dir():
    """The checkout's build directory: $BUILD as make takes it, else build/."""
    build = os.environ.get("BUILD") or "build"
    return build if os.path.isabs(build) else os.path.join(REPO, build)


def _bundle():
    """The directory to copy into ckptd/_lib/, made if needed."""
    given = os.environ.get("CKPTD_LIBCKPT_BUNDLE")
    if given:
        return given
    if not _checkout():
        raise SystemExit(
            "ckptd: no libckpt to bundle: build from a source checkout of ckptd "
            "(`pip install ./python` or `make wheel` in the repository), or set "
            "CKPTD_LIBCKPT_BUNDLE to a directory made by `make python-lib`")
    if os.environ.get("SANITIZE"):
        raise SystemExit("ckptd: SANITIZE is set: python cannot load a sanitized libckpt")
    jobs = str(max(1, min(os.cpu_count() or 1, 8)))
    # make's own check of the build packages names what is missing and says
    # `make deps`; its output reaches the user with `pip install -v`.
    r = subprocess.run(["make", "-C", REPO, "--no-print-directory", "-j" + jobs,
                        "BUILD=" + _build_dir(), "python-lib"])
    if r.returncode != 0:
        raise SystemExit("ckptd: `make python-lib` in %s failed (exit %d): run it there to see "
                         "why (`make deps` installs the build packages)" % (REPO, r.returncode))
    return os.path.join(_build_dir(), "python", "lib")


class BuildPy(build_py):
    def run(self):
        pkg = os.path.join(self.build_lib, "ckptd")
        shutil.rmtree(pkg, ignore_errors=True)  # nothing left from an earlier build
        super().run()
        src = _bundle()
        if not os.path.isfile(os.path.join(src, "libckpt.so.0")):
            raise SystemExit("ckptd: %s has no libckpt.so.0 (made by `make python-lib`)" % src)
        shutil.copytree(src, os.path.join(pkg, "_lib"))


class BinaryDistribution(Distribution):
    # It carries a shared library: installed into platlib, and the wheel is
    # not "pure" (Root-Is-Purelib: false, files at the wheel's root).
    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    def get_tag(self):
        # ctypes, no extension module: any Python 3 of this platform.
        return "py3", "none", super().get_tag()[2]


options = {}
base = os.environ.get("CKPTD_SETUP_BUILD")
if not base and _checkout():
    base = os.path.join(_build_dir(), "python", "setuptools")
if base:
    os.makedirs(base, exist_ok=True)
    options = {"build": {"build_base": base}, "egg_info": {"egg_base": base}}

setup(distclass=BinaryDistribution, cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
      options=options)
