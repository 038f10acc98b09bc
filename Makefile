# Builds the five plugins as static release binaries and installs them where runtimes look for
# CNI plugins. `make && sudo make install` puts them into /opt/cni/bin;
# `make install BINDIR=/usr/libexec/cni` (podman's default dir on some distros) or
# `make install DESTDIR=/tmp/stage` (packaging) choose elsewhere.
#
# Static: a node needs no particular glibc and each exec skips the dynamic loader (about half a
# millisecond per plugin call). Not position independent, like Debian's Go plugins: a static PIE
# relocates ~3000 pointers at every start (0.1-0.2 ms per call measured on sbr CHECK). The
# explicit --target keeps these flags off build scripts and proc macros, which cannot be static.

PLUGINS     := portmap tuning bandwidth firewall sbr
PREFIX      ?= /opt/cni
BINDIR      ?= $(PREFIX)/bin
DESTDIR     ?=
CARGO       ?= cargo
CARGO_FLAGS ?=
TARGET      := $(shell rustc -vV | sed -n 's/^host: //p')
RELEASE_DIR := target/$(TARGET)/release
STATIC_RUSTFLAGS := -C target-feature=+crt-static -C relocation-model=static

.PHONY: all build release install uninstall sizes

all: build

# The plugins only.
build:
	RUSTFLAGS="$(RUSTFLAGS) $(STATIC_RUSTFLAGS)" $(CARGO) build $(CARGO_FLAGS) --release \
		--target $(TARGET) $(addprefix -p ,$(PLUGINS))

# Every binary of the workspace (the plugins, and the demo and bench that exec them).
release:
	RUSTFLAGS="$(RUSTFLAGS) $(STATIC_RUSTFLAGS)" $(CARGO) build $(CARGO_FLAGS) --release \
		--target $(TARGET) --workspace --bins

# Each binary is copied beside its final name and renamed over it, so a runtime exec'ing the
# plugin during an upgrade gets the old file or the new one, never a half-written one. A binary
# that cannot answer VERSION is not installed.
install: build
	install -d "$(DESTDIR)$(BINDIR)"
	@set -e; for p in $(PLUGINS); do \
		tmp="$(DESTDIR)$(BINDIR)/.$$p.new"; \
		install -m 0755 "$(RELEASE_DIR)/$$p" "$$tmp"; \
		if ! echo '{"cniVersion":"1.1.0"}' | env -i CNI_COMMAND=VERSION "$$tmp" >/dev/null; then \
			rm -f "$$tmp"; echo "error: $$p does not run on this machine" >&2; exit 1; \
		fi; \
		mv -f "$$tmp" "$(DESTDIR)$(BINDIR)/$$p"; \
		echo "installed $(DESTDIR)$(BINDIR)/$$p"; \
	done

uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,$(PLUGINS))

# The sizes README.md quotes.
sizes: build
	@cd $(RELEASE_DIR) && stat -c '%n %s' $(PLUGINS) | awk '{ printf "%-10s %5.2f MiB\n", $$1, $$2 / 1048576 }'
