#!/usr/bin/env bash
# pkgconfig.sh - a program built against the installed libckpt with nothing
# but `pkg-config --cflags --libs libckpt`: `make install` into a scratch
# DESTDIR, compile a small C program (strict warnings) that uses the _INIT
# macros and the version macros, run it against the installed shared
# library, and check the soname, the symbol versions and the .pc version.
# Skips (77) when pkg-config is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if ! command -v pkg-config >/dev/null; then
	echo "pkg-config is not installed (apt-get install pkg-config)"
	exit 77
fi
build=${BUILD:-build}
cc=${CC:-cc}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-pkgconfig.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/root

fail() {
	echo "FAIL: $*"
	exit 1
}

# A sanitizer build (build/san-address-undefined) installs and links with
# the same sanitizers, so that make rebuilds nothing with other flags and
# the program loads the instrumented library.
san=
case $(basename "$build") in
san-*)
	san=$(basename "$build")
	san=${san#san-}
	san=${san//-/,}
	;;
esac

# Only BUILD and SANITIZE from here: not the jobserver of a `make test` above.
if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory install \
	DESTDIR="$dest" PREFIX=/usr/local BUILD="$build" ${san:+SANITIZE=$san} \
	>"$tmp/install.log" 2>&1; then
	cat "$tmp/install.log"
	fail "make install DESTDIR=$dest PREFIX=/usr/local failed"
fi

pcdir=$dest/usr/local/lib/pkgconfig
[ -f "$pcdir/libckpt.pc" ] || fail "no libckpt.pc under $pcdir"
# Only the installed .pc, with its paths under DESTDIR.
export PKG_CONFIG_LIBDIR=$pcdir PKG_CONFIG_PATH=$pcdir PKG_CONFIG_SYSROOT_DIR=$dest

version=$(pkg-config --modversion libckpt)
cflags=$(pkg-config --cflags libckpt)
libs=$(pkg-config --libs libckpt)
echo "libckpt $version: cflags '$cflags', libs '$libs'"
case " $cflags " in
*" -I$dest/usr/local/include "*) ;;
*) fail "pkg-config --cflags does not point into DESTDIR: '$cflags'" ;;
esac

cat >"$tmp/prog.c" <<'EOF'
/* Built with pkg-config only: the installed header and library. */
#include <ckpt.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	char want[32];
	struct ckpt_client *c = NULL;
	int r;

	if (argc != 2)
		return 2;
	snprintf(want, sizeof(want), "%d.%d.%d", CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR,
		 CKPT_VERSION_PATCH);
	if (strcmp(ckpt_version(), want) != 0) {
		fprintf(stderr, "ckpt_version() is %s, the header says %s\n", ckpt_version(), want);
		return 1;
	}

	struct ckpt_connect_opts o = { CKPT_CONNECT_OPTS_INIT, .socket_path = argv[1],
				       .job = "pkgconfig", .world = 1, .timeout_ms = 5000 };
	struct ckpt_save_opts so = { CKPT_SAVE_OPTS_INIT, .root = "/r", .name = "n" };
	struct ckpt_tensor t = { CKPT_TENSOR_INIT };
	t.name = "w";
	if (o.size != sizeof(o) || so.size != sizeof(so) || t.size != sizeof(t)) {
		fprintf(stderr, "an _INIT macro did not set the size\n");
		return 1;
	}
	/* Nobody listens there: -ENOENT means the library took the options. */
	r = ckpt_connect(&o, &c);
	if (r != -ENOENT) {
		fprintf(stderr, "ckpt_connect = %d (%s), want -ENOENT\n", r, ckpt_last_error());
		return 1;
	}
	o.size = 0; /* as a program written for libckpt 0.1 */
	r = ckpt_connect(&o, &c);
	if (r != -EINVAL) {
		fprintf(stderr, "ckpt_connect with size 0 = %d, want -EINVAL\n", r);
		return 1;
	}
	printf("ckpt_version %s\n", ckpt_version());
	return 0;
}
EOF

