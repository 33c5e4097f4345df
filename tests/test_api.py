"""The Python surface: output kinds and dtypes, out=/lse=, return_lse, inputs left
untouched, reference counts, explain() and info(), signatures and the type stub, the
version check against the extension, and torch tensors that require grad."""
import ast
import gc
import inspect
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import as_f64, assert_close, bits, make_qkv, np_dtype

EXPLAIN_KEYS = {"backend", "kernel", "num_splits", "block_m", "block_n", "pack_gqa", "reason", "gate"}
INFO_KEYS = {"version", "backends", "devices", "cpu_threads", "cpu_simd"}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_output_kind_dtype_shape(cpu, dtype):
    rng = np.random.default_rng(6000)
    q, k, v = make_qkv(rng, 2, 9, 31, 6, 3, 32, dtype)
    out, lse = fmha_native.forward(q, k, v, device="cpu")
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert out.dtype == np_dtype(dtype) and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (2, 6, 9)
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)


def test_return_lse_false(backend):
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(6100)
    q, k, v = make_qkv(rng, 2, 9, 31, 4, 2, 64, dtype)
    res = backend.forward_native(q, k, v, return_lse=False)
    assert not isinstance(res, tuple)
    assert tuple(res.shape) == q.shape
    ref_out = reference.forward(q, k, v, return_lse=False)
    assert_close(as_f64(res), None, ref_out, None, dtype)
    # Same values as with the lse requested.
    out, _ = backend.forward_native(q, k, v)
    assert bits(out) == bits(res)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("return_lse", [True, False])
def test_out_and_lse_given(cpu, num_splits, return_lse):
    rng = np.random.default_rng(6200)
    q, k, v = make_qkv(rng, 2, 20, 300, 4, 2, 64, "f32")
    out = np.full(q.shape, 7.0, dtype=np.float32)
    lse = np.full((2, 4, 20), 7.0, dtype=np.float32)
    expected_out, expected_lse = fmha_native.forward(q, k, v, device="cpu", num_splits=num_splits)
    kw = {"out": out, "return_lse": return_lse, "num_splits": num_splits, "device": "cpu"}
    if return_lse:
        kw["lse"] = lse
    res = fmha_native.forward(q, k, v, **kw)
    if return_lse:
        assert res[0] is out and res[1] is lse
        assert bits(lse) == bits(expected_lse)
    else:
        assert res is out
    assert bits(out) == bits(expected_out)


def test_lse_given_alone(cpu):
    rng = np.random.default_rng(6250)
    q, k, v = make_qkv(rng, 1, 5, 70, 2, 1, 16, "bf16")
    lse = np.empty((1, 2, 5), dtype=np.float32)
    out, lse_res = fmha_native.forward(q, k, v, lse=lse, device="cpu")
    assert lse_res is lse
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "bf16")


def test_out_given_strided(cpu):
    """out may be any writable view of the right shape and dtype; only it is written."""
    rng = np.random.default_rng(6260)
    q, k, v = make_qkv(rng, 2, 10, 50, 4, 2, 32, "f32")
    backing = np.full((2, 4, 10, 32 * 2), 5.0, dtype=np.float32)
    out = backing.transpose(0, 2, 1, 3)[..., ::2]
    res, _ = fmha_native.forward(q, k, v, out=out, device="cpu")
    assert res is out
    ref_out = reference.forward(q, k, v, return_lse=False)
    assert_close(as_f64(out), None, ref_out, None, "f32")
    assert (backing[..., 1::2] == 5.0).all(), "wrote outside out"


@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_inputs_unchanged(backend, num_splits):
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(6300)
    q, k, v = make_qkv(rng, 2, 40, 300, 8, 2, 64, dtype)
    q[0, 1, 2, 3] = np.nan
    if backend.use_torch:
        qd, kd, vd = backend.put(q), backend.put(k), backend.put(v)
        before = [x.clone() for x in (qd, kd, vd)]
        fmha_native.forward(qd, kd, vd, causal=True, num_splits=num_splits)
        for x, y in zip((qd, kd, vd), before):
            assert bits(x) == bits(y)
        return
    before = [bits(x) for x in (q, k, v)]
    backend.forward_native(q, k, v, causal=True, num_splits=num_splits)
    assert [bits(x) for x in (q, k, v)] == before


