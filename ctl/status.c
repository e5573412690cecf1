/* SPDX-License-Identifier: MIT */
/*
 * status.c - ckptctl status: the running daemon's report, once or
 * (--watch) every interval.
 *
 * Every report is asked for on a connection of its own (the control role
 * of proto.h: HELLO, STATUS_REQ, the JSON in a memfd): the daemon closes
 * control connections idle for its handshake_timeout, so one kept open
 * would not outlive a long --interval, and a daemon restarted between two
 * reports is simply asked again.
 *
 * Text is drawn for the terminal it goes to.  --watch on a terminal (and
 * neither NO_COLOR nor TERM=dumb nor TERM unset) redraws each report in
 * place: cursor home, the lines, each ending with "clear to the end of
 * the line", then "clear below", so no report flickers through a blank
 * screen; the cursor is hidden meanwhile and shown again however the
 * command ends.  Anywhere else no escape byte is ever written: reports are
 * plain text separated by a blank line, or (--json) one compact line each
 * with the time it was taken.
 *
 * A save's progress bar measures the bytes that must be durable before
 * its commit: "written" for a directory root, "s3_uploaded" for an S3
 * root (with the spill tier the local copy comes first, the upload is what
 * the commit waits for).  Its rate is that count over the save's age, or,
 * when watching, the difference since the previous report over the time
 * between them (the daemon's ages, so the time spent asking does not
 * count): the rate now, not the average since the save began.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "ctl/ctl.h"
#include "daemon/config.h"
#include "shm/proto.h"

#define CTL_TIMEOUT_S  10          /* wait for the daemon's answers */
#define CTL_STATUS_MAX (64u << 20) /* cap on the status report */
#define BAR_WIDTH      20

/* ANSI sequences, written only to a terminal that takes them. */
#define ESC_HOME       "\033[H"
#define ESC_CLEAR      "\033[2J"
#define ESC_CLEAR_EOL  "\033[K"
#define ESC_CLEAR_DOWN "\033[J"
#define ESC_HIDE       "\033[?25l"
#define ESC_SHOW       "\033[?25h"
#define ESC_BOLD       "\033[1m"
#define ESC_GREEN      "\033[32m"
#define ESC_RESET      "\033[0m"

/* ---- JSON access tolerant of missing fields (status reports of other
 * daemon versions must still print) ---- */

static uint64_t jget_u64(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	double d;

	if (json_is_integer(v))
		return json_integer_value(v) < 0 ? 0 : (uint64_t)json_integer_value(v);
	if (!json_is_real(v))
		return 0;
	/* A real out of range must not reach the cast (undefined). */
	d = json_real_value(v);
	return d < 0 ? 0 : d >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)d;
}

static double jget_f64(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *jget_str(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? s : "?";
}

/*
 * Every string of the report fit to print: control and non-ASCII bytes
 * become '?' (a job or root name must not drive the terminal, least of all
 * one being redrawn).  For the text only; --json prints the report as
 * received, escaped by jansson.  0 or -ENOMEM.
 */
static int sanitize(json_t *j)
{
	const char *key;
	json_t *v;
	size_t i;

	if (json_is_object(j)) {
		json_object_foreach(j, key, v) {
			if (json_is_string(v)) {
				char *s = ctl_display(json_string_value(v));
				/* Replacing the value of an existing key keeps
				 * the iteration valid. */
				if (!s || json_object_set_new(j, key, json_string(s)) < 0) {
					free(s);
					return -ENOMEM;
				}
				free(s);
			} else if (sanitize(v) < 0) {
				return -ENOMEM;
			}
		}
	} else if (json_is_array(j)) {
		json_array_foreach(j, i, v) {
			if (json_is_string(v)) {
				char *s = ctl_display(json_string_value(v));
				if (!s || json_array_set_new(j, i, json_string(s)) < 0) {
					free(s);
					return -ENOMEM;
				}
				free(s);
			} else if (sanitize(v) < 0) {
				return -ENOMEM;
			}
		}
	}
	return 0;
}

/* ---- asking the daemon ---- */

/*
 * The socket to ask: -s, else $CKPTD_SOCKET, else the config file's `socket`
 * (an explicit -c must load; the default one is optional), else the built-in
 * default.  Returns a malloc'd path or NULL (reason printed).
 */
char *ctl_socket_path(const char *opt_socket, const char *opt_config)
{
	const char *env = getenv("CKPTD_SOCKET");
	const char *path = opt_config ? opt_config : config_default_path;
	struct config c;
	char err[1024] = "";
	char *ret;
	int r;

	if (opt_socket)
		return strdup(opt_socket);
	if (env && *env)
		return strdup(env);

	if (config_defaults(&c) < 0) {
		ctl_err("out of memory");
		return NULL;
	}
	r = config_load(&c, path, err, sizeof(err));
	if (r == -ENOENT && !opt_config) {
		config_free(&c);
		return strdup(CKPT_DEFAULT_SOCKET);
	}
	if (r < 0) {
		ctl_err("%s", err[0] ? err : strerror(-r));
		config_free(&c);
		return NULL;
	}
	ret = strdup(c.socket_path);
	config_free(&c);
	return ret;
}

bool ctl_daemon_gone(int err)
{
	return err == -ENOENT || err == -ECONNREFUSED || err == -ENOTSOCK ||
	       err == -ECONNRESET || err == -EPIPE;
}

/* A socket to the daemon, not yet greeted. */
static int ctl_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = CTL_TIMEOUT_S };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		ctl_err("socket path '%s' is too long", path);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);

	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		int e = errno;
		ctl_err("socket: %s", strerror(e));
		return -e;
	}
	/* A daemon that hangs must not hang the operator's shell too. */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		if (e == ENOENT || e == ECONNREFUSED || e == ENOTSOCK)
			ctl_err("no ckptd listening on '%s' (is the service running?)", path);
		else if (e == EACCES || e == EPERM)
			ctl_err("permission denied on '%s' (is your user in the socket's group?)",
				path);
		else
			ctl_err("cannot connect to '%s': %s", path, strerror(e));
		close(fd);
		return -e;
	}
	return fd;
}

