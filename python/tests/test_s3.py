# SPDX-License-Identifier: MIT
"""checkpoint_id as an s3:// URL: a real ckptd with an S3 root on a moto
server (127.0.0.1, signatures checked: tests/tools/s3_fixture.py); save,
latest, list and load through S3, the bytes checked by boto3 too."""
import json
import os
import subprocess
import sys

import pytest
import torch

import ckptd
import ckptd.torch as ct
from conftest import REPO, Daemon

pytest.importorskip("moto")
boto3 = pytest.importorskip("boto3")


@pytest.fixture
def s3(tmp_path):
    d = tmp_path / "moto"
    fixture = os.path.join(REPO, "tests", "tools", "s3_fixture.py")
    out = subprocess.run([sys.executable, fixture, "start", "--dir", str(d)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        pytest.fail("moto did not start: %s" % out.stderr)
    try:
        with open(d / "s3.json") as f:
            env = json.load(f)
        saved = {k: os.environ.get(k) for k in list(env) + ["AWS_ENDPOINT_URL_S3",
                                                            "AWS_EC2_METADATA_DISABLED"]}
        for k, v in env.items():
            os.environ[k] = str(v)
        os.environ["AWS_ENDPOINT_URL_S3"] = env["S3_ENDPOINT"]
        os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
        yield env
    finally:
        subprocess.run([sys.executable, fixture, "stop", "--dir", str(d)], timeout=300)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_save_latest_list_load_through_s3(tmp_path, s3):
    root = "s3://%s/py/run-1" % s3["S3_BUCKET"]
    d = Daemon(tmp_path / "d", extra_conf="root = %s\ns3_endpoint = %s\n"
               % (root, s3["S3_ENDPOINT"])).start()
    try:
        ckptd.configure(socket=d.sock, arena_bytes="64M")
        g = torch.Generator().manual_seed(5)
        states = {}
        for step in (100, 200):
            st = {"w": torch.randn(300, 1000, generator=g), "step": step, "tag": "s%d" % step}
            ct.save(st, checkpoint_id="%s/step-%d" % (root, step), step=step,
                    metrics={"loss": 1.0 / step})
            states[step] = st
        assert ckptd.latest(root) == root + "/step-200"
        assert [(c.name, c.step) for c in ckptd.list(root)] == [("step-100", 100),
                                                                ("step-200", 200)]
        dest = {"w": torch.zeros(300, 1000), "step": 0, "tag": ""}
        ct.load(dest, checkpoint_id=root + "/step-100")
        assert torch.equal(dest["w"], states[100]["w"]) and dest["tag"] == "s100"
        # An independent client sees the committed manifest.
        obj = boto3.client("s3").get_object(Bucket=s3["S3_BUCKET"],
                                            Key="py/run-1/step-200/manifest.json")
        assert json.loads(obj["Body"].read())["step"] == 200
    finally:
        d.stop()