def test_refcounts_stable(cpu):
    rng = np.random.default_rng(6400)
    q, k, v = make_qkv(rng, 1, 4, 16, 2, 1, 16, "f32")
    out = np.empty_like(q)
    lse = np.empty((1, 2, 4), dtype=np.float32)
    objs = (q, k, v, out, lse)
    gc.collect()
    before = [sys.getrefcount(x) for x in objs]
    for i in range(1000):
        fmha_native.forward(q, k, v, device="cpu", causal=bool(i & 1))
        fmha_native.forward(q, k, v, out=out, lse=lse, device="cpu", num_splits=1 + (i % 3))
        fmha_native.forward(q, k, v, out=out, return_lse=False, device="cpu")
        fmha_native.explain(q, k, v, device="cpu")
        with pytest.raises(ValueError):
            fmha_native.forward(q, k, v, out=out, lse=lse[:, :1], device="cpu")
    gc.collect()
    assert [sys.getrefcount(x) for x in objs] == before


def test_no_leak_over_many_calls(cpu):
    """Memory traced by Python (outputs, views, error objects) does not grow with calls."""
    import tracemalloc
    rng = np.random.default_rng(6450)
    q, k, v = make_qkv(rng, 1, 8, 64, 2, 1, 32, "f32")

    def burst():
        for _ in range(300):
            fmha_native.forward(q, k, v, device="cpu")
            with pytest.raises(TypeError):
                fmha_native.forward(q, k, v.astype(np.float16), device="cpu")

    burst()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        burst()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes still held after 300 calls"


def test_explain_keys(backend):
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(6500)
    q, k, v = make_qkv(rng, 2, 16, 500, 8, 2, 64, dtype)
    plan = fmha_native.explain(backend.put(q), backend.put(k), backend.put(v), causal=True,
                               **backend.device_kw())
    assert EXPLAIN_KEYS <= set(plan), f"missing {EXPLAIN_KEYS - set(plan)}"
    assert plan["backend"] == backend.name
    assert isinstance(plan["kernel"], str) and plan["kernel"]
    assert isinstance(plan["reason"], str) and plan["reason"]
    for key in ("num_splits", "block_m", "block_n"):
        assert isinstance(plan[key], int) and plan[key] >= 1, key
    assert isinstance(plan["gate"], dict) and plan["gate"]
    for name, item in plan["gate"].items():
        assert isinstance(name, str)
        assert isinstance(item["met"], bool) and isinstance(item["why"], str) and item["why"]


def test_explain_cpu_gate_reports_unsupported_head_dim(cpu):
    rng = np.random.default_rng(6510)
    q, k, v = make_qkv(rng, 1, 2, 8, 1, 1, 600, "f32")  # the CPU covers 1..512
    try:
        plan = fmha_native.explain(q, k, v, device="cpu")
    except (NotImplementedError, ValueError) as exc:
        assert "head_dim" in str(exc)
    else:
        assert plan["gate"]["head_dim"]["met"] is False
    with pytest.raises((NotImplementedError, ValueError), match="head_dim"):
        fmha_native.forward(q, k, v, device="cpu")


def test_explain_runs_nothing(cpu):
    """explain() neither writes out nor does the work: on a problem that would take
    minutes (zero-stride inputs, so no memory) it answers at once."""
    rng = np.random.default_rng(6600)
    shape_q, shape_kv = (8, 32768, 32, 128), (8, 32768, 8, 128)
    q = np.broadcast_to(rng.standard_normal((1, 1, 1, 128), dtype=np.float32), shape_q)
    k = np.broadcast_to(rng.standard_normal((1, 1, 1, 128), dtype=np.float32), shape_kv)
    v = np.broadcast_to(rng.standard_normal((1, 1, 1, 128), dtype=np.float32), shape_kv)
    start = time.perf_counter()
    plan = fmha_native.explain(q, k, v, causal=True, device="cpu")
    assert time.perf_counter() - start < 5.0
    assert plan["backend"] == "cpu"
    small_q, small_k, small_v = make_qkv(rng, 1, 4, 16, 2, 1, 16, "f32")
    out = np.full(small_q.shape, 3.0, dtype=np.float32)
    lse = np.full((1, 2, 4), 3.0, dtype=np.float32)
    fmha_native.explain(small_q, small_k, small_v, out=out, lse=lse, device="cpu")
    assert (out == 3.0).all() and (lse == 3.0).all()


def test_info_keys():
    info = fmha_native.info()
    assert INFO_KEYS <= set(info), f"missing {INFO_KEYS - set(info)}"
    assert info["version"] == "0.1.0"
    assert "cpu" in info["backends"]
    assert set(info["backends"]) <= {"cpu", "cuda", "hip"}
    assert isinstance(info["devices"], list)
    for dev in info["devices"]:
        assert {"ordinal", "name", "arch", "sm_count"} <= set(dev)
    assert isinstance(info["cpu_threads"], int) and info["cpu_threads"] >= 1
    assert info["cpu_simd"] in ("avx512bf16", "avx512", "avx2", "scalar")
    assert issubclass(fmha_native.FmhaError, RuntimeError)


