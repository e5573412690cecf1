/* SPDX-License-Identifier: MIT */
/*
 * cudart.h - the CUDA runtime, loaded when first needed.
 *
 * libckpt never links libcudart: one build serves GPU nodes and CPU-only
 * nodes, and a process that saves only host memory never loads CUDA.  The
 * first device tensor loads the runtime with dlopen and looks up the calls
 * below; each pointer has the type of the toolkit's own declaration
 * (__typeof__), so a signature that differs from the headers this was built
 * against is a compile error, not a crash.
 *
 * Which library: $CKPT_CUDART when set (a path or a file name for dlopen;
 * the tests point it at their fake runtime), else libcudart.so.<major> of
 * the toolkit this was built against, else libcudart.so.  dlopen by file
 * name finds a runtime the process already loaded under that soname (e.g.
 * PyTorch's), so the trainer and libckpt share one runtime and one context.
 */
#ifndef CKPT_CUDA_CUDART_H
#define CKPT_CUDA_CUDART_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

/* That mode renames some calls (cudaMemcpyAsync_ptsz, ...): the names looked
 * up here are the plain ones, whose default stream is the legacy one. */
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "cuda/ must be built without CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

#define CUDART_FN(name) __typeof__(cuda##name) *name

struct cudart {
	char path[256]; /* the name it was loaded by */
	int version;    /* cudaRuntimeGetVersion: 1000 * major + 10 * minor */
	CUDART_FN(RuntimeGetVersion);
	CUDART_FN(GetErrorName);
	CUDART_FN(GetErrorString);
	CUDART_FN(GetDeviceCount);
	CUDART_FN(GetDevice);
	CUDART_FN(SetDevice);
	CUDART_FN(PointerGetAttributes);
	CUDART_FN(HostRegister);
	CUDART_FN(HostUnregister);
	CUDART_FN(StreamCreateWithFlags);
	CUDART_FN(StreamDestroy);
	CUDART_FN(StreamWaitEvent);
	CUDART_FN(StreamSynchronize);
	CUDART_FN(EventCreateWithFlags);
	CUDART_FN(EventDestroy);
	CUDART_FN(EventRecord);
	CUDART_FN(EventQuery);
	CUDART_FN(EventSynchronize);
	CUDART_FN(MemcpyAsync);
};

/*
 * Returns the runtime, loading it on the first call (thread-safe; a failure
 * is remembered, so later calls fail at once with the same reason).  NULL
 * with the reason in err (the dlopen or dlsym message) when it cannot be
 * loaded.  The runtime stays loaded until the process exits.
 */
const struct cudart *cudart_get(char *err, size_t errlen);

/* Formats a failed call for the user (nothing if buf is NULL or len 0): "cudaSetDevice(3): cudaErrorInvalidDevice
 * (invalid device ordinal)".  call_fmt is printf-style. */
void cudart_errmsg(const struct cudart *rt, cudaError_t e, char *buf, size_t len,
		   const char *call_fmt, ...) __attribute__((format(printf, 5, 6)));

/* The negative errno for a CUDA error (style: foreign errors map to errno at
 * the module boundary; the message keeps the CUDA name). */
int cudart_errno(cudaError_t e);

#endif
