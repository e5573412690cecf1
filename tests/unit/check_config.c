/* SPDX-License-Identifier: MIT */
/* check_config.c - ckptd configuration: parsers, file syntax, validation, roots. */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"

/* A private directory per test, removed by the teardown. */
static char tmpdir[1024];

static void tmp_setup(void)
{
	const char *base = getenv("TMPDIR");

	snprintf(tmpdir, sizeof(tmpdir), "%s/check_config.XXXXXX", base && *base ? base : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void tmp_teardown(void)
{
	char cmd[PATH_MAX + 32];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
}

static void tmp_path(char *buf, size_t len, const char *rel)
{
	snprintf(buf, len, "%s/%s", tmpdir, rel);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fputs(text, f) >= 0, 1);
	ck_assert_int_eq(fclose(f), 0);
}

/* ---- sizes ---- */

static const struct {
	const char *s;
	int ret;
	uint64_t bytes;
} size_cases[] = {
	{ "1024", 0, 1024 },
	{ "0", 0, 0 },
	{ "4G", 0, 4ull << 30 },
	{ "4g", 0, 4ull << 30 },
	{ "512M", 0, 512ull << 20 },
	{ "64K", 0, 64ull << 10 },
	{ "2T", 0, 2ull << 40 },
	{ "18446744073709551615", 0, UINT64_MAX },
	/* fractions are refused: the size is the exact byte count */
	{ "1.5G", -EINVAL, 0 },
	{ "", -EINVAL, 0 },
	{ "G", -EINVAL, 0 },
	{ "-1", -EINVAL, 0 },
	{ "+1", -EINVAL, 0 },
	{ " 4G", -EINVAL, 0 },
	{ "4 G", -EINVAL, 0 },
	{ "4GB", -EINVAL, 0 },
	{ "4GiB", -EINVAL, 0 },
	{ "4P", -EINVAL, 0 },
	{ "0x10", -EINVAL, 0 },
	{ "18446744073709551616", -EINVAL, 0 },
	{ "17179869184G", -EINVAL, 0 },
};

START_TEST(test_parse_size)
{
	uint64_t v = 0xdeadbeef;
	int ret = config_parse_size(size_cases[_i].s, &v);

	ck_assert_msg(ret == size_cases[_i].ret, "'%s': ret %d, want %d", size_cases[_i].s, ret,
		      size_cases[_i].ret);
	if (ret == 0)
		ck_assert_uint_eq(v, size_cases[_i].bytes);
	else
		ck_assert_uint_eq(v, 0xdeadbeef); /* untouched on failure */
}
END_TEST

/* ---- durations ---- */

static const struct {
	const char *s;
	int ret;
	uint64_t ms;
} dur_cases[] = {
	{ "30", 0, 30000 },
	{ "30s", 0, 30000 },
	{ "250ms", 0, 250 },
	{ "10m", 0, 600000 },
	{ "2h", 0, 7200000 },
	{ "0", 0, 0 },
	{ "1.5s", -EINVAL, 0 },
	{ "10M", -EINVAL, 0 }, /* case matters: M is not minutes */
	{ "7d", -EINVAL, 0 },
	{ "ms", -EINVAL, 0 },
	{ "", -EINVAL, 0 },
	{ "-5", -EINVAL, 0 },
	{ "10 m", -EINVAL, 0 },
	{ "10sec", -EINVAL, 0 },
	{ "18446744073709551615h", -EINVAL, 0 },
};

START_TEST(test_parse_duration)
{
	uint64_t v = 0xdeadbeef;
	int ret = config_parse_duration_ms(dur_cases[_i].s, &v);

	ck_assert_msg(ret == dur_cases[_i].ret, "'%s': ret %d, want %d", dur_cases[_i].s, ret,
		      dur_cases[_i].ret);
	if (ret == 0)
		ck_assert_uint_eq(v, dur_cases[_i].ms);
	else
		ck_assert_uint_eq(v, 0xdeadbeef);
}
END_TEST

/* ---- defaults ---- */

START_TEST(test_defaults)
{
	struct config c;

	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_str_eq(c.socket_path, "/run/ckptd/ckptd.sock");
	ck_assert_uint_eq(c.socket_mode, 0660);
	ck_assert_uint_eq(c.n_roots, 0);
	ck_assert_uint_eq(c.arena_max, 4ull << 30);
	ck_assert_uint_eq(c.arena_total, 16ull << 30);
	ck_assert_uint_eq(c.uring_depth, 16);
	ck_assert_uint_eq(c.commit_deadline_ms, 600000);
	ck_assert_uint_eq(c.max_clients, 256);
	ck_assert(c.o_direct);
	config_free(&c);
	ck_assert_ptr_null(c.socket_path);
	config_free(&c); /* twice is harmless */
	config_free(NULL);
}
END_TEST

/* ---- config_set: every key, good and bad values ---- */

static const struct {
	const char *key, *value;
	int ret;
} set_cases[] = {
	{ "socket", "/tmp/x.sock", 0 },
	{ "socket", "", -EINVAL },
	{ "socket", "/a/very/long/path/that/does/not/fit/into/sun_path/because/it/is/way/"
		    "longer/than/one/hundred/and/seven/bytes/x.sock", -EINVAL },
	{ "socket_mode", "0600", 0 },
	{ "socket_mode", "660", 0 },
	{ "socket_mode", "0800", -EINVAL },
	{ "socket_mode", "01777", -EINVAL },
	{ "socket_mode", "rw", -EINVAL },
	{ "socket_mode", "-0600", -EINVAL },
	{ "arena_max", "1G", 0 },
	{ "arena_max", "1M", 0 },
	{ "arena_max", "512K", -EINVAL }, /* below one slot */
	{ "arena_max", "0", -EINVAL },
	{ "arena_max", "1.5G", -EINVAL },
	{ "arena_total", "64G", 0 },
	{ "arena_total", "lots", -EINVAL },
	{ "uring_depth", "1", 0 },
	{ "uring_depth", "1024", 0 },
	{ "uring_depth", "0", -EINVAL },
	{ "uring_depth", "1025", -EINVAL },
	{ "uring_depth", "8x", -EINVAL },
	{ "commit_deadline", "100ms", 0 },
	{ "commit_deadline", "168h", 0 },
	{ "commit_deadline", "99ms", -EINVAL },
	{ "commit_deadline", "169h", -EINVAL },
	{ "commit_deadline", "0", -EINVAL },
	{ "max_clients", "1", 0 },
	{ "max_clients", "65536", 0 },
	{ "max_clients", "0", -EINVAL },
	{ "max_clients", "65537", -EINVAL },
	{ "o_direct", "no", 0 },
	{ "o_direct", "Yes", 0 },
	{ "o_direct", "false", 0 },
	{ "o_direct", "maybe", -EINVAL },
	{ "root", "/data", 0 },
	{ "root", "data", -EINVAL },
	{ "root", "", -EINVAL },
	{ "roots", "/data", -EINVAL },
	{ "Socket", "/x", -EINVAL },
};

START_TEST(test_set)
{
	struct config c;
	char err[256] = "";
	int ret;

	ck_assert_int_eq(config_defaults(&c), 0);
	ret = config_set(&c, set_cases[_i].key, set_cases[_i].value, err, sizeof(err));
	ck_assert_msg(ret == set_cases[_i].ret, "%s=%s: ret %d, want %d (%s)", set_cases[_i].key,
		      set_cases[_i].value, ret, set_cases[_i].ret, err);
	if (ret < 0)
		ck_assert_msg(err[0] != '\0', "%s=%s: no reason given", set_cases[_i].key,
			      set_cases[_i].value);
	config_free(&c);
}
END_TEST

START_TEST(test_set_values)
{
	struct config c;
	char err[256];

	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_set(&c, "socket", "/tmp/s", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "socket_mode", "0600", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "arena_max", "2G", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "arena_total", "8G", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "uring_depth", "32", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "commit_deadline", "90s", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "max_clients", "8", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "o_direct", "off", err, sizeof(err)), 0);
	ck_assert_str_eq(c.socket_path, "/tmp/s");
	ck_assert_uint_eq(c.socket_mode, 0600);
	ck_assert_uint_eq(c.arena_max, 2ull << 30);
	ck_assert_uint_eq(c.arena_total, 8ull << 30);
	ck_assert_uint_eq(c.uring_depth, 32);
	ck_assert_uint_eq(c.commit_deadline_ms, 90000);
	ck_assert_uint_eq(c.max_clients, 8);
	ck_assert(!c.o_direct);

	/* A refused value leaves the old one. */
	ck_assert_int_eq(config_set(&c, "uring_depth", "0", err, sizeof(err)), -EINVAL);
	ck_assert_uint_eq(c.uring_depth, 32);
	ck_assert_int_eq(config_set(&c, "socket", "", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(c.socket_path, "/tmp/s");
	config_free(&c);
}
END_TEST

/* ---- config_load: file syntax ---- */

START_TEST(test_load_syntax)
{
	char conf[PATH_MAX], root[PATH_MAX], text[4 * PATH_MAX], err[512] = "";
	struct config c;

	tmp_path(conf, sizeof(conf), "ckptd.conf");
	tmp_path(root, sizeof(root), "data#1");
	snprintf(text, sizeof(text),
		 "# ckptd test config\n"
		 "\n"
		 "   \t\n"
		 "socket = %s/ckptd.sock   # trailing comment\n"
		 "socket_mode=0600\n"
		 "\troot\t=\t%s\n"
		 "arena_max = 256M\n"
		 "arena_total = 1G\n"
		 "uring_depth = 8\n"
		 "commit_deadline = 30s\n"
		 "max_clients = 4\n"
		 "o_direct = no\n"
		 "# root = /not/this/one\n",
		 tmpdir, root);
	write_file(conf, text);

	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_msg(config_load(&c, conf, err, sizeof(err)) == 0, "%s", err);
	snprintf(text, sizeof(text), "%s/ckptd.sock", tmpdir);
	ck_assert_str_eq(c.socket_path, text);
	ck_assert_uint_eq(c.socket_mode, 0600);
	ck_assert_uint_eq(c.n_roots, 1);
	ck_assert_str_eq(c.roots[0], root); /* '#' inside a word is not a comment */
	ck_assert_uint_eq(c.arena_max, 256ull << 20);
	ck_assert_uint_eq(c.arena_total, 1ull << 30);
	ck_assert_uint_eq(c.uring_depth, 8);
	ck_assert_uint_eq(c.commit_deadline_ms, 30000);
	ck_assert_uint_eq(c.max_clients, 4);
	ck_assert(!c.o_direct);
	config_free(&c);
}
END_TEST

START_TEST(test_load_missing)
{
	char conf[PATH_MAX], err[512] = "";
	struct config c;

	tmp_path(conf, sizeof(conf), "absent.conf");
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_load(&c, conf, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, conf));
	config_free(&c);
}
END_TEST

/* Each bad file fails with -EINVAL and "PATH:LINE:" naming the bad line. */
static const struct {
	const char *text;
	unsigned line;
	const char *why; /* substring of the reason */
} bad_files[] = {
	{ "socket = /x\n# c\nfrobnicate = 1\n", 3, "unknown key 'frobnicate'" },
	{ "arena_max = 1.5G\n", 1, "arena_max" },
	{ "\n\nuring_depth = 0\n", 3, "uring_depth" },
	{ "root /data\n", 1, "key = value" },
	{ "root =\n", 1, "key = value" },
	{ "= /data\n", 1, "key = value" },
	{ "o_direct = sometimes\n", 1, "o_direct" },
	{ "root = relative/dir\n", 1, "absolute" },
	{ "commit_deadline = 10d\n", 1, "commit_deadline" },
};

START_TEST(test_load_bad)
{
	char conf[PATH_MAX], want[PATH_MAX + 32], err[512] = "";
	struct config c;

	tmp_path(conf, sizeof(conf), "bad.conf");
	write_file(conf, bad_files[_i].text);
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_load(&c, conf, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "%s:%u: ", conf, bad_files[_i].line);
	ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "err '%s' does not start '%s'", err,
		      want);
	ck_assert_msg(strstr(err, bad_files[_i].why) != NULL, "err '%s' lacks '%s'", err,
		      bad_files[_i].why);
	config_free(&c);
}
END_TEST

