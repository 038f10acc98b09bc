//! `firewall`'s firewalld backend against a real firewalld: a private `dbus-daemon` (system
//! bus policy, listening on a socket in a tempdir) and `firewalld --nofork --nopid`, both
//! running inside a throwaway network namespace, so firewalld programs only that namespace.
//! The machine's own bus and firewall are never touched; both daemons are killed and the
//! tempdir removed at the end, also on failure (drop guards).
//!
//! Most tests run firewalld as the machine configures it (`/etc/firewalld`: its nftables
//! backend). The reload tests at the end give it a `firewalld.conf` of their own with
//! `FirewallBackend=iptables` (`--system-config`, a dir in the tempdir) and show what its
//! reload does to `portmap`'s and `firewall`'s reference iptables layouts
//! (firewalld/firewalld#779) and how `reconcile` and `reconcile --watch` put them back.

// An integration test crate is a test module of its own.
#![allow(clippy::tests_outside_test_module)]

#[cfg(test)]
mod real_firewalld {
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use anyhow::{Context, Result, bail, ensure};
    use serde_json::{Value, json};
    use tests::process::kill_and_reap;
    use tests::{PluginOutput, Runtime, TestNetns};

    /// Kills a daemon when dropped.
    struct Daemon(Child);

    impl Drop for Daemon {
        fn drop(&mut self) {
            kill_and_reap(&mut self.0);
        }
    }

    /// A private system bus and firewalld in `ns`. Field order is drop order: firewalld
    /// goes before its bus, the tempdir last.
    struct Firewalld {
        firewalld_daemon: Daemon,
        _bus: Daemon,
        address: String,
        /// firewalld's arguments after `--nofork --nopid` (its system config dir, if its own).
        args: Vec<String>,
        _dir: tempfile::TempDir,
    }

    /// The `firewalld.conf` of a firewalld with its iptables backend, as on a node with
    /// `FirewallBackend=iptables` (firewalld/firewalld#779); the other keys are Debian's
    /// defaults. Its zones are the stock ones (`/usr/lib/firewalld`): this system config dir
    /// holds nothing else.
    const IPTABLES_CONF: &str = "DefaultZone=public\n\
                                 FirewallBackend=iptables\n\
                                 FlushAllOnReload=yes\n\
                                 IndividualCalls=no\n";

    const BUS_CONF: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=SOCKET</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
  <includedir>/usr/share/dbus-1/system.d</includedir>
  <includedir>/etc/dbus-1/system.d</includedir>
</busconfig>
"#;

    fn dbus_send(ns: &TestNetns, address: &str, dest: &str, args: &[&str]) -> Result<String> {
        let mut all = vec![
            format!("--bus={address}"),
            "--print-reply".to_owned(),
            "--reply-timeout=5000".to_owned(),
            format!("--dest={dest}"),
        ];
        all.extend(args.iter().map(|s| (*s).to_owned()));
        ns.exec_ok("dbus-send", &all)
    }

    impl Firewalld {
        /// firewalld with the machine's configuration (`/etc/firewalld`: its nftables
        /// backend).
        fn start(ns: &TestNetns) -> Result<Firewalld> {
            let dir = tempfile::Builder::new().prefix("fw-dbus").tempdir()?;
            Firewalld::start_in(ns, dir, Vec::new())
        }

        /// firewalld with its iptables backend ([`IPTABLES_CONF`] in a system config dir of
        /// its own, `--system-config`).
        fn start_iptables(ns: &TestNetns) -> Result<Firewalld> {
            let dir = tempfile::Builder::new().prefix("fw-dbus").tempdir()?;
            let etc = dir.path().join("etc");
            std::fs::create_dir(&etc)?;
            std::fs::write(etc.join("firewalld.conf"), IPTABLES_CONF)?;
            let args = vec![
                "--system-config".to_owned(),
                etc.to_string_lossy().into_owned(),
            ];
            Firewalld::start_in(ns, dir, args)
        }

