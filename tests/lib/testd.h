/* SPDX-License-Identifier: MIT */
/*
 * testd.h - helpers for the integration tests, which start a real ckptd and
 * drive it through the real libckpt.
 *
 * Cleanup model.  The tests run under Check in fork mode: every test runs in
 * its own child process, and a failed ck_assert() ends that child with
 * _exit(), so no teardown code of the test runs.  Therefore:
 *   - every process a test starts (ckptd, helper ranks, ckptctl, python) gets
 *     PR_SET_PDEATHSIG = SIGKILL, so it dies with the test process;
 *   - td_main() makes the suite's main process a child subreaper, so those
 *     orphans are reaped by it, by PID, before it looks at the disk;
 *   - every test works in a private directory under one per-run base
 *     directory; a passing test removes its own directory (td_fini()), so
 *     whatever is left after srunner_run_all() belongs to a failed test:
 *     td_main() prints the tail of each daemon log found there, then removes
 *     the whole base directory (unless $CKPT_TEST_KEEP is set).
 *
 * Directory of a test:
 *   <base>/<test>-XXXXXX/          td->dir
 *       root/                      td->root, an allowed root of every daemon
 *       ckptd-N.conf, ckptd-N.log  config and stderr of daemon N
 *       ckptd-N.sock               its socket (elsewhere if the path is too
 *                                  long for sun_path, see td_init)
 *
 * All waits are bounded.  Functions return 0 or a negative errno as in the
 * rest of the project, and print what went wrong on stderr (tests may print).
 */
#ifndef CKPT_TESTS_TESTD_H
#define CKPT_TESTS_TESTD_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <check.h>

#include "ckpt.h"

#define TD_MAX_DAEMONS 4
#define TD_PATH 512

struct td_daemon {
	pid_t pid;               /* 0: not running */
	char conf[TD_PATH];
	char log[TD_PATH];
	char sock[TD_PATH];
	uint64_t fsize_limit;    /* set before starting: RLIMIT_FSIZE of the
	                          * daemon (what LimitFSIZE= sets), 0: none */
};

struct testd {
	char name[64];           /* test name, for messages */
	char dir[TD_PATH];       /* private directory of this test */
	char root[TD_PATH];      /* dir/root: allowed root of every daemon */
	char sockdir[TD_PATH];   /* where the sockets live (dir, or a short
	                          * directory under /tmp) */
	bool own_sockdir;        /* sockdir must be removed separately */
	struct td_daemon d[TD_MAX_DAEMONS];
};

/* ---- the suite's main ---------------------------------------------------- */

/*
 * Runs suite `s` in Check's fork mode with the cleanup model above, prints
 * the summary, and returns the exit status for main() (0 if all passed).
 * `prog` names the per-run base directory.
 */
int td_main(Suite *s, const char *prog);

/* Adds a test case `name` to s: test fn, run for _i in [lo, hi), with a
 * timeout of timeout_s seconds. */
void td_case(Suite *s, const char *name, const TTest *fn, int timeout_s, int lo, int hi);

/*
 * A check that cannot run here says so with td_skip() instead of passing
 * silently: it prints "SKIP: [NAME] reason" on stdout, which tests/run.sh
 * counts as a skip (once per NAME), not as a pass.  The test then returns.
 */