START_TEST(test_load_long_line)
{
	char conf[PATH_MAX], err[512] = "";
	struct config c;
	char *text = malloc(10000);

	ck_assert_ptr_nonnull(text);
	memset(text, 'x', 9998);
	memcpy(text, "root = /", 8);
	text[9998] = '\n';
	text[9999] = '\0';
	tmp_path(conf, sizeof(conf), "long.conf");
	write_file(conf, text);
	free(text);
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_load(&c, conf, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, ":1: line longer"));
	ck_assert_uint_eq(c.n_roots, 0);
	config_free(&c);
}
END_TEST

/* ---- roots: repeated, too many, validation ---- */

START_TEST(test_roots_repeat)
{
	char conf[PATH_MAX], a[PATH_MAX], b[PATH_MAX], link[PATH_MAX];
	char text[5 * PATH_MAX], err[512] = "";
	struct config c;

	tmp_path(a, sizeof(a), "a");
	tmp_path(b, sizeof(b), "b");
	tmp_path(link, sizeof(link), "link-to-a");
	ck_assert_int_eq(mkdir(a, 0755), 0);
	ck_assert_int_eq(mkdir(b, 0755), 0);
	ck_assert_int_eq(symlink(a, link), 0);

	/* `root` repeats; the same directory spelled three ways is one root. */
	tmp_path(conf, sizeof(conf), "roots.conf");
	snprintf(text, sizeof(text), "root = %s\nroot = %s\nroot = %s/\nroot = %s\n", a, b, a,
		 link);
	write_file(conf, text);
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_msg(config_load(&c, conf, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.n_roots, 4);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.n_roots, 2);
	ck_assert_ptr_null(c.roots[2]);
	{
		char *ca = realpath(a, NULL), *cb = realpath(b, NULL);
		ck_assert_ptr_nonnull(ca);
		ck_assert_ptr_nonnull(cb);
		ck_assert_str_eq(c.roots[0], ca);
		ck_assert_str_eq(c.roots[1], cb);
		free(ca);
		free(cb);
	}
	config_free(&c);
}
END_TEST

