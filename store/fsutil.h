/* SPDX-License-Identifier: MIT */
/*
 * fsutil.h - file and directory operations, all fd-relative and never
 * following a symlink in the last component.  The one home of these helpers
 * for the daemon, the storage backends, the reader and ckptctl.
 */
#ifndef CKPT_STORE_FSUTIL_H
#define CKPT_STORE_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Creates the absolute directory `path` and its missing parents with `mode`
 * (less the umask), owned by whoever the calling thread acts as.  Returns 0
 * or -errno. */
int fs_mkdir_p(const char *path, mode_t mode);

/*
 * Opens directory `name` (one path component: no '/', not "." or "..") of
 * dirfd without following a symbolic link: -ELOOP for a link, -ENOTDIR
 * for another kind of file.  O_RDONLY if `readable`, else O_PATH (which
 * needs no read right: enough to walk through and to use as a dirfd).
 * With mode non-zero a missing directory is made first with mode (less
 * the umask), and *ret_made (if not NULL) says whether this call made it.
 * Returns the descriptor (O_CLOEXEC) or -errno.
 */
int fs_open_dir_at(int dirfd, const char *name, bool readable, mode_t mode, bool *ret_made);

/*
 * The absolute `path` with its deepest existing part resolved (realpath:
 * symbolic links, "." and "..") and the rest appended as it is, into
 * ret[len].  A spelling, not a check: what it names may change right
 * after.  Returns 0, -ENAMETOOLONG, or -errno (-EINVAL: not absolute).
 */
int fs_resolve_existing(const char *path, char *ret, size_t len);

/* Removes `name` in dirfd and everything below it, never following
 * symlinks.  Returns 0 (also if it did not exist) or -errno. */
int fs_rm_rf_at(int dirfd, const char *name);

#define FS_ATOMIC 1u /* through a temporary name and a rename */
#define FS_NOSYNC 2u /* no fsync: survives the process, not a power loss */

/* Writes `len` bytes to a new file `name` in dirfd (replacing one) and
 * fsyncs it unless FS_NOSYNC.  Returns 0 or -errno.  (An fsync on ext4 waits
 * for the journal commit that carries every other pending change of the file
 * system, other jobs' included: hundreds of milliseconds under load.) */
int fs_write_file_at(int dirfd, const char *name, const void *buf, size_t len, unsigned flags);

/* Reads a whole small file (at most max bytes) into a malloc'd NUL-terminated
 * buffer.  `name` may have several components (only the last one must not be
 * a symlink).  Returns 0, -ENOENT, -EFBIG (larger than max), -EISDIR,
 * -EINVAL (not a regular file), or -errno (a read error is never taken for
 * the end of the file). */
int fs_read_file_at(int dirfd, const char *name, size_t max, char **ret_buf, size_t *ret_len);

#endif
