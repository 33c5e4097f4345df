/*
 * plan.c: the capability gate, the kernel choice and the split rule.
 *
 * One function, fmha_plan_make, answers both "can this backend run the
 * problem?" (the gate, item by item) and "with which kernel, tiles and split
 * count?", in numbers and reason codes: explain.c puts them into words, the
 * backends run them.  Pure C: no allocation, no device calls, no text, no
 * reads behind the params' pointers (per-batch key lengths are not known
 * here: the glue passes the longest length as seqlen_k and their sum as
 * total_keys; only the presence of block_table and cu_seqlens counts).
 */
#include "fmha.h"
#include "fmha_config.h"

#include <float.h>
#include <stdint.h>
#include <string.h>

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void gate_add(fmha_plan *plan, fmha_gate_id id, int met, int64_t a, int64_t b)
{
    plan->gate[plan->n_gate++] = (fmha_gate_item){id, met, a, b};
    if (!met)
        plan->supported = 0;
}

int64_t fmha_num_key_blocks(const fmha_fwd_params *p, int block_n)
{
    int64_t keys = p->seqlen_k + (p->seqlens_k ? p->seqlen_new : 0);
    int64_t n = ceil_div(keys, block_n);
    return n > 0 ? n : 1;
}

int64_t fmha_window_right(const fmha_fwd_params *p)
{
    return p->causal ? 0 : p->window_right;
}

fmha_dtype fmha_kv_dtype(const fmha_fwd_params *p)
{
    return p->kv_dtype == FMHA_DTYPE_E4M3 ? FMHA_DTYPE_E4M3 : p->dtype;
}

int fmha_features(const fmha_fwd_params *p)
{
    int f = 0;
    if (p->window_left >= 0 || (!p->causal && p->window_right >= 0))
        f |= FMHA_FEATURE_WINDOW;
    if (p->softcap != 0.0f)
        f |= FMHA_FEATURE_SOFTCAP;
    if (p->sinks)
        f |= FMHA_FEATURE_SINKS;
    return f;
}

/*
 * A tile's query positions are consecutive (rows of one sequence), so with both sides
 * of the window bounded it sees at most rows + left + right keys, which a misaligned
 * start spreads over one more block.  A window open on one side hides no block from
 * every tile (the first or last tile still reaches the end), so all blocks count; so
 * does a side at least as long as the keys (which also keeps the sum from overflowing).
 */
int64_t fmha_visible_key_blocks(const fmha_fwd_params *p, int64_t rows, int block_n)
{
    const int64_t all = fmha_num_key_blocks(p, block_n);
    const int64_t right = fmha_window_right(p), keys = all * block_n;
    if (p->window_left < 0 || right < 0 || p->window_left >= keys || right >= keys)
        return all;
    const int64_t span = (rows > 0 ? rows : 1) + p->window_left + right;
    const int64_t visible = ceil_div(span, block_n) + 1;
    return visible < all ? visible : all;
}

/* Rows one tile covers: query rows, times the query heads of a kv head when packed. */
static int64_t tile_rows(const fmha_fwd_params *p, int pack_gqa)
{
    return pack_gqa ? p->seqlen_q * (p->heads_q / p->heads_kv) : p->seqlen_q;
}

/* ---- the split rule ---- */

/*
 * Where CTAs run, for the split model: `units` SMs (or CPU threads) holding
 * up to `per_unit` CTAs each; a CTA sharing its unit with r - 1 others takes
 * 1 + share_cost * (r - 1) times as long as alone.
 */
typedef struct machine {
    int64_t units, per_unit;
    double share_cost;
    double split_tie; /* a plan with more splits than the best must model below this fraction of it */
} machine;

static int64_t machine_slots(const machine *m) { return m->units * m->per_unit; }

/* Modelled time of `ctas` equal CTAs of `blocks` key blocks' work each. */
static double model_time(const machine *m, int64_t ctas, int64_t blocks)
{
    int64_t resident = ceil_div(ctas, m->units);
    resident = resident < m->per_unit ? resident : m->per_unit;
    return (double)ceil_div(ctas, machine_slots(m)) * (double)(blocks + FMHA_SPLIT_OVERHEAD_BLOCKS) *
           (1.0 + m->share_cost * (double)(resident > 1 ? resident - 1 : 0));
}

/* The work the split search cuts: equal tiles, or the tiles of a ragged batch. */
typedef struct split_work {
    int64_t tiles;        /* tiles (ragged: the tiles of one batch entry) */
    int64_t key_blocks;   /* key blocks of a tile (ragged: of the longest entry) */
    int64_t total_blocks; /* ragged: key blocks of all entries together; 0 = equal tiles */
    int64_t batch;        /* ragged: entries */
    int64_t partial;      /* key blocks' worth of time a split piece spends on its partials */
    int walkers;          /* walkers of one CTA */
    double split_gain;    /* a split plan's modelled time is divided by this */
} split_work;

/* (tile, split) pieces when the splits hold `chunk` key blocks each. */
static int64_t split_pieces(const split_work *w, int64_t splits, int64_t chunk)
{
    if (!w->total_blocks)
        return w->tiles * splits;
    /* every entry has ceil(its blocks / chunk) pieces; its last is on average half full */
    return w->tiles * (ceil_div(w->total_blocks, chunk) + w->batch / 2);
}

/*
 * The split rule.  Over split counts s = 1 .. min(key_blocks,
 * FMHA_MAX_HEURISTIC_SPLITS) and walkers per split ws = walkers, walkers/2,
 * .. 1 (each walker with a key block), take the least modelled time
 *
 *   waves(pieces(s) * ws / walkers) * (ceil(chunk / ws) + FMHA_SPLIT_OVERHEAD_BLOCKS
 *                                      + partial if s > 1) * slow-down of shared SMs
 *
 * with chunk = ceil(key_blocks / s) (a CTA pays a pipeline fill and an
 * epilogue, a split CTA also writes fp32 partials the combine reads back,
 * and a ragged last wave leaves SMs idle).  A split plan's time is divided by
 * split_gain (equal tiles: the model omits the partials' traffic and the
 * combine); a plan with more splits than the best so far must model below
 * m->split_tie times it; ties go to more walkers per split, then to fewer
 * splits.  The constants were fit with benchmarks/sweep_splits.py.
 */
