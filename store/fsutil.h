/* SPDX-License-Identifier: MIT */
/*
 * fsutil.h - file and directory operations, all fd-relative and never
 * following a symlink in the last component.  The one home of these helpers
 * for the daemon, the storage backends, the reader and ckptctl.
 */
#ifndef CKPT_STORE_FSUTIL_H
#define CKPT_STORE_FSUTIL_H

#include <stddef.h>
#include <sys/types.h>

/* Creates the absolute directory `path` and its missing parents with `mode`
 * (less the umask), owned by whoever the calling thread acts as.  Returns 0
 * or -errno. */
int fs_mkdir_p(const char *path, mode_t mode);

/* Removes `name` in dirfd and everything below it, never following
 * symlinks.  Returns 0 (also if it did not exist) or -errno. */
int fs_rm_rf_at(int dirfd, const char *name);

/* Writes `len` bytes to a new file `name` in dirfd (replacing one), fsyncs
 * it.  Through a temporary name and rename if atomic.  Returns 0 or -errno. */
int fs_write_file_at(int dirfd, const char *name, const void *buf, size_t len, int atomic);

/* Reads a whole small file (at most max bytes) into a malloc'd NUL-terminated
 * buffer.  `name` may have several components (only the last one must not be
 * a symlink).  Returns 0, -ENOENT, -EFBIG (larger than max), -EISDIR,
 * -EINVAL (not a regular file), or -errno (a read error is never taken for
 * the end of the file). */
int fs_read_file_at(int dirfd, const char *name, size_t max, char **ret_buf, size_t *ret_len);

#endif
