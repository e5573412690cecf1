/* SPDX-License-Identifier: MIT */
/*
 * fake_cudart.c - a fake CUDA runtime for machines without a GPU.
 *
 * Built as a shared library and chosen with $CKPT_CUDART, it stands in for
 * libcudart in tests.  It is compiled against the toolkit's own
 * cuda_runtime_api.h, so each function below must have the real signature.
 *
 *  - "Device memory" is host memory from cudaMalloc that the fake tracks,
 *    with the device it was allocated on; device pointers are checked.
 *  - A stream is a thread that runs its queue in order.  The legacy default
 *    stream (0, cudaStreamLegacy, cudaStreamPerThread) is one more stream.
 *  - An event records a generation per cudaEventRecord and completes it
 *    when its stream reaches the record; cudaStreamWaitEvent makes the
 *    stream wait for the generation recorded at the time of the call.
 *  - fake_cuda_kernel() enqueues a "kernel" that sleeps, then fills memory
 *    with a byte: work already queued that a save must wait for.
 *  - fake_cuda_fail() makes the n-th next call of a named function fail.
 *  - fake_cuda_stat() counts what is live (registrations, streams, events).
 *
 * The test hooks (fake_cuda_*) are found by tests with dlsym on the same
 * handle libckpt loaded (dlopen of the same path returns it).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "tests/fakes/fake_cudart.h"

#define API __attribute__((visibility("default")))

/* ---- bookkeeping ---- */

struct region {
	char *base;
	size_t len;
	int device; /* -1: registered host memory */
	struct region *next;
};

enum op_kind { OP_COPY, OP_RECORD, OP_WAIT, OP_KERNEL };

struct fevent;

struct op {
	enum op_kind kind;
	void *dst;
	const void *src;
	size_t len;
	unsigned delay_us;
	int fill;
	struct fevent *ev;
	uint64_t gen;
	cudaError_t fail; /* OP_COPY: fail when run (an asynchronous error) */
	struct op *next;
};

struct fstream {
	pthread_t thread;
	struct op *head, *tail;
	bool stop, busy;
	int device;
	struct fstream *next;
};

struct fevent {
	uint64_t recorded, done;
	unsigned refs;          /* queued RECORD and WAIT ops */
	bool destroyed;         /* freed when the last op is done with it */
	struct fevent *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct region *regions;
static struct fstream *streams;
static struct fevent *events;
static struct fstream *legacy;
static int n_devices = 2;
/* The first asynchronous error: as on a GPU, it is sticky for the whole
 * context, and every later call that queues or waits for work returns it. */
static cudaError_t sticky;
static __thread int cur_device;
static long n_registered, n_streams, n_events, n_allocs, n_copies, n_waits;

/* fake_cuda_fail: the next `countdown`-th call of `fail_call` fails. */
static char fail_call[64];
static long fail_countdown;
static cudaError_t fail_err;
static bool fail_async;

static bool should_fail(const char *call, cudaError_t *err, bool *async)
{
	bool hit = false;

	pthread_mutex_lock(&lock);
	if (fail_countdown > 0 && strcmp(call, fail_call) == 0 && --fail_countdown == 0) {
		hit = true;
		*err = fail_err;
		if (async)
			*async = fail_async;
	}
	pthread_mutex_unlock(&lock);
	return hit;
}

#define FAIL_POINT(call)                                  \
	do {                                              \
		cudaError_t e_;                           \
		if (should_fail(call, &e_, NULL))         \
			return e_;                        \
	} while (0)

/* Caller holds lock.  The region that holds [p, p + len), or NULL. */
static struct region *find_region(const void *p, size_t len, bool device)
{
	const char *c = p;