int ctl_expect(int sock, const char *path, unsigned want, void *buf, int *ret_fd)
{
	char err[256];
	ssize_t n;
	int type;

	n = proto_recv(sock, buf, ret_fd);
	if (n == 0) {
		ctl_err("ckptd on '%s' closed the connection", path);
		return -ECONNRESET;
	}
	if (n == -EAGAIN || n == -EWOULDBLOCK) {
		ctl_err("no answer from ckptd on '%s' within %d s", path, CTL_TIMEOUT_S);
		return -ETIMEDOUT;
	}
	if (n < 0) {
		ctl_err("receiving from '%s': %s", path, strerror((int)-n));
		return (int)n;
	}
	type = proto_check(buf, (size_t)n, err, sizeof(err));
	if (type < 0) {
		ctl_err("bad message from '%s': %s", path, err);
		type = -EPROTO;
		goto out_bad;
	}
	if (type == PROTO_ERROR) {
		const struct proto_error *e = buf;
		ctl_err("ckptd refused: %s (%s)", e->msg, strerror(-e->err));
		type = -EREMOTEIO;
		goto out_bad;
	}
	if ((unsigned)type != want) {
		ctl_err("unexpected message type %d from '%s' (wanted %u)", type, path, want);
		type = -EPROTO;
		goto out_bad;
	}
	return 0;

out_bad:
	if (ret_fd && *ret_fd >= 0) {
		close(*ret_fd);
		*ret_fd = -1;
	}
	return type;
}

int ctl_session(const char *path)
{
	_Alignas(8) unsigned char buf[PROTO_MSG_MAX];
	struct proto_hello hello;
	int sock, mfd = -1, ret;

	sock = ctl_connect(path);
	if (sock < 0)
		return sock;
	memset(&hello, 0, sizeof(hello));
	proto_init(&hello.h, PROTO_HELLO, sizeof(hello));
	hello.role = PROTO_ROLE_CONTROL;
	hello.rank = 0;
	hello.world = 1;
	hello.arena_bytes = 0;
	snprintf(hello.job, sizeof(hello.job), "ckptctl");
	ret = proto_send(sock, &hello, sizeof(hello), -1);
	if (ret < 0) {
		ctl_err("sending to '%s': %s", path, strerror(-ret));
		close(sock);
		return ret;
	}
	ret = ctl_expect(sock, path, PROTO_HELLO_OK, buf, &mfd);
	if (mfd >= 0) /* a control connection gets no arena */
		close(mfd);
	if (ret < 0) {
		close(sock);
		return ret;
	}
	return sock;
}

/* Fetches the status report.  Returns 0 and the malloc'd JSON text, or
 * -errno with the reason printed (ctl_daemon_gone() tells "no daemon"). */
