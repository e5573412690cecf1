/* SPDX-License-Identifier: MIT */
/*
 * fake_nccl.h - the test hooks of the fake NCCL (fake_nccl.c).  Tests reach
 * them with dlsym on the handle libckpt loaded ($CKPT_NCCL_LIB), so that
 * they act on the same instance; these are their types.
 */
#ifndef CKPT_TESTS_FAKE_NCCL_H
#define CKPT_TESTS_FAKE_NCCL_H

struct ncclComm;

/* Makes n communicators of one new world (ranks are threads of this
 * process): comms[r] is rank r's.  Returns 0, or -1 (n < 1, no memory). */
int fake_nccl_comm_create(int n, struct ncclComm **comms);
/* Frees the communicators comm_create made (all n of them at once). */
void fake_nccl_comm_destroy(struct ncclComm **comms, int n);
/* The n-th next call of `call` (its name without "nccl", e.g. "CommCount")
 * returns `result` (an ncclResult_t); n = 0 disarms. */
void fake_nccl_fail(const char *call, long n, int result);
/* Counts so far: "sends", "recvs", "p2p_bytes" (bytes received),
 * "allgathers" (calls), "groups" (outermost ncclGroupEnd calls); "allocs":
 * ncclMemAlloc buffers live.  -1 for another name. */
long fake_nccl_stat(const char *what);
/* Zeroes the counts (not "allocs"). */
void fake_nccl_reset_stats(void);

#endif
