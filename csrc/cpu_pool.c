/*
 * cpu_pool.c: the CPU backend's worker pool (see cpu_pool.h for the contract).
 *
 * One job at a time: a caller takes the dispatch lock, publishes the job under
 * the state lock, bumps the generation and wakes the helpers; everyone
 * (caller included) then claims items from one atomic counter.  The caller
 * waits until every participating helper has checked out, so the next job can
 * never start while a helper still runs the previous one.
 *
 * Lifetime: helpers are created on first use and never joined; at process exit
 * they are parked in a condition wait, so there is nothing to tear down.  They
 * block every signal so that the interpreter's handlers keep running on its
 * own threads.  After fork() the child has no helpers: an atfork handler
 * forgets the pool there, and the child's first job builds a new one.
 */
#define _POSIX_C_SOURCE 200809L

#include "cpu_pool.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/*
 * FMHA_NUM_THREADS is honoured up to FMHA_POOL_THREADS_PER_CPU threads per online
 * CPU.  More pool threads than CPUs never run at once: every job is split among all
 * participants and waits for the last one, so each thread past the CPU count only
 * adds a time slice to the job's end (1024 threads on 2 CPUs ran several times
 * slower).  A few per CPU are still allowed, so that tests and schedule
 * experiments can run more workers than a small machine has CPUs.
 * fmha_native/__init__.py applies the same rules and warns about a value that is
 * not a whole number >= 1 or is over the cap; keep the two in step.
 */
#define FMHA_POOL_THREADS_PER_CPU 4
/* Upper bound on pool threads, whatever FMHA_NUM_THREADS or the machine says. */
#define FMHA_POOL_MAX_THREADS 1024
/* Decimal base for parsing FMHA_NUM_THREADS. */
#define FMHA_POOL_ENV_BASE 10

typedef struct fmha_pool {
    pthread_mutex_t state_lock;   /* guards every field below except next_item */
    pthread_cond_t wake;          /* helpers wait here for a new generation */
    pthread_cond_t finished;      /* the caller waits here for busy == 0 */
    unsigned long generation;     /* bumped once per published job */
    unsigned long born;           /* generation when the helpers were created */
    int helpers;                  /* threads created (workers 1..helpers) */
    int started;                  /* helpers have been created in this process */
    /* the job of the current generation */
    fmha_pool_task task;
    void *ctx;
    int64_t n_items;
    int workers;                  /* participants, caller included */
    int busy;                     /* participating helpers not yet checked out */
    atomic_llong next_item;
} fmha_pool;

static fmha_pool g_pool = {
    .state_lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .finished = PTHREAD_COND_INITIALIZER,
};
/* Serialises jobs; held by a caller for the whole job. */
static pthread_mutex_t g_dispatch = PTHREAD_MUTEX_INITIALIZER;
/* Guards the one-time size computation and the atfork registration. */
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_size;                /* 0 until computed */
static int g_atfork_registered;

static int pool_size_from_env(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1)
        online = 1;
    if (online > FMHA_POOL_MAX_THREADS)
        online = FMHA_POOL_MAX_THREADS;
    long cap = online * FMHA_POOL_THREADS_PER_CPU;
    if (cap > FMHA_POOL_MAX_THREADS)
        cap = FMHA_POOL_MAX_THREADS;
    const char *env = getenv("FMHA_NUM_THREADS");
    if (!env || !*env)
        return (int)online;
    /* Decimal digits only (no sign, no blanks); anything else, or 0, means the default. */
    long n = 0;
    for (const char *p = env; *p; p++) {
        if (*p < '0' || *p > '9')
            return (int)online;
        if (n <= cap)  /* saturate: past the cap the exact value does not matter */
            n = n * FMHA_POOL_ENV_BASE + (*p - '0');
    }
    if (n == 0)
        return (int)online;
    return n > cap ? (int)cap : (int)n;
}

int fmha_pool_size(void)
{
    pthread_mutex_lock(&g_init_lock);
    if (g_size == 0)
        g_size = pool_size_from_env();
    int size = g_size;
    pthread_mutex_unlock(&g_init_lock);
    return size;
}

int fmha_pool_workers(int requested, int64_t n_items)
{
    int workers = fmha_pool_size();
    if (requested > 0 && requested < workers)
        workers = requested;
    if (n_items < workers)
        workers = n_items > 0 ? (int)n_items : 1;
    return workers;
}