	for (struct region *r = regions; r; r = r->next)
		if ((r->device >= 0) == device && c >= r->base && c <= r->base + r->len &&
		    len <= (size_t)(r->base + r->len - c))
			return r;
	return NULL;
}

/* ---- streams ---- */

static void run_op(struct op *o)
{
	switch (o->kind) {
	case OP_COPY:
		if (o->fail != cudaSuccess) {
			pthread_mutex_lock(&lock);
			if (sticky == cudaSuccess)
				sticky = o->fail;
			pthread_cond_broadcast(&cv);
			pthread_mutex_unlock(&lock);
		} else {
			memcpy(o->dst, o->src, o->len);
		}
		break;
	case OP_KERNEL:
		usleep(o->delay_us);
		memset(o->dst, o->fill, o->len);
		break;
	case OP_RECORD:
		pthread_mutex_lock(&lock);
		if (o->ev->done < o->gen)
			o->ev->done = o->gen;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&lock);
		break;
	case OP_WAIT:
		pthread_mutex_lock(&lock);
		while (o->ev->done < o->gen)
			pthread_cond_wait(&cv, &lock);
		pthread_mutex_unlock(&lock);
		break;
	}
}

static void *stream_main(void *arg)
{
	struct fstream *s = arg;

	pthread_mutex_lock(&lock);
	for (;;) {
		struct op *o = s->head;

		if (!o) {
			if (s->stop)
				break;
			pthread_cond_wait(&cv, &lock);
			continue;
		}
		s->busy = true;
		pthread_mutex_unlock(&lock);
		run_op(o);
		pthread_mutex_lock(&lock);
		if ((o->kind == OP_RECORD || o->kind == OP_WAIT) && --o->ev->refs == 0 &&
		    o->ev->destroyed)
			free(o->ev);
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		s->busy = false;
		free(o);
		pthread_cond_broadcast(&cv);
	}
	pthread_mutex_unlock(&lock);
	return NULL;
}

static struct fstream *stream_new(int device)
{
	struct fstream *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->device = device;
	if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
		free(s);
		return NULL;
	}
	return s;
}

/* Caller holds lock. */
static struct fstream *resolve(cudaStream_t st)
{
	if (st == NULL || st == cudaStreamLegacy || st == cudaStreamPerThread) {
		if (!legacy)
			legacy = stream_new(0);
		return legacy;
	}
	for (struct fstream *s = streams; s; s = s->next)
		if ((void *)s == (void *)st)
			return s;
	return NULL;
}

static cudaError_t enqueue(cudaStream_t st, struct op *o)
{
	struct fstream *s;

	pthread_mutex_lock(&lock);
	s = resolve(st);
	if (!s) {
		pthread_mutex_unlock(&lock);
		free(o);
		return cudaErrorInvalidResourceHandle;
	}
	if (sticky != cudaSuccess) {
		cudaError_t e = sticky;

		pthread_mutex_unlock(&lock);
		free(o);
		return e;
	}
	if (o->kind == OP_RECORD)
		o->gen = ++o->ev->recorded;
	if (o->kind == OP_RECORD || o->kind == OP_WAIT)
		o->ev->refs++;
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&lock);
	return cudaSuccess;
}

/* ---- the runtime API ---- */

API cudaError_t cudaRuntimeGetVersion(int *v)
{
	if (!v)
		return cudaErrorInvalidValue;
	*v = CUDART_VERSION;
	return cudaSuccess;
}

API const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "cudaSuccess";
	case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
	case cudaErrorNoDevice: return "cudaErrorNoDevice";
	case cudaErrorNotReady: return "cudaErrorNotReady";
	case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
	case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
	case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
	case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
	case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
	default: return "cudaErrorUnknown";
	}
}

API const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
	case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	default: return "unknown error (fake runtime)";
	}
}

API cudaError_t cudaGetDeviceCount(int *n)
{
	FAIL_POINT("GetDeviceCount");
	if (!n)
		return cudaErrorInvalidValue;
	pthread_mutex_lock(&lock);
	*n = n_devices;
	pthread_mutex_unlock(&lock);
	return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}

API cudaError_t cudaGetDevice(int *d)
{
	if (!d)
		return cudaErrorInvalidValue;
	*d = cur_device;
	return cudaSuccess;
}

API cudaError_t cudaSetDevice(int d)
{
	int n;

	FAIL_POINT("SetDevice");
	pthread_mutex_lock(&lock);
	n = n_devices;
	pthread_mutex_unlock(&lock);
	if (d < 0 || d >= n)
		return cudaErrorInvalidDevice;
	cur_device = d;
	return cudaSuccess;
}

