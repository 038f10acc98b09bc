//! What the Go plugin made for an attachment, removed by our DEL so that a node can switch
//! implementations while containers run: its nftables rules in `ip`/`ip6 cni_hostport`
//! (commented with the container ID) and its iptables chain `CNI-DN-<hash>` (the name our
//! iptables layout uses too).
//!
//! Both are looked up without exec: the nftables rules over the call's socket; the chain in
//! the nf_tables tables `iptables-nft` keeps `nat` in, and with `iptables-save` only where the
//! legacy `nat` table is loaded.

use netfilter::nft::{Batch, LazyNft, Nft, NftError, Table};

use crate::backend::iptables;
use crate::config::IpFamily;
use crate::error::PortmapError;
use crate::names;
use crate::node;
use cni::Attachment;

/// Removes the Go plugin's objects of `att`; with `iptables_done`, the chain was already torn
/// down by our iptables backend. Returns what failed.
pub fn remove(nft: &mut LazyNft, att: &Attachment, iptables_done: bool) -> Vec<PortmapError> {
    let mut errors = Vec::new();
    if !iptables_done {
        let chain = names::dnat_chain(&att.network, &att.container_id);
        let families: Vec<IpFamily> = IpFamily::BOTH
            .into_iter()
            .filter(|f| {
                nft.get()
                    .map_or(true, |n| iptables_chain_may_exist(n, *f, &chain))
            })
            .collect();
        if !families.is_empty()
            && let Err(e) = iptables::remove(nft, &att.network, &att.container_id, &families, None)
        {
            errors.push(e);
        }
    }
    match nft.get().and_then(|n| del_nft_rules(n, &att.container_id)) {
        Ok(()) => {}
        // No nf_tables, or one that refuses us: the Go plugin could not have made rules there.
        Err(e) if e.is_unsupported() => {
            log::debug!("nftables not usable for the Go plugin's rules: {e}");
        }
        Err(e) => errors.push(PortmapError::Nft(e)),
    }
    errors
}

/// Whether the iptables chain `chain` may exist in `family`, found without exec:
/// `iptables-nft` keeps its `nat` table in nf_tables; the legacy tools leave `nat` in
/// `/proc/net/ip*_tables_names` (then only the dump can tell, so say yes).
pub fn iptables_chain_may_exist(nft: &mut Nft, family: IpFamily, chain: &str) -> bool {
    let table = netfilter::iptables::native::nft_table(family.into(), names::IPT_NAT);
    nft.chain_exists(&table, chain).unwrap_or(false) || node::legacy_nat_loaded(family)
}

/// Removes the Go plugin's nftables rules of this container (comment == container ID) from
/// `cni_hostport`, in both families, when that table exists.
fn del_nft_rules(nft: &mut Nft, container_id: &str) -> Result<(), NftError> {
    let mut batch = Batch::new();
    for family in IpFamily::BOTH {
        let t = Table::new(family.into(), names::GO_NFT_TABLE);
        if !nft.table_exists(&t)? {
            continue;
        }
        for chain in names::GO_NFT_CHAINS {
            let rules = match nft.rules(&t, chain) {
                Ok(r) => r,
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            for r in rules
                .iter()
                .filter(|r| r.comment.as_deref() == Some(container_id))
            {
                batch.delete_rule(&t, chain, r.handle);
            }
        }
    }
    nft.apply(&batch)
}
