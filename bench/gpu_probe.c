/* SPDX-License-Identifier: MIT */
/*
 * gpu_probe.c - tells `make bench` whether this machine can run the GPU
 * scenarios, through the same loader libckpt uses (cuda/cudart.c).  Prints
 * one JSON object: {"devices": N, "error": "..." or null, "fake": true if
 * the runtime is the tests' fake (it exports their hooks), "runtime": the
 * library loaded}.  Exit 0 either way.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>

#ifdef CKPT_HAVE_CUDA
#include "cuda/cudart.h"
#endif

/* The message as a JSON string body: quotes, backslashes and control
 * characters escaped. */
static void print_json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", (unsigned char)*s);
		else
			putchar(*s);
	}
	putchar('"');
}

int main(void)
{
#ifdef CKPT_HAVE_CUDA
	char err[512], msg[600];
	const struct cudart *rt = cudart_get(err, sizeof(err));
	int n = 0;

	if (!rt) {
		printf("{\"devices\": 0, \"error\": ");
		print_json_str(err);
		printf("}\n");
		return 0;
	}
	void *dl = dlopen(rt->path, RTLD_NOW | RTLD_NOLOAD);
	bool fake = dl && dlsym(dl, "fake_cuda_stat");
	cudaError_t e = rt->GetDeviceCount(&n);

	if (dl)
		dlclose(dl);
	if (e != cudaSuccess) {
		cudart_errmsg(rt, e, msg, sizeof(msg), "cudaGetDeviceCount (runtime '%s')", rt->path);
		n = 0;
	}
	printf("{\"devices\": %d, \"error\": ", n);
	if (e != cudaSuccess)
		print_json_str(msg);
	else
		printf("null");
	printf(", \"fake\": %s, \"runtime\": ", fake ? "true" : "false");
	print_json_str(rt->path);
	printf("}\n");
#else
	printf("{\"devices\": 0, \"error\": ");
	print_json_str("libckpt was built without CUDA (CUDA=0 or no toolkit headers)");
	printf("}\n");
#endif
	return 0;
}
