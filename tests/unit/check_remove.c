/* SPDX-License-Identifier: MIT */
/*
 * check_remove.c - removing local checkpoints (store/remove.h): what is
 * refused (names that are not a checkpoint's, symbolic links, another
 * owner's, a leased one), what a sweep leaves alone, and tombstones.  The
 * crash-at-every-step tests are tests/integration/prune_crash.sh.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/index.h"
#include "store/fsutil.h"
#include "store/remove.h"

static char tmp[PATH_MAX];
static int rootfd = -1;

static void put(const char *rel, const char *text)
{
	ck_assert_int_eq(fs_write_file_at(rootfd, rel, text, strlen(text), 0), 0);
}

static void ckpt(const char *name)
{
	char rel[PATH_MAX];

	ck_assert_int_eq(mkdirat(rootfd, name, 0755), 0);
	snprintf(rel, sizeof(rel), "%s/%s", name, MANIFEST_FILE);
	put(rel, "{\"format\": \"ckpt-1\"}");
	snprintf(rel, sizeof(rel), "%s/shard.bin", name);
	put(rel, "bytes");
}

static bool there(const char *rel)
{
	struct stat st;

	return fstatat(rootfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

static void setup(void)
{
	snprintf(tmp, sizeof(tmp), "/tmp/check_remove.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmp));
	rootfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(rootfd, 0);
}

static void teardown(void)
{
	int parent = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	fs_rm_rf_at(parent, strrchr(tmp, '/') + 1);
	close(parent);
	close(rootfd);
}

static long rm1(const char *name, uid_t owner, struct store_rm_result *res)
{
	struct store_rm_target t = { .name = name };

	return store_local_remove(rootfd, &t, 1, owner, res);
}

START_TEST(test_removes_whole)
{
	struct store_rm_result res[2];
	struct store_rm_target names[2] = { { .name = "a" }, { .name = "b" } };

	ckpt("a");
	ckpt("b");
	ckpt("c");
	ck_assert_int_eq(mkdirat(rootfd, "a/deep", 0755), 0);
	put("a/deep/x", "x");
	ck_assert_int_eq(store_local_remove(rootfd, names, 2, STORE_NO_OWNER, res), 2);
	ck_assert_int_eq(res[0].res, 0);
	ck_assert_int_eq(res[1].res, 0);
	ck_assert(!there("a") && !there("b"));
	ck_assert(there("c/manifest.json") && there("c/shard.bin"));
	/* Nothing left in the trash either. */
	ck_assert_int_eq(store_local_trash_sweep(rootfd, STORE_NO_OWNER, NULL, NULL, NULL), 0);
}
END_TEST

START_TEST(test_refuses_names)
{
	static const char *bad[] = { "", ".", "..", "a/b", "../c", ".ckpt-trash-0123" };
	struct store_rm_result res;

	ckpt("c");
	ck_assert_int_eq(mkdirat(rootfd, ".ckpt-trash-0123", 0755), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(rm1(bad[i], STORE_NO_OWNER, &res), 0);
		ck_assert_int_eq(res.res, -EINVAL);
	}
	ck_assert_int_eq(rm1("missing", STORE_NO_OWNER, &res), 0);
	ck_assert_int_eq(res.res, -ENOENT);
	ck_assert(there("c/manifest.json"));
}
END_TEST

START_TEST(test_never_through_links)
{
	struct store_rm_result res;

	ckpt("c");
	ck_assert_int_eq(symlinkat("c", rootfd, "alias"), 0);
	ck_assert_int_eq(rm1("alias", STORE_NO_OWNER, &res), 0);
	ck_assert_int_eq(res.res, -ENOTDIR);
	ck_assert(there("c/manifest.json") && there("c/shard.bin") && there("alias"));
	/* A link inside a checkpoint goes, its target stays. */
	ckpt("d");
	ck_assert_int_eq(symlinkat("../c", rootfd, "d/link"), 0);
	ck_assert_int_eq(rm1("d", STORE_NO_OWNER, &res), 1);
	ck_assert(there("c/manifest.json") && there("c/shard.bin"));
}
END_TEST

