/* SPDX-License-Identifier: MIT */
/*
 * fake_nccl.c - a fake NCCL for machines without GPUs, whose ranks are
 * threads of one test process.
 *
 * Built as a shared library and chosen with $CKPT_NCCL_LIB, it stands in
 * for libnccl in tests.  It is compiled against NCCL's own nccl.h, so each
 * function below must have the real signature.  It works with the fake
 * CUDA runtime ($CKPT_CUDART, tests/fakes/fake_cudart.c), whose "device
 * memory" is host memory:
 *
 *  - fake_nccl_comm_create(n) makes one world of n communicators; each
 *    rank's thread uses its own.
 *  - ncclMemAlloc/ncclMemFree are the fake runtime's cudaMalloc/cudaFree;
 *    every buffer given to a send, receive or all-gather must be device
 *    memory of the fake (cudaPointerGetAttributes), as NCCL requires.
 *  - Work "on a stream" runs when it is issued (a send or receive at the
 *    outermost ncclGroupEnd), after the fake waited for the stream
 *    (cudaStreamSynchronize): so it sees the copies queued before it, and
 *    copies queued after it see its results, as stream order promises.
 *  - Point-to-point: sends are posted to a FIFO per (sender, receiver);
 *    the k-th receive from a peer takes the k-th send of that peer to this
 *    rank, and both must have the same size (else the fake aborts: a bug of
 *    the caller that real NCCL would turn into a hang or garbage).  The
 *    group returns when its receives are filled and its sends taken.
 *  - All-gather: a barrier, the copies, a barrier.
 *
 * Every wait is bounded: after FAKE_NCCL_TIMEOUT_S the fake prints what it
 * waited for and aborts, so a test with mismatched calls fails instead of
 * hanging.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "tests/fakes/fake_nccl.h"

#define API __attribute__((visibility("default")))
#define FAKE_NCCL_TIMEOUT_S 30
#define MAX_GROUP_OPS 65536

struct msg {
	const void *buf;
	size_t len;
	bool taken;
	struct msg *next;
};

struct world {
	int n;
	struct msg **q;          /* n * n FIFOs: q[src * n + dst] */
	uint64_t bar_gen;
	int bar_count;
	const void **ag_src;     /* per rank: its all-gather buffer */
	size_t *ag_len;
};

struct ncclComm {
	struct world *w;
	int rank;
};

/* One lock for every world: tests are small. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static long n_sends, n_recvs, n_p2p_bytes, n_allgathers, n_groups, n_allocs;

static char fail_call[64];
static long fail_countdown;
static ncclResult_t fail_result;

/* A rank's queued point-to-point operations (between GroupStart and End). */
struct op {
	bool send;
	void *buf;
	size_t len;
	int peer;
	struct ncclComm *comm;
	cudaStream_t st;
};

static __thread int group_depth;
static __thread struct op *ops;
static __thread size_t n_ops, cap_ops;

static __attribute__((noreturn, format(printf, 1, 2))) void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "fake NCCL: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

static bool should_fail(const char *call, ncclResult_t *res)
{
	bool hit = false;

	pthread_mutex_lock(&lock);
	if (fail_countdown > 0 && strcmp(call, fail_call) == 0 && --fail_countdown == 0) {
		hit = true;
		*res = fail_result;
	}
	pthread_mutex_unlock(&lock);
	return hit;
}

#define FAIL_POINT(call)                                  \
	do {                                              \
		ncclResult_t r_;                          \
		if (should_fail(call, &r_))               \
			return r_;                        \
	} while (0)

/* Caller holds lock.  Waits on cv, dying after the timeout. */
static void wait_bounded(const struct timespec *deadline, const char *what, int rank)
{
	int e = pthread_cond_timedwait(&cv, &lock, deadline);

	if (e == ETIMEDOUT)
		die("rank %d waited %d s for %s: the ranks' calls do not match", rank,
		    FAKE_NCCL_TIMEOUT_S, what);
}

static struct timespec deadline_in(int s)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += s;
	return t;
}

/* ---- the fake CUDA runtime, for memory and streams ---- */

static struct {
	pthread_once_t once;
	cudaError_t (*malloc_)(void **, size_t);
	cudaError_t (*free_)(void *);
	cudaError_t (*attrs)(struct cudaPointerAttributes *, const void *);
	cudaError_t (*sync)(cudaStream_t);
} rt = { .once = PTHREAD_ONCE_INIT };

