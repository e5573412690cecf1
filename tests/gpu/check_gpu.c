/* SPDX-License-Identifier: MIT */
/*
 * check_gpu.c - the CUDA copy engine against the real runtime and a real GPU:
 * a save issued right behind work queued on the trainer's stream holds that
 * work's result, and device bytes read back exactly.  Every case reports
 * SKIP with the reason where the runtime or a GPU is missing (these
 * project's machines have none: check_cuda.c runs the same checks against
 * the fake runtime).
 *
 * The "slow kernel" is a host function queued on the stream that sleeps,
 * followed by a cudaMemsetAsync: work the copy must wait for, with no
 * kernel to compile.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>

#include "ckpt.h"
#include "tests/lib/testd.h"

#ifdef CKPT_HAVE_CUDA
#include "cuda/cudart.h"

#define MiB (1024ull * 1024ull)
#define WAIT_MS 60000

struct gpu {
	const struct cudart *rt;
	__typeof__(cudaMalloc) *malloc_;
	__typeof__(cudaFree) *free_;
	__typeof__(cudaMemset) *memset_;
	__typeof__(cudaMemsetAsync) *memset_async;
	__typeof__(cudaMemcpy) *memcpy_;
	__typeof__(cudaLaunchHostFunc) *host_func;
	__typeof__(cudaStreamSynchronize) *sync;
};

/* The real runtime with a device, or false after a SKIP line. */
static bool gpu_open(const char *test, struct gpu *g)
{
	char err[512];
	int n = 0;
	cudaError_t e;
	void *dl;

	unsetenv("CKPT_CUDART");
	g->rt = cudart_get(err, sizeof(err));
	if (!g->rt) {
		td_skip(test, "no CUDA runtime: %s", err);
		return false;
	}
	e = g->rt->GetDeviceCount(&n);
	if (e != cudaSuccess || n < 1) {
		td_skip(test, "no GPU: cudaGetDeviceCount: %s (%s)", g->rt->GetErrorName(e),
			g->rt->GetErrorString(e));
		return false;
	}
	dl = dlopen(g->rt->path, RTLD_NOW | RTLD_NOLOAD);
	ck_assert_msg(dl, "%s", dlerror());
#define SYM(field, name) ck_assert_ptr_nonnull(*(void **)&g->field = dlsym(dl, name))
	SYM(malloc_, "cudaMalloc");
	SYM(free_, "cudaFree");
	SYM(memset_, "cudaMemset");
	SYM(memset_async, "cudaMemsetAsync");
	SYM(memcpy_, "cudaMemcpy");
	SYM(host_func, "cudaLaunchHostFunc");
	SYM(sync, "cudaStreamSynchronize");
#undef SYM
	return true;
}

static void CUDART_CB sleep_300ms(void *ud)
{
	(void)ud;
	usleep(300000); /* no CUDA call in a host function */
}

static struct ckpt_client *connect_gpu(const struct testd *t, uint64_t arena)
{
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT, .socket_path = td_sock(t, 0),
				       .job = "gpujob", .world = 1, .arena_bytes = arena,
				       .cuda_pin = CKPT_CUDA_PIN_ON };
	struct ckpt_client *c = NULL;
	int rc = ckpt_connect(&o, &c);

	ck_assert_msg(rc == 0, "ckpt_connect = %d: %s", rc, ckpt_last_error());
	return c;
}

