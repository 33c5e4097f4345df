"""Rebuilds in one checkout build what their settings ask for.

pip builds a local directory in place, so a second `pip install .` finds the first
one's build/ folder; setuptools alone then skipped the link whenever the old module
was newer than the sources, and a changed FMHA_BACKENDS silently kept the old
backends. This test builds a copy of the tree several times into fresh targets
with different settings and asks each result which backends it has. It needs a GPU
compiler (a setting that info() can see has to change) and several minutes.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow


def _gpu_backend():
    """(backend name, build settings) for the GPU compiler found here, or None."""
    # Where setup.py looks for nvcc.
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if shutil.which("nvcc") or any(h and os.path.exists(os.path.join(h, "bin", "nvcc"))
                                   for h in homes):
        # One arch and two compiles at a time keep this to a few minutes on 2 cores.
        return "cuda", {"FMHA_BACKENDS": "cuda", "FMHA_CUDA_ARCHS": "80",
                        "FMHA_NVCC_THREADS": "2"}
    if shutil.which("hipcc"):
        return "hip", {"FMHA_BACKENDS": "hip", "FMHA_HIP_ARCHS": "gfx90a",
                       "FMHA_NVCC_THREADS": "2"}
    return None


def _copy_tree(dst):
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "*.so",
        ".benchmarks"))


def _install(tree, target, settings):
    """pip install the tree (built in place, as a user's checkout is) into target."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FMHA_")}
    env.update(settings)
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "-v",
           "--target", target, tree]
    res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    log = res.stdout + res.stderr
    assert res.returncode == 0, f"pip install with {settings} failed:\n{log[-4000:]}"
    return log


def _backends(target, cwd):
    """info()['backends'] of the module installed in target, asked in a new process."""
    code = ("import json, fmha_native, _fmha_native; "
            "print(json.dumps([_fmha_native.__file__, fmha_native.info()['backends']]))")
    env = dict(os.environ, PYTHONPATH=target)
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    module_file, backends = json.loads(res.stdout.strip().splitlines()[-1])
    assert os.path.realpath(module_file).startswith(os.path.realpath(target)), \
        f"imported {module_file}, not the build under test in {target}"
    return backends


def _kernel_objects(tree):
    """{path: mtime} of the compiled kernel objects in the tree's build folder."""
    return {p: os.stat(p).st_mtime_ns
            for p in glob.glob(os.path.join(tree, "build", "*", "kernels", "*.o"))
            if not os.path.basename(p).startswith("arch_probe")}


def test_rebuild_follows_backend_setting(tmp_path):
    gpu = _gpu_backend()
    if gpu is None:
        pytest.skip("no nvcc or hipcc here: without a GPU compiler no build setting that "
                    "info() reports can change, so a stale link cannot be seen")
    if subprocess.run([sys.executable, "-m", "pip", "--version"],
                      capture_output=True).returncode != 0:
        pytest.skip("pip is not available to this Python")
    name, gpu_settings = gpu
    tree = str(tmp_path / "tree")
    _copy_tree(tree)
    want_gpu = ["cpu", name]

    _install(tree, str(tmp_path / "t1"), {"FMHA_BACKENDS": "cpu"})
    assert _backends(str(tmp_path / "t1"), str(tmp_path)) == ["cpu"]

    # Same checkout, same build/: the GPU backend must be linked in now.
    _install(tree, str(tmp_path / "t2"), gpu_settings)
    assert _backends(str(tmp_path / "t2"), str(tmp_path)) == want_gpu
    objects = _kernel_objects(tree)
    assert objects, "no kernel objects in the build folder after a GPU build"

    # And back: a CPU-only request must not keep the GPU module.
    _install(tree, str(tmp_path / "t3"), {"FMHA_BACKENDS": "cpu"})
    assert _backends(str(tmp_path / "t3"), str(tmp_path)) == ["cpu"]

    # The GPU settings again: relinked with the kernels compiled the first time.
    log = _install(tree, str(tmp_path / "t4"), gpu_settings)
    assert _backends(str(tmp_path / "t4"), str(tmp_path)) == want_gpu
    assert _kernel_objects(tree) == objects, \
        "unchanged kernels were compiled again (objects added or rewritten)"
    assert " -c kernels/" not in log, "a kernel compile ran although nothing changed"