static int status_fetch(const char *path, char **ret_text, size_t *ret_len)
{
	_Alignas(8) unsigned char buf[PROTO_MSG_MAX];
	struct proto_status_req req;
	const struct proto_status_reply *rep;
	size_t off = 0, len;
	char *text = NULL;
	int sock, mfd = -1, ret;

	sock = ctl_session(path);
	if (sock < 0)
		return sock;

	proto_init(&req.h, PROTO_STATUS_REQ, sizeof(req));
	ret = proto_send(sock, &req, sizeof(req), -1);
	if (ret < 0) {
		ctl_err("sending to '%s': %s", path, strerror(-ret));
		goto out_close;
	}
	ret = ctl_expect(sock, path, PROTO_STATUS_REPLY, buf, &mfd);
	if (ret < 0)
		goto out_close;
	rep = (const struct proto_status_reply *)buf;
	if (mfd < 0) {
		ctl_err("status reply from '%s' carries no report", path);
		ret = -EPROTO;
		goto out_close;
	}
	if (rep->len > CTL_STATUS_MAX) {
		ctl_err("status report of %llu bytes is larger than %u",
			(unsigned long long)rep->len, CTL_STATUS_MAX);
		ret = -EFBIG;
		goto out_close;
	}
	len = (size_t)rep->len;
	text = malloc(len + 1);
	if (!text) {
		ret = -ENOMEM;
		ctl_err("out of memory");
		goto out_close;
	}
	while (off < len) {
		ssize_t n = pread(mfd, text + off, len - off, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			/* EPIPE-like errnos of a memfd would read as "no
			 * daemon": a short report is a bad message. */
			ret = -EBADMSG;
			ctl_err("reading the status report: %s",
				n < 0 ? strerror(errno) : "shorter than announced");
			free(text);
			goto out_close;
		}
		off += (size_t)n;
	}
	text[len] = '\0';
	*ret_text = text;
	*ret_len = len;
	ret = 0;

out_close:
	if (mfd >= 0)
		close(mfd);
	close(sock);
	return ret;
}

int ctl_status_get(const char *path, json_t **ret)
{
	json_error_t jerr;
	char *text = NULL;
	size_t len = 0;
	json_t *st;
	int r;

	r = status_fetch(path, &text, &len);
	if (r < 0)
		return r;
	st = json_loadb(text, len, 0, &jerr);
	free(text);
	if (!json_is_object(st)) {
		ctl_err("status report from '%s' is not a JSON object: %s (line %d)", path,
			st ? "wrong type" : jerr.text, jerr.line);
		json_decref(st);
		return -EBADMSG;
	}
	*ret = st;
	return 0;
}

/* ---- the text report ---- */

/* How a report is drawn. */
struct view {
	FILE *f;
	bool color;          /* ANSI colours allowed */
	const json_t *prev;  /* the previous report (--watch), or NULL */
	double prev_dt;      /* seconds between it and this one (local clock) */
};

/* part/total in percent, rounded down (nothing shows 100% before it is
 * all there), at most 100; 0 for a total of 0. */
static unsigned pct_down(uint64_t part, uint64_t total)
{
	if (!total)
		return 0;
	if (part >= total)
		return 100;
	return (unsigned)((long double)part * 100 / total);
}

/* The previous report's entry of save `s` (same attempt of the same
 * checkpoint), or NULL. */
static const json_t *prev_save(const struct view *V, const json_t *s)
{
	const json_t *saves = json_object_get(V->prev, "saves");
	const char *att = json_string_value(json_object_get(s, "attempt"));
	const json_t *p;
	size_t i;

	if (!att)
		return NULL;
	json_array_foreach(saves, i, p) {
		const char *a = json_string_value(json_object_get(p, "attempt"));
		if (a && !strcmp(a, att) && !strcmp(jget_str(p, "root"), jget_str(s, "root")) &&
		    !strcmp(jget_str(p, "name"), jget_str(s, "name")))
			return p;
	}
	return NULL;
}

/*
 * A save's progress: "[#####---------------]  25%  1.0 GiB/4.0 GiB written
 * 850.0 MiB/s  ETA 3.6s".  Nothing is shown as done before it is: the
 * percentage and the bar round down.
 */
