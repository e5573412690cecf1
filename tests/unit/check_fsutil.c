/* SPDX-License-Identifier: MIT */
/* check_fsutil.c - the committer's directory operations (daemon/fsutil.c). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/fsutil.h"

static char tmp[PATH_MAX];
static int tmpfd = -1;

static void setup(void)
{
	snprintf(tmp, sizeof(tmp), "/tmp/check_fsutil.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmp));
	tmpfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(tmpfd, 0);
}

static void teardown(void)
{
	char name[PATH_MAX];
	char *slash = strrchr(tmp, '/');
	int parent = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	snprintf(name, sizeof(name), "%s", slash + 1);
	fs_rm_rf_at(parent, name);
	close(parent);
	close(tmpfd);
}

static bool exists(const char *rel)
{
	struct stat st;
	return fstatat(tmpfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

START_TEST(test_mkdir_p)
{
	char p[PATH_MAX + 64];
	struct stat st;

	snprintf(p, sizeof(p), "%s/a/b/c", tmp);
	ck_assert_int_eq(fs_mkdir_p(p, 0755), 0);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	/* Again: every component exists, which is fine. */
	ck_assert_int_eq(fs_mkdir_p(p, 0755), 0);
	ck_assert_int_eq(fs_mkdir_p("relative/path", 0755), -EINVAL);
	ck_assert_int_eq(fs_mkdir_p("", 0755), -EINVAL);
	/* A file in the way. */
	ck_assert_int_eq(fs_write_file_at(tmpfd, "file", "x", 1, 0), 0);
	snprintf(p, sizeof(p), "%s/file/sub", tmp);
	ck_assert_int_eq(fs_mkdir_p(p, 0755), -ENOTDIR);
}
END_TEST

