/* SPDX-License-Identifier: MIT */
/*
 * testd.c - integration-test helpers: a private ckptd per test, helper
 * processes, bounded waits, data patterns.  See testd.h for the cleanup
 * model (Check fork mode + PDEATHSIG + a subreaper main).
 */
#include "tests/lib/testd.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "store/fsutil.h"

/* Per-run base directory, set by td_main() before the tests fork. */
static char td_base[TD_PATH];

/* ---- time ------------------------------------------------------------------ */

int64_t td_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void td_sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* ---- paths ----------------------------------------------------------------- */

char *td_path(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	ck_assert_msg(n >= 0 && (size_t)n < len, "path too long: %s", buf);
	return buf;
}

bool td_exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

static bool is_file(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Directory of this test binary, into buf.  Returns 0 or -errno. */
static int exe_dir(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);
	char *slash;

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	slash = strrchr(buf, '/');
	if (!slash)
		return -ENOENT;
	*slash = '\0';
	return 0;
}

/* Walks up from `start` (at most 8 levels) to a directory holding `rel`. */
static bool find_upwards(const char *start, const char *rel, char *out, size_t len)
{
	char cur[PATH_MAX], probe[PATH_MAX + 64];
	int level;

	if (!realpath(start, cur))
		return false;
	for (level = 0; level < 8; level++) {
		char *slash;

		snprintf(probe, sizeof(probe), "%s/%s", cur, rel);
		if (is_file(probe)) {
			snprintf(out, len, "%s", cur);
			return true;
		}
		slash = strrchr(cur, '/');
		if (!slash || slash == cur)
			break;
		*slash = '\0';
	}
	return false;
}

const char *td_src_dir(void)
{
	static char src[PATH_MAX];
	char exe[PATH_MAX];
	const char *env;

	if (src[0])
		return src;
	env = getenv("CKPT_SRC_DIR");
	if (env && env[0]) {
		snprintf(src, sizeof(src), "%s", env);
		return src;
	}
	if (find_upwards(".", "tests/tools/st_verify.py", src, sizeof(src)))
		return src;
	if (exe_dir(exe, sizeof(exe)) == 0 &&
	    find_upwards(exe, "tests/tools/st_verify.py", src, sizeof(src)))
		return src;
	snprintf(src, sizeof(src), ".");
	return src;
}

const char *td_build_dir(void)
{
	static char bld[PATH_MAX];
	char exe[PATH_MAX], probe[PATH_MAX + 16];
	const char *env;
	char *slash;

	if (bld[0])
		return bld;
	env = getenv("CKPT_BUILD_DIR");
	if (env && env[0]) {
		snprintf(bld, sizeof(bld), "%s", env);
		return bld;
	}
	/* $(BUILD)/tests/check_x: the build dir is two levels up. */
	if (exe_dir(exe, sizeof(exe)) == 0) {
		slash = strrchr(exe, '/');
		if (slash && slash != exe) {
			*slash = '\0';
			snprintf(probe, sizeof(probe), "%s/ckptd", exe);
			if (is_file(probe)) {
				snprintf(bld, sizeof(bld), "%s", exe);
				return bld;
			}
		}
	}
	snprintf(bld, sizeof(bld), "%s/build", td_src_dir());
	return bld;
}

static int mkdir_p(const char *path, mode_t mode)
{
	char tmp[PATH_MAX];
	size_t i, n = strlen(path);

	if (n == 0 || n >= sizeof(tmp))
		return -ENAMETOOLONG;
	memcpy(tmp, path, n + 1);
	for (i = 1; i <= n; i++) {
		if (tmp[i] != '/' && tmp[i] != '\0')
			continue;
		tmp[i] = '\0';
		if (mkdir(tmp, mode) < 0 && errno != EEXIST)
			return -errno;
		if (i < n)
			tmp[i] = '/';
	}
	return 0;
}

/* ---- files ----------------------------------------------------------------- */