static void progress_print(const struct view *V, const json_t *s, int indent)
{
	bool s3 = json_is_integer(json_object_get(s, "s3_uploaded"));
	const char *field = s3 ? "s3_uploaded" : "written";
	uint64_t total = jget_u64(s, "bytes"), done = jget_u64(s, field);
	double age = jget_f64(s, "age_s"), rate = NAN;
	const json_t *p = V->prev ? prev_save(V, s) : NULL;
	unsigned fill = 0, pct = 0;
	char a[32], b[32], c[32];

	if (done > total)
		done = total;
	if (total)
		fill = (unsigned)((long double)done * BAR_WIDTH / total);
	pct = pct_down(done, total);
	if (p && jget_u64(p, field) <= done) {
		/* The daemon's clock between the two reports, else ours. */
		double dt = jget_f64(s, "age_s") - jget_f64(p, "age_s");
		if (!(dt > 0.001))
			dt = V->prev_dt;
		if (dt > 0.001)
			rate = (double)(done - jget_u64(p, field)) / dt;
	} else if (age > 0.001) {
		rate = (double)done / age;
	}

	fprintf(V->f, "%*s[", indent, "");
	if (V->color && fill)
		fputs(ESC_GREEN, V->f);
	for (unsigned k = 0; k < BAR_WIDTH; k++) {
		if (k == fill && V->color && fill)
			fputs(ESC_RESET, V->f);
		fputc(k < fill ? '#' : '-', V->f);
	}
	if (V->color && fill == BAR_WIDTH)
		fputs(ESC_RESET, V->f);
	fprintf(V->f, "] %3u%%  %s/%s %s", pct, ctl_human_size(done, a, sizeof(a)),
		ctl_human_size(total, b, sizeof(b)), s3 ? "uploaded" : "written");
	/* Once all is there, the save waits (for ranks, the commit): a rate
	 * of nothing would only be noise. */
	if (total && done == total)
		rate = NAN;
	if (!isnan(rate) && rate >= 0 && rate < 1e19)
		fprintf(V->f, "  %s/s", ctl_human_size((uint64_t)rate, c, sizeof(c)));
	if (!isnan(rate) && rate >= 1.0 && done < total)
		fprintf(V->f, "  ETA %s",
			ctl_human_duration((double)(total - done) / rate, c, sizeof(c)));
	fputc('\n', V->f);
}

/* A save the spill tier owes a commit (status.h "pending"): durable on
 * the node, and what S3 said last when it failed it. */
static void pending_print(const struct view *V, const json_t *pd, int indent)
{
	const json_t *next = json_object_get(pd, "next_try_s");
	char a[32], b[32];

	if (!json_is_object(pd))
		return;
	fprintf(V->f, "%*sdurable on this node%s; ", indent, "",
		json_is_true(json_object_get(pd, "resumed")) ? " (resumed after a restart)" : "");
	if (!json_is_string(json_object_get(pd, "last_error"))) {
		fprintf(V->f, "S3 has not failed it\n");
		return;
	}
	fprintf(V->f, "%llu tr%s failed, the last %s ago: %s",
		(unsigned long long)jget_u64(pd, "tries"), jget_u64(pd, "tries") == 1 ? "y" : "ies",
		ctl_human_duration(jget_f64(pd, "last_error_age_s"), a, sizeof(a)),
		jget_str(pd, "last_error"));
	if (json_is_number(next))
		fprintf(V->f, "; next try in %s",
			ctl_human_duration(json_number_value(next), b, sizeof(b)));
	fputc('\n', V->f);
}

/* The newest commit of this daemon (newer daemons): absent, null (none
 * since it started) or {"root","name","job","step","bytes","age_s"}. */
static void last_commit_print(const struct view *V, const json_t *st)
{
	const json_t *lc = json_object_get(st, "last_commit");
	char a[32], b[32];

	if (json_is_null(lc)) {
		fprintf(V->f, "\nlast commit: none since ckptd started\n");
		return;
	}
	if (!json_is_object(lc))
		return;
	fprintf(V->f, "\nlast commit: %s step %llu, %s ago (job %s, %s, root %s)\n",
		jget_str(lc, "name"), (unsigned long long)jget_u64(lc, "step"),
		ctl_human_duration(jget_f64(lc, "age_s"), a, sizeof(a)), jget_str(lc, "job"),
		ctl_human_size(jget_u64(lc, "bytes"), b, sizeof(b)), jget_str(lc, "root"));
}

/* The daemon's S3 uploads (status.h "s3"), when its S3 client runs.  The
 * report holds no secret; the endpoint is printed as the daemon gives it. */
