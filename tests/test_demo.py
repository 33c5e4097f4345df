"""`python -m fmha_native` runs, checks itself against the reference and says so."""
import os
import subprocess
import sys

import fmha_native


def _run_demo(*args):
    env = dict(os.environ)
    # The child must import the same fmha_native the tests import.
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "fmha_native", *args], capture_output=True,
                          text=True, env=env, cwd=package_parent, timeout=300)


def test_demo_cpu_small():
    res = _run_demo("--device", "cpu", "--shape", "1,4,2,100,130,32", "--runs", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    for word in ("plan (explain)", "PASS", "TFLOP/s", "GB/s", "kernel", "num_splits"):
        assert word in res.stdout, f"{word!r} missing from:\n{res.stdout}"


def test_demo_bf16_non_causal():
    res = _run_demo("--device", "cpu", "--dtype", "bf16", "--shape", "2,2,1,1,300,64",
                    "--no-causal", "--num-splits", "2", "--runs", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout


def test_demo_rejects_bad_shape():
    res = _run_demo("--device", "cpu", "--shape", "1,2,3")
    assert res.returncode == 2
    assert "--shape" in res.stderr