void td_skip(const char *name, const char *fmt, ...)
{
	va_list ap;

	printf("SKIP: [%s] ", name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

int td_rm_rf(const char *path)
{
	return fs_rm_rf_at(AT_FDCWD, path);
}

int td_count_entries(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	size_t plen = strlen(prefix);
	int n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (strncmp(e->d_name, prefix, plen) == 0)
			n++;
	}
	closedir(d);
	return n;
}

bool td_wait_exists(const char *path, bool want, int timeout_ms)
{
	int64_t end = td_now_ms() + timeout_ms;

	for (;;) {
		if (td_exists(path) == want)
			return true;
		if (td_now_ms() >= end)
			return false;
		td_sleep_ms(20);
	}
}

bool td_wait_count(const char *dir, const char *prefix, int want, int timeout_ms)
{
	int64_t end = td_now_ms() + timeout_ms;

	for (;;) {
		if (td_count_entries(dir, prefix) == want)
			return true;
		if (td_now_ms() >= end)
			return false;
		td_sleep_ms(20);
	}
}

int td_read_file(const char *path, size_t max, char **ret, size_t *ret_len)
{
	size_t len;

	return fs_read_file_at(AT_FDCWD, path, max, ret, ret_len ? ret_len : &len);
}

int td_write_file(const char *path, const char *text)
{
	return fs_write_file_at(AT_FDCWD, path, text, strlen(text), 0);
}

/* ---- processes ------------------------------------------------------------- */

const char *td_status_str(int status)
{
	static char buf[64];

	if (status < 0)
		snprintf(buf, sizeof(buf), "error %d (%s)", status, strerror(-status));
	else if (WIFEXITED(status))
		snprintf(buf, sizeof(buf), "exit %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, sizeof(buf), "signal %d (%s)%s", WTERMSIG(status),
			 strsignal(WTERMSIG(status)), WCOREDUMP(status) ? ", core dumped" : "");
	else
		snprintf(buf, sizeof(buf), "status 0x%x", (unsigned)status);
	return buf;
}

/*
 * In a freshly forked child: die with the parent (the test process), so a
 * failed test never leaves a daemon or a rank behind.  The getppid() check
 * closes the race where the parent died before prctl().
 */
static void child_die_with_parent(pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(126);
}

/* Waits for pid until deadline (absolute, ms); SIGKILL after that.  Returns
 * the status, or -ETIMEDOUT if it had to be killed. */
static int wait_pid_until(pid_t pid, int64_t deadline)
{
	int st;

	for (;;) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid)
			return st;
		if (w < 0 && errno != EINTR)
			return -errno;
		if (td_now_ms() >= deadline)
			break;
		td_sleep_ms(10);
	}
	kill(pid, SIGKILL);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return -ETIMEDOUT;
}