static void s3_print(const struct view *V, const json_t *s3)
{
	char a[32], b[32], c[32], d[32];

	if (!json_is_object(s3))
		return;
	fprintf(V->f,
		"  s3       %s, region %s: %llu part(s) in flight (at most %llu), %llu queued\n",
		jget_str(s3, "endpoint"), jget_str(s3, "region"),
		(unsigned long long)jget_u64(s3, "in_flight"),
		(unsigned long long)jget_u64(s3, "parts_in_flight_max"),
		(unsigned long long)jget_u64(s3, "queued"));
	fprintf(V->f, "           %s uploaded, now %s/s (last %s), %s downloaded\n",
		ctl_human_size(jget_u64(s3, "bytes_up"), a, sizeof(a)),
		ctl_human_size(jget_u64(s3, "up_bytes_per_s"), b, sizeof(b)),
		ctl_human_duration(jget_f64(s3, "rate_window_s"), c, sizeof(c)),
		ctl_human_size(jget_u64(s3, "bytes_down"), d, sizeof(d)));
	fprintf(V->f, "           %llu request(s), %llu retried, %llu failed, %llu part(s) done\n",
		(unsigned long long)jget_u64(s3, "requests"),
		(unsigned long long)jget_u64(s3, "retries"),
		(unsigned long long)jget_u64(s3, "failures"),
		(unsigned long long)jget_u64(s3, "parts_done"));
}

