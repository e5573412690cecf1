/* SPDX-License-Identifier: MIT */
/*
 * config.c - ckptd configuration: the key table, defaults, the config file,
 * the command line and the final consistency checks.  See config.h for the
 * syntax, the keys and how file and flags compose.
 *
 * Parsing is strict on purpose: a typo in a daemon's config should stop it at
 * start-up with "PATH:LINE: reason", not run it with a silently different
 * value.  Sizes are whole numbers (no "1.5G"): the value the admin reads is
 * the exact byte count the daemon uses.  Every key is one row of config_keys:
 * its parser, range, default and the text of its error message all come from
 * that row, so they cannot disagree.
 */
#include "daemon/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "ckpt.h"
#include "store/fsutil.h"
#include "store/s3_addr.h"

/* The build passes -DCKPTD_CONFIG_PATH="$(SYSCONFDIR)/ckptd/ckptd.conf". */
#ifndef CKPTD_CONFIG_PATH
#define CKPTD_CONFIG_PATH "/etc/ckptd/ckptd.conf"
#endif

const char config_default_path[] = CKPTD_CONFIG_PATH;

#define CONFIG_LINE_MAX 4096 /* longest accepted config line */
#define SUN_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)
#define MS_PER_S 1000ull
#define MS_PER_M (60 * MS_PER_S)
#define MS_PER_H (60 * MS_PER_M)
/* A file the daemon replaces through ".NAME.tmp" (metrics.c): the name
 * must leave room for the five bytes around it. */
#define FILE_NAME_MAX (NAME_MAX - 5)

#define KEY(name, kind_, lo, hi, field, def_, help_)                                       \
	{                                                                                   \
		.key = name, .kind = kind_, .min = lo, .max = hi,                           \
		.offset = offsetof(struct config, field), .def = def_, .help = help_,       \
	}

const struct config_key config_keys[] = {
	KEY("socket", CONFIG_SOCKET, 1, SUN_PATH_MAX, socket_path, CKPT_DEFAULT_SOCKET,
	    "listening socket"),
	KEY("socket_mode", CONFIG_MODE, 0, 0777, socket_mode, "0660",
	    "its permissions (octal)"),
	KEY("root", CONFIG_ROOT, 1, PATH_MAX - 1, roots, NULL,
	    "allowed checkpoint root (repeatable)"),
	KEY("state_dir", CONFIG_PATH, 1, PATH_MAX - 1, state_dir, CONFIG_DEFAULT_STATE_DIR,
	    "registry of work directories"),
	/* At least one CRC block: the smallest slot. */
	KEY("arena_max", CONFIG_SIZE, 1ull << 20, UINT64_MAX, arena_max, "4G",
	    "staging arena of one client"),
	KEY("arena_total", CONFIG_SIZE, 1ull << 20, UINT64_MAX, arena_total, "16G",
	    "all arenas and resident images together"),
	/* No default of its own: derived from arena_total (config_validate). */
	KEY("arena_per_uid", CONFIG_SIZE, 1ull << 20, UINT64_MAX, arena_per_uid, NULL,
	    "arenas and load pools of one uid (unset: half of arena_total)"),
	KEY("load_share", CONFIG_SIZE, 0, UINT64_MAX, load_share, "512M",
	    "pool per uid of pieces its loads read, shared by its loaders (0: none)"),
	KEY("uring_depth", CONFIG_UINT, 1, 1024, uring_depth, "16",
	    "writes in flight per client"),
	KEY("disk_depth", CONFIG_UINT, 0, 65536, disk_depth, "16",
	    "writes in flight of all clients together (0: no cap)"),
	KEY("commit_deadline", CONFIG_DURATION, 100, 168 * MS_PER_H, commit_deadline_ms, "10m",
	    "a save must commit within this"),
	KEY("handshake_timeout", CONFIG_DURATION, 100, 10 * MS_PER_M, handshake_timeout_ms, "10s",
	    "HELLO must arrive within this"),
	KEY("max_clients", CONFIG_UINT, 1, 65536, max_clients, "256", "connections at once"),
	KEY("max_clients_per_uid", CONFIG_UINT, 1, 65536, max_clients_per_uid, "64",
	    "connections of one uid at once"),
	KEY("o_direct", CONFIG_BOOL, 0, 1, o_direct, "yes", "write with O_DIRECT"),
	KEY("s3_endpoint", CONFIG_STRING, 1, 255, s3_endpoint, NULL,
	    "S3 endpoint URL (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS)"),
	KEY("s3_region", CONFIG_STRING, 1, 63, s3_region, NULL,
	    "S3 region (default: AWS_REGION, AWS_DEFAULT_REGION, us-east-1)"),
	KEY("s3_addressing", CONFIG_STRING, 4, 7, s3_addressing, "path",
	    "S3 bucket addressing: path or virtual"),
	KEY("s3_parts_in_flight", CONFIG_UINT, 1, 256, s3_parts_in_flight, "16",
	    "S3 uploads at once"),
	KEY("s3_retries", CONFIG_UINT, 0, 100, s3_retries, "8", "retries of one S3 request"),
	KEY("s3_backoff_base", CONFIG_DURATION, 1, MS_PER_M, s3_backoff_base_ms, "100ms",
	    "first S3 retry waits at most this"),
	KEY("s3_backoff_cap", CONFIG_DURATION, 1, 10 * MS_PER_M, s3_backoff_cap_ms, "10s",
	    "no S3 retry waits longer"),
	KEY("s3_stall_timeout", CONFIG_DURATION, MS_PER_S, MS_PER_H, s3_stall_timeout_ms, "30s",
	    "an S3 request moving no byte this long is retried"),
	KEY("s3_connect_timeout", CONFIG_DURATION, 100, 10 * MS_PER_M, s3_connect_timeout_ms,
	    "10s", "connecting to S3"),
	KEY("s3_heartbeat", CONFIG_DURATION, 100, MS_PER_H, s3_heartbeat_ms, "1m",
	    "a live S3 save renews its work area's heartbeat this often (ckptctl gc's --grace "
	    "must be longer)"),
	KEY("s3_credentials_file", CONFIG_PATH, 1, PATH_MAX - 1, s3_credentials_file, NULL,
	    "AWS shared-credentials file"),
	KEY("s3_profile", CONFIG_STRING, 1, 63, s3_profile, "default",
	    "its profile"),
	KEY("s3_spill_dir", CONFIG_PATH, 1, PATH_MAX - 1, s3_spill_dir, NULL,
	    "S3 saves go through this local directory first (spill tier)"),
	KEY("s3_spill_keep", CONFIG_UINT, 0, 1000, s3_spill_keep, "1",
	    "committed checkpoints kept per root in the spill directory"),
	KEY("s3_spill_retry_cap", CONFIG_DURATION, 10, MS_PER_H, s3_spill_retry_cap_ms, "1m",
	    "a spilled save the store refused is tried again at least this often"),
	KEY("metrics_listen", CONFIG_LISTEN, 0, 65535, metrics_listen, NULL,
	    "Prometheus metrics on this loopback HOST:PORT (unset: off)"),
	KEY("metrics_textfile", CONFIG_FILE, 1, PATH_MAX - 1, metrics_textfile, NULL,
	    "the metrics written to this file too, for node_exporter (unset: off)"),
	KEY("retention", CONFIG_RETENTION, 1, PATH_MAX - 1, retention, NULL,
	    "ROOT RULE: a retention rule for ROOT and below (repeatable)"),
	KEY("retention_sweep", CONFIG_DURATION, 0, 168 * MS_PER_H, retention_sweep_ms, "1h",
	    "every known directory pruned again this often (0: only after commits)"),
};