START_TEST(test_owner)
{
	struct store_rm_result res;

	if (geteuid() != 0) {
		printf("SKIP: [owner] needs root to make a directory another uid owns\n");
		return;
	}
	ckpt("theirs");
	ck_assert_int_eq(fchownat(rootfd, "theirs", 4242, 4242, AT_SYMLINK_NOFOLLOW), 0);
	ck_assert_int_eq(rm1("theirs", 4343, &res), 0);
	ck_assert_int_eq(res.res, -EPERM);
	ck_assert_ptr_nonnull(strstr(res.err, "uid 4242"));
	ck_assert(there("theirs/manifest.json"));
	ck_assert_int_eq(rm1("theirs", 4242, &res), 1);
	ck_assert(!there("theirs"));
}
END_TEST

START_TEST(test_lease)
{
	struct store_rm_result res;
	int fd;

	ckpt("read");
	fd = openat(rootfd, "read", O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(store_lease_take(fd, 0), 0);
	ck_assert_int_eq(store_lease_busy(rootfd, "read"), 1);
	ck_assert_int_eq(rm1("read", STORE_NO_OWNER, &res), 0);
	ck_assert_int_eq(res.res, -EBUSY);
	ck_assert(res.in_use);
	ck_assert(there("read/manifest.json"));
	close(fd);
	ck_assert_int_eq(store_lease_busy(rootfd, "read"), 0);
	ck_assert_int_eq(rm1("read", STORE_NO_OWNER, &res), 1);
	ck_assert_int_eq(store_lease_busy(rootfd, "read"), -ENOENT);
}
END_TEST

START_TEST(test_sweep)
{
	size_t problems = 9;
	int fd;

	/* Left by crashes: one still with its manifest, one locked by a
	 * removal still running, a directory renamed to look like trash (no
	 * marker, or a marker naming another), and a file of that name. */
	ck_assert_int_eq(mkdirat(rootfd, ".ckpt-trash-aa", 0755), 0);
	put(".ckpt-trash-aa/manifest.json", "{}");
	put(".ckpt-trash-aa/shard.bin", "x");
	put(".ckpt-trash-aa/.ckpt-removing", "trash=.ckpt-trash-aa\nuid=0\n");
	ck_assert_int_eq(mkdirat(rootfd, ".ckpt-trash-bb", 0755), 0);
	put(".ckpt-trash-bb/shard.bin", "x");
	put(".ckpt-trash-bb/.ckpt-removing", "trash=.ckpt-trash-bb\nuid=0\n");
	ck_assert_int_eq(mkdirat(rootfd, ".ckpt-trash-planted", 0755), 0);
	put(".ckpt-trash-planted/manifest.json", "{}");
	ck_assert_int_eq(mkdirat(rootfd, ".ckpt-trash-other", 0755), 0);
	put(".ckpt-trash-other/.ckpt-removing", "trash=.ckpt-trash-aa\nuid=0\n");
	put(".ckpt-trash-cc", "a file");
	fd = openat(rootfd, ".ckpt-trash-bb", O_RDONLY | O_DIRECTORY);
	ck_assert_int_eq(flock(fd, LOCK_EX), 0);
	ck_assert_int_eq(store_local_trash_sweep(rootfd, STORE_NO_OWNER, NULL, NULL, &problems), 1);
	ck_assert_int_eq(problems, 2);
	ck_assert(!there(".ckpt-trash-aa"));
	ck_assert(there(".ckpt-trash-bb/shard.bin"));
	ck_assert(there(".ckpt-trash-planted/manifest.json"));
	ck_assert(there(".ckpt-trash-other/.ckpt-removing"));
	ck_assert(there(".ckpt-trash-cc"));
	close(fd);
	ck_assert_int_eq(store_local_trash_sweep(rootfd, STORE_NO_OWNER, NULL, NULL, NULL), 1);
	ck_assert(!there(".ckpt-trash-bb"));
}
END_TEST

START_TEST(test_reused_name)
{
	struct store_rm_result res;
	struct store_rm_target t = { .name = "x" };
	struct stat st;

	/* Planned: x as it was; then x is replaced by another checkpoint. */
	ckpt("x");
	ck_assert_int_eq(fstatat(rootfd, "x", &st, 0), 0);
	t.dev = st.st_dev;
	t.ino = st.st_ino;
	ck_assert_int_eq(renameat(rootfd, "x", rootfd, "old"), 0);
	ckpt("x");
	ck_assert_int_eq(store_local_remove(rootfd, &t, 1, STORE_NO_OWNER, &res), 0);
	ck_assert_int_eq(res.res, -ESTALE);
	ck_assert(there("x/manifest.json") && there("old/manifest.json"));
}
END_TEST

START_TEST(test_mount_point)
{
	struct store_rm_result res;
	char path[PATH_MAX + 320];

	if (geteuid() != 0) {
		printf("SKIP: [mount] needs root to mount a tmpfs inside a checkpoint\n");
		return;
	}
	ckpt("m");
	ck_assert_int_eq(mkdirat(rootfd, "m/data", 0755), 0);
	snprintf(path, sizeof(path), "%s/m/data", tmp);
	if (mount("ckpt-test", path, "tmpfs", 0, "size=1m") < 0) {
		printf("SKIP: [mount] cannot mount a tmpfs here: %s\n", strerror(errno));
		return;
	}
	put("m/data/precious", "x");
	ck_assert_int_eq(rm1("m", STORE_NO_OWNER, &res), 0);
	ck_assert_int_eq(res.res, -EXDEV);
	ck_assert(!res.in_use);
	ck_assert_ptr_nonnull(strstr(res.err, "mount point"));
	/* (the directory is in the trash now, the mount with it) */
	{
		char trash[PATH_MAX + 300] = "";
		DIR *d = fdopendir(dup(rootfd));
		struct dirent *de;

		rewinddir(d);
		while ((de = readdir(d)))
			if (store_is_trash_name(de->d_name))
				snprintf(trash, sizeof(trash), "%s/%s/data", tmp, de->d_name);
		closedir(d);
		ck_assert(trash[0]);
		snprintf(path, sizeof(path), "%s/precious", trash);
		ck_assert_int_eq(access(path, F_OK), 0);
		ck_assert_int_eq(umount(trash), 0);
	}
}
END_TEST

START_TEST(test_tombstone)
{
	static const char t[] = "{\"ckpt_tombstone\": {\"by\": \"x\"}}";
	static const char m[] = "{\"format\": \"ckpt-1\", \"ckpt_tombstone\": 1}";
	struct manifest man;
	char err[256] = "";

	ck_assert(store_is_tombstone(t, strlen(t)));
	ck_assert(!store_is_tombstone(m, strlen(m)));
	ck_assert(!store_is_tombstone("{", 1));
	ck_assert(!store_is_tombstone("[\"ckpt_tombstone\"]", 18));
	memset(&man, 0, sizeof(man));
	ck_assert_int_eq(manifest_parse(t, strlen(t), &man, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "being removed"));
	ck_assert(store_is_trash_name(".ckpt-trash-00"));
	ck_assert(!store_is_trash_name("ckpt-trash-00"));
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("remove");
	TCase *tc = tcase_create("local");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_removes_whole);
	tcase_add_test(tc, test_refuses_names);
	tcase_add_test(tc, test_never_through_links);
	tcase_add_test(tc, test_owner);
	tcase_add_test(tc, test_lease);
	tcase_add_test(tc, test_sweep);
	tcase_add_test(tc, test_reused_name);
	tcase_add_test(tc, test_mount_point);
	tcase_add_test(tc, test_tombstone);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
