/* SPDX-License-Identifier: MIT */
/* fsutil.c - see fsutil.h. */
#include "store/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_mkdir_p(const char *path, mode_t mode)
{
	char buf[PATH_MAX];
	size_t len = strlen(path);

	if (len == 0 || len >= sizeof(buf) || path[0] != '/')
		return -EINVAL;
	memcpy(buf, path, len + 1);
	for (size_t i = 1; i <= len; i++) {
		if (buf[i] != '/' && buf[i] != '\0')
			continue;
		char saved = buf[i];
		buf[i] = '\0';
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return -errno;
		buf[i] = saved;
	}
	return 0;
}

int fs_open_dir_at(int dirfd, const char *name, bool readable, mode_t mode, bool *ret_made)
{
	int flags = (readable ? O_RDONLY : O_PATH) | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
	bool made = false;
	struct stat st;
	int fd;

	if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	fd = openat(dirfd, name, flags);
	if (fd < 0 && errno == ENOENT && mode) {
		if (mkdirat(dirfd, name, mode) == 0)
			made = true;
		else if (errno != EEXIST)
			return -errno;
		/* (EEXIST: made by someone else meanwhile, opened as found) */
		fd = openat(dirfd, name, flags);
	}
	if (fd < 0) {
		int e = errno;

		/* O_DIRECTORY says ENOTDIR for a link too: tell them apart. */
		if (e == ENOTDIR && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISLNK(st.st_mode))
			e = ELOOP;
		return -e;
	}
	if (ret_made)
		*ret_made = made;
	return fd;
}

int fs_resolve_existing(const char *path, char *ret, size_t len)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);

	if (path[0] != '/')
		return -EINVAL;
	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (;;) {
		char *canon = realpath(buf, NULL), *slash;
		size_t at = strlen(buf);

		if (canon) {
			/* canon, then what did not exist yet (path from
			 * path[at] on), one '/' between them */
			const char *rest = path + at;
			int w;

			while (*rest == '/')
				rest++;
			w = snprintf(ret, len, "%s%s%s", canon, *rest && strcmp(canon, "/") ? "/" : "",
				     rest);

			free(canon);
			if (w < 0 || (size_t)w >= len)
				return -ENAMETOOLONG;
			return 0;
		}
		if (errno != ENOENT && errno != ENOTDIR)
			return -errno;
		slash = strrchr(buf, '/');
		if (slash == buf)
			slash[1] = '\0'; /* up to "/", which exists */
		else
			*slash = '\0';
	}
}

static int rm_children(int fd)
{
	DIR *d = fdopendir(fd);
	struct dirent *de;
	int r = 0;

	if (!d) {
		close(fd);
		return -errno;
	}
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		int q = fs_rm_rf_at(dirfd(d), de->d_name);
		if (q < 0 && r == 0)
			r = q;
	}
	closedir(d);
	return r;
}

int fs_rm_rf_at(int dirfd, const char *name)
{
	struct stat st;
	int fd, r;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return unlinkat(dirfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	r = rm_children(fd);
	if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && r == 0)
		r = -errno;
	return r;
}

int fs_write_file_at(int dirfd, const char *name, const void *buf, size_t len, unsigned flags)
{
	bool atomic = flags & FS_ATOMIC;
	char tmp[NAME_MAX + 1];
	const char *target = name;
	size_t off = 0;
	int fd, r = 0;

	if (atomic) {
		if (snprintf(tmp, sizeof(tmp), ".%s.tmp", name) >= (int)sizeof(tmp))
			return -ENAMETOOLONG;
		target = tmp;
	}
	fd = openat(dirfd, target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return -errno;
	while (off < len) {
		ssize_t n = write(fd, (const char *)buf + off, len - off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			goto out;
		}
		off += (size_t)n;
	}
	if (!(flags & FS_NOSYNC) && fsync(fd) < 0)
		r = -errno;
out:
	close(fd);
	if (r == 0 && atomic && renameat(dirfd, tmp, dirfd, name) < 0)
		r = -errno;
	if (r < 0 && atomic)
		unlinkat(dirfd, tmp, 0);
	return r;
}

int fs_read_file_at(int dirfd, const char *name, size_t max, char **ret_buf, size_t *ret_len)
{
	struct stat st;
	char *buf;
	size_t off = 0;
	int fd, r = 0;

	/* O_NONBLOCK: opening a FIFO left in a file's place must not hang
	 * (it is refused below); reads of a regular file ignore the flag. */
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		r = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
		r = S_ISREG(st.st_mode) ? -EFBIG : S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	while (off < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + off, (size_t)st.st_size - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			/* An I/O error must not pass for a shorter file. */
			r = -errno;
			free(buf);
			goto out;
		}
		if (n == 0)
			break; /* the file shrank since fstat */
		off += (size_t)n;
	}
	buf[off] = '\0';
	*ret_buf = buf;
	*ret_len = off;
out:
	close(fd);
	return r;
}
