"""Run-time environment variables: FMHA_NUM_THREADS and FMHA_CPU_SIMD values the CPU
backend cannot take as given, and FMHA_GPU_PREFILL_KERNEL values the GPU planner does not
know, are replaced, and `import fmha_native` says so with a
RuntimeWarning naming what is used instead.  Each value runs in its own process (the
C side reads the variables once per process)."""
import json
import os

import pytest

from _harness import run_python

# The rules the README states: a whole number of threads >= 1, at most 4 per online CPU
# (and 1024 overall); SIMD names auto, scalar, avx2, avx512, avx512bf16.
ONLINE = max(1, min(os.sysconf("SC_NPROCESSORS_ONLN"), 1024))
CAP = min(1024, 4 * ONLINE)

_SCRIPT = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fmha_native
info = fmha_native.info()
print(json.dumps({"threads": info["cpu_threads"], "simd": info["cpu_simd"],
                  "warnings": [[w.category.__name__, str(w.message)] for w in caught
                               if "FMHA_" in str(w.message)]}))
"""


def _run(**env_vars):
    res = run_python(["-c", _SCRIPT], env_vars, drop=(
        "FMHA_NUM_THREADS", "FMHA_CPU_SIMD", "FMHA_GPU_PREFILL_KERNEL"))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _one_runtime_warning(got):
    """The message of the one FMHA_ warning the child saw, which must be a RuntimeWarning."""
    assert len(got["warnings"]) == 1, got
    category, message = got["warnings"][0]
    assert category == "RuntimeWarning"
    return message


@pytest.fixture(scope="module")
def default_simd():
    return _run()["simd"]


@pytest.mark.parametrize("value", ["abc", "-3", "0", "000", "+2", " 2", "2.5", "0x4"])
def test_num_threads_not_a_count_falls_back_to_online_cpus(value):
    got = _run(FMHA_NUM_THREADS=value)
    assert got["threads"] == ONLINE
    message = _one_runtime_warning(got)
    assert "FMHA_NUM_THREADS" in message and repr(value) in message
    assert f"using {ONLINE} threads" in message


@pytest.mark.parametrize("value", [str(CAP + 1), "100000", "9" * 40])
def test_num_threads_too_many_is_clamped(value):
    got = _run(FMHA_NUM_THREADS=value)
    assert got["threads"] == CAP
    message = _one_runtime_warning(got)
    assert f"using {CAP} threads" in message


@pytest.mark.parametrize("value", ["1", "3", str(CAP)])
def test_num_threads_valid_is_obeyed_quietly(value):
    got = _run(FMHA_NUM_THREADS=value)
    assert got == {"threads": int(value), "simd": got["simd"], "warnings": []}


def test_num_threads_empty_means_default():
    got = _run(FMHA_NUM_THREADS="")
    assert got["threads"] == ONLINE and got["warnings"] == []


@pytest.mark.parametrize("value", ["sse", "AVX2", "avx-512", "neon"])
def test_cpu_simd_unknown_falls_back_to_auto(value, default_simd):
    got = _run(FMHA_CPU_SIMD=value)
    assert got["simd"] == default_simd
    message = _one_runtime_warning(got)
    assert repr(value) in message and "using auto" in message


def test_cpu_simd_known_names_are_quiet(default_simd):
    assert _run(FMHA_CPU_SIMD="scalar") == {"threads": ONLINE, "simd": "scalar", "warnings": []}
    assert _run(FMHA_CPU_SIMD="auto")["simd"] == default_simd
    assert _run(FMHA_CPU_SIMD="auto")["warnings"] == []
    # A cap above what the CPU has is a cap, not a request: the best path it has runs.
    for name, below in (("avx2", ("scalar",)), ("avx512", ("scalar", "avx2")),
                        ("avx512bf16", ("scalar", "avx2", "avx512"))):
        got = _run(FMHA_CPU_SIMD=name)
        assert got["warnings"] == []
        assert got["simd"] in below + (name,)


@pytest.mark.parametrize("value", ["SM90", "hopper", "wgmma", "mma ", "1"])
def test_gpu_prefill_kernel_unknown_warns_auto(value):
    got = _run(FMHA_GPU_PREFILL_KERNEL=value)
    message = _one_runtime_warning(got)
    assert "FMHA_GPU_PREFILL_KERNEL" in message and repr(value) in message
    assert "using auto" in message


@pytest.mark.parametrize("value", ["auto", "mma", "sm90", ""])
def test_gpu_prefill_kernel_known_names_are_quiet(value):
    assert _run(FMHA_GPU_PREFILL_KERNEL=value)["warnings"] == []
