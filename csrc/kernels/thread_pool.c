#define _GNU_SOURCE
#include "thread_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "fp_env.h"

/* Hard cap on threads: a bound for the worker table, far above the rows'
   useful parallelism on any machine this runs on. */
#define RMS_MAX_THREADS 256

typedef struct {
    pthread_mutex_t busy;      /* held by the one caller using the pool */
    pthread_mutex_t lock;      /* guards everything below */
    pthread_cond_t work_ready; /* generation changed */
    pthread_cond_t work_done;  /* pending reached 0 */
    /* atomics, read without the lock only to spin on */
    atomic_ulong generation;
    atomic_int pending; /* workers still running the current task */
    int started; /* workers alive */
    int active;  /* workers taking part in the current task */
    rms_task task;
    void *context;
    /* The generation current when each worker was started: a new worker
       must not mistake the task it was started for as already seen. */
    unsigned long start_generation[RMS_MAX_THREADS];
} rms_pool;

static rms_pool pool = {
    .busy = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .work_ready = PTHREAD_COND_INITIALIZER,
    .work_done = PTHREAD_COND_INITIALIZER,
};
static atomic_int num_threads; /* 0 until first asked */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/*
 * How long a thread waits busy before it sleeps: a worker for the next
 * task, the caller for the workers to finish theirs. Waking a sleeping
 * thread costs tens of microseconds, as much as a small problem's whole
 * work (docs/performance.md). An idle worker sleeps after this long.
 */
#define RMS_SPIN_NANOSECONDS 100000

typedef struct {
    struct timespec start;
    unsigned polls;
} rms_spin;

static rms_spin spin_start(void)
{
    rms_spin spin = {.polls = 0};
    clock_gettime(CLOCK_MONOTONIC, &spin.start);
    return spin;
}

/* Pauses once; returns 0, having not paused, once the spin's time is up
   (the clock is read every 64 polls). */
static int spin_on(rms_spin *spin)
{
    if (++spin->polls % 64 == 0) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long elapsed = (long long)(now.tv_sec - spin->start.tv_sec) * 1000000000LL +
                            (now.tv_nsec - spin->start.tv_nsec);
        if (elapsed >= RMS_SPIN_NANOSECONDS) {
            return 0;
        }
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
    return 1;
}

/* Worker w (1-based thread index) waits for each new generation. */
static void *worker_main(void *arg)
{
    int index = (int)(size_t)arg;
    pthread_mutex_lock(&pool.lock);
    unsigned long seen = pool.start_generation[index];
    for (;;) {
        if (pool.generation == seen) {
            pthread_mutex_unlock(&pool.lock);
            rms_spin spin = spin_start();
            while (atomic_load_explicit(&pool.generation, memory_order_relaxed) == seen &&
                   spin_on(&spin)) {
            }
            pthread_mutex_lock(&pool.lock);
        }
        while (pool.generation == seen) {
            pthread_cond_wait(&pool.work_ready, &pool.lock);
        }
        seen = pool.generation;
        if (index >= pool.active) {
            continue;
        }
        rms_task task = pool.task;
        void *context = pool.context;
        int count = pool.active;
        pthread_mutex_unlock(&pool.lock);
        const rms_fp_env saved = rms_fp_env_enter();
        task(context, index, count);
        rms_fp_env_leave(saved);
        pthread_mutex_lock(&pool.lock);
        if (--pool.pending == 0) {
            pthread_cond_signal(&pool.work_done);
        }
    }
    return NULL;
}

/* In a forked child only the forking thread exists: forget the workers
   and any lock state copied from the parent. */
static void forget_pool_in_child(void)
{
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.work_ready, NULL);
    pthread_cond_init(&pool.work_done, NULL);
    pool.started = 0;
    pool.pending = 0;
    pool.active = 0;
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, forget_pool_in_child); }

static int cpus_available(void)
{
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int count = CPU_COUNT(&set);
        if (count > 0) {
            return count;
        }
    }
#endif
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
}

/* The one place where a thread count is capped. */
static int clamp_threads(long long n)
{
    if (n < 1) {
        return 1;
    }
    return n > RMS_MAX_THREADS ? RMS_MAX_THREADS : (int)n;
}

int rms_pool_get_num_threads(void)
{
    int n = atomic_load(&num_threads);
    if (n == 0) {
        /* RMSNORM_NUM_THREADS is read at import (rmsnorm/_environment.py),
           which sets the count where it is given */
        n = clamp_threads(cpus_available());
        atomic_store(&num_threads, n);
    }
    return n;
}

void rms_pool_set_num_threads(long long n) { atomic_store(&num_threads, clamp_threads(n)); }

void rms_pool_run(rms_task task, void *context, int max_threads)
{
    int allowed = rms_pool_get_num_threads();
    int want = max_threads < allowed ? max_threads : allowed;
    if (want <= 1 || pthread_mutex_trylock(&pool.busy) != 0) {
        task(context, 0, 1);
        return;
    }
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&pool.lock);
    while (pool.started < want - 1) {
        int index = pool.started + 1;
        pthread_t worker;
        pool.start_generation[index] = pool.generation;
        if (pthread_create(&worker, NULL, worker_main, (void *)(size_t)index) != 0) {
            break;
        }
        pthread_detach(worker);
        pool.started++;
    }
    int count = pool.started + 1 < want ? pool.started + 1 : want;
    pool.task = task;
    pool.context = context;
    pool.active = count;
    pool.pending = count - 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.work_ready);
    pthread_mutex_unlock(&pool.lock);

    task(context, 0, count);

    rms_spin spin = spin_start();
    while (atomic_load_explicit(&pool.pending, memory_order_relaxed) > 0 && spin_on(&spin)) {
    }
    pthread_mutex_lock(&pool.lock);
    while (pool.pending > 0) {
        pthread_cond_wait(&pool.work_done, &pool.lock);
    }
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}