/* The rule's modelled time of s splits of ws walkers each (chunk = ceil(key_blocks / s)). */
static double split_cost(const split_work *w, const machine *m, int64_t s, int ws)
{
    const int64_t chunk = ceil_div(w->key_blocks, s);
    const int64_t ctas = ceil_div(split_pieces(w, s, chunk) * ws, w->walkers);
    const double cost = model_time(m, ctas, ceil_div(chunk, ws) + (s > 1 ? w->partial : 0));
    return s > 1 ? cost / w->split_gain : cost;
}

static int split_search_all(const split_work *w, const machine *m, int *walkers_out)
{
    int64_t limit = w->key_blocks < FMHA_MAX_HEURISTIC_SPLITS ? w->key_blocks
                                                              : FMHA_MAX_HEURISTIC_SPLITS;
    int best = 1, best_ws = 1;
    double best_cost = DBL_MAX;
    for (int ws = w->walkers; ws >= 1; ws /= 2)
        for (int64_t s = 1; s <= (limit > 1 ? limit : 1); s++) {
            if (ws > 1 && ceil_div(w->key_blocks, s) < ws)
                break; /* a walker with no block */
            const double cost = split_cost(w, m, s, ws);
            if (cost < best_cost * (s > best ? m->split_tie : 1.0)) {
                best_cost = cost;
                best = (int)s;
                best_ws = ws;
            }
        }
    *walkers_out = best_ws;
    return best;
}

/*
 * split_search_all runs on the host path of every call: for long keys hundreds of
 * model evaluations (each s up to 128, for each walker count), and a decode loop
 * asks the same question at every step.  The last few answers are kept, per thread
 * (the search is a function of w and m alone).
 */
#define SPLIT_MEMO_ENTRIES 4
typedef struct split_memo {
    split_work w;
    machine m;
    int splits, ws, valid;
} split_memo;

static int same_question(const split_memo *e, const split_work *w, const machine *m)
{
    return e->valid && e->w.tiles == w->tiles && e->w.key_blocks == w->key_blocks &&
           e->w.total_blocks == w->total_blocks && e->w.batch == w->batch && e->w.partial == w->partial &&
           e->w.walkers == w->walkers && e->w.split_gain == w->split_gain && e->m.units == m->units &&
           e->m.per_unit == m->per_unit && e->m.share_cost == m->share_cost && e->m.split_tie == m->split_tie;
}

static int split_search(const split_work *w, const machine *m, int *walkers_out)
{
    static _Thread_local split_memo memo[SPLIT_MEMO_ENTRIES];
    static _Thread_local int next;
    for (int i = 0; i < SPLIT_MEMO_ENTRIES; i++)
        if (same_question(&memo[i], w, m)) {
            *walkers_out = memo[i].ws;
            return memo[i].splits;
        }
    split_memo *e = &memo[next];
    next = (next + 1) % SPLIT_MEMO_ENTRIES;
    e->splits = split_search_all(w, m, &e->ws);
    e->w = *w;
    e->m = *m;
    e->valid = 1;
    *walkers_out = e->ws;
    return e->splits;
}

/*
 * The split count and walkers per split: the caller's count clamped to the
 * key blocks there are (one walker per split, so a row's result does not
 * depend on the rest of the batch: DESIGN.md), or the split rule's, on equal
 * tiles or (heuristic with known per-entry lengths) on a ragged batch.
 * A ragged batch is cut into chunks of the same size for every entry, so an
 * entry of n blocks has ceil(n / chunk) non-empty splits and short entries do
 * not wait on the longest one's pieces.
 */
static void plan_splits(int requested, split_work *w, const machine *m, fmha_plan *plan)
{
    fmha_split_why *why = &plan->split;
    why->requested = requested;
    why->key_blocks = w->key_blocks;
    why->tiles = w->tiles;
    why->units = m->units;
    why->slots = machine_slots(m);
    if (requested > 0) {
        why->rule = FMHA_SPLITS_FORCED;
        plan->num_splits = requested > w->key_blocks ? (int)w->key_blocks : requested;
        plan->walkers_per_split = 1;
        return;
    }
    if (w->total_blocks) {
        w->split_gain = 1.0;
        plan->num_splits = split_search(w, m, &plan->walkers_per_split);
        why->rule = FMHA_SPLITS_RAGGED;
        why->total_blocks = w->total_blocks;
        why->chunk = ceil_div(w->key_blocks, plan->num_splits);
        plan->split_blocks = plan->num_splits > 1 ? (int)why->chunk : 0;
        return;
    }
    w->split_gain = FMHA_SPLIT_MIN_GAIN;
    plan->num_splits = split_search(w, m, &plan->walkers_per_split);
    const int64_t ctas = ceil_div(w->tiles * plan->num_splits * plan->walkers_per_split, w->walkers);
    why->rule = FMHA_SPLITS_HEURISTIC;
    why->waves = ceil_div(ctas, why->slots);
    why->busy = (double)ctas / (double)why->slots / (double)why->waves;
}

/*
 * Lengths on the device (cache_seqlens or cu_seqlens_k the host does not
 * read): the plan must serve whatever lengths the kernels find, from all at
 * the capacity to a spread of long and short ones.  A plan made for all at the
 * capacity ends unevenly on spread lengths: the SMs of short entries idle while
 * the longest finish.  Both kinds of plan cut every entry into chunks so that
 * each gets as many non-empty splits as its length needs:
 *   fixed chunks   split_blocks key blocks, the length-aware plan's at the capacity;
 *                  the grid has every split of every entry, and the CTAs of splits
 *                  past an entry's length walk no key block and only write empty
 *                  partials (lse = -inf, which the combine skips);
 *   device chunks  sized by the kernels from the lengths they find
 *                  (fmha_device_chunk: about `pieces` pieces per tile, at least
 *                  FMHA_DEVICE_CHUNK_MIN_BLOCKS blocks, at most num_splits per
 *                  entry), so that a batch of short entries, or one long entry
 *                  among short ones, still spreads over every SM; the grid is
 *                  compact (fmha_device_grid_pieces: pieces + batch per tile at
 *                  most, the entries' pieces back to back), its pieces past the
 *                  lengths' idle, and each entry's last piece marks its unused
 *                  splits empty.
 * Plans are modelled on three cases of the same model: `full`, every entry at
 * the capacity; `spread`, lengths spread evenly over [0, capacity]; `skew`,
 * one entry at the capacity and the others at 1/FMHA_UNSEEN_SKEW of it.
 * Issue 20 allows a length-independent plan 3% over a length-aware one: at full
 * length a plan must model within FMHA_UNSEEN_LENGTHS_SLACK of the length-aware
 * plan, which bounds the split slots of a wide grid.
 */