static void rt_load(void)
{
	const char *path = getenv("CKPT_CUDART");
	void *dl = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;

	if (!dl)
		die("needs the fake CUDA runtime: $CKPT_CUDART (%s): %s", path ? path : "unset",
		    path ? dlerror() : "");
	*(void **)&rt.malloc_ = dlsym(dl, "cudaMalloc");
	*(void **)&rt.free_ = dlsym(dl, "cudaFree");
	*(void **)&rt.attrs = dlsym(dl, "cudaPointerGetAttributes");
	*(void **)&rt.sync = dlsym(dl, "cudaStreamSynchronize");
	if (!rt.malloc_ || !rt.free_ || !rt.attrs || !rt.sync)
		die("'%s' lacks a call the fake NCCL uses", path);
}

static void rt_get(void)
{
	pthread_once(&rt.once, rt_load);
}

/* Whether [p, p + len) is device memory of the fake runtime (checked at
 * both ends). */
static bool device_mem(const void *p, size_t len)
{
	struct cudaPointerAttributes a;

	if (!p)
		return false;
	if (rt.attrs(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice)
		return false;
	return len == 0 ||
	       (rt.attrs(&a, (const char *)p + len - 1) == cudaSuccess &&
		a.type == cudaMemoryTypeDevice);
}

static size_t type_size(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8:
	case ncclUint8:
		return 1;
	case ncclInt32:
	case ncclUint32:
	case ncclFloat32:
		return 4;
	case ncclInt64:
	case ncclUint64:
	case ncclFloat64:
		return 8;
	default:
		return 0;
	}
}

/* ---- communicators ---- */

API int fake_nccl_comm_create(int n, struct ncclComm **comms)
{
	struct world *w;

	if (n < 1 || !comms)
		return -1;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -1;
	w->n = n;
	w->q = calloc((size_t)n * (size_t)n, sizeof(*w->q));
	w->ag_src = calloc((size_t)n, sizeof(*w->ag_src));
	w->ag_len = calloc((size_t)n, sizeof(*w->ag_len));
	if (!w->q || !w->ag_src || !w->ag_len)
		goto fail;
	for (int r = 0; r < n; r++) {
		comms[r] = calloc(1, sizeof(**comms));
		if (!comms[r]) {
			while (r-- > 0)
				free(comms[r]);
			goto fail;
		}
		comms[r]->w = w;
		comms[r]->rank = r;
	}
	return 0;
fail:
	free(w->q);
	free(w->ag_src);
	free(w->ag_len);
	free(w);
	return -1;
}

API void fake_nccl_comm_destroy(struct ncclComm **comms, int n)
{
	struct world *w;

	if (n < 1 || !comms[0])
		return;
	w = comms[0]->w;
	for (int i = 0; i < n * n; i++)
		if (w->q[i])
			die("destroying a world with a send not received (rank %d to %d)", i / n,
			    i % n);
	for (int r = 0; r < n; r++)
		free(comms[r]);
	free(w->q);
	free(w->ag_src);
	free(w->ag_len);
	free(w);
}

API ncclResult_t ncclGetVersion(int *version)
{
	if (!version)
		return ncclInvalidArgument;
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t result)
{
	switch (result) {
	case ncclSuccess:
		return "no error";
	case ncclUnhandledCudaError:
		return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError:
		return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError:
		return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument:
		return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage:
		return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError:
		return "remote process exited or there was a network error";
	case ncclInProgress:
		return "NCCL operation in progress";
	default:
		return "unknown result code";
	}
}

API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	FAIL_POINT("CommCount");
	if (!comm || !count)
		return ncclInvalidArgument;
	*count = comm->w->n;
	return ncclSuccess;
}

API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	FAIL_POINT("CommUserRank");
	if (!comm || !rank)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}

API ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
	FAIL_POINT("MemAlloc");
	rt_get();
	if (!ptr)
		return ncclInvalidArgument;
	if (rt.malloc_(ptr, size) != cudaSuccess)
		return ncclUnhandledCudaError;
	pthread_mutex_lock(&lock);
	n_allocs++;
	pthread_mutex_unlock(&lock);
	return ncclSuccess;
}

