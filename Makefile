# ckptd - top-level build.  `make help` lists the targets.
#
# Quiet by default; `make V=1` prints the commands.  Objects go under
# $(BUILD) (build/, or build/san-<list> with SANITIZE=...).

# Every install path lies under $(DESTDIR)$(PREFIX) unless set by hand;
# SYSCONFDIR is $(PREFIX)/etc, and /etc only for PREFIX=/usr.  ckptd reads
# $(SYSCONFDIR)/ckptd/ckptd.conf when given no -c, so build and install with
# the same PREFIX/SYSCONFDIR (changing them rebuilds what depends on them).
CC       ?= cc
PREFIX   ?= /usr/local
LIBDIR   ?= $(PREFIX)/lib
BINDIR   ?= $(PREFIX)/bin
INCDIR   ?= $(PREFIX)/include
UNITDIR  ?= $(PREFIX)/lib/systemd/system
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
ifeq ($(PREFIX),/usr)
SYSCONFDIR  ?= /etc
else
SYSCONFDIR  ?= $(PREFIX)/etc
endif
DESTDIR  ?=
SANITIZE ?=
VERSION  := 0.6.0

ifeq ($(SANITIZE),)
BUILD    ?= build
else
BUILD    ?= build/san-$(subst $(comma),-,$(SANITIZE))
endif
comma := ,

ifeq ($(V),1)
Q :=
msg = @true
else
Q := @
msg = @printf '  %-7s %s\n' $(1) $(2)
endif

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
        -Wvla -Wimplicit-fallthrough
ifneq ($(CI),)
WARN += -Werror
endif
ifneq ($(WERROR),)
WARN += -Werror
endif

CPPFLAGS += -D_GNU_SOURCE -Iinclude -I. -DCKPT_VERSION=\"$(VERSION)\"
CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu17 -pthread -fPIC -fvisibility=hidden $(WARN) -MMD -MP
LDLIBS   += -ljansson -lisal -luring -lsystemd -lcurl -lpthread -ldl
ifneq ($(SANITIZE),)
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
LDFLAGS += -fsanitize=$(SANITIZE)
endif

# CUDA: cuda/ is built when the toolkit's headers are found (CUDA_HOME, by
# default /usr/local/cuda); CUDA=0 leaves it out, CUDA=1 insists.  Nothing
# links libcudart: libckpt loads it at run time (cuda/cudart.h), so the
# headers are all the build needs, and the daemon never sees CUDA.
CUDA      ?= auto
CUDA_HOME ?= /usr/local/cuda
ifeq ($(filter $(CUDA),0 1 auto),)
$(error CUDA=$(CUDA): use CUDA=0 (leave CUDA out), CUDA=1 (require it) or CUDA=auto)
endif
ifeq ($(CUDA),0)
HAVE_CUDA :=
else
HAVE_CUDA := $(shell test -f '$(CUDA_HOME)/include/cuda_runtime_api.h' && echo 1)
ifeq ($(CUDA)$(HAVE_CUDA),1)
$(error CUDA=1 but no $(CUDA_HOME)/include/cuda_runtime_api.h: set CUDA_HOME to the toolkit)
endif
endif