#define FMHA_UNSEEN_LENGTHS_SLACK 1.03

/* Modelled time of `pieces` (tile, split) pieces of at most `chunk` key blocks, ws
 * walkers each, on a grid of `launched` pieces: the others are empty or idle, each
 * costing about its partials in a split plan. */
static double pieces_time(const split_work *w, const machine *m, int64_t pieces, int64_t launched,
                          int64_t chunk, int ws, int split)
{
    pieces = pieces < launched ? pieces : launched;
    const int64_t ctas = ceil_div(pieces * ws, w->walkers);
    const int64_t empty = ceil_div(launched * ws, w->walkers) - ctas;
    double t = model_time(m, ctas, ceil_div(chunk, ws) + (split ? w->partial : 0));
    if (split)
        t += (double)ceil_div(empty, machine_slots(m)) * (double)w->partial;
    return t;
}

/* A plan for unseen lengths: `splits` splits of ws walkers; chunks of fixed key
 * blocks (pieces 0: ceil(key_blocks / splits)) or sized on the device. */
typedef struct unseen_plan {
    int64_t splits, pieces;
    int ws;
} unseen_plan;

/* The chunk of plan u for a batch whose longest entry has `longest` key blocks and all
 * together `total` (key_blocks: the capacity's). */
static int64_t unseen_chunk(const unseen_plan *u, int64_t key_blocks, int64_t longest, int64_t total)
{
    if (!u->pieces)
        return ceil_div(key_blocks, u->splits);
    return fmha_device_chunk(longest, total, u->splits, u->pieces);
}

/* The (tile, split) slots of plan u on the tiles of full, every split of every entry.
 * Each costs about its partials whether a piece fills it or not: an empty piece writes
 * its lse, and with device chunks (a compact grid of fewer pieces) the entry's last
 * piece marks it empty and the combine reads it. */
static int64_t unseen_launched(const split_work *full, const unseen_plan *u)
{
    return full->tiles * u->splits;
}

/* Modelled times of plan u (full: the equal tiles of the whole batch) at full length,
 * and on spread + skewed lengths. */
static double unseen_full(const split_work *full, const machine *m, const unseen_plan *u)
{
    const int64_t K = full->key_blocks, B = full->batch;
    const int64_t chunk = unseen_chunk(u, K, K, B * K);
    const int64_t per_tile = ceil_div(K, chunk) < u->splits ? ceil_div(K, chunk) : u->splits;
    return pieces_time(full, m, full->tiles * per_tile, unseen_launched(full, u), chunk, u->ws, u->splits > 1);
}
static double unseen_spread_skew(const split_work *full, const machine *m, const unseen_plan *u)
{
    const int64_t K = full->key_blocks, B = full->batch, tiles = full->tiles / B;
    const int64_t launched = unseen_launched(full, u), short_len = ceil_div(K, FMHA_UNSEEN_SKEW);
    /* spread: half the capacity's blocks in all, the last chunk of each entry half full */
    const int64_t spread_total = B * K / 2 > 0 ? B * K / 2 : 1;
    const int64_t c1 = unseen_chunk(u, K, K, spread_total);
    const double spread = pieces_time(full, m, tiles * (ceil_div(spread_total, c1) + B / 2), launched, c1,
                                      u->ws, u->splits > 1);
    const int64_t c2 = unseen_chunk(u, K, K, K + (B - 1) * short_len);
    const double skew = pieces_time(full, m, tiles * (ceil_div(K, c2) + (B - 1) * ceil_div(short_len, c2)),
                                    launched, c2, u->ws, u->splits > 1);
    return spread + skew;
}

/*
 * After plan_splits on the equal tiles of the whole batch (`full`): the plan for
 * lengths the host cannot see.  The reference is the length-aware plan of a batch
 * at the capacity (the ragged rule's s splits of ws walkers, chunks of
 * ceil(key_blocks / s)): that plan with fixed chunks, or (batch up to
 * FMHA_DEVICE_CHUNK_MAX_BATCH) its device-chunk form: batch x s pieces per tile,
 * which at full length are the same chunks and shrink with the total found, on a
 * grid of more splits (the most, up to one per FMHA_DEVICE_CHUNK_MIN_BLOCKS, halved
 * down to s) so that a long entry among short ones still spreads over the SMs.
 * The plan that models fastest on spread + skew lengths is taken, among those
 * that model within FMHA_UNSEEN_LENGTHS_SLACK of the reference at full length
 * (the split slots of the wider grids).
 */
static void plan_unseen_lengths(const split_work *full, const machine *m, fmha_plan *plan)
{
    const int64_t K = full->key_blocks, B = full->batch, tiles = full->tiles / B;
    const int64_t limit = K < FMHA_MAX_HEURISTIC_SPLITS ? K : FMHA_MAX_HEURISTIC_SPLITS;
    split_work at_capacity = {tiles, K, B * K, B, full->partial, full->walkers, 1.0};
    int ws = 1;
    const int64_t s = split_search(&at_capacity, m, &ws);
    const unseen_plan fixed = {s, 0, ws};
    unseen_plan best = fixed;
    if (B <= FMHA_DEVICE_CHUNK_MAX_BATCH) {
        const double bound = FMHA_UNSEEN_LENGTHS_SLACK * unseen_full(full, m, &fixed);
        double best_cost = unseen_spread_skew(full, m, &fixed);
        const int64_t most = ceil_div(K, FMHA_DEVICE_CHUNK_MIN_BLOCKS) < limit
                                 ? ceil_div(K, FMHA_DEVICE_CHUNK_MIN_BLOCKS)
                                 : limit;
        for (int64_t splits = most > s ? most : s;; splits = splits / 2 > s ? splits / 2 : s) {
            const unseen_plan u = {splits, B * s, ws};
            if (unseen_full(full, m, &u) <= bound) {
                const double cost = unseen_spread_skew(full, m, &u);
                if (cost < best_cost) {
                    best_cost = cost;
                    best = u;
                }
            }
            if (splits == s)
                break;
        }
    }
    fmha_split_why *why = &plan->split;
    plan->num_splits = (int)best.splits;
    plan->walkers_per_split = best.ws;
    why->rule = best.pieces ? FMHA_SPLITS_DEVICE : FMHA_SPLITS_RAGGED;
    why->tiles = tiles;
    why->total_blocks = 0; /* not known: explain says the lengths are unseen */
    why->chunk = unseen_chunk(&best, K, K, B * K);
    why->pieces = best.pieces;
    why->min_chunk = best.pieces ? FMHA_DEVICE_CHUNK_MIN_BLOCKS : 0;
    why->waves = 0;
    why->busy = 0.0;
    plan->split_blocks = !best.pieces && best.splits > 1 ? (int)why->chunk : 0;
    plan->device_pieces = best.pieces;
}

