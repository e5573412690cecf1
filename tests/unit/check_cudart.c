/* SPDX-License-Identifier: MIT */
/*
 * check_cudart.c - loading the CUDA runtime at run time (cuda/cudart.c), and
 * the fake runtime the CUDA tests stand on (tests/fakes/fake_cudart.c): its
 * streams run in order and honour cudaStreamWaitEvent, so a test built on it
 * can tell a copy that waited for the trainer's work from one that did not.
 *
 * cudart_get() loads once per process; Check runs each test in a process of
 * its own, so each test sets $CKPT_CUDART before its first call.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CKPT_HAVE_CUDA
#include "cuda/cudart.h"
#include "cuda/cuxfer.h"

static char fake_path[4096];

static void use_fake(void)
{
	const char *b = getenv("CKPT_BUILD_DIR");

	snprintf(fake_path, sizeof(fake_path), "%s/tests/libfakecudart.so", b ? b : "build");
	setenv("CKPT_CUDART", fake_path, 1);
}

/* The fake's test hooks, from the handle libckpt's loader opened. */
static void *hook(const char *name)
{
	void *dl = dlopen(fake_path, RTLD_NOW | RTLD_NOLOAD);
	void *f;

	ck_assert_msg(dl, "the fake runtime is not loaded: %s", dlerror());
	f = dlsym(dl, name);
	ck_assert_msg(f, "no %s in the fake runtime", name);
	dlclose(dl);
	return f;
}

START_TEST(test_missing_library)
{
	char err[512];

	setenv("CKPT_CUDART", "/nonexistent/libcudart.so.99", 1);
	ck_assert_ptr_null(cudart_get(err, sizeof(err)));
	ck_assert_msg(strstr(err, "$CKPT_CUDART='/nonexistent/libcudart.so.99'"), "err: %s", err);
	/* Remembered: the second call fails the same way without retrying. */
	err[0] = 0;
	ck_assert_ptr_null(cudart_get(err, sizeof(err)));
	ck_assert_msg(strstr(err, "/nonexistent/libcudart.so.99"), "err: %s", err);
}
END_TEST

START_TEST(test_not_a_runtime)
{
	char err[512];

	/* Loads, but has none of the calls. */
	setenv("CKPT_CUDART", "libm.so.6", 1);
	ck_assert_ptr_null(cudart_get(err, sizeof(err)));
	ck_assert_msg(strstr(err, "'libm.so.6' has no cudaRuntimeGetVersion"), "err: %s", err);
}
END_TEST

START_TEST(test_fake_loads)
{
	char err[512], msg[256];
	const struct cudart *rt;
	int n = -1;

	use_fake();
	rt = cudart_get(err, sizeof(err));
	ck_assert_msg(rt, "%s", err);
	ck_assert_str_eq(rt->path, fake_path);
	ck_assert_int_eq(rt->version, CUDART_VERSION);
	ck_assert_int_eq(rt->GetDeviceCount(&n), cudaSuccess);
	ck_assert_int_eq(n, 2);

	cudaError_t e = rt->SetDevice(7);
	ck_assert_int_eq(cudart_errno(e), -ENODEV);
	cudart_errmsg(rt, e, msg, sizeof(msg), "cudaSetDevice(%d)", 7);
	ck_assert_str_eq(msg, "cudaSetDevice(7): cudaErrorInvalidDevice (invalid device ordinal)");
}
END_TEST

/* The real runtime of the toolkit, where the loader finds it.  On these
 * machines there is no driver: the first call that needs one fails with
 * the runtime's own error, which is what a user of a CPU-only node sees. */
START_TEST(test_real_runtime)
{
	char err[512], msg[256];
	const struct cudart *rt;
	cudaError_t e;
	int n = -1;

	unsetenv("CKPT_CUDART");
	rt = cudart_get(err, sizeof(err));
	if (!rt) {
		printf("SKIP: [test_real_runtime] no CUDA runtime in the loader's path: %s\n", err);
		return;
	}
	ck_assert_msg(rt->version / 1000 == CUDART_VERSION / 1000, "loaded %s version %d, built against %d",
		      rt->path, rt->version, CUDART_VERSION);
	e = rt->GetDeviceCount(&n);
	if (e == cudaSuccess && n > 0) {
		printf("SKIP: [test_real_runtime] a GPU is present (%d): the no-driver case cannot be "
		       "checked here (tests/gpu/ covers it)\n", n);
		return;
	}
	cudart_errmsg(rt, e, msg, sizeof(msg), "cudaGetDeviceCount");
	ck_assert_msg(e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice, "%s", msg);
	ck_assert_int_eq(cudart_errno(e), -ENODEV);
	/* The runtime's own words, not ours. */
	ck_assert_msg(strstr(msg, rt->GetErrorString(e)) && strstr(msg, rt->GetErrorName(e)), "%s", msg);
}
END_TEST

