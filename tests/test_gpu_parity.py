"""GPU parity sweep: the GPU backend against the float64 reference over dtypes, head
dims, causal, GQA/MQA, odd lengths, seqlen_q > seqlen_k, and forced split counts
(0 = the planner's choice, 1 = unsplit, 2 and 3, and 256, which the planner clamps).

Each case runs through the shared Backend (torch CUDA tensors when torch has CUDA,
otherwise NumPy arrays with device="gpu") and is held to the accuracy contract of
DESIGN.md section 2 by _harness.check_forward; every case also checks that the output
holds no NaN where the reference has none (check_forward's NaN pattern).

Every seventh case carries "quick" in its id: `pytest tests/test_gpu_parity.py -k quick`
is the subset benchmarks/tools/device_run.sh runs under compute-sanitizer.
Without a GPU every case skips, saying so; none passes without running on one.
"""
import itertools

import numpy as np
import pytest

from _harness import NO_GPU_REASON, Backend, check_forward, gpu_devices, make_qkv

pytestmark = pytest.mark.gpu

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k): odd lengths, MQA (8:1), GQA (4:1, 8:1),
# a single decode row, seqlen_q > seqlen_k (causal rows that see no key), and lengths
# that are not multiples of any tile.
SHAPES = [(2, 4, 4, 113, 1000), (1, 8, 2, 1, 4097), (2, 8, 1, 17, 300), (1, 4, 4, 300, 100),
          (1, 16, 2, 1000, 1000), (3, 4, 4, 1, 77), (2, 8, 2, 16, 2000), (1, 4, 4, 50, 700)]
SPLITS = [0, 1, 2, 3, 256]


def _cases():
    cases = []
    for dtype, head_dim, causal in itertools.product(("bf16", "f16"), (64, 128), (False, True)):
        for shape in SHAPES:
            for splits in SPLITS:
                cases.append((dtype, head_dim, causal, shape, splits))
    params = []
    for i, (dtype, head_dim, causal, shape, splits) in enumerate(cases):
        ident = (f"{dtype}-d{head_dim}-{'causal' if causal else 'full'}-"
                 f"{'x'.join(map(str, shape))}-s{splits}" + ("-quick" if i % 7 == 0 else ""))
        params.append(pytest.param(i, dtype, head_dim, causal, shape, splits, id=ident))
    return params


@pytest.fixture(scope="module")
def gpu():
    if not gpu_devices():
        pytest.skip(NO_GPU_REASON)
    return Backend("gpu")


@pytest.mark.parametrize("seed,dtype,head_dim,causal,shape,splits", _cases())
def test_gpu_parity(gpu, seed, dtype, head_dim, causal, shape, splits):
    batch, heads_q, heads_kv, seqlen_q, seqlen_k = shape
    rng = np.random.default_rng(seed)
    q, k, v = make_qkv(rng, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype)
    gpu.require(q, k, v, causal=causal, num_splits=splits)
    out, lse = check_forward(gpu, q, k, v, dtype, causal=causal, num_splits=splits)
    assert not np.isnan(out).any(), "NaN in out where the inputs hold none"
    if causal and seqlen_q > seqlen_k:
        # Bottom-right alignment: the first seqlen_q - seqlen_k rows see no key.
        empty = seqlen_q - seqlen_k
        assert (out[:, :empty] == 0).all(), "rows that see no key must be exactly 0"
