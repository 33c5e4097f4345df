"""The GPU planner without a GPU: the gate, the kernel choice and the split decisions on
described devices (H100, H200, A100, a cc 7.5 card, MI300X), through the private hook
_fmha_native._plan_for_device, which plans as if the GPU kernels were built in.  The split
golden cases come from measurement: benchmarks/sweep_h200.json holds, per shape, the
times of forced split counts on an H200 with the tensor-core prefill tiles.  Tests of the
tensor-core tiles' rules pin prefill_kernel="mma" (FMHA_GPU_PREFILL_KERNEL), so they hold
in builds with or without sm_90a code."""
import json
import math
import os

import pytest

import _fmha_native

plan_for = _fmha_native._plan_for_device

# Described devices (public specifications: SMs or CUs, L2, shared memory per SM / block).
H100 = dict(name="NVIDIA H100 80GB HBM3", arch="sm_90", cc=(9, 0), sm_count=132,
            l2_bytes=50 << 20, max_smem_per_block=227 << 10, max_smem_per_sm=228 << 10)
H200 = dict(H100, name="NVIDIA H200", l2_bytes=60 << 20)
A100 = dict(name="NVIDIA A100-SXM4-80GB", arch="sm_80", cc=(8, 0), sm_count=108,
            l2_bytes=40 << 20, max_smem_per_block=163 << 10, max_smem_per_sm=164 << 10)
T4 = dict(name="Tesla T4", arch="sm_75", cc=(7, 5), sm_count=40, l2_bytes=4 << 20,
          max_smem_per_block=64 << 10, max_smem_per_sm=64 << 10)
MI300X = dict(name="AMD Instinct MI300X", arch="gfx942:sramecc+:xnack-", is_amd=1, sm_count=304,
              warp_size=64, l2_bytes=4 << 20, max_smem_per_block=64 << 10,
              max_smem_per_sm=64 << 10)


def problem(batch=1, seqlen_q=1, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128,
            dtype="bfloat16", causal=False, **kw):
    return dict(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q,
                heads_kv=heads_kv, head_dim=head_dim, dtype=dtype, causal=int(causal), **kw)


# ---------------------------------------------------------------------------- the gate

