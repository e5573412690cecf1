/* SPDX-License-Identifier: MIT */
/*
 * config.c - ckptd configuration: defaults, the config file, -o flags and the
 * final consistency checks.  See config.h for the syntax and the keys.
 *
 * Parsing is strict on purpose: a typo in a daemon's config should stop it at
 * start-up with "PATH:LINE: reason", not run it with a silently different
 * value.  Sizes are whole numbers (no "1.5G"): the value the admin reads is
 * the exact byte count the daemon uses.
 */
#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "ckpt.h"

#define CONFIG_LINE_MAX 4096          /* longest accepted config line */
#define CONFIG_MIN_ARENA (1ull << 20) /* one CRC block: the smallest slot */
#define CONFIG_DEADLINE_MIN_MS 100ull
#define CONFIG_DEADLINE_MAX_MS (7ull * 24 * 3600 * 1000)

int config_defaults(struct config *c)
{
	char *sock = strdup(CKPT_DEFAULT_SOCKET);

	if (!sock)
		return -ENOMEM;
	memset(c, 0, sizeof(*c));
	c->socket_path = sock;
	c->socket_mode = 0660;
	c->arena_max = 4ull << 30;
	c->arena_total = 16ull << 30;
	c->uring_depth = 16;
	c->commit_deadline_ms = 10ull * 60 * 1000;
	c->max_clients = 256;
	c->o_direct = true;
	c->state_dir = strdup("/var/lib/ckptd/state");
	c->handshake_timeout_ms = 10000;
	c->max_clients_per_uid = 64;
	if (!c->state_dir) {
		free(sock);
		return -ENOMEM;
	}
	return 0;
}

