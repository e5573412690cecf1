# SPDX-License-Identifier: MIT
"""The package as packaged: what `import ckptd` pulls in, which libckpt it
loads, and that its versions agree.  (The wheel itself, installed into a
fresh venv, is tests/integration/python_wheel.sh.)"""
import os
import re
import subprocess
import sys

from conftest import BUILD, REPO

PKG = os.path.join(REPO, "python")


def run_py(code, **env):
    e = dict(os.environ)
    e["PYTHONPATH"] = PKG
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run([sys.executable, "-c", code], env=e, cwd=str(REPO),
                          capture_output=True, text=True, timeout=120)


def test_import_needs_no_framework():
    r = run_py("import sys, ckptd\n"
               "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_ckptd_libckpt_is_loaded_first():
    lib = os.path.join(BUILD, "libckpt.so")
    r = run_py("import ckptd; print(ckptd.libckpt_path())", CKPTD_LIBCKPT=lib)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == lib


def test_bad_ckptd_libckpt_names_itself():
    missing = os.path.join(BUILD, "no-such-dir", "libckpt.so.0")
    r = run_py("import ckptd", CKPTD_LIBCKPT=missing)
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert missing in r.stderr and "$CKPTD_LIBCKPT" in r.stderr
    assert "CKPTD_LIBCKPT" in r.stderr.splitlines()[-1]  # how to point it elsewhere


def test_versions_agree():
    make = open(os.path.join(REPO, "Makefile")).read()
    want = re.search(r"^VERSION\s*:=\s*(\S+)", make, re.M).group(1)
    r = run_py("import ckptd; print(ckptd.__version__, ckptd.libckpt_version())",
               CKPTD_LIBCKPT=os.path.join(BUILD, "libckpt.so"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [want, want]
