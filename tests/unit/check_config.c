/* SPDX-License-Identifier: MIT */
/* check_config.c - ckptd configuration: parsers, file syntax, validation, roots. */
#include <arpa/inet.h>
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

/* ---- metrics_listen: what an accepted value binds ---- */

static const struct {
	const char *s;
	int family;
	const char *addr; /* as inet_ntop spells it */
	unsigned port;
} listen_cases[] = {
	{ "127.0.0.1:9464", AF_INET, "127.0.0.1", 9464 },
	{ "127.0.0.1:0", AF_INET, "127.0.0.1", 0 },
	{ "127.9.8.7:65535", AF_INET, "127.9.8.7", 65535 },
	{ "localhost:80", AF_INET, "127.0.0.1", 80 },
	{ "LocalHost:80", AF_INET, "127.0.0.1", 80 },
	{ "[::1]:9464", AF_INET6, "::1", 9464 },
	{ "[0:0:0:0:0:0:0:1]:1", AF_INET6, "::1", 1 },
};

START_TEST(test_parse_listen)
{
	struct config_listen l;
	char why[256] = "", text[INET6_ADDRSTRLEN];

	ck_assert_msg(config_parse_listen(listen_cases[_i].s, &l, why, sizeof(why)) == 0, "%s: %s",
		      listen_cases[_i].s, why);
	ck_assert_int_eq(l.family, listen_cases[_i].family);
	ck_assert_ptr_nonnull(inet_ntop(l.family, l.addr, text, sizeof(text)));
	ck_assert_str_eq(text, listen_cases[_i].addr);
	ck_assert_uint_eq(l.port, listen_cases[_i].port);
}
END_TEST