def test_public_names():
    for name in ("forward", "explain", "combine", "info", "FmhaError", "Tensor", "reference"):
        assert hasattr(fmha_native, name), name


def test_device_none_host_arrays_run(cpu):
    """device=None with host arrays runs somewhere (GPU when present and admitted, else
    CPU) and gives the reference result."""
    rng = np.random.default_rng(6700)
    q, k, v = make_qkv(rng, 1, 10, 70, 4, 2, 64, "f16")
    out, lse = fmha_native.forward(q, k, v, causal=True)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")


@pytest.mark.parametrize("name", ["cuda", "hip", "gpu"])
def test_device_gpu_without_gpu(name):
    if fmha_native.info()["devices"]:
        pytest.skip("a GPU is visible: this checks the no-GPU error")
    rng = np.random.default_rng(6800)
    q, k, v = make_qkv(rng, 1, 2, 8, 1, 1, 64, "f16")
    with pytest.raises(ValueError, match="device|GPU|gpu"):
        fmha_native.forward(q, k, v, device=name)


# The C argument lists, written from DESIGN.md's API section: (name, default) after the
# positional arguments.
FORWARD_KEYWORDS = [("causal", False), ("softmax_scale", None), ("num_splits", 0),
                    ("return_lse", True), ("out", None), ("lse", None), ("device", None),
                    ("stream", None), ("cache_seqlens", None), ("k_new", None), ("v_new", None),
                    ("max_seqlen_k", None), ("block_table", None), ("cu_seqlens_q", None),
                    ("cu_seqlens_k", None), ("max_seqlen_q", None), ("window", None),
                    ("softcap", 0.0), ("sinks", None), ("out_dtype", None), ("kv_dtype", None),
                    ("k_scale", None), ("v_scale", None)]
COMBINE_KEYWORDS = [("out", None), ("lse", None), ("stream", None), ("sinks", None)]


@pytest.mark.parametrize("name, positional, keywords", [
    ("forward", ["q", "k", "v"], FORWARD_KEYWORDS),
    ("explain", ["q", "k", "v"], FORWARD_KEYWORDS),
    ("combine", ["outs", "lses"], COMBINE_KEYWORDS)])
def test_signatures_show_the_keywords(name, positional, keywords):
    sig = inspect.signature(getattr(fmha_native, name))
    params = list(sig.parameters.values())
    assert [p.name for p in params] == positional + [k for k, _ in keywords]
    for p in params[:len(positional)]:
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is p.empty
    for p, (_, default) in zip(params[len(positional):], keywords):
        assert p.kind is inspect.Parameter.KEYWORD_ONLY
        assert p.default == default and type(p.default) is type(default), p


@pytest.mark.parametrize("name, positional, keywords", [
    ("forward", ["q", "k", "v"], FORWARD_KEYWORDS),
    ("combine", ["outs", "lses"], COMBINE_KEYWORDS)])
def test_extension_docstring_signatures_show_the_keywords(name, positional, keywords):
    """help(_fmha_native.forward) shows the signature its docstring states: every keyword."""
    sig = inspect.signature(getattr(sys.modules["_fmha_native"], name))
    assert list(sig.parameters) == positional + [k for k, _ in keywords]


def _at_most(fn, *args):
    """The argument count the C function admits, from its too-many-arguments message."""
    with pytest.raises(TypeError) as info:
        fn(*args)
    m = re.search(r"takes at most (\d+) (?:keyword )?arguments", str(info.value))
    assert m, str(info.value)
    return int(m.group(1))


def test_signatures_match_the_c_argument_lists():
    """Every keyword of the Python signatures is one the extension binds, with the
    extension's own default (passing it changes nothing), and there are no others."""
    c = sys.modules["_fmha_native"]
    rng = np.random.default_rng(6900)
    q, k, v = make_qkv(rng, 1, 3, 20, 2, 1, 16, "f32")
    fwd = inspect.signature(fmha_native.forward).parameters
    assert _at_most(c.forward, *range(len(fwd) + 1)) == len(fwd)
    assert _at_most(c.explain, *range(len(fwd) + 1)) == len(fwd)
    keywords = {name: p.default for name, p in fwd.items() if p.kind is p.KEYWORD_ONLY}
    keywords["device"] = "cpu"  # None may pick a GPU; the point is that the names bind
    base = {"device": "cpu"}
    assert fmha_native.explain(q, k, v, **keywords) == fmha_native.explain(q, k, v, **base)
    out, lse = fmha_native.forward(q, k, v, **keywords)
    ref_out, ref_lse = fmha_native.forward(q, k, v, **base)
    assert bits(out) == bits(ref_out) and bits(lse) == bits(ref_lse)

    comb = inspect.signature(fmha_native.combine).parameters
    assert _at_most(c.combine, *range(len(comb) + 1)) == len(comb)
    outs = np.stack([out, out])
    lses = np.stack([lse, lse])
    keywords = {name: p.default for name, p in comb.items() if p.kind is p.KEYWORD_ONLY}
    got = fmha_native.combine(outs, lses, **keywords)
    want = fmha_native.combine(outs, lses)
    assert bits(got[0]) == bits(want[0]) and bits(got[1]) == bits(want[1])