const size_t config_n_keys = sizeof(config_keys) / sizeof(config_keys[0]);
_Static_assert(sizeof(config_keys) / sizeof(config_keys[0]) <= CONFIG_MAX_KEYS,
	       "struct config's key_origin[] is too small for config_keys");

const struct config_key *config_key_find(const char *key)
{
	for (size_t i = 0; i < config_n_keys; i++)
		if (strcmp(config_keys[i].key, key) == 0)
			return &config_keys[i];
	return NULL;
}

/* "1M", "16G", "1536K", "0": the largest suffix that divides exactly. */
static void fmt_size(uint64_t v, char *buf, size_t len)
{
	static const char units[] = "KMGT";
	int u = -1;

	while (v && u < 3 && v % 1024 == 0) {
		v /= 1024;
		u++;
	}
	if (u < 0)
		snprintf(buf, len, "%llu", (unsigned long long)v);
	else
		snprintf(buf, len, "%llu%c", (unsigned long long)v, units[u]);
}

/* "100ms", "10s", "10m", "168h": the largest unit that divides exactly. */
static void fmt_duration(uint64_t ms, char *buf, size_t len)
{
	if (ms && ms % MS_PER_H == 0)
		snprintf(buf, len, "%lluh", (unsigned long long)(ms / MS_PER_H));
	else if (ms && ms % MS_PER_M == 0)
		snprintf(buf, len, "%llum", (unsigned long long)(ms / MS_PER_M));
	else if (ms % MS_PER_S == 0)
		snprintf(buf, len, "%llus", (unsigned long long)(ms / MS_PER_S));
	else
		snprintf(buf, len, "%llums", (unsigned long long)ms);
}

int config_key_range(const struct config_key *k, char *buf, size_t len)
{
	char lo[32], hi[32];

	switch (k->kind) {
	case CONFIG_MODE:
		/* "0..0777": octal with its leading 0, but a bare 0 for zero */
		return snprintf(buf, len, "%#llo..%#llo", (unsigned long long)k->min,
				(unsigned long long)k->max);
	case CONFIG_SIZE:
		fmt_size(k->min, lo, sizeof(lo));
		fmt_size(k->max, hi, sizeof(hi));
		if (k->max == UINT64_MAX)
			return snprintf(buf, len, "at least %s", lo);
		return snprintf(buf, len, "%s..%s", lo, hi);
	case CONFIG_UINT:
		return snprintf(buf, len, "%llu..%llu", (unsigned long long)k->min,
				(unsigned long long)k->max);
	case CONFIG_DURATION:
		fmt_duration(k->min, lo, sizeof(lo));
		fmt_duration(k->max, hi, sizeof(hi));
		return snprintf(buf, len, "%s..%s", lo, hi);
	case CONFIG_SOCKET:
	case CONFIG_PATH:
	case CONFIG_ROOT:
	case CONFIG_BOOL:
	case CONFIG_STRING:
	case CONFIG_LISTEN:
	case CONFIG_FILE:
	case CONFIG_RETENTION:
		break;
	}
	return snprintf(buf, len, "%s", "");
}