static void status_print(const struct view *V, const json_t *st)
{
	json_t *cfg = json_object_get(st, "config");
	json_t *roots = json_object_get(cfg, "roots");
	json_t *clients = json_object_get(st, "clients");
	json_t *saves = json_object_get(st, "saves");
	json_t *totals = json_object_get(st, "totals");
	char a[32], b[32], c[32], d[32];
	size_t i, wjob = 3, wname = 4;
	FILE *f = V->f;
	json_t *v;

	fprintf(f, "ckptd %s, pid %llu, up %s\n", jget_str(st, "version"),
		(unsigned long long)jget_u64(st, "pid"),
		ctl_human_duration(jget_f64(st, "uptime_s"), a, sizeof(a)));
	fprintf(f, "  socket   %s\n", jget_str(cfg, "socket"));
	fprintf(f, "  roots   ");
	if (json_array_size(roots) == 0)
		fprintf(f, " (none)");
	json_array_foreach(roots, i, v)
		fprintf(f, " %s", json_string_value(v) ? json_string_value(v) : "?");
	fprintf(f, "\n");
	fprintf(f, "  arenas   %s in use of %s (at most %s per client)\n",
		ctl_human_size(jget_u64(st, "arena_bytes_total"), a, sizeof(a)),
		ctl_human_size(jget_u64(cfg, "arena_total"), b, sizeof(b)),
		ctl_human_size(jget_u64(cfg, "arena_max"), c, sizeof(c)));
	fprintf(f, "  writes   io_uring depth %llu, commit deadline %s\n",
		(unsigned long long)jget_u64(cfg, "uring_depth"),
		ctl_human_duration((double)jget_u64(cfg, "commit_deadline_ms") / 1000.0, d,
				   sizeof(d)));
	/* Fields of newer daemons: shown when the report has them. */
	{
		json_t *stall = json_object_get(st, "max_loop_stall_ms");
		if (!stall)
			stall = json_object_get(totals, "max_loop_stall_ms");
		if (json_is_number(stall))
			fprintf(f,
				"  loop     longest stall %.1f ms (time away from serving clients)\n",
				json_number_value(stall));
	}
	s3_print(V, json_object_get(st, "s3"));

	json_array_foreach(clients, i, v) {
		size_t l = strlen(jget_str(v, "job"));
		wjob = l > wjob ? l : wjob;
	}
	json_array_foreach(saves, i, v) {
		size_t l = strlen(jget_str(v, "job"));
		wjob = l > wjob ? l : wjob;
		l = strlen(jget_str(v, "name"));
		wname = l > wname ? l : wname;
	}
	int wj = ctl_name_width(wjob, 3), wn = ctl_name_width(wname, 4);

	fprintf(f, "\nclients: %zu\n", json_array_size(clients));
	if (json_array_size(clients) > 0) {
		fprintf(f, "  %5s %8s  %-*s %11s %10s %10s\n", "ID", "PID", wj, "JOB", "RANK/WORLD",
			"ARENA", "SLOTS");
		json_array_foreach(clients, i, v) {
			char rw[48], slots[48];
			snprintf(rw, sizeof(rw), "%llu/%llu",
				 (unsigned long long)jget_u64(v, "rank"),
				 (unsigned long long)jget_u64(v, "world"));
			snprintf(slots, sizeof(slots), "%llu/%llu",
				 (unsigned long long)jget_u64(v, "slots_in_use"),
				 (unsigned long long)jget_u64(v, "slots"));
			fprintf(f, "  %5llu %8llu  %-*.*s %11s %10s %10s\n",
				(unsigned long long)jget_u64(v, "id"),
				(unsigned long long)jget_u64(v, "pid"), wj, wj, jget_str(v, "job"),
				rw, ctl_human_size(jget_u64(v, "arena_bytes"), a, sizeof(a)),
				slots);
		}
	}

	fprintf(f, "\nsaves in flight: %zu\n", json_array_size(saves));
	if (json_array_size(saves) > 0) {
		fprintf(f, "  %-*s %-*s %-10s %14s %14s %7s %11s\n", wj, "JOB", wn, "NAME", "STATE",
			"STAGED", "WRITTEN", "AGE", "RATE");
		json_array_foreach(saves, i, v) {
			uint64_t total = jget_u64(v, "bytes");
			uint64_t staged = jget_u64(v, "staged"), written = jget_u64(v, "written");
			double gibps = jget_f64(v, "write_gibps");
			char sbuf[48], wbuf[48], rate[32];

			snprintf(sbuf, sizeof(sbuf), "%s %3u%%",
				 ctl_human_size(staged, a, sizeof(a)), pct_down(staged, total));
			snprintf(wbuf, sizeof(wbuf), "%s %3u%%",
				 ctl_human_size(written, b, sizeof(b)), pct_down(written, total));
			if (isnan(gibps))
				snprintf(rate, sizeof(rate), "-");
			else
				snprintf(rate, sizeof(rate), "%.2f GiB/s", gibps);
			fprintf(f, "  %-*.*s %-*.*s %-10s %14s %14s %7s %11s\n", wj, wj,
				jget_str(v, "job"), wn, wn, jget_str(v, "name"),
				jget_str(v, "state"), sbuf, wbuf,
				ctl_human_duration(jget_f64(v, "age_s"), c, sizeof(c)), rate);
			fprintf(f, "  %-*s %-*s of %s, %llu rank(s), root %s", wj, "", wn, "",
				ctl_human_size(total, d, sizeof(d)),
				(unsigned long long)jget_u64(v, "world"), jget_str(v, "root"));
			if (json_is_integer(json_object_get(v, "s3_uploaded")))
				fprintf(f, ", %s uploaded",
					ctl_human_size(jget_u64(v, "s3_uploaded"), a, sizeof(a)));
			fputc('\n', f);
			progress_print(V, v, 2 + wj + 1 + wn + 1);
			pending_print(V, json_object_get(v, "pending"), 2 + wj + 1 + wn + 1);
		}
	}
	last_commit_print(V, st);

	/* Newer daemons: checkpoints held in memory for restarts. */
	json_t *res = json_object_get(st, "resident");
	if (json_is_array(res)) {
		fprintf(f, "\nresident in memory: %zu, %s\n", json_array_size(res),
			ctl_human_size(jget_u64(st, "resident_bytes"), a, sizeof(a)));
		json_array_foreach(res, i, v) {
			fprintf(f,
				"  %-*.*s rank %-5llu step %-8llu %10s  %s/%s (%s old, %llu load(s))\n",
				wj, wj, jget_str(v, "job"), (unsigned long long)jget_u64(v, "rank"),
				(unsigned long long)jget_u64(v, "step"),
				ctl_human_size(jget_u64(v, "bytes"), b, sizeof(b)),
				jget_str(v, "root"), jget_str(v, "name"),
				ctl_human_duration(jget_f64(v, "age_s"), c, sizeof(c)),
				(unsigned long long)jget_u64(v, "loads"));
		}
	}

	fprintf(f, "\ntotals: %llu committed, %llu failed",
		(unsigned long long)jget_u64(totals, "saves_committed"),
		(unsigned long long)jget_u64(totals, "saves_failed"));
	if (json_is_integer(json_object_get(totals, "saves_refused")))
		fprintf(f, ", %llu refused", (unsigned long long)jget_u64(totals, "saves_refused"));
	fprintf(f, ", %s written\n",
		ctl_human_size(jget_u64(totals, "bytes_written"), a, sizeof(a)));
}

