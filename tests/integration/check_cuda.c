/* SPDX-License-Identifier: MIT */
/*
 * check_cuda.c - integration: device tensors saved through a real ckptd with
 * the CUDA copy engine, against the fake CUDA runtime of tests/fakes/ (these
 * machines have no GPU).  The fake's "device memory" is host memory it
 * tracks, its streams run in order and honour event waits, and its "kernel"
 * writes a byte after a delay: so a save issued right behind a slow kernel
 * shows whether the copy waited for the trainer's work.  One case uses the
 * toolkit's real runtime, which has no driver here.
 */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "ckpt.h"
#include "tests/lib/testd.h"

#ifdef CKPT_HAVE_CUDA
#include "client/internal.h"
#include "cuda/cudart.h"
#include "store/store.h"
#include "tests/fakes/fake_cudart.h"

#define MiB (1024ull * 1024ull)
#define WAIT_MS 60000

/* The fake runtime, loaded through the same path libckpt will load, so the
 * test and the library share its state. */
struct fake {
	cudaError_t (*malloc_)(void **, size_t);
	cudaError_t (*free_)(void *);
	cudaError_t (*stream_create)(cudaStream_t *, unsigned);
	cudaError_t (*stream_destroy)(cudaStream_t);
	cudaError_t (*set_device)(int);
	__typeof__(fake_cuda_kernel) *kernel;
	__typeof__(fake_cuda_fail) *fail_at;
	__typeof__(fake_cuda_stat) *stat;
	__typeof__(fake_cuda_idle) *idle;
};

static struct fake fake_load(void)
{
	static char path[TD_PATH];
	struct fake f;
	void *dl;

	td_path(path, sizeof(path), "%s/tests/libfakecudart.so", td_build_dir());
	setenv("CKPT_CUDART", path, 1);
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	ck_assert_msg(dl, "%s", dlerror());
#define SYM(field, name) ck_assert_ptr_nonnull(*(void **)&f.field = dlsym(dl, name))
	SYM(malloc_, "cudaMalloc");
	SYM(free_, "cudaFree");
	SYM(stream_create, "cudaStreamCreateWithFlags");
	SYM(stream_destroy, "cudaStreamDestroy");
	SYM(set_device, "cudaSetDevice");
	SYM(kernel, "fake_cuda_kernel");
	SYM(fail_at, "fake_cuda_fail");
	SYM(stat, "fake_cuda_stat");
	SYM(idle, "fake_cuda_idle");
#undef SYM
	return f;
}

static struct ckpt_client *connect_pin(const struct testd *t, enum ckpt_cuda_pin pin,
				       uint64_t arena, int *ret_rc)
{
	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT, .socket_path = td_sock(t, 0),
				       .job = "gpujob", .world = 1, .arena_bytes = arena,
				       .cuda_pin = pin };
	struct ckpt_client *c = NULL;
	int rc = ckpt_connect(&o, &c);

	if (ret_rc)
		*ret_rc = rc;
	else
		ck_assert_msg(rc == 0, "ckpt_connect = %d: %s", rc, ckpt_last_error());
	return rc == 0 ? c : NULL;
}

static struct ckpt_tensor dev_tensor(const char *name, const uint64_t *shape, const void *data,
				     int dev, cudaStream_t st)
{
	struct ckpt_tensor t = { CKPT_TENSOR_INIT, .name = name, .dtype = CKPT_U8, .ndim = 1,
				 .shape = shape, .data = data, .device = CKPT_DEVICE_CUDA,
				 .device_index = dev, .cuda_stream = st };
	return t;
}

static void add_ok(struct ckpt_save *s, const struct ckpt_tensor *t)
{
	int rc = ckpt_save_add_tensor(s, t);

	ck_assert_msg(rc == 0, "add '%s' = %d: %s", t->name, rc, ckpt_last_error());
}

static void commit_ok(struct ckpt_save *s, const char *what)
{
	char msg[1024];
	int st, cm, r = td_commit_wait(s, WAIT_MS, &st, &cm, msg, sizeof(msg));

	ck_assert_msg(r == 0 && st == 0 && cm == 0, "%s: commit %d, staged %d, committed %d: %s",
		      what, r, st, cm, msg);
}