int config_key_expect(const struct config_key *k, char *buf, size_t len)
{
	char range[64];

	config_key_range(k, range, sizeof(range));
	switch (k->kind) {
	case CONFIG_SOCKET:
		return snprintf(buf, len, "a path of %llu..%llu bytes", (unsigned long long)k->min,
				(unsigned long long)k->max);
	case CONFIG_PATH:
		return snprintf(buf, len, "an absolute path of at most %llu bytes",
				(unsigned long long)k->max);
	case CONFIG_ROOT:
		return snprintf(buf, len, "an absolute path of at most %llu bytes, or "
				"s3://bucket[/prefix]", (unsigned long long)k->max);
	case CONFIG_STRING:
		return snprintf(buf, len, "%llu..%llu printable characters without spaces",
				(unsigned long long)k->min, (unsigned long long)k->max);
	case CONFIG_LISTEN:
		return snprintf(buf, len, "a loopback address and port: 127.0.0.1:PORT, [::1]:PORT "
				"or localhost:PORT (PORT in 0..65535; 0: any free port)");
	case CONFIG_FILE:
		return snprintf(buf, len, "an absolute path of a file of at most %llu bytes (its "
				"name at most %d)", (unsigned long long)k->max, FILE_NAME_MAX);
	case CONFIG_RETENTION:
		return snprintf(buf, len, "ROOT RULE: a directory (absolute) or s3://bucket[/prefix], "
				"then a rule such as keep_last 3");
	case CONFIG_MODE:
		return snprintf(buf, len, "an octal mode in %s", range);
	case CONFIG_SIZE:
		return snprintf(buf, len,
				"a size %s%s (a whole number of bytes with an optional K, M, G or "
				"T suffix)",
				k->max == UINT64_MAX ? "of " : "in ", range);
	case CONFIG_UINT:
		return snprintf(buf, len, "a whole number in %s", range);
	case CONFIG_DURATION:
		return snprintf(buf, len,
				"a duration in %s (a whole number with ms, s, m or h; no suffix: "
				"seconds)",
				range);
	case CONFIG_BOOL:
		break;
	}
	return snprintf(buf, len, "yes or no");
}

/*
 * Leading decimal digits of s as a u64.  Returns the number of digits read
 * (0 if none) and sets *overflow if the value does not fit.
 */
static size_t parse_digits(const char *s, uint64_t *ret, bool *overflow)
{
	uint64_t v = 0;
	size_t n = 0;

	*overflow = false;
	for (; isdigit((unsigned char)s[n]); n++) {
		unsigned d = (unsigned)(s[n] - '0');
		if (v > (UINT64_MAX - d) / 10)
			*overflow = true;
		else
			v = v * 10 + d;
	}
	*ret = v;
	return n;
}

int config_parse_size(const char *s, uint64_t *ret_bytes)
{
	uint64_t v, mult;
	bool overflow;
	size_t n;

	if (!s)
		return -EINVAL;
	n = parse_digits(s, &v, &overflow);
	if (n == 0 || overflow)
		return -EINVAL;

	switch (s[n]) {
	case '\0':
		mult = 1;
		break;
	case 'k': case 'K':
		mult = 1ull << 10;
		break;
	case 'm': case 'M':
		mult = 1ull << 20;
		break;
	case 'g': case 'G':
		mult = 1ull << 30;
		break;
	case 't': case 'T':
		mult = 1ull << 40;
		break;
	default:
		/* Includes '.', so fractions such as "1.5G" are refused. */
		return -EINVAL;
	}
	if (mult != 1 && s[n + 1] != '\0')
		return -EINVAL;
	if (v > UINT64_MAX / mult)
		return -EINVAL;
	*ret_bytes = v * mult;
	return 0;
}

int config_parse_duration_ms(const char *s, uint64_t *ret_ms)
{
	uint64_t v, mult;
	bool overflow;
	size_t n;

	if (!s)
		return -EINVAL;
	n = parse_digits(s, &v, &overflow);
	if (n == 0 || overflow)
		return -EINVAL;

	if (strcmp(s + n, "") == 0 || strcmp(s + n, "s") == 0)
		mult = 1000;
	else if (strcmp(s + n, "ms") == 0)
		mult = 1;
	else if (strcmp(s + n, "m") == 0)
		mult = 60ull * 1000;
	else if (strcmp(s + n, "h") == 0)
		mult = 3600ull * 1000;
	else
		return -EINVAL;
	if (v > UINT64_MAX / mult)
		return -EINVAL;
	*ret_ms = v * mult;
	return 0;
}

/* A decimal integer, nothing else on the string. */
static int parse_uint(const char *s, uint64_t *ret)
{
	uint64_t v;
	bool overflow;
	size_t n = parse_digits(s, &v, &overflow);

	if (n == 0 || overflow || s[n] != '\0')
		return -EINVAL;
	*ret = v;
	return 0;
}

/* An octal number ("0660", "660"), nothing else on the string. */
static int parse_octal(const char *s, uint64_t *ret)
{
	uint64_t v = 0;
	size_t n;

	for (n = 0; s[n] >= '0' && s[n] <= '7'; n++) {
		if (v > (UINT64_MAX >> 3))
			return -EINVAL;
		v = v << 3 | (uint64_t)(s[n] - '0');
	}
	if (n == 0 || s[n] != '\0')
		return -EINVAL;
	*ret = v;
	return 0;
}

int config_parse_listen(const char *s, struct config_listen *ret, char *why, size_t whylen)
{
	static const char forms[] = "127.0.0.1:PORT, [::1]:PORT or localhost:PORT";
	struct config_listen l = { 0 };
	const char *port, *sep, *h;
	char host[64];
	size_t hlen;
	uint64_t v;

	if (s[0] == '[') {
		sep = strchr(s, ']');
		if (!sep || sep[1] != ':') {
			snprintf(why, whylen, "not HOST:PORT (%s)", forms);
			return -EINVAL;
		}
		h = s + 1;
		hlen = (size_t)(sep - h);
		port = sep + 2;
		l.family = AF_INET6;
	} else {
		sep = strrchr(s, ':');
		if (!sep) {
			snprintf(why, whylen, "not HOST:PORT (%s)", forms);
			return -EINVAL;
		}
		if (memchr(s, ':', (size_t)(sep - s))) {
			snprintf(why, whylen, "an IPv6 address is written in brackets: [::1]:PORT");
			return -EINVAL;
		}
		h = s;
		hlen = (size_t)(sep - s);
		port = sep + 1;
		l.family = AF_INET;
	}
	if (hlen == 0 || hlen >= sizeof(host)) {
		snprintf(why, whylen, "not HOST:PORT (%s)", forms);
		return -EINVAL;
	}
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	if (strlen(port) > 5 || parse_uint(port, &v) < 0 || v > 65535) {
		snprintf(why, whylen, "port '%.16s' is not a whole number in 0..65535", port);
		return -EINVAL;
	}
	l.port = (uint16_t)v;
	if (l.family == AF_INET && !strcasecmp(host, "localhost")) {
		/* Not looked up: the name means the loopback address here. */
		l.addr[0] = 127;
		l.addr[3] = 1;
	} else if (inet_pton(l.family, host, l.addr) != 1) {
		snprintf(why, whylen, "'%s' is not an IP address (%s)", host, forms);
		return -EINVAL;
	}
	if ((l.family == AF_INET && l.addr[0] != 127) ||
	    (l.family == AF_INET6 && !IN6_IS_ADDR_LOOPBACK((struct in6_addr *)l.addr))) {
		snprintf(why, whylen,
			 "%s is not a loopback address: the metrics endpoint has no "
			 "authentication, so it listens on %s only",
			 host, forms);
		return -EINVAL;
	}
	*ret = l;
	return 0;
}