/* Key blocks' worth of time a split CTA spends on its fp32 partials (written,
 * then read by the combine): block_m rows of fp32 against block_n rows of K
 * and V in 16 bits, about 2 * block_m / block_n. */
static int64_t split_partial_cost(int block_m, int block_n)
{
    return ceil_div(2 * (int64_t)block_m, block_n);
}

/* ---- CPU ---- */

static void plan_cpu(const fmha_fwd_params *p, const fmha_target *t, int requested,
                     fmha_plan *plan)
{
    plan->backend = FMHA_BACKEND_CPU;
    gate_add(plan, FMHA_GATE_DTYPE, 1, p->dtype, fmha_kv_dtype(p));
    gate_add(plan, FMHA_GATE_HEAD_DIM, p->head_dim >= 1 && p->head_dim <= FMHA_CPU_MAX_HEAD_DIM,
             p->head_dim, FMHA_CPU_MAX_HEAD_DIM);
    plan->kernel_id = FMHA_KERNEL_CPU_TILED;
    plan->block_m = FMHA_CPU_BLOCK_M;
    plan->block_n = FMHA_CPU_BLOCK_N;
    /* The CPU tiles always interleave the query heads of a kv head into rows. */
    plan->pack_gqa = p->heads_q > p->heads_kv;

    const int threads = t->num_threads > 0 ? t->num_threads : 1;
    const machine cpu = {threads, 1, 0.0, 1.0};
    /* A tile's query positions: block_m packed rows hold block_m / group positions. */
    const int64_t group = p->heads_q / p->heads_kv;
    const int64_t positions = ceil_div(plan->block_m, plan->pack_gqa ? group : 1);
    split_work w = {p->batch * p->heads_kv * ceil_div(tile_rows(p, 1), plan->block_m),
                    fmha_visible_key_blocks(p, positions < p->seqlen_q ? positions : p->seqlen_q,
                                            plan->block_n),
                    0, 0, split_partial_cost(plan->block_m, plan->block_n), 1, 1.0};
    plan_splits(requested, &w, &cpu, plan);
    plan->split.all_key_blocks = fmha_num_key_blocks(p, plan->block_n);
}

/* ---- GPU ---- */

/* A row of the GPU tile tables. */
typedef struct gpu_tiles {
    int block_m, block_n, warps, stages, walkers;
} gpu_tiles;

/* The GPU kernels are instantiated for the head_dims of these tables; the
 * row index also indexes fmha_device_info.ctas_per_sm. */
static int gpu_mma_config(int64_t head_dim, gpu_tiles *t, int *row)
{
    int r = 0;
#define FMHA_MATCH(hd, bm, bn, w, st, ctas, wk) \
    if (head_dim == (hd)) { *t = (gpu_tiles){bm, bn, w, st, wk}; *row = r; return 1; } r++; (void)(ctas);
    FMHA_GPU_MMA_CONFIGS(FMHA_MATCH)
#undef FMHA_MATCH
    return 0;
}

/* The decode tiles for head_dim (every head_dim of the prefill table has a row); fp8:
 * an fp8 KV cache's, whose CTAs per SM, the table's, go to *ctas_per_sm (else that
 * stays as it was: the runtime measures the 16-bit tiles' occupancy). */
static int gpu_decode_config(int64_t head_dim, int fp8, gpu_tiles *t, int *ctas_per_sm)
{
#define FMHA_MATCH(hd, bm, bn, w, st, ctas, wk) \
    if (head_dim == (hd)) { *t = (gpu_tiles){bm, bn, w, st, wk}; if (fp8) *ctas_per_sm = (ctas); return 1; }
    if (fp8) {
        FMHA_GPU_DECODE_FP8_CONFIGS(FMHA_MATCH)
    } else {
        FMHA_GPU_DECODE_CONFIGS(FMHA_MATCH)
    }
#undef FMHA_MATCH
    return 0;
}

/* The sm90 kernel's tiles for head_dim and the CTAs per SM it is built for. */
static int gpu_sm90_config(int64_t head_dim, gpu_tiles *t, int *ctas_per_sm)
{
#define FMHA_MATCH(hd, bm, bn, w, st, ctas, wk) \
    if (head_dim == (hd)) { *t = (gpu_tiles){bm, bn, w, st, wk}; *ctas_per_sm = ctas; return 1; }
    FMHA_GPU_SM90_CONFIGS(FMHA_MATCH)
#undef FMHA_MATCH
    return 0;
}

int fmha_rows_aligned(const void *data, int64_t batch_stride, int64_t row_stride,
                      int64_t head_stride, int64_t head_dim, int64_t align_elems, int64_t elem_bytes)
{
    if (!data)
        return 1; /* not placed yet (explain, outputs still to allocate): allocated aligned */
    return (uintptr_t)data % (uintptr_t)(align_elems * elem_bytes) == 0 &&
           batch_stride % align_elems == 0 && row_stride % align_elems == 0 &&
           head_stride % align_elems == 0 && head_dim % align_elems == 0;
}

/* Whether k and v rows start on the boundaries of `in` 2-byte elements (in * 2 bytes;
 * an fp8 cache's codes are 1 byte). */
static int kv_aligned(const fmha_fwd_params *p, int64_t in)
{
    const int64_t elem = fmha_kv_dtype(p) == FMHA_DTYPE_E4M3 ? 1 : FMHA_GPU_ELEM_BYTES;
    const int64_t align = in * FMHA_GPU_ELEM_BYTES / elem;
    return fmha_rows_aligned(p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride,
                             p->head_dim, align, elem) &&
           fmha_rows_aligned(p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride,
                             p->head_dim, align, elem);
}

