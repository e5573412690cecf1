/* SPDX-License-Identifier: MIT */
/*
 * fake_cudart.h - the test hooks of the fake CUDA runtime (fake_cudart.c).
 * Tests reach them with dlsym on the handle libckpt loaded ($CKPT_CUDART),
 * so that they act on the same instance; these are their types.
 */
#ifndef CKPT_TESTS_FAKE_CUDART_H
#define CKPT_TESTS_FAKE_CUDART_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

/* Devices the fake has (default 2; 0: cudaGetDeviceCount fails). */
void fake_cuda_set_devices(int n);
/* The n-th next call of `call` (its name without "cuda", e.g. "MemcpyAsync")
 * returns err; for MemcpyAsync with async set, the call succeeds and the copy
 * fails when its stream runs it, and from then on, as on a GPU, every call
 * that queues or waits for work returns err (the context is broken).
 * n = 0 disarms. */
void fake_cuda_fail(const char *call, long n, cudaError_t err, bool async);
/* Enqueues a "kernel" on st: after delay_us it sets len bytes at dst (device
 * memory) to fill.  cudaErrorInvalidValue for memory not from cudaMalloc. */
cudaError_t fake_cuda_kernel(void *dst, size_t len, int fill, unsigned delay_us, cudaStream_t st);
/* What is live: "registered" (host registrations), "streams", "events",
 * "allocs" (cudaMalloc); "copies", "waits": cudaMemcpyAsync and
 * cudaStreamWaitEvent calls so far.  -1 for
 * another name. */
long fake_cuda_stat(const char *what);
/* Waits until every stream's queue is empty. */
void fake_cuda_idle(void);

#endif
