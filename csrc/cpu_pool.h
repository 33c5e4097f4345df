/*
 * cpu_pool.h: the CPU backend's worker pool.
 *
 * Owns one process-wide set of pthreads, created lazily on the first job that
 * wants more than one worker, that run "for every item i in [0, n)" jobs.  The
 * caller's thread is worker 0 and takes items too, so a job on one worker runs
 * inline and never touches the pool.  Items are handed out dynamically, so a
 * job must make each item's result independent of which worker runs it (the
 * CPU backend's determinism rests on that, not on the schedule).
 */
#ifndef FMHA_CPU_POOL_H
#define FMHA_CPU_POOL_H

#include <stdint.h>

/* One item of a job; worker is in [0, workers) and is stable for the item. */
typedef void (*fmha_pool_task)(void *ctx, int64_t item, int worker);

/* Threads the pool runs jobs on, the caller included: FMHA_NUM_THREADS or the online CPUs. */
int fmha_pool_size(void);

/*
 * Workers a job of n_items would get when the caller asks for `requested`
 * (0 = the pool's size): min(requested, pool size, n_items), at least 1.
 * Size per-worker scratch with this, then pass it to fmha_pool_run.
 */
int fmha_pool_workers(int requested, int64_t n_items);

/*
 * Run task(ctx, i, worker) for every i in [0, n_items) on `workers` threads
 * (from fmha_pool_workers) and return when all are done.  Jobs from several
 * caller threads are serialised.  Never fails: if the pool has fewer threads
 * than asked (thread creation failed), the items run on those there are.
 */
void fmha_pool_run(int64_t n_items, int workers, fmha_pool_task task, void *ctx);

#endif /* FMHA_CPU_POOL_H */
