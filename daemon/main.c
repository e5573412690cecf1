/* SPDX-License-Identifier: MIT */
/*
 * main.c - ckptd: options, the listening socket, the event loop.
 *
 * Exit codes: 0 after a clean stop, 1 on a run-time failure, 2 on bad usage,
 * 78 (EX_CONFIG) on an invalid configuration -- found before anything starts.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server.h"

#define EX_CONFIG_ 78
#define TICK_MS 50
#define SWEEP_EVERY_MS 60000
#define STOP_GRACE_MS 30000

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ckptd [-c CONFIG] [-s SOCKET] [-r ROOT]... [-o KEY=VALUE]... [-v]\n"
		"             [--check-config] [--version]\n"
		"\n"
		"  -c, --config PATH    configuration file (default %s; a missing default\n"
		"                       file is fine when the flags give a root)\n"
		"  -s, --socket PATH    listening socket (config key 'socket')\n"
		"  -r, --root DIR       allow checkpoints under DIR (repeatable; key 'root')\n"
		"  -o KEY=VALUE         set any config key (repeatable)\n"
		"  -v, --verbose        debug logging\n"
		"      --check-config   validate the configuration and exit\n",
		CONFIG_DEFAULT_PATH);
}

static int listen_socket(struct server *srv)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path = srv->cfg.socket_path;
	/* Keep $LISTEN_FDS (0: do not unset): teardown asks sd_listen_fds()
	 * again to learn that the socket file is systemd's and must not be
	 * unlinked.  No child can mistake it for its own: ckptd execs nothing,
	 * and $LISTEN_PID names this process only. */
	int n = sd_listen_fds(0);
	int fd, r;

	if (n < 0) {
		log_err("the sockets passed by systemd are unusable: %s", strerror(-n));
		return n;
	}
	if (n > 1) {
		log_err("systemd passed %d sockets; expected one", n);
		return -EINVAL;
	}
	if (n == 1) {
		struct sockaddr_un bound = { 0 };
		socklen_t len = sizeof(bound);
		int flags;

		/* sd_listen_fds() has set FD_CLOEXEC; the socket must also be a
		 * listening SOCK_SEQPACKET one (a ListenStream= unit would pass
		 * a stream socket, and Accept=yes a connected one). */
		fd = SD_LISTEN_FDS_START;
		r = sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0);
		if (r <= 0) {
			log_err("the socket systemd passed (fd %d) is not a listening SOCK_SEQPACKET "
				"Unix socket%s%s",
				fd, r < 0 ? ": " : "", r < 0 ? strerror(-r) : "");
			return r < 0 ? r : -EINVAL;
		}
		/* Socket activation promises nothing about O_NONBLOCK (a
		 * socket from systemd-socket-activate is blocking), and the
		 * loop accepts until EAGAIN: on a blocking socket the accept4
		 * after the last pending connection would wait for the next
		 * one, with signals and every client stopped behind it.  The
		 * flag belongs to the open file, shared with the copy the
		 * activator keeps; it only polls that copy, so no harm. */
		flags = fcntl(fd, F_GETFL);
		if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
			r = -errno;
			log_err("making the socket passed by systemd non-blocking: %s", strerror(-r));
			return r;
		}
		/* Clients find the daemon through the configuration's `socket`:
		 * say so when systemd's socket is elsewhere. */
		if (getsockname(fd, (struct sockaddr *)&bound, &len) == 0 &&
		    len > sizeof(sa_family_t) && bound.sun_path[0] != '\0' &&
		    strncmp(bound.sun_path, path, sizeof(bound.sun_path)) != 0)
			log_warn("the socket passed by systemd is '%.*s' but the configuration's "
				 "socket is '%s', where clients will look for it",
				 (int)sizeof(bound.sun_path), bound.sun_path, path);
		log_info("using the socket passed by systemd");
		return fd;
	}

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_err("socket path '%s' is too long", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		goto bound;
	if (errno == EADDRINUSE) {
		/* A socket file is there: if a daemon answers on it, refuse to
		 * steal it; if not, it is a stale leftover. */
		int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(probe);
			close(fd);
			log_err("another ckptd is listening on '%s'", path);
			return -EADDRINUSE;
		}
		if (probe >= 0)
			close(probe);
		unlink(path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			goto bound;
	}
	r = -errno;
	log_err("cannot bind '%s': %s", path, strerror(-r));
	close(fd);
	return r;
bound:
	if (chmod(path, srv->cfg.socket_mode) < 0)
		log_warn("chmod '%s': %s", path, strerror(errno));
	if (listen(fd, 128) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

static int add_ev(struct server *srv, int fd, struct ev *ev, enum ev_kind kind)
{
	struct epoll_event ee = { .events = EPOLLIN, .data.ptr = ev };
	ev->kind = kind;
	ev->ptr = srv;
	return epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ee) < 0 ? -errno : 0;
}

static int setup(struct server *srv)
{
	struct itimerspec its = {
		.it_interval = { 0, TICK_MS * 1000000L },
		.it_value = { 0, TICK_MS * 1000000L },
	};
	sigset_t mask;
	int r;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* A file size limit (LimitFSIZE=) must fail the write with EFBIG and
	 * that save only, not kill the daemon. */
	signal(SIGXFSZ, SIG_IGN);

	if (pipe2(srv->apipe, O_CLOEXEC | O_NONBLOCK) < 0)
		return -errno;
	srv->epfd = epoll_create1(EPOLL_CLOEXEC);
	srv->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	srv->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (srv->epfd < 0 || srv->sigfd < 0 || srv->tfd < 0)
		return -errno;
	timerfd_settime(srv->tfd, 0, &its, NULL);
	srv->lfd = listen_socket(srv);
	if (srv->lfd < 0)
		return srv->lfd;
	if ((r = add_ev(srv, srv->lfd, &srv->ev_listen, EV_LISTEN)) < 0 ||
	    (r = add_ev(srv, srv->sigfd, &srv->ev_sig, EV_SIGNAL)) < 0 ||
	    (r = add_ev(srv, srv->tfd, &srv->ev_timer, EV_TIMER)) < 0 ||
	    (r = add_ev(srv, srv->apipe[0], &srv->ev_arena, EV_ARENA)) < 0)
		return r;
	return 0;
}

/* SIGTERM: take no new clients or saves, fail the saves that can no longer
 * be staged, and let the ones the daemon already owns commit. */
static void begin_stop(struct server *srv)
{
	struct list *p, *t;

	if (srv->stopping)
		return;
	srv->stopping = true;
	sd_notify(0, "STOPPING=1");
	log_info("stopping: finishing the saves already staged");
	epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->lfd, NULL);
	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		bool staged = true;
		for (struct list *q = s->ranks.next; q != &s->ranks; q = q->next)
			staged &= list_entry(q, struct rank_save, slink)->staged;
		if (s->state == SAVE_ACTIVE && !staged)
			save_fail(s, -ESHUTDOWN, "ckptd is shutting down");
	}
}