API ncclResult_t ncclMemFree(void *ptr)
{
	rt_get();
	if (rt.free_(ptr) != cudaSuccess)
		return ncclInvalidArgument;
	pthread_mutex_lock(&lock);
	n_allocs--;
	pthread_mutex_unlock(&lock);
	return ncclSuccess;
}

/* ---- point-to-point ---- */

/* Runs a group's operations: the streams first (stream order), then posts
 * every send, fills every receive in order, and waits until the sends
 * were taken. */
static ncclResult_t run_ops(struct op *o, size_t n)
{
	struct msg **mine;
	struct timespec dl = deadline_in(FAKE_NCCL_TIMEOUT_S);

	if (n == 0)
		return ncclSuccess;
	mine = calloc(n, sizeof(*mine));
	if (!mine)
		return ncclSystemError;
	for (size_t i = 0; i < n; i++)
		if (i == 0 || o[i].st != o[i - 1].st)
			if (rt.sync(o[i].st) != cudaSuccess)
				die("cudaStreamSynchronize before a group failed");
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < n; i++) {
		struct world *w = o[i].comm->w;
		struct msg **pp;

		if (!o[i].send)
			continue;
		mine[i] = calloc(1, sizeof(**mine));
		if (!mine[i])
			die("out of memory");
		mine[i]->buf = o[i].buf;
		mine[i]->len = o[i].len;
		for (pp = &w->q[o[i].comm->rank * w->n + o[i].peer]; *pp; pp = &(*pp)->next)
			;
		*pp = mine[i];
		n_sends++;
	}
	pthread_cond_broadcast(&cv);
	for (size_t i = 0; i < n; i++) {
		struct world *w = o[i].comm->w;
		int me = o[i].comm->rank;
		struct msg *m;

		if (o[i].send)
			continue;
		for (;;) {
			for (m = w->q[o[i].peer * w->n + me]; m && m->taken; m = m->next)
				;
			if (m)
				break;
			char what[96];
			snprintf(what, sizeof(what), "a send of %zu bytes from rank %d", o[i].len,
				 o[i].peer);
			wait_bounded(&dl, what, me);
		}
		if (m->len != o[i].len)
			die("rank %d receives %zu bytes from rank %d, which sends %zu", me, o[i].len,
			    o[i].peer, m->len);
		memcpy(o[i].buf, m->buf, m->len);
		m->taken = true;
		n_recvs++;
		n_p2p_bytes += (long)m->len;
		pthread_cond_broadcast(&cv);
	}
	for (size_t i = 0; i < n; i++) {
		struct world *w = o[i].comm->w;
		struct msg **pp;

		if (!o[i].send)
			continue;
		while (!mine[i]->taken) {
			char what[96];
			snprintf(what, sizeof(what), "rank %d to receive %zu bytes", o[i].peer,
				 o[i].len);
			wait_bounded(&dl, what, o[i].comm->rank);
		}
		for (pp = &w->q[o[i].comm->rank * w->n + o[i].peer]; *pp != mine[i];
		     pp = &(*pp)->next)
			;
		*pp = mine[i]->next;
		free(mine[i]);
	}
	pthread_mutex_unlock(&lock);
	free(mine);
	return ncclSuccess;
}

static ncclResult_t queue_op(bool send, const void *buf, size_t count, ncclDataType_t t,
			     int peer, ncclComm_t comm, cudaStream_t st)
{
	size_t es = type_size(t);
	struct op o;

	rt_get();
	if (!comm || !es || peer < 0 || peer >= comm->w->n || peer == comm->rank)
		return ncclInvalidArgument;
	if (count && !device_mem(buf, count * es))
		return ncclInvalidArgument;
	o = (struct op){ .send = send, .buf = (void *)buf, .len = count * es, .peer = peer,
			 .comm = comm, .st = st };
	if (group_depth == 0)
		return run_ops(&o, 1);
	if (n_ops == cap_ops) {
		size_t cap = cap_ops ? 2 * cap_ops : 64;
		struct op *p = cap <= MAX_GROUP_OPS ? realloc(ops, cap * sizeof(*ops)) : NULL;
		if (!p)
			return ncclSystemError;
		ops = p;
		cap_ops = cap;
	}
	ops[n_ops++] = o;
	return ncclSuccess;
}

API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
			  ncclComm_t comm, cudaStream_t stream)
{
	FAIL_POINT("Send");
	return queue_op(true, sendbuff, count, datatype, peer, comm, stream);
}

