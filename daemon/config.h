/* SPDX-License-Identifier: MIT */
/*
 * config.h - ckptd configuration: the config file, then the command line.
 *
 * File syntax: one `key = value` per line; '#' starts a comment; blank lines
 * are ignored; `root` may repeat.  Sizes take K/M/G/T suffixes (powers of
 * 1024); durations take ms/s/m/h (default s).  Keys (config_keys[] in
 * config.c is the one definition; systemd/ckptd.conf.example documents each
 * with the same default and range, and a unit test holds the two together):
 *
 *   socket              path of the listening socket  /run/ckptd/ckptd.sock
 *   socket_mode         octal mode of the socket      0660 (0..0777)
 *   root                an allowed checkpoint root (absolute, repeatable;
 *                       at least one is required)
 *   state_dir           where ckptd keeps its registry of work directories
 *                       (absolute)                    /var/lib/ckptd/state
 *   arena_max           cap on one client's arena     4G   (at least 1M)
 *   arena_total         cap on all arenas together    16G  (at least 1M)
 *   arena_per_uid       cap on the arenas and load pools of one uid
 *                       (users.h); unset: half of arena_total, at least
 *                       arena_max                     (at least 1M; from
 *                       arena_max to arena_total)
 *   load_share          pool per uid of pieces its loads read through the
 *                       daemon, shared by its loaders (share.h); counts in
 *                       arena_total, of which it takes at most half
 *                       (0: none)                   512M (0, or at least 16M)
 *   uring_depth         writes in flight per client   16   (1..1024)
 *   disk_depth          writes in flight of all clients together
 *                       (0: no cap)                   16   (0..65536)
 *   commit_deadline     a save not committed this long after it began fails
 *                                                     10m  (100ms..168h)
 *   handshake_timeout   a connection that has not completed HELLO this long
 *                       after it was accepted is closed
 *                                                     10s  (100ms..10m)
 *   max_clients         connections at once           256  (1..65536)
 *   max_clients_per_uid connections of one uid at once
 *                                                     64   (1..65536)
 *   o_direct            write with O_DIRECT (yes/no)  yes
 *   s3_endpoint         S3 endpoint URL (scheme://host[:port]); unset: the
 *                       AWS_ENDPOINT_URL_S3/AWS_ENDPOINT_URL variables, else
 *                       https://s3.<region>.amazonaws.com
 *   s3_region           unset: AWS_REGION/AWS_DEFAULT_REGION, the
 *                       credentials file, else us-east-1
 *   s3_addressing       path or virtual (bucket.host)   path
 *   s3_parts_in_flight  uploads at once              16   (1..256)
 *   s3_retries          retries of one request       8    (0..100)
 *   s3_backoff_base     first retry's wait cap       100ms (1ms..1m)
 *   s3_backoff_cap      any retry's wait cap         10s  (1ms..10m)
 *   s3_stall_timeout    a request moving no byte this long is retried
 *                                                    30s  (1s..1h)
 *   s3_connect_timeout                               10s  (100ms..10m)
 *   s3_credentials_file a shared-credentials file (AWS format, mode 0600);
 *                       the AWS_* variables win over it
 *   s3_profile          its profile               default
 *   s3_spill_dir        spill tier: S3 saves are written to this local
 *                       directory first (absolute; unset: off)
 *   s3_spill_keep       committed checkpoints kept per root in its restore
 *                       cache                     1    (0..1000)
 *   s3_spill_retry_cap  the longest wait between two tries of a spilled save
 *                       whose upload or commit met S3 failing
 *                                                    1m   (10ms..1h)
 *   metrics_listen      Prometheus metrics over HTTP on this loopback address
 *                       (127.0.0.1:PORT, [::1]:PORT, localhost:PORT; port 0:
 *                       any free one; unset: off)
 *   metrics_textfile    the same text written to this file (absolute; for
 *                       node_exporter's textfile collector; unset: off)
 *   retention           ROOT RULE: a rule of the retention policy of ROOT (a
 *                       root or a directory below one) and of every
 *                       directory below it (repeatable: a root's rules are
 *                       joined; the deepest ROOT that covers a directory
 *                       decides); RULE as format/retention.h spells it:
 *                       keep_last 3, keep_best 2 val_loss min, ...
 *   retention_sweep     how often every known directory is pruned again
 *                       (0: only after commits)  1h   (0, or 1s..168h)
 * Roots may be s3://bucket[/prefix] too.
 *
 * Composition (config_from_args): defaults, then the file, then the command
 * line in its order.  Every flag wins over the file; roots given on the
 * command line (-r DIR or -o root=DIR) replace the file's roots instead of
 * adding to them; the default file may be missing (then the flags must give
 * a root), a file named with -c may not.
 */
#ifndef CKPTD_CONFIG_H
#define CKPTD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "format/retention.h"