START_TEST(test_roots_too_many)
{
	struct config c;
	char err[512] = "", root[64];

	ck_assert_int_eq(config_defaults(&c), 0);
	for (int i = 0; i < CONFIG_MAX_ROOTS; i++) {
		snprintf(root, sizeof(root), "/r%d", i);
		ck_assert_int_eq(config_set(&c, "root", root, err, sizeof(err)), 0);
	}
	ck_assert_int_eq(config_set(&c, "root", "/one-more", err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "more than"));
	ck_assert_uint_eq(c.n_roots, CONFIG_MAX_ROOTS);
	config_free(&c);
}
END_TEST

START_TEST(test_validate_no_root)
{
	struct config c;
	char err[512] = "";

	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "no root"));
	config_free(&c);
}
END_TEST

START_TEST(test_validate_missing_root)
{
	struct config c;
	char err[512] = "", root[PATH_MAX];

	tmp_path(root, sizeof(root), "not-there");
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_set(&c, "root", root, err, sizeof(err)), 0);
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, root) && strstr(err, "No such file"), "%s", err);
	config_free(&c);
}
END_TEST

START_TEST(test_validate_file_root)
{
	struct config c;
	char err[512] = "", root[PATH_MAX];

	tmp_path(root, sizeof(root), "plain-file");
	write_file(root, "x");
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_set(&c, "root", root, err, sizeof(err)), 0);
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "not a directory") != NULL, "%s", err);
	config_free(&c);
}
END_TEST

