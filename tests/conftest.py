"""pytest configuration: which fmha_native is tested, and the backend fixture.

`python -m pytest` puts the current directory first on sys.path, so from the repo root
the source tree's fmha_native/ (which has no compiled _C unless built in place) would
shadow the installed package.  Prefer a package whose _C imports: the source tree when
it was built in place, else the installed one.
"""
import importlib
import os
import sys

import pytest

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _forget_fmha_native():
    for name in [m for m in sys.modules if m == "fmha_native" or m.startswith("fmha_native.")]:
        del sys.modules[name]


def _import_built_fmha_native():
    try:
        importlib.import_module("fmha_native._C")
        return
    except ImportError as exc:
        first_error = exc
    _forget_fmha_native()
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _REPO_ROOT]
    try:
        importlib.import_module("fmha_native._C")
    except ImportError:
        sys.path[:] = saved
        raise ImportError(
            "fmha_native is not built: run `pip install .` (or `python setup.py build_ext "
            f"--inplace` in {_REPO_ROOT}) first; the import failed with: {first_error}"
        ) from first_error


_import_built_fmha_native()

import fmha_native  # noqa: E402  (after the path fix above)

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