static bool busy(struct server *srv)
{
	return !list_empty(&srv->saves) || srv->arenas_pending;
}

static int run(struct server *srv)
{
	struct epoll_event evs[64];
	int64_t stop_at = 0;

	for (;;) {
		int n = epoll_wait(srv->epfd, evs, 64, -1);
		if (n < 0 && errno != EINTR) {
			log_err("epoll_wait: %s", strerror(errno));
			return -errno;
		}
		for (int i = 0; i < n; i++) {
			struct ev *ev = evs[i].data.ptr;
			switch (ev->kind) {
			case EV_LISTEN:
				for (int k = 0; k < 64; k++)
					if (server_accept(srv) != 0 || srv->stopping)
						break;
				break;
			case EV_CLIENT:
				server_client_event(ev->ptr, evs[i].events);
				break;
			case EV_RING:
				writer_ring_event(ev->ptr);
				break;
			case EV_ARENA:
				server_arena_event(srv);
				break;
			case EV_SIGNAL: {
				struct signalfd_siginfo si;
				while (read(srv->sigfd, &si, sizeof(si)) == sizeof(si)) {
					if (si.ssi_signo == SIGHUP) {
						log_info("SIGHUP: reload is not supported; restart to "
							 "apply a new configuration");
						continue;
					}
					if (srv->stopping) {
						log_warn("second signal: stopping now");
						return 0;
					}
					begin_stop(srv);
					stop_at = now_ms() + STOP_GRACE_MS;
				}
				break;
			}
			case EV_TIMER: {
				uint64_t ticks;
				if (read(srv->tfd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN)
					log_debug("timerfd: %s", strerror(errno));
				saves_tick(srv);
				/* A leftover becomes removable one deadline after its
				 * last change: sweep that often, at least every minute. */
				if (now_ms() - srv->last_sweep_ms >
				    (int64_t)(srv->cfg.commit_deadline_ms < SWEEP_EVERY_MS ?
						      srv->cfg.commit_deadline_ms :
						      SWEEP_EVERY_MS))
					sweep_roots(srv);
				break;
			}
			}
		}
		server_reap(srv);
		if (srv->stopping && (!busy(srv) || now_ms() > stop_at)) {
			if (busy(srv))
				log_warn("stop grace period over with saves still in flight");
			return 0;
		}
	}
}

static void teardown(struct server *srv)
{
	struct list *p, *t;
	int64_t until = now_ms() + STOP_GRACE_MS;

	/* Arena workers still hold their clients: wait for them (bounded). */
	while (srv->arenas_pending && now_ms() < until) {
		struct pollfd pfd = { .fd = srv->apipe[0], .events = POLLIN };
		if (poll(&pfd, 1, 100) > 0)
			server_arena_event(srv);
	}

	list_for_each_safe(p, t, &srv->clients)
	{
		struct client *c = list_entry(p, struct client, link);
		client_close(c, "daemon stopping");
	}
	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		save_fail(s, -ESHUTDOWN, "ckptd stopped before the save committed");
	}
	/* Writes still in flight complete or are cancelled when the rings go;
	 * the kernel keeps the pages until then. */
	list_for_each_safe(p, t, &srv->clients)
	{
		struct client *c = list_entry(p, struct client, link);
		c->ring_inflight = 0;
		c->slots_held = 0;
		for (struct list *q = c->ranks.next; q != &c->ranks;) {
			struct rank_save *rs = list_entry(q, struct rank_save, clink);
			q = q->next;
			rs->inflight = rs->held = 0;
		}
	}
	server_reap(srv);
	if (srv->lfd >= 0 && sd_listen_fds(0) <= 0)
		unlink(srv->cfg.socket_path);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "socket", required_argument, NULL, 's' },
		{ "root", required_argument, NULL, 'r' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "check-config", no_argument, NULL, 'C' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct server srv = { .lfd = -1, .epfd = -1, .sigfd = -1, .tfd = -1 };
	const char *config_path = NULL;
	char *sets[256];
	size_t n_sets = 0;
	bool check_only = false;
	char err[1024];
	int c, r;

	while ((c = getopt_long(argc, argv, "c:s:r:o:vh", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			config_path = optarg;
			break;
		case 's':
		case 'r':
		case 'o': {
			size_t len = strlen(optarg) + 8;
			if (n_sets == 256) {
				fprintf(stderr, "ckptd: too many -o/-s/-r options\n");
				return 2;
			}
			sets[n_sets] = malloc(len);
			if (!sets[n_sets])
				return 1;
			snprintf(sets[n_sets++], len, "%s%s", c == 's' ? "socket=" :
							      c == 'r' ? "root=" : "",
				 optarg);
			break;
		}
		case 'v':
			log_set_level(LOG_DEBUG);
			break;
		case 'C':
			check_only = true;
			break;
		case 'V':
			printf("ckptd %s\n", CKPT_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "ckptd: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}

	if (config_defaults(&srv.cfg) < 0)
		return 1;
	r = config_load(&srv.cfg, config_path ? config_path : CONFIG_DEFAULT_PATH, err,
			sizeof(err));
	if (r == -ENOENT && !config_path) {
		r = 0; /* no default file: flags alone may configure us */
	} else if (r < 0) {
		if (r == -ENOENT)
			snprintf(err, sizeof(err), "%s: %s", config_path, strerror(ENOENT));
		fprintf(stderr, "ckptd: invalid configuration: %s\n", err);
		return EX_CONFIG_;
	}
	for (size_t i = 0; i < n_sets; i++) {
		char *eq = strchr(sets[i], '=');
		if (!eq) {
			fprintf(stderr, "ckptd: -o '%s': expected KEY=VALUE\n", sets[i]);
			return 2;
		}
		*eq = '\0';
		if (config_set(&srv.cfg, sets[i], eq + 1, err, sizeof(err)) < 0) {
			fprintf(stderr, "ckptd: invalid option: %s\n", err);
			return EX_CONFIG_;
		}
		free(sets[i]);
	}
	if (config_validate(&srv.cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "ckptd: invalid configuration: %s\n", err);
		return EX_CONFIG_;
	}
	if (check_only) {
		printf("configuration is valid\n");
		config_free(&srv.cfg);
		return 0;
	}

	list_init(&srv.clients);
	list_init(&srv.saves);
	srv.start_ms = now_ms();
	srv.euid_root = geteuid() == 0;
	{
		struct rlimit rl;
		if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
			srv.fsize_limit = (uint64_t)rl.rlim_cur;
	}
	r = setup(&srv);
	if (r < 0) {
		log_err("start-up failed: %s", strerror(-r));
		return 1;
	}
	sweep_roots(&srv);
	log_info("ckptd %s ready on '%s' (%zu root%s, arena_max %llu MiB, deadline %llu ms)",
		 CKPT_VERSION, srv.cfg.socket_path, srv.cfg.n_roots, srv.cfg.n_roots == 1 ? "" : "s",
		 (unsigned long long)(srv.cfg.arena_max >> 20),
		 (unsigned long long)srv.cfg.commit_deadline_ms);
	sd_notify(0, "READY=1");

	r = run(&srv);
	teardown(&srv);
	log_info("stopped");
	config_free(&srv.cfg);
	return r < 0 ? 1 : 0;
}
