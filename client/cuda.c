/* SPDX-License-Identifier: MIT */
/*
 * cuda.c - the client's side of the CUDA copy engine (cuda/cuxfer.h does the
 * CUDA work): one struct cuxfer per client, the check of a device tensor at
 * add time, the start events recorded at commit, and the copy threads' calls;
 * and a client-less struct cuxfer per load with device destinations (load.c).
 * A build without CUDA keeps these entry points and refuses device tensors.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "client/internal.h"

/* Never called: fill_extent sends CUDA items to cli_cuda_copy(). */
static int cuda_copy_unused(void *dst, const void *src, size_t len, char *err, size_t errlen)
{
	(void)dst;
	(void)src;
	(void)len;
	snprintf(err, errlen, "internal error: CUDA item copied as host memory");
	return -EIO;
}

const struct copy_engine copy_engine_cuda = {
	.name = "cuda",
	.copy = cuda_copy_unused,
	.sync = NULL,
};

#ifdef CKPT_HAVE_CUDA

int cli_cuda_open(struct ckpt_client *c, enum ckpt_cuda_pin pin, char *err, size_t errlen)
{
	struct cuxfer *x;
	int r = cuxfer_open((enum cuxfer_pin)pin, c->arena, c->arena_bytes, &x, err, errlen);

	if (r < 0)
		return r;
	c->cuda = x;
	if (cuxfer_pinned(x))
		cli_log(CKPT_LOG_DEBUG, "arena pinned for CUDA copies");
	return 0;
}

void cli_cuda_close(struct ckpt_client *c)
{
	cuxfer_close(c->cuda);
	c->cuda = NULL;
}

/* cuxfer_check, logging `pinned` when it pinned x's arena (the first check
 * pins under AUTO), or `unpinned` and why it could not (once). */
static int check_logged(struct cuxfer *x, const char *pinned, const char *unpinned,
			const void *data, uint64_t bytes, int device, char *err, size_t errlen)
{
	bool was = cuxfer_pinned(x);
	int r = cuxfer_check(x, data, bytes, device, err, errlen);
	char why[512];

	if (r == 0 && !was && cuxfer_pinned(x))
		cli_log(CKPT_LOG_DEBUG, "%s", pinned);
	if (cuxfer_pin_failure(x, why, sizeof(why)))
		cli_log(CKPT_LOG_WARNING, "%s: %s", unpinned, why);
	return r;
}

int cli_cuda_check(struct ckpt_client *c, const void *data, uint64_t bytes, int device, char *err,
		   size_t errlen)
{
	return check_logged(c->cuda, "arena pinned for CUDA copies (first device tensor)",
			    "device copies go to unpinned memory (slower)", data, bytes, device, err,
			    errlen);
}

int cli_cuda_commit(struct ckpt_client *c, struct ckpt_save *s, char *err, size_t errlen)
{
	for (size_t i = 0; i < s->layout.n_items; i++) {
		struct save_src *src = &s->src[i];
		void *stream;
		uint32_t k;

		if (src->engine != &copy_engine_cuda)
			continue;
		stream = src->stream_set ? src->stream : s->cuda_stream;
		for (k = 0; k < s->n_starts; k++)
			if (s->starts[k].device == src->device && s->starts[k].stream == stream)
				break;
		if (k == s->n_starts) {
			struct cli_cuda_start *n = realloc(s->starts, (k + 1) * sizeof(*n));
			cudaEvent_t ev;
			int r;

			if (!n) {
				snprintf(err, errlen, "out of memory");
				return -ENOMEM;
			}
			s->starts = n;
			r = cuxfer_record_start(c->cuda, src->device, stream, &ev, err, errlen);
			if (r < 0)
				return r;
			s->starts[k] = (struct cli_cuda_start){ src->device, stream, ev };
			s->n_starts++;
		}
		src->start = k;
	}
	return 0;
}

void cli_cuda_save_free(struct ckpt_save *s)
{
	for (uint32_t k = 0; k < s->n_starts; k++)
		cuxfer_start_free(s->client->cuda, (cudaEvent_t)s->starts[k].event);
	free(s->starts);
	s->starts = NULL;
	s->n_starts = 0;
}

int cli_cuda_copy(struct ckpt_client *c, const struct ckpt_save *s, size_t i, void *dst,
		  const void *from, size_t n, cli_cuda_pending *p, char *err, size_t errlen)
{
	const struct save_src *src = &s->src[i];

	return cuxfer_copy(c->cuda, p, src->device, (cudaEvent_t)s->starts[src->start].event, dst,
			   from, n, err, errlen);
}

int cli_cuda_mark(struct ckpt_client *c, cli_cuda_pending *p, char *err, size_t errlen)
{
	return p->n ? cuxfer_mark(c->cuda, p, err, errlen) : 0;
}

int cli_cuda_poll(struct ckpt_client *c, cli_cuda_pending *p, bool wait, char *err, size_t errlen)
{
	return cuxfer_poll(c->cuda, p, wait, err, errlen);
}

