/* SPDX-License-Identifier: MIT */
/*
 * root.c - what a save's root may be (store.h: store_name_reserved,
 * root_open), and the local backend's root_open.
 *
 * A root lies at or below an allowed root of the daemon.  Below that, each
 * directory of its path is checked and opened in turn, from the one above
 * it, never through a symbolic link; the directory that passed is the one
 * the save then uses (its descriptor goes to attempt_open).  Resolving the
 * path, checking the result and opening the path again would let a user
 * who can write a directory of the path swap it for a link in between and
 * send the save, with the daemon's help, anywhere the user could not reach
 * through the roots.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "format/index.h"
#include "store/fsutil.h"
#include "store/store.h"
#include "store/store_local.h"

/* Directories made below an allowed root: writable by their user only
 * (the umask may take more away, never add).  Another user who could
 * write a job's directory could rename or replace its checkpoints. */
#define ROOT_DIR_MODE 0755

bool store_name_reserved(const char *name)
{
	return !strncmp(name, STORE_RESERVED_PREFIX, sizeof(STORE_RESERVED_PREFIX) - 1) ||
	       !strncmp(name, STORE_LEGACY_WORK_PREFIX, sizeof(STORE_LEGACY_WORK_PREFIX) - 1) ||
	       !strcmp(name, MANIFEST_FILE);
}

int store_local_root_open(const char *base, const char *root, int *ret_fd, char *err,
			  size_t errlen)
{
	size_t bl = strlen(base), below;
	const char *p;
	int fd, r;

	while (bl > 1 && base[bl - 1] == '/')
		bl--;
	/* Components that start at `below` or later lie below base. */
	below = bl == 1 ? 1 : bl + 1;
	if (base[0] != '/' || root[0] != '/' || strncmp(root, base, bl) ||
	    (bl > 1 && root[bl] && root[bl] != '/')) {
		snprintf(err, errlen, "root '%.400s' is not below '%.400s'", root, base);
		return -EINVAL;
	}
	fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (p = root + 1; *p;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		bool in = (size_t)(p - root) >= below, made = false;
		char name[NAME_MAX + 1];
		int sub;

		if (n == 0) {
			p++; /* a trailing '/' */
			continue;
		}
		if (n > NAME_MAX) {
			r = -ENAMETOOLONG;
			snprintf(err, errlen, "root '%.400s' has a component longer than %d bytes",
				 root, NAME_MAX);
			goto fail;
		}
		memcpy(name, p, n);
		name[n] = '\0';
		p += n;
		if (in && store_name_reserved(name)) {
			r = -EINVAL;
			snprintf(err, errlen, "root '%.400s': '%s' is a name ckptd keeps for its own "
				 "(work areas, trash, leases, manifests): choose another directory",
				 root, name);
			goto fail;
		}
		/* Only below the allowed root is anything made. */
		sub = fs_open_dir_at(fd, name, false, in ? ROOT_DIR_MODE : 0, &made);
		if (sub < 0) {
			r = sub == -ELOOP ? -EACCES : sub;
			snprintf(err, errlen, "root '%.400s': '%.*s' %s", root,
				 (int)(p - root), root,
				 sub == -ELOOP ? "is a symbolic link (ckptd follows none in a "
						 "save's root)" :
				 sub == -ENOTDIR ? "is not a directory" :
				 in ? "cannot be opened or created" : "cannot be opened");
			if (sub != -ELOOP && sub != -ENOTDIR)
				snprintf(err + strlen(err), errlen - strlen(err), ": %s",
					 strerror(-sub));
			goto fail;
		}
		close(fd);
		fd = sub;
		/* A root inside a checkpoint would go with it when it is
		 * removed, and list as nothing. */
		if (in && !made && faccessat(fd, MANIFEST_FILE, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
			r = -EINVAL;
			snprintf(err, errlen, "root '%.400s' lies inside checkpoint '%.*s': a save's "
				 "root may not be inside a checkpoint", root, (int)(p - root), root);
			goto fail;
		}
	}
	/* The directory walked to, readable (fsync, listing): "." is that
	 * directory itself, not a path resolved again. */
	r = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (r < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot open root '%.400s': %s", root, strerror(-r));
		goto fail;
	}
	close(fd);
	*ret_fd = r;
	return 0;

fail:
	close(fd);
	return r;
}