/* Whether q, k and v rows are aligned to `in` elements and out rows to `out`
 * (2-byte elements, the GPU kernels' types; fp8 K/V to the same bytes).  An out of
 * another dtype than the inputs' is written by the combine alone, element by element:
 * any layout will do. */
static int qkvo_aligned(const fmha_fwd_params *p, int64_t in, int64_t out)
{
    const int64_t elem = FMHA_GPU_ELEM_BYTES;
    if (p->out_dtype != p->dtype)
        out = 1;
    return fmha_rows_aligned(p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride,
                             p->head_dim, in, elem) &&
           kv_aligned(p, in) &&
           fmha_rows_aligned(p->out, p->o_batch_stride, p->o_row_stride, p->o_head_stride,
                             p->head_dim, out, elem);
}

/* Whether no operand needs gpu.c's aligned copy (fmha.h: FMHA_GPU_ALIGN_*). */
static int gpu_rows_aligned(const fmha_fwd_params *p)
{
    const int64_t in = FMHA_GPU_ALIGN_IN, elem = FMHA_GPU_ELEM_BYTES;
    int ok = qkvo_aligned(p, in, FMHA_GPU_ALIGN_OUT);
    if (p->k_new)
        ok = ok && fmha_rows_aligned(p->k_new, p->knew_batch_stride, p->knew_row_stride,
                                     p->knew_head_stride, p->head_dim, in, elem) &&
             fmha_rows_aligned(p->v_new, p->vnew_batch_stride, p->vnew_row_stride,
                               p->vnew_head_stride, p->head_dim, in, elem);
    return ok;
}

/* Resident CTAs per SM of the tensor-core kernel: measured by the runtime
 * (registers and shared memory) when known, else as its shared memory allows. */
static int gpu_ctas_per_sm(const fmha_device_info *dev, int kernel, int row, int64_t head_dim,
                           const gpu_tiles *t)
{
    if (row < FMHA_GPU_MAX_CONFIGS && dev->ctas_per_sm[kernel - 1][row] > 0)
        return dev->ctas_per_sm[kernel - 1][row];
    /* Per walker: Q tile + `stages` K and V tiles, 2-byte elements. */
    int64_t smem = (int64_t)t->walkers * (t->block_m + 2 * t->stages * t->block_n) * head_dim * 2;
    int64_t per_sm = dev->max_smem_per_sm > 0 ? dev->max_smem_per_sm : dev->max_smem_per_block;
    int ctas = smem > 0 ? (int)(per_sm / smem) : 1;
    return ctas < 1 ? 1 : ctas;
}

#ifndef FMHA_HIP_ARCHS_BUILT
#define FMHA_HIP_ARCHS_BUILT "" /* not a HIP build: no AMD code objects */
#endif
#ifndef FMHA_CUDA_ARCHS_BUILT
#define FMHA_CUDA_ARCHS_BUILT "" /* not a CUDA build: no NVIDIA code */
#endif

/* Whether arch (a gcnArchName: only the part before the first ':' counts) is in
 * the ';'-separated list. */
static int arch_in_list(const char *arch, const char *list)
{
    size_t len = strcspn(arch, ":");
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ";");
        if (n == len && strncmp(p, arch, len) == 0)
            return 1;
        p += n + (p[n] == ';');
    }
    return 0;
}

/*
 * Launching without a code object would make the HIP runtime abort, so both
 * the gate here and the launcher (kernels/runtime.hip) ask this first.
 */
int fmha_hip_arch_built(const char *arch) { return arch_in_list(arch, FMHA_HIP_ARCHS_BUILT); }

const char *fmha_plan_hip_archs(const fmha_target *t)
{
    return t->hip_archs_built ? t->hip_archs_built : FMHA_HIP_ARCHS_BUILT;
}

const char *fmha_plan_cuda_archs(const fmha_target *t)
{
    return t->cuda_archs_built ? t->cuda_archs_built : FMHA_CUDA_ARCHS_BUILT;
}

/* A head_dim with sm90 tiles and no tensor-core tiles (256): only the sm90 kernel runs it.
 * None in an AMD build (no sm90 kernel; its tensor-core table lists 64 and 128 only). */
int fmha_plan_sm90_only_head_dim(int64_t head_dim)
{
#if defined(FMHA_WITH_HIP)
    (void)head_dim;
    return 0;
#else
    gpu_tiles tiles;
    int row = 0, ctas = 0;
    return !gpu_mma_config(head_dim, &tiles, &row) && gpu_sm90_config(head_dim, &tiles, &ctas);
#endif
}

static fmha_sm90_why sm90_fit(const fmha_fwd_params *p, const fmha_target *t, int requested, int packed);

static void gpu_gate(const fmha_fwd_params *p, const fmha_target *t, int requested, fmha_plan *plan)
{
    const fmha_device_info *dev = t->device;
    if (!t->gpu_compiled)
        gate_add(plan, FMHA_GATE_DEVICE, 0, 0, FMHA_DEVICE_NOT_BUILT);
    else if (!dev)
        gate_add(plan, FMHA_GATE_DEVICE, 0, 0, FMHA_DEVICE_NONE_VISIBLE);
    else
        gate_add(plan, FMHA_GATE_DEVICE, 1, dev->sm_count, FMHA_DEVICE_OK);
    /* NVIDIA: mma.sync m16n8k16 and cp.async need sm_80 */
    if (dev && !dev->is_amd)
        gate_add(plan, FMHA_GATE_ARCH, dev->cc_major >= 8, dev->cc_major, dev->cc_minor);
    else if (dev)
        gate_add(plan, FMHA_GATE_ARCH, arch_in_list(dev->arch, fmha_plan_hip_archs(t)), 0, 0);
    /* K/V of q's dtype, or an fp8 e4m3fn cache that the tensor-core tiles widen. */
    const int kv_fp8 = fmha_kv_dtype(p) == FMHA_DTYPE_E4M3;
    gate_add(plan, FMHA_GATE_DTYPE,
             (p->dtype == FMHA_DTYPE_F16 || p->dtype == FMHA_DTYPE_BF16) &&
                 (fmha_kv_dtype(p) == p->dtype || kv_fp8),
             p->dtype, fmha_kv_dtype(p));
    gpu_tiles tiles;
    int row = 0;
    /* b: for a head_dim only the sm90 kernel has, why it does not take this problem
     * (fmha_sm90_why; FMHA_SM90_CHOSEN when it does) */
    const int sm90_only = fmha_plan_sm90_only_head_dim(p->head_dim);
    const fmha_sm90_why only_why = !sm90_only ? FMHA_SM90_CHOSEN
                                   : dev      ? sm90_fit(p, t, requested, 0)
                                              : FMHA_SM90_NOT_HOPPER;
    gate_add(plan, FMHA_GATE_HEAD_DIM,
             gpu_mma_config(p->head_dim, &tiles, &row) || (sm90_only && only_why == FMHA_SM90_CHOSEN),
             p->head_dim, only_why);
    /* Unaligned rows are copied to aligned scratch first (gpu.c), except an fp8 cache's
     * (a = all aligned, b = whether fp8 K/V rows are). */
    const int kv_ok = kv_aligned(p, FMHA_GPU_ALIGN_IN);
    gate_add(plan, FMHA_GATE_ALIGNMENT, !kv_fp8 || kv_ok, gpu_rows_aligned(p), kv_fp8 ? kv_ok : 1);
    /* Window, softcap and sinks: every GPU kernel runs them (informative; a = the
     * features asked for). */
    gate_add(plan, FMHA_GATE_FEATURES, 1, fmha_features(p), 0);
}