API cudaError_t cudaMalloc(void **p, size_t len)
{
	struct region *r;

	FAIL_POINT("Malloc");
	if (!p)
		return cudaErrorInvalidValue;
	r = calloc(1, sizeof(*r));
	if (!r || !(r->base = malloc(len ? len : 1))) {
		free(r);
		return cudaErrorMemoryAllocation;
	}
	/* Not zeroed, like device memory: a test that forgets to write it
	 * should not pass by luck. */
	memset(r->base, 0xA5, len);
	r->len = len;
	r->device = cur_device;
	pthread_mutex_lock(&lock);
	r->next = regions;
	regions = r;
	n_allocs++;
	pthread_mutex_unlock(&lock);
	*p = r->base;
	return cudaSuccess;
}

API cudaError_t cudaFree(void *p)
{
	struct region **pp;

	if (!p)
		return cudaSuccess;
	pthread_mutex_lock(&lock);
	for (pp = &regions; *pp; pp = &(*pp)->next) {
		if ((*pp)->base == p && (*pp)->device >= 0) {
			struct region *r = *pp;

			*pp = r->next;
			n_allocs--;
			pthread_mutex_unlock(&lock);
			free(r->base);
			free(r);
			return cudaSuccess;
		}
	}
	pthread_mutex_unlock(&lock);
	return cudaErrorInvalidValue;
}

API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
	struct region *r;

	FAIL_POINT("PointerGetAttributes");
	if (!a)
		return cudaErrorInvalidValue;
	memset(a, 0, sizeof(*a));
	pthread_mutex_lock(&lock);
	if ((r = find_region(p, 1, true))) {
		a->type = cudaMemoryTypeDevice;
		a->device = r->device;
		a->devicePointer = (void *)p;
	} else if ((r = find_region(p, 1, false))) {
		a->type = cudaMemoryTypeHost;
		a->device = 0;
		a->hostPointer = (void *)p;
		a->devicePointer = (void *)p;
	} else {
		a->type = cudaMemoryTypeUnregistered;
		a->device = -2;
	}
	pthread_mutex_unlock(&lock);
	return cudaSuccess;
}

API cudaError_t cudaHostRegister(void *p, size_t len, unsigned int flags)
{
	struct region *r;
	const char *c = p;

	(void)flags;
	FAIL_POINT("HostRegister");
	if (!p || len == 0)
		return cudaErrorInvalidValue;
	pthread_mutex_lock(&lock);
	for (r = regions; r; r = r->next) {
		if (r->device < 0 && c < r->base + r->len && r->base < c + len) {
			pthread_mutex_unlock(&lock);
			return cudaErrorHostMemoryAlreadyRegistered;
		}
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		pthread_mutex_unlock(&lock);
		return cudaErrorMemoryAllocation;
	}
	r->base = p;
	r->len = len;
	r->device = -1;
	r->next = regions;
	regions = r;
	n_registered++;
	pthread_mutex_unlock(&lock);
	return cudaSuccess;
}

API cudaError_t cudaHostUnregister(void *p)
{
	FAIL_POINT("HostUnregister");
	pthread_mutex_lock(&lock);
	for (struct region **pp = &regions; *pp; pp = &(*pp)->next) {
		if ((*pp)->base == p && (*pp)->device < 0) {
			struct region *r = *pp;

			*pp = r->next;
			n_registered--;
			pthread_mutex_unlock(&lock);
			free(r);
			return cudaSuccess;
		}
	}
	pthread_mutex_unlock(&lock);
	return cudaErrorHostMemoryNotRegistered;
}

API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned int flags)
{
	struct fstream *s;

	(void)flags;
	FAIL_POINT("StreamCreateWithFlags");
	if (!st)
		return cudaErrorInvalidValue;
	s = stream_new(cur_device);
	if (!s)
		return cudaErrorMemoryAllocation;
	pthread_mutex_lock(&lock);
	s->next = streams;
	streams = s;
	n_streams++;
	pthread_mutex_unlock(&lock);
	*st = (cudaStream_t)(void *)s;
	return cudaSuccess;
}