/* An absolute path whose last component names a file ("/a/b.prom", not
 * "/a/", "/a/." or "/"). */
static bool file_path_ok(const char *v, uint64_t max)
{
	const char *name = strrchr(v, '/');

	if (v[0] != '/' || strlen(v) > max)
		return false;
	name++;
	return name[0] && strcmp(name, ".") && strcmp(name, "..") &&
	       strlen(name) <= FILE_NAME_MAX;
}

static int parse_bool(const char *s, bool *ret)
{
	static const char *const yes[] = { "yes", "true", "on", "1" };
	static const char *const no[] = { "no", "false", "off", "0" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

static int replace_str(char **field, const char *value)
{
	char *copy = strdup(value);

	if (!copy)
		return -ENOMEM;
	free(*field);
	*field = copy;
	return 0;
}

/* "ORIGIN: " or "" */
static const char *origin_sep(const char *origin)
{
	return origin ? ": " : "";
}

/* "ROOT RULE": the rule joins ROOT's policy (a new entry for a new ROOT). */
static int add_retention(struct config *c, const struct config_key *k, const char *value,
			 const char *origin, char *err, size_t errlen)
{
	char root[PATH_MAX], canon[S3_BUCKET_MAX + S3_PREFIX_MAX + 8], why[256];
	const char *sp = value + strcspn(value, " \t");
	struct config_retention *e = NULL;
	size_t rl = (size_t)(sp - value), at;
	bool fresh = false;

	while (*sp == ' ' || *sp == '\t')
		sp++;
	if (!rl || rl >= sizeof(root) || !*sp ||
	    (value[0] != '/' && strncmp(value, "s3://", 5))) {
		char expect[160];

		config_key_expect(k, expect, sizeof(expect));
		snprintf(err, errlen, "retention: '%.256s' is not %s", value, expect);
		return -EINVAL;
	}
	memcpy(root, value, rl);
	root[rl] = '\0';
	if (s3_is_url(root)) {
		struct s3_loc loc;

		if (s3_url_parse(root, &loc, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "retention: root '%.256s': %s", root, why);
			return -EINVAL;
		}
		s3_url_format(&loc, canon, sizeof(canon));
		snprintf(root, sizeof(root), "%s", canon);
	}
	for (size_t i = 0; i < c->n_retention && !e; i++)
		if (!strcmp(c->retention[i].root, root))
			e = &c->retention[i];
	if (!e) {
		fresh = true;
		if (c->n_retention >= CONFIG_MAX_ROOTS) {
			snprintf(err, errlen, "retention: more than %d directories", CONFIG_MAX_ROOTS);
			return -EINVAL;
		}
		e = &c->retention[c->n_retention];
		memset(e, 0, sizeof(*e));
		e->root = strdup(root);
		e->origin = origin ? strdup(origin) : NULL;
		if (!e->root || (origin && !e->origin)) {
			free(e->root);
			free(e->origin);
			return -ENOMEM;
		}
		c->n_retention++;
	}
	if (ret_policy_parse_rule(&e->policy, sp, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "retention of '%.256s': %s", root, why);
		if (fresh) { /* (no entry is left by a refused line) */
			free(e->root);
			free(e->origin);
			e->root = e->origin = NULL;
			c->n_retention--;
		}
		return -EINVAL;
	}
	at = strlen(e->text);
	if (at + strlen(sp) + 3 >= sizeof(e->text)) {
		snprintf(err, errlen, "retention of '%.256s': too many rules", root);
		return -EINVAL;
	}
	snprintf(e->text + at, sizeof(e->text) - at, "%s%s", at ? ", " : "", sp);
	return 0;
}

static int add_root(struct config *c, const struct config_key *k, const char *value,
		    const char *origin, char *err, size_t errlen)
{
	char *copy, *from = NULL;
	char canon[S3_BUCKET_MAX + S3_PREFIX_MAX + 8];

	if (s3_is_url(value)) {
		struct s3_loc loc;
		char why[256];

		if (s3_url_parse(value, &loc, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "root '%.256s': %s", value, why);
			return -EINVAL;
		}
		/* One spelling per location, so that the lexical checks of
		 * config_root_allowed compare like with like. */
		s3_url_format(&loc, canon, sizeof(canon));
		value = canon;
	} else if (value[0] != '/' || strlen(value) > k->max) {
		char expect[128];

		config_key_expect(k, expect, sizeof(expect));
		snprintf(err, errlen, "root '%.256s' is not %s", value, expect);
		return -EINVAL;
	}
	if (c->n_roots >= CONFIG_MAX_ROOTS) {
		snprintf(err, errlen, "root '%.256s': more than %d roots", value, CONFIG_MAX_ROOTS);
		return -EINVAL;
	}
	copy = strdup(value);
	if (origin)
		from = strdup(origin);
	if (!copy || (origin && !from)) {
		free(copy);
		free(from);
		return -ENOMEM;
	}
	c->roots[c->n_roots] = copy;
	c->root_origin[c->n_roots] = from;
	c->n_roots++;
	return 0;
}

static bool string_ok(const char *v, uint64_t min, uint64_t max)
{
	size_t n = strlen(v);

	if (n < min || n > max)
		return false;
	for (size_t i = 0; i < n; i++)
		if (v[i] <= 0x20 || v[i] > 0x7e)
			return false;
	return true;
}

/* Applies one value to the field of `k`; a refused value leaves the old
 * one.  `origin` (may be NULL) is remembered with a root. */
static int set_key(struct config *c, const struct config_key *k, const char *value,
		   const char *origin, char *err, size_t errlen)
{
	void *field = (char *)c + k->offset;
	char expect[160];
	uint64_t v = 0;
	bool b;

	switch (k->kind) {
	case CONFIG_SOCKET:
		if (strlen(value) < k->min || strlen(value) > k->max)
			break;
		return replace_str(field, value);
	case CONFIG_PATH:
		if (value[0] != '/' || strlen(value) > k->max)
			break;
		return replace_str(field, value);
	case CONFIG_STRING:
		if (!string_ok(value, k->min, k->max))
			break;
		return replace_str(field, value);
	case CONFIG_LISTEN: {
		struct config_listen l;
		char why[256];

		if (config_parse_listen(value, &l, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "%s: '%.256s': %s", k->key, value, why);
			return -EINVAL;
		}
		return replace_str(field, value);
	}
	case CONFIG_FILE:
		if (!file_path_ok(value, k->max))
			break;
		return replace_str(field, value);
	case CONFIG_ROOT:
		return add_root(c, k, value, origin, err, errlen);
	case CONFIG_RETENTION:
		return add_retention(c, k, value, origin, err, errlen);
	case CONFIG_MODE:
		if (parse_octal(value, &v) < 0 || v < k->min || v > k->max)
			break;
		*(unsigned *)field = (unsigned)v;
		return 0;
	case CONFIG_SIZE:
		if (config_parse_size(value, &v) < 0 || v < k->min || v > k->max)
			break;
		*(uint64_t *)field = v;
		return 0;
	case CONFIG_UINT:
		if (parse_uint(value, &v) < 0 || v < k->min || v > k->max)
			break;
		*(unsigned *)field = (unsigned)v;
		return 0;
	case CONFIG_DURATION:
		if (config_parse_duration_ms(value, &v) < 0 || v < k->min || v > k->max)
			break;
		*(uint64_t *)field = v;
		return 0;
	case CONFIG_BOOL:
		if (parse_bool(value, &b) < 0)
			break;
		*(bool *)field = b;
		return 0;
	}
	config_key_expect(k, expect, sizeof(expect));
	snprintf(err, errlen, "%s: '%.256s' is not %s", k->key, value, expect);
	return -EINVAL;
}

static int set_from(struct config *c, const char *key, const char *value, const char *origin,
		    char *err, size_t errlen)
{
	const struct config_key *k = config_key_find(key);
	size_t i;
	int r;

	if (!k) {
		snprintf(err, errlen, "unknown key '%.64s'", key);
		return -EINVAL;
	}
	r = set_key(c, k, value, origin, err, errlen);
	if (r < 0)
		return r;
	/* The value is set even if its origin cannot be remembered: a
	 * message then names the key without FILE:LINE. */
	if (k->offset == offsetof(struct config, arena_per_uid))
		c->arena_per_uid_derived = false;
	i = (size_t)(k - config_keys);
	free(c->key_origin[i]);
	c->key_origin[i] = origin ? strdup(origin) : NULL;
	return 0;
}

/* Where key was set last ("FILE:LINE", "option -o"), or NULL. */
static const char *key_origin(const struct config *c, const char *key)
{
	const struct config_key *k = config_key_find(key);

	return k ? c->key_origin[k - config_keys] : NULL;
}

/* The same as a message prefix: "FILE:LINE: ", or "". */
static void key_from(const struct config *c, const char *key, char *buf, size_t len)
{
	const char *o = key_origin(c, key);

	snprintf(buf, len, "%s%s", o ? o : "", origin_sep(o));
}

/*
 * The caps on staging memory must nest: one client's arena (arena_max)
 * within one uid's share (arena_per_uid) within the node's (arena_total).
 * An unset arena_per_uid is half of arena_total, so that one user leaves
 * the other half to the rest; never below arena_max, so that a client can
 * still get the arena the admin allowed it.
 */
static int validate_arena_caps(struct config *c, char *err, size_t errlen)
{
	char from[PATH_MAX + 32];

	if (c->arena_max > c->arena_total) {
		key_from(c, key_origin(c, "arena_max") ? "arena_max" : "arena_total", from,
			 sizeof(from));
		snprintf(err, errlen,
			 "%sarena_max (%llu bytes) is larger than arena_total (%llu bytes)", from,
			 (unsigned long long)c->arena_max, (unsigned long long)c->arena_total);
		return -EINVAL;
	}
	if (!c->arena_per_uid || c->arena_per_uid_derived) {
		c->arena_per_uid = c->arena_total / 2 > c->arena_max ? c->arena_total / 2 :
									c->arena_max;
		c->arena_per_uid_derived = true;
		return 0;
	}
	key_from(c, "arena_per_uid", from, sizeof(from));
	if (c->arena_per_uid < c->arena_max) {
		snprintf(err, errlen,
			 "%sarena_per_uid (%llu bytes) is smaller than arena_max (%llu bytes): "
			 "no client could get an arena of arena_max", from,
			 (unsigned long long)c->arena_per_uid, (unsigned long long)c->arena_max);
		return -EINVAL;
	}
	if (c->arena_per_uid > c->arena_total) {
		snprintf(err, errlen,
			 "%sarena_per_uid (%llu bytes) is larger than arena_total (%llu bytes)",
			 from, (unsigned long long)c->arena_per_uid,
			 (unsigned long long)c->arena_total);
		return -EINVAL;
	}
	return 0;
}

int config_set(struct config *c, const char *key, const char *value, char *err, size_t errlen)
{
	return set_from(c, key, value, NULL, err, errlen);
}

void config_clear_roots(struct config *c)
{
	for (size_t i = 0; i < c->n_roots; i++) {
		free(c->roots[i]);
		free(c->root_origin[i]);
		c->roots[i] = c->root_origin[i] = NULL;
	}
	c->n_roots = 0;
}

void config_free(struct config *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < config_n_keys; i++) {
		const struct config_key *k = &config_keys[i];
		if (k->kind == CONFIG_SOCKET || k->kind == CONFIG_PATH || k->kind == CONFIG_STRING ||
		    k->kind == CONFIG_LISTEN || k->kind == CONFIG_FILE) {
			char **field = (char **)((char *)c + k->offset);
			free(*field);
			*field = NULL;
		}
	}
	config_clear_roots(c);
	for (size_t i = 0; i < CONFIG_MAX_KEYS; i++) {
		free(c->key_origin[i]);
		c->key_origin[i] = NULL;
	}
	for (size_t i = 0; i < c->n_retention; i++) {
		free(c->retention[i].root);
		free(c->retention[i].origin);
		c->retention[i].root = c->retention[i].origin = NULL;
	}
	c->n_retention = 0;
}

int config_defaults(struct config *c)
{
	char err[256];

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < config_n_keys; i++) {
		const struct config_key *k = &config_keys[i];
		int r;

		if (!k->def)
			continue;
		/* A default the table refuses is a bug: check_config holds
		 * every row to its own range. */
		r = set_key(c, k, k->def, NULL, err, sizeof(err));
		if (r < 0) {
			config_free(c);
			return r;
		}
	}
	return 0;
}