CORE_SRCS   := $(sort $(wildcard shm/*.c format/*.c store/*.c))
CUDA_SRCS   := $(if $(HAVE_CUDA),$(sort $(wildcard cuda/*.c)))
CLIENT_SRCS := $(sort $(wildcard client/*.c))
DAEMON_MAIN := daemon/main.c
CTL_MAIN    := $(sort $(wildcard ctl/*.c))
DAEMON_SRCS := $(filter-out $(DAEMON_MAIN),$(sort $(wildcard daemon/*.c)))
UNIT_SRCS   := $(sort $(wildcard tests/unit/check_*.c))
INTEG_SRCS  := $(sort $(wildcard tests/integration/check_*.c tests/gpu/check_*.c))
TESTLIB_SRCS := $(sort $(wildcard tests/lib/*.c))
BENCH_SRCS  := $(sort $(wildcard bench/*.c))
EXAMPLE_SRCS := $(sort $(wildcard examples/*.c))
TOOL_SRCS   := $(sort $(wildcard tests/tools/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
CORE_OBJS   := $(call obj,$(CORE_SRCS))
CLIENT_OBJS := $(call obj,$(CLIENT_SRCS)) $(call obj,$(CUDA_SRCS))
DAEMON_OBJS := $(call obj,$(DAEMON_SRCS))
TESTLIB_OBJS := $(call obj,$(TESTLIB_SRCS))

LIB_SO    := $(BUILD)/libckpt.so
LIB_A     := $(BUILD)/libckpt.a
LIB_INT   := $(BUILD)/libckpt-internal.a
CKPTD     := $(BUILD)/ckptd
CKPTCTL   := $(BUILD)/ckptctl
UNIT_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRCS))
INTEG_BINS := $(patsubst %.c,$(BUILD)/tests/%,$(notdir $(INTEG_SRCS)))
BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
FAKE_CUDART := $(if $(HAVE_CUDA),$(BUILD)/tests/libfakecudart.so)
# The fake NCCL is compiled against NCCL's own nccl.h (libckpt needs none):
# built when one is found, else the group-load tests SKIP.
NCCL_INC ?= $(firstword $(foreach d,$(CUDA_HOME)/include /usr/include /usr/local/include,$(if $(wildcard $(d)/nccl.h),$(d))))
FAKE_NCCL := $(if $(HAVE_CUDA),$(if $(NCCL_INC),$(BUILD)/tests/libfakenccl.so))
EXAMPLE_BINS := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRCS))
TOOL_BINS   := $(patsubst tests/tools/%.c,$(BUILD)/tests/%,$(TOOL_SRCS))

.PHONY: all deps test test-s3-faults unit integration demo bench install uninstall clean help check-deps \
	python-lib wheel FORCE

all: $(LIB_SO) $(LIB_A) $(CKPTD) $(CKPTCTL) $(BUILD)/libckpt.pc

help:
	@echo "make            build libckpt.so/.a, ckptd, ckptctl (into $(BUILD)/)"
	@echo "make deps       install missing Debian packages (apt-get) and Python envs"
	@echo "make test       run every test (unit + integration)"
	@echo "make test-s3-faults  the long S3 fault campaign (1000 injected faults)"
	@echo "make demo       start a private ckptd and drive it with a sample trainer"
	@echo "make wheel      the Python package (ckptd) as a wheel bundling libckpt, into $(BUILD)/wheel/"
	@echo "make bench      benchmarks against memcpy, fio, torch.save, DCP (QUICK=1: small)"
	@echo "make install    install under PREFIX=$(PREFIX), config in SYSCONFDIR=$(SYSCONFDIR) (DESTDIR=)"
	@echo "options: V=1 (verbose), SANITIZE=address,undefined | thread, WERROR=1"

# The Debian packages are needed to compile at all: every compile waits for
# this check (once per build directory, again after dpkg changed anything),
# so a fresh machine gets the list of what is missing and `make deps` rather
# than a compiler error.
DEPS_STAMP := $(BUILD)/.deps-checked
$(DEPS_STAMP): scripts/deps.sh $(wildcard /var/lib/dpkg/status)
	@mkdir -p $(dir $@)
	@scripts/deps.sh --check-build >/dev/null || { \
		echo "the build needs the packages above: run 'make deps' (installs what is missing)" >&2; \
		exit 1; }
	@touch $@

check-deps:
	@rm -f $(DEPS_STAMP)
	@$(MAKE) --no-print-directory $(DEPS_STAMP)

deps:
	$(Q)scripts/deps.sh

$(BUILD)/obj/%.o: %.c | $(DEPS_STAMP)
	$(call msg,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# The config file ckptd reads by default is compiled into config.o, and the
# unit file names the install paths.  The stamp holds those paths and is
# rewritten only when one of them changes, so exactly then config.o and the
# unit are made again.
CONFIG_PATH := $(SYSCONFDIR)/ckptd/ckptd.conf
PATHS_STAMP := $(BUILD)/.install-paths
$(PATHS_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(PREFIX) $(BINDIR) $(SYSCONFDIR)' | cmp -s - $@ || \
		echo '$(PREFIX) $(BINDIR) $(SYSCONFDIR)' >$@
$(BUILD)/obj/daemon/config.o: $(PATHS_STAMP)
$(BUILD)/obj/daemon/config.o: CPPFLAGS += -DCKPTD_CONFIG_PATH='"$(CONFIG_PATH)"'

# Whether this build has the CUDA engine is compiled into the client: the
# stamp changes (and the client is rebuilt) exactly when that does.
CUDA_STAMP := $(BUILD)/.cuda
$(CUDA_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(HAVE_CUDA) $(CUDA_HOME)' | cmp -s - $@ || echo '$(HAVE_CUDA) $(CUDA_HOME)' >$@
$(call obj,$(CLIENT_SRCS)): $(CUDA_STAMP)
# Tests and benchmarks see the client's internals, so they are built the
# same way; the CUDA tests are built either way (without CUDA they SKIP).
CUDA_USERS := $(call obj,$(CLIENT_SRCS) $(CUDA_SRCS)) $(UNIT_BINS) $(INTEG_BINS) $(BENCH_BINS)
$(CUDA_USERS): $(CUDA_STAMP)
ifneq ($(HAVE_CUDA),)
$(CUDA_USERS): CPPFLAGS += -DCKPT_HAVE_CUDA -isystem $(CUDA_HOME)/include
endif

$(BUILD)/systemd/ckptd.service: systemd/ckptd.service.in $(PATHS_STAMP)
	$(call msg,GEN,$@)
	@mkdir -p $(dir $@)
	$(Q)sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
		-e 's|@PREFIX@|$(PREFIX)|g' $< >$@
	@if grep -n '@[A-Z_]*@' $@; then echo "$@: placeholder left unsubstituted" >&2; rm -f $@; exit 1; fi

$(LIB_SO): $(CLIENT_OBJS) $(CORE_OBJS) client/libckpt.map
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libckpt.so.0 -Wl,--version-script=client/libckpt.map \
		-o $@ $(CLIENT_OBJS) $(CORE_OBJS) $(LDLIBS)

$(LIB_A): $(CLIENT_OBJS) $(CORE_OBJS)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

# The libckpt the Python wheel bundles (python/setup.py copies $(PYLIB_DIR)
# into ckptd/_lib/): libckpt.so's objects, linked so that the wheel needs
# nothing on the user's machine but glibc and libcurl.  liburing is linked
# in (Debian's liburing.a is position-independent); Debian ships jansson's
# archive without -fPIC and no archive of ISA-L, so their shared libraries
# are copied beside it and found through RUNPATH $ORIGIN; libcurl stays the
# system's, because it brings OpenSSL, whose fixes must come from the
# distribution.  Their Debian copyright files go along where they exist.
PYLIB_DIR    := $(BUILD)/python/lib
PYLIB        := $(PYLIB_DIR)/libckpt.so.0
PYLIB_COPIES := libjansson.so.4 libisal.so.2
PYLIB_DOCS   := libjansson4 libisal2 liburing2

$(PYLIB): $(CLIENT_OBJS) $(CORE_OBJS) client/libckpt.map
	$(call msg,LD,$@)
	@rm -rf $(PYLIB_DIR) && mkdir -p $(PYLIB_DIR)/licenses
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libckpt.so.0 -Wl,--version-script=client/libckpt.map \
		-Wl,-rpath,'$$ORIGIN' -Wl,--as-needed -o $@ $(CLIENT_OBJS) $(CORE_OBJS) \
		-Wl,-Bstatic -luring -Wl,-Bdynamic -ljansson -lisal -lcurl -lpthread -ldl
	$(Q)for l in $(PYLIB_COPIES); do \
		f=$$($(CC) -print-file-name=$$l); \
		case $$f in /*) cp -L "$$f" $(PYLIB_DIR)/$$l ;; \
		*) echo "$$l: not found by $(CC) -print-file-name" >&2; rm -f $@; exit 1 ;; esac; \
	done
	$(Q)for d in $(PYLIB_DOCS); do \
		if [ -r /usr/share/doc/$$d/copyright ]; then \
			cp /usr/share/doc/$$d/copyright $(PYLIB_DIR)/licenses/$$d.copyright; fi; \
	done

# `make wheel`: the Python package with that libckpt, built offline by the
# pinned setuptools of scripts/requirements-wheel.txt (scripts/pyenv.sh).
WHEEL_DIR := $(BUILD)/wheel
PY_VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' python/ckptd/__init__.py)
ifneq ($(SANITIZE),)
python-lib wheel:
	@echo "make $@: python cannot load a sanitized libckpt; build it without SANITIZE" >&2; exit 1
else
python-lib: $(PYLIB)

wheel: $(PYLIB)
	@[ "$(PY_VERSION)" = "$(VERSION)" ] || { \
		echo "python/ckptd/__init__.py says version '$(PY_VERSION)', the Makefile $(VERSION)" >&2; exit 1; }
	$(call msg,WHEEL,$(WHEEL_DIR))
	@rm -rf $(WHEEL_DIR) $(BUILD)/python/setuptools && mkdir -p $(WHEEL_DIR)
	$(Q)py=$$(scripts/pyenv.sh wheel) && \
		CKPTD_LIBCKPT_BUNDLE=$(abspath $(PYLIB_DIR)) CKPTD_SETUP_BUILD=$(abspath $(BUILD)/python/setuptools) \
		"$$py" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w $(WHEEL_DIR) ./python
	@ls $(WHEEL_DIR)/*.whl
endif

$(LIB_INT): $(CLIENT_OBJS) $(CORE_OBJS) $(DAEMON_OBJS)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(CKPTD): $(call obj,$(DAEMON_MAIN)) $(DAEMON_OBJS) $(CORE_OBJS)
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(CKPTCTL): $(call obj,$(CTL_MAIN)) $(LIB_INT)
	$(call msg,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libckpt.pc: client/libckpt.pc.in Makefile
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCDIR@|$(INCDIR)|g' \
		-e 's|@VERSION@|$(VERSION)|g' $< > $@

$(BUILD)/tests/%: tests/unit/%.c $(LIB_INT) $(TESTLIB_OBJS)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(TESTLIB_OBJS) $(LIB_INT) -lcheck -lsubunit -lm -lrt $(LDLIBS)

$(BUILD)/tests/%: tests/integration/%.c $(LIB_INT) $(TESTLIB_OBJS)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(TESTLIB_OBJS) $(LIB_INT) -lcheck -lsubunit -lm -lrt $(LDLIBS)

$(BUILD)/tests/%: tests/gpu/%.c $(LIB_INT) $(TESTLIB_OBJS)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(TESTLIB_OBJS) $(LIB_INT) -lcheck -lsubunit -lm -lrt $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LIB_INT)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB_INT) $(LDLIBS)

$(BUILD)/examples/%: examples/%.c $(LIB_A)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

# Test tools: programs of the public API that scripts run (not tests).
$(BUILD)/tests/%: tests/tools/%.c $(LIB_A)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

# The fake CUDA runtime (tests/fakes/fake_cudart.c), compiled against the
# toolkit's header so that its signatures are the real ones.
$(BUILD)/tests/libfakecudart.so: tests/fakes/fake_cudart.c tests/fakes/fake_cudart.h $(CUDA_STAMP) | $(DEPS_STAMP)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -isystem $(CUDA_HOME)/include $(CFLAGS) $(LDFLAGS) -shared -o $@ $< -lpthread

# The fake NCCL (tests/fakes/fake_nccl.c): ranks are threads of the test;
# it uses the fake CUDA runtime for memory and streams (dlopen at run time).
$(BUILD)/tests/libfakenccl.so: tests/fakes/fake_nccl.c tests/fakes/fake_nccl.h $(CUDA_STAMP) | $(DEPS_STAMP)
	$(call msg,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -isystem $(CUDA_HOME)/include -isystem $(NCCL_INC) $(CFLAGS) $(LDFLAGS) -shared -o $@ $< -lpthread -ldl

tests-build: all $(UNIT_BINS) $(INTEG_BINS) $(EXAMPLE_BINS) $(TOOL_BINS) $(FAKE_CUDART) $(FAKE_NCCL) $(BENCH_BINS)

# `make test`: installs what is missing, builds, runs every test and prints
# one summary line.  TESTS=name,name limits the run; see tests/run.sh.
test:
	$(Q)scripts/deps.sh --quiet
	$(Q)$(MAKE) --no-print-directory tests-build
	$(Q)BUILD=$(BUILD) tests/run.sh

# The long S3 fault campaign: 1000 injected faults instead of make test's
# 200 (tests/integration/s3_faults.sh).
test-s3-faults:
	$(Q)scripts/deps.sh --quiet
	$(Q)$(MAKE) --no-print-directory tests-build
	$(Q)BUILD=$(BUILD) CKPT_TEST_FAULTS=1000 TESTS=s3_faults tests/run.sh

unit: tests-build
	$(Q)BUILD=$(BUILD) tests/run.sh --unit

integration: tests-build
	$(Q)BUILD=$(BUILD) tests/run.sh --integration

demo:
	$(Q)scripts/deps.sh --quiet
	$(Q)$(MAKE) --no-print-directory all $(EXAMPLE_BINS)
	$(Q)BUILD=$(BUILD) scripts/demo.sh

bench:
	$(Q)scripts/deps.sh --quiet --bench
	$(Q)$(MAKE) --no-print-directory all $(BENCH_BINS) $(if $(filter-out 0,$(BENCH_FAKE_CUDA)),$(FAKE_CUDART))
	$(Q)BUILD=$(BUILD) QUICK=$(QUICK) python3 bench/run.py

install: all $(BUILD)/systemd/ckptd.service
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(INCDIR) \
		$(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(UNITDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(SYSCONFDIR)/ckptd
	install -m 0755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/libckpt.so.$(VERSION)
	ln -sf libckpt.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libckpt.so.0
	ln -sf libckpt.so.0 $(DESTDIR)$(LIBDIR)/libckpt.so
	install -m 0644 $(LIB_A) $(DESTDIR)$(LIBDIR)/libckpt.a
	install -m 0644 include/ckpt.h $(DESTDIR)$(INCDIR)/ckpt.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCDIR@|$(INCDIR)|g' \
		-e 's|@VERSION@|$(VERSION)|g' client/libckpt.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/libckpt.pc
	install -m 0755 $(CKPTD) $(CKPTCTL) $(DESTDIR)$(BINDIR)/
	install -m 0644 $(BUILD)/systemd/ckptd.service $(DESTDIR)$(UNITDIR)/ckptd.service
	install -m 0644 systemd/ckptd.socket $(DESTDIR)$(UNITDIR)/ckptd.socket
	install -m 0644 systemd/ckptd.tmpfiles $(DESTDIR)$(TMPFILESDIR)/ckptd.conf
	install -m 0644 systemd/ckptd.sysusers $(DESTDIR)$(SYSUSERSDIR)/ckptd.conf
	test -e $(DESTDIR)$(SYSCONFDIR)/ckptd/ckptd.conf || \
		install -m 0644 systemd/ckptd.conf.example $(DESTDIR)$(SYSCONFDIR)/ckptd/ckptd.conf

# Leaves $(SYSCONFDIR)/ckptd/ckptd.conf: it may hold the admin's edits.
uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libckpt.so* $(DESTDIR)$(LIBDIR)/libckpt.a \
		$(DESTDIR)$(INCDIR)/ckpt.h $(DESTDIR)$(LIBDIR)/pkgconfig/libckpt.pc \
		$(DESTDIR)$(BINDIR)/ckptd $(DESTDIR)$(BINDIR)/ckptctl \
		$(DESTDIR)$(UNITDIR)/ckptd.service $(DESTDIR)$(UNITDIR)/ckptd.socket \
		$(DESTDIR)$(TMPFILESDIR)/ckptd.conf $(DESTDIR)$(SYSUSERSDIR)/ckptd.conf

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