/* Every byte of tensor `name` in <root>/<ckpt> equals `want`. */
static void assert_bytes(const struct testd *t, const char *ckpt, const char *name, size_t len,
			 int want)
{
	struct ckpt_reader *r;
	unsigned char *buf = malloc(len);
	char p[TD_PATH];
	int rc;

	ck_assert_ptr_nonnull(buf);
	td_path(p, sizeof(p), "%s/%s", t->root, ckpt);
	rc = ckpt_reader_open(p, &r);
	ck_assert_msg(rc == 0, "open %s: %d %s", p, rc, ckpt_last_error());
	rc = ckpt_reader_read_tensor(r, name, buf, len);
	ck_assert_msg(rc == 0, "read %s: %d %s", name, rc, ckpt_last_error());
	for (size_t i = 0; i < len; i++)
		ck_assert_msg(buf[i] == want, "%s/%s byte %zu is 0x%02x, want 0x%02x", ckpt, name, i,
			      buf[i], want);
	ckpt_reader_close(r);
	free(buf);
}

/* ---- the copy waits for the trainer's stream --------------------------------- */

/*
 * The trainer fills three tensors with 0x11, then queues a 300 ms kernel on
 * its stream that sets them to 0x22 and saves at once: the checkpoint must
 * hold 0x22.  Without the wait on the event recorded at commit, the copy
 * stream (non-blocking, so not ordered after any other stream) would copy
 * 0x11: run by hand with cuxfer_copy's cudaStreamWaitEvent removed, this
 * test fails.  Also: the save call does not wait for the kernel.
 */
START_TEST(test_waits_for_caller_stream)
{
	const size_t len = 8 * MiB;
	const uint64_t shape[1] = { len };
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s;
	struct ckpt_future *st, *cm;
	cudaStream_t trainer;
	unsigned char *dev[3];
	char name[3][16];
	int64_t t0;

	td_init(&t, "waits_for_caller_stream");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\n"), 0);
	c = connect_pin(&t, CKPT_CUDA_PIN_AUTO, 64 * MiB, NULL);
	ck_assert_int_eq(f.stream_create(&trainer, cudaStreamNonBlocking), cudaSuccess);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(f.malloc_((void **)&dev[i], len), cudaSuccess);
		ck_assert_int_eq(f.kernel(dev[i], len, 0x11, 0, trainer), cudaSuccess);
	}
	f.idle();

	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(f.kernel(dev[i], len, 0x22, i == 0 ? 300000 : 0, trainer),
				 cudaSuccess);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "ordered", 1, &s), 0);
	ck_assert_int_eq(ckpt_save_set_cuda_stream(s, trainer), 0);
	for (int i = 0; i < 3; i++) {
		struct ckpt_tensor ten;

		snprintf(name[i], sizeof(name[i]), "w%d", i);
		ten = dev_tensor(name[i], shape, dev[i], 0, NULL); /* the save's stream */
		add_ok(s, &ten);
	}
	long waits = f.stat("waits");

	t0 = td_now_ms();
	ck_assert_int_eq(ckpt_save_commit(s, &st, &cm), 0);
	ck_assert_msg(td_now_ms() - t0 < 250, "the commit call waited for the kernel");
	ck_assert_int_eq(ckpt_future_wait(cm, WAIT_MS), 0);
	ckpt_save_free(s);
	/* The copy stream was made to wait (the bytes checked below say it
	 * waited for the right thing). */
	ck_assert_int_ge(f.stat("waits") - waits, 1);
	/* The arena was pinned at the first device tensor (AUTO). */
	ck_assert_int_eq(f.stat("registered"), 1);
	ckpt_disconnect(c);
	ck_assert_int_eq(f.stat("registered"), 0);

	for (int i = 0; i < 3; i++)
		assert_bytes(&t, "ordered", name[i], len, 0x22);
	f.idle();
	ck_assert_int_eq(f.stream_destroy(trainer), cudaSuccess);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(f.free_(dev[i]), cudaSuccess);
	/* The library's copy stream and events are gone with the client. */
	ck_assert_int_eq(f.stat("streams"), 0);
	ck_assert_int_eq(f.stat("events"), 0);
	td_fini(&t);
}
END_TEST

