"""pytest configuration: the backend fixture and the report header.

From the repository root `import fmha_native` finds the tree's Python files and the
compiled _fmha_native that `pip install ".[test]"` installed.
"""
import os

import pytest

try:
    import fmha_native
except ImportError as exc:  # pragma: no cover - a setup problem, said plainly
    raise ImportError("fmha_native is not installed: run `pip install \".[test]\"` from the "
                      f"repository root first ({exc})") from exc

from _harness import Backend, NO_GPU_REASON, gpu_devices  # noqa: E402


def pytest_report_header(config):
    info = fmha_native.info()
    return [f"fmha_native {info.get('version')} from {os.path.dirname(fmha_native.__file__)}",
            f"backends {info.get('backends')}, devices {[d.get('name') for d in gpu_devices()]}, "
            f"cpu_threads {info.get('cpu_threads')}, cpu_simd {info.get('cpu_simd')}"]


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):
    """Each backend in turn: the CPU always, the GPU only when a device is visible."""
    if request.param == "gpu" and not gpu_devices():
        pytest.skip(NO_GPU_REASON)
    return Backend(request.param)


@pytest.fixture
def gpu_backend():
    if not gpu_devices():
        pytest.skip(NO_GPU_REASON)
    return Backend("gpu")


@pytest.fixture
def cpu():
    return Backend("cpu")