void config_free(struct config *c)
{
	if (!c)
		return;
	free(c->socket_path);
	c->socket_path = NULL;
	free(c->state_dir);
	c->state_dir = NULL;
	for (size_t i = 0; i < c->n_roots; i++) {
		free(c->roots[i]);
		c->roots[i] = NULL;
	}
	c->n_roots = 0;
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

/* A decimal integer in [lo, hi], nothing else on the string. */
static int parse_uint_range(const char *s, uint64_t lo, uint64_t hi, uint64_t *ret)
{
	uint64_t v;
	bool overflow;
	size_t n = parse_digits(s, &v, &overflow);

	if (n == 0 || overflow || s[n] != '\0' || v < lo || v > hi)
		return -EINVAL;
	*ret = v;
	return 0;
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

static int set_socket(struct config *c, const char *value, char *err, size_t errlen)
{
	char *copy;

	/* The path must fit sockaddr_un.sun_path with its NUL. */
	if (value[0] == '\0' || strlen(value) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		snprintf(err, errlen, "socket: path '%s' is empty or longer than %zu bytes", value,
			 sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		return -EINVAL;
	}
	copy = strdup(value);
	if (!copy)
		return -ENOMEM;
	free(c->socket_path);
	c->socket_path = copy;
	return 0;
}

static int add_root(struct config *c, const char *value, char *err, size_t errlen)
{
	char *copy;

	if (value[0] != '/') {
		snprintf(err, errlen, "root '%s' is not an absolute path", value);
		return -EINVAL;
	}
	if (strlen(value) >= PATH_MAX) {
		snprintf(err, errlen, "root '%.64s...' is longer than PATH_MAX", value);
		return -EINVAL;
	}
	if (c->n_roots >= CONFIG_MAX_ROOTS) {
		snprintf(err, errlen, "root '%s': more than %d roots", value, CONFIG_MAX_ROOTS);
		return -EINVAL;
	}
	copy = strdup(value);
	if (!copy)
		return -ENOMEM;
	c->roots[c->n_roots++] = copy;
	return 0;
}

int config_set(struct config *c, const char *key, const char *value, char *err, size_t errlen)
{
	uint64_t v;

	if (strcmp(key, "socket") == 0)
		return set_socket(c, value, err, errlen);

	if (strcmp(key, "root") == 0)
		return add_root(c, value, err, errlen);

	if (strcmp(key, "socket_mode") == 0) {
		char *end;
		unsigned long m;

		errno = 0;
		m = strtoul(value, &end, 8);
		if (!isdigit((unsigned char)value[0]) || *end != '\0' || errno || m > 0777) {
			snprintf(err, errlen, "socket_mode: '%s' is not an octal mode 0..0777",
				 value);
			return -EINVAL;
		}
		c->socket_mode = (unsigned)m;
		return 0;
	}

	if (strcmp(key, "arena_max") == 0 || strcmp(key, "arena_total") == 0) {
		if (config_parse_size(value, &v) < 0 || v < CONFIG_MIN_ARENA) {
			snprintf(err, errlen,
				 "%s: '%s' is not a size of at least 1M (a whole number with "
				 "an optional K/M/G/T suffix)",
				 key, value);
			return -EINVAL;
		}
		if (key[6] == 'm')
			c->arena_max = v;
		else
			c->arena_total = v;
		return 0;
	}

	if (strcmp(key, "uring_depth") == 0) {
		if (parse_uint_range(value, 1, 1024, &v) < 0) {
			snprintf(err, errlen, "uring_depth: '%s' is not a number in 1..1024", value);
			return -EINVAL;
		}
		c->uring_depth = (unsigned)v;
		return 0;
	}

	if (strcmp(key, "commit_deadline") == 0) {
		if (config_parse_duration_ms(value, &v) < 0 || v < CONFIG_DEADLINE_MIN_MS ||
		    v > CONFIG_DEADLINE_MAX_MS) {
			snprintf(err, errlen,
				 "commit_deadline: '%s' is not a duration in 100ms..7d "
				 "(a whole number with ms/s/m/h, default s)",
				 value);
			return -EINVAL;
		}
		c->commit_deadline_ms = v;
		return 0;
	}

	if (strcmp(key, "max_clients") == 0) {
		if (parse_uint_range(value, 1, 65536, &v) < 0) {
			snprintf(err, errlen, "max_clients: '%s' is not a number in 1..65536", value);
			return -EINVAL;
		}
		c->max_clients = (unsigned)v;
		return 0;
	}

	if (strcmp(key, "state_dir") == 0) {
		char *copy;
		if (value[0] != '/') {
			snprintf(err, errlen, "state_dir: '%s' is not an absolute path", value);
			return -EINVAL;
		}
		copy = strdup(value);
		if (!copy)
			return -ENOMEM;
		free(c->state_dir);
		c->state_dir = copy;
		return 0;
	}

	if (strcmp(key, "handshake_timeout") == 0) {
		if (config_parse_duration_ms(value, &v) < 0 || v < 100 || v > 600000) {
			snprintf(err, errlen, "handshake_timeout: '%s' is not a duration in 100ms..10m",
				 value);
			return -EINVAL;
		}
		c->handshake_timeout_ms = v;
		return 0;
	}

	if (strcmp(key, "max_clients_per_uid") == 0) {
		if (parse_uint_range(value, 1, 65536, &v) < 0) {
			snprintf(err, errlen, "max_clients_per_uid: '%s' is not a number in 1..65536",
				 value);
			return -EINVAL;
		}
		c->max_clients_per_uid = (unsigned)v;
		return 0;
	}

	if (strcmp(key, "o_direct") == 0) {
		bool b;
		if (parse_bool(value, &b) < 0) {
			snprintf(err, errlen, "o_direct: '%s' is not yes or no", value);
			return -EINVAL;
		}
		c->o_direct = b;
		return 0;
	}

	snprintf(err, errlen, "unknown key '%s'", key);
	return -EINVAL;
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
		char *key, *value, *eq;

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
		ret = config_set(c, key, value, why, sizeof(why));
		if (ret < 0) {
			snprintf(err, errlen, "%s:%u: %s", path, lineno,
				 why[0] ? why : strerror(-ret));
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
		char *canon;
		struct stat st;

		if (c->roots[i][0] != '/') {
			snprintf(err, errlen, "root '%s' is not an absolute path", c->roots[i]);
			return -EINVAL;
		}
		canon = realpath(c->roots[i], NULL);
		if (!canon) {
			int e = errno;
			snprintf(err, errlen, "root '%s': %s", c->roots[i], strerror(e));
			return e == ENOMEM ? -ENOMEM : -EINVAL;
		}
		if (stat(canon, &st) < 0 || !S_ISDIR(st.st_mode)) {
			snprintf(err, errlen, "root '%s' is not a directory", c->roots[i]);
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
				c->roots[j] = c->roots[--c->n_roots];
				c->roots[c->n_roots] = NULL;
			} else {
				j++;
			}
		}
	}

	if (c->arena_max > c->arena_total) {
		snprintf(err, errlen,
			 "arena_max (%llu bytes) is larger than arena_total (%llu bytes)",
			 (unsigned long long)c->arena_max, (unsigned long long)c->arena_total);
		return -EINVAL;
	}
	return 0;
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

static bool under_any_root(const struct config *c, const char *path)
{
	size_t len = strlen(path);

	while (len > 1 && path[len - 1] == '/')
		len--;
	for (size_t i = 0; i < c->n_roots; i++) {
		if (under_root(c->roots[i], path, len))
			return true;
	}
	return false;
}

bool config_root_allowed(const struct config *c, const char *path)
{
	char buf[PATH_MAX];
	size_t len;

	if (!path || path[0] != '/')
		return false;
	len = strlen(path);
	if (len >= sizeof(buf))
		return false;
	if (!under_any_root(c, path))
		return false;

	/*
	 * The lexical check is not enough once directories exist: "/data/link"
	 * may be a symlink out of the root.  Resolve the deepest part of the
	 * path that exists (the rest will be created below it, and name_root_ok
	 * has ruled out ".." components) and check that it is still inside.
	 * The canonical roots came from realpath, so the comparison is fair.
	 */
	memcpy(buf, path, len + 1);
	for (;;) {
		char *canon = realpath(buf, NULL);
		char *slash;

		if (canon) {
			/*
			 * If the root itself is gone, its deepest existing
			 * ancestor lies above every root: refused, rightly.
			 */
			bool ok = under_any_root(c, canon);
			free(canon);
			return ok;
		}
		if (errno != ENOENT && errno != ENOTDIR)
			return false;
		slash = strrchr(buf, '/');
		if (!slash || strcmp(buf, "/") == 0)
			return false;
		if (slash == buf)
			slash[1] = '\0';
		else
			*slash = '\0';
	}
}