/*
 * Restore's direction through a client: bytes from the arena to a device
 * buffer, after a slow kernel the trainer queued on that buffer; refused
 * for memory that is not on the device named.
 */
START_TEST(test_h2d_through_client)
{
	const size_t len = 4 * MiB;
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_client *c;
	cudaStream_t trainer;
	unsigned char *dev, *src = malloc(len);
	char err[512];

	ck_assert_ptr_nonnull(src);
	for (size_t i = 0; i < len; i++)
		src[i] = (unsigned char)(i * 13 + 5);
	td_init(&t, "h2d_through_client");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 64M\n"), 0);
	c = connect_pin(&t, CKPT_CUDA_PIN_AUTO, 64 * MiB, NULL);
	ck_assert_int_eq(f.set_device(1), cudaSuccess);
	ck_assert_int_eq(f.malloc_((void **)&dev, len), cudaSuccess);
	ck_assert_int_eq(f.stream_create(&trainer, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(f.kernel(dev, len, 0x33, 200000, trainer), cudaSuccess);
	ck_assert_int_eq(cli_cuda_h2d(c, 1, dev, src, len, trainer, err, sizeof(err)), 0);
	f.idle();
	ck_assert_int_eq(memcmp(dev, src, len), 0);
	/* Named as device 0, or longer than the allocation: refused. */
	ck_assert_int_lt(cli_cuda_h2d(c, 0, dev, src, len, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(cli_cuda_h2d(c, 1, dev, src, len + 1, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(f.stream_destroy(trainer), cudaSuccess);
	ck_assert_int_eq(f.free_(dev), cudaSuccess);
	ckpt_disconnect(c);
	ck_assert_int_eq(f.stat("streams"), 0);
	free(src);
	td_fini(&t);
}
END_TEST

/*
 * Two tensors of one device in one extent, produced on two streams: each
 * copy waits for its own stream's work (the slow one is on the second
 * stream).  And the caller's current device is what it was after add,
 * commit and disconnect.
 */
START_TEST(test_two_streams_one_extent)
{
	const size_t len = 64 * 1024;
	const uint64_t shape[1] = { len };
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s;
	struct ckpt_tensor ten;
	cudaStream_t fast, slow;
	unsigned char *a, *b;
	int (*get_device)(int *);
	int cur = -1;

	*(void **)&get_device = dlsym(dlopen(getenv("CKPT_CUDART"), RTLD_NOW | RTLD_NOLOAD),
				      "cudaGetDevice");
	ck_assert_ptr_nonnull(get_device);
	td_init(&t, "two_streams_one_extent");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);
	ck_assert_int_eq(f.set_device(1), cudaSuccess);
	c = connect_pin(&t, CKPT_CUDA_PIN_AUTO, 16 * MiB, NULL);
	ck_assert_int_eq(f.stream_create(&fast, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(f.stream_create(&slow, cudaStreamNonBlocking), cudaSuccess);
	ck_assert_int_eq(f.set_device(0), cudaSuccess);
	ck_assert_int_eq(f.malloc_((void **)&a, len), cudaSuccess);
	ck_assert_int_eq(f.malloc_((void **)&b, len), cudaSuccess);
	ck_assert_int_eq(f.set_device(1), cudaSuccess);
	ck_assert_int_eq(f.kernel(a, len, 0x11, 0, fast), cudaSuccess);
	ck_assert_int_eq(f.kernel(b, len, 0x11, 0, slow), cudaSuccess);
	f.idle();
	ck_assert_int_eq(f.kernel(a, len, 0x22, 0, fast), cudaSuccess);
	ck_assert_int_eq(f.kernel(b, len, 0x33, 300000, slow), cudaSuccess);

	ck_assert_int_eq(ckpt_save_begin(c, t.root, "twostreams", 1, &s), 0);
	ten = dev_tensor("a", shape, a, 0, fast);
	add_ok(s, &ten);
	ten = dev_tensor("b", shape, b, 0, slow);
	add_ok(s, &ten);
	ck_assert_int_eq(get_device(&cur), cudaSuccess);
	ck_assert_int_eq(cur, 1);
	commit_ok(s, "two streams");
	ck_assert_int_eq(get_device(&cur), cudaSuccess);
	ck_assert_int_eq(cur, 1);
	ckpt_save_free(s);
	ckpt_disconnect(c);
	ck_assert_int_eq(get_device(&cur), cudaSuccess);
	ck_assert_int_eq(cur, 1);
	assert_bytes(&t, "twostreams", "a", len, 0x22);
	assert_bytes(&t, "twostreams", "b", len, 0x33);
	f.idle();
	ck_assert_int_eq(f.stream_destroy(fast), cudaSuccess);
	ck_assert_int_eq(f.stream_destroy(slow), cudaSuccess);
	ck_assert_int_eq(f.free_(a), cudaSuccess);
	ck_assert_int_eq(f.free_(b), cudaSuccess);
	td_fini(&t);
}
END_TEST

/* ---- host and device tensors, two devices, larger than the arena ----------- */

/* A save of device 0's tensor, a host tensor and device 1's tensor. */
static struct ckpt_save *begin_mixed(struct ckpt_client *c, const struct testd *t,
				     const uint64_t *dshape, const uint64_t *hshape, void *dev0,
				     void *dev1, void *host)
{
	struct ckpt_save *s;
	struct ckpt_tensor ten;

	ck_assert_int_eq(ckpt_save_begin(c, t->root, "mixed", 2, &s), 0);
	ten = dev_tensor("d0", dshape, dev0, 0, NULL);
	add_ok(s, &ten);
	ten = (struct ckpt_tensor){ CKPT_TENSOR_INIT, .name = "h", .dtype = CKPT_U8, .ndim = 1,
				    .shape = hshape, .data = host };
	add_ok(s, &ten);
	ten = dev_tensor("d1", dshape, dev1, 1, NULL);
	add_ok(s, &ten);
	return s;
}

START_TEST(test_mixed_and_backpressure)
{
	/* 8 MiB arena, 36 MiB of tensors: the copies wait for slots. */
	const size_t dlen = 12 * MiB, hlen = 5 * MiB + 3;
	const uint64_t dshape[1] = { dlen }, hshape[1] = { hlen };
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s;
	unsigned char *dev0, *dev1, *host;
	struct ckpt_tensor ten;
	struct ckpt_reader *r;
	char p[TD_PATH];

	td_init(&t, "mixed_and_backpressure");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 8M\n"), 0);
	c = connect_pin(&t, CKPT_CUDA_PIN_ON, 8 * MiB, NULL);
	ck_assert_int_eq(f.stat("registered"), 1);

	ck_assert_int_eq(f.set_device(1), cudaSuccess);
	ck_assert_int_eq(f.malloc_((void **)&dev1, dlen), cudaSuccess);
	ck_assert_int_eq(f.set_device(0), cudaSuccess);
	ck_assert_int_eq(f.malloc_((void **)&dev0, dlen), cudaSuccess);
	host = malloc(hlen);
	ck_assert_ptr_nonnull(host);
	/* The fake's device memory is host memory: fill it directly. */
	td_fill(dev0, dlen, 7, 0);
	td_fill(dev1, dlen, 8, 0);
	td_fill(host, hlen, 9, 0);

	s = begin_mixed(c, &t, dshape, hshape, dev0, dev1, host);
	/* Memory of device 1 given as device 0's is refused, with the reason. */
	ten = dev_tensor("wrong", dshape, dev1, 0, NULL);
	ck_assert_int_eq(ckpt_save_add_tensor(s, &ten), -EINVAL);
	ck_assert_msg(strstr(ckpt_last_error(), "device 1, not 0"), "%s", ckpt_last_error());
	ckpt_save_free(s); /* that made the save incomplete: begin again */

	s = begin_mixed(c, &t, dshape, hshape, dev0, dev1, host);
	ck_assert_int_eq(ckpt_save_add_blob(s, "loader", "epoch=3", 7), 0);
	commit_ok(s, "mixed save");
	ckpt_save_free(s);
	ckpt_disconnect(c);
	ck_assert_int_eq(f.stat("registered"), 0);

	td_path(p, sizeof(p), "%s/mixed", t.root);
	ck_assert_int_eq(ckpt_reader_open(p, &r), 0);
	ck_assert_msg(td_verify_tensor(r, "d0", CKPT_U8, 1, dshape, 7), "d0 (see above)");
	ck_assert_msg(td_verify_tensor(r, "d1", CKPT_U8, 1, dshape, 8), "d1 (see above)");
	ck_assert_msg(td_verify_tensor(r, "h", CKPT_U8, 1, hshape, 9), "h (see above)");
	ckpt_reader_close(r);
	ck_assert_int_eq(f.free_(dev0), cudaSuccess);
	ck_assert_int_eq(f.free_(dev1), cudaSuccess);
	free(host);
	td_fini(&t);
}
END_TEST

/* ---- a failed copy fails both futures, with the CUDA error ------------------ */

START_TEST(test_copy_error)
{
	const size_t len = 6 * MiB;
	const uint64_t shape[1] = { len };
	static const struct {
		bool async;
		cudaError_t err;
		const char *name;
	} cases[] = {
		{ false, cudaErrorLaunchFailure, "cudaErrorLaunchFailure" },
		{ true, cudaErrorIllegalAddress, "cudaErrorIllegalAddress" },
	};
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s;
	unsigned char *dev;
	struct ckpt_tensor ten;
	char msg[1024], p[TD_PATH];
	int st, cm;

	td_init(&t, "copy_error");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 4M\n"), 0);
	c = connect_pin(&t, CKPT_CUDA_PIN_ON, 4 * MiB, NULL);
	ck_assert_int_eq(f.malloc_((void **)&dev, len), cudaSuccess);
	td_fill(dev, len, 3, 0);
	ten = dev_tensor("w", shape, dev, 0, NULL);

	/* The third copy fails: some extents were handed on already. */
	f.fail_at("MemcpyAsync", 3, cases[_i].err, cases[_i].async);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "broken", 1, &s), 0);
	add_ok(s, &ten);
	ck_assert_int_eq(td_commit_wait(s, WAIT_MS, &st, &cm, msg, sizeof(msg)), 0);
	ck_assert_msg(st < 0 && cm < 0, "staged %d committed %d", st, cm);
	ck_assert_msg(strstr(msg, cases[_i].name),
		      "the failure does not name %s: %s", cases[_i].name, msg);
	ckpt_save_free(s);
	td_path(p, sizeof(p), "%s/broken", t.root);
	ck_assert_msg(!td_exists(p), "a failed save left %s", p);
	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 10000), "work dir left");

	/* An asynchronous error is sticky, as on a real GPU; a synchronous
	 * one is not: the next save works. */
	if (!cases[_i].async) {
		ck_assert_int_eq(ckpt_save_begin(c, t.root, "fine", 2, &s), 0);
		add_ok(s, &ten);
		commit_ok(s, "save after a failed copy");
		ckpt_save_free(s);
	}
	ckpt_disconnect(c);
	ck_assert_int_eq(f.stat("registered"), 0);
	if (!cases[_i].async) {
		struct ckpt_reader *r;

		td_path(p, sizeof(p), "%s/fine", t.root);
		ck_assert_int_eq(ckpt_reader_open(p, &r), 0);
		ck_assert_msg(td_verify_tensor(r, "w", CKPT_U8, 1, shape, 3), "(see above)");
		ckpt_reader_close(r);
	}
	td_fini(&t);
}
END_TEST

/* ---- pinning: paired on every path ------------------------------------------ */

static int warned;

static void on_log(enum ckpt_log_level level, const char *msg, void *ud)
{
	(void)ud;
	if (level == CKPT_LOG_WARNING && strstr(msg, "unpinned memory") &&
	    strstr(msg, "cudaErrorMemoryAllocation"))
		__atomic_add_fetch(&warned, 1, __ATOMIC_RELAXED);
}

START_TEST(test_pinning)
{
	struct fake f = fake_load();
	struct testd t;
	struct ckpt_client *c;
	int rc;

	td_init(&t, "pinning");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 16M\n"), 0);

	/* ON: pinned at connect, unpinned at disconnect. */
	c = connect_pin(&t, CKPT_CUDA_PIN_ON, 16 * MiB, NULL);
	ck_assert_int_eq(f.stat("registered"), 1);
	ckpt_disconnect(c);
	ck_assert_int_eq(f.stat("registered"), 0);

	/* ON, and pinning fails: the connect fails, says why, pins nothing. */
	f.fail_at("HostRegister", 1, cudaErrorMemoryAllocation, false);
	c = connect_pin(&t, CKPT_CUDA_PIN_ON, 16 * MiB, &rc);
	ck_assert_int_eq(rc, -ENOMEM);
	ck_assert_msg(strstr(ckpt_last_error(), "cudaHostRegister") &&
			      strstr(ckpt_last_error(), "cudaErrorMemoryAllocation"),
		      "%s", ckpt_last_error());
	ck_assert_int_eq(f.stat("registered"), 0);

	/* OFF: never pinned.  AUTO: not at connect, though the runtime is
	 * loaded in this process by now (a client that saves only host memory
	 * never pins). */
	c = connect_pin(&t, CKPT_CUDA_PIN_OFF, 16 * MiB, NULL);
	ck_assert_int_eq(f.stat("registered"), 0);
	ckpt_disconnect(c);
	c = connect_pin(&t, CKPT_CUDA_PIN_AUTO, 16 * MiB, NULL);
	ck_assert_int_eq(f.stat("registered"), 0);
	ckpt_disconnect(c);
	ck_assert_int_eq(f.stat("registered"), 0);

	/* AUTO, and pinning at the first device tensor fails: the tensor is
	 * added, the client warns once, and the save works from unpinned
	 * memory. */
	const uint64_t shape[1] = { 3 * MiB };
	struct ckpt_save *s;
	struct ckpt_tensor ten;
	unsigned char *dev;

	f.fail_at("HostRegister", 1, cudaErrorMemoryAllocation, false);
	warned = 0;
	ckpt_set_log_fn(on_log, NULL);
	c = connect_pin(&t, CKPT_CUDA_PIN_AUTO, 16 * MiB, NULL);
	ck_assert_int_eq(f.malloc_((void **)&dev, shape[0]), cudaSuccess);
	td_fill(dev, shape[0], 11, 0);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "unpinned", 1, &s), 0);
	ten = dev_tensor("w", shape, dev, 0, NULL);
	add_ok(s, &ten);
	ck_assert_int_eq(f.stat("registered"), 0);
	ck_assert_msg(warned == 1, "%d warnings about unpinned memory", warned);
	commit_ok(s, "unpinned save");
	ckpt_save_free(s);
	ckpt_disconnect(c);
	ckpt_set_log_fn(NULL, NULL);
	ck_assert_int_eq(f.stat("registered"), 0);
	{
		struct ckpt_reader *r;
		char p[TD_PATH];

		td_path(p, sizeof(p), "%s/unpinned", t.root);
		ck_assert_int_eq(ckpt_reader_open(p, &r), 0);
		ck_assert_msg(td_verify_tensor(r, "w", CKPT_U8, 1, shape, 11), "(see above)");
		ckpt_reader_close(r);
	}
	ck_assert_int_eq(f.free_(dev), cudaSuccess);
	td_fini(&t);
}
END_TEST

/* ---- a trainer killed mid-copy leaves nothing ------------------------------- */

START_TEST(test_killed_mid_copy)
{
	const size_t len = 16 * MiB;
	const uint64_t shape[1] = { len };
	struct testd t;
	char p[TD_PATH];
	pid_t pid;
	int status;

	td_init(&t, "killed_mid_copy");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 8M\n"), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* The trainer: its kernel takes 2 s, so the copies wait; it is
		 * killed while they do. */
		struct fake f = fake_load();
		struct ckpt_client *c = NULL;
		struct ckpt_save *s;
		struct ckpt_future *st, *cm;
		unsigned char *dev;
		struct ckpt_tensor ten;

		if (td_connect_rc(td_sock(&t, 0), "gpujob", 0, 1, 8 * MiB, &c) < 0 ||
		    f.malloc_((void **)&dev, len) != cudaSuccess ||
		    f.kernel(dev, len, 0x33, 2000000, NULL) != cudaSuccess ||
		    ckpt_save_begin(c, t.root, "killed", 1, &s) < 0)
			_exit(2);
		ten = dev_tensor("w", shape, dev, 0, NULL);
		if (ckpt_save_add_tensor(s, &ten) < 0 || ckpt_save_commit(s, &st, &cm) < 0)
			_exit(3);
		td_sleep_ms(300);
		kill(getpid(), SIGKILL);
		_exit(4);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "trainer status %d", status);
	td_path(p, sizeof(p), "%s/killed", t.root);
	ck_assert_msg(td_wait_count(t.root, STORE_WORK_PREFIX, 0, 20000),
		      "the killed trainer's work dir is still there");
	ck_assert_msg(!td_exists(p), "a checkpoint was committed for a trainer killed mid-copy");
	ck_assert(td_daemon_alive(&t, 0));
	td_fini(&t);
}
END_TEST

