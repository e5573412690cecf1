/* SPDX-License-Identifier: MIT */
/*
 * gpu_probe.c - tells `make bench` whether this machine can run the GPU
 * scenarios, through the same loader libckpt uses (cuda/cudart.c).  Prints
 * one JSON object: {"devices": N, "error": "..." or null}.  Exit 0 either way.
 */
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
	cudaError_t e = rt->GetDeviceCount(&n);
	if (e != cudaSuccess) {
		cudart_errmsg(rt, e, msg, sizeof(msg), "cudaGetDeviceCount (runtime '%s')", rt->path);
		printf("{\"devices\": 0, \"error\": ");
		print_json_str(msg);
		printf("}\n");
		return 0;
	}
	printf("{\"devices\": %d, \"error\": null}\n", n);
#else
	printf("{\"devices\": 0, \"error\": ");
	print_json_str("libckpt was built without CUDA (CUDA=0 or no toolkit headers)");
	printf("}\n");
#endif
	return 0;
}
