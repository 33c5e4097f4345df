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
#define FMHA_KERNEL_GPU_SM90 3    /* GPU: warp-specialized Hopper prefill (kernels/fwd_sm90.h) */
/* Ids 1..FMHA_GPU_KERNELS are the tensor-core producer's tile tables, whose
 * occupancy the runtime measures (fmha_device_info.ctas_per_sm). */
#define FMHA_GPU_KERNELS 2

/*
 * GPU tensor-core producer, one row per head_dim.  One warpgroup of 64 rows
 * per CTA, two CTAs per SM: the two CTAs drift apart, so one's softmax runs
 * while the other's tile products do.  Up to 64 packed rows (speculative
 * decoding, chunked prefill) it also packs GQA heads.
 *   X(head_dim, block_m, block_n, warps, stages, ctas, walkers)
 *   head_dim  features per head (compile-time in the kernel)
 *   block_m   query rows per tile; each warp of a walker owns block_m / (warps / walkers)
 *   block_n   keys per main-loop step
 *   warps     warps per CTA
 *   stages    K/V shared-memory buffers in flight (cp.async pipeline depth)
 *   ctas      CTAs per SM the register budget is cut for (__launch_bounds__)
 *   walkers   independent walkers per CTA: groups of warps / walkers warps, each
 *             with its own Q tile, K/V ring and key blocks; the planner gives
 *             each walker its own (tile, split), or lets 2 or 4 of them share
 *             one split's key blocks and merge in shared memory
 *             (fmha_fwd_params.walkers_per_split)
 *
 * Head dims are multiples of 16 (whole mma k-steps).  Those that are not
 * multiples of 64 (32, 80, 96) pad each shared-memory row by one 16-byte chunk
 * (kernels/fwd_mma.h smem_tile), never the caller's memory; 192 is three
 * swizzled panels and takes 32 keys a step so two CTAs fit an SM.  32, 80, 96
 * and 192 are NVIDIA only (the MFMA operand reads walk whole 64-column panels,
 * and have been built for 64 and 128).  256 runs O in two column parts
 * (FMHA_GPU_O_PARTS): a warp's 16 rows of 256 fp32 accumulators leave no
 * registers (the decode tiles spilled), so two walkers take the same rows and
 * keys, each computes S over all 256 features and keeps 128 columns of O;
 * its tiles hold the K rows whole and half of each V row.
 */
/* Column parts of O per (tile, split) at a head_dim: 2 at 256, else 1.  NVIDIA only. */
#define FMHA_GPU_O_PARTS(hd) ((hd) > 192 ? 2 : 1)
#if defined(FMHA_WITH_HIP)
#define FMHA_GPU_NVIDIA_ROW(X, ...)
#else
#define FMHA_GPU_NVIDIA_ROW(X, ...) X(__VA_ARGS__)
#endif
#define FMHA_GPU_MMA_CONFIGS(X)    \
    FMHA_GPU_NVIDIA_ROW(X, 32, 64, 128, 4, 3, 2, 1) \
    X(64, 64, 128, 4, 3, 2, 1)     \
    FMHA_GPU_NVIDIA_ROW(X, 80, 64, 64, 4, 3, 2, 1)  \
    FMHA_GPU_NVIDIA_ROW(X, 96, 64, 64, 4, 3, 2, 1)  \
    X(128, 64, 64, 4, 3, 2, 1)     \
    FMHA_GPU_NVIDIA_ROW(X, 192, 64, 32, 4, 3, 2, 1) \
    FMHA_GPU_NVIDIA_ROW(X, 256, 64, 32, 4, 2, 2, 1)

/*
 * GPU decode tiles, for few rows per kv head (decode, speculative decoding):
 * the query heads of a kv head are packed into the rows (pack_gqa), each warp
 * is a walker with a deep cp.async ring of its own (four per SM keep HBM
 * busy), and when there are few tiles the four warps of a CTA share one
 * split instead of needing four times the splits and a combine.  Same
 * fields as above.
 */
