/* SPDX-License-Identifier: MIT */
/*
 * dlsyms.h - loading a vendor library at run time (the CUDA runtime,
 * NCCL): the first of several candidate names that dlopen() takes, and
 * every symbol of a table or none, so that a library lacking one call is
 * not used at all.  Shared by cudart.c and nccl.c.
 */
#ifndef CKPT_CUDA_DLSYMS_H
#define CKPT_CUDA_DLSYMS_H

#include <stdbool.h>
#include <stddef.h>

/* A function pointer field of a struct, filled from symbol prefix + name. */
struct dl_sym {
	const char *name; /* without the prefix */
	size_t off;       /* offsetof(struct ..., field) */
};

/*
 * dlopen()s names[0], names[1], ... (RTLD_NOW | RTLD_LOCAL) until one
 * loads.  The name tried last is copied to path (pathlen bytes); the
 * reason the FIRST one failed to first_err.  Returns the handle or NULL.
 */
void *dl_open_first(const char *const *names, size_t n, char *path, size_t pathlen,
		    char *first_err, size_t errlen);

/*
 * Looks up prefix + syms[i].name for every i into the void * at
 * (char *)obj + syms[i].off.  Returns true, or false with "'PATH' has no
 * SYMBOL: reason" in err (then nothing useful is in obj).
 */
bool dl_lookup_all(void *dl, const char *prefix, const struct dl_sym *syms, size_t n, void *obj,
		   const char *path, char *err, size_t errlen);

#endif
