/* SPDX-License-Identifier: MIT */
/* names.c - validation of checkpoint, job, item and root names. */
#include <limits.h>
#include <string.h>

#include "ckpt.h"
#include "format/errmsg.h"
#include "format/names.h"
#include "store/s3_addr.h"

/* Formats the reason and returns false. */
#define reject(err, errlen, ...) (errmsg_set((err), (errlen), 0, __VA_ARGS__) != 0)
#define show(s, buf) errmsg_safe((s), (buf))
#define SHOWBUF ERRMSG_SAFE_LEN

bool name_portable_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '-';
}

/* Shared rule of checkpoint names and job ids. */
static bool portable_ok(const char *what, const char *s, size_t max, char *err, size_t errlen)
{
	char buf[SHOWBUF];
	size_t n;

	if (!s || !*s)
		return reject(err, errlen, "%s is empty", what);
	n = strnlen(s, max + 1);
	if (n > max)
		return reject(err, errlen, "%s '%s' is longer than %zu bytes", what, show(s, buf), max);
	for (size_t i = 0; i < n; i++) {
		if (name_portable_char(s[i]))
			continue;
		if (s[i] == '/')
			return reject(err, errlen, "%s '%s' contains '/'", what, show(s, buf));
		return reject(err, errlen, "%s '%s' has a character outside [A-Za-z0-9._-] at byte %zu",
			      what, show(s, buf), i);
	}
	return true;
}

bool name_run_ok(const char *run, char *err, size_t errlen)
{
	/* Empty: no run id (one run of the job at a time is assumed). */
	return (run && !*run) || portable_ok("run id", run, CKPT_MAX_RUN_LEN, err, errlen);
}

bool name_checkpoint_ok(const char *name, char *err, size_t errlen)
{
	char buf[SHOWBUF];

	if (!portable_ok("checkpoint name", name, CKPT_MAX_NAME_LEN, err, errlen))
		return false;
	if (name[0] == '.')
		return reject(err, errlen, "checkpoint name '%s' starts with '.'", show(name, buf));
	return true;
}

bool name_job_ok(const char *job, char *err, size_t errlen)
{
	return portable_ok("job id", job, CKPT_MAX_JOB_LEN, err, errlen);
}

bool name_item_ok(const char *name, char *err, size_t errlen)
{
	char buf[SHOWBUF];
	size_t n;

	if (!name || !*name)
		return reject(err, errlen, "item name is empty");
	n = strnlen(name, CKPT_MAX_ITEM_NAME + 1);
	if (n > CKPT_MAX_ITEM_NAME)
		return reject(err, errlen, "item name '%s' is longer than %d bytes", show(name, buf),
			      CKPT_MAX_ITEM_NAME);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)name[i];

		if (c < 0x20 || c > 0x7e)
			return reject(err, errlen,
				      "item name '%s' has a byte outside printable ASCII at %zu",
				      show(name, buf), i);
	}
	if (name[0] == '_' && name[1] == '_')
		return reject(err, errlen, "item name '%s' starts with '__' (reserved)", show(name, buf));
	return true;
}

bool name_root_ok(const char *root, char *err, size_t errlen)
{
	char buf[SHOWBUF];
	const size_t max = PATH_MAX - 256;
	size_t n;
	const char *p;

	if (!root || !*root)
		return reject(err, errlen, "root directory is empty");
	if (s3_is_url(root)) {
		struct s3_loc loc;
		char why[256];
		if (s3_url_parse(root, &loc, why, sizeof(why)) < 0)
			return reject(err, errlen, "root '%s': %s", show(root, buf), why);
		return true;
	}
	if (root[0] != '/')
		return reject(err, errlen, "root directory '%s' is not an absolute path", show(root, buf));
	n = strnlen(root, max + 1);
	if (n > max)
		return reject(err, errlen, "root directory '%s' is longer than %zu bytes", show(root, buf),
			      max);
	/* Walk the components after each '/'. */
	for (p = root + 1; *p;) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);

		if (len == 0)
			return reject(err, errlen, "root directory '%s' has an empty component ('//')",
				      show(root, buf));
		if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
			return reject(err, errlen, "root directory '%s' has a '%.*s' component",
				      show(root, buf), (int)len, p);
		if (!slash)
			break;
		p = slash + 1; /* a trailing '/' ends the loop here */
	}
	return true;
}