static char *trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

/*
 * Cuts a comment off a line.  '#' starts a comment at the start of the line
 * or after white space, so a value such as a path may still contain a '#'
 * inside a word.
 */
static void strip_comment(char *line)
{
	for (char *p = line; *p; p++) {
		if (*p == '#' && (p == line || isspace((unsigned char)p[-1]))) {
			*p = '\0';
			return;
		}
	}
}

int config_load(struct config *c, const char *path, char *err, size_t errlen)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	char why[512];
	unsigned lineno = 0;
	FILE *f;
	int ret = 0;

	f = fopen(path, "re");
	if (!f) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return ret;
	}

	while ((len = getline(&line, &cap, f)) >= 0) {
		char *key, *value, *eq, origin[PATH_MAX + 16];

		lineno++;
		if (len > CONFIG_LINE_MAX) {
			snprintf(err, errlen, "%s:%u: line longer than %d bytes", path, lineno,
				 CONFIG_LINE_MAX);
			ret = -EINVAL;
			goto out_close;
		}
		if (strlen(line) != (size_t)len) {
			snprintf(err, errlen, "%s:%u: NUL byte in line", path, lineno);
			ret = -EINVAL;
			goto out_close;
		}
		strip_comment(line);
		key = trim(line);
		if (*key == '\0')
			continue;

		eq = strchr(key, '=');
		if (!eq) {
			snprintf(err, errlen, "%s:%u: expected 'key = value'", path, lineno);
			ret = -EINVAL;
			goto out_close;
		}
		*eq = '\0';
		value = trim(eq + 1);
		key = trim(key);
		if (*key == '\0' || *value == '\0') {
			snprintf(err, errlen, "%s:%u: expected 'key = value'", path, lineno);
			ret = -EINVAL;
			goto out_close;
		}

		why[0] = '\0';
		snprintf(origin, sizeof(origin), "%s:%u", path, lineno);
		ret = set_from(c, key, value, origin, why, sizeof(why));
		if (ret < 0) {
			snprintf(err, errlen, "%s: %s", origin, why[0] ? why : strerror(-ret));
			goto out_close;
		}
	}
	if (!feof(f)) {
		/* getline failed before the end of the file. */
		ret = errno == ENOMEM ? -ENOMEM : -EIO;
		snprintf(err, errlen, "%s: read error", path);
	}

