/* SPDX-License-Identifier: MIT */
/* cuxfer.c - see cuxfer.h. */
#include "cuda/cuxfer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cudart.h"

/* Events of one device, timing disabled; blocking-sync so that a copy
 * thread waiting for its extent sleeps instead of spinning. */
#define MARK_FLAGS  (cudaEventDisableTiming | cudaEventBlockingSync)
#define START_FLAGS cudaEventDisableTiming

struct cudev {
	cudaStream_t stream;
	bool has_stream;
	cudaEvent_t *pool;
	unsigned n_pool, cap_pool;
};

struct cuxfer {
	pthread_mutex_t mu;
	enum cuxfer_pin pin;
	char *arena;
	uint64_t len;
	/* [mu] */
	const struct cudart *rt;
	int rt_err;            /* the first failure to get a usable runtime */
	char rt_msg[512];
	int n_devices;
	unsigned n_pinned;     /* pieces of CUXFER_PIN_PIECE pinned */
	char pin_msg[512];     /* AUTO: why pinning failed, until reported */
	struct cudev dev[CUXFER_MAX_DEVICES];
};

/* Caller holds mu.  The runtime with at least one device, or -errno. */
static int runtime_locked(struct cuxfer *x, char *err, size_t errlen)
{
	char why[512];
	cudaError_t e;

	if (x->rt)
		return 0;
	if (x->rt_err) {
		snprintf(err, errlen, "%s", x->rt_msg);
		return x->rt_err;
	}
	const struct cudart *rt = cudart_get(why, sizeof(why));
	if (!rt) {
		x->rt_err = -ENODEV;
		snprintf(x->rt_msg, sizeof(x->rt_msg), "%s", why);
	} else if ((e = rt->GetDeviceCount(&x->n_devices)) != cudaSuccess || x->n_devices < 1) {
		x->rt_err = e != cudaSuccess ? cudart_errno(e) : -ENODEV;
		if (e != cudaSuccess)
			cudart_errmsg(rt, e, x->rt_msg, sizeof(x->rt_msg), "cudaGetDeviceCount (runtime '%s')",
				      rt->path);
		else
			snprintf(x->rt_msg, sizeof(x->rt_msg), "no CUDA device (runtime '%s')", rt->path);
	} else {
		x->rt = rt;
		if (x->n_devices > CUXFER_MAX_DEVICES)
			x->n_devices = CUXFER_MAX_DEVICES;
		return 0;
	}
	snprintf(err, errlen, "%s", x->rt_msg);
	return x->rt_err;
}

static void unpin_locked(struct cuxfer *x)
{
	for (unsigned i = x->n_pinned; i-- > 0;)
		(void)x->rt->HostUnregister(x->arena + (uint64_t)i * CUXFER_PIN_PIECE);
	x->n_pinned = 0;
}

/* Caller holds mu and has the runtime.  Registration is slow (it pins every
 * page): done once per client, never per save. */
static int pin_locked(struct cuxfer *x, char *err, size_t errlen)
{
	uint64_t off;

	if (x->pin == CUXFER_PIN_OFF || x->n_pinned > 0 || x->len == 0)
		return 0;
	for (off = 0; off < x->len; off += CUXFER_PIN_PIECE) {
		uint64_t n = x->len - off < CUXFER_PIN_PIECE ? x->len - off : CUXFER_PIN_PIECE;
		cudaError_t e = x->rt->HostRegister(x->arena + off, n, cudaHostRegisterPortable);

		if (e != cudaSuccess) {
			cudart_errmsg(x->rt, e, err, errlen, "pinning the arena: cudaHostRegister of %llu "
				      "bytes at offset %llu", (unsigned long long)n, (unsigned long long)off);
			unpin_locked(x);
			return cudart_errno(e);
		}
		x->n_pinned++;
	}
	return 0;
}