#define FMHA_GPU_DECODE_CONFIGS(X)                                     \
    FMHA_GPU_NVIDIA_ROW(X, 32, 16, 64, FMHA_GPU_DECODE_WALKERS, 3, 1, FMHA_GPU_DECODE_WALKERS) \
    X(64, 16, 64, FMHA_GPU_DECODE_WALKERS, 3, 1, FMHA_GPU_DECODE_WALKERS)  \
    FMHA_GPU_NVIDIA_ROW(X, 80, 16, 32, FMHA_GPU_DECODE_WALKERS, 3, 1, FMHA_GPU_DECODE_WALKERS) \
    FMHA_GPU_NVIDIA_ROW(X, 96, 16, 32, FMHA_GPU_DECODE_WALKERS, 2, 1, FMHA_GPU_DECODE_WALKERS) \
    X(128, 16, 32, FMHA_GPU_DECODE_WALKERS, 3, 1, FMHA_GPU_DECODE_WALKERS) \
    FMHA_GPU_NVIDIA_ROW(X, 192, 16, 16, FMHA_GPU_DECODE_WALKERS, 2, 1, FMHA_GPU_DECODE_WALKERS) \
    FMHA_GPU_NVIDIA_ROW(X, 256, 16, 16, FMHA_GPU_DECODE_WALKERS, 2, 1, FMHA_GPU_DECODE_WALKERS)
/*
 * Decode tiles for an fp8 e4m3fn KV cache (fwd_mma.h kv_ring widens each stage of codes
 * in shared memory): a walker spends issue slots on the widening, and one warp per
 * scheduler leaves every latency of its chain exposed, so these run two CTAs of four
 * walkers per SM (two warps per scheduler) on 16-key steps, whose Q tile, ring of
 * codes and widened K/V tile fit 28 KB a walker at head_dim 128.  192 keeps one CTA.
 * Same fields as above; AMD takes its decode rows.
 */
#if defined(FMHA_WITH_HIP)
#define FMHA_GPU_DECODE_FP8_CONFIGS(X) FMHA_GPU_DECODE_CONFIGS(X)
#else
#define FMHA_GPU_DECODE_FP8_CONFIGS(X)                                  \
    X(32, 16, 16, FMHA_GPU_DECODE_WALKERS, 4, 2, FMHA_GPU_DECODE_WALKERS)  \
    X(64, 16, 16, FMHA_GPU_DECODE_WALKERS, 4, 2, FMHA_GPU_DECODE_WALKERS)  \
    X(80, 16, 16, FMHA_GPU_DECODE_WALKERS, 4, 2, FMHA_GPU_DECODE_WALKERS)  \
    X(96, 16, 16, FMHA_GPU_DECODE_WALKERS, 4, 2, FMHA_GPU_DECODE_WALKERS)  \
    X(128, 16, 16, FMHA_GPU_DECODE_WALKERS, 4, 2, FMHA_GPU_DECODE_WALKERS) \
    X(192, 16, 16, FMHA_GPU_DECODE_WALKERS, 2, 1, FMHA_GPU_DECODE_WALKERS) \
    X(256, 16, 16, FMHA_GPU_DECODE_WALKERS, 2, 1, FMHA_GPU_DECODE_WALKERS)
#endif

/*
 * Hopper (sm_90a) warp-specialized prefill, one row per head_dim, same fields:
 * one producer warpgroup (TMA loads) and block_m / 64 consumer warpgroups of 64
 * rows (three at head_dims 32 and 64, whose products are too short to hide a softmax
 * behind one other warpgroup; two from 80 up), `stages` K and V buffers, one CTA
 * per SM (it holds most of the shared memory and registers).  Head_dim 192 takes
 * 112-key blocks: Q (48 KB) and two stages of 128-key K and V (4 x 48 KB) would
 * pass the 227 KB of shared memory, 112 keys fit (217 KB) with S at 56 floats a
 * thread next to O's 96.  Head_dim 256 takes 80-key blocks (Q 64 KB, two stages of K
 * and V 160 KB; O holds 128 registers a thread); KV caches and split plans at 256 run
 * the tensor-core tiles above, O in two parts.  Head_dims 80 and 96 run two
 * 64-column panels whose last 48 or 32 columns TMA fills with zeros (fwd_sm90.h), on the d96
 * tiles; head_dim 32 runs one panel whose last 32 columns are zeros, on the d64 tiles (the
 * same panel: the same O registers and shared memory, shorter S products).
 * kernels/fwd_sm90.h checks its compile-time constants against these rows.  The planner
 * picks it for prefill on cc 9.x when the build has sm_90a code (plan.c says when else).
 * The rows are listed in AMD builds too: only NVIDIA cc 9.x plans read them (plan.c
 * sm90_fit; fmha_plan_sm90_only_head_dim is 0 there), as fwd_sm90.h is NVIDIA only.
 */
#ifndef FMHA_SM90_D64_CONSUMERS
#define FMHA_SM90_D64_CONSUMERS 3 /* a build knob for comparisons (sm90_variants.sh) */
#endif
/*
 * Persistent grid (fwd_sm90.h persistent_tiles): the unmasked instances up to head_dim 192
 * (at 64 only those without a softcap or sinks) run one CTA per SM, each walking tiles
 * in launch order, so the next tile's K/V loads overlap a tile's epilogue.  0: one tile
 * per CTA everywhere.  Off until a GPU run has checked it (NOTES.md, known gaps); a build
 * knob for comparisons (config_variants.sh swaps this line).
 */