/* ---- the real runtime, without a driver -------------------------------------- */

START_TEST(test_real_runtime_no_driver)
{
	const uint64_t shape[1] = { 16 };
	char err[512];
	unsigned char host[16] = { 1, 2, 3 };
	struct testd t;
	struct ckpt_client *c;
	struct ckpt_save *s;
	struct ckpt_tensor ten;
	const struct cudart *rt;
	int n = 0, rc;

	unsetenv("CKPT_CUDART");
	rt = cudart_get(err, sizeof(err));
	if (!rt) {
		td_skip("test_real_runtime_no_driver", "no CUDA runtime in the loader's path: %s", err);
		return;
	}
	if (rt->GetDeviceCount(&n) == cudaSuccess && n > 0) {
		td_skip("test_real_runtime_no_driver", "a GPU is present: see tests/gpu/");
		return;
	}
	td_init(&t, "real_runtime_no_driver");
	ck_assert_int_eq(td_daemon_start(&t, 0, "arena_max = 4M\n"), 0);
	c = connect_pin(&t, CKPT_CUDA_PIN_AUTO, 4 * MiB, NULL);
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "gpu", 1, &s), 0);
	ten = dev_tensor("w", shape, (void *)0x1000, 0, NULL);
	rc = ckpt_save_add_tensor(s, &ten);
	ck_assert_int_eq(rc, -ENODEV);
	ck_assert_msg(strstr(ckpt_last_error(), "cudaGetDeviceCount") &&
			      strstr(ckpt_last_error(), rt->GetErrorName(rt->GetDeviceCount(&n))),
		      "%s", ckpt_last_error());
	ckpt_save_free(s);
	/* Host tensors still save. */
	ck_assert_int_eq(ckpt_save_begin(c, t.root, "host", 1, &s), 0);
	ten = (struct ckpt_tensor){ CKPT_TENSOR_INIT, .name = "h", .dtype = CKPT_U8, .ndim = 1,
				    .shape = shape, .data = host };
	add_ok(s, &ten);
	commit_ok(s, "host save with a driverless CUDA runtime");
	ckpt_save_free(s);
	/* AUTO with a runtime that has no device: connects, pins nothing. */
	ckpt_disconnect(c);
	td_fini(&t);
}
END_TEST

#else /* built without CUDA */

START_TEST(test_no_cuda)
{
	td_skip("cuda", "libckpt was built without CUDA (CUDA=0 or no toolkit headers)");
}
END_TEST
#endif

int main(void)
{
	Suite *s = suite_create("cuda");

#ifndef CKPT_HAVE_CUDA
	td_case(s, "no_cuda", test_no_cuda, 30, 0, 1);
#else

	td_case(s, "waits_for_caller_stream", test_waits_for_caller_stream, 120, 0, 1);
	td_case(s, "two_streams_one_extent", test_two_streams_one_extent, 120, 0, 1);
	td_case(s, "h2d_through_client", test_h2d_through_client, 120, 0, 1);
	td_case(s, "mixed_and_backpressure", test_mixed_and_backpressure, 120, 0, 1);
	td_case(s, "copy_error", test_copy_error, 120, 0, 2);
	td_case(s, "pinning", test_pinning, 120, 0, 1);
	td_case(s, "killed_mid_copy", test_killed_mid_copy, 120, 0, 1);
	td_case(s, "real_runtime_no_driver", test_real_runtime_no_driver, 120, 0, 1);
#endif
	return td_main(s, "check_cuda");
}