int cli_cuda_h2d(struct ckpt_client *c, int device, void *dst, const void *src, size_t len,
		 void *stream, char *err, size_t errlen)
{
	int r = cuxfer_check(c->cuda, dst, len, device, err, errlen);

	return r < 0 ? r : cuxfer_h2d(c->cuda, device, dst, src, len, stream, err, errlen);
}

int cli_cuda_load_open(void *arena, uint64_t len, struct cuxfer **ret, char *err, size_t errlen)
{
	return cuxfer_open(arena ? CUXFER_PIN_AUTO : CUXFER_PIN_OFF, arena, arena ? len : 0, ret,
			   err, errlen);
}

void cli_cuda_load_close(struct cuxfer *x)
{
	cuxfer_close(x);
}

int cli_cuda_load_check(struct cuxfer *x, const void *data, uint64_t len, int device, char *err,
			size_t errlen)
{
	return check_logged(x, "load: bounce buffers pinned for CUDA copies",
			    "load: device copies go from unpinned memory (slower)", data, len, device,
			    err, errlen);
}

int cli_cuda_load_h2d(struct cuxfer *x, int device, void *dst, const void *src, size_t len,
		      char *err, size_t errlen)
{
	/* A load names no stream: the caller owns the destinations until the
	 * load is done (ckpt.h), so the legacy default stream, which
	 * cuxfer_h2d waits for, is the only ordering there is to keep. */
	return cuxfer_h2d(x, device, dst, src, len, NULL, err, errlen);
}

#else /* !CKPT_HAVE_CUDA */

int cli_cuda_load_open(void *arena, uint64_t len, struct cuxfer **ret, char *err, size_t errlen)
{
	(void)arena, (void)len, (void)ret;
	snprintf(err, errlen, "loads into CUDA device memory need the CUDA copy engine, which this "
		 "build does not include (built with CUDA=0 or without the toolkit's headers)");
	return -EOPNOTSUPP;
}

void cli_cuda_load_close(struct cuxfer *x)
{
	(void)x;
}

int cli_cuda_load_check(struct cuxfer *x, const void *data, uint64_t len, int device, char *err,
			size_t errlen)
{
	(void)x, (void)data, (void)len, (void)device;
	snprintf(err, errlen, "internal error: no CUDA engine in this build");
	return -EOPNOTSUPP;
}

int cli_cuda_load_h2d(struct cuxfer *x, int device, void *dst, const void *src, size_t len,
		      char *err, size_t errlen)
{
	(void)x, (void)device, (void)dst, (void)src, (void)len;
	snprintf(err, errlen, "internal error: no CUDA engine in this build");
	return -EOPNOTSUPP;
}

int cli_cuda_h2d(struct ckpt_client *c, int device, void *dst, const void *src, size_t len,
		 void *stream, char *err, size_t errlen)
{
	(void)c, (void)device, (void)dst, (void)src, (void)len, (void)stream;
	snprintf(err, errlen, "copies to CUDA devices need the CUDA copy engine, which this build "
		 "does not include (built with CUDA=0 or without the toolkit's headers)");
	return -EOPNOTSUPP;
}

int cli_cuda_open(struct ckpt_client *c, enum ckpt_cuda_pin pin, char *err, size_t errlen)
{
	(void)c;
	if (pin == CKPT_CUDA_PIN_ON) {
		snprintf(err, errlen, "cuda_pin is CKPT_CUDA_PIN_ON, but this libckpt was built "
			 "without CUDA");
		return -EOPNOTSUPP;
	}
	return 0;
}

void cli_cuda_close(struct ckpt_client *c)
{
	(void)c;
}

int cli_cuda_check(struct ckpt_client *c, const void *data, uint64_t bytes, int device, char *err,
		   size_t errlen)
{
	(void)c;
	(void)data;
	(void)bytes;
	(void)device;
	snprintf(err, errlen, "CUDA device tensors need the CUDA copy engine, which this build "
		 "does not include (built with CUDA=0 or without the toolkit's headers)");
	return -EOPNOTSUPP;
}

int cli_cuda_commit(struct ckpt_client *c, struct ckpt_save *s, char *err, size_t errlen)
{
	(void)c;
	(void)s;
	(void)err;
	(void)errlen;
	return 0;
}

void cli_cuda_save_free(struct ckpt_save *s)
{
	(void)s;
}

int cli_cuda_copy(struct ckpt_client *c, const struct ckpt_save *s, size_t i, void *dst,
		  const void *from, size_t n, cli_cuda_pending *p, char *err, size_t errlen)
{
	(void)c;
	(void)s;
	(void)i;
	(void)dst;
	(void)from;
	(void)n;
	(void)p;
	snprintf(err, errlen, "internal error: no CUDA engine in this build");
	return -EIO;
}

int cli_cuda_mark(struct ckpt_client *c, cli_cuda_pending *p, char *err, size_t errlen)
{
	(void)c;
	(void)p;
	(void)err;
	(void)errlen;
	return 0;
}

int cli_cuda_poll(struct ckpt_client *c, cli_cuda_pending *p, bool wait, char *err, size_t errlen)
{
	(void)c;
	(void)wait;
	(void)err;
	(void)errlen;
	p->n = 0;
	return 0;
}

#endif