/* ---- once ---- */

static int status_once(const char *path, bool json)
{
	struct view V = { .f = stdout };
	json_t *st;
	int r;

	r = ctl_status_get(path, &st);
	if (r < 0)
		return ctl_daemon_gone(r) ? CTL_EXIT_NO_DAEMON : CTL_EXIT_ERROR;
	if (json) {
		r = ctl_json_print(st, JSON_REAL_PRECISION(15));
	} else {
		r = sanitize(st);
		if (r == 0)
			status_print(&V, st);
	}
	json_decref(st);
	if (r < 0) {
		ctl_err("out of memory");
		return CTL_EXIT_ERROR;
	}
	return 0;
}

/* ---- --watch ---- */

/*
 * Stopping: SIGINT and SIGTERM end the watch at once with status 0.  They
 * are blocked while a report is written and flushed, so the handler only
 * ever runs between reports (asking the daemon or sleeping): all output is
 * out, and no report is cut short (a --json reader never sees half a
 * line).  All it has left to do is show the cursor again.
 */
static volatile sig_atomic_t cursor_hidden;

static void on_stop(int sig)
{
	(void)sig;
	if (cursor_hidden) {
		ssize_t n = write(STDOUT_FILENO, ESC_SHOW, sizeof(ESC_SHOW) - 1);
		(void)n;
	}
	_exit(0);
}

double ctl_mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void ctl_sleep_until(double t)
{
	struct timespec ts;

	ts.tv_sec = (time_t)t;
	ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L)
		ts.tv_nsec = 999999999L;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Whether escapes may be written: a terminal that says it takes them, and
 * no NO_COLOR (https://no-color.org: set and not empty). */
static bool fancy_output(void)
{
	const char *term = getenv("TERM"), *nc = getenv("NO_COLOR");

	return isatty(STDOUT_FILENO) && !(nc && *nc) && term && *term && strcmp(term, "dumb");
}

/* Columns one line takes on a terminal `cols` wide, escapes not counted. */
static unsigned line_rows(const char *s, size_t len, unsigned cols)
{
	size_t w = 0;

	for (size_t i = 0; i < len; i++) {
		if (s[i] == '\033' && i + 1 < len && s[i + 1] == '[') {
			for (i += 2; i < len && !(s[i] >= '@' && s[i] <= '~'); i++)
				;
			continue;
		}
		w++;
	}
	return w == 0 ? 1 : (unsigned)((w + cols - 1) / cols);
}

/*
 * Draws `buf` (a whole report) over the previous one: cursor home, each
 * line followed by clear-to-end-of-line, then clear-below.  A report
 * taller than the terminal is cut, with a note on its last line: one that
 * scrolled would leave the top of the screen stale.  The cursor ends on
 * the last row at most, so nothing ever scrolls.
 */
static void redraw(FILE *out, const char *buf, size_t len)
{
	struct winsize ws;
	unsigned rows = 24, cols = 80, need = 0, room, used = 0, left = 0;
	const char *p, *end = buf + len;

	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
		rows = ws.ws_row;
		cols = ws.ws_col;
	}
	for (p = buf; p < end;) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		need += line_rows(p, n, cols);
		p += n + (nl ? 1 : 0);
	}
	/* Rows for the lines: all but the cursor's, and the note's if cut. */
	room = need <= rows - 1 ? rows - 1 : rows > 2 ? rows - 2 : 0;
	fputs(ESC_HOME, out);
	for (p = buf; p < end;) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		unsigned r = line_rows(p, n, cols);

		if (left || used + r > room) {
			left++;
		} else {
			fwrite(p, 1, n, out);
			fputs(ESC_CLEAR_EOL "\n", out);
			used += r;
		}
		p += n + (nl ? 1 : 0);
	}
	if (left && rows > 1)
		fprintf(out, "... %u more line(s): a taller terminal shows them" ESC_CLEAR_EOL "\n",
			left);
	fputs(ESC_CLEAR_DOWN, out);
}

/* The local time now as "2026-11-27 10:00:01" (text) or the UTC time as
 * "2026-11-27T09:00:01.250Z" (JSON). */
static void time_str(bool utc_json, char *buf, size_t len)
{
	struct timespec ts;
	struct tm tm;
	char s[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	if (utc_json) {
		gmtime_r(&ts.tv_sec, &tm);
		strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);
		snprintf(buf, len, "%s.%03dZ", s, (int)(ts.tv_nsec / 1000000 % 1000));
	} else {
		localtime_r(&ts.tv_sec, &tm);
		strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
	}
}

