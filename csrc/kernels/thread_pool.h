/*
 * A small pthread pool that runs one task on several threads at once.
 *
 * Not OpenMP: torch wheels bring their own libgomp, and GNU libgomp hangs in
 * a child forked after a parallel region. This pool is forgotten in a forked
 * child and re-created on first use there.
 */
#ifndef RMSNORM_KERNELS_THREAD_POOL_H
#define RMSNORM_KERNELS_THREAD_POOL_H

/* The task: called once with each thread_index in [0, thread_count). */
typedef void (*rms_task)(void *context, int thread_index, int thread_count);

/*
 * Runs `task` on up to `max_threads` threads (the caller is thread 0) and
 * returns when every call has returned. If another caller is using the
 * pool, or threads cannot be started, the task runs on fewer threads:
 * callers must give the same result for any thread count.
 */
void rms_pool_run(rms_task task, void *context, int max_threads);

/* The number of threads calls may use: set_num_threads's (which
   RMSNORM_NUM_THREADS sets at import), else the CPUs this process may run
   on; any count is
   capped at RMS_MAX_THREADS (thread_pool.c) on the way in. */
int rms_pool_get_num_threads(void);
void rms_pool_set_num_threads(long long num_threads);

#endif
