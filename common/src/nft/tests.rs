//! Kernel tests (each in a fresh network namespace) and golden-byte tests.

use std::net::Ipv4Addr;
use std::process::Command;

use super::DataType as T;
use super::Selector::*;
use super::*;

/// Runs `body` on a thread in a fresh network namespace of its own.
fn in_fresh_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET) needs root");
            body()
        })
        .join()
        .unwrap()
    })
}

/// `nft ARGS` in the calling thread's namespace (children inherit the thread's netns).
fn nft(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn v4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn scratch() {
    in_fresh_netns(|| {
        let t = Table::new(Family::Ip, "t");
        let mut nl = Nft::new().unwrap();
        let mut b = Batch::new();
        b.add_table(&t)
            .add_set(
                &t,
                &Set::map(
                    "hostip_ports",
                    &[T::Ipv4Addr, T::InetProto, T::InetService],
                    &[T::Ipv4Addr, T::InetService],
                ),
            )
            .add_set(
                &t,
                &Set::map(
                    "ports",
                    &[T::InetProto, T::InetService],
                    &[T::Ipv4Addr, T::InetService],
                ),
            )
            .add_set(&t, &Set::new("allowed", &[T::Ipv4Addr]))
            .add_set(&t, &Set::verdict_map("vm", &[T::InetProto]))
            .add_chain(&t, &Chain::regular("c"))
            .add_chain(
                &t,
                &Chain::base(
                    "pre",
                    ChainType::Nat,
                    ChainHook::Prerouting,
                    priority::DSTNAT,
                ),
            )
            .add_rule(
                &t,
                "pre",
                &Rule::new().fib_daddr_local().jump("c").comment("enter"),
            )
            .add_rule(
                &t,
                "c",
                &Rule::new().dnat_map(
                    NfProto::Ipv4,
                    &[IpDaddr, MetaL4proto, ThDport],
                    "hostip_ports",
                ),
            )
            .add_rule(
                &t,
                "c",
                &Rule::new()
                    .ct_state(CtStateFlags::ESTABLISHED | CtStateFlags::RELATED)
                    .counter()
                    .accept(),
            )
            .add_elements(
                &t,
                "ports",
                &[
                    Element::new([super::L4Proto::Tcp.into(), Value::Port(8080)])
                        .to([v4("10.0.0.2").into(), Value::Port(80)])
                        .comment("net/ctr/eth0"),
                ],
            )
            .add_elements(&t, "allowed", &[Element::new([v4("10.1.2.3").into()])])
            .add_elements(
                &t,
                "vm",
                &[
                    Element::new([super::L4Proto::Udp.into()])
                        .to_verdict(Verdict::Jump("c".into())),
                ],
            );
        nl.apply(&b).unwrap();
        println!("{}", nft(&["list", "ruleset"]));
        println!("{:?}", nl.rules(&t, "c").unwrap());
        println!("{:?}", nl.elements(&t, "ports").unwrap());
        println!(
            "{:?}",
            nl.element(
                &t,
                "ports",
                &[super::L4Proto::Tcp.into(), Value::Port(8080)]
            )
            .unwrap()
        );
        nl.apply(&b).unwrap();
        let mut b2 = Batch::new();
        b2.add_rule(&t, "c", &Rule::new().accept())
            .add_rule(&t, "nope", &Rule::new().accept());
        println!("{}", nl.apply(&b2).unwrap_err());
    });
}