out_close:
	free(line);
	fclose(f);
	return ret;
}

int config_validate(struct config *c, char *err, size_t errlen)
{
	if (c->n_roots == 0) {
		snprintf(err, errlen, "no root configured: add at least one 'root = /path'");
		return -EINVAL;
	}

	for (size_t i = 0; i < c->n_roots; i++) {
		const char *from = c->root_origin[i] ? c->root_origin[i] : "";
		char *canon;
		struct stat st;

		if (s3_is_url(c->roots[i]))
			continue; /* canonical since add_root; a bucket is not looked at */
		if (c->roots[i][0] != '/') {
			snprintf(err, errlen, "%s%sroot '%s' is not an absolute path", from,
				 origin_sep(c->root_origin[i]), c->roots[i]);
			return -EINVAL;
		}
		canon = realpath(c->roots[i], NULL);
		if (!canon) {
			int e = errno;
			snprintf(err, errlen, "%s%sroot '%s': %s", from, origin_sep(c->root_origin[i]),
				 c->roots[i], strerror(e));
			return e == ENOMEM ? -ENOMEM : -EINVAL;
		}
		if (stat(canon, &st) < 0 || !S_ISDIR(st.st_mode)) {
			snprintf(err, errlen, "%s%sroot '%s' is not a directory", from,
				 origin_sep(c->root_origin[i]), c->roots[i]);
			free(canon);
			return -EINVAL;
		}
		free(c->roots[i]);
		c->roots[i] = canon;
	}

	/* Two spellings of one directory (or a symlink to it) are one root. */
	for (size_t i = 0; i < c->n_roots; i++) {
		for (size_t j = i + 1; j < c->n_roots;) {
			if (strcmp(c->roots[i], c->roots[j]) == 0) {
				free(c->roots[j]);
				free(c->root_origin[j]);
				c->n_roots--;
				c->roots[j] = c->roots[c->n_roots];
				c->root_origin[j] = c->root_origin[c->n_roots];
				c->roots[c->n_roots] = c->root_origin[c->n_roots] = NULL;
			} else {
				j++;
			}
		}
	}

	if (c->retention_sweep_ms && c->retention_sweep_ms < 1000) {
		snprintf(err, errlen, "retention_sweep: %llums is not 0 (off) or at least 1s",
			 (unsigned long long)c->retention_sweep_ms);
		return -EINVAL;
	}
	/* A policy names a root or a directory below one: made canonical as
	 * roots are, so that saves' directories match it. */
	for (size_t i = 0; i < c->n_retention; i++) {
		struct config_retention *e = &c->retention[i];
		const char *from = e->origin ? e->origin : "";
		char *canon;

		if (!s3_is_url(e->root)) {
			canon = realpath(e->root, NULL);
			if (!canon) {
				snprintf(err, errlen, "%s%sretention: '%s': %s", from,
					 origin_sep(e->origin), e->root, strerror(errno));
				return -EINVAL;
			}
			free(e->root);
			e->root = canon;
		}
		if (!config_root_allowed(c, e->root)) {
			snprintf(err, errlen, "%s%sretention: '%s' is not a root nor below one", from,
				 origin_sep(e->origin), e->root);
			return -EINVAL;
		}
		for (size_t j = 0; j < i; j++) {
			if (!strcmp(c->retention[j].root, e->root)) {
				snprintf(err, errlen, "%s%sretention: '%s' is named twice (another "
					 "spelling of it came first)", from, origin_sep(e->origin),
					 e->root);
				return -EINVAL;
			}
		}
	}

	if (c->s3_addressing && strcmp(c->s3_addressing, "path") &&
	    strcmp(c->s3_addressing, "virtual")) {
		snprintf(err, errlen, "s3_addressing: '%.64s' is not path or virtual",
			 c->s3_addressing);
		return -EINVAL;
	}
	if (c->s3_endpoint) {
		char url[600], why[256];
		int r = s3_object_url(c->s3_endpoint, false, "bucket", "", NULL, url, sizeof(url),
				      why, sizeof(why));
		if (r < 0) {
			snprintf(err, errlen, "s3_endpoint: %s", why);
			return -EINVAL;
		}
	}
	if (c->s3_backoff_base_ms > c->s3_backoff_cap_ms) {
		snprintf(err, errlen, "s3_backoff_base is longer than s3_backoff_cap");
		return -EINVAL;
	}
	if (c->load_share && c->load_share < (16ull << 20)) {
		snprintf(err, errlen, "load_share (%llu bytes) must be 0 (none) or at least 16M",
			 (unsigned long long)c->load_share);
		return -EINVAL;
	}
	return validate_arena_caps(c, err, errlen);
}