#define CONFIG_MAX_ROOTS 64
/* Rows config_keys may have (key_origin's size; config.c asserts it). */
#define CONFIG_MAX_KEYS 64
/* state_dir unless configured (a daemon not run by root uses the user's own
 * state directory instead, see main.c). */
#define CONFIG_DEFAULT_STATE_DIR "/var/lib/ckptd/state"

/* The config file ckptd and ckptctl read when no -c is given: SYSCONFDIR/
 * ckptd/ckptd.conf of the build (the Makefile passes CKPTD_CONFIG_PATH to
 * config.c only, so this is the one place that knows it). */
extern const char config_default_path[];

/* The retention policy of one directory (retention.h of the daemon). */
struct config_retention {
	char *root;                /* canonical once validated */
	char *origin;              /* "FILE:LINE" of its first rule, or NULL */
	struct ret_policy policy;
	char text[512];            /* the rules as given, joined with ", " */
};

struct config {
	char *socket_path;
	unsigned socket_mode;
	char *roots[CONFIG_MAX_ROOTS];     /* canonical (realpath) once validated */
	char *root_origin[CONFIG_MAX_ROOTS]; /* "FILE:LINE", "-r", "-o root" or NULL:
	                                      * where roots[i] came from, for messages */
	size_t n_roots;
	char *state_dir;
	uint64_t arena_max;
	uint64_t arena_total;
	uint64_t arena_per_uid;          /* 0: unset (config_validate derives it) */
	bool arena_per_uid_derived;      /* it did: derived again if validated again */
	uint64_t load_share;
	unsigned uring_depth;
	unsigned disk_depth;
	uint64_t commit_deadline_ms;
	uint64_t handshake_timeout_ms;
	unsigned max_clients;
	unsigned max_clients_per_uid;
	bool o_direct;
	/* S3 (roots s3://bucket/prefix); NULL strings: not set */
	char *s3_endpoint;
	char *s3_region;
	char *s3_addressing;             /* "path" or "virtual" */
	unsigned s3_parts_in_flight;
	unsigned s3_retries;
	uint64_t s3_backoff_base_ms;
	uint64_t s3_backoff_cap_ms;
	uint64_t s3_stall_timeout_ms;
	uint64_t s3_connect_timeout_ms;
	uint64_t s3_heartbeat_ms;         /* store_ops.attempt_renew, this often */
	char *s3_credentials_file;
	char *s3_profile;
	char *s3_spill_dir;              /* NULL: no spill tier */
	unsigned s3_spill_keep;
	uint64_t s3_spill_retry_cap_ms;
	/* Metrics (metrics.h); NULL: off */
	char *metrics_listen;            /* as written; config_parse_listen */
	char *metrics_textfile;
	struct config_retention retention[CONFIG_MAX_ROOTS];
	size_t n_retention;
	uint64_t retention_sweep_ms;
	/* Where each key was set last ("FILE:LINE", "option -o"), by its index
	 * in config_keys; NULL: its default.  For config_validate's messages
	 * about keys that must agree with each other. */
	char *key_origin[CONFIG_MAX_KEYS];
};

enum config_kind {
	CONFIG_SOCKET,   /* char *: a path that fits sockaddr_un */
	CONFIG_PATH,     /* char *: an absolute path */
	CONFIG_ROOT,     /* roots[]: an absolute path, repeatable */
	CONFIG_MODE,     /* unsigned: octal, min..max */
	CONFIG_SIZE,     /* uint64_t bytes: min..max */
	CONFIG_UINT,     /* unsigned: decimal, min..max */
	CONFIG_DURATION, /* uint64_t milliseconds: min..max */
	CONFIG_BOOL,     /* bool: yes/no, true/false, on/off, 1/0 */
	CONFIG_STRING,   /* char *: min..max bytes of printable ASCII, no space */
	CONFIG_LISTEN,   /* char *: a loopback address and port (config_parse_listen) */
	CONFIG_FILE,     /* char *: an absolute path naming a file, at most max bytes */
	CONFIG_RETENTION, /* retention[]: "ROOT RULE", repeatable */
};

/* One key: the table drives parsing, defaults, validation and messages. */
struct config_key {
	const char *key;
	enum config_kind kind;
	uint64_t min, max; /* in the kind's unit (bytes, ms, the number) */
	size_t offset;     /* of the field in struct config */
	const char *def;   /* the default in file syntax; NULL: none */
	const char *help;  /* one line, for --help */
};

extern const struct config_key config_keys[];
extern const size_t config_n_keys;

/* The entry of `key`, or NULL if there is no such key (exact match). */
const struct config_key *config_key_find(const char *key);

/*
 * The range of `k` as the example config and every message spell it:
 * "1..1024", "100ms..168h", "at least 1M", "0..0777"; "" for kinds without
 * one (paths, yes/no).  Returns snprintf's count.
 */