int td_run_capture(char *const argv[], int timeout_ms, char **ret_out)
{
	int64_t deadline = td_now_ms() + timeout_ms;
	int pfd[2];
	pid_t pid, parent = getpid();
	char *out = NULL;
	size_t len = 0, cap = 0;
	int st;

	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		int e = -errno;

		close(pfd[0]);
		close(pfd[1]);
		return e;
	}
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

		child_die_with_parent(parent);
		if (devnull >= 0)
			dup2(devnull, 0);
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		execv(argv[0], argv);
		dprintf(2, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(pfd[1]);
	for (;;) {
		struct pollfd p = { .fd = pfd[0], .events = POLLIN };
		int64_t left = deadline - td_now_ms();
		ssize_t n;

		if (left <= 0)
			break;
		if (poll(&p, 1, (int)(left > 100 ? 100 : left)) <= 0)
			continue;
		if (cap - len < 4096) {
			char *nb = realloc(out, cap ? cap * 2 : 8192);

			if (!nb)
				break;
			out = nb;
			cap = cap ? cap * 2 : 8192;
		}
		n = read(pfd[0], out + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(pfd[0]);
	st = wait_pid_until(pid, deadline);
	if (!out)
		out = calloc(1, 1);
	else
		out[len] = '\0';
	if (ret_out)
		*ret_out = out;
	else
		free(out);
	return st;
}

/* ---- daemons --------------------------------------------------------------- */

int td_init(struct testd *t, const char *name)
{
	char tmpl[TD_PATH], marker[TD_PATH + 16];
	struct sockaddr_un sa;
	int r;

	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	if (!td_base[0]) {
		/* Not run through td_main (e.g. CK_RUN_CASE by hand in nofork
		 * mode): a base directory of our own. */
		char b[TD_PATH];

		td_path(b, sizeof(b), "%s/tmp/integ-%d", td_build_dir(), (int)getpid());
		r = mkdir_p(b, 0755);
		ck_assert_msg(r == 0, "mkdir %s: %s", b, strerror(-r));
		ck_assert_msg(realpath(b, td_base) != NULL, "realpath %s", b);
	}
	td_path(tmpl, sizeof(tmpl), "%s/%s-XXXXXX", td_base, name);
	ck_assert_msg(mkdtemp(tmpl) != NULL, "mkdtemp %s: %s", tmpl, strerror(errno));
	snprintf(t->dir, sizeof(t->dir), "%s", tmpl);
	td_path(t->root, sizeof(t->root), "%s/root", t->dir);
	ck_assert_msg(mkdir(t->root, 0755) == 0, "mkdir %s: %s", t->root, strerror(errno));

	/* sun_path is 108 bytes: fall back to a short directory under /tmp
	 * when the build tree's path is too long, and note it in the test dir
	 * so td_main removes it even if the test fails. */
	if (strlen(t->dir) + sizeof("/ckptd-0.sock") <= sizeof(sa.sun_path)) {
		snprintf(t->sockdir, sizeof(t->sockdir), "%s", t->dir);
	} else {
		snprintf(t->sockdir, sizeof(t->sockdir), "/tmp/ckptd-t-XXXXXX");
		ck_assert_msg(mkdtemp(t->sockdir) != NULL, "mkdtemp: %s", strerror(errno));
		t->own_sockdir = true;
		td_path(marker, sizeof(marker), "%s/sockdir", t->dir);
		td_write_file(marker, t->sockdir);
	}
	for (int i = 0; i < TD_MAX_DAEMONS; i++) {
		td_path(t->d[i].conf, TD_PATH, "%s/ckptd-%d.conf", t->dir, i);
		td_path(t->d[i].log, TD_PATH, "%s/ckptd-%d.log", t->dir, i);
		td_path(t->d[i].sock, TD_PATH, "%s/ckptd-%d.sock", t->sockdir, i);
	}
	return 0;
}

const char *td_sock(const struct testd *t, int idx)
{
	return t->d[idx].sock;
}

static int try_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, r = 0;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		r = -errno;
	close(fd);
	return r;
}

void td_dump_log(const struct testd *t, int idx, size_t max)
{
	char *text = NULL;
	size_t len = 0;
	const char *start;

	if (td_read_file(t->d[idx].log, (size_t)1 << 30, &text, &len) < 0) {
		fprintf(stderr, "[%s] (no log %s)\n", t->name, t->d[idx].log);
		return;
	}
	start = text;
	if (len > max)
		start = text + len - max;
	fprintf(stderr, "----- [%s] ckptd-%d log (%s, last %zu of %zu bytes) -----\n%s"
		"----- end of ckptd-%d log -----\n",
		t->name, idx, t->d[idx].log, strlen(start), len, start, idx);
	free(text);
}

ssize_t td_read_log(const struct testd *t, int idx, char *out, size_t len)
{
	char *text = NULL;
	size_t n = 0;
	int r = td_read_file(t->d[idx].log, (size_t)1 << 30, &text, &n);

	if (r < 0)
		return r;
	if (n >= len)
		n = len - 1;
	memcpy(out, text, n);
	out[n] = '\0';
	free(text);
	return (ssize_t)n;
}

int td_daemon_start_raw(struct testd *t, int idx, const char *conf_text)
{
	struct td_daemon *d = &t->d[idx];
	char text[8192], exe[TD_PATH];
	char *argv[6];
	pid_t pid, parent = getpid();
	int64_t deadline;
	int r, logfd;

	ck_assert(idx >= 0 && idx < TD_MAX_DAEMONS);
	ck_assert_msg(d->pid == 0, "daemon %d already running", idx);
	/* Each daemon has its own state directory (it is locked), kept across
	 * restarts of the same daemon so that a restart finds what the crashed
	 * one noted; a test's own state_dir line comes later and wins. */
	td_path(text, sizeof(text), "# written by %s\nsocket = %s\nstate_dir = %s/state-%d\n%s",
		t->name, d->sock, t->dir, idx, conf_text);
	r = td_write_file(d->conf, text);
	if (r < 0)
		return r;
	td_path(exe, sizeof(exe), "%s/ckptd", td_build_dir());
	if (!is_file(exe)) {
		fprintf(stderr, "[%s] no daemon binary at %s\n", t->name, exe);
		return -ENOENT;
	}
	logfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (logfd < 0)
		return -errno;
	argv[0] = exe;
	argv[1] = (char *)"-c";
	argv[2] = d->conf;
	argv[3] = (char *)"-v";
	argv[4] = NULL;
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		r = -errno;
		close(logfd);
		return r;
	}
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

		child_die_with_parent(parent);
		if (devnull >= 0)
			dup2(devnull, 0);
		dup2(logfd, 1);
		dup2(logfd, 2);
		if (d->fsize_limit) {
			struct rlimit rl = { d->fsize_limit, d->fsize_limit };
			if (setrlimit(RLIMIT_FSIZE, &rl) < 0) {
				dprintf(2, "setrlimit(RLIMIT_FSIZE): %s\n", strerror(errno));
				_exit(127);
			}
		}
		execv(exe, argv);
		dprintf(2, "exec %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(logfd);
	d->pid = pid;

	/* Ready = the socket accepts.  Bounded; a daemon that exits meanwhile
	 * is reported with its log. */
	deadline = td_now_ms() + 20000;
	for (;;) {
		int st;
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid) {
			fprintf(stderr, "[%s] ckptd-%d exited during start-up: %s\n", t->name, idx,
				td_status_str(st));
			td_dump_log(t, idx, 8192);
			d->pid = 0;
			return -ECHILD;
		}
		if (try_connect(d->sock) == 0)
			return 0;
		if (td_now_ms() >= deadline)
			break;
		td_sleep_ms(10);
	}
	fprintf(stderr, "[%s] ckptd-%d did not accept on %s within 20 s\n", t->name, idx, d->sock);
	td_dump_log(t, idx, 8192);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	d->pid = 0;
	return -ETIMEDOUT;
}

int td_daemon_start(struct testd *t, int idx, const char *extra)
{
	char text[8192];

	td_path(text, sizeof(text), "root = %s\n%s", t->root, extra ? extra : "");
	return td_daemon_start_raw(t, idx, text);
}

