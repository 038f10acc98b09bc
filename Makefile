# Builds the five plugins as static release binaries and installs them where runtimes look for
# CNI plugins. `make && sudo make install` puts them into /opt/cni/bin;
# `make install BINDIR=/usr/libexec/cni` (podman's default dir on some distros) or
# `make install DESTDIR=/tmp/stage` (packaging) choose elsewhere.
#
# Static: a node needs no particular libc and each exec skips the dynamic loader (about half a
# millisecond per plugin call). Not position independent, like Debian's Go plugins: a static PIE
# relocates ~3000 pointers at every start (0.1-0.2 ms per call measured on sbr CHECK). The
# explicit --target keeps these flags off build scripts and proc macros, which cannot be static.
#
# musl when its Rust standard library is installed (`rustup target add x86_64-unknown-linux-musl`;
# scripts/setup.sh tries), else the host's glibc. A static glibc spends 0.15-0.25 ms of every
# start detecting the CPU (each CPUID traps to the hypervisor on a VM) and resolving IFUNCs; musl
# does neither. The plugins bring their own allocator (cni/src/arena.rs), so musl's slower
# malloc does not matter. `make TARGET=x86_64-unknown-linux-gnu` forces glibc.

PLUGINS     := portmap tuning bandwidth firewall sbr
PREFIX      ?= /opt/cni
BINDIR      ?= $(PREFIX)/bin
DESTDIR     ?=
# systemd units of deploy/systemd/: /etc/systemd/system for a machine's own install, as
# BINDIR's /opt; a package sets /usr/lib/systemd/system.
UNITDIR     ?= /etc/systemd/system
UNITS       := cni-reconcile@.service cni-reconcile-watch@.service
CARGO       ?= cargo
CARGO_FLAGS ?=
HOST        := $(shell rustc -vV | sed -n 's/^host: //p')
MUSL        := $(subst -gnu,-musl,$(HOST))
TARGET      ?= $(if $(wildcard $(shell rustc --print target-libdir --target $(MUSL) 2>/dev/null)),$(MUSL),$(HOST))
RELEASE_DIR := target/$(TARGET)/release
STATIC_RUSTFLAGS := -C target-feature=+crt-static -C relocation-model=static

.PHONY: all build release install uninstall install-units uninstall-units sizes release-dir

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

# The repair units (deploy/systemd/README.md), with BINDIR in place of /opt/cni/bin, each written
# beside its final name and renamed over it. systemd is told to re-read its units when it runs
# this machine (/run/systemd/system) and nothing is staged under DESTDIR; enabling them is the
# operator's choice.
install-units:
	install -d "$(DESTDIR)$(UNITDIR)"
	@set -e; for u in $(UNITS); do \
		tmp="$(DESTDIR)$(UNITDIR)/.$$u.new"; \
		sed 's|/opt/cni/bin/|$(BINDIR)/|g' "deploy/systemd/$$u" > "$$tmp"; \
		chmod 0644 "$$tmp"; \
		mv -f "$$tmp" "$(DESTDIR)$(UNITDIR)/$$u"; \
		echo "installed $(DESTDIR)$(UNITDIR)/$$u"; \
	done
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

uninstall-units:
	rm -f $(addprefix $(DESTDIR)$(UNITDIR)/,$(UNITS))
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

# The sizes README.md quotes.
sizes: build
	@cd $(RELEASE_DIR) && stat -c '%n %s' $(PLUGINS) | awk '{ printf "%-10s %5.2f MiB\n", $$1, $$2 / 1048576 }'

# Where `build` and `release` put the binaries (scripts/setup.sh runs them from there).
release-dir:
	@echo $(RELEASE_DIR)