/* The refusal of a non-loopback address says why. */
START_TEST(test_parse_listen_why)
{
	struct config_listen l = { .port = 7 };
	char why[256] = "";

	ck_assert_int_eq(config_parse_listen("0.0.0.0:9", &l, why, sizeof(why)), -EINVAL);
	ck_assert_msg(strstr(why, "0.0.0.0 is not a loopback address") &&
			      strstr(why, "no authentication"),
		      "%s", why);
	ck_assert_uint_eq(l.port, 7); /* untouched on failure */
	ck_assert_int_eq(config_parse_listen("::1:9", &l, why, sizeof(why)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "[::1]:PORT"));
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
	ck_assert_str_eq(c.state_dir, "/var/lib/ckptd/state");
	ck_assert_uint_eq(c.handshake_timeout_ms, 10000);
	ck_assert_uint_eq(c.max_clients_per_uid, 64);
	ck_assert_ptr_null(c.metrics_listen); /* metrics are off unless asked for */
	ck_assert_ptr_null(c.metrics_textfile);
	config_free(&c);
	ck_assert_ptr_null(c.socket_path);
	ck_assert_ptr_null(c.state_dir);
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
	{ "state_dir", "/srv/ckptd-state", 0 },
	{ "state_dir", "state", -EINVAL },
	{ "state_dir", "", -EINVAL },
	{ "handshake_timeout", "100ms", 0 },
	{ "handshake_timeout", "10m", 0 },
	{ "handshake_timeout", "99ms", -EINVAL },
	{ "handshake_timeout", "601s", -EINVAL },
	{ "handshake_timeout", "5x", -EINVAL },
	{ "max_clients_per_uid", "1", 0 },
	{ "max_clients_per_uid", "65536", 0 },
	{ "max_clients_per_uid", "0", -EINVAL },
	{ "max_clients_per_uid", "65537", -EINVAL },
	{ "max_clients_per_uid", "-1", -EINVAL },
	{ "root", "/data", 0 },
	{ "root", "data", -EINVAL },
	{ "root", "", -EINVAL },
	{ "roots", "/data", -EINVAL },
	{ "Socket", "/x", -EINVAL },
	/* the metrics endpoint has no authentication: loopback only */
	{ "metrics_listen", "127.0.0.1:9464", 0 },
	{ "metrics_listen", "127.0.0.1:0", 0 },
	{ "metrics_listen", "127.200.0.9:65535", 0 },
	{ "metrics_listen", "[::1]:9464", 0 },
	{ "metrics_listen", "localhost:9464", 0 },
	{ "metrics_listen", "0.0.0.0:9464", -EINVAL },
	{ "metrics_listen", "10.0.0.1:9464", -EINVAL },
	{ "metrics_listen", "128.0.0.1:9464", -EINVAL },
	{ "metrics_listen", "[::]:9464", -EINVAL },
	{ "metrics_listen", "[::ffff:127.0.0.1]:9464", -EINVAL },
	{ "metrics_listen", "[fe80::1]:9464", -EINVAL },
	{ "metrics_listen", "example.com:9464", -EINVAL },
	{ "metrics_listen", "localhost.:9464", -EINVAL },
	{ "metrics_listen", "127.0.0.1:65536", -EINVAL },
	{ "metrics_listen", "127.0.0.1:99999999999999999999999", -EINVAL },
	{ "metrics_listen", "127.0.0.1:-1", -EINVAL },
	{ "metrics_listen", "127.0.0.1:+80", -EINVAL },
	{ "metrics_listen", "127.0.0.1:0x50", -EINVAL },
	{ "metrics_listen", "127.0.0.1:80x", -EINVAL },
	{ "metrics_listen", "127.0.0.1:", -EINVAL },
	{ "metrics_listen", "127.0.0.1", -EINVAL },
	{ "metrics_listen", ":9464", -EINVAL },
	{ "metrics_listen", "::1:9464", -EINVAL },
	{ "metrics_listen", "[::1]9464", -EINVAL },
	{ "metrics_listen", "[::1", -EINVAL },
	{ "metrics_listen", "[]:9464", -EINVAL },
	{ "metrics_listen", "127.0.0.1.5:80", -EINVAL },
	{ "metrics_listen", "", -EINVAL },
	{ "metrics_textfile", "/var/lib/node_exporter/textfile/ckptd.prom", 0 },
	{ "metrics_textfile", "/ckptd.prom", 0 },
	{ "metrics_textfile", "ckptd.prom", -EINVAL },
	{ "metrics_textfile", "textfile/ckptd.prom", -EINVAL },
	{ "metrics_textfile", "", -EINVAL },
	{ "metrics_textfile", "/", -EINVAL },
	{ "metrics_textfile", "/var/lib/node_exporter/", -EINVAL },
	{ "metrics_textfile", "/var/lib/.", -EINVAL },
	{ "metrics_textfile", "/var/lib/..", -EINVAL },
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
	ck_assert_int_eq(config_set(&c, "state_dir", "/srv/state", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "handshake_timeout", "2500ms", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "max_clients_per_uid", "3", err, sizeof(err)), 0);
	ck_assert_str_eq(c.state_dir, "/srv/state");
	ck_assert_uint_eq(c.handshake_timeout_ms, 2500);
	ck_assert_uint_eq(c.max_clients_per_uid, 3);
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
	/* the range is spelled as in the example config, in hours */
	{ "commit_deadline = 169h\n", 1, "commit_deadline: '169h' is not a duration in 100ms..168h" },
	{ "\nhandshake_timeout = 1h\n", 2, "handshake_timeout: '1h' is not a duration in 100ms..10m" },
	{ "max_clients_per_uid = 0\n", 1, "max_clients_per_uid: '0' is not a whole number in 1..65536" },
	{ "state_dir = var/lib\n", 1, "state_dir: 'var/lib' is not an absolute path" },
	{ "socket_mode = 0800\n", 1, "socket_mode: '0800' is not an octal mode in 0..0777" },
	{ "arena_max = 1K\n", 1, "arena_max: '1K' is not a size of at least 1M" },
	{ "root = /data\nmetrics_listen = 0.0.0.0:9\n", 2,
	  "metrics_listen: '0.0.0.0:9': 0.0.0.0 is not a loopback address" },
	{ "metrics_listen = 127.0.0.1:70000\n", 1,
	  "metrics_listen: '127.0.0.1:70000': port '70000' is not a whole number in 0..65535" },
	{ "\nmetrics_listen = [::1]\n", 2, "metrics_listen: '[::1]': not HOST:PORT" },
	{ "metrics_textfile = prom/ckptd.prom\n", 1,
	  "metrics_textfile: 'prom/ckptd.prom' is not an absolute path of a file" },
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

START_TEST(test_validate_retention)
{
	struct config c;
	char err[512] = "", root[PATH_MAX], sub[PATH_MAX + 16], v[PATH_MAX + 64];
	static const char *bad[] = { "", "keep_last 3", "relative keep_last 3", "/x",
				     "/x keep_lots 3", "/x keep_last", "/x keep_last 0",
				     "s3://b keep_best 2 -loss min", "s3://Bad_Bucket keep_last 1" };

	tmp_path(root, sizeof(root), "r");
	ck_assert_int_eq(mkdir(root, 0755), 0);
	snprintf(sub, sizeof(sub), "%s/job", root);
	ck_assert_int_eq(mkdir(sub, 0755), 0);
	ck_assert_int_eq(config_defaults(&c), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(config_set(&c, "retention", bad[i], err, sizeof(err)) == -EINVAL,
			      "'%s' accepted", bad[i]);
	ck_assert_uint_eq(c.n_retention, 0);
	/* Rules of one directory join; the same rule twice is refused. */
	ck_assert_int_eq(config_set(&c, "root", root, err, sizeof(err)), 0);
	snprintf(v, sizeof(v), "%s/./job keep_last 3", root);
	ck_assert_int_eq(config_set(&c, "retention", v, err, sizeof(err)), 0);
	snprintf(v, sizeof(v), "%s/./job  keep_best 2 val_loss min", root);
	ck_assert_int_eq(config_set(&c, "retention", v, err, sizeof(err)), 0);
	snprintf(v, sizeof(v), "%s/./job keep_last 4", root);
	ck_assert_int_eq(config_set(&c, "retention", v, err, sizeof(err)), -EINVAL);
	ck_assert_uint_eq(c.n_retention, 1);
	ck_assert_str_eq(c.retention[0].text, "keep_last 3, keep_best 2 val_loss min");
	ck_assert_uint_eq(c.retention[0].policy.keep_last, 3);
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), 0);
	ck_assert_str_eq(c.retention[0].root, sub); /* canonical */
	/* Outside every root: refused at validation. */
	snprintf(v, sizeof(v), "/tmp keep_last 1");
	ck_assert_int_eq(config_set(&c, "retention", v, err, sizeof(err)), 0);
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "is not a root nor below one") != NULL, "%s", err);
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