/* The sm90 kernel addresses q, k, v and out through TMA tensor maps: every
 * base address and stride a multiple of 16 bytes. */
static int sm90_tma_aligned(const fmha_fwd_params *p)
{
    const int64_t tma = 16 / FMHA_GPU_ELEM_BYTES;
    return qkvo_aligned(p, tma, tma);
}

/*
 * Whether the sm90 kernel (FMHA_KERNEL_GPU_SM90) takes a prefill problem the
 * gate admits, split decision aside: the first reason it does not, else
 * FMHA_SM90_CHOSEN.  It needs its sm_90a code and a cc 9.x device, runs one
 * unsplit pass over keys in k/v (no KV cache, no pages; packed sequences,
 * cu_seqlens_q and/or cu_seqlens_k, are its own), addresses memory through
 * TMA, and puts (batch, query head) on the grid's y and z.  It does not pack query
 * heads: where the old prefill tiles hold all query heads of a kv head
 * (`packed`), they read K/V once for the group, so they stay (unless
 * FMHA_GPU_PREFILL_KERNEL=sm90).
 */
static fmha_sm90_why sm90_fit(const fmha_fwd_params *p, const fmha_target *t, int requested,
                              int packed)
{
    const fmha_device_info *dev = t->device;
    gpu_tiles tiles;
    int ctas = 0;
    if (dev->is_amd || dev->cc_major != 9)
        return FMHA_SM90_NOT_HOPPER;
    if (!arch_in_list("90a", fmha_plan_cuda_archs(t)))
        return FMHA_SM90_NOT_BUILT;
    if (t->prefill == FMHA_PREFILL_MMA)
        return FMHA_SM90_ASKED_MMA;
    if (!gpu_sm90_config(p->head_dim, &tiles, &ctas))
        return FMHA_SM90_HEAD_DIM;
    if (fmha_kv_dtype(p) == FMHA_DTYPE_E4M3)
        return FMHA_SM90_KV_FP8;
    /* in fmha_sm90_why's order: a paged or packed KV cache says KV_CACHE */
    if (p->seqlens_k || p->k_new || p->v_new || p->seqlen_new)
        return FMHA_SM90_KV_CACHE;
    if (p->block_table)
        return FMHA_SM90_PAGED;
    if (requested > 1)
        return FMHA_SM90_FORCED_SPLITS;
    if (p->out_dtype != p->dtype)
        return FMHA_SM90_OUT_DTYPE; /* it writes no partials for the combine to widen */
    if (!sm90_tma_aligned(p))
        return FMHA_SM90_UNALIGNED;
    /* the kernel reads the scale in exp2 units, as the host glue computed it */
    if (!(p->scale_log2 > 0.0f && p->scale_log2 <= FLT_MAX))
        return FMHA_SM90_SCALE;
    if (p->batch > 65535 || p->heads_q > 65535)
        return FMHA_SM90_GRID;
    if (packed && t->prefill != FMHA_PREFILL_SM90)
        return FMHA_SM90_PACKED;
    return FMHA_SM90_CHOSEN;
}

/*
 * The sm90 kernel's schedule (fmha_config.h says why): ping-pong for
 * head_dim >= FMHA_SM90_PINGPONG_MIN_HEAD_DIM when a query row sees at least
 * FMHA_SM90_PINGPONG_MIN_BLOCKS key blocks on average, else interleaved.
 * Causal, with d = seqlen_k - seqlen_q, row i sees min(seqlen_k, i + d + 1)
 * keys (none below 0): on average seqlen_k - (seqlen_q - 1) / 2 when d >= 0,
 * seqlen_k (seqlen_k + 1) / (2 seqlen_q) when d < 0.
 */
static int sm90_schedule(const fmha_fwd_params *p, int block_n)
{
    if (p->head_dim < FMHA_SM90_PINGPONG_MIN_HEAD_DIM)
        return FMHA_SM90_INTERLEAVED;
    const double sq = (double)p->seqlen_q, sk = (double)p->seqlen_k;
    double keys = sk;
    if (p->causal)
        keys = sk >= sq ? sk - (sq - 1.0) / 2.0 : sk * (sk + 1.0) / (2.0 * sq);
    /* the kernel runs windows too (fwd_sm90.h): one bounded on both sides shows a row
     * at most left + right + 1 keys */
    const int64_t right = fmha_window_right(p);
    if (p->window_left >= 0 && right >= 0 && (double)p->window_left + (double)right + 1.0 < keys)
        keys = (double)p->window_left + (double)right + 1.0;
    return keys >= (double)FMHA_SM90_PINGPONG_MIN_BLOCKS * block_n ? FMHA_SM90_PINGPONG
                                                                   : FMHA_SM90_INTERLEAVED;
}

/* Whether the tensor-core tiles of block_m rows pack the query heads of a kv head into one
 * tile's rows (a short query under GQA). */
static int packs_gqa(const fmha_fwd_params *p, int block_m)
{
    const int64_t group = p->heads_q / p->heads_kv;
    return group > 1 && p->seqlen_q * group <= block_m;
}

/* The share of a kernel's tile rows that hold query rows, over the row tiles of a head. */
static double row_fill(int64_t rows, int block_m)
{
    return rows > 0 ? (double)rows / (double)(ceil_div(rows, block_m) * block_m) : 1.0;
}

