/* SPDX-License-Identifier: MIT */
/* s3_creds.c - S3 credentials from the environment or a credentials file (s3_creds.h). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/s3_creds.h"

static const char *env_get(const char *name)
{
	return getenv(name);
}

/* Copies v into dst[cap]; -EINVAL naming `what` (never the value) if it
 * does not fit or holds a control character. */
static int set(char *dst, size_t cap, const char *v, size_t n, const char *what,
	       const char *where, char *err, size_t errlen)
{
	if (n >= cap) {
		snprintf(err, errlen, "%s: %s is longer than %zu bytes", where, what, cap - 1);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f) {
			snprintf(err, errlen, "%s: %s holds a control character", where, what);
			return -EINVAL;
		}
	}
	memcpy(dst, v, n);
	dst[n] = '\0';
	return 0;
}

/* The environment's pair and token (both keys or neither: -EINVAL for half
 * a pair, or for a token without one), its region and endpoint. */
static int from_env(const char *(*get)(const char *), struct s3_creds *c, char *err,
		    size_t errlen)
{
	static const struct {
		const char *name;
		size_t off, cap;
	} vars[] = {
		{ "AWS_ACCESS_KEY_ID", offsetof(struct s3_creds, key_id), sizeof(c->key_id) },
		{ "AWS_SECRET_ACCESS_KEY", offsetof(struct s3_creds, secret), sizeof(c->secret) },
		{ "AWS_SESSION_TOKEN", offsetof(struct s3_creds, token), sizeof(c->token) },
		{ "AWS_DEFAULT_REGION", offsetof(struct s3_creds, region), sizeof(c->region) },
		{ "AWS_REGION", offsetof(struct s3_creds, region), sizeof(c->region) },
		{ "AWS_ENDPOINT_URL", offsetof(struct s3_creds, endpoint), sizeof(c->endpoint) },
		{ "AWS_ENDPOINT_URL_S3", offsetof(struct s3_creds, endpoint), sizeof(c->endpoint) },
	};

	/* Later entries win: AWS_REGION over AWS_DEFAULT_REGION, the S3
	 * endpoint over the general one. */
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = get(vars[i].name);
		int r;

		if (!v || !*v)
			continue;
		r = set((char *)c + vars[i].off, vars[i].cap, v, strlen(v), vars[i].name,
			"environment", err, errlen);
		if (r < 0)
			return r;
	}
	if (!c->key_id[0] != !c->secret[0]) {
		snprintf(err, errlen, "environment: %s is set but %s is not: set both (or "
				      "neither, to take the pair from the credentials file)",
			 c->key_id[0] ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
			 c->key_id[0] ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
		return -EINVAL;
	}
	if (c->token[0] && !c->key_id[0]) {
		snprintf(err, errlen, "environment: AWS_SESSION_TOKEN is set without "
				      "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (a token belongs "
				      "to the pair it came with)");
		return -EINVAL;
	}
	return 0;
}

static size_t trim(const char **s, size_t n)
{
	while (n && (**s == ' ' || **s == '\t')) {
		(*s)++;
		n--;
	}
	while (n && ((*s)[n - 1] == ' ' || (*s)[n - 1] == '\t' || (*s)[n - 1] == '\r'))
		n--;
	return n;
}

/* The keys of section [profile] into *c; *ret_seen tells whether there
 * is such a section. */
static int parse_file(const char *text, size_t len, const char *file, const char *profile,
		      struct s3_creds *c, bool *ret_seen, char *err, size_t errlen)
{
	bool in = false, seen = false;
	unsigned line = 0;
	char where[512];

	for (const char *p = text, *end = text + len; p < end;) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *s = p, *eq;
		size_t n = (size_t)((nl ? nl : end) - p);

		p = nl ? nl + 1 : end;
		line++;
		n = trim(&s, n);
		if (n == 0 || *s == '#' || *s == ';')
			continue;
		snprintf(where, sizeof(where), "%s:%u", file, line);
		if (*s == '[') {
			const char *name = s + 1;
			size_t m;

			if (s[n - 1] != ']') {
				snprintf(err, errlen, "%s: a section line must end with ']'", where);
				return -EINVAL;
			}
			m = trim(&name, n - 2);
			/* "[profile x]" is the config file's spelling of [x]. */
			if (m > 8 && !strncmp(name, "profile ", 8)) {
				name += 8;
				m = trim(&name, m - 8);
			}
			in = m == strlen(profile) && !memcmp(name, profile, m);
			seen |= in;
			continue;
		}
		eq = memchr(s, '=', n);
		if (!eq) {
			snprintf(err, errlen, "%s: expected 'key = value' or '[profile]'", where);
			return -EINVAL;
		}
		if (!in)
			continue;
		{
			const char *k = s, *v = eq + 1;
			size_t kn = trim(&k, (size_t)(eq - s)), vn = trim(&v, n - (size_t)(eq + 1 - s));
			static const struct {
				const char *name;
				size_t off, cap;
			} keys[] = {
				{ "aws_access_key_id", offsetof(struct s3_creds, key_id),
				  sizeof(c->key_id) },
				{ "aws_secret_access_key", offsetof(struct s3_creds, secret),
				  sizeof(c->secret) },
				{ "aws_session_token", offsetof(struct s3_creds, token),
				  sizeof(c->token) },
				{ "region", offsetof(struct s3_creds, region), sizeof(c->region) },
				{ "endpoint_url", offsetof(struct s3_creds, endpoint),
				  sizeof(c->endpoint) },
			};

			for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
				if (kn == strlen(keys[i].name) && !memcmp(k, keys[i].name, kn)) {
					int r = set((char *)c + keys[i].off, keys[i].cap, v, vn,
						    keys[i].name, where, err, errlen);

					if (r < 0)
						return r;
				}
			}
			/* Other keys (output, s3 = ..., ...) are not ours: ignored. */
		}
	}
	*ret_seen = seen;
	return 0;
}