#ifndef FMHA_SM90_PERSISTENT
#define FMHA_SM90_PERSISTENT 0
#endif
/* A warp skips O *= 1 when no row's max moved, at head_dims up to this (0: never). */
#ifndef FMHA_SM90_SKIP_UNIT_RESCALE_MAX_HEAD_DIM
#define FMHA_SM90_SKIP_UNIT_RESCALE_MAX_HEAD_DIM 64
#endif
/*
 * bfloat16 with a softcap c (fwd_sm90.h): every capped score lies in (-c, c), so each
 * block's exponentials may take one fixed shift instead of the running row max: no row
 * max, no shuffles, no rescale of O.  The shift is min(c, FLOOR - c) (rounded to a
 * whole power of two), so the weights e^(s - shift) lie in about (e^-FLOOR,
 * e^max(0, 2c - FLOOR)): a row's largest weight stays
 * above e^-63, 24 above fp32's flush to zero (e^-87.3), so each weight that flushes is
 * under e^-24 of it; O and the row sum grow at most e^(2c - FLOOR) past the running
 * max's bound (e^37 at c = 50).  Float16's range is too short for it.
 */
#ifndef FMHA_SM90_FIXED_SHIFT_MAX_CAP
#define FMHA_SM90_FIXED_SHIFT_MAX_CAP 50.f /* 0: always the running max */
#endif
#define FMHA_SM90_FIXED_SHIFT_FLOOR 63.f
#define FMHA_GPU_SM90_CONFIGS(X)                                                          \
    X(32, 64 * FMHA_SM90_D64_CONSUMERS, 128, 4 * (1 + FMHA_SM90_D64_CONSUMERS), 3, 1, 1) \
    X(64, 64 * FMHA_SM90_D64_CONSUMERS, 128, 4 * (1 + FMHA_SM90_D64_CONSUMERS), 3, 1, 1) \
    X(80, 128, 128, 12, 2, 1, 1)                                                          \
    X(96, 128, 128, 12, 2, 1, 1)                                                          \
    X(128, 128, 128, 12, 2, 1, 1)                                                         \
    X(192, 128, 112, 12, 2, 1, 1)                                                         \
    X(256, 128, 80, 12, 2, 1, 1)

/*
 * How the consumer warpgroups of the sm90 kernel share the tensor cores
 * (fmha_fwd_params.schedule): INTERLEAVED, each issues its products as soon as
 * its operands are there; PINGPONG, they take turns, so one's softmax runs
 * under the others' products.  Ping-pong pays when the products of the other
 * warpgroups are long enough to hide a softmax (head_dim >=
 * FMHA_SM90_PINGPONG_MIN_HEAD_DIM: every head_dim now that d64 tiles have
 * three consumers; d32 runs the d64 tiles and follows their rule, though its
 * S products are half as long) and the tiles walk enough key blocks that the turn
 * hand-offs at a tile's start and end are a small part of it (on average at
 * least FMHA_SM90_PINGPONG_MIN_BLOCKS; causal tiles walk about half the keys);
 * otherwise interleaved is faster.  The rule is plan.c's sm90_schedule().
 */
#define FMHA_SM90_INTERLEAVED 0
#define FMHA_SM90_PINGPONG 1
#define FMHA_SM90_PINGPONG_MIN_HEAD_DIM (FMHA_SM90_D64_CONSUMERS >= 3 ? 32 : 128)
#define FMHA_SM90_PINGPONG_MIN_BLOCKS 16
/*
 * Wide key blocks: ping-pong tiles without a softcap walk FMHA_SM90_WIDE_BLOCK_N keys per
 * block, from a row's `bn` above (the narrow tiles', of which sm90_schedule() counts
 * blocks): 176 at head_dim 128 (S = Q K^T as m64n176k16, 88 floats a thread; Q 32 KB +
 * two stages of K and V, 4 x 44 KB), where each softmax pass, row reduction and O rescale
 * covers 1.375x the keys.  Ping-pong rows are long, so the partial last block costs
 * little; short interleaved rows and the softcap (its tanh over 88 scores a thread) ran
 * slower with 176 (NOTES.md).
 */
#ifndef FMHA_SM90_D128_WIDE_BLOCK_N
#define FMHA_SM90_D128_WIDE_BLOCK_N 176
#endif
#define FMHA_SM90_WIDE_BLOCK_N(hd, bn) ((hd) == 128 ? FMHA_SM90_D128_WIDE_BLOCK_N : (bn))
/* Which tiles are wide: the rule plan.c plans by and fwd_sm90.h compiles by. */
#define FMHA_SM90_WIDE_BLOCKS(schedule, softcapped) ((schedule) == FMHA_SM90_PINGPONG && !(softcapped))