int cuxfer_open(enum cuxfer_pin pin, void *arena, uint64_t len, struct cuxfer **ret, char *err,
		size_t errlen)
{
	struct cuxfer *x;
	int r;

	if (pin != CUXFER_PIN_AUTO && pin != CUXFER_PIN_ON && pin != CUXFER_PIN_OFF) {
		snprintf(err, errlen, "unknown pinning mode %d", (int)pin);
		return -EINVAL;
	}
	x = calloc(1, sizeof(*x));
	if (!x) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = -pthread_mutex_init(&x->mu, NULL);
	if (r < 0) {
		free(x);
		snprintf(err, errlen, "pthread_mutex_init: %s", strerror(-r));
		return r;
	}
	x->pin = pin;
	x->arena = arena;
	x->len = len;
	if (pin == CUXFER_PIN_ON) {
		pthread_mutex_lock(&x->mu);
		r = runtime_locked(x, err, errlen);
		if (r == 0)
			r = pin_locked(x, err, errlen);
		pthread_mutex_unlock(&x->mu);
		if (r < 0) {
			cuxfer_close(x);
			return r;
		}
	}
	*ret = x;
	return 0;
}

void cuxfer_close(struct cuxfer *x)
{
	if (!x)
		return;
	if (x->rt) {
		/* None of these needs a current device: the caller's thread
		 * keeps its own. */
		for (int d = 0; d < CUXFER_MAX_DEVICES; d++) {
			struct cudev *v = &x->dev[d];

			for (unsigned i = 0; i < v->n_pool; i++)
				(void)x->rt->EventDestroy(v->pool[i]);
			if (v->has_stream)
				(void)x->rt->StreamDestroy(v->stream);
		}
		/* Before the caller unmaps the arena. */
		unpin_locked(x);
	}
	for (int d = 0; d < CUXFER_MAX_DEVICES; d++)
		free(x->dev[d].pool);
	pthread_mutex_destroy(&x->mu);
	free(x);
}

bool cuxfer_pinned(struct cuxfer *x)
{
	bool r;

	if (!x)
		return false;
	pthread_mutex_lock(&x->mu);
	r = x->n_pinned > 0;
	pthread_mutex_unlock(&x->mu);
	return r;
}

bool cuxfer_pin_failure(struct cuxfer *x, char *buf, size_t len)
{
	bool r;

	pthread_mutex_lock(&x->mu);
	r = x->pin_msg[0] && x->pin_msg[0] != '\1';
	if (r) {
		snprintf(buf, len, "%s", x->pin_msg);
		x->pin_msg[0] = '\1'; /* reported; still not retried */
	}
	pthread_mutex_unlock(&x->mu);
	return r;
}

/* Makes dev the calling thread's current device.  On a caller's thread,
 * note its device first (*prev) and put it back with device_restore(): the
 * trainer must find it unchanged.  Setting a device that is already
 * current is skipped, so no context is made on a device the thread does
 * not use. */
static int with_device(struct cuxfer *x, int dev, int *prev, char *err, size_t errlen)
{
	int cur = -1;
	cudaError_t e = x->rt->GetDevice(&cur);

	if (e != cudaSuccess) {
		cudart_errmsg(x->rt, e, err, errlen, "cudaGetDevice");
		return cudart_errno(e);
	}
	if (prev)
		*prev = cur;
	if (cur == dev)
		return 0;
	e = x->rt->SetDevice(dev);
	if (e != cudaSuccess) {
		cudart_errmsg(x->rt, e, err, errlen, "cudaSetDevice(%d)", dev);
		return cudart_errno(e);
	}
	return 0;
}

static void device_restore(struct cuxfer *x, int dev, int prev)
{
	if (prev >= 0 && prev != dev)
		(void)x->rt->SetDevice(prev);
}

/* The runtime is there (loaded on first use) and has device dev. */
static int device_ready(struct cuxfer *x, int dev, char *err, size_t errlen)
{
	int r;

	pthread_mutex_lock(&x->mu);
	r = runtime_locked(x, err, errlen);
	pthread_mutex_unlock(&x->mu);
	if (r < 0)
		return r;
	if (dev < 0 || dev >= x->n_devices) {
		snprintf(err, errlen, "CUDA device %d does not exist (this process sees %d)", dev,
			 x->n_devices);
		return -ENODEV;
	}
	return 0;
}