START_TEST(test_validate_relative_root)
{
	struct config c;
	char err[512] = "";

	/* config_set refuses it; a caller filling roots[] directly is caught too. */
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_set(&c, "root", "tmp", err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "absolute"));
	c.roots[0] = strdup(".");
	c.n_roots = 1;
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "absolute"));
	config_free(&c);
}
END_TEST

START_TEST(test_validate_arena_caps)
{
	struct config c;
	char err[512] = "";

	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_set(&c, "root", tmpdir, err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "arena_max", "8G", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "arena_total", "4G", err, sizeof(err)), 0);
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "arena_max") && strstr(err, "arena_total"), "%s", err);
	ck_assert_int_eq(config_set(&c, "arena_total", "8G", err, sizeof(err)), 0);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);
	config_free(&c);
}
END_TEST

/* ---- config_root_allowed ---- */

/* Paths relative to tmpdir ("" is tmpdir itself); absolute if they start '/'. */
static const struct {
	const char *path;
	bool allowed;
} allowed_cases[] = {
	{ "data", true },
	{ "data/", true },
	{ "data/x", true },
	{ "data/x/y/z", true },        /* not yet created */
	{ "data/sub/new", true },      /* sub exists */
	{ "database", false },         /* prefix but not a component */
	{ "dat", false },
	{ "", false },                 /* the parent of the root */
	{ "other", false },
	{ "other/x", false },
	{ "data/escape", false },      /* symlink to ../other */
	{ "data/escape/new", false },
	{ "data/inside", true },       /* symlink to data/sub */
	{ "data/inside/new", true },
	{ "data/to-root2", true },     /* symlink to another root */
	{ "root2/x", true },
	{ "/", false },
	{ "relative/data", false },
};

