/* SPDX-License-Identifier: MIT */
/* nccl.c - see nccl.h. */
#include "cuda/nccl.h"

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
	struct nccl nc;
	bool ok;
	char err[512];
} g = { .once = PTHREAD_ONCE_INIT };

#define SYM(name) { #name, offsetof(struct nccl, name) }
static const struct dl_sym syms[] = {
	SYM(GetVersion), SYM(GetErrorString), SYM(CommCount), SYM(CommUserRank),
	SYM(GroupStart), SYM(GroupEnd), SYM(Send), SYM(Recv), SYM(AllGather),
	SYM(MemAlloc), SYM(MemFree),
};
#undef SYM

static void load(void)
{
	static const char *const names[] = { "libnccl.so.2", "libnccl.so" };
	const char *env = secure_getenv("CKPT_NCCL_LIB");
	char first[256] = "";
	void *dl = NULL;

	if (env && *env) {
		snprintf(g.nc.path, sizeof(g.nc.path), "%s", env);
		dl = dlopen(env, RTLD_NOW | RTLD_LOCAL);
		if (!dl) {
			snprintf(g.err, sizeof(g.err), "cannot load NCCL $CKPT_NCCL_LIB='%s': %s",
				 env, dlerror());
			return;
		}
	}
	if (!dl)
		dl = dl_open_first(names, sizeof(names) / sizeof(names[0]), g.nc.path,
				   sizeof(g.nc.path), first, sizeof(first));
	if (!dl) {
		snprintf(g.err, sizeof(g.err), "cannot load NCCL (%s; set $CKPT_NCCL_LIB to its "
			 "path, or add its directory to the loader's path)", first);
		return;
	}
	if (!dl_lookup_all(dl, "nccl", syms, sizeof(syms) / sizeof(syms[0]), &g.nc, g.nc.path,
			   g.err, sizeof(g.err))) {
		dlclose(dl);
		return;
	}
	if (g.nc.GetVersion(&g.nc.version) != ncclSuccess)
		g.nc.version = 0;
	if (g.nc.version < NCCL_MIN_VERSION) {
		snprintf(g.err, sizeof(g.err), "NCCL '%s' is version %d; loads across a group need "
			 "%d or later (ncclMemAlloc)", g.nc.path, g.nc.version, NCCL_MIN_VERSION);
		dlclose(dl);
		return;
	}
	g.ok = true;
}

const struct nccl *nccl_get(char *err, size_t errlen)
{
	pthread_once(&g.once, load);
	if (!g.ok) {
		snprintf(err, errlen, "%s", g.err);
		return NULL;
	}
	return &g.nc;
}

void nccl_errmsg(const struct nccl *nc, ncclResult_t e, char *buf, size_t len,
		 const char *call_fmt, ...)
{
	const char *str = nc->GetErrorString(e);
	size_t n;
	va_list ap;

	if (!buf || len == 0)
		return;
	va_start(ap, call_fmt);
	vsnprintf(buf, len, call_fmt, ap);
	va_end(ap);
	n = strlen(buf);
	if (n < len)
		snprintf(buf + n, len - n, ": NCCL error %d (%s)", (int)e,
			 str ? str : "no description");
}

int nccl_errno(ncclResult_t e)
{
	switch (e) {
	case ncclSuccess:
		return 0;
	case ncclInvalidArgument:
	case ncclInvalidUsage:
		return -EINVAL;
	case ncclInProgress:
		return -EAGAIN;
	case ncclRemoteError:
		return -ECONNRESET;
	default:
		return -EIO;
	}
}
