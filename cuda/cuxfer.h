/* SPDX-License-Identifier: MIT */
/*
 * cuxfer.h - copies between CUDA devices and a client's arena.
 *
 * One struct cuxfer per client.  It pins the arena (cudaHostRegister,
 * portable, in pieces of at most CUXFER_PIN_PIECE), keeps one non-blocking
 * copy stream per device in use, and a pool of events per device (timing
 * disabled).  The runtime is loaded on first use (cuda/cudart.h).
 *
 * Ordering, the reason this module exists: a save's device tensors were
 * produced by work the trainer queued on its own streams.  At commit, on
 * the caller's thread, cuxfer_record_start() records an event on each such
 * stream; every copy of the save's bytes on a device is queued on that
 * device's copy stream behind a wait for the event of the tensor's stream
 * (cudaStreamWaitEvent), so it sees the results of everything queued before
 * the save, without a device-wide synchronisation and without blocking the
 * trainer.
 *
 * Copy threads issue the copies of one extent (cuxfer_copy), then mark it
 * (cuxfer_mark: one event per device it used) and poll it (cuxfer_poll);
 * the extent may be handed to the daemon only once cuxfer_poll says done,
 * and its slot must not be reused before that either (DMA may still write
 * it).
 */
#ifndef CKPT_CUDA_CUXFER_H
#define CKPT_CUDA_CUXFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

/* Drivers since R580 refuse one registration of 512 GiB or more. */
#define CUXFER_PIN_PIECE (64ull << 30)
/* Devices one client can copy from. */
#define CUXFER_MAX_DEVICES 64
/* Devices one extent's copies may use before the copy thread waits for
 * the earlier ones (an extent is one arena slot: rarely more than one). */
#define CUXFER_MARK_DEVICES 4

enum cuxfer_pin { CUXFER_PIN_AUTO = 0, CUXFER_PIN_ON = 1, CUXFER_PIN_OFF = 2 };

struct cuxfer;

/* A copy thread's extent in flight: the devices it used, then their events. */
struct cuxfer_pending {
	unsigned n;
	int dev[CUXFER_MARK_DEVICES];
	cudaEvent_t waited[CUXFER_MARK_DEVICES]; /* the last start event dev's
	                                          * stream was made to wait for */
	cudaEvent_t ev[CUXFER_MARK_DEVICES];
	bool marked;
};

/*
 * For a client whose arena is [arena, arena + len).  pin ON loads the
 * runtime and pins the arena now, in the calling thread's current CUDA
 * context (failing if either fails); AUTO pins at the first device tensor,
 * with that tensor's device current (a process that saves only host memory
 * never pins, and no context is made on a device the trainer does not
 * use); OFF never pins (device copies then go to pageable memory: slower,
 * and synchronous for the copying thread).  Returns 0 and *ret, or -errno
 * with the reason in err.
 */
int cuxfer_open(enum cuxfer_pin pin, void *arena, uint64_t len, struct cuxfer **ret, char *err,
		size_t errlen);

/* Unpins the arena (before the caller unmaps it) and frees streams and
 * events.  Every copy must be finished (cuxfer_poll said done or failed).
 * Accepts NULL. */
void cuxfer_close(struct cuxfer *x);

/* Whether the arena is pinned now. */
bool cuxfer_pinned(struct cuxfer *x);

/* AUTO: true once, with the reason in buf, if pinning was tried and failed
 * (the copies then go to pageable memory). */
bool cuxfer_pin_failure(struct cuxfer *x, char *buf, size_t len);

/*
 * Checks that [data, data + len) is memory of CUDA device `dev`, loading
 * the runtime (and pinning the arena under AUTO) on first use.  Returns 0,
 * -ENODEV (no runtime, driver or such device), -EINVAL (not memory of that
 * device), or another -errno, with the reason in err (the CUDA error's name
 * and text when CUDA reported it).
 */
int cuxfer_check(struct cuxfer *x, const void *data, uint64_t len, int dev, char *err,
		 size_t errlen);

/*
 * On the caller's thread, at commit: records an event on `stream` (a
 * cudaStream_t of device `dev`; NULL is the legacy default stream) and
 * returns it in *ret_ev; destroy it with cuxfer_start_free().  The
 * caller's current device is left as it was.  Returns 0 or -errno with the
 * reason in err.
 */
int cuxfer_record_start(struct cuxfer *x, int dev, void *stream, cudaEvent_t *ret_ev, char *err,
			size_t errlen);
void cuxfer_start_free(struct cuxfer *x, cudaEvent_t ev);

/*
 * Copy thread: queues a copy of len bytes from device memory src (device
 * `dev`) to dst in the arena, on dev's copy stream, after the stream waits
 * for `start`; notes dev in p.  Returns 0 or -errno with the reason in err.
 */
int cuxfer_copy(struct cuxfer *x, struct cuxfer_pending *p, int dev, cudaEvent_t start, void *dst,
		const void *src, size_t len, char *err, size_t errlen);

/* After an extent's copies: records an event on each device p used.  With
 * nothing used, p is done at once.  Returns 0 or -errno with err. */
int cuxfer_mark(struct cuxfer *x, struct cuxfer_pending *p, char *err, size_t errlen);

/*
 * Whether p's copies are done: 0 (done), -EAGAIN (not yet; only without
 * wait), or -errno for a failed copy with the CUDA error in err.  After 0
 * or a failure, p is empty again and its events back in the pool; a copy
 * CUDA reports failed no longer writes (the context is broken), so its slot
 * may be given back.
 */
int cuxfer_poll(struct cuxfer *x, struct cuxfer_pending *p, bool wait, char *err, size_t errlen);

/*
 * Host to device, for restore: copies len bytes from src (in the arena or
 * any host memory) to device memory dst of device `dev`, on dev's copy
 * stream, after the work queued on `stream` (a cudaStream_t of that device;
 * NULL: the legacy default stream) before this call, and waits for it: when
 * it returns, src may be reused and anything queued later sees dst.  The
 * caller's current device is left as it was.  Returns 0 or -errno with the
 * reason in err.
 */
int cuxfer_h2d(struct cuxfer *x, int dev, void *dst, const void *src, size_t len, void *stream,
	       char *err, size_t errlen);

#endif