/* ---- the fake's semantics ---- */

struct fake {
	const struct cudart *rt;
	cudaError_t (*malloc_)(void **, size_t);
	cudaError_t (*free_)(void *);
	cudaError_t (*kernel)(void *, size_t, int, unsigned, cudaStream_t);
	void (*fail_at)(const char *, long, cudaError_t, bool);
	long (*stat)(const char *);
	void (*idle)(void);
};

static struct fake fake_open(void)
{
	struct fake f;
	char err[512];

	use_fake();
	f.rt = cudart_get(err, sizeof(err));
	ck_assert_msg(f.rt, "%s", err);
	*(void **)&f.malloc_ = hook("cudaMalloc");
	*(void **)&f.free_ = hook("cudaFree");
	*(void **)&f.kernel = hook("fake_cuda_kernel");
	*(void **)&f.fail_at = hook("fake_cuda_fail");
	*(void **)&f.stat = hook("fake_cuda_stat");
	*(void **)&f.idle = hook("fake_cuda_idle");
	return f;
}

/* A slow "kernel" on the trainer's stream, then a copy on another stream:
 * with the wait on an event recorded after the kernel, the copy sees the
 * kernel's bytes; without it, the bytes from before. */
static void ordering(bool wait)
{
	struct fake f = fake_open();
	const size_t len = 1 << 20;
	cudaStream_t trainer, copier;
	cudaEvent_t ev, done;
	unsigned char *dev, *host = malloc(len);

	ck_assert_ptr_nonnull(host);
	ck_assert_int_eq(f.malloc_((void **)&dev, len), cudaSuccess);
	ck_assert_int_eq(f.rt->StreamCreateWithFlags(&trainer, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(f.rt->StreamCreateWithFlags(&copier, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(f.rt->EventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
	ck_assert_int_eq(f.rt->EventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
	ck_assert_int_eq(f.kernel(dev, len, 0x11, 0, trainer), cudaSuccess);
	f.idle();
	ck_assert_int_eq(f.kernel(dev, len, 0x22, 200000, trainer), cudaSuccess);
	ck_assert_int_eq(f.rt->EventRecord(ev, trainer), cudaSuccess);
	if (wait)
		ck_assert_int_eq(f.rt->StreamWaitEvent(copier, ev, 0), cudaSuccess);
	ck_assert_int_eq(f.rt->MemcpyAsync(host, dev, len, cudaMemcpyDeviceToHost, copier), cudaSuccess);
	ck_assert_int_eq(f.rt->EventRecord(done, copier), cudaSuccess);
	ck_assert_int_eq(f.rt->EventSynchronize(done), cudaSuccess);
	ck_assert_int_eq(host[0], wait ? 0x22 : 0x11);
	ck_assert_int_eq(host[len - 1], wait ? 0x22 : 0x11);
	f.idle();
	ck_assert_int_eq(f.rt->EventDestroy(ev), cudaSuccess);
	ck_assert_int_eq(f.rt->EventDestroy(done), cudaSuccess);
	ck_assert_int_eq(f.rt->StreamDestroy(trainer), cudaSuccess);
	ck_assert_int_eq(f.rt->StreamDestroy(copier), cudaSuccess);
	ck_assert_int_eq(f.free_(dev), cudaSuccess);
	ck_assert_int_eq(f.stat("streams"), 0);
	ck_assert_int_eq(f.stat("events"), 0);
	ck_assert_int_eq(f.stat("allocs"), 0);
	free(host);
}

START_TEST(test_fake_wait_orders)
{
	ordering(true);
}
END_TEST

START_TEST(test_fake_no_wait_races)
{
#ifdef __SANITIZE_THREAD__
	/* The copy and the kernel race on purpose: what ThreadSanitizer is for. */
	printf("SKIP: [test_fake_no_wait_races] races on purpose; not under ThreadSanitizer\n");
#else
	ordering(false);
#endif
}
END_TEST

START_TEST(test_fake_checks_pointers)
{
	struct fake f = fake_open();
	struct cudaPointerAttributes a;
	char host[64], pinned[4096];
	void *dev;

	ck_assert_int_eq(f.malloc_(&dev, 64), cudaSuccess);
	/* A D2H copy from host memory, or past the allocation, is refused. */
	ck_assert_int_eq(f.rt->MemcpyAsync(host, host, 64, cudaMemcpyDeviceToHost, NULL),
			 cudaErrorInvalidValue);
	ck_assert_int_eq(f.rt->MemcpyAsync(host, dev, 65, cudaMemcpyDeviceToHost, NULL),
			 cudaErrorInvalidValue);
	ck_assert_int_eq(f.rt->PointerGetAttributes(&a, dev), cudaSuccess);
	ck_assert_int_eq(a.type, cudaMemoryTypeDevice);
	ck_assert_int_eq(f.rt->PointerGetAttributes(&a, host), cudaSuccess);
	ck_assert_int_eq(a.type, cudaMemoryTypeUnregistered);

	ck_assert_int_eq(f.rt->HostRegister(pinned, sizeof(pinned), cudaHostRegisterPortable), cudaSuccess);
	ck_assert_int_eq(f.rt->PointerGetAttributes(&a, pinned + 100), cudaSuccess);
	ck_assert_int_eq(a.type, cudaMemoryTypeHost);
	ck_assert_int_eq(f.rt->HostRegister(pinned + 1024, 16, 0), cudaErrorHostMemoryAlreadyRegistered);
	ck_assert_int_eq(f.rt->HostUnregister(pinned + 1), cudaErrorHostMemoryNotRegistered);
	ck_assert_int_eq(f.stat("registered"), 1);
	ck_assert_int_eq(f.rt->HostUnregister(pinned), cudaSuccess);
	ck_assert_int_eq(f.stat("registered"), 0);
	ck_assert_int_eq(f.free_(dev), cudaSuccess);
}
END_TEST

START_TEST(test_fake_fails_on_demand)
{
	struct fake f = fake_open();
	unsigned char host[64];
	cudaEvent_t ev;
	void *dev;

	ck_assert_int_eq(f.malloc_(&dev, 64), cudaSuccess);
	ck_assert_int_eq(f.rt->EventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
	/* The second call fails at once. */
	f.fail_at("MemcpyAsync", 2, cudaErrorLaunchFailure, false);
	ck_assert_int_eq(f.rt->MemcpyAsync(host, dev, 64, cudaMemcpyDeviceToHost, NULL), cudaSuccess);
	ck_assert_int_eq(f.rt->MemcpyAsync(host, dev, 64, cudaMemcpyDeviceToHost, NULL),
			 cudaErrorLaunchFailure);
	ck_assert_int_eq(f.rt->MemcpyAsync(host, dev, 64, cudaMemcpyDeviceToHost, NULL), cudaSuccess);
	/* An asynchronous failure: the call succeeds, the stream's next event
	 * reports it. */
	f.fail_at("MemcpyAsync", 1, cudaErrorIllegalAddress, true);
	ck_assert_int_eq(f.rt->MemcpyAsync(host, dev, 64, cudaMemcpyDeviceToHost, NULL), cudaSuccess);
	/* The copy may have failed already: then, as on a GPU, the record
	 * itself reports the (sticky) error. */
	cudaError_t rec = f.rt->EventRecord(ev, NULL);
	ck_assert_msg(rec == cudaSuccess || rec == cudaErrorIllegalAddress, "record: %d", rec);
	ck_assert_int_eq(f.rt->EventSynchronize(ev), cudaErrorIllegalAddress);
	ck_assert_int_eq(f.rt->EventQuery(ev), cudaErrorIllegalAddress);
	f.idle();
	ck_assert_int_eq(f.rt->EventDestroy(ev), cudaSuccess);
	ck_assert_int_eq(f.free_(dev), cudaSuccess);
}
END_TEST

/* ---- cuxfer: the engine's calls that check_cuda.c does not reach ---- */

/* Host to device (what restore will call), and the caller's current device
 * left alone by the calls made on the caller's thread. */
START_TEST(test_cuxfer_h2d_and_caller_device)
{
	struct fake f = fake_open();
	const size_t len = 3 << 20;
	unsigned char *arena = malloc(len), *dev;
	struct cuxfer *x;
	cudaEvent_t ev;
	char err[512];
	int cur = -1;

	ck_assert_ptr_nonnull(arena);
	for (size_t i = 0; i < len; i++)
		arena[i] = (unsigned char)(i * 7 + 1);
	ck_assert_int_eq(cuxfer_open(CUXFER_PIN_OFF, arena, len, &x, err, sizeof(err)), 0);
	ck_assert_int_eq(f.rt->SetDevice(1), cudaSuccess);
	ck_assert_int_eq(f.malloc_((void **)&dev, len), cudaSuccess);
	ck_assert_int_eq(cuxfer_check(x, dev, len, 1, err, sizeof(err)), 0);
	ck_assert_int_eq(cuxfer_check(x, dev, len + 1, 1, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(cuxfer_check(x, dev, len, 2, err, sizeof(err)), -ENODEV);
	ck_assert_msg(strstr(err, "device 2 does not exist"), "%s", err);
	ck_assert_int_eq(cuxfer_record_start(x, 0, NULL, &ev, err, sizeof(err)), 0);
	ck_assert_int_eq(f.rt->GetDevice(&cur), cudaSuccess);
	ck_assert_int_eq(cur, 1);
	cuxfer_start_free(x, ev);
	ck_assert_int_eq(cuxfer_h2d(x, 1, dev, arena, len, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(memcmp(dev, arena, len), 0); /* the fake's device memory is host memory */
	/* After the caller's queued work: a slow kernel on the caller's stream
	 * still writing dst when h2d is called does not land over the
	 * restored bytes (without the wait it would, 200 ms later). */
	{
		cudaStream_t trainer;

		ck_assert_int_eq(f.rt->StreamCreateWithFlags(&trainer, cudaStreamNonBlocking),
				 cudaSuccess);
		ck_assert_int_eq(f.kernel(dev, len, 0xEE, 200000, trainer), cudaSuccess);
		ck_assert_int_eq(cuxfer_h2d(x, 1, dev, arena, len, trainer, err, sizeof(err)), 0);
		ck_assert_int_eq(f.rt->StreamSynchronize(trainer), cudaSuccess);
		ck_assert_int_eq(memcmp(dev, arena, len), 0);
		ck_assert_int_eq(f.rt->StreamDestroy(trainer), cudaSuccess);
	}
	/* A copy into memory of another device is refused with the CUDA error. */
	ck_assert_int_eq(cuxfer_h2d(x, 1, arena, arena, 16, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "cudaErrorInvalidValue"), "%s", err);
	ck_assert_int_eq(cuxfer_pinned(x), false);
	cuxfer_close(x);
	ck_assert_int_eq(f.stat("streams"), 0);
	ck_assert_int_eq(f.free_(dev), cudaSuccess);
	free(arena);
}
END_TEST

#else /* built without CUDA: nothing to test, and the run says so */

START_TEST(test_no_cuda)
{
	printf("SKIP: [cudart] libckpt was built without CUDA (CUDA=0 or no toolkit headers)\n");
}
END_TEST
#endif

static Suite *suite(void)
{
	Suite *s = suite_create("cudart");
	TCase *tc = tcase_create("load");

#ifndef CKPT_HAVE_CUDA
	tcase_add_test(tc, test_no_cuda);
	suite_add_tcase(s, tc);
	return s;
#else

	tcase_add_test(tc, test_missing_library);
	tcase_add_test(tc, test_not_a_runtime);
	tcase_add_test(tc, test_fake_loads);
	tcase_add_test(tc, test_real_runtime);
	suite_add_tcase(s, tc);
	tc = tcase_create("fake");
	tcase_add_test(tc, test_fake_wait_orders);
	tcase_add_test(tc, test_fake_no_wait_races);
	tcase_add_test(tc, test_fake_checks_pointers);
	tcase_add_test(tc, test_fake_fails_on_demand);
	tcase_add_test(tc, test_cuxfer_h2d_and_caller_device);
	suite_add_tcase(s, tc);
	return s;
#endif
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