int cuxfer_check(struct cuxfer *x, const void *data, uint64_t len, int dev, char *err, size_t errlen)
{
	struct cudaPointerAttributes a;
	cudaError_t e;
	int r;

	r = device_ready(x, dev, err, errlen);
	if (r < 0)
		return r;
	pthread_mutex_lock(&x->mu);
	if (x->pin == CUXFER_PIN_AUTO && x->n_pinned == 0 && !x->pin_msg[0]) {
		int prev = -1;

		/* In the context of the tensor's device, which the trainer
		 * uses.  Unpinned, device copies still work (slower): a
		 * failure to pin is not the tensor's fault.  Tried once. */
		if (with_device(x, dev, &prev, x->pin_msg, sizeof(x->pin_msg)) == 0) {
			if (pin_locked(x, x->pin_msg, sizeof(x->pin_msg)) == 0)
				x->pin_msg[0] = '\0';
			device_restore(x, dev, prev);
		}
	}
	pthread_mutex_unlock(&x->mu);
	if (len == 0)
		return 0;
	e = x->rt->PointerGetAttributes(&a, data);
	if (e != cudaSuccess) {
		cudart_errmsg(x->rt, e, err, errlen, "cudaPointerGetAttributes(%p)", data);
		return cudart_errno(e) == -EIO ? -EINVAL : cudart_errno(e);
	}
	if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
		snprintf(err, errlen, "%p is not CUDA device memory (memory type %d): give host "
			 "memory as CKPT_DEVICE_HOST", data, (int)a.type);
		return -EINVAL;
	}
	if (a.device != dev) {
		snprintf(err, errlen, "%p is memory of CUDA device %d, not %d", data, a.device, dev);
		return -EINVAL;
	}
	/* The end too: a length past the allocation would fail in the copy,
	 * long after the caller could be told. */
	e = x->rt->PointerGetAttributes(&a, (const char *)data + len - 1);
	if (e != cudaSuccess || (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) ||
	    a.device != dev) {
		snprintf(err, errlen, "the last byte of [%p, +%llu) is not memory of CUDA device %d",
			 data, (unsigned long long)len, dev);
		return -EINVAL;
	}
	return 0;
}

int cuxfer_record_start(struct cuxfer *x, int dev, void *stream, cudaEvent_t *ret_ev, char *err,
			size_t errlen)
{
	cudaEvent_t ev;
	cudaError_t e;
	int caller = -1, r;

	if (!x->rt) {
		snprintf(err, errlen, "internal error: no CUDA runtime at commit");
		return -EIO;
	}
	r = with_device(x, dev, &caller, err, errlen);
	if (r < 0)
		return r;
	e = x->rt->EventCreateWithFlags(&ev, START_FLAGS);
	if (e != cudaSuccess) {
		cudart_errmsg(x->rt, e, err, errlen, "cudaEventCreateWithFlags on device %d", dev);
	} else {
		e = x->rt->EventRecord(ev, (cudaStream_t)stream);
		if (e != cudaSuccess) {
			cudart_errmsg(x->rt, e, err, errlen, "cudaEventRecord on the caller's stream %p "
				      "of device %d", stream, dev);
			(void)x->rt->EventDestroy(ev);
		}
	}
	device_restore(x, dev, caller);
	if (e != cudaSuccess)
		return cudart_errno(e);
	*ret_ev = ev;
	return 0;
}

void cuxfer_start_free(struct cuxfer *x, cudaEvent_t ev)
{
	if (x && x->rt && ev)
		(void)x->rt->EventDestroy(ev);
}

/* The copy stream of dev, made on first use.  The calling (library) thread's
 * current device is dev afterwards. */