static int from_file(const char *file, const char *profile, struct s3_creds *c, bool *ret_seen,
		     char *err, size_t errlen)
{
	struct stat st;
	char *text;
	ssize_t n;
	size_t got = 0;
	int fd, r;

	fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "credentials file '%s': %s", file, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "credentials file '%s' is not a regular file", file);
		close(fd);
		return -EINVAL;
	}
	if (st.st_mode & 077) {
		snprintf(err, errlen,
			 "credentials file '%s' is open to group or others (mode %04o): "
			 "chmod 600 it", file, (unsigned)(st.st_mode & 07777));
		close(fd);
		return -EACCES;
	}
	if ((uint64_t)st.st_size > S3_CREDS_FILE_MAX) {
		snprintf(err, errlen, "credentials file '%s' is larger than %u bytes", file,
			 S3_CREDS_FILE_MAX);
		close(fd);
		return -EINVAL;
	}
	text = malloc((size_t)st.st_size + 1);
	if (!text) {
		close(fd);
		return -ENOMEM;
	}
	while (got < (size_t)st.st_size && (n = read(fd, text + got, (size_t)st.st_size - got)) > 0)
		got += (size_t)n;
	close(fd);
	r = parse_file(text, got, file, profile, c, ret_seen, err, errlen);
	explicit_bzero(text, (size_t)st.st_size + 1);
	free(text);
	return r;
}

int s3_creds_load(const char *(*get)(const char *name), const char *file, const char *profile,
		  struct s3_creds *ret, char *err, size_t errlen)
{
	const char *prof = profile && *profile ? profile : "default";
	struct s3_creds c, f;
	bool seen = false;
	int r;

	memset(&c, 0, sizeof(c));
	memset(&f, 0, sizeof(f));
	r = from_env(get ? get : env_get, &c, err, errlen);
	/* A file named is read (and its mode checked) whatever the
	 * environment holds: a broken config is said, not skipped. */
	if (r == 0 && file)
		r = from_file(file, prof, &f, &seen, err, errlen);
	if (r == 0 && !c.key_id[0] && file) {
		/* The environment has no pair: the whole pair, and the
		 * token, come from the file's profile. */
		if (!seen) {
			snprintf(err, errlen, "%s: no [%s] section", file, prof);
			r = -ENOENT;
		} else if (!f.key_id[0] != !f.secret[0]) {
			snprintf(err, errlen, "%s [%s]: %s without %s", file, prof,
				 f.key_id[0] ? "aws_access_key_id" : "aws_secret_access_key",
				 f.key_id[0] ? "aws_secret_access_key" : "aws_access_key_id");
			r = -EINVAL;
		} else if (f.token[0] && !f.key_id[0]) {
			snprintf(err, errlen, "%s [%s]: aws_session_token without a key pair", file,
				 prof);
			r = -EINVAL;
		} else {
			memcpy(c.key_id, f.key_id, sizeof(c.key_id));
			memcpy(c.secret, f.secret, sizeof(c.secret));
			memcpy(c.token, f.token, sizeof(c.token));
		}
	}
	/* Region and endpoint: the environment's, else the file's. */
	if (r == 0 && !c.region[0])
		memcpy(c.region, f.region, sizeof(c.region));
	if (r == 0 && !c.endpoint[0])
		memcpy(c.endpoint, f.endpoint, sizeof(c.endpoint));
	if (r == 0 && !c.key_id[0]) {
		snprintf(err, errlen,
			 "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY%s",
			 file ? " or put aws_access_key_id and aws_secret_access_key in the "
				"credentials file" : " or name a credentials file in the config");
		r = -ENOENT;
	}
	if (r == 0)
		*ret = c;
	s3_creds_wipe(&c);
	s3_creds_wipe(&f);
	return r;
}

void s3_creds_wipe(struct s3_creds *c)
{
	explicit_bzero(c, sizeof(*c));
}