        /// The bus in `dir`, then firewalld with `args`.
        fn start_in(
            ns: &TestNetns,
            dir: tempfile::TempDir,
            args: Vec<String>,
        ) -> Result<Firewalld> {
            let socket: PathBuf = dir.path().join("bus");
            let conf = dir.path().join("bus.conf");
            std::fs::write(&conf, BUS_CONF.replace("SOCKET", &socket.to_string_lossy()))?;
            let bus = Daemon(
                ns.spawn(
                    Command::new("dbus-daemon")
                        .arg(format!("--config-file={}", conf.display()))
                        .args(["--nofork", "--nopidfile"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null()),
                )?,
            );
            let address = format!("unix:path={}", socket.display());
            let deadline = Instant::now() + Duration::from_secs(10);
            while !socket.exists() {
                ensure!(
                    Instant::now() < deadline,
                    "dbus-daemon did not create {socket:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let firewalld = Firewalld::spawn_daemon(ns, &address, &args)?;
            let daemons = Firewalld {
                firewalld_daemon: firewalld,
                _bus: bus,
                address,
                args,
                _dir: dir,
            };
            daemons.wait_ready(ns)?;
            Ok(daemons)
        }

        /// `firewalld` on the bus at `address`, with `args`.
        fn spawn_daemon(ns: &TestNetns, address: &str, args: &[String]) -> Result<Daemon> {
            Ok(Daemon(
                ns.spawn(
                    Command::new("firewalld")
                        .args(["--nofork", "--nopid"])
                        .args(args)
                        .env("DBUS_SYSTEM_BUS_ADDRESS", address)
                        .stdout(Stdio::null())
                        .stderr(Stdio::null()),
                )?,
            ))
        }

        /// Kills firewalld and starts another on the same bus.
        fn restart(&mut self, ns: &TestNetns) -> Result<()> {
            kill_and_reap(&mut self.firewalld_daemon.0);
            self.firewalld_daemon = Firewalld::spawn_daemon(ns, &self.address, &self.args)?;
            self.wait_ready(ns)
        }

        /// Waits until firewalld owns its name and its zone interface answers.
        fn wait_ready(&self, ns: &TestNetns) -> Result<()> {
            // firewalld takes its name only once its firewall is loaded.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let owned = dbus_send(
                    ns,
                    &self.address,
                    "org.freedesktop.DBus",
                    &[
                        "/org/freedesktop/DBus",
                        "org.freedesktop.DBus.NameHasOwner",
                        "string:org.fedoraproject.FirewallD1",
                    ],
                )?;
                if owned.contains("boolean true") {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("firewalld did not own org.fedoraproject.FirewallD1 within 60 s");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // The zone interface answers only once startup is complete.
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.sources(ns).is_err() {
                ensure!(
                    Instant::now() < deadline,
                    "firewalld zone API never answered"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        }

        /// `firewall-cmd --reload` against this firewalld's bus, as an operator runs it.
        fn reload(&self, ns: &TestNetns) -> Result<()> {
            let reload = ns.output(
                Command::new("firewall-cmd")
                    .arg("--reload")
                    .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address),
                b"",
                Duration::from_secs(60),
            )?;
            ensure!(
                reload.status.success(),
                "firewall-cmd --reload: {}",
                String::from_utf8_lossy(&reload.stderr)
            );
            Ok(())
        }

        /// `zone.getSources("trusted")`.
        fn sources(&self, ns: &TestNetns) -> Result<String> {
            dbus_send(
                ns,
                &self.address,
                "org.fedoraproject.FirewallD1",
                &[
                    "/org/fedoraproject/FirewallD1",
                    "org.fedoraproject.FirewallD1.zone.getSources",
                    "string:trusted",
                ],
            )
        }
    }

    fn conf(backend: &str, prev: bool) -> Value {
        let mut conf = json!({
            "cniVersion": "1.1.0", "name": "fwdnet", "type": "firewall", "backend": backend,
        });
        if prev {
            conf["prevResult"] = json!({
                "cniVersion": "1.1.0",
                "interfaces": [{ "name": "br0" }, { "name": "veth1", "sandbox": "/x" }],
                "ips": [
                    { "address": "10.68.0.2/24", "interface": 1 },
                    { "address": "fd68::2/64", "interface": 1 },
                ],
            });
        }
        conf
    }

    fn exec(
        rt: &Runtime,
        fw: &Firewalld,
        ns: &TestNetns,
        command: &str,
        conf: &Value,
    ) -> Result<PluginOutput> {
        exec_binary(rt, fw, ns, "firewall", command, conf)
    }

    /// [`exec`] of `plugin` (our `firewall`, or a path).
    fn exec_binary(
        rt: &Runtime,
        fw: &Firewalld,
        ns: &TestNetns,
        plugin: &str,
        command: &str,
        conf: &Value,
    ) -> Result<PluginOutput> {
        let netns = ns.path().to_string_lossy().into_owned();
        rt.exec_plugin(
            plugin,
            Some(command),
            &[
                ("CNI_CONTAINERID", "fwd-ctr"),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/usr/lib/cni"),
                ("CNI_NETNS_OVERRIDE", "1"),
                ("DBUS_SYSTEM_BUS_ADDRESS", &fw.address),
            ],
            conf.to_string().as_bytes(),
        )
    }

    /// A proxy in front of the bus socket at `upstream`, for one client: it forwards both ways
    /// until the client sends a message naming `method`; from then on nothing reaches the
    /// client. The call is made (firewalld applies it), its reply never arrives, and the client
    /// waits until it is killed.
    struct HoldingProxy {
        path: PathBuf,
        _dir: tempfile::TempDir,
    }

    impl HoldingProxy {
        fn start(upstream: PathBuf, method: &'static [u8]) -> Result<HoldingProxy> {
            use std::io::{Read, Write};
            use std::os::unix::net::{UnixListener, UnixStream};
            use std::sync::Arc;
            use std::sync::atomic::{AtomicBool, Ordering};
            let dir = tempfile::Builder::new().prefix("fw-hold").tempdir()?;
            let path = dir.path().join("bus");
            let listener = UnixListener::bind(&path)?;
            // Detached: it ends when the client's connection does (or with the test).
            std::thread::spawn(move || -> std::io::Result<()> {
                let (client, _) = listener.accept()?;
                let bus = UnixStream::connect(upstream)?;
                let held = Arc::new(AtomicBool::new(false));
                let (mut from_client, mut to_bus) = (client.try_clone()?, bus.try_clone()?);
                let seen = Arc::clone(&held);
                let forward = std::thread::spawn(move || -> std::io::Result<()> {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut tail: Vec<u8> = Vec::new();
                    loop {
                        let n = from_client.read(&mut buf)?;
                        if n == 0 {
                            return to_bus.shutdown(std::net::Shutdown::Both);
                        }
                        tail.extend_from_slice(&buf[..n]);
                        if tail.windows(method.len()).any(|w| w == method) {
                            // Before the call goes on: its reply cannot overtake this.
                            seen.store(true, Ordering::SeqCst);
                        }
                        let keep = tail.len().saturating_sub(method.len());
                        tail.drain(..keep);
                        to_bus.write_all(&buf[..n])?;
                    }
                });
                let (mut from_bus, mut to_client) = (bus, client);
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = from_bus.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    if !held.load(Ordering::SeqCst) {
                        to_client.write_all(&buf[..n])?;
                    }
                }
                let _ = forward.join();
                Ok(())
            });
            Ok(HoldingProxy { path, _dir: dir })
        }
    }

    /// firewalld's ADD records the attachment before it adds a source: an ADD killed once
    /// firewalld has the source (here: while waiting for the reply to `addSource`, which the
    /// proxy holds back) leaves a record, and the DEL a runtime sends then (no prevResult)
    /// removes the source.
    #[test]
    fn del_removes_the_source_of_an_add_killed_after_firewalld_added_it() -> Result<()> {
        let ns = TestNetns::new("fwdkill")?;
        let fw = Firewalld::start(&ns).context("starting a private firewalld")?;
        let rt = Runtime::new(&ns)?;
        let upstream = PathBuf::from(
            fw.address
                .strip_prefix("unix:path=")
                .context("a unix:path address")?,
        );
        let proxy = HoldingProxy::start(upstream, b"addSource")?;
        let netns = ns.path().to_string_lossy().into_owned();
        let mut cmd = Command::new(tests::bins::plugin_binary("firewall")?);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", "fwd-ctr")
            .env("CNI_NETNS", &netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env("CNI_NETNS_OVERRIDE", "1")
            .env(
                "DBUS_SYSTEM_BUS_ADDRESS",
                format!("unix:path={}", proxy.path.display()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = ns.spawn(&mut cmd)?;
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, conf("firewalld", true).to_string().as_bytes())?;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !fw.sources(&ns)?.contains("\"10.68.0.2/32\"") {
            if let Ok(Some(status)) = child.try_wait() {
                bail!("ADD ended before firewalld had the source: {status}");
            }
            ensure!(Instant::now() < deadline, "firewalld never got the source");
            std::thread::sleep(Duration::from_millis(20));
        }
        ensure!(
            child.try_wait()?.is_none(),
            "the ADD did not wait for its reply"
        );
        kill_and_reap(&mut child);
        ok(
            &exec(&rt, &fw, &ns, "DEL", &conf("firewalld", false))?,
            "DEL",
        )?;
        let sources = fw.sources(&ns)?;
        ensure!(
            !sources.contains("10.68.0.2"),
            "the source stayed: {sources}"
        );
        Ok(())
    }

    /// firewalld's announcements reach firewall's listener: `Reloaded` after
    /// `firewall-cmd --reload`, `Started` when a new firewalld takes the name, nothing before.
    #[test]
    fn a_reload_and_a_restart_of_firewalld_are_announced_to_a_listener() -> Result<()> {
        use firewall::backend::firewalld_signal::{FirewalldEvent, FirewalldSignals};
        let ns = TestNetns::new("fwdsig")?;
        let mut fw = Firewalld::start(&ns).context("starting a private firewalld")?;
        let mut signals = FirewalldSignals::at(&fw.address)?;
        let early = signals.wait(Duration::from_millis(200))?;
        ensure!(early.is_none(), "{early:?} before any reload");
        fw.reload(&ns)?;
        let got = signals.wait(Duration::from_secs(60))?;
        ensure!(got == Some(FirewalldEvent::Reloaded), "{got:?}");
        // Losing the name (the kill) is not announced; the new firewalld taking it is.
        fw.restart(&ns)?;
        let got = signals.wait(Duration::from_secs(60))?;
        ensure!(got == Some(FirewalldEvent::Started), "{got:?}");
        let late = signals.wait(Duration::from_millis(200))?;
        ensure!(late.is_none(), "{late:?} after the restart");
        Ok(())
    }

    fn ok(out: &PluginOutput, what: &str) -> Result<()> {
        ensure!(
            out.status.success(),
            "{what}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    #[test]
    fn add_check_del_gc_status_against_a_real_firewalld_in_a_namespace() -> Result<()> {
        let ns = TestNetns::new("fwd")?;
        let fw = Firewalld::start(&ns).context("starting a private firewalld")?;
        let rt = Runtime::new(&ns)?;
        for backend in ["firewalld", ""] {
            ok(
                &exec(&rt, &fw, &ns, "STATUS", &conf(backend, false))?,
                "STATUS",
            )?;
            ok(&exec(&rt, &fw, &ns, "ADD", &conf(backend, true))?, "ADD")?;
            let sources = fw.sources(&ns)?;
            ensure!(
                sources.contains("\"10.68.0.2/32\"") && sources.contains("\"fd68::2/128\""),
                "{sources}"
            );
            // A second ADD tolerates ZONE_ALREADY_SET.
            ok(
                &exec(&rt, &fw, &ns, "ADD", &conf(backend, true))?,
                "ADD again",
            )?;
            ok(
                &exec(&rt, &fw, &ns, "CHECK", &conf(backend, true))?,
                "CHECK",
            )?;
            // Auto-detection chose firewalld: no iptables chain was made.
            let filter = ns.exec_ok("iptables-save", &["-t", "filter"])?;
            ensure!(!filter.contains("CNI-FORWARD"), "{filter}");
            // DEL without prevResult finds the IPs in the attachment's state.
            ok(&exec(&rt, &fw, &ns, "DEL", &conf(backend, false))?, "DEL")?;
            let sources = fw.sources(&ns)?;
            ensure!(
                !sources.contains("10.68.0.2") && !sources.contains("fd68::2"),
                "{sources}"
            );
            let check = exec(&rt, &fw, &ns, "CHECK", &conf(backend, true))?;
            ensure!(!check.status.success(), "CHECK after DEL must fail");
            ok(
                &exec(&rt, &fw, &ns, "DEL", &conf(backend, true))?,
                "DEL again",
            )?;
        }
        // GC removes the sources of an attachment that is not valid any more.
        ok(
            &exec(&rt, &fw, &ns, "ADD", &conf("firewalld", true))?,
            "ADD",
        )?;
        let mut gc = conf("firewalld", false);
        gc["cni.dev/valid-attachments"] = json!([]);
        ok(&exec(&rt, &fw, &ns, "GC", &gc)?, "GC")?;
        let sources = fw.sources(&ns)?;
        ensure!(!sources.contains("10.68.0.2"), "{sources}");
        // A zone firewalld does not know: ours and the Go plugin fail with the same message.
        let mut unknown = conf("firewalld", true);
        unknown["firewalldZone"] = json!("nosuchzone");
        // Debian's Go plugin (v1.1.1) stops at 1.0.0.
        unknown["cniVersion"] = json!("1.0.0");
        unknown["prevResult"]["cniVersion"] = json!("1.0.0");
        let ours = exec(&rt, &fw, &ns, "ADD", &unknown)?
            .error()
            .context("our ADD into an unknown zone gave no error")?;
        let reference = tests::bins::reference_binary("firewall")?;
        let go = exec_binary(&rt, &fw, &ns, &reference.to_string_lossy(), "ADD", &unknown)?
            .error()
            .context("Go ADD into an unknown zone gave no error")?;
        ensure!(
            ours.msg == go.msg
                && ours
                    .msg
                    .starts_with("failed to add the address 10.68.0.2/32 to nosuchzone zone: "),
            "ours {ours:?}, Go {go:?}"
        );
        Ok(())
    }

    /// A reload of firewalld drops the zone's sources (its runtime configuration): CHECK
    /// fails; `firewall reconcile` puts them back (once: a second one finds nothing
    /// missing), CHECK passes again, and a later DEL removes them and the record.
    #[test]
    fn reconcile_puts_back_the_sources_a_reload_of_firewalld_dropped() -> Result<()> {
        let ns = TestNetns::new("fwdrec")?;
        let fw = Firewalld::start(&ns).context("starting a private firewalld")?;
        let rt = Runtime::new(&ns)?;
        let bus = [("DBUS_SYSTEM_BUS_ADDRESS", fw.address.as_str())];
        let reconcile = || -> Result<String> {
            let out = rt.operate("firewall", &["reconcile"], &bus)?;
            ok(&out, "reconcile")?;
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        ok(
            &exec(&rt, &fw, &ns, "ADD", &conf("firewalld", true))?,
            "ADD",
        )?;
        let quiet = reconcile()?;
        ensure!(
            quiet == "reconcile: nothing missing; 1 attachment(s) in place\n",
            "{quiet}"
        );
        dbus_send(
            &ns,
            &fw.address,
            "org.fedoraproject.FirewallD1",
            &[
                "/org/fedoraproject/FirewallD1",
                "org.fedoraproject.FirewallD1.reload",
            ],
        )?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while fw.sources(&ns).map_or(true, |s| s.contains("10.68.0.2")) {
            ensure!(Instant::now() < deadline, "the reload kept the sources");
            std::thread::sleep(Duration::from_millis(100));
        }
        let check = exec(&rt, &fw, &ns, "CHECK", &conf("firewalld", true))?;
        ensure!(!check.status.success(), "CHECK passed without the sources");
        let stdout = reconcile()?;
        ensure!(
            stdout.starts_with(
                "restored fwdnet/fwd-ctr/eth0 (firewalld): source 10.68.0.2/32 of zone trusted, \
                 source fd68::2/128 of zone trusted\n"
            ) && stdout.ends_with(
                "reconcile: 1 attachment(s) restored, 0 removed (namespace gone), 0 in place\n"
            ),
            "{stdout}"
        );
        let sources = fw.sources(&ns)?;
        ensure!(
            sources.contains("\"10.68.0.2/32\"") && sources.contains("\"fd68::2/128\""),
            "{sources}"
        );
        ok(
            &exec(&rt, &fw, &ns, "CHECK", &conf("firewalld", true))?,
            "CHECK",
        )?;
        let again = reconcile()?;
        ensure!(
            again == "reconcile: nothing missing; 1 attachment(s) in place\n",
            "{again}"
        );
        ok(
            &exec(&rt, &fw, &ns, "DEL", &conf("firewalld", false))?,
            "DEL",
        )?;
        let sources = fw.sources(&ns)?;
        ensure!(
            !sources.contains("10.68.0.2") && !sources.contains("fd68::2"),
            "{sources}"
        );
        let none = reconcile()?;
        ensure!(
            none == "reconcile: nothing missing; 0 attachment(s) in place\n",
            "{none}"
        );
        Ok(())
    }

    /// `firewall reconcile --watch` with the real firewalld: after `firewall-cmd --reload`
    /// (its `Reloaded` signal) and after a restart (its taking its bus name) the zone's
    /// sources come back by the watcher alone, each repair caused by firewalld's signal;
    /// CHECK passes; SIGTERM stops it with status 0.
    #[test]
    fn the_watcher_puts_back_the_sources_after_a_reload_and_a_restart_of_firewalld() -> Result<()> {
        use tests::watcher::Watcher;
        let ns = TestNetns::new("fwdwat")?;
        let mut fw = Firewalld::start(&ns).context("starting a private firewalld")?;
        let rt = Runtime::new(&ns)?;
        let address = fw.address.clone();
        let bus = [("DBUS_SYSTEM_BUS_ADDRESS", address.as_str())];
        ok(
            &exec(&rt, &fw, &ns, "ADD", &conf("firewalld", true))?,
            "ADD",
        )?;
        let mut watcher = Watcher::start(&rt, "firewall", &bus, Duration::from_secs(60))?;
        ensure!(
            watcher.log().contains("and firewalld's signals"),
            "{}",
            watcher.log()
        );
        let has_sources = |s: &str| s.contains("\"10.68.0.2/32\"") && s.contains("\"fd68::2/128\"");
        let wait_restored = |fw: &Firewalld, watcher: &mut Watcher, n: usize, cause: &str| {
            let repair = watcher.wait_for_reconcile(n, Duration::from_secs(60))?;
            ensure!(
                repair.starts_with(&format!("watch: reconciling ({cause}")),
                "reconcile {n} was not caused by {cause}:\n{}",
                watcher.log()
            );
            ensure!(
                repair.contains("restored fwdnet/fwd-ctr/eth0 (firewalld)"),
                "{}",
                watcher.log()
            );
            let sources = fw.sources(&ns)?;
            ensure!(has_sources(&sources), "{sources}");
            Ok(())
        };
        fw.reload(&ns)?;
        wait_restored(&fw, &mut watcher, 2, "firewalld reloaded")?;
        ok(
            &exec(&rt, &fw, &ns, "CHECK", &conf("firewalld", true))?,
            "CHECK after the reload",
        )?;
        fw.restart(&ns)?;
        wait_restored(&fw, &mut watcher, 3, "firewalld started")?;
        ok(
            &exec(&rt, &fw, &ns, "CHECK", &conf("firewalld", true))?,
            "CHECK after the restart",
        )?;
        let (status, log) = watcher.stop(Duration::from_secs(20))?;
        ensure!(status.success(), "{status}:\n{log}");
        ok(
            &exec(&rt, &fw, &ns, "DEL", &conf("firewalld", false))?,
            "DEL",
        )?;
        Ok(())
    }

    // firewalld with its iptables backend, reloaded (firewalld/firewalld#779).

    /// How long a connection that must succeed may take.
    const OPEN: Duration = Duration::from_secs(3);
    /// How long to wait before calling a flow blocked.
    const BLOCKED: Duration = Duration::from_millis(700);
    /// How long the watchers may take to repair before the test gives up (a bound on a hung
    /// test, not a measure).
    const REPAIRED: Duration = Duration::from_secs(10);
    /// How long a watcher may take to start (its first reconcile) and to stop.
    const START: Duration = Duration::from_secs(20);
    /// The attachment's name in the plugins' reconcile reports.
    const ATTACHMENT: &str = "fwdipnet/fwdip-a/eth0 (iptables)";

    /// `iptables-save` and `ip6tables-save` of `nat` and `filter` in `ns`, each line
    /// prefixed by its family and table, without counters, sorted (a reconcile may put rules
    /// back in another order than the ADD made them; not in another number).
    fn tables(ns: &TestNetns) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        for family in ["iptables", "ip6tables"] {
            for table in ["nat", "filter"] {
                let save = ns.exec_ok(&format!("{family}-save"), &["-t", table])?;
                lines.extend(
                    save.lines()
                        .filter(|l| !l.starts_with('#') && !l.starts_with('*') && *l != "COMMIT")
                        .map(|l| match l.find(" [") {
                            Some(i) if l.starts_with(':') => {
                                format!("{family} {table} {}", &l[..i])
                            }
                            _ => format!("{family} {table} {l}"),
                        }),
                );
            }
        }
        lines.sort();
        Ok(lines)
    }

    /// The lines of [`tables`] that name a chain of the CNI plugins'.
    fn ours(lines: &[String]) -> Vec<&String> {
        lines.iter().filter(|l| l.contains("CNI-")).collect()
    }

    /// `<plugin> reconcile` in `rt`'s host namespace: its stdout, after checking it succeeded.
    fn reconcile(rt: &Runtime, plugin: &str) -> Result<String> {
        let out = rt.operate(plugin, &["reconcile"], &[])?;
        ok(&out, &format!("{plugin} reconcile"))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Whether a reconcile's report says it restored the one attachment (and, before it, the
    /// plugin's shared objects, which the reload deleted too) and nothing else.
    fn restored_it(stdout: &str) -> bool {
        let mut lines: Vec<&str> = stdout.lines().collect();
        let summary = lines.pop();
        let (shared, attachment): (Vec<&str>, Vec<&str>) = lines
            .into_iter()
            .partition(|l| l.starts_with("restored shared objects ("));
        summary
            == Some("reconcile: 1 attachment(s) restored, 0 removed (namespace gone), 0 in place")
            && shared.len() == 1
            && attachment.len() == 1
            && attachment[0].starts_with(&format!("restored {ATTACHMENT}: "))
    }

    /// How the attachment's objects come back after the reload.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Repair {
        /// `portmap reconcile` and `firewall reconcile`, run once each by the test.
        OneShot,
        /// `portmap reconcile --watch` and `firewall reconcile --watch`, started before the
        /// reload, alone.
        Watchers,
    }

    /// Waits until `watcher` has finished its latest reconcile and started none for a second
    /// (firewalld's reload flushes twice, and announces itself after: each may start one):
    /// its log.
    fn settled(watcher: &mut tests::watcher::Watcher) -> Result<String> {
        loop {
            let n = watcher.reconciles();
            watcher.wait_for_reconcile(n, REPAIRED)?;
            std::thread::sleep(Duration::from_secs(1));
            if watcher.reconciles() == n {
                return Ok(watcher.log());
            }
        }
    }

    /// A real firewalld with `FirewallBackend=iptables` in the host namespace; Debian's Go
    /// `bridge` + `host-local`, then our `portmap` and `firewall`, both with the reference
    /// iptables layout (`iptables-nft`, the tools firewalld runs too), with traffic from the
    /// client through the mapping (host port 8080 to the container's 80) and from the
    /// container out through the firewall's accepts (firewalld's `FORWARD` ends in a REJECT
    /// and its zones do not forward the default zone's interfaces). `firewall-cmd --reload`;
    /// then `repair`; each plugin's CHECK, the traffic and the tables as after the ADD; a
    /// second reconcile of each changes nothing; DEL leaves only the shared chains.
    fn through_a_reload_of_firewalld_with_its_iptables_backend(repair: Repair) -> Result<()> {
        use std::net::SocketAddr;
        use tests::netns::{CLIENT_V4, HOST_UPLINK_V4};
        use tests::traffic::{TcpServer, answers};
        use tests::{NetworkConfigList, RuntimeConf, Topology, main_plugin};
        let topo = Topology::new(match repair {
            Repair::OneShot => "fwdipr",
            Repair::Watchers => "fwdipw",
        })?;
        let fw = Firewalld::start_iptables(&topo.host)
            .context("starting a private firewalld with its iptables backend")?;
        // The backend is iptables: firewalld's chains are in the iptables tables, and it
        // made no nftables table of its own.
        let before = tables(&topo.host)?;
        ensure!(
            before
                .iter()
                .any(|l| l == "iptables filter -A FORWARD -j FORWARD_direct"),
            "firewalld made no iptables chains: {before:#?}"
        );
        let nft_tables = topo.host.exec_ok("nft", &["list", "tables"])?;
        ensure!(!nft_tables.contains("firewalld"), "{nft_tables}");
        ensure!(ours(&before).is_empty(), "{before:#?}");
        let rt = Runtime::new(&topo.host)?.with_env("DBUS_SYSTEM_BUS_ADDRESS", &fw.address);
        let dir = tempfile::tempdir()?;
        let net = NetworkConfigList::new(
            "fwdipnet",
            "1.0.0",
            vec![
                main_plugin::bridge("fwdipbr0", &["10.79.0.0/24"], dir.path()),
                json!({ "type": "portmap", "backend": "iptables",
                        "capabilities": { "portMappings": true } }),
                json!({ "type": "firewall", "backend": "iptables" }),
            ],
        );
        let only = |plugin: &str| {
            let mut one = net.clone();
            one.plugins.retain(|p| p["type"] == plugin);
            one
        };
        let attach = RuntimeConf::new("fwdip-a", topo.container.path(), "eth0").with_capability(
            "portMappings",
            json!([{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }]),
        );
        let result = rt.add(&net, &attach)?;
        let ctr = SocketAddr::new(tests::result::ipv4(&result)?, 80);
        let _server = TcpServer::banner(&topo.container, ctr, "hello")?;
        let outside = SocketAddr::new(CLIENT_V4.parse()?, 8081);
        let _outside_server = TcpServer::banner(&topo.client, outside, "hello")?;
        let mapped = SocketAddr::new(HOST_UPLINK_V4.parse()?, 8080);
        let forwards = |wait| answers(&topo.client, mapped, b"hello", wait);
        let goes_out = |wait| answers(&topo.container, outside, b"hello", wait);
        ensure!(
            forwards(OPEN),
            "no forwarding through the mapping after ADD"
        );
        ensure!(
            goes_out(OPEN),
            "the container's traffic out is not forwarded after ADD"
        );
        let added = tables(&topo.host)?;
        let mut watchers = Vec::new();
        if repair == Repair::Watchers {
            for plugin in ["portmap", "firewall"] {
                let mut watcher = tests::watcher::Watcher::start(&rt, plugin, &[], START)?;
                let first = watcher.wait_for_reconcile(1, START)?;
                ensure!(
                    first.contains("nothing missing; 1 attachment(s) in place"),
                    "{plugin}: {first}"
                );
                watchers.push((plugin, watcher));
            }
            let log = watchers[1].1.log();
            ensure!(log.contains("and firewalld's signals"), "{log}");
        }

        fw.reload(&topo.host)?;

        match repair {
            Repair::OneShot => {
                // What the reload did: firewalld flushed and deleted every chain of every
                // table and made its own again; nothing of ours is left.
                let reloaded = tables(&topo.host)?;
                ensure!(
                    reloaded == before,
                    "after the reload: {reloaded:#?}\nbefore the ADD: {before:#?}"
                );
                ensure!(
                    !forwards(BLOCKED),
                    "the mapping still forwards after the reload"
                );
                ensure!(
                    !goes_out(BLOCKED),
                    "the container still gets out after the reload"
                );
                ensure!(
                    rt.check(&only("portmap"), &attach).is_err(),
                    "portmap's CHECK passed after the reload"
                );
                ensure!(
                    rt.check(&only("firewall"), &attach).is_err(),
                    "firewall's CHECK passed after the reload"
                );
                for plugin in ["portmap", "firewall"] {
                    let stdout = reconcile(&rt, plugin)?;
                    eprintln!("{plugin} reconcile after the reload:\n{stdout}");
                    ensure!(restored_it(&stdout), "{plugin}: {stdout}");
                }
            }
            Repair::Watchers => {
                let deadline = Instant::now() + REPAIRED;
                while !(forwards(BLOCKED) && goes_out(BLOCKED)) {
                    ensure!(
                        Instant::now() < deadline,
                        "not repaired within {REPAIRED:?}; the watchers' logs:\n{}\n{}",
                        watchers[0].1.log(),
                        watchers[1].1.log()
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                for (plugin, watcher) in &mut watchers {
                    let log = settled(watcher)?;
                    eprintln!("{plugin}'s watcher:\n{log}");
                    // A repair (not the start) restored the attachment.
                    let after_start = log
                        .match_indices(tests::watcher::RECONCILING)
                        .nth(1)
                        .map(|(i, _)| &log[i..])
                        .with_context(|| {
                            format!("{plugin}: no reconcile after the start:\n{log}")
                        })?;
                    ensure!(
                        after_start.contains(&format!("restored {ATTACHMENT}: ")),
                        "{plugin}:\n{log}"
                    );
                    // Each was caused by firewalld's flush, which it commits with
                    // `iptables-restore` (its `comm`, cut to 15 bytes, as the kernel gives it),
                    // twice in a reload (in `reload` and again before it applies its rules:
                    // one repair or two, as the debounce groups them); firewall's also by the
                    // `Reloaded` signal, after which nothing is missing.
                    let causes: Vec<&str> = log
                        .lines()
                        .filter_map(|l| l.strip_prefix(tests::watcher::RECONCILING))
                        .skip(1)
                        .collect();
                    ensure!(
                        causes.iter().all(|c| {
                            c.contains(" deleted by iptables-restor (pid ")
                                || (*plugin == "firewall" && *c == "firewalld reloaded)")
                        }),
                        "{plugin}: a reconcile not caused by firewalld's reload:\n{log}"
                    );
                }
            }
        }

        ensure!(
            forwards(OPEN),
            "no forwarding through the mapping after the repair"
        );
        ensure!(
            goes_out(OPEN),
            "the container does not get out after the repair"
        );
        rt.check(&net, &attach)?;
        let repaired = tables(&topo.host)?;
        ensure!(
            repaired == added,
            "after the repair: {repaired:#?}\nafter the ADD: {added:#?}"
        );
        for plugin in ["portmap", "firewall"] {
            let again = reconcile(&rt, plugin)?;
            ensure!(
                again == "reconcile: nothing missing; 1 attachment(s) in place\n",
                "{plugin}, again: {again}"
            );
        }
        ensure!(tables(&topo.host)? == added, "a second reconcile wrote");
        for (plugin, watcher) in watchers {
            let (status, log) = watcher.stop(START)?;
            ensure!(status.success(), "{plugin}'s watcher: {status}:\n{log}");
        }

        rt.del(&net, &attach)?;
        ensure!(!forwards(BLOCKED), "the mapping forwards after DEL");
        ensure!(
            tests::firewall_state::records(&topo.host)?.is_empty(),
            "firewall records after DEL"
        );
        ensure!(
            !tests::portmap_state::dir(&topo.host)?.exists(),
            "portmap records after DEL: {:?}",
            tests::portmap_state::records(&topo.host)?
        );
        // firewalld's own rules are as before the ADD; what else is left is the shared
        // chains both plugins keep (as the Go plugins do), and nothing of the attachment.
        let left = tables(&topo.host)?;
        let shared = [
            "CNI-HOSTPORT-SETMARK",
            "CNI-HOSTPORT-MASQ",
            "CNI-HOSTPORT-DNAT",
            "CNI-FORWARD",
            "CNI-ADMIN",
        ];
        let extra: Vec<&String> = left
            .iter()
            .filter(|l| !before.contains(l))
            .filter(|l| {
                !shared.iter().any(|c| l.contains(c))
                    || l.contains(&ctr.ip().to_string())
                    || l.contains("CNI-DN-")
                    || l.contains("fwdipnet")
            })
            .collect();
        let gone: Vec<&String> = before.iter().filter(|l| !left.contains(l)).collect();
        ensure!(
            extra.is_empty() && gone.is_empty(),
            "DEL left {extra:#?}, took firewalld's {gone:#?}"
        );
        Ok(())
    }

    /// `firewall-cmd --reload` of firewalld with its iptables backend flushes and deletes
    /// every chain of `nat` and `filter`: the mapping and the accepts go (CHECK fails); one
    /// `portmap reconcile` and one `firewall reconcile` bring them back.
    #[test]
    fn reconcile_brings_back_the_mapping_and_accepts_a_reload_of_firewalld_s_iptables_backend_flushed()
    -> Result<()> {
        through_a_reload_of_firewalld_with_its_iptables_backend(Repair::OneShot)
    }

    /// The same reload with `portmap reconcile --watch` and `firewall reconcile --watch`
    /// running: forwarding and the accepts come back by the watchers alone.
    #[test]
    fn the_watchers_bring_back_the_mapping_and_accepts_after_a_reload_of_firewalld_s_iptables_backend()
    -> Result<()> {
        through_a_reload_of_firewalld_with_its_iptables_backend(Repair::Watchers)
    }
}