START_TEST(test_gpu_waits_for_caller_stream)
{
	const size_t len = 64 * MiB;
	const uint64_t shape[1] = { len };
	struct gpu g;
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	struct ckpt_reader *r;
	cudaStream_t trainer;
	unsigned char *dev, *back;
	char p[TD_PATH];

	if (!gpu_open("test_gpu_waits_for_caller_stream", &g))
		return;
	td_init(&t, "gpu_waits");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 256M\n"), 0);
	c = connect_gpu(&t, 256 * MiB);
	ck_assert_int_eq(g.rt->StreamCreateWithFlags(&trainer, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(g.malloc_((void **)&dev, len), cudaSuccess);
	ck_assert_int_eq(g.memset_(dev, 0x11, len), cudaSuccess);
	/* cudaMemset may return before it is done, and the trainer's
	 * non-blocking stream is not ordered after the legacy stream. */
	ck_assert_int_eq(g.rt->StreamSynchronize(NULL), cudaSuccess);

	ck_assert_int_eq(g.host_func(trainer, sleep_300ms, NULL), cudaSuccess);
	ck_assert_int_eq(g.memset_async(dev, 0x22, len, trainer), cudaSuccess);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "ordered", 1, &s), 0);
	struct ckpt_tensor ten = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_U8, .ndim = 1,
				   .shape = shape, .data = dev, .device = CKPT_DEVICE_CUDA,
				   .device_index = 0, .cuda_stream = trainer };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ten), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(ckpt_future_wait(cm, WAIT_MS), 0);
	ckpt_save_free(s);
	ckpt_disconnect(c);

	back = malloc(len);
	ck_assert_ptr_nonnull(back);
	td_path(p, sizeof(p), "%s/ordered", t.root);
	ck_assert_int_eq(ckpt_reader_open(p, &r), 0);
	ck_assert_int_eq(ckpt_reader_read_tensor(r, "w", back, len), 0);
	for (size_t i = 0; i < len; i++)
		ck_assert_msg(back[i] == 0x22, "byte %zu is 0x%02x: the copy did not wait", i, back[i]);
	ckpt_reader_close(r);
	free(back);
	ck_assert_int_eq(g.sync(trainer), cudaSuccess);
	ck_assert_int_eq(g.rt->StreamDestroy(trainer), cudaSuccess);
	ck_assert_int_eq(g.free_(dev), cudaSuccess);
	td_fini(&t);
}
END_TEST

/* 3x the arena of patterned device bytes, read back exactly. */
START_TEST(test_gpu_round_trip)
{
	const size_t len = 96 * MiB;
	const uint64_t shape[1] = { len };
	struct gpu g;
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	struct ckpt_reader *r;
	unsigned char *dev, *host;
	char p[TD_PATH];

	if (!gpu_open("test_gpu_round_trip", &g))
		return;
	td_init(&t, "gpu_round_trip");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 32M\n"), 0);
	c = connect_gpu(&t, 32 * MiB);
	host = malloc(len);
	ck_assert_ptr_nonnull(host);
	td_fill(host, len, 77, 0);
	ck_assert_int_eq(g.malloc_((void **)&dev, len), cudaSuccess);
	ck_assert_int_eq(g.memcpy_(dev, host, len, cudaMemcpyHostToDevice), cudaSuccess);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "trip", 1, &s), 0);
	struct ckpt_tensor ten = { CKPT_TENSOR_INIT, .name = "w", .dtype = CKPT_U8, .ndim = 1,
				   .shape = shape, .data = dev, .device = CKPT_DEVICE_CUDA };
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ten), 0);
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_int_eq(ckpt_future_wait(cm, WAIT_MS), 0);
	ckpt_save_free(s);
	ckpt_disconnect(c);
	td_path(p, sizeof(p), "%s/trip", t.root);
	ck_assert_int_eq(ckpt_reader_open(p, &r), 0);
	ck_assert_msg(td_verify_tensor(r, "w", CKPT_U8, 1, shape, 77), "(see above)");
	ckpt_reader_close(r);
	ck_assert_int_eq(g.free_(dev), cudaSuccess);
	free(host);
	td_fini(&t);
}
END_TEST
#else

START_TEST(test_gpu_no_cuda)
{
	td_skip("gpu", "libckpt was built without CUDA (CUDA=0 or no toolkit headers)");
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("gpu");

#ifdef CKPT_HAVE_CUDA
	td_case(s, "gpu_waits_for_caller_stream", test_gpu_waits_for_caller_stream, 120, 0, 1);
	td_case(s, "gpu_round_trip", test_gpu_round_trip, 120, 0, 1);
#else
	td_case(s, "gpu_no_cuda", test_gpu_no_cuda, 30, 0, 1);
#endif
	return td_main(s, "check_gpu");
}