/* One-warp walkers per decode CTA.  AMD: a workgroup has 64 KB of LDS, one
 * walker's worth there (its ring is one stage deep: mma_amd.h). */
#if defined(FMHA_WITH_HIP)
#define FMHA_GPU_DECODE_WALKERS 1
#else
#define FMHA_GPU_DECODE_WALKERS 4
#endif

/* Packed rows per kv head up to which the planner picks the decode tiles. */
#define FMHA_GPU_DECODE_MAX_ROWS 16

/* CPU tiles: query rows and keys per step (any head_dim 1..FMHA_CPU_MAX_HEAD_DIM). */
#define FMHA_CPU_BLOCK_M 16
#define FMHA_CPU_BLOCK_N 64
#define FMHA_CPU_MAX_HEAD_DIM 512

/* Splits: upper bound on any forced split count. */
#define FMHA_MAX_SPLITS 256
/* Upper bound on a split count the heuristic chooses (the combine folds them). */
#define FMHA_MAX_HEURISTIC_SPLITS 128
/* How much longer a prefill CTA takes when it shares its SM with another,
 * for the heuristic's time model: 1 + this per extra resident CTA.  The pair
 * overlaps one's softmax with the other's tile products but shares the tensor
 * cores.  The decode tiles are memory-bound: 0 there. */
#define FMHA_GPU_MMA_SHARE_COST 0.4
/* Fixed cost of one CTA (pipeline fill, epilogue) in key blocks, for the
 * heuristic's time model (benchmarks/sweep_splits.py). */
#define FMHA_SPLIT_OVERHEAD_BLOCKS 4
/* A split plan is taken only if its modelled time is below this fraction of
 * the unsplit plan's (the model omits the partials' traffic and the combine). */
#define FMHA_SPLIT_MIN_GAIN 0.9
/* Known ragged lengths are cut into equal chunks (the ragged rule) only when the
 * unsplit tiles fill fewer waves than this: with more, the grid's own order already
 * balances long and short entries (packed prefill), and chunks only add partials and a
 * combine (and would take prefill off the sm90 kernel, which writes none). */
#define FMHA_RAGGED_MAX_WAVES 2
/* How much faster the sm90 kernel runs a key block than the tensor-core prefill tiles
 * (a lower bound of the measured ratios, NOTES.md): a split plan, which only the old
 * tiles can run, must model this much faster than the sm90 kernel unsplit. */
#define FMHA_SM90_BLOCK_SPEEDUP 1.3
/* Decode tiles: a plan with more splits than the best so far must model below
 * this fraction of its time to replace it.  The model counts a walker's key
 * blocks, but these tiles are bandwidth-bound once enough CTAs read and each
 * split adds partials and combine work, so a plan the model finds a little
 * faster with more splits runs slower.  Prefill keeps the plain minimum (the
 * tie would move some of its shapes to too few splits). */
#define FMHA_GPU_DECODE_SPLIT_TIE 0.97
/*
 * Lengths on the device (never read on the host): plans whose chunk the kernels size
 * from the lengths they find (fmha_device_chunk, plan.c plan_unseen_lengths).  A
 * chunk is never under FMHA_DEVICE_CHUNK_MIN_BLOCKS key blocks (a piece's fill,
 * epilogue and partials are about 5 blocks' worth); every CTA sums the lengths
 * itself, so batches over FMHA_DEVICE_CHUNK_MAX_BATCH keep chunks fixed by the host.
 * The plans are modelled on lengths spread evenly up to the capacity and on one
 * entry at the capacity with the others at 1/FMHA_UNSEEN_SKEW of it.
 */
#define FMHA_DEVICE_CHUNK_MIN_BLOCKS 16
#define FMHA_DEVICE_CHUNK_MAX_BATCH 1024
#define FMHA_UNSEEN_SKEW 16

/*
 * A decode tile is the only reader of its K/V.  When the K/V bytes of a call total at
 * most FMHA_GPU_READ_ONCE_L2 times the L2's size, the tiles' copies ask L2 to evict
 * those lines first (fmha_fwd_params.kv_read_once), so the read leaves what else L2
 * holds in place: dirty lines of earlier kernels are not written back underneath it.
 * Past that size the dirty lines stay to the end anyway and the read runs in the rest
 * of the L2, so the hint would only cost (NOTES.md).
 */
#define FMHA_GPU_READ_ONCE_L2 4

#endif /* FMHA_CONFIG_H */