API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
			  ncclComm_t comm, cudaStream_t stream)
{
	FAIL_POINT("Recv");
	return queue_op(false, recvbuff, count, datatype, peer, comm, stream);
}

/* nccl.h declares these two with "()", no prototype: give them one. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

API ncclResult_t ncclGroupStart(void)
{
	FAIL_POINT("GroupStart");
	group_depth++;
	return ncclSuccess;
}

API ncclResult_t ncclGroupEnd(void)
{
	ncclResult_t r;

	FAIL_POINT("GroupEnd");
	if (group_depth == 0)
		return ncclInvalidUsage;
	if (--group_depth > 0)
		return ncclSuccess;
	r = run_ops(ops, n_ops);
	/* Freed each time: a thread-local array would leak at thread exit. */
	free(ops);
	ops = NULL;
	n_ops = cap_ops = 0;
	pthread_mutex_lock(&lock);
	n_groups++;
	pthread_mutex_unlock(&lock);
	return r;
}

/* ---- all-gather ---- */

/* Caller holds lock: every rank of w gets here before any goes on. */
static void barrier(struct world *w, int rank, const char *what)
{
	struct timespec dl = deadline_in(FAKE_NCCL_TIMEOUT_S);
	uint64_t gen = w->bar_gen;

	if (++w->bar_count == w->n) {
		w->bar_count = 0;
		w->bar_gen++;
		pthread_cond_broadcast(&cv);
		return;
	}
	while (w->bar_gen == gen)
		wait_bounded(&dl, what, rank);
}

API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
			       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
	size_t es = type_size(datatype), len;
	struct world *w;

	FAIL_POINT("AllGather");
	rt_get();
	if (!comm || !es)
		return ncclInvalidArgument;
	if (group_depth > 0)
		die("ncclAllGather inside a group is not faked");
	w = comm->w;
	len = sendcount * es;
	if (len && (!device_mem(sendbuff, len) || !device_mem(recvbuff, len * (size_t)w->n)))
		return ncclInvalidArgument;
	if (rt.sync(stream) != cudaSuccess)
		die("cudaStreamSynchronize before an all-gather failed");
	pthread_mutex_lock(&lock);
	w->ag_src[comm->rank] = sendbuff;
	w->ag_len[comm->rank] = len;
	barrier(w, comm->rank, "the other ranks to call ncclAllGather");
	for (int r = 0; r < w->n; r++)
		if (w->ag_len[r] != len)
			die("ncclAllGather of %zu bytes on rank %d, %zu on rank %d", len, comm->rank,
			    w->ag_len[r], r);
	pthread_mutex_unlock(&lock);
	/* Every source stays put until the second barrier. */
	for (int r = 0; r < w->n; r++)
		memmove((char *)recvbuff + (size_t)r * len, w->ag_src[r], len);
	pthread_mutex_lock(&lock);
	barrier(w, comm->rank, "the other ranks to finish ncclAllGather");
	n_allgathers++;
	pthread_mutex_unlock(&lock);
	return ncclSuccess;
}

/* ---- test hooks (see fake_nccl.h) ---- */

API void fake_nccl_fail(const char *call, long n, int result)
{
	pthread_mutex_lock(&lock);
	snprintf(fail_call, sizeof(fail_call), "%s", call ? call : "");
	fail_countdown = n;
	fail_result = (ncclResult_t)result;
	pthread_mutex_unlock(&lock);
}

API long fake_nccl_stat(const char *what)
{
	long v = -1;

	pthread_mutex_lock(&lock);
	if (!strcmp(what, "sends"))
		v = n_sends;
	else if (!strcmp(what, "recvs"))
		v = n_recvs;
	else if (!strcmp(what, "p2p_bytes"))
		v = n_p2p_bytes;
	else if (!strcmp(what, "allgathers"))
		v = n_allgathers;
	else if (!strcmp(what, "groups"))
		v = n_groups;
	else if (!strcmp(what, "allocs"))
		v = n_allocs;
	pthread_mutex_unlock(&lock);
	return v;
}

API void fake_nccl_reset_stats(void)
{
	pthread_mutex_lock(&lock);
	n_sends = n_recvs = n_p2p_bytes = n_allgathers = n_groups = 0;
	pthread_mutex_unlock(&lock);
}
