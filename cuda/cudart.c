/* SPDX-License-Identifier: MIT */
/* cudart.c - see cudart.h. */
#include "cuda/cudart.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/dlsyms.h"

static struct {
	pthread_once_t once;
	struct cudart rt;
	bool ok;
	char err[512];
} g = { .once = PTHREAD_ONCE_INIT };

#define SYM(name) { #name, offsetof(struct cudart, name) }
static const struct dl_sym syms[] = {
	SYM(RuntimeGetVersion), SYM(GetErrorName), SYM(GetErrorString), SYM(GetDeviceCount),
	SYM(GetDevice), SYM(SetDevice), SYM(PointerGetAttributes), SYM(HostRegister),
	SYM(HostUnregister), SYM(StreamCreateWithFlags), SYM(StreamDestroy),
	SYM(StreamWaitEvent), SYM(StreamSynchronize), SYM(EventCreateWithFlags),
	SYM(EventDestroy), SYM(EventRecord), SYM(EventQuery), SYM(EventSynchronize),
	SYM(MemcpyAsync),
};
#undef SYM

static const char *candidate(unsigned i, char *buf, size_t len)
{
	const char *env = secure_getenv("CKPT_CUDART");

	if (env && *env)
		return i == 0 ? env : NULL;
	/* The toolkit's soname first: the runtime keeps its ABI within a
	 * major version (CUDART_VERSION is 1000 * major + 10 * minor); CUDA
	 * 11's was libcudart.so.11.0. */
	if (i == 0)
		snprintf(buf, len, "libcudart.so.%d", CUDART_VERSION / 1000);
	else if (i == 1)
		snprintf(buf, len, "libcudart.so.%d.0", CUDART_VERSION / 1000);
	return i <= 1 ? buf : i == 2 ? "libcudart.so" : NULL;
}

static void load(void)
{
	const char *env = secure_getenv("CKPT_CUDART");
	char buf[64], first[256] = "";
	const char *name;
	void *dl = NULL;

	for (unsigned i = 0; !dl && (name = candidate(i, buf, sizeof(buf))); i++) {
		snprintf(g.rt.path, sizeof(g.rt.path), "%s", name);
		dl = dlopen(name, RTLD_NOW | RTLD_LOCAL);
		if (!dl && i == 0)
			snprintf(first, sizeof(first), "%s", dlerror());
	}
	if (!dl) {
		if (env && *env)
			snprintf(g.err, sizeof(g.err),
				 "cannot load the CUDA runtime $CKPT_CUDART='%s': %s", env, first);
		else
			snprintf(g.err, sizeof(g.err),
				 "cannot load the CUDA runtime (%s; set $CKPT_CUDART to its path, "
				 "or add its directory to the loader's path)", first);
		return;
	}
	if (!dl_lookup_all(dl, "cuda", syms, sizeof(syms) / sizeof(syms[0]), &g.rt, g.rt.path,
			   g.err, sizeof(g.err))) {
		dlclose(dl);
		return;
	}
	/* Needs no driver: a runtime without one still answers this.  Another
	 * major version (the unversioned name may be any) has another ABI. */
	if (g.rt.RuntimeGetVersion(&g.rt.version) != cudaSuccess)
		g.rt.version = 0;
	if (g.rt.version / 1000 != CUDART_VERSION / 1000) {
		snprintf(g.err, sizeof(g.err), "the CUDA runtime '%s' is version %d.%d; this libckpt "
			 "was built for CUDA %d.x (set $CKPT_CUDART to a runtime of that version)",
			 g.rt.path, g.rt.version / 1000, g.rt.version % 1000 / 10,
			 CUDART_VERSION / 1000);
		dlclose(dl);
		return;
	}
	g.ok = true;
}

const struct cudart *cudart_get(char *err, size_t errlen)
{
	pthread_once(&g.once, load);
	if (!g.ok) {
		snprintf(err, errlen, "%s", g.err);
		return NULL;
	}
	return &g.rt;
}

void cudart_errmsg(const struct cudart *rt, cudaError_t e, char *buf, size_t len,
		   const char *call_fmt, ...)
{
	const char *name = rt->GetErrorName(e), *str = rt->GetErrorString(e);
	size_t n;
	va_list ap;

	if (!buf || len == 0)
		return;
	va_start(ap, call_fmt);
	vsnprintf(buf, len, call_fmt, ap);
	va_end(ap);
	n = strlen(buf);
	if (n < len)
		snprintf(buf + n, len - n, ": %s (%s)", name ? name : "unknown CUDA error",
			 str ? str : "no description");
}

int cudart_errno(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
		return -EINVAL;
	case cudaErrorNotReady:
		return -EAGAIN;
	case cudaErrorHostMemoryAlreadyRegistered:
		return -EEXIST;
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorInsufficientDriver:
		return -ENODEV;
	default:
		return -EIO;
	}
}