bool td_daemon_alive(struct testd *t, int idx)
{
	struct td_daemon *d = &t->d[idx];
	int st;

	if (d->pid <= 0)
		return false;
	if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
		fprintf(stderr, "[%s] ckptd-%d (pid %d) died: %s\n", t->name, idx, (int)d->pid,
			td_status_str(st));
		td_dump_log(t, idx, 8192);
		d->pid = 0;
		return false;
	}
	return true;
}

int td_daemon_stop(struct testd *t, int idx)
{
	struct td_daemon *d = &t->d[idx];
	int st;

	if (d->pid <= 0)
		return -ESRCH;
	kill(d->pid, SIGTERM);
	st = wait_pid_until(d->pid, td_now_ms() + 15000);
	if (st == -ETIMEDOUT)
		fprintf(stderr, "[%s] ckptd-%d ignored SIGTERM for 15 s, killed\n", t->name, idx);
	d->pid = 0;
	return st;
}

void td_daemon_kill(struct testd *t, int idx)
{
	struct td_daemon *d = &t->d[idx];

	if (d->pid <= 0)
		return;
	kill(d->pid, SIGKILL);
	while (waitpid(d->pid, NULL, 0) < 0 && errno == EINTR)
		;
	d->pid = 0;
}

void td_fini(struct testd *t)
{
	for (int i = 0; i < TD_MAX_DAEMONS; i++) {
		int st;

		if (t->d[i].pid <= 0)
			continue;
		ck_assert_msg(td_daemon_alive(t, i), "ckptd-%d died during the test (log above)",
			      i);
		st = td_daemon_stop(t, i);
		if (!(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			td_dump_log(t, i, 8192);
			ck_abort_msg("ckptd-%d did not exit cleanly on SIGTERM: %s", i,
				     td_status_str(st));
		}
	}
	if (getenv("CKPT_TEST_KEEP"))
		return;
	if (t->own_sockdir)
		td_rm_rf(t->sockdir);
	td_rm_rf(t->dir);
}

/* ---- helper processes ------------------------------------------------------ */

int td_child_start(struct td_child *c, td_child_fn fn, void *arg)
{
	int rep[2], go[2];
	pid_t pid, parent = getpid();

	memset(c, 0, sizeof(*c));
	c->rd = c->go = -1;
	if (pipe2(rep, O_CLOEXEC) < 0)
		return -errno;
	if (pipe2(go, O_CLOEXEC) < 0) {
		int e = -errno;

		close(rep[0]);
		close(rep[1]);
		return e;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		int e = -errno;

		close(rep[0]);
		close(rep[1]);
		close(go[0]);
		close(go[1]);
		return e;
	}
	if (pid == 0) {
		int rc;

		child_die_with_parent(parent);
		signal(SIGPIPE, SIG_IGN);
		close(rep[0]);
		close(go[1]);
		rc = fn(arg, rep[1], go[0]);
		fflush(NULL);
		_exit(rc & 0xff);
	}
	close(rep[1]);
	close(go[0]);
	c->pid = pid;
	c->rd = rep[0];
	c->go = go[1];
	return 0;
}

void td_report(int report_fd, const char *fmt, ...)
{
	char line[2048];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	/* One line per report: newlines inside (e.g. from an error message)
	 * would split it. */
	for (int i = 0; i < n; i++)
		if (line[i] == '\n')
			line[i] = ' ';
	line[n++] = '\n';
	while (write(report_fd, line, (size_t)n) < 0 && errno == EINTR)
		;
}

int td_wait_go(int go_fd, int timeout_ms)
{
	struct pollfd p = { .fd = go_fd, .events = POLLIN };
	char b;
	int r;

	do
		r = poll(&p, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r == 0)
		return -ETIMEDOUT;
	if (read(go_fd, &b, 1) != 1)
		return -EPIPE;
	return 0;
}

int td_child_go(struct td_child *c)
{
	char b = 'g';

	if (write(c->go, &b, 1) != 1)
		return -errno;
	return 0;
}

/* Reads what is there (waiting at most wait_ms).  Returns false at EOF. */
static bool child_pump(struct td_child *c, int wait_ms)
{
	struct pollfd p = { .fd = c->rd, .events = POLLIN };
	char scratch[4096];
	ssize_t n;

	if (c->eof || c->rd < 0)
		return false;
	if (poll(&p, 1, wait_ms) <= 0)
		return true;
	if (c->len + 1 < sizeof(c->out))
		n = read(c->rd, c->out + c->len, sizeof(c->out) - 1 - c->len);
	else
		n = read(c->rd, scratch, sizeof(scratch)); /* full: drop */
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return true;
	if (n <= 0) {
		c->eof = true;
		return false;
	}
	if (c->len + 1 < sizeof(c->out))
		c->len += (size_t)n;
	c->out[c->len] = '\0';
	return true;
}

/* Finds a complete line starting with prefix; copies the rest. */
static bool child_find(const struct td_child *c, const char *prefix, char *rest, size_t restlen)
{
	size_t plen = strlen(prefix);
	const char *line = c->out;

	while (*line) {
		const char *nl = strchr(line, '\n');

		if (!nl)
			return false; /* incomplete last line */
		if ((size_t)(nl - line) >= plen && strncmp(line, prefix, plen) == 0 &&
		    (line[plen] == ' ' || line[plen] == '\n')) {
			if (rest && restlen) {
				const char *r = line + plen + (line[plen] == ' ');
				size_t n = (size_t)(nl - r);

				if (n >= restlen)
					n = restlen - 1;
				memcpy(rest, r, n);
				rest[n] = '\0';
			}
			return true;
		}
		line = nl + 1;
	}
	return false;
}

int td_child_expect(struct td_child *c, const char *prefix, int timeout_ms, char *rest,
		    size_t restlen)
{
	int64_t deadline = td_now_ms() + timeout_ms;

	for (;;) {
		int64_t left;

		if (child_find(c, prefix, rest, restlen))
			return 0;
		if (c->eof)
			return -EPIPE;
		left = deadline - td_now_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		child_pump(c, (int)(left > 100 ? 100 : left));
	}
}

int td_child_wait(struct td_child *c, int timeout_ms)
{
	int64_t deadline = td_now_ms() + timeout_ms;
	int st = -ETIMEDOUT;

	if (c->reaped)
		return c->status;
	for (;;) {
		pid_t w = waitpid(c->pid, &st, WNOHANG);

		if (w == c->pid)
			break;
		if (td_now_ms() >= deadline) {
			kill(c->pid, SIGKILL);
			while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
				;
			st = -ETIMEDOUT;
			break;
		}
		if (!child_pump(c, 20))
			td_sleep_ms(10);
	}
	/* Whatever it wrote before exiting is still in the pipe. */
	while (child_pump(c, 0) && !c->eof) {
		struct pollfd p = { .fd = c->rd, .events = POLLIN };

		if (poll(&p, 1, 0) <= 0)
			break;
	}
	if (c->rd >= 0)
		close(c->rd);
	if (c->go >= 0)
		close(c->go);
	c->rd = c->go = -1;
	c->reaped = true;
	c->status = st;
	return st;
}

void td_child_kill(struct td_child *c)
{
	if (c->reaped || c->pid <= 0)
		return;
	kill(c->pid, SIGKILL);
	td_child_wait(c, 10000);
}

/* ---- patterns -------------------------------------------------------------- */

static inline uint64_t td_word(uint64_t seed, uint64_t k)
{
	uint64_t x = (k + 1) * 0x9E3779B97F4A7C15ull + seed * 0xC2B2AE3D27D4EB4Full;

	return x ^ (x >> 31);
}

void td_fill(void *buf, size_t len, uint64_t seed, uint64_t off)
{
	unsigned char *p = buf;
	uint64_t w;

	while (len && (off & 7)) {
		w = htole64(td_word(seed, off >> 3));
		*p++ = ((unsigned char *)&w)[off & 7];
		off++;
		len--;
	}
	while (len >= 8) {
		w = htole64(td_word(seed, off >> 3));
		memcpy(p, &w, 8);
		p += 8;
		off += 8;
		len -= 8;
	}
	if (len) {
		w = htole64(td_word(seed, off >> 3));
		memcpy(p, &w, len);
	}
}

int64_t td_check(const void *buf, size_t len, uint64_t seed, uint64_t off)
{
	const unsigned char *p = buf;
	unsigned char tmp[4096];
	size_t done = 0;

	while (done < len) {
		size_t n = len - done < sizeof(tmp) ? len - done : sizeof(tmp);

		td_fill(tmp, n, seed, off + done);
		if (memcmp(tmp, p + done, n) != 0) {
			for (size_t i = 0; i < n; i++)
				if (tmp[i] != p[done + i])
					return (int64_t)(done + i);
		}
		done += n;
	}
	return -1;
}

uint64_t td_nbytes(size_t elem, unsigned ndim, const uint64_t *shape)
{
	uint64_t n = elem;

	for (unsigned i = 0; i < ndim; i++)
		n *= shape[i];
	return n;
}

void td_fill_chunk(void *buf, size_t elem, unsigned ndim, const uint64_t *gshape,
		   const uint64_t *offs, const uint64_t *shape, uint64_t seed)
{
	uint64_t idx[CKPT_MAX_NDIM] = { 0 };
	unsigned char *p = buf;
	uint64_t row;

	if (ndim == 0) {
		td_fill(buf, elem, seed, 0);
		return;
	}
	for (unsigned i = 0; i < ndim; i++)
		if (shape[i] == 0)
			return;
	row = shape[ndim - 1] * elem;
	for (;;) {
		/* Global element index of (offs + idx), idx[ndim-1] = 0. */
		uint64_t lin = 0;

		for (unsigned i = 0; i < ndim; i++)
			lin = lin * gshape[i] + offs[i] + idx[i];
		td_fill(p, row, seed, lin * elem);
		p += row;
		if (ndim == 1)
			return;
		/* Next row: increment the index over the leading dims. */
		for (int i = (int)ndim - 2;; i--) {
			if (i < 0)
				return;
			if (++idx[i] < shape[i])
				break;
			idx[i] = 0;
		}
	}
}

static const struct {
	const char *name;
	size_t size;
} td_dtypes[CKPT_DTYPE_COUNT] = {
	[CKPT_BOOL] = { "BOOL", 1 },       [CKPT_U8] = { "U8", 1 },
	[CKPT_I8] = { "I8", 1 },           [CKPT_I16] = { "I16", 2 },
	[CKPT_U16] = { "U16", 2 },         [CKPT_I32] = { "I32", 4 },
	[CKPT_U32] = { "U32", 4 },         [CKPT_I64] = { "I64", 8 },
	[CKPT_U64] = { "U64", 8 },         [CKPT_F16] = { "F16", 2 },
	[CKPT_BF16] = { "BF16", 2 },       [CKPT_F32] = { "F32", 4 },
	[CKPT_F64] = { "F64", 8 },         [CKPT_F8_E4M3] = { "F8_E4M3", 1 },
	[CKPT_F8_E5M2] = { "F8_E5M2", 1 },
};

const char *td_dtype_name(enum ckpt_dtype dt)
{
	return (unsigned)dt < CKPT_DTYPE_COUNT ? td_dtypes[dt].name : "?";
}

size_t td_dtype_size(enum ckpt_dtype dt)
{
	return (unsigned)dt < CKPT_DTYPE_COUNT ? td_dtypes[dt].size : 0;
}

/* ---- libckpt conveniences -------------------------------------------------- */

int td_connect_rc(const char *sock, const char *job, uint32_t rank, uint32_t world,
		  uint64_t arena_bytes, struct ckpt_client **ret)
{
	struct ckpt_connect_opts o = {
		CKPT_CONNECT_OPTS_INIT,
		.socket_path = sock,
		.job = job,
		.rank = rank,
		.world = world,
		.arena_bytes = arena_bytes,
	};

	return ckpt_connect(&o, ret);
}

struct ckpt_client *td_connect(const char *sock, const char *job, uint32_t rank, uint32_t world,
			       uint64_t arena_bytes)
{
	struct ckpt_client *c = NULL;
	int r = td_connect_rc(sock, job, rank, world, arena_bytes, &c);

	ck_assert_msg(r == 0, "ckpt_connect(%s, job %s, rank %u/%u) = %d (%s): %s", sock, job,
		      rank, world, r, strerror(-r), ckpt_last_error());
	ck_assert_ptr_nonnull(c);
	return c;
}

void td_add(struct ckpt_save *s, const char *name, enum ckpt_dtype dt, unsigned ndim,
	    const uint64_t *shape, const void *data)
{
	struct ckpt_tensor tn = {
		CKPT_TENSOR_INIT,
		.name = name,
		.dtype = dt,
		.ndim = ndim,
		.shape = shape,
		.data = data,
		.device = CKPT_DEVICE_HOST,
	};
	int r = ckpt_save_add_tensor(s, &tn);

	ck_assert_msg(r == 0, "ckpt_save_add_tensor(%s) = %d (%s): %s", name, r, strerror(-r),
		      ckpt_last_error());
}

int td_future_wait(struct ckpt_future *f, int timeout_ms)
{
	int r = ckpt_future_wait(f, timeout_ms);

	if (r == -ETIMEDOUT && ckpt_future_poll(f) == -EINPROGRESS)
		return -EINPROGRESS;
	return r;
}

int td_commit_wait(struct ckpt_save *s, int timeout_ms, int *ret_staged, int *ret_committed,
		   char *msg, size_t msglen)
{
	struct ckpt_future *st = NULL, *cm = NULL;
	int r = ckpt_save_commit(s, &st, &cm);
	const char *m;

	if (msg && msglen)
		msg[0] = '\0';
	if (r < 0) {
		*ret_staged = r;
		*ret_committed = r;
		if (msg && msglen)
			snprintf(msg, msglen, "%s", ckpt_last_error());
		return r;
	}
	*ret_staged = td_future_wait(st, timeout_ms);
	*ret_committed = td_future_wait(cm, timeout_ms);
	m = ckpt_future_error(cm);
	if (!m || !m[0])
		m = ckpt_future_error(st);
	if (msg && msglen) {
		if (*ret_staged == -EINPROGRESS || *ret_committed == -EINPROGRESS)
			snprintf(msg, msglen, "(still pending after %d ms) %s", timeout_ms,
				 m ? m : "");
		else
			snprintf(msg, msglen, "%s", m ? m : "");
	}
	return 0;
}

bool td_verify_tensor(struct ckpt_reader *r, const char *tname, enum ckpt_dtype dt, unsigned ndim,
		      const uint64_t *shape, uint64_t seed)
{
	enum ckpt_dtype gdt;
	unsigned gndim = 0;
	uint64_t gshape[CKPT_MAX_NDIM];
	uint64_t n = td_nbytes(td_dtype_size(dt), ndim, shape);
	void *buf;
	int64_t bad;
	int rc;

	rc = ckpt_reader_tensor_info(r, tname, CKPT_MAX_NDIM, &gdt, &gndim, gshape);
	if (rc < 0) {
		fprintf(stderr, "tensor_info(%s) = %d (%s): %s\n", tname, rc, strerror(-rc),
			ckpt_last_error());
		return false;
	}
	if (gdt != dt || gndim != ndim) {
		fprintf(stderr, "%s: dtype %d ndim %u, expected dtype %d ndim %u\n", tname, gdt,
			gndim, dt, ndim);
		return false;
	}
	for (unsigned i = 0; i < ndim; i++) {
		if (gshape[i] != shape[i]) {
			fprintf(stderr, "%s: dim %u is %llu, expected %llu\n", tname, i,
				(unsigned long long)gshape[i], (unsigned long long)shape[i]);
			return false;
		}
	}
	buf = malloc(n ? n : 1);
	if (!buf)
		return false;
	memset(buf, 0xee, n);
	rc = ckpt_reader_read_tensor(r, tname, buf, n);
	if (rc < 0) {
		fprintf(stderr, "read_tensor(%s, %llu bytes) = %d (%s): %s\n", tname,
			(unsigned long long)n, rc, strerror(-rc), ckpt_last_error());
		free(buf);
		return false;
	}
	bad = td_check(buf, n, seed, 0);
	free(buf);
	if (bad >= 0) {
		fprintf(stderr, "%s: byte %lld of %llu differs from what was saved\n", tname,
			(long long)bad, (unsigned long long)n);
		return false;
	}
	return true;
}

bool td_msg_names_rank(const char *msg, uint32_t rank)
{
	const char *p = msg;

	while ((p = strstr(p, "rank"))) {
		const char *q = p + 4;

		p = q;
		if (*q == 's')
			q++;
		else if (strncmp(q, "(s)", 3) == 0)
			q += 3;
		if (*q == ':' || *q == '=')
			q++;
		for (;;) {
			char *end;
			unsigned long v;

			while (*q == ' ' || *q == ',')
				q++;
			if (strncmp(q, "and ", 4) == 0)
				q += 4;
			if (*q < '0' || *q > '9')
				break;
			v = strtoul(q, &end, 10);
			if (v == rank)
				return true;
			q = end;
		}
	}
	return false;
}

/* ---- st_verify spec ---------------------------------------------------------- */

struct td_spec {
	json_t *arr;
};

struct td_spec *td_spec_new(void)
{
	struct td_spec *sp = calloc(1, sizeof(*sp));

	ck_assert_ptr_nonnull(sp);
	sp->arr = json_array();
	ck_assert_ptr_nonnull(sp->arr);
	return sp;
}

void td_spec_free(struct td_spec *sp)
{
	if (!sp)
		return;
	json_decref(sp->arr);
	free(sp);
}

static json_t *dims_json(unsigned ndim, const uint64_t *v)
{
	json_t *a = json_array();

	for (unsigned i = 0; i < ndim; i++)
		json_array_append_new(a, json_integer((json_int_t)(v ? v[i] : 0)));
	return a;
}

void td_spec_add(struct td_spec *sp, const char *file, const char *name, enum ckpt_dtype dt,
		 unsigned ndim, const uint64_t *shape, const uint64_t *gshape,
		 const uint64_t *offs, uint64_t seed)
{
	json_t *o = json_object();

	ck_assert_ptr_nonnull(o);
	json_object_set_new(o, "file", json_string(file));
	json_object_set_new(o, "name", json_string(name));
	json_object_set_new(o, "dtype", json_string(td_dtype_name(dt)));
	json_object_set_new(o, "shape", dims_json(ndim, shape));
	json_object_set_new(o, "global_shape", dims_json(ndim, gshape ? gshape : shape));
	json_object_set_new(o, "offsets", dims_json(ndim, offs));
	/* seeds are small in the tests; json_int_t is signed */
	json_object_set_new(o, "seed", json_integer((json_int_t)seed));
	json_array_append_new(sp->arr, o);
}

int td_st_verify(struct testd *t, const char *ckpt_dir, struct td_spec *sp)
{
	static int serial;
	const char *py = getenv("CKPT_TEST_PYTHON");
	char spec[TD_PATH], script[TD_PATH];
	char *argv[5];
	char *out = NULL;
	int st;

	if (!py || !py[0]) {
		printf("SKIP: [%s] safetensors cross-check: CKPT_TEST_PYTHON is not set\n",
		       t->name);
		fflush(stdout);
		return 1;
	}
	td_path(spec, sizeof(spec), "%s/stspec-%d.json", t->dir, serial++);
	ck_assert_msg(json_dump_file(sp->arr, spec, JSON_COMPACT) == 0, "writing %s", spec);
	td_path(script, sizeof(script), "%s/tests/tools/st_verify.py", td_src_dir());
	argv[0] = (char *)py;
	argv[1] = script;
	argv[2] = (char *)ckpt_dir;
	argv[3] = spec;
	argv[4] = NULL;
	st = td_run_capture(argv, 240000, &out);
	if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		fprintf(stderr, "[%s] st_verify: %s", t->name, out ? out : "");
		free(out);
		return 0;
	}
	fprintf(stderr, "[%s] st_verify.py failed (%s):\n%s\n", t->name, td_status_str(st),
		out ? out : "");
	free(out);
	return -1;
}

