/* SPDX-License-Identifier: MIT */
/* ctl.h - what ckptctl's files share (ckptctl.c, prune.c, status.c, wait.c). */
#ifndef CKPT_CTL_H
#define CKPT_CTL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "format/retention.h"

/* Exit statuses (README: ckptctl). */
#define CTL_EXIT_ERROR   1
#define CTL_EXIT_USAGE   2
#define CTL_EXIT_NO_DAEMON 3 /* no ckptd answers on the socket (or it went away) */
#define CTL_EXIT_TIMEOUT 4 /* wait: the checkpoint was not committed in time */
#define CTL_EXIT_DEGRADED 5 /* done, but part of the input could not be read */
#define CTL_EXIT_REFUSED 6 /* a safety rule refused the operation */

/* "ckptctl: <message>" on stderr, control bytes shown as '?'. */
void ctl_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One compact JSON object on its own line (--json).  0 or -ENOMEM. */
int ctl_json_line(const json_t *j);
/* The same with extra json_dumps flags (JSON_REAL_PRECISION for measured
 * values). */
int ctl_json_print(const json_t *j, size_t flags);
/* "512 B", "1.5 KiB", "4.0 GiB" into buf; returns buf. */
const char *ctl_human_size(uint64_t n, char *buf, size_t len);
/* "850ms", "12.5s", "3m 4s", "2h 5m", "3d 4h" ("?" for a negative or absurd
 * value) into buf; returns buf. */
const char *ctl_human_duration(double s, char *buf, size_t len);
/* Display width of a name column: the longest name, at least the header's,
 * capped. */
int ctl_name_width(size_t longest, size_t header);
/* A copy of a name fit to print and to put in JSON ('?' for control and
 * non-ASCII bytes), or NULL (out of memory). */
char *ctl_display(const char *s);

/* ckptctl pin|unpin ROOT NAME (prune.c): returns the exit status. */
int ctl_pin(const char *root, const char *name, bool pin, bool json);

/* ckptctl prune ROOT [--dry-run] (prune.c): returns the exit status. */
int ctl_prune(const char *root, const struct ret_policy *p, bool force, bool dry_run, bool json);

/* ckptctl verify ROOT/NAME (verify.c): every CRC, coverage and size of one
 * committed checkpoint; returns the exit status (0 whole, 1 damaged or
 * unreadable). */
int ctl_verify(const char *path, bool json);

/* Cap on a manifest.json ckptctl reads. */
#define CTL_MANIFEST_MAX (1024ull << 20)

/*
 * What list (and wait) make of a checkpoint directory's manifest.json: `r`
 * is fs_read_file_at's or store_s3_get's result and `text` its buffer (taken
 * over, may be NULL when r < 0).  Returns CTL_CKPT_COMMITTED with *m filled
 * (manifest_free it), CTL_CKPT_CORRUPT, CTL_CKPT_NEWER (a later format) or
 * CTL_CKPT_REMOVING (a removal's tombstone)
 * with the reason in err, or -ENOMEM.
 */
enum {
	CTL_CKPT_COMMITTED = 0,
	CTL_CKPT_CORRUPT = 1,
	CTL_CKPT_NEWER = 2,
	CTL_CKPT_REMOVING = 3, /* a tombstone stands in for the manifest */
};
struct manifest;
int ctl_manifest_judge(int r, char *text, size_t len, struct manifest *m, char *err,
		       size_t errlen);

/* S3 roots (ckptctl.c).  ctl_s3_start: the process's S3 client from the
 * AWS_* environment, once; 0 or -errno with the reason printed.
 * ctl_s3_probe: 1 if anything is stored under the URL's prefix, 0 if
 * nothing, -errno with the reason printed (a missing bucket, a refusal).
 * ctl_s3_denied: prints what to check after a 403.  ctl_s3_stop: wipes the
 * credentials (main calls it at the end). */
struct s3_loc;
int ctl_s3_start(const char *url);
int ctl_s3_probe(const char *url, const struct s3_loc *loc);
void ctl_s3_denied(const char *url, const char *err);
void ctl_s3_stop(void);

/* CLOCK_MONOTONIC in seconds; sleeping until such a time (through
 * signals whose handlers return) (status.c). */
double ctl_mono_now(void);
void ctl_sleep_until(double t);

/* ckptctl status [--watch] (status.c): returns the exit status. */
struct ctl_watch {
	bool on;           /* --watch: a report every interval_s */
	double interval_s; /* CTL_WATCH_MIN_S..CTL_WATCH_MAX_S */
	uint64_t count;    /* stop after this many reports; 0: until a signal */
};
#define CTL_WATCH_DEFAULT_S 1.0
#define CTL_WATCH_MIN_S     0.1
#define CTL_WATCH_MAX_S     3600.0
int ctl_status(const char *opt_socket, const char *opt_config, bool json,
	       const struct ctl_watch *w);

/* Asking the daemon (status.c).  ctl_socket_path: the socket to ask: -s,
 * else $CKPTD_SOCKET, else the config file's `socket` (an explicit -c must
 * load; the default one is optional), else the built-in default; malloc'd,
 * or NULL (reason printed).  ctl_session: a control connection, greeted
 * (HELLO, HELLO_OK): its fd, or -errno (reason printed).  ctl_expect:
 * receives one message into buf (PROTO_MSG_MAX bytes) and checks it is of
 * type `want`; a PROTO_ERROR is printed and returned as -EREMOTEIO; the fd
 * that came along into *ret_fd (-1: none) when ret_fd is given.
 * ctl_status_get: the report as a JSON object (0 and *ret), or -errno with
 * the reason printed.  ctl_daemon_gone: the error means no daemon is there
 * (any more): nothing listens, or it hung up. */
char *ctl_socket_path(const char *opt_socket, const char *opt_config);
int ctl_session(const char *path);
int ctl_expect(int sock, const char *path, unsigned want, void *buf, int *ret_fd);
int ctl_status_get(const char *path, json_t **ret);
bool ctl_daemon_gone(int err);

/* ckptctl spill list|drop (spill.c): the spilled saves the daemon owes a
 * commit, and an operator's giving one up (`what`: its attempt id or
 * ROOT/NAME).  Returns the exit status. */
int ctl_spill(const char *opt_socket, const char *opt_config, const char *sub,
	      const char *what, bool json);

/* ckptctl wait ROOT NAME | ROOT --step N (wait.c): name NULL waits for any
 * checkpoint of `step`; timeout_s < 0 waits forever, 0 checks once.
 * Returns the exit status (0, 1, CTL_EXIT_USAGE for a NAME no checkpoint
 * can have, or CTL_EXIT_TIMEOUT). */
#define CTL_WAIT_MAX_S 100000000.0 /* --timeout's cap (3 years) */
int ctl_wait(const char *root, const char *name, uint64_t step, double timeout_s, bool json);

/* ckptctl gc ROOT [--dry-run] [--grace DURATION] (gc.c): removes dead saves'
 * work areas and unfinished removals older than grace_s; returns the exit
 * status. */
#define CTL_GC_GRACE_S (24 * 3600) /* --grace's default */
int ctl_gc(const char *root, int64_t grace_s, bool dry_run, bool json);

#endif