START_TEST(test_root_allowed)
{
	struct config c;
	char err[512] = "", p[PATH_MAX], q[PATH_MAX];
	const char *path = allowed_cases[_i].path;

	ck_assert_int_eq(config_defaults(&c), 0);
	tmp_path(p, sizeof(p), "data");
	ck_assert_int_eq(mkdir(p, 0755), 0);
	ck_assert_int_eq(config_set(&c, "root", p, err, sizeof(err)), 0);
	tmp_path(p, sizeof(p), "root2");
	ck_assert_int_eq(mkdir(p, 0755), 0);
	ck_assert_int_eq(config_set(&c, "root", p, err, sizeof(err)), 0);
	tmp_path(p, sizeof(p), "data/sub");
	ck_assert_int_eq(mkdir(p, 0755), 0);
	tmp_path(p, sizeof(p), "database");
	ck_assert_int_eq(mkdir(p, 0755), 0);
	tmp_path(p, sizeof(p), "other");
	ck_assert_int_eq(mkdir(p, 0755), 0);
	tmp_path(p, sizeof(p), "data/escape");
	ck_assert_int_eq(symlink("../other", p), 0);
	tmp_path(p, sizeof(p), "data/inside");
	ck_assert_int_eq(symlink("sub", p), 0);
	tmp_path(p, sizeof(p), "data/to-root2");
	ck_assert_int_eq(symlink("../root2", p), 0);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);

	/* Compare against canonical paths, as the daemon would after
	 * validation (tmpdir itself may sit below a symlink). */
	{
		char *canon = realpath(tmpdir, NULL);
		ck_assert_ptr_nonnull(canon);
		if (path[0] == '/' || strncmp(path, "relative", 8) == 0)
			snprintf(q, sizeof(q), "%s", path);
		else if (path[0] == '\0')
			snprintf(q, sizeof(q), "%s", canon);
		else
			snprintf(q, sizeof(q), "%s/%s", canon, path);
		free(canon);
	}
	ck_assert_msg(config_root_allowed(&c, q) == allowed_cases[_i].allowed, "'%s': want %s", q,
		      allowed_cases[_i].allowed ? "allowed" : "refused");
	config_free(&c);
}
END_TEST

START_TEST(test_root_allowed_slash)
{
	struct config c;
	char err[512] = "";

	/* The root "/" allows every absolute path, and only those. */
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_set(&c, "root", "/", err, sizeof(err)), 0);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert(config_root_allowed(&c, "/"));
	ck_assert(config_root_allowed(&c, "/anything/at/all"));
	ck_assert(!config_root_allowed(&c, "anything"));
	ck_assert(!config_root_allowed(&c, ""));
	config_free(&c);
}
END_TEST

/* ---- the shipped example documents every key with its default ---- */