static void run_items(fmha_pool_task task, void *ctx, int64_t n_items, int worker)
{
    for (;;) {
        int64_t item = atomic_fetch_add_explicit(&g_pool.next_item, 1, memory_order_relaxed);
        if (item >= n_items)
            return;
        task(ctx, item, worker);
    }
}

static void *helper_main(void *arg)
{
    int worker = (int)(intptr_t)arg;
    pthread_mutex_lock(&g_pool.state_lock);
    /* Not the current generation: the first job may have been published before this thread ran. */
    unsigned long seen = g_pool.born;
    for (;;) {
        while (g_pool.generation == seen)
            pthread_cond_wait(&g_pool.wake, &g_pool.state_lock);
        seen = g_pool.generation;
        if (worker >= g_pool.workers)
            continue;
        fmha_pool_task task = g_pool.task;
        void *ctx = g_pool.ctx;
        int64_t n_items = g_pool.n_items;
        pthread_mutex_unlock(&g_pool.state_lock);
        run_items(task, ctx, n_items, worker);
        pthread_mutex_lock(&g_pool.state_lock);
        if (--g_pool.busy == 0)
            pthread_cond_signal(&g_pool.finished);
    }
    return NULL;
}

/* In the child of fork(): no helper survived, and its locks may be held by threads now gone. */
static void pool_atfork_child(void)
{
    pthread_mutex_init(&g_pool.state_lock, NULL);
    pthread_cond_init(&g_pool.wake, NULL);
    pthread_cond_init(&g_pool.finished, NULL);
    pthread_mutex_init(&g_dispatch, NULL);
    pthread_mutex_init(&g_init_lock, NULL);
    g_pool.started = 0;
    g_pool.helpers = 0;
    g_pool.busy = 0;
    g_pool.workers = 0;
}

/* A fork taken while a job runs waits for it, so the child never sees half a job. */
static void pool_atfork_prepare(void) { pthread_mutex_lock(&g_dispatch); }
static void pool_atfork_parent(void) { pthread_mutex_unlock(&g_dispatch); }

/* Called with g_dispatch held. */
static void pool_start(void)
{
    if (g_pool.started)
        return;
    g_pool.started = 1;
    pthread_mutex_lock(&g_pool.state_lock);
    g_pool.born = g_pool.generation;
    pthread_mutex_unlock(&g_pool.state_lock);
    int size = fmha_pool_size();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int w = 1; w < size; w++) {
        pthread_t tid;
        if (pthread_create(&tid, &attr, helper_main, (void *)(intptr_t)w) != 0)
            break;
        g_pool.helpers = w;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void register_atfork_once(void)
{
    pthread_mutex_lock(&g_init_lock);
    if (!g_atfork_registered) {
        if (pthread_atfork(pool_atfork_prepare, pool_atfork_parent, pool_atfork_child) == 0)
            g_atfork_registered = 1;
    }
    pthread_mutex_unlock(&g_init_lock);
}

void fmha_pool_run(int64_t n_items, int workers, fmha_pool_task task, void *ctx)
{
    if (n_items <= 0)
        return;
    if (workers <= 1) {
        for (int64_t i = 0; i < n_items; i++)
            task(ctx, i, 0);
        return;
    }
    register_atfork_once();
    pthread_mutex_lock(&g_dispatch);
    pool_start();
    int helpers = workers - 1 < g_pool.helpers ? workers - 1 : g_pool.helpers;

    pthread_mutex_lock(&g_pool.state_lock);
    g_pool.task = task;
    g_pool.ctx = ctx;
    g_pool.n_items = n_items;
    g_pool.workers = helpers + 1;
    g_pool.busy = helpers;
    atomic_store_explicit(&g_pool.next_item, 0, memory_order_relaxed);
    g_pool.generation++;
    pthread_cond_broadcast(&g_pool.wake);
    pthread_mutex_unlock(&g_pool.state_lock);

    run_items(task, ctx, n_items, 0);

    pthread_mutex_lock(&g_pool.state_lock);
    while (g_pool.busy > 0)
        pthread_cond_wait(&g_pool.finished, &g_pool.state_lock);
    g_pool.workers = 0;
    pthread_mutex_unlock(&g_pool.state_lock);
    pthread_mutex_unlock(&g_dispatch);
}