static int stream_of(struct cuxfer *x, int dev, cudaStream_t *ret, char *err, size_t errlen)
{
	struct cudev *v = &x->dev[dev];
	int r = with_device(x, dev, NULL, err, errlen);

	if (r < 0)
		return r;
	pthread_mutex_lock(&x->mu);
	if (!v->has_stream) {
		/* Non-blocking: no implicit ordering with the legacy default
		 * stream; the only ordering is the wait for the start event. */
		cudaError_t e = x->rt->StreamCreateWithFlags(&v->stream, cudaStreamNonBlocking);

		if (e != cudaSuccess) {
			pthread_mutex_unlock(&x->mu);
			cudart_errmsg(x->rt, e, err, errlen, "cudaStreamCreateWithFlags on device %d", dev);
			return cudart_errno(e);
		}
		v->has_stream = true;
	}
	*ret = v->stream;
	pthread_mutex_unlock(&x->mu);
	return 0;
}

int cuxfer_copy(struct cuxfer *x, struct cuxfer_pending *p, int dev, cudaEvent_t start, void *dst,
		const void *src, size_t len, char *err, size_t errlen)
{
	cudaStream_t st;
	cudaError_t e;
	unsigned i;
	int r;

	if (!x->rt || dev < 0 || dev >= x->n_devices) {
		snprintf(err, errlen, "internal error: copy from device %d without its runtime", dev);
		return -EIO;
	}
	for (i = 0; i < p->n && p->dev[i] != dev; i++)
		;
	if (i == CUXFER_MARK_DEVICES) {
		/* More devices in one extent than p holds: finish those. */
		r = cuxfer_mark(x, p, err, errlen);
		if (r == 0)
			r = cuxfer_poll(x, p, true, err, errlen);
		if (r < 0)
			return r;
		i = 0;
	}
	r = stream_of(x, dev, &st, err, errlen);
	if (r < 0)
		return r;
	if (i == p->n) {
		p->dev[p->n] = dev;
		p->waited[p->n++] = NULL;
	}
	if (p->waited[i] != start) {
		/* Each item waits for the event of its own stream: tensors of
		 * one device produced on two streams share the copy stream but
		 * not their ordering.  Consecutive items of one stream need it
		 * once (a wait is a no-op once its event is done). */
		e = x->rt->StreamWaitEvent(st, start, 0);
		if (e != cudaSuccess) {
			cudart_errmsg(x->rt, e, err, errlen, "cudaStreamWaitEvent on device %d", dev);
			return cudart_errno(e);
		}
		p->waited[i] = start;
	}
	e = x->rt->MemcpyAsync(dst, src, len, cudaMemcpyDeviceToHost, st);
	if (e != cudaSuccess) {
		cudart_errmsg(x->rt, e, err, errlen, "cudaMemcpyAsync of %zu bytes from device %d (%p)",
			      len, dev, src);
		return cudart_errno(e);
	}
	return 0;
}

static int event_get(struct cuxfer *x, int dev, cudaEvent_t *ret, char *err, size_t errlen)
{
	struct cudev *v = &x->dev[dev];
	cudaError_t e;

	pthread_mutex_lock(&x->mu);
	if (v->n_pool > 0) {
		*ret = v->pool[--v->n_pool];
		pthread_mutex_unlock(&x->mu);
		return 0;
	}
	pthread_mutex_unlock(&x->mu);
	e = x->rt->EventCreateWithFlags(ret, MARK_FLAGS);
	if (e != cudaSuccess) {
		cudart_errmsg(x->rt, e, err, errlen, "cudaEventCreateWithFlags on device %d", dev);
		return cudart_errno(e);
	}
	return 0;
}

static void event_put(struct cuxfer *x, int dev, cudaEvent_t ev)
{
	struct cudev *v = &x->dev[dev];

	pthread_mutex_lock(&x->mu);
	if (v->n_pool == v->cap_pool) {
		unsigned cap = v->cap_pool ? 2 * v->cap_pool : 8;
		cudaEvent_t *n = realloc(v->pool, cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&x->mu);
			(void)x->rt->EventDestroy(ev);
			return;
		}
		v->pool = n;
		v->cap_pool = cap;
	}
	v->pool[v->n_pool++] = ev;
	pthread_mutex_unlock(&x->mu);
}