START_TEST(test_rm_rf_no_follow)
{
	char outside[PATH_MAX + 64];
	int fd;

	/* A tree with a symlink to a directory outside it: the link goes, the
	 * target and its contents stay. */
	ck_assert_int_eq(mkdirat(tmpfd, "keep", 0755), 0);
	ck_assert_int_eq(fs_write_file_at(tmpfd, "keep/precious", "data", 4, 0), 0);
	ck_assert_int_eq(mkdirat(tmpfd, "tree", 0755), 0);
	ck_assert_int_eq(mkdirat(tmpfd, "tree/sub", 0755), 0);
	ck_assert_int_eq(fs_write_file_at(tmpfd, "tree/sub/f", "1234", 4, 0), 0);
	snprintf(outside, sizeof(outside), "%s/keep", tmp);
	ck_assert_int_eq(symlinkat(outside, tmpfd, "tree/link"), 0);
	ck_assert_int_eq(fs_rm_rf_at(tmpfd, "tree"), 0);
	ck_assert(!exists("tree"));
	ck_assert(exists("keep/precious"));
	/* Absent is not an error; a plain file is removed. */
	ck_assert_int_eq(fs_rm_rf_at(tmpfd, "tree"), 0);
	fd = openat(tmpfd, "plain", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(fs_rm_rf_at(tmpfd, "plain"), 0);
	ck_assert(!exists("plain"));
}
END_TEST

START_TEST(test_write_read)
{
	char *buf = NULL;
	size_t len = 0;

	ck_assert_int_eq(fs_write_file_at(tmpfd, "m.json", "{\"a\":1}", 7, 1), 0);
	/* The temporary name is gone after an atomic write. */
	ck_assert(!exists(".m.json.tmp"));
	ck_assert_int_eq(fs_read_file_at(tmpfd, "m.json", 100, &buf, &len), 0);
	ck_assert_uint_eq(len, 7);
	ck_assert_str_eq(buf, "{\"a\":1}");
	free(buf);
	/* Replacing keeps one file with the new content. */
	ck_assert_int_eq(fs_write_file_at(tmpfd, "m.json", "{}", 2, 1), 0);
	ck_assert_int_eq(fs_read_file_at(tmpfd, "m.json", 100, &buf, &len), 0);
	ck_assert_str_eq(buf, "{}");
	free(buf);
	/* Limits and absence. */
	ck_assert_int_eq(fs_read_file_at(tmpfd, "m.json", 1, &buf, &len), -EFBIG);
	ck_assert_int_eq(fs_read_file_at(tmpfd, "missing", 100, &buf, &len), -ENOENT);
	ck_assert_int_eq(mkdirat(tmpfd, "dir", 0755), 0);
	ck_assert_int_eq(fs_read_file_at(tmpfd, "dir", 100, &buf, &len), -EISDIR);
}
END_TEST

/* One directory at a time, never through a link, made when missing. */
START_TEST(test_open_dir_at)
{
	struct stat st;
	bool made = true;
	int fd;

	ck_assert_int_eq(mkdirat(tmpfd, "d", 0755), 0);
	ck_assert_int_eq(symlinkat("d", tmpfd, "link"), 0);
	ck_assert_int_eq(fs_write_file_at(tmpfd, "file", "x", 1, 0), 0);
	fd = fs_open_dir_at(tmpfd, "d", true, 0, &made);
	ck_assert_int_ge(fd, 0);
	ck_assert(!made);
	close(fd);
	ck_assert_int_eq(fs_open_dir_at(tmpfd, "link", false, 0755, NULL), -ELOOP);
	ck_assert_int_eq(fs_open_dir_at(tmpfd, "file", false, 0755, NULL), -ENOTDIR);
	ck_assert_int_eq(fs_open_dir_at(tmpfd, "missing", false, 0, NULL), -ENOENT);
	ck_assert_int_eq(fs_open_dir_at(tmpfd, "..", false, 0, NULL), -EINVAL);
	ck_assert_int_eq(fs_open_dir_at(tmpfd, "d/x", false, 0755, NULL), -EINVAL);
	/* Made with the mode less the umask. */
	umask(0);
	fd = fs_open_dir_at(tmpfd, "new", false, 0755, &made);
	umask(022);
	ck_assert_int_ge(fd, 0);
	ck_assert(made);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(st.st_mode & 07777, 0755);
	close(fd);
}
END_TEST

/* A spelling: the existing part resolved, the rest appended. */
START_TEST(test_resolve_existing)
{
	char p[PATH_MAX + 64], want[PATH_MAX + 64], got[PATH_MAX];
	char *real = realpath(tmp, NULL);

	ck_assert_ptr_nonnull(real);
	ck_assert_int_eq(mkdirat(tmpfd, "d", 0755), 0);
	ck_assert_int_eq(symlinkat("d", tmpfd, "link"), 0);
	snprintf(p, sizeof(p), "%s/link/not/yet", tmp);
	snprintf(want, sizeof(want), "%s/d/not/yet", real);
	ck_assert_int_eq(fs_resolve_existing(p, got, sizeof(got)), 0);
	ck_assert_str_eq(got, want);
	snprintf(p, sizeof(p), "%s/link", tmp);
	snprintf(want, sizeof(want), "%s/d", real);
	ck_assert_int_eq(fs_resolve_existing(p, got, sizeof(got)), 0);
	ck_assert_str_eq(got, want);
	ck_assert_int_eq(fs_resolve_existing("/", got, sizeof(got)), 0);
	ck_assert_str_eq(got, "/");
	ck_assert_int_eq(fs_resolve_existing("/nonexistent-ckpt-dir/x", got, sizeof(got)), 0);
	ck_assert_str_eq(got, "/nonexistent-ckpt-dir/x");
	ck_assert_int_eq(fs_resolve_existing("relative", got, sizeof(got)), -EINVAL);
	ck_assert_int_eq(fs_resolve_existing(p, got, 4), -ENAMETOOLONG);
	free(real);
}
END_TEST

static Suite *fsutil_suite(void)
{
	Suite *s = suite_create("fsutil");
	TCase *tc;

	tc = tcase_create("mkdir_p");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_mkdir_p);
	suite_add_tcase(s, tc);
	tc = tcase_create("rm_rf");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_rm_rf_no_follow);
	suite_add_tcase(s, tc);
	tc = tcase_create("write_read");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_write_read);
	suite_add_tcase(s, tc);
	tc = tcase_create("walk");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_open_dir_at);
	tcase_add_test(tc, test_resolve_existing);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(fsutil_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