/* One user's share of arena_total: derived when unset, checked when set. */
static const struct {
	const char *max, *total, *per_uid; /* NULL: the default / unset */
	int ret;
	uint64_t want;                     /* arena_per_uid after validation */
	const char *err;                   /* substring of the message */
} per_uid_cases[] = {
	{ NULL, NULL, NULL, 0, 8ull << 30, NULL },     /* half of 16G */
	{ NULL, "64G", NULL, 0, 32ull << 30, NULL },
	{ "6G", "8G", NULL, 0, 6ull << 30, NULL },     /* never below arena_max */
	{ "8G", "8G", NULL, 0, 8ull << 30, NULL },
	{ "1M", "3M", NULL, 0, 1572864, NULL },        /* half, to the byte */
	{ NULL, NULL, "6G", 0, 6ull << 30, NULL },
	{ NULL, NULL, "4G", 0, 4ull << 30, NULL },     /* = arena_max */
	{ NULL, NULL, "16G", 0, 16ull << 30, NULL },   /* = arena_total: no cap */
	{ NULL, NULL, "4095M", -EINVAL, 0, "arena_per_uid (4293918720 bytes) is smaller than "
					   "arena_max (4294967296 bytes)" },
	{ NULL, NULL, "17G", -EINVAL, 0, "arena_per_uid (18253611008 bytes) is larger than "
					 "arena_total (17179869184 bytes)" },
	{ "2G", "1G", "1G", -EINVAL, 0, "arena_max (2147483648 bytes) is larger than "
					"arena_total" },
};

START_TEST(test_validate_arena_per_uid)
{
	struct config c;
	char err[512] = "";
	int r;

	ck_assert_int_eq(config_defaults(&c), 0);
	/* Unset until validated: it follows arena_total, whatever the order
	 * of the keys. */
	ck_assert_uint_eq(c.arena_per_uid, 0);
	ck_assert_int_eq(config_set(&c, "root", tmpdir, err, sizeof(err)), 0);
	if (per_uid_cases[_i].max)
		ck_assert_int_eq(config_set(&c, "arena_max", per_uid_cases[_i].max, err,
					    sizeof(err)), 0);
	if (per_uid_cases[_i].total)
		ck_assert_int_eq(config_set(&c, "arena_total", per_uid_cases[_i].total, err,
					    sizeof(err)), 0);
	if (per_uid_cases[_i].per_uid)
		ck_assert_int_eq(config_set(&c, "arena_per_uid", per_uid_cases[_i].per_uid, err,
					    sizeof(err)), 0);
	r = config_validate(&c, err, sizeof(err));
	ck_assert_msg(r == per_uid_cases[_i].ret, "ret %d (%s), want %d", r, err,
		      per_uid_cases[_i].ret);
	if (r == 0)
		ck_assert_uint_eq(c.arena_per_uid, per_uid_cases[_i].want);
	else
		ck_assert_msg(strstr(err, per_uid_cases[_i].err), "err '%s' lacks '%s'", err,
			      per_uid_cases[_i].err);
	config_free(&c);
}
END_TEST

