/* SPDX-License-Identifier: MIT */
/*
 * nccl.h - NCCL, loaded when a load first needs it.
 *
 * Like the CUDA runtime (cudart.h), NCCL is never linked: only a load that
 * shares its reads across a communicator (ckpt_load_set_group) loads it,
 * with dlopen, and looks up the calls below.  The caller's communicator
 * came from the NCCL the process already loaded (e.g. PyTorch's); dlopen by
 * file name returns that same library, so the communicator is valid here.
 *
 * The build does not need nccl.h: the few types and values used are
 * declared here and match NCCL 2's ABI (nccl.h of 2.28; these enum values
 * and signatures have not changed since 2.0, ncclMemAlloc since 2.19).
 *
 * Which library: $CKPT_NCCL_LIB when set (a path or a file name for
 * dlopen; the tests point it at their fake), else libnccl.so.2, else
 * libnccl.so.  A library older than NCCL_MIN_VERSION is refused.
 */
#ifndef CKPT_CUDA_NCCL_H
#define CKPT_CUDA_NCCL_H

#include <stddef.h>

#include <cuda_runtime_api.h>

/* ncclMemAlloc first appeared in 2.19.3 (ncclGetVersion: 10000 * major +
 * 100 * minor + patch from 2.9 on). */
#define NCCL_MIN_VERSION 21903

typedef struct ncclComm *ncclComm_t;

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
	ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclInt8 = 0, ncclUint8 = 1 } ncclDataType_t;

struct nccl {
	char path[256]; /* the name it was loaded by */
	int version;    /* ncclGetVersion */
	ncclResult_t (*GetVersion)(int *version);
	const char *(*GetErrorString)(ncclResult_t result);
	ncclResult_t (*CommCount)(const ncclComm_t comm, int *count);
	ncclResult_t (*CommUserRank)(const ncclComm_t comm, int *rank);
	ncclResult_t (*GroupStart)(void);
	ncclResult_t (*GroupEnd)(void);
	ncclResult_t (*Send)(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
			     ncclComm_t comm, cudaStream_t stream);
	ncclResult_t (*Recv)(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
			     ncclComm_t comm, cudaStream_t stream);
	ncclResult_t (*AllGather)(const void *sendbuff, void *recvbuff, size_t sendcount,
				  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
	/* Device memory of the current device (what the staging buffers
	 * are): NCCL's own allocator, so cudart.h needs no cudaMalloc. */
	ncclResult_t (*MemAlloc)(void **ptr, size_t size);
	ncclResult_t (*MemFree)(void *ptr);
};

/*
 * Returns NCCL, loading it on the first call (thread-safe; a failure is
 * remembered, so later calls fail at once with the same reason).  NULL with
 * the reason in err (dlopen's or dlsym's message, or the version) when it
 * cannot be loaded.  It stays loaded until the process exits.
 */
const struct nccl *nccl_get(char *err, size_t errlen);

/* Formats a failed call for the user (nothing if buf is NULL or len is 0):
 * "ncclSend(3 bytes to rank 2): unhandled system error (...)".  call_fmt is
 * printf-style. */
void nccl_errmsg(const struct nccl *nc, ncclResult_t e, char *buf, size_t len,
		 const char *call_fmt, ...) __attribute__((format(printf, 5, 6)));

/* The negative errno for an NCCL result (the message keeps NCCL's words). */
int nccl_errno(ncclResult_t e);

#endif