@pytest.mark.parametrize("device", [H100, H200, A100], ids=["H100", "H200", "A100"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gate_admits_sm80_and_newer(device, head_dim, dtype):
    plan = plan_for(problem(head_dim=head_dim, dtype=dtype), device)
    assert plan["supported"] is True and "error" not in plan
    assert set(plan["gate"]) == {"device", "arch", "dtype", "head_dim", "alignment", "features"}
    assert all(item["met"] for item in plan["gate"].values()), plan["gate"]
    assert plan["backend"] == "gpu" and plan["device"] == device["name"]
    assert plan["sm_count"] == device["sm_count"] and plan["arch"] == device["arch"]
    assert device["name"] in plan["gate"]["device"]["why"]


def test_gate_refuses_cc75():
    plan = plan_for(problem(), T4)
    assert plan["supported"] is False
    assert plan["gate"]["arch"]["met"] is False
    assert all(item["met"] for name, item in plan["gate"].items() if name != "arch")
    assert plan["error"].startswith("compute capability 7.5 is not supported"), plan["error"]
    assert 'device="cpu"' in plan["error"]


@pytest.mark.parametrize("built,met", [(["gfx90a", "gfx942"], True), (["gfx90a"], False),
                                       ([], False)])
def test_gate_amd_selects_by_gcn_arch_name(built, met):
    plan = plan_for(problem(), dict(MI300X, archs_built=built))
    assert plan["gate"]["arch"]["met"] is met, plan["gate"]["arch"]
    assert plan["supported"] is met
    if not met:
        assert plan["error"].startswith("gfx942"), plan["error"]
    # gcnArchName's feature suffix does not count, but the arch itself must match exactly
    other = plan_for(problem(), dict(MI300X, arch="gfx94:sramecc+", archs_built=built))
    assert other["gate"]["arch"]["met"] is False


def test_gate_amd_never_asks_l2_to_evict():
    plan = plan_for(problem(seqlen_k=1024), dict(MI300X, archs_built=["gfx942"]))
    assert plan["supported"] is True and plan["kv_read_once"] is False


@pytest.mark.parametrize("device", [H100, A100], ids=["H100", "A100"])
def test_gate_refuses_float32(device):
    plan = plan_for(problem(dtype="float32"), device)
    assert plan["supported"] is False and plan["gate"]["dtype"]["met"] is False
    assert plan["gate"]["head_dim"]["met"] is True
    assert plan["error"].startswith("float32 is not supported by the GPU kernels"), plan["error"]


@pytest.mark.parametrize("head_dim", [48, 112, 320])
def test_gate_refuses_other_head_dims_and_says_so_first(head_dim):
    plan = plan_for(problem(head_dim=head_dim), H100)
    assert plan["supported"] is False and plan["gate"]["head_dim"]["met"] is False
    want = (f"head_dim {head_dim} is not supported by the GPU kernels (they cover 32, 64, 80, 96, 128, 192, "
            '256); device="cpu" runs it')
    assert plan["error"].startswith(want), plan["error"]
    assert plan["reason"].startswith(f"head_dim {head_dim} is not supported")


def test_gate_lists_every_unmet_requirement():
    plan = plan_for(problem(head_dim=112, dtype="float32"), T4)
    first = plan["error"].split(". ")[0]
    for needle in ("compute capability 7.5", "float32", "head_dim 112"):
        assert needle in first, plan["error"]


def test_gate_alignment_is_reported_not_refused():
    plan = plan_for(problem(misaligned=1), H100)
    assert plan["supported"] is True
    assert plan["gate"]["alignment"]["met"] is True
    assert "copied to aligned scratch" in plan["gate"]["alignment"]["why"]
    aligned = plan_for(problem(), H100)
    assert "16-byte boundaries" in aligned["gate"]["alignment"]["why"]


# ---------------------------------------------------------------------- the kernel choice

@pytest.mark.parametrize("seqlen_q,heads_q,heads_kv,kernel,pack", [
    (1, 32, 8, "decode", True),     # 4 packed rows
    (4, 32, 8, "decode", True),     # 16 packed rows: the decode tiles' limit
    (5, 32, 8, "mma", True),        # 20 packed rows: prefill tiles, still packed (<= 64)
    (16, 32, 8, "mma", True),       # 64 packed rows
    (17, 32, 8, "mma", False),      # 68 rows do not fit one 64-row tile
    (1, 16, 16, "decode", False),   # MHA decode: nothing to pack
    (2048, 32, 8, "mma", False),    # prefill
])
def test_kernel_choice(seqlen_q, heads_q, heads_kv, kernel, pack):
    plan = plan_for(problem(seqlen_q=seqlen_q, heads_q=heads_q, heads_kv=heads_kv,
                            seqlen_k=8192, causal=seqlen_q > 1), H200, prefill_kernel="mma")
    assert plan["kernel"].startswith(f"fwd_{kernel}<bfloat16,d128"), plan["kernel"]
    assert plan["kernel_id"] == (2 if kernel == "decode" else 1)
    assert plan["pack_gqa"] is pack
    assert ("pack_gqa" in plan["kernel"]) is pack
    assert plan["block_m"] == (16 if kernel == "decode" else 64)
    assert ("+combine" in plan["kernel"]) is (plan["num_splits"] > 1)
    assert ("+merge" in plan["kernel"]) is (plan["walkers_per_split"] > 1)


# ------------------------------------------------- the Hopper prefill kernel (fwd_sm90.h)

WITH_SM90 = ["80", "90a"]      # FMHA_CUDA_ARCHS entries of a build with sm_90a code
H100_SM90 = dict(H100, archs_built=WITH_SM90)
H200_SM90 = dict(H200, archs_built=WITH_SM90)


def prefill(**kw):
    """A plain prefill: 4 x 32 query heads (GQA 4) x 4096 rows and keys."""
    return problem(**dict(dict(batch=4, seqlen_q=4096, seqlen_k=4096, heads_q=32, heads_kv=8),
                          **kw))


def is_sm90(plan):
    return plan["kernel"].startswith("fwd_sm90<") and plan["kernel_id"] == 3


@pytest.mark.parametrize("device", [H100_SM90, H200_SM90], ids=["H100", "H200"])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128, 192])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_runs_hopper_prefill(device, head_dim, dtype, causal):
    plan = plan_for(prefill(head_dim=head_dim, dtype=dtype, causal=causal), device)
    assert is_sm90(plan), plan["reason"]
    assert plan["kernel"].startswith(f"fwd_sm90<{dtype},d{head_dim}" + (",causal," if causal else ","))
    # 64 rows per consumer warpgroup: three at head_dims 32 and 64, two from 80 up; 112-key
    # blocks at 192 (two stages of 128 keys would not fit the shared memory next to Q); these
    # rows see >= 16 blocks (ping-pong), whose d128 tiles take 176-key blocks
    assert plan["kernel"].endswith(",pingpong>"), plan["kernel"]
    block_m, block_n = {32: (192, 128), 64: (192, 128), 80: (128, 128), 96: (128, 128),
                        128: (128, 176), 192: (128, 112)}[head_dim]
    assert plan["block_m"] == block_m and plan["block_n"] == block_n
    assert plan["num_splits"] == 1 and plan["walkers_per_split"] == 1
    assert plan["pack_gqa"] is False and "+combine" not in plan["kernel"]
    assert plan["reason"].startswith(
        f"Hopper prefill: warp-specialized TMA + wgmma tiles {block_m}x{block_n}"), plan["reason"]
    # one CTA per SM: as many slots as SMs; one tile per (block_m rows, query head, batch entry)
    assert plan["split"]["slots"] == device["sm_count"]
    assert plan["split"]["tiles"] == 4 * 32 * -(-4096 // block_m)
    assert all(item["met"] for item in plan["gate"].values())


@pytest.mark.parametrize("head_dim,causal,seqlen,schedule", [
    (64, False, 8192, "pingpong"),      # ping-pong at both head dims
    (64, True, 8192, "pingpong"),
    (128, False, 8192, "pingpong"),
    (128, True, 8192, "pingpong"),
    (128, True, 2048, "interleaved"),   # ... except short causal problems
    (64, True, 2048, "interleaved"),
    (32, False, 8192, "pingpong"),      # d32 runs the d64 tiles and their rule, d80 d96's
    (32, True, 2048, "interleaved"),
    (80, True, 8192, "pingpong"),
    (80, True, 2048, "interleaved"),
])
def test_sm90_schedule(head_dim, causal, seqlen, schedule):
    plan = plan_for(prefill(head_dim=head_dim, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen),
                    H100_SM90)
    assert is_sm90(plan), plan["reason"]
    assert plan["kernel"].endswith(f",{schedule}>"), plan["kernel"]
    assert ("ping-pong" in plan["reason"]) is (schedule == "pingpong")
    # the d128 ping-pong tiles walk 176-key blocks; the schedule rule counts 128-key ones
    assert plan["block_n"] == (176 if (head_dim, schedule) == (128, "pingpong") else 128)
    # ... except with a softcap (narrow blocks, same schedule)
    capped = plan_for(prefill(head_dim=head_dim, causal=causal, seqlen_q=seqlen, seqlen_k=seqlen,
                              softcap=30), H100_SM90)
    assert capped["kernel"].endswith(f",{schedule}>") and capped["block_n"] == 128, capped


@pytest.mark.parametrize("built", [["80"], ["80", "90"], [], ["90a"]])
def test_sm90_needs_sm90a_code(built):
    plan = plan_for(prefill(), dict(H100, archs_built=built))
    if "90a" in built:
        assert is_sm90(plan), plan["reason"]
        return
    assert plan["kernel"].startswith("fwd_mma<"), plan["kernel"]
    assert plan["supported"] is True and plan["block_m"] == 64
    assert "not fwd_sm90: this build has no sm_90a code" in plan["reason"], plan["reason"]


@pytest.mark.parametrize("device", [A100, dict(A100, cc=(8, 9), name="L4-like"),
                                    dict(H100, cc=(10, 0), name="next")],
                         ids=["A100", "cc8.9", "cc10"])
def test_sm90_only_on_cc9(device):
    plan = plan_for(prefill(), dict(device, archs_built=WITH_SM90))
    assert plan["kernel"].startswith("fwd_mma<"), plan["kernel"]
    assert "fwd_sm90" not in plan["reason"]


def test_sm90_never_on_amd():
    plan = plan_for(prefill(), dict(MI300X, archs_built=["gfx942"]))
    assert plan["kernel"].startswith("fwd_mma<"), plan["kernel"]


@pytest.mark.parametrize("seqlen_q,heads_q,heads_kv", [(1, 32, 8), (4, 32, 8), (1, 16, 16)])
def test_sm90_leaves_decode_to_the_decode_tiles(seqlen_q, heads_q, heads_kv):
    plan = plan_for(problem(seqlen_q=seqlen_q, heads_q=heads_q, heads_kv=heads_kv,
                            seqlen_k=8192), H100_SM90)
    assert plan["kernel"].startswith("fwd_decode<"), plan["kernel"]
    assert plan["block_m"] == 16
    # FMHA_GPU_PREFILL_KERNEL=sm90 puts it first wherever it can run, unsplit
    asked = plan_for(problem(seqlen_q=seqlen_q, heads_q=heads_q, heads_kv=heads_kv,
                             seqlen_k=8192), H100_SM90, prefill_kernel="sm90")
    assert is_sm90(asked) and asked["num_splits"] == 1, asked["reason"]
    # ... but not where it cannot: a KV cache keeps the decode tiles
    cached = plan_for(problem(seqlen_q=seqlen_q, heads_q=heads_q, heads_kv=heads_kv,
                              seqlen_k=8192, cache_seqlens=[100]), H100_SM90,
                      prefill_kernel="sm90")
    assert cached["kernel"].startswith("fwd_decode<"), cached["kernel"]


def test_sm90_not_for_kv_caches():
    plan = plan_for(prefill(batch=2, cache_seqlens=[4000, 1000]), H100_SM90)
    assert plan["kernel"].startswith("fwd_mma<"), plan["kernel"]
    assert "not fwd_sm90: it does not read KV caches" in plan["reason"]
    appended = plan_for(prefill(batch=2, seqlen_q=512, cache_seqlens=[3000, 10], seqlen_new=512),
                        H100_SM90)
    assert appended["kernel"].startswith("fwd_mma<"), appended["kernel"]


@pytest.mark.parametrize("num_splits", [2, 7])
def test_sm90_not_for_forced_splits(num_splits):
    plan = plan_for(prefill(), H100_SM90, num_splits=num_splits)
    assert plan["kernel"].startswith("fwd_mma<") and plan["kernel"].endswith("+combine")
    assert plan["num_splits"] == num_splits
    assert "it writes no split partials" in plan["reason"]
    # num_splits=1 is no split: the sm90 kernel runs it
    assert is_sm90(plan_for(prefill(), H100_SM90, num_splits=1))


@pytest.mark.parametrize("device", [H100_SM90, H200_SM90], ids=["H100", "H200"])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_256_runs_the_hopper_prefill_kernel_unsplit(device, causal):
    plan = plan_for(prefill(head_dim=256, causal=causal), device)
    assert plan["supported"] and is_sm90(plan), plan["reason"]
    assert plan["kernel"].startswith("fwd_sm90<bfloat16,d256") and (plan["block_m"], plan["block_n"]) == (128, 80)
    assert plan["gate"]["head_dim"]["why"].startswith("head_dim 256 in {")
    # few query rows over many keys: split over the tensor-core tiles and a combine, as the
    # other head dims are, O in two column parts (each a tile of its own in the split model)
    long_kv = plan_for(prefill(batch=1, seqlen_q=128, seqlen_k=131072, causal=causal), device)
    assert long_kv["num_splits"] > 1, long_kv["reason"]
    plan = plan_for(prefill(batch=1, seqlen_q=128, seqlen_k=131072, head_dim=256, causal=causal), device)
    assert plan["kernel"].startswith("fwd_mma<bfloat16,d256") and plan["num_splits"] > 1, plan["reason"]
    assert "O in 2 column parts of 128" in plan["reason"], plan["reason"]


@pytest.mark.parametrize("case,device,kw,kernel,sm90_why", [
    ("kv cache", H100_SM90, dict(seqlen_q=1, seqlen_k=8192, cache_seqlens=[100]), "fwd_decode<", None),
    ("forced splits", H100_SM90, dict(num_splits=2), "fwd_mma<", "it writes no split partials"),
    ("no sm_90a code", dict(H100, archs_built=["80", "90"]), {}, "fwd_mma<", "this build has no sm_90a code"),
    ("A100", A100, {}, "fwd_mma<", None),
    ("unaligned", H100_SM90, dict(misaligned=1), "fwd_mma<", "16-byte multiples"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_head_dim_256_off_the_hopper_prefill_kernel_runs_the_tensor_core_tiles(case, device, kw, kernel,
                                                                                sm90_why):
    """Where the sm90 kernel does not take a d256 problem, the tensor-core tiles do, with O in
    two column parts (csrc/fmha_config.h FMHA_GPU_O_PARTS), and the plan says why not sm90."""
    kw = dict(kw)
    splits = kw.pop("num_splits", 0)
    plan = plan_for(prefill(batch=1, head_dim=256, **kw), device, num_splits=splits)
    assert plan["supported"] is True and plan["gate"]["head_dim"]["met"] is True, plan.get("error")
    assert plan["kernel"].startswith(kernel + "bfloat16,d256"), plan["kernel"]
    assert "O in 2 column parts of 128 (each part's tile computes S over all 256 features)" in plan["reason"]
    if sm90_why:
        assert sm90_why in plan["reason"], plan["reason"]


def test_sm90_not_for_unaligned_rows():
    plan = plan_for(prefill(misaligned=1), H100_SM90)
    assert plan["kernel"].startswith("fwd_mma<"), plan["kernel"]
    assert "16-byte multiples" in plan["reason"], plan["reason"]
    assert plan["gate"]["alignment"]["met"] is True  # the gate is unchanged: staged, not refused


def test_sm90_not_past_the_grid():
    plan = plan_for(prefill(batch=65536, seqlen_q=256, seqlen_k=256), H100_SM90)
    assert plan["kernel"].startswith("fwd_mma<") and "65535" in plan["reason"]


def test_sm90_leaves_packed_query_heads_to_the_old_tiles():
    # 16 rows x 4 query heads per kv head = 64 packed rows: one old tile reads K/V once for all
    shape = prefill(seqlen_q=16, seqlen_k=2048, batch=64)
    plan = plan_for(shape, H100_SM90)
    assert plan["kernel"].startswith("fwd_mma<") and plan["pack_gqa"] is True
    assert "query heads of a kv head fit one tile" in plan["reason"]
    asked = plan_for(shape, H100_SM90, prefill_kernel="sm90")
    assert is_sm90(asked) and asked["pack_gqa"] is False, asked["reason"]


def test_sm90_gives_way_when_the_keys_should_split():
    # 8 tiles of 128 rows over 132 SMs with 64K keys: unsplit, most SMs would idle
    shape = prefill(batch=1, seqlen_q=128, seqlen_k=65536, heads_q=8, heads_kv=8)
    plan = plan_for(shape, H100_SM90)
    assert plan["kernel"].startswith("fwd_mma<") and plan["num_splits"] > 1
    assert "the split rule splits the keys" in plan["reason"], plan["reason"]
    asked = plan_for(shape, H100_SM90, prefill_kernel="sm90")
    assert is_sm90(asked) and asked["num_splits"] == 1
    assert "FMHA_GPU_PREFILL_KERNEL=sm90" in asked["reason"]


def test_sm90_can_be_turned_off():
    plan = plan_for(prefill(), H100_SM90, prefill_kernel="mma")
    assert plan["kernel"].startswith("fwd_mma<") and plan["block_m"] == 64
    assert "not fwd_sm90: FMHA_GPU_PREFILL_KERNEL=mma" in plan["reason"]
    assert is_sm90(plan_for(prefill(), H100_SM90, prefill_kernel="auto"))


# ------------------------------------------------------------------------- split decisions

@pytest.mark.parametrize("requested,want", [(1, 1), (5, 5), (32, 32), (256, 32)])
def test_forced_splits_are_clamped_to_key_blocks(requested, want):
    # 1000 keys in blocks of 32 (decode tiles, head_dim 128): 32 key blocks
    plan = plan_for(problem(seqlen_k=1000), H100, num_splits=requested)
    assert plan["num_splits"] == want and plan["requested_splits"] == requested
    assert plan["walkers_per_split"] == 1, "a forced count runs one walker per split"
    assert f"num_splits={requested} forced (clamped to 32 key blocks)" in plan["reason"]


@pytest.mark.parametrize("device", [H100, H200, A100], ids=["H100", "H200", "A100"])
def test_few_tiles_with_long_keys_fill_the_machine(device):
    # one sequence, 8 kv heads: 8 decode tiles; unsplit they would use 8 of the SMs
    plan = plan_for(problem(seqlen_k=131072), device)
    decode_walkers = 4
    ctas = 8 * plan["num_splits"] * plan["walkers_per_split"] / decode_walkers
    assert plan["num_splits"] > 1
    assert plan["split"]["rule"] == "heuristic" and plan["split"]["tiles"] == 8
    assert plan["split"]["key_blocks"] == 131072 // 32
    assert 0.9 * device["sm_count"] <= ctas <= 2 * device["sm_count"], plan["reason"]


def test_short_decode_needs_no_combine():
    plan = plan_for(problem(batch=64, seqlen_k=512), H200)
    assert plan["num_splits"] == 1, plan["reason"]


def test_ragged_batch_cuts_equal_chunks():
    lens = [5, 100000, 3000, 7]
    plan = plan_for(problem(batch=4, seqlen_k=131072, cache_seqlens=lens), H200)
    assert plan["kv_cache"] is True
    assert plan["reason"].split("; ")[-1].startswith("ragged batch"), plan["reason"]
    # chunks are sized on the longest entry, 100000 keys in blocks of 32
    longest_blocks = math.ceil(100000 / 32)
    assert f"longest {longest_blocks}" in plan["reason"]
    assert 1 < plan["num_splits"] <= 128
    # a forced count does not depend on the other entries: no ragged chunks
    forced = plan_for(problem(batch=4, seqlen_k=131072, cache_seqlens=lens), H200, num_splits=8)
    assert "ragged" not in forced["reason"] and forced["num_splits"] == 8


@pytest.mark.parametrize("device,seqlen_k,once", [
    (H200, 32768, True),    # K+V 128 MiB <= 4 x 60 MiB
    (H200, 65536, False),   # 256 MiB
    (H100, 49152, True),    # 192 MiB <= 4 x 50 MiB
    (H100, 53248, False),   # 208 MiB
])
def test_kv_read_once_follows_l2_size(device, seqlen_k, once):
    # 8 kv heads x 128 features x 2 bytes x (K and V) = 4 KiB per key
    plan = plan_for(problem(seqlen_k=seqlen_k), device)
    assert plan["kv_read_once"] is once, plan["reason"]


def test_kv_read_once_counts_the_cache_lengths():
    big = problem(batch=2, seqlen_k=131072)
    assert plan_for(big, H200)["kv_read_once"] is False
    short = problem(batch=2, seqlen_k=131072, cache_seqlens=[1000, 2000])
    assert plan_for(short, H200)["kv_read_once"] is True


def test_kv_read_once_counts_the_keys_a_window_shows():
    """(16,32,8,1,8192,128) decode, window 1023 to the left: a tile sees 33 key blocks of 32
    keys (the window's 1024 keys, plus one block for where it starts), 16 x 1056 keys x
    4 KiB = 66 MiB, under 4 x the H100's 50 MiB; the whole cache is 512 MiB."""
    shape = dict(batch=16, seqlen_k=8192, causal=True)
    assert plan_for(problem(**shape), H100)["kv_read_once"] is False
    windowed = plan_for(problem(window_left=1023, window_right=0, **shape), H100)
    assert windowed["split"]["key_blocks"] == 33, windowed["reason"]
    assert windowed["kv_read_once"] is True, windowed["reason"]
    # a window as long as the cache hides nothing
    assert plan_for(problem(window_left=8192, window_right=0, **shape), H100)["kv_read_once"] is False


def test_prefill_never_reads_once():
    assert plan_for(problem(seqlen_q=512, seqlen_k=1024), H200)["kv_read_once"] is False


# ------------------------------------------------------------ golden cases from the sweep

SWEEP = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "sweep_h200.json")
# The sweep's stated target (benchmarks/SWEEP.md): no shape above 1.15 regret, geomean
# at most 1.05.
REGRET_LIMIT = 1.15
GEOMEAN_LIMIT = 1.05
# Shapes of the sweep whose plan runs one walker per split (prefill tiles, and decode
# tiles the planner gives one walker), so a forced count of the sweep measured that plan.
GOLDEN = [13, 15, 17, 18, 21, 22, 23, 24, 25, 27, 28, 29, 31, 33, 38, 40, 42, 43, 45, 46,
          47, 48, 53, 55, 56, 61, 62, 65, 66, 67, 72, 75, 78]
# The H200 of the sweep; the CTAs per SM are fmha_config.h's __launch_bounds__ targets
# (prefill 2, decode tiles 1), what its shared memory allows as well.
SWEEP_H200 = dict(H200, ctas_per_sm={"prefill": [2, 2], "decode": [1, 1]})


@pytest.fixture(scope="module")
def sweep():
    if not os.path.exists(SWEEP):
        pytest.skip("benchmarks/sweep_h200.json is not in this tree")
    with open(SWEEP) as f:
        data = json.load(f)
    assert data["sm_count"] == SWEEP_H200["sm_count"]
    return {row["index"]: row for row in data["rows"]}


def measured(row):
    """{effective split count: ms}: finalists' medians, else the screening median."""
    times = {}
    for key, cand in row["candidates"].items():
        ms = cand.get("ms", cand.get("screen_ms"))
        if ms:
            times[int(key)] = ms
    best = min(cand["ms"] for cand in row["candidates"].values() if "ms" in cand)
    return times, best


def test_sweep_golden_regret(sweep):
    regrets = {}
    for index in GOLDEN:
        row = sweep[index]
        assert not row.get("trimmed_from"), "the golden shapes ran untrimmed"
        b, hq, hkv, sq, sk, d, causal = row["shape"]
        plan = plan_for(problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk,
                                head_dim=d, causal=causal), SWEEP_H200, prefill_kernel="mma")
        label = f"#{index} {row['label']}: {plan['reason']}"
        assert plan["walkers_per_split"] == 1, label
        times, best = measured(row)
        splits = plan["num_splits"]
        assert splits in times, (f"{label}: the sweep did not time {splits} splits "
                                 f"(timed {sorted(times)}); re-run benchmarks/sweep_splits.py")
        regrets[index] = times[splits] / best
        assert regrets[index] <= REGRET_LIMIT, f"{label}: regret {regrets[index]:.3f}"
    geomean = math.exp(sum(math.log(r) for r in regrets.values()) / len(regrets))
    assert geomean <= GEOMEAN_LIMIT, f"geomean regret {geomean:.3f} over {len(regrets)} shapes"


# ------------------------------------------------------------------------------ the hook

def test_hook_validates_its_input():
    with pytest.raises(ValueError, match="heads_kv"):
        plan_for(problem(heads_q=6, heads_kv=4), H100)
    with pytest.raises(ValueError, match="sm_count"):
        plan_for(problem(), {"name": "x", "cc": (9, 0)})
    with pytest.raises(ValueError, match="dtype"):
        plan_for(problem(dtype="int8"), H100)
    with pytest.raises(ValueError, match="cache_seqlens"):
        plan_for(problem(batch=2, cache_seqlens=[1]), H100)
    with pytest.raises(ValueError, match="num_splits"):
        plan_for(problem(), H100, num_splits=-1)
    with pytest.raises(ValueError, match="prefill_kernel"):
        plan_for(problem(), H100, prefill_kernel="wgmma")


# ------------------------------------------------------- paged and packed calls (issue 20)

def test_sm90_not_for_paged_caches():
    plan = plan_for(prefill(paged=1), H100_SM90)
    assert plan["kernel"].startswith("fwd_mma<"), plan["kernel"]
    assert "not fwd_sm90: it does not read paged KV caches" in plan["reason"]
    assert plan["paged"] is True and plan["page_size"] == 16
    # FMHA_GPU_PREFILL_KERNEL=sm90 cannot force it either
    forced = plan_for(prefill(paged=1), H100_SM90, prefill_kernel="sm90")
    assert forced["kernel"].startswith("fwd_mma<"), forced["kernel"]


@pytest.mark.parametrize("causal", [False, True])
def test_sm90_takes_packed_sequences(causal):
    """The sm90 kernel reads packed q (cu_seqlens_q) and packed k/v (cu_seqlens_k) itself:
    a packed prefill plans as the dense one, on the sm90 tiles, unsplit."""
    dense = plan_for(prefill(causal=causal), H100_SM90)
    packed_q = plan_for(prefill(varlen=1, causal=causal), H100_SM90)
    # 4 sequences of 4096 keys each, given as packed key lengths
    packed_qk = plan_for(prefill(varlen=1, causal=causal, seqlens_k=[4096] * 4), H100_SM90)
    for plan in (dense, packed_q, packed_qk):
        assert is_sm90(plan), plan["reason"]
        assert plan["num_splits"] == 1 and plan["block_m"] == 128
        assert "packed sequences" not in plan["reason"]
    assert packed_q["kernel"] == dense["kernel"] == packed_qk["kernel"]
    # ... but not with a KV cache, dense or paged: each says its own reason
    cached = plan_for(prefill(varlen=1, cache_seqlens=[4000, 10, 4096, 0]), H100_SM90)
    assert cached["kernel"].startswith("fwd_mma<"), cached["kernel"]
    assert "not fwd_sm90: it does not read KV caches" in cached["reason"]
    paged = plan_for(prefill(varlen=1, paged=1, cache_seqlens=[4000, 10, 4096, 0]), H100_SM90)
    assert paged["kernel"].startswith("fwd_mma<"), paged["kernel"]
    assert "not fwd_sm90: it does not read KV caches" in paged["reason"]


def test_packed_keys_split_as_a_ragged_batch():
    """Host cu_seqlens_k give per-sequence key lengths: the ragged rule, as for host
    cache_seqlens of the same lengths."""
    lens = [5, 100000, 3000, 7]
    packed = plan_for(problem(batch=4, seqlen_k=1, varlen=1, seqlens_k=lens), H200)
    cached = plan_for(problem(batch=4, seqlen_k=131072, cache_seqlens=lens), H200)
    assert packed["split"]["rule"] == "ragged", packed["reason"]
    assert packed["num_splits"] == cached["num_splits"]
    assert packed["split"]["chunk"] == cached["split"]["chunk"]
    assert packed["split"]["total_blocks"] == cached["split"]["total_blocks"]


def test_sm90_stays_unsplit_unless_a_split_gains_more_than_its_speed():
    """(1,2,2,40000^2,64): 2 heads x 209 tiles of 192 rows = 418 CTAs, 3.2 waves of 132: the
    split rule would cut it (wave quantization), which only the old tiles can run; by the
    model a split gains at most ~1.03x, less than FMHA_SM90_BLOCK_SPEEDUP (1.3), so the sm90
    kernel runs it unsplit.  (1,8,8,128,65536,128): 8 tiles on 132 SMs, 512 key blocks
    each: splitting gains > 10x, so the old tiles split it."""
    plan = plan_for(problem(batch=1, seqlen_q=40000, seqlen_k=40000, heads_q=2, heads_kv=2,
                            head_dim=64), H100_SM90)
    assert is_sm90(plan) and plan["num_splits"] == 1, plan["reason"]
    assert plan["split"]["waves"] == 4, plan["split"]
    long_keys = plan_for(problem(batch=1, seqlen_q=128, seqlen_k=65536, heads_q=8, heads_kv=8,
                                 head_dim=128), H100_SM90)
    assert long_keys["kernel"].startswith("fwd_mma<") and long_keys["num_splits"] > 8, \
        long_keys["reason"]


# (B, Hq, Hkv, Sq, Sk, D, causal) -> the split count measured fastest on the H100 sweep of
# 2026-12-07 (benchmarks/sweep_h100.json: forced counts, medians of 15 interleaved rounds),
# where 1 is the sm90 kernel unsplit and more splits run the tensor-core tiles.
FEW_ROWS_MEASURED = {
    (3, 28, 28, 32, 21577, 64, False): 3,    # sm90 0.2607 ms, 3 splits 0.1744
    (4, 20, 20, 256, 12787, 64, False): 4,   # 0.3165, 4 splits 0.2365
    (1, 12, 12, 1024, 16384, 64, False): 4,  # 0.2010, 4 splits 0.1731
    (5, 32, 32, 256, 44542, 64, True): 2,    # 1.5887, 2 splits 1.4375
    (1, 18, 18, 2048, 16384, 64, False): 1,  # sm90 0.3955, 4 splits 0.4943
    (2, 24, 3, 512, 12745, 128, False): 1,   # sm90 0.2942 (2 splits pruned as slower)
}


@pytest.mark.parametrize("shape", list(FEW_ROWS_MEASURED), ids=lambda s: ",".join(map(str, s)))
def test_sm90_edge_shrinks_with_empty_tile_rows(shape):
    """Few query rows leave most of an sm90 tile (192 rows at d64) empty: 32 rows fill
    1/6 of it and half of a 64-row tensor-core tile, 256 rows 2/3 against all, 1024
    rows 8/9. The sm90 kernel's edge per key block shrinks by that ratio, so these
    shapes, which the model splits anyway, go to the split tiles as the measurements
    say; shapes whose rows fill the sm90 tiles stay on it unsplit."""
    b, hq, hkv, sq, sk, d, causal = shape
    plan = plan_for(problem(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv,
                            head_dim=d, causal=causal), H100_SM90)
    best = FEW_ROWS_MEASURED[shape]
    if best == 1:
        assert is_sm90(plan) and plan["num_splits"] == 1, plan["reason"]
    else:
        assert plan["kernel"].startswith("fwd_mma<") and plan["num_splits"] == best, plan["reason"]


@pytest.mark.parametrize("causal", [False, True])
def test_packed_prefill_of_ragged_lengths_stays_unsplit_on_sm90(causal):
    """Host key lengths that differ, on a prefill with many tiles: 4 x 32 query heads x
    32 row tiles = 4096 tiles, 32 waves of the H100's 132 slots, far past
    FMHA_RAGGED_MAX_WAVES (2), so no ragged chunks: the sm90 kernel runs it unsplit."""
    plan = plan_for(prefill(varlen=1, causal=causal, seqlens_k=[4096, 2048, 1024, 512]),
                    H100_SM90)
    assert is_sm90(plan) and plan["num_splits"] == 1, plan["reason"]
    assert plan["split"]["rule"] == "heuristic", plan["reason"]


# ------------------------------------------- device lengths: the length-independent plan

def device_row(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim):
    """A decode with cache_seqlens on the device: present, never read on the host, so the
    plan is made for seqlen_k (the capacity) keys per sequence."""
    return problem(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                   seqlen_k=seqlen_k, head_dim=head_dim, device_lengths=1)


def test_device_lengths_ragged_batch_gets_device_chunks():
    """Issue 20's ragged row, (32,32,8,1,32768,128), lengths on the device.  By hand, with
    plan.c's model (decode tiles 16x32: 8 tiles per entry, 1024 key blocks each; 4 walkers
    per CTA, 1 CTA per SM on the described H100, 132 slots; a CTA costs 4 blocks, a split
    piece 1 more for its partials, an empty split CTA 1 block per wave of them):
      the length-aware plan at the capacity (the ragged rule on 32 x 1024 blocks) is 14
      splits x 1 walker, chunks of ceil(1024 / 14) = 74: 8 x (443 + 16) = 3672 pieces,
      918 CTAs, 7 waves x 79 = 553; the bound is 1.03 x 553 = 569.6.
      Device chunks, 32 x 14 = 448 pieces per tile: at full length chunks of 74 again
      (3584 pieces, 896 CTAs, 7 x 79) on a grid of 32 splits, 2048 CTAs, whose 1152 empty
      ones cost 9 waves x 1: 562, allowed (64 splits: 3200 empty, 578, not).
      spread (16384 blocks): chunks of max(1024 / 32, 16384 / 448) = 37, 3672 pieces, 918
      CTAs, 7 x 42 + 9 = 303; skew (1024 + 31 x 64 = 3008 blocks): chunks of 32, 8 x (32 +
      62) = 752 pieces, 188 CTAs, 2 x 37 + 15 = 89; 392 in all, against the fixed chunks'
      320 + 86 = 406 and 16 splits' 349 + 77 = 426."""
    plan = plan_for(device_row(32, 32, 8, 1, 32768, 128), H100)
    assert plan["length_independent"] is True and plan["kv_cache"] is True
    # one walker per split: no merge of walkers
    assert plan["kernel"] == "fwd_decode<bfloat16,d128,pack_gqa>+combine", plan["kernel"]
    assert (plan["num_splits"], plan["walkers_per_split"]) == (32, 1), plan["reason"]
    split = plan["split"]
    assert split["rule"] == "device", plan["reason"]
    assert (split["pieces"], split["chunk"], split["min_chunk"]) == (448, 74, 16)
    assert split["total_blocks"] == 0 and split["key_blocks"] == 1024 and split["tiles"] == 8
    assert ("the kernels size the chunks from the lengths they find, about 448 pieces per tile"
            in plan["reason"]), plan["reason"]
    assert "length-independent plan" in plan["reason"]
    # the same lengths on the host: the ragged rule on the real total, not this one
    host = plan_for(problem(batch=32, seqlen_k=32768, cache_seqlens=[100, 32768] * 16), H100)
    assert host["split"]["total_blocks"] > 0 and host["length_independent"] is False
    assert host["split"]["rule"] == "ragged"


@pytest.mark.parametrize("row,plan_want,rule", [
    # batch 1: no spread to plan for; the heuristic's plans (see the split rule)
    ((1, 32, 8, 1, 131072, 128), (16, 4), "heuristic"),
    ((1, 16, 16, 1, 65535, 64), (8, 4), "heuristic"),
    # 16 x 8 tiles of 256 blocks: the length-aware plan at the capacity, 12 x 1 (chunks of
    # 22: 8 x (187 + 8) = 1560 pieces, 390 CTAs, 3 waves x 27 = 81), models spread + skew
    # at 56 + 30 = 86; device chunks on 16 splits at 65 + 25 = 90: fixed chunks
    ((16, 32, 8, 1, 8192, 128), (12, 1), "ragged"),
    # 64 x 8 tiles of 128 blocks: the length-aware plan is 2 x 2 (chunks of 64 in pairs:
    # 512 CTAs, 4 waves x 37 = 148 at full length); device chunks of 128 pieces per tile
    # on 4 splits: 512 more empty CTAs, 152 (bound 152.4), and 108 + 69 = 177
    # spread + skew against 112 + 76 = 188; 8 splits model 160 at full length
    ((64, 32, 8, 1, 4096, 128), (4, 2), "device"),
])
def test_device_lengths_decode_rows_plans(row, plan_want, rule):
    """The decode rows of benchmarks/bench.py with device lengths.  Where they are
    chunked, at full length the chunks are those of the length-aware plan at the capacity
    (cache_seqlens on the host, all at the capacity)."""
    plan = plan_for(device_row(*row), H100)
    assert (plan["num_splits"], plan["walkers_per_split"]) == plan_want, plan["reason"]
    assert plan["split"]["rule"] == rule, plan["reason"]
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = row
    shape = dict(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                 seqlen_k=seqlen_k, head_dim=head_dim)
    if rule == "heuristic":
        dense = plan_for(problem(**shape), H100)
        assert (dense["num_splits"], dense["walkers_per_split"]) == plan_want
        assert dense["kernel"] == plan["kernel"]
        return
    at_capacity = plan_for(problem(cache_seqlens=[seqlen_k] * batch, **shape), H100)
    assert at_capacity["split"]["rule"] == "ragged"
    assert at_capacity["split"]["chunk"] == plan["split"]["chunk"]
    assert at_capacity["walkers_per_split"] == plan["walkers_per_split"]
    assert at_capacity["num_splits"] <= plan["num_splits"]


def test_device_lengths_chunks_only_for_the_heuristic():
    # a forced count: each row's result must not depend on the chunking of the others
    forced = plan_for(device_row(32, 32, 8, 1, 32768, 128), H100, num_splits=4)
    assert forced["num_splits"] == 4 and forced["split"]["rule"] == "forced"
    # no lengths at all (dense k/v): every entry is at full length, the heuristic's plan
    dense = plan_for(problem(batch=32, seqlen_k=32768), H100)
    assert (dense["num_splits"], dense["walkers_per_split"]) == (1, 2)
    assert dense["split"]["rule"] == "heuristic" and dense["length_independent"] is False


def test_device_lengths_hook_refuses_both_kinds():
    with pytest.raises(ValueError, match="device_lengths"):
        plan_for(problem(batch=2, cache_seqlens=[1, 2], device_lengths=1), H100)