int cuxfer_mark(struct cuxfer *x, struct cuxfer_pending *p, char *err, size_t errlen)
{
	for (unsigned i = 0; i < p->n; i++) {
		cudaStream_t st;
		cudaError_t e;
		int r = stream_of(x, p->dev[i], &st, err, errlen);

		if (r == 0)
			r = event_get(x, p->dev[i], &p->ev[i], err, errlen);
		if (r == 0 && (e = x->rt->EventRecord(p->ev[i], st)) != cudaSuccess) {
			cudart_errmsg(x->rt, e, err, errlen, "cudaEventRecord on device %d", p->dev[i]);
			event_put(x, p->dev[i], p->ev[i]);
			r = cudart_errno(e);
		}
		if (r < 0) {
			/* What was queued still runs: wait for it the slow way,
			 * so the slot is not reused under a running copy. */
			for (unsigned j = 0; j < p->n; j++) {
				if (j < i)
					event_put(x, p->dev[j], p->ev[j]);
				char ignored[256];

				if (stream_of(x, p->dev[j], &st, ignored, sizeof(ignored)) == 0)
					(void)x->rt->StreamSynchronize(st);
			}
			p->n = 0;
			p->marked = false;
			return r;
		}
	}
	p->marked = true;
	return 0;
}

int cuxfer_poll(struct cuxfer *x, struct cuxfer_pending *p, bool wait, char *err, size_t errlen)
{
	int res = 0;

	if (!p->marked || p->n == 0) {
		p->n = 0;
		p->marked = false;
		return 0;
	}
	for (unsigned i = 0; i < p->n; i++) {
		cudaError_t e = wait ? x->rt->EventSynchronize(p->ev[i]) : x->rt->EventQuery(p->ev[i]);

		if (e == cudaErrorNotReady)
			return -EAGAIN;
		if (e != cudaSuccess && res == 0) {
			cudart_errmsg(x->rt, e, err, errlen, "copy from CUDA device %d", p->dev[i]);
			res = cudart_errno(e);
			if (res == -EAGAIN)
				res = -EIO;
		}
	}
	for (unsigned i = 0; i < p->n; i++)
		event_put(x, p->dev[i], p->ev[i]);
	p->n = 0;
	p->marked = false;
	return res;
}

int cuxfer_h2d(struct cuxfer *x, int dev, void *dst, const void *src, size_t len, void *stream,
	       char *err, size_t errlen)
{
	struct cuxfer_pending p = { 0 };
	cudaEvent_t start = NULL;
	cudaStream_t st;
	cudaError_t e;
	int prev = -1, r;

	r = device_ready(x, dev, err, errlen);
	if (r < 0)
		return r;
	/* Work the caller queued before this call may still use dst (the
	 * last step's kernels reading the weights being replaced): the copy
	 * waits for it, as a save's copies do. */
	r = cuxfer_record_start(x, dev, stream, &start, err, errlen);
	if (r < 0)
		return r;
	r = with_device(x, dev, &prev, err, errlen);
	if (r < 0) {
		cuxfer_start_free(x, start);
		return r;
	}
	r = stream_of(x, dev, &st, err, errlen);
	if (r == 0) {
		e = x->rt->StreamWaitEvent(st, start, 0);
		if (e != cudaSuccess) {
			cudart_errmsg(x->rt, e, err, errlen, "cudaStreamWaitEvent on device %d", dev);
			r = cudart_errno(e);
		}
	}
	if (r == 0) {
		e = x->rt->MemcpyAsync(dst, src, len, cudaMemcpyHostToDevice, st);
		if (e != cudaSuccess) {
			cudart_errmsg(x->rt, e, err, errlen, "cudaMemcpyAsync of %zu bytes to device %d "
				      "(%p)", len, dev, dst);
			r = cudart_errno(e);
		}
	}
	if (r == 0) {
		p.dev[p.n++] = dev;
		r = cuxfer_mark(x, &p, err, errlen);
	}
	/* Waited for: the bytes at src may be reused when this returns, and
	 * whatever the caller queues next, on any stream, sees dst. */
	if (r == 0)
		r = cuxfer_poll(x, &p, true, err, errlen);
	device_restore(x, dev, prev);
	cuxfer_start_free(x, start);
	return r;
}