# shellcheck disable=SC2086 # the flags are lists
if ! "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror ${san:+-fsanitize=$san} $cflags \
	-o "$tmp/prog" "$tmp/prog.c" $libs 2>"$tmp/cc.log"; then
	cat "$tmp/cc.log"
	fail "compiling against the installed header with pkg-config flags failed"
fi
if command -v c++ >/dev/null; then
	# The header is usable from C++ too (designated initializers: C++20).
	printf '#include <ckpt.h>\nint main() { ckpt_tensor t = { CKPT_TENSOR_INIT }; return (int)t.size - (int)sizeof(t); }\n' \
		>"$tmp/prog.cc"
	# shellcheck disable=SC2086
	c++ -std=c++20 -Wall -Werror $cflags -fsyntax-only "$tmp/prog.cc" ||
		fail "ckpt.h does not compile as C++20"
fi

# The program needs the installed libckpt.so.0 and binds to LIBCKPT_0.2.
# (Outputs are captured first: with pipefail, grep -q closing the pipe early
# would fail the writer.)
dyn=$(readelf -d "$tmp/prog")
grep -q 'NEEDED.*\[libckpt\.so\.0\]' <<<"$dyn" ||
	fail "the program does not need libckpt.so.0: $(grep NEEDED <<<"$dyn")"
dyn=$(readelf -d "$dest/usr/local/lib/libckpt.so.$version")
grep -q 'SONAME.*\[libckpt\.so\.0\]' <<<"$dyn" || fail "libckpt.so.$version has no soname libckpt.so.0"
syms=$(objdump -T "$tmp/prog")
grep -Eq '\(LIBCKPT_0\.2\) +ckpt_version$' <<<"$syms" ||
	fail "ckpt_version is not bound to LIBCKPT_0.2: $(grep ckpt_ <<<"$syms")"

out=$(LD_LIBRARY_PATH=$dest/usr/local/lib "$tmp/prog" "$tmp/nobody.sock") ||
	fail "the program failed: $out"
[ "$out" = "ckpt_version $version" ] ||
	fail "the program printed '$out', want 'ckpt_version $version' (the .pc version)"
# It really ran the installed copy.
LD_LIBRARY_PATH=$dest/usr/local/lib LD_DEBUG=libs "$tmp/prog" "$tmp/nobody.sock" \
	>"$tmp/ld.log" 2>&1 || fail "the program failed under LD_DEBUG: $(tail -n 5 "$tmp/ld.log")"
grep -q "calling init: $dest/usr/local/lib/libckpt.so.0" "$tmp/ld.log" ||
	fail "the program did not load $dest/usr/local/lib/libckpt.so.0"

# Static: the installed libckpt.a and `pkg-config --static --libs` are all a
# program needs (Libs.private names every library libckpt.a calls into,
# libdl for the CUDA runtime's dlopen included).
static_libs=$(pkg-config --static --libs libckpt)
case " $static_libs " in
*" -ldl "*) ;;
*) fail "pkg-config --static --libs does not name -ldl (libckpt.a calls dlopen): '$static_libs'" ;;
esac
static_libs=${static_libs//-lckpt/}
# shellcheck disable=SC2086
if ! "$cc" -std=c11 ${san:+-fsanitize=$san} $cflags -o "$tmp/prog-static" "$tmp/prog.c" \
	"$dest/usr/local/lib/libckpt.a" $static_libs 2>"$tmp/cc-static.log"; then
	cat "$tmp/cc-static.log"
	fail "linking libckpt.a with 'pkg-config --static --libs' failed"
fi
if readelf -d "$tmp/prog-static" | grep -q 'NEEDED.*libckpt'; then
	fail "the static program still needs libckpt.so"
fi
out=$("$tmp/prog-static" "$tmp/nobody.sock") || fail "the static program failed: $out"
[ "$out" = "ckpt_version $version" ] || fail "the static program printed '$out'"
echo "ok: $out"