int config_key_range(const struct config_key *k, char *buf, size_t len);

/*
 * What a value of `k` must be, as every message says it: "a whole number in
 * 1..1024", "a duration in 100ms..168h (a whole number with ms, s, m or h;
 * no suffix: seconds)".  Returns snprintf's count.
 */
int config_key_expect(const struct config_key *k, char *buf, size_t len);

/* Sets every default (no roots).  Returns 0 or -ENOMEM; on failure *c is
 * left freed (config_free may still be called). */
int config_defaults(struct config *c);

/*
 * Reads a config file over the current values.  A missing file is -ENOENT
 * (the caller decides whether that is an error).  Unknown keys, bad values,
 * too many roots: -EINVAL with "PATH:LINE: reason" in err.  Roots remember
 * their "PATH:LINE" for config_validate's messages.
 */
int config_load(struct config *c, const char *path, char *err, size_t errlen);

/* Applies one `key=value`.  -EINVAL with the reason in err (a refused value
 * leaves the old one), -ENOMEM. */
int config_set(struct config *c, const char *key, const char *value, char *err, size_t errlen);

/* Removes every root (the command line's roots replace the file's). */
void config_clear_roots(struct config *c);

/*
 * Final checks once file and flags are applied: at least one root; each root
 * absolute and an existing directory (made canonical with realpath; the
 * message starts with where the root came from, e.g. "FILE:LINE: "); caps
 * consistent (arena_max <= arena_per_uid <= arena_total; an unset
 * arena_per_uid becomes half of arena_total, at least arena_max; the
 * message starts with where the offending key was set).  -EINVAL with the
 * reason in err.
 */
int config_validate(struct config *c, char *err, size_t errlen);

/* Frees what config_defaults and the setters allocated.  Accepts NULL and a
 * freed config. */
void config_free(struct config *c);

/* Parsers, exposed for tests.  Return 0 and the value, or -EINVAL. */
int config_parse_size(const char *s, uint64_t *ret_bytes);
int config_parse_duration_ms(const char *s, uint64_t *ret_ms);

/* A TCP address to listen on, loopback only. */
struct config_listen {
	int family;        /* AF_INET or AF_INET6 */
	uint8_t addr[16];  /* network order: 4 bytes for AF_INET */
	uint16_t port;     /* 0: any free port */
};

/*
 * Parses "127.0.0.1:PORT" (any 127.x.y.z), "[::1]:PORT" or "localhost:PORT"
 * (127.0.0.1, never looked up: /etc/hosts could point it anywhere), PORT a
 * decimal number in 0..65535.  Anything else, notably an address other than
 * loopback, is -EINVAL with the reason in why: what listens there answers
 * anyone who can reach it, without authentication.
 */
int config_parse_listen(const char *s, struct config_listen *ret, char *why, size_t whylen);

/*
 * Checks that `path` (absolute, validated by name_root_ok) is one of the
 * roots or lies below one, lexically and, once created, after resolving
 * symlinks.  Returns true if allowed.
 */
bool config_root_allowed(const struct config *c, const char *path);

/*
 * The allowed root `path` lies at or below, lexically (the deepest one if
 * roots nest; S3 locations in s3_url_format's spelling, as the roots
 * are), or NULL.  What lies below it is for the store's root_open to walk
 * and check (store.h).  Borrowed from c.
 */
const char *config_root_base(const struct config *c, const char *path);

/* ---- ckptd's command line ---- */

struct config_arg {
	char *key;         /* malloc'd */
	const char *value; /* borrowed from argv */
	char origin[8];    /* "-s", "-r" or "-o" */
};

struct config_args {
	const char *config_path; /* -c, else config_default_path */
	bool config_given;       /* -c was given: the file must exist */
	bool verbose, check_only, version, help;
	struct config_arg *sets; /* -s, -r, -o in command-line order */
	size_t n_sets;
};

/*
 * Parses ckptd's options (`argv` is borrowed and must outlive *ret).
 * Returns 0, -EINVAL on bad usage (the reason in err: exit 2), -ENOMEM.
 */
int config_args_parse(struct config_args *ret, int argc, char **argv, char *err, size_t errlen);
void config_args_free(struct config_args *a);

/* ckptd's --help text. */
void config_usage(FILE *f);

/*
 * Builds the daemon's configuration as the header comment says (defaults,
 * file, flags, config_validate).  On success *ret is the configuration to
 * free with config_free.  Returns -EINVAL with the reason in err (an invalid
 * configuration: exit 78), -ENOENT if a file named with -c does not exist
 * (also exit 78), or -ENOMEM.
 */
int config_from_args(struct config *ret, const struct config_args *a, char *err, size_t errlen);

#endif
