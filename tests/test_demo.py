"""`python -m fmha_native` runs, checks itself against the reference and says so."""
import re

import pytest

import fmha_native
from _harness import run_python


def _run_demo(*args):
    # The child must import the same fmha_native the tests import.
    return run_python(["-m", "fmha_native", *args], timeout=300)


def test_demo_cpu_small():
    res = _run_demo("--device", "cpu", "--shape", "1,4,2,100,130,32", "--runs", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    for word in ("fmha_native.explain", "PASS", "FLOP/s", "B/s", "kernel", "num_splits",
                 "float32", "median of 2 runs"):
        assert word in res.stdout, f"{word!r} missing from:\n{res.stdout}"
    assert "f32" not in res.stdout  # dtypes by their NumPy/torch names


def test_demo_rates_read_well():
    """Rates are shown in the unit that puts them in [1, 1000): a CPU run says GFLOP/s
    (or MFLOP/s), not 0.0358 TFLOP/s."""
    res = _run_demo("--device", "cpu", "--shape", "1,2,1,64,64,32", "--runs", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    rates = re.findall(r"([0-9.]+(?:e[-+]?\d+)?) ([kMGT]?)(FLOP/s|B/s)", res.stdout)
    assert {unit for _, _, unit in rates} == {"FLOP/s", "B/s"}, res.stdout
    for value, prefix, unit in rates:
        assert float(value) < 1000, (value, prefix, unit)
        assert prefix == "" or float(value) >= 1, (value, prefix, unit)


def test_demo_bf16_non_causal():
    res = _run_demo("--device", "cpu", "--dtype", "bf16", "--shape", "2,2,1,1,300,64",
                    "--no-causal", "--num-splits", "2", "--runs", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout


@pytest.mark.parametrize("args, word", [
    (["--shape", "1,2,3"], "--shape"),
    (["--num-splits", "-1"], "--num-splits"),
    (["--num-splits", "x"], "--num-splits"),
    (["--runs", "0"], "--runs"),
    (["--runs", "-2"], "--runs"),
    (["--dtype", "float64"], "--dtype"),
    (["--device", "tpu"], "--device"),
    (["--bogus"], "--bogus"),
    (["--shape", "1,4,3,8,8,16"], "heads_kv"),
    (["--shape", "1,2,1,8,8,0"], "head_dim"),
    (["--num-splits", "100000"], "num_splits"),
])
def test_demo_argument_errors_are_one_line(args, word):
    """A bad argument exits 2 with one line on stderr naming it, no usage dump, no
    traceback, and runs nothing."""
    res = _run_demo("--device", "cpu", *args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("python -m fmha_native: error:") and word in lines[0], lines[0]
    assert "PASS" not in res.stdout and "FLOP/s" not in res.stdout


def test_demo_runs_as_many_times_as_asked(monkeypatch, capsys):
    """--runs n times n calls (plus the warm-up, the check's call and none other)."""
    from fmha_native import __main__ as demo

    calls = []
    real_forward = fmha_native.forward

    def counting_forward(*args, **kw):
        calls.append(1)
        return real_forward(*args, **kw)

    monkeypatch.setattr(fmha_native, "forward", counting_forward)
    for runs in (1, 3):
        calls.clear()
        assert demo.main(["--device", "cpu", "--shape", "1,2,1,16,16,16", "--runs", str(runs)]) == 0
        assert len(calls) == 1 + demo.WARMUP_RUNS + runs
        assert f"median of {runs} run" in capsys.readouterr().out
