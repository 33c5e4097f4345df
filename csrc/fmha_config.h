/*
 * fmha_config.h: the tile configurations, in one place.
 *
 * The planner (plan.c) reads these tables to answer "supported?" and to choose
 * tiles and splits; kernels/launch.hip instantiates exactly the rows listed
 * here and checks at compile time that its templates agree with them.  Nothing
 * else spells a tile size.  C11 and C++ clean.
 */
#ifndef FMHA_CONFIG_H
#define FMHA_CONFIG_H

/* Kernel ids, shared by planner and launcher. */
#define FMHA_KERNEL_CPU_TILED 0   /* CPU: block_m x block_n tiles, online softmax */
#define FMHA_KERNEL_GPU_MMA 1     /* GPU: tensor-core tiles (wgmma / mma.sync / MFMA) */
#define FMHA_KERNEL_GPU_DECODE 2  /* GPU: same kernel, few packed rows, deep K/V ring */
#define FMHA_GPU_KERNELS 2        /* GPU kernel ids are 1..FMHA_GPU_KERNELS */

/*
 * GPU tensor-core producer, one row per head_dim.  One warpgroup of 64 rows
 * per CTA, two CTAs per SM: the two CTAs drift apart, so one's softmax runs
 * while the other's tile products do (H200: d64 prefill 1.12x the 128-row,
 * two-warpgroup CTA at one per SM; benchmarks/RESULTS.md).  Up to 64 packed
 * rows (speculative decoding, chunked prefill) it also packs GQA heads.
 *   X(head_dim, block_m, block_n, warps, stages, ctas, streams)
 *   head_dim  features per head (compile-time in the kernel)
 *   block_m   query rows per tile; each warp of a stream owns block_m / (warps / streams)
 *   block_n   keys per main-loop step
 *   warps     warps per CTA
 *   stages    K/V shared-memory buffers in flight (cp.async pipeline depth)
 *   ctas      CTAs per SM the register budget is cut for (__launch_bounds__)
 *   streams   independent K/V streams per CTA, each with warps / streams warps,
 *             its own Q tile and K/V ring; the planner gives each stream its
 *             own (tile, split), or lets 2 or 4 of them share one split's key
 *             blocks and merge in shared memory (fmha_fwd_params.stream_splits)
 */
#define FMHA_GPU_MMA_CONFIGS(X)    \
    X(64, 64, 128, 4, 3, 2, 1)     \
    X(128, 64, 64, 4, 3, 2, 1)

/*
 * GPU decode tiles, for few rows per kv head (decode, speculative decoding):
 * the query heads of a kv head are packed into the rows (pack_gqa), each warp
 * is a stream with a deep cp.async ring of its own (four per SM keep HBM
 * busy), and when there are few tiles the four warps of a CTA share one
 * split instead of needing four times the splits and a combine.  Same
 * fields as above.
 */
#define FMHA_GPU_DECODE_CONFIGS(X)                                    \
    X(64, 16, 64, FMHA_GPU_DECODE_STREAMS, 3, 1, FMHA_GPU_DECODE_STREAMS) \
    X(128, 16, 32, FMHA_GPU_DECODE_STREAMS, 3, 1, FMHA_GPU_DECODE_STREAMS)
/* One-warp streams per decode CTA.  AMD: a workgroup has 64 KB of LDS, one
 * stream's worth there (its ring is one stage deep: mma_amd.h). */
#if defined(FMHA_WITH_HIP)
#define FMHA_GPU_DECODE_STREAMS 1
#else
#define FMHA_GPU_DECODE_STREAMS 4
#endif

/* Packed rows per kv head up to which the planner picks the decode tiles. */
#define FMHA_GPU_DECODE_MAX_ROWS 16

/* CPU tiles: query rows and keys per step (any head_dim 1..FMHA_CPU_MAX_HEAD_DIM). */
#define FMHA_CPU_BLOCK_M 16
#define FMHA_CPU_BLOCK_N 64
#define FMHA_CPU_MAX_HEAD_DIM 256

/* 1: the producer and the split-K combine are launched to overlap the tail
 * of the kernel before them (programmatic dependent launch, NVIDIA sm_90+;
 * each waits for that kernel before it touches memory); 0: plain launches. */
#define FMHA_GPU_OVERLAP_LAUNCH 1

/* Splits: upper bound on any forced split count. */
#define FMHA_MAX_SPLITS 256
/* Upper bound on a split count the heuristic chooses (the combine folds them). */
#define FMHA_MAX_HEURISTIC_SPLITS 128
/* A split the heuristic makes owns at least this many key blocks (the time
 * model below already charges each split its fill and partials; H200 sweep:
 * 4 -> 1 took the geomean regret from 1.019 to 1.009). */
#define FMHA_MIN_BLOCKS_PER_SPLIT 1
/* How much longer a prefill CTA takes when it shares its SM with another,
 * for the heuristic's time model: 1 + this per extra resident CTA.  The pair
 * overlaps one's softmax with the other's tile products but shares the tensor
 * cores (H200 sweep: two long d128 CTAs per SM finish in ~1.4x the time of
 * one).  The decode tiles are memory-bound: 0 there. */
#define FMHA_GPU_MMA_SHARE_COST 0.4
/* Fixed cost of one CTA (pipeline fill, epilogue) in key blocks, for the
 * heuristic's time model (benchmarks/sweep_splits.py). */
#define FMHA_SPLIT_OVERHEAD_BLOCKS 4
/* A split plan is taken only if its modelled time is below this fraction of
 * the unsplit plan's (the model omits the partials' traffic and the combine). */
#define FMHA_SPLIT_MIN_GAIN 0.9
/* Decode tiles: a plan with more splits than the best so far must model below
 * this fraction of its time to replace it.  The model counts a stream's key
 * blocks, but these tiles are bandwidth-bound once ~128 CTAs stream (H200: 132
 * instead of 128 CTAs brought no bandwidth) and each split adds partials and
 * combine work: (1,32,8,1,131072,128) ran 16 splits x 4 streams in 0.1398 ms
 * against 33 x 2 in 0.1415, modelled 1.5% apart the other way.  Prefill keeps
 * the plain minimum ((5,4,4,512,73544,64) would drop from 8 splits to a slower 3). */
#define FMHA_GPU_DECODE_SPLIT_TIE 0.97

/*
 * A decode tile is the only reader of its K/V.  When the K/V bytes of a call total at
 * most FMHA_GPU_READ_ONCE_L2 times the L2's size, the tiles' copies ask L2 to evict
 * those lines first (fmha_fwd_params.kv_read_once), so the read leaves what else L2
 * holds in place: dirty lines of earlier kernels are not written back underneath it.
 * H200 (60 MB L2), L2 zeroed before each call: reads of 34-134 MB 5-8% faster, 201 MB
 * 1.5%, 268 MB even, 537 MB and more 4% slower (the dirty lines then stay to the end
 * and the stream runs in the rest of the L2); with a clean L2, within 1% at every size
 * (benchmarks/RESULTS.md, ninth session).
 */
#define FMHA_GPU_READ_ONCE_L2 4

#endif /* FMHA_CONFIG_H */