/* A derived share follows arena_total if validated again; a set one stays. */
START_TEST(test_validate_arena_per_uid_again)
{
	struct config c;
	char err[512] = "";

	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_int_eq(config_set(&c, "root", tmpdir, err, sizeof(err)), 0);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.arena_per_uid, 8ull << 30);
	ck_assert_int_eq(config_set(&c, "arena_total", "4G", err, sizeof(err)), 0);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.arena_per_uid, 4ull << 30);
	ck_assert_int_eq(config_set(&c, "arena_total", "32G", err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "arena_per_uid", "5G", err, sizeof(err)), 0);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.arena_per_uid, 5ull << 30);
	ck_assert_int_eq(config_set(&c, "arena_total", "64G", err, sizeof(err)), 0);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.arena_per_uid, 5ull << 30);
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
	/* ...and no S3 location: those are for S3 roots alone (else a root
	 * "/" would let a client have ckptd read any bucket). */
	ck_assert(!config_root_allowed(&c, "s3://other-bucket/secret"));
	ck_assert_int_eq(config_set(&c, "root", "s3://bucket/ckpt", err, sizeof(err)), 0);
	ck_assert_msg(config_validate(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert(config_root_allowed(&c, "s3://bucket/ckpt/run1"));
	ck_assert(!config_root_allowed(&c, "s3://bucket/ckpt2"));
	ck_assert(!config_root_allowed(&c, "s3://other-bucket/secret"));
	ck_assert(config_root_allowed(&c, "/anything/at/all"));
	config_free(&c);
}
END_TEST

/* ---- the key table: every row's default and range hold ---- */

/* The value of the field of `k` in `c`, widened (numeric kinds). */
static uint64_t field_u64(const struct config *c, const struct config_key *k)
{
	const char *p = (const char *)c + k->offset;

	switch (k->kind) {
	case CONFIG_MODE:
	case CONFIG_UINT:
		return *(const unsigned *)p;
	case CONFIG_SIZE:
	case CONFIG_DURATION:
		return *(const uint64_t *)p;
	case CONFIG_BOOL:
		return *(const bool *)p;
	default:
		ck_abort_msg("key '%s' is not numeric", k->key);
	}
	return 0;
}

static const char *field_str(const struct config *c, const struct config_key *k)
{
	return *(char *const *)((const char *)c + k->offset);
}

static bool numeric(const struct config_key *k)
{
	return k->kind == CONFIG_MODE || k->kind == CONFIG_UINT || k->kind == CONFIG_SIZE ||
	       k->kind == CONFIG_DURATION;
}

/* v spelled in the key's syntax without a suffix: octal modes, bytes, ms. */
static void spell(const struct config_key *k, uint64_t v, char *buf, size_t len)
{
	if (k->kind == CONFIG_MODE)
		snprintf(buf, len, "0%llo", (unsigned long long)v);
	else if (k->kind == CONFIG_DURATION)
		snprintf(buf, len, "%llums", (unsigned long long)v);
	else
		snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* Sets key=value on defaults; returns the result and, on success, the
 * field's value in *ret. */
static int try_set(const struct config_key *k, uint64_t v, uint64_t *ret, char *err, size_t len)
{
	struct config c;
	char text[64];
	int r;

	spell(k, v, text, sizeof(text));
	ck_assert_int_eq(config_defaults(&c), 0);
	err[0] = '\0';
	r = config_set(&c, k->key, text, err, len);
	if (r == 0)
		*ret = field_u64(&c, k);
	config_free(&c);
	return r;
}

START_TEST(test_key_row)
{
	const struct config_key *k = &config_keys[_i];
	char err[512], expect[256];
	uint64_t got = 0;
	struct config c;

	ck_assert_ptr_eq(config_key_find(k->key), k);
	ck_assert_msg(k->help && k->help[0], "key '%s' has no help", k->key);
	ck_assert_msg(k->min <= k->max, "key '%s': min > max", k->key);

	/* The default is in range (config_defaults would fail otherwise) and
	 * is what config_defaults sets. */
	ck_assert_int_eq(config_defaults(&c), 0);
	if (k->def) {
		struct config d;
		ck_assert_int_eq(config_defaults(&d), 0);
		ck_assert_msg(config_set(&d, k->key, k->def, err, sizeof(err)) == 0, "%s", err);
		if (numeric(k) || k->kind == CONFIG_BOOL)
			ck_assert_uint_eq(field_u64(&c, k), field_u64(&d, k));
		else
			ck_assert_str_eq(field_str(&c, k), field_str(&d, k));
		config_free(&d);
	} else {
		/* Only roots and retention rules (repeatable lists), optional
		 * S3 settings (unset: the AWS variables decide), the metrics
		 * outputs (unset: off) and arena_per_uid (unset: derived from
		 * arena_total by config_validate) have no default, and these
		 * start unset. */
		ck_assert_msg(k->kind == CONFIG_ROOT || k->kind == CONFIG_RETENTION ||
				      !strncmp(k->key, "s3_", 3) ||
				      !strncmp(k->key, "metrics_", 8) ||
				      !strcmp(k->key, "arena_per_uid"),
			      "key '%s' has no default", k->key);
		if (k->kind == CONFIG_RETENTION)
			ck_assert_uint_eq(c.n_retention, 0);
		else if (numeric(k))
			ck_assert_uint_eq(field_u64(&c, k), 0);
		else if (k->kind != CONFIG_ROOT)
			ck_assert_ptr_null(field_str(&c, k));
	}
	config_free(&c);

	if (!numeric(k))
		return;
	/* Both ends are accepted and read back exactly; one past either end
	 * is refused with the key and its range in the message. */
	config_key_expect(k, expect, sizeof(expect));
	ck_assert_msg(try_set(k, k->min, &got, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(got, k->min);
	if (k->max != UINT64_MAX) {
		ck_assert_msg(try_set(k, k->max, &got, err, sizeof(err)) == 0, "%s", err);
		ck_assert_uint_eq(got, k->max);
		ck_assert_int_eq(try_set(k, k->max + 1, &got, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strncmp(err, k->key, strlen(k->key)) == 0 && strstr(err, expect),
			      "'%s' lacks '%s: ... %s'", err, k->key, expect);
	}
	if (k->min > 0) {
		ck_assert_int_eq(try_set(k, k->min - 1, &got, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, expect) != NULL, "'%s' lacks '%s'", err, expect);
	}
}
END_TEST

/* The ranges as messages spell them: hours, not days; exact suffixes. */
static const struct {
	const char *key, *range;
} range_cases[] = {
	{ "commit_deadline", "100ms..168h" }, { "handshake_timeout", "100ms..10m" },
	{ "uring_depth", "1..1024" },         { "max_clients", "1..65536" },
	{ "max_clients_per_uid", "1..65536" }, { "socket_mode", "0..0777" },
	{ "arena_max", "at least 1M" },       { "arena_total", "at least 1M" },
	{ "arena_per_uid", "at least 1M" },
	{ "root", "" },                       { "o_direct", "" },
	{ "metrics_listen", "" },             { "metrics_textfile", "" },
};

START_TEST(test_key_range)
{
	const struct config_key *k = config_key_find(range_cases[_i].key);
	char buf[64];

	ck_assert_ptr_nonnull(k);
	config_key_range(k, buf, sizeof(buf));
	ck_assert_str_eq(buf, range_cases[_i].range);
}
END_TEST

/* ---- the shipped example documents every key, its default and range ---- */

START_TEST(test_example_config)
{
	const struct config_key *k = &config_keys[_i];
	const char *dir = getenv("CKPT_SOURCE_DIR");
	char path[PATH_MAX], err[512] = "", *line = NULL, block[4096] = "", range[64];
	char want[80];
	bool seen = false;
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

	/* The key's line: "#key = default" (commented out: it is the default)
	 * or, for root, "root = ..."; the comment block above it gives the
	 * range as config_key_range spells it, in brackets. */
	ck_assert_int_eq(config_defaults(&def), 0);
	ck_assert_int_eq(config_defaults(&c), 0);
	while (getline(&line, &cap, f) >= 0) {
		char key[64], value[256];

		if (line[0] == '\n') {
			block[0] = '\0';
			continue;
		}
		/* (the value is the rest of the line: retention's has spaces) */
		if (sscanf(line, "#%63[a-z0-9_] = %255[^\n]", key, value) != 2 &&
		    sscanf(line, "%63[a-z0-9_] = %255[^\n]", key, value) != 2) {
			if (strlen(block) + strlen(line) < sizeof(block))
				strcat(block, line);
			continue;
		}
		if (strcmp(key, k->key) != 0)
			continue;
		seen = true;
		ck_assert_msg(config_set(&c, key, value, err, sizeof(err)) == 0, "%s", err);
		if (k->def) {
			ck_assert_msg(line[0] == '#', "example sets '%s' instead of showing it", key);
			if (numeric(k) || k->kind == CONFIG_BOOL)
				ck_assert_uint_eq(field_u64(&c, k), field_u64(&def, k));
			else
				ck_assert_str_eq(field_str(&c, k), field_str(&def, k));
		}
		config_key_range(k, range, sizeof(range));
		if (range[0]) {
			/* The comment may wrap the bracket onto its next line. */
			char flat[sizeof(block)];
			size_t n = 0;
			for (const char *p = block; *p && n + 1 < sizeof(flat); p++) {
				if (*p == '\n' || (*p == '#' && (p == block || p[-1] == '\n')))
					continue;
				flat[n++] = *p;
			}
			flat[n] = '\0';
			snprintf(want, sizeof(want), "[%s]", range);
			ck_assert_msg(strstr(flat, want) != NULL,
				      "example: the comment of '%s' lacks '%s'", key, want);
		}
	}
	free(line);
	fclose(f);
	ck_assert_msg(seen, "example does not document '%s'", k->key);
	config_free(&c);
	config_free(&def);
}
END_TEST

/* ---- where a root came from is in its message ---- */

START_TEST(test_root_origin)
{
	char conf[PATH_MAX], want[PATH_MAX + 64], err[512] = "";
	struct config c;

	tmp_path(conf, sizeof(conf), "origin.conf");
	write_file(conf, "socket = /x.sock\n\nroot = /nonexistent-ckptd-root\n");
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_msg(config_load(&c, conf, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "%s:3: root '/nonexistent-ckptd-root': No such file", conf);
	ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "err '%s', want '%s...'", err, want);
	config_free(&c);

	/* A plain file as root, from the file: PATH:LINE too. */
	tmp_path(want, sizeof(want), "plain");
	write_file(want, "x");
	{
		char text[PATH_MAX + 16];
		snprintf(text, sizeof(text), "root = %s\n", want);
		write_file(conf, text);
	}
	ck_assert_int_eq(config_defaults(&c), 0);
	ck_assert_msg(config_load(&c, conf, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(config_validate(&c, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "%s:1: root '", conf);
	ck_assert_msg(strncmp(err, want, strlen(want)) == 0 && strstr(err, "not a directory"),
		      "err '%s'", err);
	config_free(&c);
}
END_TEST

/* ---- the command line: parsing ---- */

#define MAX_ARGV 10

static const struct {
	const char *argv[MAX_ARGV]; /* after "ckptd" */
	int ret;
	const char *err; /* substring, when ret < 0 */
	bool verbose, check_only, version, help, config_given;
	size_t n_sets;
} parse_cases[] = {
	{ .argv = { NULL } },
	{ .argv = { "-v", "--check-config", NULL }, .verbose = true, .check_only = true },
	{ .argv = { "--version", NULL }, .version = true },
	{ .argv = { "-h", NULL }, .help = true },
	{ .argv = { "-c", "/x.conf", "-r", "/a", "--root=/b", "-s", "/s", "-o", "uring_depth=8",
		    NULL },
	  .config_given = true, .n_sets = 4 },
	{ .argv = { "-o", "uring_depth", NULL }, .ret = -EINVAL,
	  .err = "-o 'uring_depth': expected KEY=VALUE" },
	{ .argv = { "-o", "=8", NULL }, .ret = -EINVAL, .err = "expected KEY=VALUE" },
	{ .argv = { "--frob", NULL }, .ret = -EINVAL, .err = "unknown option '--frob'" },
	{ .argv = { "-x", NULL }, .ret = -EINVAL, .err = "unknown option '-x'" },
	{ .argv = { "-r", NULL }, .ret = -EINVAL, .err = "option '-r' needs a value" },
	{ .argv = { "--config", NULL }, .ret = -EINVAL, .err = "option '--config' needs a value" },
	{ .argv = { "-r", "/a", "extra", NULL }, .ret = -EINVAL,
	  .err = "unexpected argument 'extra'" },
};

static int argv_of(const char *const *in, char **out, const char *prog)
{
	int n = 0;

	out[n++] = (char *)prog;
	for (; n <= MAX_ARGV && in[n - 1]; n++)
		out[n] = (char *)in[n - 1];
	out[n] = NULL;
	return n;
}

START_TEST(test_args_parse)
{
	char *argv[MAX_ARGV + 2];
	int argc = argv_of(parse_cases[_i].argv, argv, "ckptd");
	struct config_args a;
	char err[512] = "";
	int r;

	memset(&a, 0xa5, sizeof(a));
	r = config_args_parse(&a, argc, argv, err, sizeof(err));
	ck_assert_msg(r == parse_cases[_i].ret, "case %d: ret %d, want %d (%s)", _i, r,
		      parse_cases[_i].ret, err);
	if (r < 0) {
		ck_assert_msg(strstr(err, parse_cases[_i].err) != NULL, "err '%s' lacks '%s'", err,
			      parse_cases[_i].err);
		return;
	}
	ck_assert_int_eq(a.verbose, parse_cases[_i].verbose);
	ck_assert_int_eq(a.check_only, parse_cases[_i].check_only);
	ck_assert_int_eq(a.version, parse_cases[_i].version);
	ck_assert_int_eq(a.help, parse_cases[_i].help);
	ck_assert_int_eq(a.config_given, parse_cases[_i].config_given);
	ck_assert_str_eq(a.config_path, a.config_given ? "/x.conf" : config_default_path);
	ck_assert_uint_eq(a.n_sets, parse_cases[_i].n_sets);
	if (a.n_sets == 4) {
		/* in command-line order, -s and -r spelled as their keys */
		ck_assert_str_eq(a.sets[0].key, "root");
		ck_assert_str_eq(a.sets[0].value, "/a");
		ck_assert_str_eq(a.sets[1].key, "root");
		ck_assert_str_eq(a.sets[1].value, "/b");
		ck_assert_str_eq(a.sets[2].key, "socket");
		ck_assert_str_eq(a.sets[3].key, "uring_depth");
		ck_assert_str_eq(a.sets[3].value, "8");
		ck_assert_str_eq(a.sets[3].origin, "-o");
	}
	config_args_free(&a);
	config_args_free(&a);
}
END_TEST

/* ---- the command line and the file compose ---- */

/*
 * In files and arguments, "@T@" is the test's directory (holding the
 * directories a, b and c) and "@F@" the config file.  file NULL: no file.
 */
static const struct {
	const char *what;
	const char *file;
	const char *argv[MAX_ARGV];
	bool no_c;        /* no -c: the file is the default one */
	int ret;
	const char *want; /* ret 0: the roots ("a b"); else an error substring */
	const char *socket;
	unsigned depth;
} compose_cases[] = {
	{ "file roots without flags", "root = @T@/a\nroot = @T@/b\n", { NULL }, .want = "a b" },
	{ "-r replaces the file's roots", "root = @T@/a\n", { "-r", "@T@/b", NULL }, .want = "b" },
	{ "-r replaces a missing root of the installed example",
	  "root = /nonexistent-ckptd-root\n", { "-r", "@T@/b", "-s", "@T@/s.sock", NULL },
	  .want = "b", .socket = "@T@/s.sock" },
	{ "-r repeats", "root = @T@/a\n", { "-r", "@T@/b", "-r", "@T@/c", NULL }, .want = "b c" },
	{ "-o root= replaces too", "root = @T@/a\n", { "-o", "root=@T@/c", "-r", "@T@/b", NULL },
	  .want = "c b" },
	{ "-s wins over the file", "socket = @T@/file.sock\nroot = @T@/a\n",
	  { "-s", "@T@/flag.sock", NULL }, .want = "a", .socket = "@T@/flag.sock" },
	{ "-o wins over the file", "uring_depth = 8\nroot = @T@/a\n",
	  { "-o", "uring_depth=32", NULL }, .want = "a", .depth = 32 },
	{ "the file's value stays without a flag", "uring_depth = 8\nroot = @T@/a\n", { NULL },
	  .want = "a", .depth = 8 },
	{ "last flag wins", "root = @T@/a\n",
	  { "-s", "@T@/1.sock", "-o", "socket=@T@/2.sock", NULL }, .want = "a",
	  .socket = "@T@/2.sock" },
	{ "missing default file, -r given", NULL, { "-r", "@T@/a", NULL }, .no_c = true,
	  .want = "a" },
	{ "missing default file, no root", NULL, { "-s", "@T@/s.sock", NULL }, .no_c = true,
	  .ret = -EINVAL, .want = "no root configured: @F@ does not exist and no -r DIR was given" },
	{ "file without root, no -r", "uring_depth = 8\n", { NULL }, .ret = -EINVAL,
	  .want = "no root configured: add 'root = /path' to @F@ or give -r DIR" },
	{ "missing -c file", NULL, { "-r", "@T@/a", NULL }, .ret = -ENOENT,
	  .want = "@F@: No such file or directory" },
	{ "a bad file is not rescued by flags", "uring_depth = 0\n", { "-r", "@T@/a", NULL },
	  .ret = -EINVAL, .want = "@F@:1: uring_depth: '0' is not a whole number in 1..1024" },
	{ "missing root in the file", "\nroot = /nonexistent-ckptd-root\n", { NULL },
	  .ret = -EINVAL,
	  .want = "@F@:2: root '/nonexistent-ckptd-root': No such file or directory" },
	{ "missing -r root", "root = @T@/a\n", { "-r", "@T@/nope", NULL }, .ret = -EINVAL,
	  .want = "option -r: root '@T@/nope': No such file or directory" },
	{ "relative -r root", "root = @T@/a\n", { "-r", "rel", NULL }, .ret = -EINVAL,
	  .want = "option -r: root 'rel' is not an absolute path" },
	{ "unknown -o key", "root = @T@/a\n", { "-o", "bogus=1", NULL }, .ret = -EINVAL,
	  .want = "option -o: unknown key 'bogus'" },
	{ "arena_per_uid below arena_max, in the file",
	  "root = @T@/a\narena_max = 1G\n\narena_per_uid = 512M\n", { NULL }, .ret = -EINVAL,
	  .want = "@F@:4: arena_per_uid (536870912 bytes) is smaller than arena_max (1073741824 "
		  "bytes)" },
	{ "arena_per_uid above arena_total, by -o", "root = @T@/a\narena_total = 8G\n",
	  { "-o", "arena_per_uid=9G", NULL }, .ret = -EINVAL,
	  .want = "option -o: arena_per_uid (9663676416 bytes) is larger than arena_total "
		  "(8589934592 bytes)" },
	{ "arena_max above arena_total, in the file",
	  "root = @T@/a\narena_total = 1G\narena_max = 2G\n", { NULL }, .ret = -EINVAL,
	  .want = "@F@:3: arena_max (2147483648 bytes) is larger than arena_total" },
	{ "bad -o value", "root = @T@/a\n", { "-o", "handshake_timeout=1h", NULL },
	  .ret = -EINVAL,
	  .want = "option -o: handshake_timeout: '1h' is not a duration in 100ms..10m" },
	{ "bad -s", "root = @T@/a\n", { "-s", "", NULL }, .ret = -EINVAL,
	  .want = "option -s: socket: '' is not a path" },
};

/* Replaces @T@ and @F@ in `in`. */
static void subst(const char *in, const char *conf, char *out, size_t len)
{
	size_t n = 0;

	for (const char *p = in; *p && n + 1 < len;) {
		const char *with = NULL;
		if (strncmp(p, "@T@", 3) == 0)
			with = tmpdir;
		else if (strncmp(p, "@F@", 3) == 0)
			with = conf;
		if (with) {
			n += (size_t)snprintf(out + n, len - n, "%s", with);
			p += 3;
		} else {
			out[n++] = *p++;
		}
	}
	out[n < len ? n : len - 1] = '\0';
}

START_TEST(test_args_compose)
{
	char conf[PATH_MAX], text[2 * PATH_MAX], want[2 * PATH_MAX], err[1024] = "";
	char store[MAX_ARGV + 2][PATH_MAX], *argv[MAX_ARGV + 4];
	struct config_args a;
	struct config c;
	int argc = 0, r;

	for (const char *d = "abc"; *d; d++) {
		char p[PATH_MAX];
		snprintf(p, sizeof(p), "%s/%c", tmpdir, *d);
		ck_assert_int_eq(mkdir(p, 0755), 0);
	}
	tmp_path(conf, sizeof(conf), "ckptd.conf");
	if (compose_cases[_i].file) {
		subst(compose_cases[_i].file, conf, text, sizeof(text));
		write_file(conf, text);
	}
	argv[argc++] = (char *)"ckptd";
	if (!compose_cases[_i].no_c) {
		argv[argc++] = (char *)"-c";
		argv[argc++] = conf;
	}
	for (int i = 0; i < MAX_ARGV && compose_cases[_i].argv[i]; i++) {
		subst(compose_cases[_i].argv[i], conf, store[i], sizeof(store[i]));
		argv[argc++] = store[i];
	}
	argv[argc] = NULL;

	ck_assert_msg(config_args_parse(&a, argc, argv, err, sizeof(err)) == 0, "%s", err);
	if (compose_cases[_i].no_c)
		a.config_path = conf; /* stands in for the default path */
	memset(&c, 0xa5, sizeof(c));
	r = config_from_args(&c, &a, err, sizeof(err));
	config_args_free(&a);
	ck_assert_msg(r == compose_cases[_i].ret, "%s: ret %d, want %d (%s)",
		      compose_cases[_i].what, r, compose_cases[_i].ret, err);
	subst(compose_cases[_i].want, conf, want, sizeof(want));
	if (r < 0) {
		ck_assert_msg(strstr(err, want) != NULL, "%s: err '%s' lacks '%s'",
			      compose_cases[_i].what, err, want);
		return;
	}

	/* The roots, canonical and in order. */
	{
		char *canon = realpath(tmpdir, NULL), got[2 * PATH_MAX] = "";
		size_t off = 0, cl;
		ck_assert_ptr_nonnull(canon);
		cl = strlen(canon);
		for (size_t i = 0; i < c.n_roots; i++) {
			ck_assert_msg(strncmp(c.roots[i], canon, cl) == 0 && c.roots[i][cl] == '/',
				      "root '%s' not under '%s'", c.roots[i], canon);
			off += (size_t)snprintf(got + off, sizeof(got) - off, "%s%s", i ? " " : "",
						c.roots[i] + cl + 1);
		}
		free(canon);
		ck_assert_msg(strcmp(got, want) == 0, "%s: roots '%s', want '%s'",
			      compose_cases[_i].what, got, want);
	}
	if (compose_cases[_i].socket) {
		subst(compose_cases[_i].socket, conf, want, sizeof(want));
		ck_assert_str_eq(c.socket_path, want);
	}
	if (compose_cases[_i].depth)
		ck_assert_uint_eq(c.uring_depth, compose_cases[_i].depth);
	config_free(&c);
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

	tc = tcase_create("parse_listen");
	tcase_add_loop_test(tc, test_parse_listen, 0, N(listen_cases));
	tcase_add_test(tc, test_parse_listen_why);
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
	tcase_add_loop_test(tc, test_validate_arena_per_uid, 0, N(per_uid_cases));
	tcase_add_test(tc, test_validate_arena_per_uid_again);
	tcase_add_test(tc, test_validate_retention);
	suite_add_tcase(s, tc);

	tc = tcase_create("root_allowed");
	tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
	tcase_add_loop_test(tc, test_root_allowed, 0, N(allowed_cases));
	tcase_add_test(tc, test_root_allowed_slash);
	suite_add_tcase(s, tc);

	tc = tcase_create("keys");
	tcase_add_loop_test(tc, test_key_row, 0, (int)config_n_keys);
	tcase_add_loop_test(tc, test_key_range, 0, N(range_cases));
	suite_add_tcase(s, tc);

	tc = tcase_create("example");
	tcase_add_loop_test(tc, test_example_config, 0, (int)config_n_keys);
	suite_add_tcase(s, tc);

	tc = tcase_create("root_origin");
	tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
	tcase_add_test(tc, test_root_origin);
	suite_add_tcase(s, tc);

	tc = tcase_create("args");
	tcase_add_loop_test(tc, test_args_parse, 0, N(parse_cases));
	suite_add_tcase(s, tc);

	tc = tcase_create("compose");
	tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
	tcase_add_loop_test(tc, test_args_compose, 0, N(compose_cases));
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