/* How much faster the sm90 kernel (tiles of sm90_block_m rows) walks a key block of this
 * problem than the tensor-core prefill tiles would: FMHA_SM90_BLOCK_SPEEDUP for full
 * tiles, times the share of its rows the problem fills over the share of theirs (packed
 * as those tiles pack a short query's heads). */
static double sm90_block_speedup(const fmha_fwd_params *p, int sm90_block_m)
{
    gpu_tiles mma;
    int row = 0;
    if (!gpu_mma_config(p->head_dim, &mma, &row))
        return FMHA_SM90_BLOCK_SPEEDUP;
    return FMHA_SM90_BLOCK_SPEEDUP * row_fill(tile_rows(p, 0), sm90_block_m) /
           row_fill(tile_rows(p, packs_gqa(p, mma.block_m)), mma.block_m);
}

static void plan_kernel(const fmha_fwd_params *p, const fmha_target *t, int kernel, int requested,
                        fmha_plan *plan);

/* Whether the tensor-core prefill tiles' own rule splits p: where it does not, handing p to
 * them for a split would run it unsplit on the slower tiles. */
static int old_tiles_split(const fmha_fwd_params *p, const fmha_target *t)
{
    gpu_tiles mma;
    int row = 0;
    if (!gpu_mma_config(p->head_dim, &mma, &row))
        return 0;
    fmha_plan alt;
    memset(&alt, 0, sizeof alt);
    plan_kernel(p, t, FMHA_KERNEL_GPU_MMA, 0, &alt);
    return alt.num_splits > 1;
}

/*
 * Tiles, GQA packing, L2 hint and split count of one GPU kernel for the
 * problem.  The tensor-core tiles pack the query heads of a kv head into one
 * tile when they fit; the sm90 kernel never packs and runs one CTA per SM.
 */
static void plan_kernel(const fmha_fwd_params *p, const fmha_target *t, int kernel,
                        int requested, fmha_plan *plan)
{
    const fmha_device_info *dev = t->device;
    gpu_tiles tiles = {0, 0, 0, 0, 1};
    int config_row = 0, table_ctas = 0; /* CTAs per SM from a tile table (0: measured) */
    const int fp8 = fmha_kv_dtype(p) == FMHA_DTYPE_E4M3;
    if (kernel == FMHA_KERNEL_GPU_SM90) {
        gpu_sm90_config(p->head_dim, &tiles, &table_ctas);
    } else {
        gpu_mma_config(p->head_dim, &tiles, &config_row); /* the row indexes ctas_per_sm */
        if (kernel == FMHA_KERNEL_GPU_DECODE)
            gpu_decode_config(p->head_dim, fp8, &tiles, &table_ctas);
    }
    plan->kernel_id = kernel;
    plan->pack_gqa = kernel != FMHA_KERNEL_GPU_SM90 && packs_gqa(p, tiles.block_m);
    plan->block_m = tiles.block_m;
    plan->block_n = tiles.block_n;
    plan->num_splits = 1;
    plan->split_blocks = 0;
    plan->device_pieces = 0;
    plan->walkers_per_split = 1;
    plan->kv_read_once = 0;
    plan->schedule = kernel == FMHA_KERNEL_GPU_SM90 ? sm90_schedule(p, tiles.block_n) : 0;
    /* wide key blocks: ping-pong without a softcap (fmha_config.h) */
    if (kernel == FMHA_KERNEL_GPU_SM90 && FMHA_SM90_WIDE_BLOCKS(plan->schedule, p->softcap > 0.f))
        plan->block_n = tiles.block_n = FMHA_SM90_WIDE_BLOCK_N(p->head_dim, tiles.block_n);
    memset(&plan->split, 0, sizeof plan->split);
    /* host cache_seqlens or cu_seqlens_k: the glue passes their sum */
    const int lengths_known = p->total_keys > 0;
    /* A window hides key blocks from every tile: the splits share only the ones a tile
     * sees (fwd_mma.h make_work), of its positions (all of them when heads are packed). */
    const int64_t positions = plan->pack_gqa || p->seqlen_q < tiles.block_m ? p->seqlen_q : tiles.block_m;
    const int64_t visible_blocks = fmha_visible_key_blocks(p, positions, tiles.block_n);
    if (kernel == FMHA_KERNEL_GPU_DECODE && !dev->is_amd && dev->l2_bytes > 0) {
        /* K and V bytes the tiles read: the real lengths when known, else the capacity;
         * with a window, at most the keys a tile sees */
        double keys = lengths_known ? (double)p->total_keys : (double)p->batch * (double)p->seqlen_k;
        const double seen = (double)p->batch * (double)visible_blocks * (double)tiles.block_n;
        keys = keys < seen ? keys : seen;
        double kv_bytes = keys * (double)p->heads_kv * (double)p->head_dim * 2.0 /* K, V */ * (fp8 ? 1.0 : 2.0);
        plan->kv_read_once = kv_bytes <= FMHA_GPU_READ_ONCE_L2 * (double)dev->l2_bytes;
    }

    const int64_t row_tiles = ceil_div(tile_rows(p, plan->pack_gqa), tiles.block_m);
    /* the tensor-core tiles run each column part of O as a tile of its own (fmha_config.h) */
    const int64_t parts = kernel == FMHA_KERNEL_GPU_SM90 ? 1 : FMHA_GPU_O_PARTS(p->head_dim);
    const int64_t n_tiles = p->batch * (plan->pack_gqa ? p->heads_kv : p->heads_q) * row_tiles * parts;
    const machine gpu = {dev->sm_count,
                         table_ctas > 0 ? table_ctas
                                        : gpu_ctas_per_sm(dev, kernel, config_row, p->head_dim, &tiles),
                         kernel == FMHA_KERNEL_GPU_MMA ? FMHA_GPU_MMA_SHARE_COST : 0.0,
                         kernel == FMHA_KERNEL_GPU_DECODE ? FMHA_GPU_DECODE_SPLIT_TIE : 1.0};
    /* Ragged chunks only for the heuristic (with a forced num_splits a row's
     * result must not depend on the other batch entries, and the chunk would), and
     * only when the unsplit tiles leave the machine short of work (fmha_config.h). */
    const int64_t unsplit_waves = ceil_div(ceil_div(n_tiles, tiles.walkers), machine_slots(&gpu));
    const int ragged = requested == 0 && lengths_known && p->batch > 1 &&
                       unsplit_waves < FMHA_RAGGED_MAX_WAVES;
    split_work w = {ragged ? n_tiles / p->batch : n_tiles, visible_blocks,
                    ragged ? ceil_div(p->total_keys, tiles.block_n) : 0, p->batch,
                    split_partial_cost(tiles.block_m, tiles.block_n), tiles.walkers, 1.0};
    plan_splits(requested, &w, &gpu, plan);
    plan->split.all_key_blocks = fmha_num_key_blocks(p, tiles.block_n);
    /* Lengths on the device, not read here: chunks that fit any spread of them. */
    if (requested == 0 && !lengths_known && p->batch > 1 && (p->seqlens_k || p->cu_seqlens_k) &&
        unsplit_waves < FMHA_RAGGED_MAX_WAVES)
        plan_unseen_lengths(&w, &gpu, plan);
    /* The sm90 kernel writes no partials: a split here hands the problem to the old
     * tiles, slower per key block of a full tile by FMHA_SM90_BLOCK_SPEEDUP, so split only
     * when the model gains more than that (few tiles over long keys), else stay unsplit.
     * Few query rows leave a tile partly empty, the sm90 kernel's 128 or 192 rows more
     * than the old tiles' 64: its edge shrinks by how much fuller the old tiles are. */
    if (kernel == FMHA_KERNEL_GPU_SM90 && requested == 0 && plan->num_splits > 1 &&
        (split_cost(&w, &gpu, 1, 1) <
             sm90_block_speedup(p, tiles.block_m) * split_cost(&w, &gpu, plan->num_splits, plan->walkers_per_split) ||
         !old_tiles_split(p, t))) {
        plan->num_splits = 1;
        plan->walkers_per_split = 1;
        plan->split_blocks = 0;
        plan->device_pieces = 0;
        plan->split.rule = FMHA_SPLITS_HEURISTIC;
        plan->split.chunk = 0;
        plan->split.waves = ceil_div(n_tiles, machine_slots(&gpu));
        plan->split.busy = (double)n_tiles / (double)machine_slots(&gpu) / (double)plan->split.waves;
    }
}