void td_skip(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- paths --------------------------------------------------------------- */

/* The build directory: $CKPT_BUILD_DIR, else the directory two levels above
 * this test binary ($(BUILD)/tests/check_x) if it holds ckptd, else "build"
 * under the source tree.  Borrowed, static. */
const char *td_build_dir(void);
/* The source tree: $CKPT_SRC_DIR, else the nearest directory upwards from the
 * current one or from the test binary that holds tests/tools/st_verify.py.
 * Borrowed, static; "." if not found. */
const char *td_src_dir(void);

/* ---- test directory and daemons ------------------------------------------ */

/* Creates the private directory of test `name` and its root/.  Returns 0 or
 * -errno.  ck_assert()s on failure, since nothing can go on. */
int td_init(struct testd *t, const char *name);

/*
 * Writes the config of daemon `idx` (socket, root = t->root, plus the
 * `extra` lines verbatim, e.g. "arena_max = 64M\ncommit_deadline = 2s\n";
 * NULL for none), starts `ckptd -c CONF -v` with stderr (and stdout) into
 * its log, and waits (bounded, 20 s) until its socket accepts a connection.
 * Fails with the log printed if ckptd exits or never listens.
 * Returns 0 or -errno.
 */
int td_daemon_start(struct testd *t, int idx, const char *extra);

/* Same, with the config written by the caller: `conf_text` is the whole
 * config except the socket line. */
int td_daemon_start_raw(struct testd *t, int idx, const char *conf_text);

/* Socket path of daemon idx. */
const char *td_sock(const struct testd *t, int idx);

/* True if daemon idx was started and has not exited (reaps it if it has,
 * printing how it ended and its log). */
bool td_daemon_alive(struct testd *t, int idx);

/*
 * Stops daemon idx: SIGTERM, up to 15 s for it to exit, then SIGKILL; reaps
 * it.  Returns its wait status (>= 0), or -ESRCH if it was not running.
 * Sets pid to 0.
 */
int td_daemon_stop(struct testd *t, int idx);

/* SIGKILLs daemon idx and reaps it (a crash, for tests). */
void td_daemon_kill(struct testd *t, int idx);

/* Prints the last `max` bytes of daemon idx's log to stderr. */
void td_dump_log(const struct testd *t, int idx, size_t max);

/* Appends the daemon log of idx to `out` (NUL-terminated, truncated to len)
 * for assertions on log content.  Returns bytes read or -errno. */
ssize_t td_read_log(const struct testd *t, int idx, char *out, size_t len);

/*
 * Ends a passing test: asserts every running daemon is still alive, stops
 * each and asserts it exited with status 0 on SIGTERM, then removes the
 * test directory.  (A failing test never gets here; td_main cleans up.)
 */
void td_fini(struct testd *t);

/* ---- files ----------------------------------------------------------------- */

/* Removes a file or a directory tree (no symlinks are followed).  Missing is
 * not an error.  Returns 0 or -errno. */
int td_rm_rf(const char *path);

/* Snprintf into a path buffer; ck_assert()s it fits.  Returns buf. */
char *td_path(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

bool td_exists(const char *path);

/* Number of entries of directory `dir` whose name starts with `prefix`
 * ("" counts all but . and ..); -errno if it cannot be read. */
int td_count_entries(const char *dir, const char *prefix);

/* Polls (every 20 ms, at most timeout_ms) until td_exists(path) == want.
 * Returns true if it got there. */
bool td_wait_exists(const char *path, bool want, int timeout_ms);

/* Polls until td_count_entries(dir, prefix) == want. */
bool td_wait_count(const char *dir, const char *prefix, int want, int timeout_ms);

/* Reads a whole file (at most max bytes) into a malloc'd NUL-terminated
 * buffer.  Returns 0 and *ret, or -errno (-EFBIG if larger). */
int td_read_file(const char *path, size_t max, char **ret, size_t *ret_len);

int td_write_file(const char *path, const char *text);

/* ---- processes ------------------------------------------------------------- */

/* Milliseconds on CLOCK_MONOTONIC. */
int64_t td_now_ms(void);
void td_sleep_ms(int ms);

/*
 * Runs argv (argv[0] a path; no PATH search) with stdout and stderr captured
 * into a malloc'd NUL-terminated *ret_out (may be NULL to discard), at most
 * timeout_ms (then SIGKILL).  Returns the wait status (>= 0), or -ETIMEDOUT
 * (killed at the time limit; output so far still returned), or -errno.
 */
int td_run_capture(char *const argv[], int timeout_ms, char **ret_out);

/*
 * A helper process (a trainer rank): forked, runs fn(arg, report_fd, go_fd)
 * and _exit()s with its return value.  It must not use ck_assert (the parent
 * asserts on what it reports).  report_fd: lines for the parent (td_report);
 * go_fd: bytes from the parent (td_child_go / td_wait_go).
 *
 * Fork only while this process has no libckpt client (no library threads).
 */
struct td_child {
	pid_t pid;
	int rd;           /* parent's end of the report pipe */
	int go;           /* parent's end of the go pipe */
	char out[16384];  /* everything reported so far, NUL-terminated */
	size_t len;
	bool eof;
	int status;       /* wait status once reaped */
	bool reaped;
};

typedef int (*td_child_fn)(void *arg, int report_fd, int go_fd);

/* Starts the child.  Returns 0 or -errno. */
int td_child_start(struct td_child *c, td_child_fn fn, void *arg);

/* Child side: writes one line "fmt\n" to report_fd (atomic for short lines). */
void td_report(int report_fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Child side: waits for one byte from the parent; returns 0, -ETIMEDOUT, or
 * -EPIPE if the parent closed its end. */
int td_wait_go(int go_fd, int timeout_ms);

/* Parent side: sends one go byte.  Returns 0 or -errno. */
int td_child_go(struct td_child *c);

/*
 * Parent side: reads reports until a line starting with `prefix` has
 * arrived (already-received lines count), at most timeout_ms.  If `rest` is
 * not NULL, the remainder of that line (after the prefix and one space) is
 * copied there.  Returns 0, -ETIMEDOUT, or -EPIPE (the child closed its end
 * without sending it).
 */
int td_child_expect(struct td_child *c, const char *prefix, int timeout_ms, char *rest,
		    size_t restlen);

/* Parent side: waits at most timeout_ms for the child to exit (SIGKILL after
 * that), reading its reports meanwhile.  Returns its wait status (>= 0) or
 * -ETIMEDOUT (it was killed).  Closes the pipes. */
int td_child_wait(struct td_child *c, int timeout_ms);

/* SIGKILLs the child and reaps it. */
void td_child_kill(struct td_child *c);

/* "exit 0", "exit 3", "signal 9 (Killed)" for a wait status, static buffer. */
const char *td_status_str(int status);

/* ---- data patterns --------------------------------------------------------- */

/*
 * A deterministic byte stream per seed: byte i of stream `seed` is byte
 * (i % 8) (little-endian) of word w(i / 8), where
 *     w(k) = x ^ (x >> 31),  x = (k + 1) * 0x9E3779B97F4A7C15
 *                                + seed * 0xC2B2AE3D27D4EB4F   (mod 2^64).
 * tests/tools/st_verify.py computes the same stream with numpy.
 *
 * td_fill writes stream bytes [off, off + len) into buf; td_check compares
 * and returns -1 if equal, else the index in buf of the first difference.
 */
void td_fill(void *buf, size_t len, uint64_t seed, uint64_t off);
int64_t td_check(const void *buf, size_t len, uint64_t seed, uint64_t off);

/*
 * A chunk (shape at offs) of a global row-major tensor (gshape, elem bytes
 * per element) whose bytes are stream `seed`: td_fill_chunk writes the
 * chunk's bytes as the sharded tensor would hold them.
 */
void td_fill_chunk(void *buf, size_t elem, unsigned ndim, const uint64_t *gshape,
		   const uint64_t *offs, const uint64_t *shape, uint64_t seed);

/* Product of shape times elem. */
uint64_t td_nbytes(size_t elem, unsigned ndim, const uint64_t *shape);

/* safetensors name and element size of a dtype (independent of libckpt). */
const char *td_dtype_name(enum ckpt_dtype dt);
size_t td_dtype_size(enum ckpt_dtype dt);

/* ---- libckpt conveniences ------------------------------------------------- */

/* Connects rank/world of job to socket sock with arena_bytes.  ck_assert()s
 * success (test process only, not in children). */
struct ckpt_client *td_connect(const char *sock, const char *job, uint32_t rank, uint32_t world,
			       uint64_t arena_bytes);

/* Non-asserting form for helper processes: returns 0 or -errno. */
int td_connect_rc(const char *sock, const char *job, uint32_t rank, uint32_t world,
		  uint64_t arena_bytes, struct ckpt_client **ret);

/* Adds an unsharded tensor; asserts success. */
void td_add(struct ckpt_save *s, const char *name, enum ckpt_dtype dt, unsigned ndim,
	    const uint64_t *shape, const void *data);

/* ckpt_future_wait, except that a future still pending at the time limit
 * gives -EINPROGRESS (so -ETIMEDOUT always means the future failed with it). */
int td_future_wait(struct ckpt_future *f, int timeout_ms);

/*
 * Commits a save and waits for both futures (timeout_ms each).  Writes the
 * results to *ret_staged / *ret_committed (0 or -errno as td_future_wait:
 * -EINPROGRESS if a future did not finish in time) and copies the committed future's message
 * (or the staged one's if committed has none) into msg.  Returns the commit
 * call's own result.
 */
int td_commit_wait(struct ckpt_save *s, int timeout_ms, int *ret_staged, int *ret_committed,
		   char *msg, size_t msglen);

/*
 * Opens <root>/<name> with ckpt_reader and checks tensor `tname` equals
 * stream `seed` (whole global tensor, td_fill_chunk with offs 0), including
 * dtype and shape.  Returns true if so; prints why not.
 */
bool td_verify_tensor(struct ckpt_reader *r, const char *tname, enum ckpt_dtype dt, unsigned ndim,
		      const uint64_t *shape, uint64_t seed);

/*
 * True if message `msg` names rank `rank`: a word "rank", "ranks" or
 * "rank(s)", optionally followed by ':' or '=', then a list of numbers
 * (separated by ',', ' ' or "and") that includes `rank`.  Accepts
 * "rank 3", "ranks 1, 3", "rank(s) 1", "rank=3".
 */
bool td_msg_names_rank(const char *msg, uint32_t rank);

/* ---- a spec for tests/tools/st_verify.py --------------------------------- */

/* What a safetensors file must hold: a JSON array of
 * {"file","name","dtype","shape","global_shape","offsets","seed"}. */
struct td_spec;
struct td_spec *td_spec_new(void);
void td_spec_free(struct td_spec *sp);
/* gshape/offs NULL: not sharded. */
void td_spec_add(struct td_spec *sp, const char *file, const char *name, enum ckpt_dtype dt,
		 unsigned ndim, const uint64_t *shape, const uint64_t *gshape,
		 const uint64_t *offs, uint64_t seed);

/*
 * Writes the spec next to the checkpoint (in the test dir) and runs
 * $CKPT_TEST_PYTHON tests/tools/st_verify.py CKPT_DIR SPEC.  If
 * CKPT_TEST_PYTHON is unset, prints "SKIP: ..." and returns 1.  Returns 0
 * if the checker passed, 1 if skipped, -1 if it failed (its output is
 * printed).
 */
int td_st_verify(struct testd *t, const char *ckpt_dir, struct td_spec *sp);

/* ---- ckptctl ----------------------------------------------------------- */

/* Runs ckptctl with the given arguments (NULL-terminated list), 30 s max.
 * Returns the wait status (>= 0) or -errno; *ret_out as td_run_capture. */
int td_ckptctl(char **ret_out, ...) __attribute__((sentinel));

#endif
