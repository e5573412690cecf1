/* SPDX-License-Identifier: MIT */
/*
 * config.h - ckptd configuration: /etc/ckptd/ckptd.conf, then flags.
 *
 * File syntax: one `key = value` per line; '#' starts a comment; blank lines
 * are ignored; `root` may repeat.  Sizes take K/M/G/T suffixes (powers of
 * 1024); durations take ms/s/m/h (default s).  Keys:
 *
 *   socket          path of the listening socket      /run/ckptd/ckptd.sock
 *   socket_mode     octal mode of the socket          0660
 *   root            an allowed checkpoint root (absolute, repeatable;
 *                   at least one is required)
 *   arena_max       cap on one client's arena         4G
 *   arena_total     cap on all arenas together        16G
 *   uring_depth     writes in flight per client       16   (1..1024)
 *   commit_deadline a save not committed this long after it began fails
 *                                                     10m  (100ms..7d)
 *   max_clients     connections at once               256  (1..65536)
 *   o_direct        write with O_DIRECT (yes/no)      yes
 */
#ifndef CKPTD_CONFIG_H
#define CKPTD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONFIG_DEFAULT_PATH "/etc/ckptd/ckptd.conf"
#define CONFIG_MAX_ROOTS 64

struct config {
	char *socket_path;
	unsigned socket_mode;
	char *roots[CONFIG_MAX_ROOTS]; /* canonical (realpath) once validated */
	size_t n_roots;
	uint64_t arena_max;
	uint64_t arena_total;
	unsigned uring_depth;
	uint64_t commit_deadline_ms;
	unsigned max_clients;
	bool o_direct;
	char *state_dir;               /* the daemon's registry (registry.h) */
	uint64_t handshake_timeout_ms; /* HELLO must arrive within this */
	unsigned max_clients_per_uid;  /* connections of one uid at once */
};

/* Sets every default (no roots).  Returns 0 or -ENOMEM. */
int config_defaults(struct config *c);

/*
 * Reads a config file over the current values.  A missing file is -ENOENT
 * (the caller decides whether that is an error).  Unknown keys, bad values,
 * too many roots: -EINVAL with "PATH:LINE: reason" in err.
 */
int config_load(struct config *c, const char *path, char *err, size_t errlen);

/* Applies one `key=value` (as from a -o flag or a file line).  -EINVAL with
 * the reason in err. */
int config_set(struct config *c, const char *key, const char *value, char *err, size_t errlen);

/*
 * Final checks once file and flags are applied: at least one root; each root
 * absolute and an existing directory (made canonical with realpath); caps
 * consistent (arena_max <= arena_total).  -EINVAL with the reason in err.
 */
int config_validate(struct config *c, char *err, size_t errlen);

void config_free(struct config *c);

/* Parsers, exposed for tests.  Return 0 and the value, or -EINVAL. */
int config_parse_size(const char *s, uint64_t *ret_bytes);
int config_parse_duration_ms(const char *s, uint64_t *ret_ms);

/*
 * Checks that `path` (absolute, validated by name_root_ok) is one of the
 * roots or lies below one, lexically and, once created, after resolving
 * symlinks.  Returns true if allowed.
 */
bool config_root_allowed(const struct config *c, const char *path);

#endif