START_TEST(test_example_config)
{
	static const char *const keys[] = { "socket",	   "socket_mode",     "arena_max",
					    "arena_total", "uring_depth",     "commit_deadline",
					    "max_clients", "o_direct" };
	const char *dir = getenv("CKPT_SOURCE_DIR");
	char path[PATH_MAX], err[512] = "", *line = NULL;
	bool seen[sizeof(keys) / sizeof(keys[0])] = { false };
	struct config def, c;
	size_t cap = 0;
	FILE *f;

	/* tests/run.sh runs the tests from the repository root. */
	snprintf(path, sizeof(path), "%s/systemd/ckptd.conf.example", dir ? dir : ".");
	f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s (run from the repository root)", path);

	/* As shipped it loads (root = /var/lib/ckptd, need not exist here). */
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_msg(config_load(&c, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.n_roots, 1);
	config_free(&c);

	/* Every "#key = value" line, uncommented, gives the default value. */
	ck_assert_int_eq(config_defaults(&def), 0);
	ck_assert_int_eq(config_defaults(&c), 0);
	while (getline(&line, &cap, f) >= 0) {
		char key[64], value[256];

		if (sscanf(line, "#%63[a-z_] = %255s", key, value) != 2)
			continue;
		ck_assert_msg(config_set(&c, key, value, err, sizeof(err)) == 0, "%s", err);
		for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
			if (strcmp(keys[i], key) == 0)
				seen[i] = true;
	}
	free(line);
	fclose(f);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		ck_assert_msg(seen[i], "example does not document '%s'", keys[i]);
	ck_assert_str_eq(c.socket_path, def.socket_path);
	ck_assert_uint_eq(c.socket_mode, def.socket_mode);
	ck_assert_uint_eq(c.arena_max, def.arena_max);
	ck_assert_uint_eq(c.arena_total, def.arena_total);
	ck_assert_uint_eq(c.uring_depth, def.uring_depth);
	ck_assert_uint_eq(c.commit_deadline_ms, def.commit_deadline_ms);
	ck_assert_uint_eq(c.max_clients, def.max_clients);
	ck_assert_int_eq(c.o_direct, def.o_direct);
	config_free(&c);
	config_free(&def);
}
END_TEST

static Suite *config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc;

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
	tc = tcase_create("parse_size");
	tcase_add_loop_test(tc, test_parse_size, 0, N(size_cases));
	suite_add_tcase(s, tc);

	tc = tcase_create("parse_duration");
	tcase_add_loop_test(tc, test_parse_duration, 0, N(dur_cases));
	suite_add_tcase(s, tc);

	tc = tcase_create("defaults");
	tcase_add_test(tc, test_defaults);
	suite_add_tcase(s, tc);

	tc = tcase_create("set");
	tcase_add_loop_test(tc, test_set, 0, N(set_cases));
	tcase_add_test(tc, test_set_values);
	suite_add_tcase(s, tc);

	tc = tcase_create("load");
	tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
	tcase_add_test(tc, test_load_syntax);
	tcase_add_test(tc, test_load_missing);
	tcase_add_loop_test(tc, test_load_bad, 0, N(bad_files));
	tcase_add_test(tc, test_load_long_line);
	suite_add_tcase(s, tc);

	tc = tcase_create("roots");
	tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
	tcase_add_test(tc, test_roots_repeat);
	tcase_add_test(tc, test_roots_too_many);
	suite_add_tcase(s, tc);

	tc = tcase_create("validate");
	tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
	tcase_add_test(tc, test_validate_no_root);
	tcase_add_test(tc, test_validate_missing_root);
	tcase_add_test(tc, test_validate_file_root);
	tcase_add_test(tc, test_validate_relative_root);
	tcase_add_test(tc, test_validate_arena_caps);
	suite_add_tcase(s, tc);

	tc = tcase_create("root_allowed");
	tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
	tcase_add_loop_test(tc, test_root_allowed, 0, N(allowed_cases));
	tcase_add_test(tc, test_root_allowed_slash);
	suite_add_tcase(s, tc);

	tc = tcase_create("example");
	tcase_add_test(tc, test_example_config);
	suite_add_tcase(s, tc);
#undef N
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(config_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