/* ---- ckptctl ---------------------------------------------------------------- */

int td_ckptctl(char **ret_out, ...)
{
	char exe[TD_PATH];
	char *argv[24];
	va_list ap;
	int n = 0;

	td_path(exe, sizeof(exe), "%s/ckptctl", td_build_dir());
	argv[n++] = exe;
	va_start(ap, ret_out);
	for (;;) {
		char *a = va_arg(ap, char *);

		if (!a)
			break;
		ck_assert_msg(n < 23, "too many ckptctl arguments");
		argv[n++] = a;
	}
	va_end(ap);
	argv[n] = NULL;
	return td_run_capture(argv, 30000, ret_out);
}

/* ---- main ------------------------------------------------------------------ */

/* Reaps every child of this (subreaper) process: first waits up to 10 s for
 * them to go on their own (they were SIGKILLed by PDEATHSIG), then kills
 * what is left by PID, read from /proc. */
static void reap_orphans(void)
{
	int64_t deadline = td_now_ms() + 10000;
	char path[64];

	for (;;) {
		pid_t w = waitpid(-1, NULL, WNOHANG);

		if (w > 0)
			continue;
		if (w < 0 && errno == ECHILD)
			return;
		if (td_now_ms() >= deadline)
			break;
		td_sleep_ms(20);
	}
	snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)getpid());
	{
		char *text = NULL;
		char *p, *end;

		if (td_read_file(path, 1 << 20, &text, NULL) == 0) {
			for (p = text;; p = end) {
				long pid = strtol(p, &end, 10);

				if (end == p)
					break;
				if (pid > 0) {
					fprintf(stderr, "killing leftover process %ld\n", pid);
					kill((pid_t)pid, SIGKILL);
				}
			}
			free(text);
		}
	}
	while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
		;
}