/*
 * True if `path` (len bytes, no trailing '/' except for "/" itself) equals
 * `root` or lies below it, on component boundaries: "/data" covers "/data"
 * and "/data/x" but not "/database".
 */
static bool under_root(const char *root, const char *path, size_t len)
{
	size_t rl = strlen(root);

	while (rl > 1 && root[rl - 1] == '/')
		rl--;
	if (rl == 1 && root[0] == '/')
		return true;
	if (len < rl || memcmp(root, path, rl) != 0)
		return false;
	return len == rl || path[rl] == '/';
}

/* The deepest root `path` lies in, or NULL.  S3 locations are compared
 * with S3 roots only, paths with local roots only: a local root "/" covers
 * every path, never an s3:// URL. */
const char *config_root_base(const struct config *c, const char *path)
{
	const char *best = NULL;
	size_t len, bl = 0;
	bool s3;

	if (!path || (!s3_is_url(path) && path[0] != '/'))
		return NULL;
	s3 = s3_is_url(path);
	len = strlen(path);
	while (len > 1 && path[len - 1] == '/')
		len--;
	for (size_t i = 0; i < c->n_roots; i++) {
		size_t rl = strlen(c->roots[i]);

		if (s3_is_url(c->roots[i]) == s3 && under_root(c->roots[i], path, len) &&
		    (!best || rl > bl)) {
			best = c->roots[i];
			bl = rl;
		}
	}
	return best;
}

bool config_root_allowed(const struct config *c, const char *path)
{
	char buf[PATH_MAX];
	size_t len;

	/* An S3 location has no symlinks: the lexical check is the check,
	 * on a location that is valid and in s3_url_format's spelling (as
	 * the roots are), never on another spelling of it. */
	if (path && s3_is_url(path)) {
		struct s3_loc loc;
		char e[256];

		return s3_url_parse(path, &loc, e, sizeof(e)) == 0 &&
		       s3_url_format(&loc, buf, sizeof(buf)) == 0 && !strcmp(buf, path) &&
		       config_root_base(c, path) != NULL;
	}
	if (!path || path[0] != '/')
		return false;
	len = strlen(path);
	if (len >= sizeof(buf))
		return false;
	if (!config_root_base(c, path))
		return false;

	/*
	 * The lexical check is not enough once directories exist: "/data/link"
	 * may be a symlink out of the root.  Resolve the deepest part of the
	 * path that exists (the rest will be created below it, and name_root_ok
	 * has ruled out ".." components) and check that it is still inside.
	 * The canonical roots came from realpath, so the comparison is fair.
	 * (If the root itself is gone, its deepest existing ancestor lies
	 * above every root: refused, rightly.)
	 */
	return fs_resolve_existing(path, buf, sizeof(buf)) == 0 && config_root_base(c, buf) != NULL;
}

/* ---- ckptd's command line ---- */