def test_stub_and_py_typed_ship_with_the_package():
    here = os.path.dirname(os.path.abspath(fmha_native.__file__))
    assert os.path.isfile(os.path.join(here, "py.typed"))
    stub = os.path.join(here, "__init__.pyi")
    tree = ast.parse(open(stub, encoding="utf-8").read())
    defined = {node.name for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert {"forward", "explain", "combine", "info", "Tensor", "FmhaError"} <= defined
    # Each stub overload of forward lists the keywords of the runtime signature.
    runtime = list(inspect.signature(fmha_native.forward).parameters)
    overloads = [node for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name == "forward"]
    assert overloads
    for node in overloads:
        names = [a.arg for a in node.args.args + node.args.kwonlyargs]
        assert names == runtime


def test_version_matches_the_extension_and_the_project():
    assert fmha_native.__version__ == sys.modules["_fmha_native"].__version__
    assert fmha_native.__version__ == fmha_native.info()["version"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    pyproject = os.path.join(root, "pyproject.toml")
    if not os.path.isfile(pyproject):
        pytest.skip("no pyproject.toml beside the package (an installed copy)")
    import tomllib

    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    if "version" in project:
        assert project["version"] == fmha_native.__version__


def test_mismatched_extension_is_refused(tmp_path):
    """Python files of one version with an extension of another (the repository's
    fmha_native/ next to an older installed _fmha_native) raise ImportError that says
    to reinstall."""
    (tmp_path / "_fmha_native.py").write_text("__version__ = '0.0.0-old'\n")
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), package_parent]))
    res = subprocess.run([sys.executable, "-c", "import fmha_native"], capture_output=True,
                         text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError"), res.stderr
    assert "0.0.0-old" in last and fmha_native.__version__ in last and "pip install" in last


def _torch_or_skip():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (pip install torch adds these tests)")
    return torch


def _torch_problem(torch, requires_grad=()):
    gen = torch.Generator().manual_seed(6950)
    q = torch.randn(1, 5, 4, 16, generator=gen)
    k = torch.randn(1, 9, 2, 16, generator=gen)
    v = torch.randn(1, 9, 2, 16, generator=gen)
    named = {"q": q, "k": k, "v": v}
    for name in requires_grad:
        named[name].requires_grad_(True)
    return named


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("fn", ["forward", "explain"])
def test_torch_requires_grad_refused_under_grad_mode(fn, which):
    torch = _torch_or_skip()
    t = _torch_problem(torch, requires_grad=[which])
    assert torch.is_grad_enabled()
    with pytest.raises(ValueError, match=rf"^{which} requires grad.*torch\.no_grad\(\).*"
                                         r"torch\.inference_mode\(\)"):
        getattr(fmha_native, fn)(t["q"], t["k"], t["v"], device="cpu")


def test_torch_requires_grad_out_and_combine_refused():
    torch = _torch_or_skip()
    t = _torch_problem(torch)
    out = torch.zeros(1, 5, 4, 16, requires_grad=True)
    with pytest.raises(ValueError, match=r"^out requires grad"):
        fmha_native.forward(t["q"], t["k"], t["v"], out=out, device="cpu")
    assert (out == 0).all()
    outs = torch.randn(2, 1, 5, 4, 16, requires_grad=True)
    lses = torch.randn(2, 1, 4, 5)
    with pytest.raises(ValueError, match=r"^outs requires grad"):
        fmha_native.combine(outs, lses)
    param = torch.nn.Parameter(t["k"].clone())  # requires grad by default
    with pytest.raises(ValueError, match=r"^k requires grad"):
        fmha_native.forward(t["q"], param, t["v"], device="cpu")


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_torch_requires_grad_runs_without_grad_mode(mode):
    torch = _torch_or_skip()
    t = _torch_problem(torch, requires_grad=["q", "k", "v"])
    with getattr(torch, mode)():
        out, lse = fmha_native.forward(t["q"], t["k"], t["v"], causal=True, device="cpu")
    assert not out.requires_grad
    ref_out, ref_lse = reference.forward(t["q"], t["k"], t["v"], causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")