/* Prints the daemon logs of each test directory left behind (a failed test),
 * and removes the short socket directory it may have used. */
static void report_leftovers(void)
{
	DIR *d = opendir(td_base);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char sub[TD_PATH * 2], file[TD_PATH * 3];
		char *text = NULL;
		size_t len;

		if (e->d_name[0] == '.')
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", td_base, e->d_name);
		for (int i = 0; i < TD_MAX_DAEMONS; i++) {
			snprintf(file, sizeof(file), "%s/ckptd-%d.log", sub, i);
			if (td_read_file(file, (size_t)1 << 30, &text, &len) < 0)
				continue;
			fprintf(stderr, "===== %s: ckptd-%d log (left by a failed test), last %zu bytes =====\n%s"
				"===== end =====\n",
				e->d_name, i, len > 16384 ? (size_t)16384 : len,
				len > 16384 ? text + len - 16384 : text);
			free(text);
		}
		snprintf(file, sizeof(file), "%s/sockdir", sub);
		if (td_read_file(file, 4096, &text, NULL) == 0) {
			if (strncmp(text, "/tmp/ckptd-t-", 13) == 0)
				td_rm_rf(text);
			free(text);
		}
	}
	closedir(d);
}

void td_case(Suite *s, const char *name, const TTest *fn, int timeout_s, int lo, int hi)
{
	TCase *tc = tcase_create(name);

	tcase_set_timeout(tc, timeout_s);
	tcase_add_loop_test(tc, fn, lo, hi);
	suite_add_tcase(s, tc);
}

int td_main(Suite *s, const char *prog)
{
	SRunner *sr;
	char b[TD_PATH];
	int failed, r;

	/* Orphans of a failed test (its daemon, its ranks) are reparented to
	 * us, so we can reap them before removing their directories. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	signal(SIGPIPE, SIG_IGN);

	/* No ck_* calls out here: Check only accepts them inside a test. */
	if (snprintf(b, sizeof(b), "%s/tmp/%s-%d", td_build_dir(), prog, (int)getpid()) >=
	    (int)sizeof(b)) {
		fprintf(stderr, "%s: build dir path too long\n", prog);
		return 1;
	}
	r = mkdir_p(b, 0755);
	if (r < 0 || !realpath(b, td_base)) {
		fprintf(stderr, "%s: cannot create %s: %s\n", prog, b, strerror(r < 0 ? -r : errno));
		return 1;
	}

	sr = srunner_create(s);
	/* The cleanup model needs fork mode (testd.h). */
	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);

	reap_orphans();
	report_leftovers();
	if (!getenv("CKPT_TEST_KEEP"))
		td_rm_rf(td_base);
	else
		fprintf(stderr, "%s: kept %s\n", prog, td_base);
	return failed ? 1 : 0;
}
