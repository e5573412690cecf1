/* SPDX-License-Identifier: MIT */
/* dlsyms.c - see dlsyms.h. */
#include "cuda/dlsyms.h"

#include <dlfcn.h>
#include <stdio.h>

void *dl_open_first(const char *const *names, size_t n, char *path, size_t pathlen,
		    char *first_err, size_t errlen)
{
	void *dl = NULL;

	if (errlen)
		first_err[0] = '\0';
	for (size_t i = 0; !dl && i < n; i++) {
		snprintf(path, pathlen, "%s", names[i]);
		dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!dl && i == 0) {
			const char *e = dlerror();
			snprintf(first_err, errlen, "%s", e ? e : "dlopen failed");
		}
	}
	return dl;
}

bool dl_lookup_all(void *dl, const char *prefix, const struct dl_sym *syms, size_t n, void *obj,
		   const char *path, char *err, size_t errlen)
{
	char sym[128];

	for (size_t i = 0; i < n; i++) {
		void *f;

		snprintf(sym, sizeof(sym), "%s%s", prefix, syms[i].name);
		dlerror();
		f = dlsym(dl, sym);
		if (!f) {
			const char *e = dlerror();
			snprintf(err, errlen, "'%s' has no %s: %s", path, sym,
				 e ? e : "symbol is NULL");
			return false;
		}
		*(void **)((char *)obj + syms[i].off) = f;
	}
	return true;
}