/*
 * The kernel for a problem the gate admits, in one place: the decode tiles
 * when few packed query rows share a kv head (decode, speculative decoding:
 * one tile reads each K/V byte once for all of them); else the sm90 kernel
 * when sm90_fit() takes the problem and the split rule, on its tiles and one
 * CTA per SM, keeps the keys in one split (it writes no split partials); else
 * the tensor-core prefill tiles.  FMHA_GPU_PREFILL_KERNEL=sm90 puts the sm90
 * kernel first wherever sm90_fit() allows, unsplit.  plan->sm90_why says
 * which test decided.
 */
static void plan_gpu_kernel(const fmha_fwd_params *p, const fmha_target *t, int requested,
                            fmha_plan *plan)
{
    gpu_tiles mma, decode;
    int row = 0;
    /* without tensor-core tiles (fmha_plan_sm90_only_head_dim) the gate admitted the sm90 kernel, unsplit */
    const int has_mma = gpu_mma_config(p->head_dim, &mma, &row);
    const int64_t group = p->heads_q / p->heads_kv;
    const int asked = t->prefill == FMHA_PREFILL_SM90;
    int decode_ctas = 0;
    const int decode_rows = p->seqlen_q * group <= FMHA_GPU_DECODE_MAX_ROWS &&
                            gpu_decode_config(p->head_dim, fmha_kv_dtype(p) == FMHA_DTYPE_E4M3, &decode,
                                              &decode_ctas);
    fmha_sm90_why why = FMHA_SM90_DECODE;
    if (!decode_rows || asked) {
        const int packed = has_mma && packs_gqa(p, mma.block_m);
        why = sm90_fit(p, t, requested, packed);
    }
    if (why == FMHA_SM90_CHOSEN) {
        const int one_pass = (asked || !has_mma) && requested == 0;
        plan_kernel(p, t, FMHA_KERNEL_GPU_SM90, one_pass ? 1 : requested, plan);
        if (one_pass)
            plan->split.rule = FMHA_SPLITS_ONE_PASS;
        if (plan->num_splits == 1) {
            plan->sm90_why = FMHA_SM90_CHOSEN;
            return;
        }
        why = FMHA_SM90_SPLITS;
    }
    plan_kernel(p, t, decode_rows ? FMHA_KERNEL_GPU_DECODE : FMHA_KERNEL_GPU_MMA, requested, plan);
    plan->sm90_why = decode_rows ? FMHA_SM90_DECODE : why;
}

static void plan_gpu(const fmha_fwd_params *p, const fmha_target *t, int requested,
                     fmha_plan *plan)
{
    plan->backend = FMHA_BACKEND_GPU;
    gpu_gate(p, t, requested, plan);
    if (plan->supported)
        plan_gpu_kernel(p, t, requested, plan);
}

fmha_status fmha_plan_make(const fmha_fwd_params *p, const fmha_target *t, int requested_splits,
                           fmha_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->supported = 1;
    plan->num_splits = 1;
    plan->walkers_per_split = 1;
    if (t->backend == FMHA_BACKEND_CPU)
        plan_cpu(p, t, requested_splits, plan);
    else
        plan_gpu(p, t, requested_splits, plan);
    /* Partials + combine: every split plan; on the GPU also an out of another dtype than
     * the inputs', which the producers (their output type is the inputs') leave to the
     * combine, even with one split.  The CPU rows write any out dtype themselves. */
    plan->partials = plan->num_splits > 1 ||
                     (plan->backend == FMHA_BACKEND_GPU && p->out_dtype != p->dtype);
    return plan->supported ? FMHA_OK : FMHA_ERR_UNSUPPORTED;
}

void fmha_plan_apply(const fmha_plan *plan, fmha_fwd_params *p)
{
    p->split_blocks = plan->split_blocks;
    p->device_pieces = plan->device_pieces;
    p->walkers_per_split = plan->walkers_per_split > 0 ? plan->walkers_per_split : 1;
    p->kv_read_once = plan->kv_read_once;
    p->schedule = plan->schedule;
    p->num_splits = plan->num_splits;
    p->partials = plan->partials;
    p->block_m = plan->block_m;
    p->block_n = plan->block_n;
    p->pack_gqa = plan->pack_gqa;
    p->kernel = plan->kernel_id;
}