/* Writes report number n (from 1).  0, -ENOMEM, or -EPIPE and other write
 * errors of stdout. */
static int watch_emit(const struct ctl_watch *w, bool json, bool fancy, const json_t *prev,
		      double prev_dt, json_t *st, uint64_t n)
{
	struct view V = { .color = fancy, .prev = prev, .prev_dt = prev_dt };
	char now[64], *buf = NULL;
	size_t len = 0;
	int r = 0;

	if (json) {
		time_str(true, now, sizeof(now));
		if (json_object_set_new(st, "time", json_string(now)) < 0 ||
		    ctl_json_print(st, JSON_REAL_PRECISION(15)) < 0)
			r = -ENOMEM;
	} else if (sanitize(st) < 0) {
		r = -ENOMEM;
	} else if (!fancy) {
		V.f = stdout;
		time_str(false, now, sizeof(now));
		if (n > 1)
			fputc('\n', stdout);
		printf("status at %s, every %gs\n", now, w->interval_s);
		status_print(&V, st);
	} else {
		V.f = open_memstream(&buf, &len);
		if (!V.f)
			return -ENOMEM;
		time_str(false, now, sizeof(now));
		fprintf(V.f, ESC_BOLD "status at %s, every %gs" ESC_RESET " (Ctrl-C to stop)\n",
			now, w->interval_s);
		status_print(&V, st);
		if (fclose(V.f) != 0) {
			free(buf);
			return -ENOMEM;
		}
		redraw(stdout, buf, len);
		free(buf);
	}
	if (r < 0)
		return r;
	if (fflush(stdout) != 0)
		return -errno;
	return ferror(stdout) ? -EIO : 0;
}

static int status_watch(const char *path, const struct ctl_watch *w, bool json)
{
	bool fancy = !json && fancy_output();
	struct sigaction sa = { .sa_handler = on_stop };
	sigset_t stop, old;
	json_t *prev = NULL;
	double next, prev_t = 0;
	uint64_t n = 0;
	int ret = 0;

	/* A reader that goes away (`| head`) ends the watch: EPIPE below. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	sa.sa_mask = stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	next = ctl_mono_now();
	for (;;) {
		json_t *st;
		double t;
		int r;

		r = ctl_status_get(path, &st);
		if (r < 0) {
			if (ctl_daemon_gone(r) && n)
				ctl_err("status --watch: ckptd went away after %llu report(s)",
					(unsigned long long)n);
			ret = ctl_daemon_gone(r) ? CTL_EXIT_NO_DAEMON : CTL_EXIT_ERROR;
			break;
		}
		t = ctl_mono_now();
		n++;

		sigprocmask(SIG_BLOCK, &stop, &old);
		if (fancy && !cursor_hidden) {
			fputs(ESC_HIDE ESC_HOME ESC_CLEAR, stdout);
			cursor_hidden = 1;
		}
		r = watch_emit(w, json, fancy, prev, t - prev_t, st, n);
		sigprocmask(SIG_SETMASK, &old, NULL);
		json_decref(prev);
		prev = st;
		prev_t = t;
		if (r == -EPIPE)
			break; /* nobody reads any more: done */
		if (r < 0) {
			ctl_err(r == -ENOMEM ? "out of memory" : "writing output: %s",
				strerror(-r));
			ret = CTL_EXIT_ERROR;
			break;
		}
		if (w->count && n >= w->count)
			break;

		/* A steady beat; a report that took longer than the interval
		 * delays the next, it never brings a burst of them. */
		next += w->interval_s;
		if (next < ctl_mono_now())
			next = ctl_mono_now();
		ctl_sleep_until(next);
	}
	json_decref(prev);
	sigprocmask(SIG_BLOCK, &stop, &old);
	if (cursor_hidden) {
		fputs(ESC_SHOW, stdout);
		fflush(stdout);
		cursor_hidden = 0;
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	return ret;
}

int ctl_status(const char *opt_socket, const char *opt_config, bool json,
	       const struct ctl_watch *w)
{
	char *path = ctl_socket_path(opt_socket, opt_config);
	int ret;

	if (!path)
		return CTL_EXIT_ERROR;
	ret = w && w->on ? status_watch(path, w, json) : status_once(path, json);
	free(path);
	return ret;
}