/* The stream's queued work still runs; unlike the real runtime, which
 * returns at once and releases the stream later, this waits for it. */
API cudaError_t cudaStreamDestroy(cudaStream_t st)
{
	struct fstream *s = NULL;

	pthread_mutex_lock(&lock);
	for (struct fstream **pp = &streams; *pp; pp = &(*pp)->next) {
		if ((void *)*pp == (void *)st) {
			s = *pp;
			*pp = s->next;
			break;
		}
	}
	if (!s) {
		pthread_mutex_unlock(&lock);
		return cudaErrorInvalidResourceHandle;
	}
	s->stop = true;
	n_streams--;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&lock);
	pthread_join(s->thread, NULL);
	free(s);
	return cudaSuccess;
}

API cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned int flags)
{
	struct fevent *ev = (struct fevent *)(void *)e;
	struct op *o;

	(void)flags;
	FAIL_POINT("StreamWaitEvent");
	if (!ev)
		return cudaErrorInvalidResourceHandle;
	o = calloc(1, sizeof(*o));
	if (!o)
		return cudaErrorMemoryAllocation;
	o->kind = OP_WAIT;
	o->ev = ev;
	pthread_mutex_lock(&lock);
	o->gen = ev->recorded; /* what was recorded when the wait was issued */
	n_waits++;
	pthread_mutex_unlock(&lock);
	return enqueue(st, o);
}

API cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
	struct fstream *s;
	cudaError_t r;

	FAIL_POINT("StreamSynchronize");
	pthread_mutex_lock(&lock);
	s = resolve(st);
	if (!s) {
		pthread_mutex_unlock(&lock);
		return cudaErrorInvalidResourceHandle;
	}
	while ((s->head || s->busy) && sticky == cudaSuccess)
		pthread_cond_wait(&cv, &lock);
	r = sticky;
	pthread_mutex_unlock(&lock);
	return r;
}

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
	struct fevent *ev;

	(void)flags;
	FAIL_POINT("EventCreateWithFlags");
	if (!e)
		return cudaErrorInvalidValue;
	ev = calloc(1, sizeof(*ev));
	if (!ev)
		return cudaErrorMemoryAllocation;
	pthread_mutex_lock(&lock);
	ev->next = events;
	events = ev;
	n_events++;
	pthread_mutex_unlock(&lock);
	*e = (cudaEvent_t)(void *)ev;
	return cudaSuccess;
}

API cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	struct fevent *ev = (struct fevent *)(void *)e;

	pthread_mutex_lock(&lock);
	for (struct fevent **pp = &events; *pp; pp = &(*pp)->next) {
		if (*pp == ev) {
			*pp = ev->next;
			n_events--;
			/* Like the real runtime: returns at once, and the event
			 * goes when no queued record or wait needs it. */
			ev->destroyed = true;
			if (ev->refs == 0)
				free(ev);
			pthread_mutex_unlock(&lock);
			return cudaSuccess;
		}
	}
	pthread_mutex_unlock(&lock);
	return cudaErrorInvalidResourceHandle;
}

API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st)
{
	struct op *o;

	FAIL_POINT("EventRecord");
	if (!e)
		return cudaErrorInvalidResourceHandle;
	o = calloc(1, sizeof(*o));
	if (!o)
		return cudaErrorMemoryAllocation;
	o->kind = OP_RECORD;
	o->ev = (struct fevent *)(void *)e;
	return enqueue(st, o);
}

static cudaError_t event_state_locked(struct fevent *ev)
{
	if (sticky != cudaSuccess)
		return sticky;
	return ev->done >= ev->recorded ? cudaSuccess : cudaErrorNotReady;
}

API cudaError_t cudaEventQuery(cudaEvent_t e)
{
	struct fevent *ev = (struct fevent *)(void *)e;
	cudaError_t r;

	FAIL_POINT("EventQuery");
	if (!ev)
		return cudaErrorInvalidResourceHandle;
	pthread_mutex_lock(&lock);
	r = event_state_locked(ev);
	pthread_mutex_unlock(&lock);
	return r;
}

API cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	struct fevent *ev = (struct fevent *)(void *)e;
	uint64_t want;
	cudaError_t r;

	FAIL_POINT("EventSynchronize");
	if (!ev)
		return cudaErrorInvalidResourceHandle;
	pthread_mutex_lock(&lock);
	want = ev->recorded;
	while (ev->done < want && sticky == cudaSuccess)
		pthread_cond_wait(&cv, &lock);
	/* What was recorded when it was called: a later record on another
	 * thread does not make it wait longer. */
	r = sticky;
	pthread_mutex_unlock(&lock);
	return r;
}

API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t len, enum cudaMemcpyKind kind,
				cudaStream_t st)
{
	struct op *o;
	cudaError_t e;
	bool async = false;
	bool ok;

	if (should_fail("MemcpyAsync", &e, &async) && !async)
		return e;
	if (!dst || !src)
		return cudaErrorInvalidValue;
	pthread_mutex_lock(&lock);
	switch (kind) {
	case cudaMemcpyDeviceToHost:
		ok = find_region(src, len, true) != NULL;
		break;
	case cudaMemcpyHostToDevice:
		ok = find_region(dst, len, true) != NULL;
		break;
	case cudaMemcpyDeviceToDevice:
		ok = find_region(src, len, true) && find_region(dst, len, true);
		break;
	default:
		ok = true; /* cudaMemcpyDefault, HostToHost */
		break;
	}
	pthread_mutex_unlock(&lock);
	if (!ok)
		return cudaErrorInvalidValue;
	o = calloc(1, sizeof(*o));
	if (!o)
		return cudaErrorMemoryAllocation;
	o->kind = OP_COPY;
	o->dst = dst;
	o->src = src;
	o->len = len;
	o->fail = async ? e : cudaSuccess;
	pthread_mutex_lock(&lock);
	n_copies++;
	pthread_mutex_unlock(&lock);
	return enqueue(st, o);
}

/* ---- test hooks (see fake_cudart.h) ---- */

API void fake_cuda_set_devices(int n)
{
	pthread_mutex_lock(&lock);
	n_devices = n;
	pthread_mutex_unlock(&lock);
}

API void fake_cuda_fail(const char *call, long n, cudaError_t err, bool async)
{
	pthread_mutex_lock(&lock);
	strncpy(fail_call, call ? call : "", sizeof(fail_call) - 1);
	fail_countdown = n;
	fail_err = err;
	fail_async = async;
	pthread_mutex_unlock(&lock);
}

API cudaError_t fake_cuda_kernel(void *dst, size_t len, int fill, unsigned delay_us, cudaStream_t st)
{
	struct op *o;
	bool ok;

	pthread_mutex_lock(&lock);
	ok = find_region(dst, len, true) != NULL;
	pthread_mutex_unlock(&lock);
	if (!ok)
		return cudaErrorInvalidValue;
	o = calloc(1, sizeof(*o));
	if (!o)
		return cudaErrorMemoryAllocation;
	o->kind = OP_KERNEL;
	o->dst = dst;
	o->len = len;
	o->fill = fill;
	o->delay_us = delay_us;
	return enqueue(st, o);
}

API long fake_cuda_stat(const char *what)
{
	long v = -1;

	pthread_mutex_lock(&lock);
	if (!strcmp(what, "registered"))
		v = n_registered;
	else if (!strcmp(what, "streams"))
		v = n_streams;
	else if (!strcmp(what, "events"))
		v = n_events;
	else if (!strcmp(what, "allocs"))
		v = n_allocs;
	else if (!strcmp(what, "copies"))
		v = n_copies;
	else if (!strcmp(what, "waits"))
		v = n_waits;
	pthread_mutex_unlock(&lock);
	return v;
}

API void fake_cuda_idle(void)
{
	pthread_mutex_lock(&lock);
	for (;;) {
		bool busy = legacy && (legacy->head || legacy->busy);

		for (struct fstream *s = streams; s && !busy; s = s->next)
			busy = s->head || s->busy;
		if (!busy)
			break;
		pthread_cond_wait(&cv, &lock);
	}
	pthread_mutex_unlock(&lock);
}