void config_usage(FILE *f)
{
	fprintf(f,
		"usage: ckptd [-c CONFIG] [-s SOCKET] [-r ROOT]... [-o KEY=VALUE]... [-v]\n"
		"             [--check-config] [--version]\n"
		"\n"
		"  -c, --config PATH   configuration file (default %s;\n"
		"                      may be missing when the flags give a root)\n"
		"  -s, --socket PATH   listening socket (config key 'socket')\n"
		"  -r, --root DIR      allow checkpoints under DIR (repeatable; key 'root');\n"
		"                      roots on the command line replace the file's roots\n"
		"  -o KEY=VALUE        set any config key (repeatable)\n"
		"  -v, --verbose       debug logging\n"
		"      --check-config  validate the configuration and exit\n"
		"      --version       print the version and exit\n"
		"\n"
		"Every flag wins over the file.  Config keys:\n",
		config_default_path);
	for (size_t i = 0; i < config_n_keys; i++) {
		const struct config_key *k = &config_keys[i];
		fprintf(f, "  %-20s %-22s %s\n", k->key,
			k->def ? k->def : k->kind == CONFIG_ROOT ? "(required)" : "(unset)", k->help);
	}
}

void config_args_free(struct config_args *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->n_sets; i++)
		free(a->sets[i].key);
	free(a->sets);
	a->sets = NULL;
	a->n_sets = 0;
}

int config_args_parse(struct config_args *ret, int argc, char **argv, char *err, size_t errlen)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "socket", required_argument, NULL, 's' },
		{ "root", required_argument, NULL, 'r' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "check-config", no_argument, NULL, 'C' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct config_args a = { .config_path = config_default_path };
	int c, r = 0;

	/* Each option adds at most one setting: argc bounds them. */
	a.sets = calloc(argc > 0 ? (size_t)argc : 1, sizeof(*a.sets));
	if (!a.sets)
		return -ENOMEM;
	/* 0 restarts glibc's getopt from scratch (tests parse many times);
	 * ':' first: a missing value is reported as ':', not '?'. */
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":c:s:r:o:vh", opts, NULL)) != -1) {
		struct config_arg *s = &a.sets[a.n_sets];
		const char *eq;

		switch (c) {
		case 'c':
			a.config_path = optarg;
			a.config_given = true;
			break;
		case 's':
		case 'r':
			s->key = strdup(c == 's' ? "socket" : "root");
			if (!s->key) {
				r = -ENOMEM;
				goto out_free;
			}
			s->value = optarg;
			snprintf(s->origin, sizeof(s->origin), "-%c", c);
			a.n_sets++;
			break;
		case 'o':
			eq = strchr(optarg, '=');
			if (!eq || eq == optarg) {
				snprintf(err, errlen, "-o '%.256s': expected KEY=VALUE", optarg);
				r = -EINVAL;
				goto out_free;
			}
			s->key = strndup(optarg, (size_t)(eq - optarg));
			if (!s->key) {
				r = -ENOMEM;
				goto out_free;
			}
			s->value = eq + 1;
			snprintf(s->origin, sizeof(s->origin), "-o");
			a.n_sets++;
			break;
		case 'v':
			a.verbose = true;
			break;
		case 'C':
			a.check_only = true;
			break;
		case 'V':
			a.version = true;
			break;
		case 'h':
			a.help = true;
			break;
		case ':':
			snprintf(err, errlen, "option '%.64s' needs a value", argv[optind - 1]);
			r = -EINVAL;
			goto out_free;
		default:
			if (optopt)
				snprintf(err, errlen, "unknown option '-%c'", optopt);
			else
				snprintf(err, errlen, "unknown option '%.64s'", argv[optind - 1]);
			r = -EINVAL;
			goto out_free;
		}
	}
	if (optind < argc) {
		snprintf(err, errlen, "unexpected argument '%.256s'", argv[optind]);
		r = -EINVAL;
		goto out_free;
	}
	*ret = a;
	return 0;

out_free:
	config_args_free(&a);
	return r;
}

int config_from_args(struct config *ret, const struct config_args *a, char *err, size_t errlen)
{
	const char *path = a->config_path ? a->config_path : config_default_path;
	bool no_file = false, flag_roots = false;
	struct config c;
	char why[768];
	int r;

	r = config_defaults(&c);
	if (r < 0) {
		snprintf(err, errlen, "%s", strerror(-r));
		return r;
	}
	r = config_load(&c, path, err, errlen);
	if (r == -ENOENT && !a->config_given) {
		no_file = true; /* no default file: flags alone may configure us */
	} else if (r < 0) {
		goto out_free;
	}

	for (size_t i = 0; i < a->n_sets; i++) {
		const struct config_arg *s = &a->sets[i];
		char origin[16];

		/* The command line's roots replace the file's (the first one
		 * clears them), so `-r DIR` means "this root", not "this one
		 * too". */
		if (strcmp(s->key, "root") == 0 && !flag_roots) {
			config_clear_roots(&c);
			flag_roots = true;
		}
		snprintf(origin, sizeof(origin), "option %s", s->origin);
		why[0] = '\0';
		r = set_from(&c, s->key, s->value, origin, why, sizeof(why));
		if (r < 0) {
			snprintf(err, errlen, "%s: %s", origin, why[0] ? why : strerror(-r));
			goto out_free;
		}
	}

	if (c.n_roots == 0) {
		if (no_file)
			snprintf(err, errlen,
				 "no root configured: %s does not exist and no -r DIR was given",
				 path);
		else
			snprintf(err, errlen,
				 "no root configured: add 'root = /path' to %s or give -r DIR", path);
		r = -EINVAL;
		goto out_free;
	}
	r = config_validate(&c, err, errlen);
	if (r < 0)
		goto out_free;
	*ret = c;
	return 0;

out_free:
	config_free(&c);
	return r;
}
