//! Recovery fills an index from the checkpoint and the journal: each key
//! at its recorded location, checked (inside the namespace, no block
//! shared), in the table, the eviction order and the key order.

use super::order::order;
use super::table::key_at;
use super::{Entry, KvIndex, State};
use kvt_meta::journal::KvLoc;
use kvt_wire::nvme::KvKey;
use std::sync::atomic::Ordering;

impl KvIndex {
    /// Recovery: `key`'s value is at `loc`. Locations overlapping another
    /// key's or past the end are refused (`check` reports them).
    /// Ages of restored keys count from the index's base (the first `now`
    /// after the restart): no clock is read here, so recovery never sets the
    /// base from a clock other than the callers'.
    pub fn restore(&self, key: KvKey, loc: KvLoc) -> Result<(), String> {
        self.with_state(move |ix, st| {
            let slot = ix.restore_entry(st, key, loc)?;
            st.order_insert(slot);
            Ok(())
        })
    }

    /// `restore` of every key of `keys`, in one hold of the home lock (recovery, before any owner). Keys in
    /// ascending order (a B-tree's, as recovery has them) join the key order
    /// at its end in constant time instead of a split and a merge from the
    /// root each: those were a quarter of a recovery of 10^6 keys.
    pub fn restore_all<'a>(
        &self,
        keys: impl IntoIterator<Item = (&'a KvKey, &'a KvLoc)>,
    ) -> Result<(), String> {
        let mut home = self.home();
        // Recovery fills the index before any reactor serves it.
        assert!(
            self.owner.get().is_none() || self.owner_gone.load(Ordering::Acquire),
            "restore into an index a reactor owns"
        );
        let Some(st) = home.as_deref_mut() else {
            return Err("the key index is held by a reactor".into());
        };
        let mut spine = st.right_spine();
        for (key, loc) in keys {
            let slot = self.restore_entry(st, *key, *loc)?;
            let after_all = match spine.last() {
                Some(&last) => order(&st.node(last).key, key).is_lt(),
                None => true,
            };
            if after_all {
                st.order_append(slot, &mut spine);
            } else {
                st.order_insert(slot);
                spine = st.right_spine();
            }
        }
        self.publish(st);
        Ok(())
    }

    /// A restored key's entry, checked and in the map and the age list; the
    /// caller puts it in the key order.
    fn restore_entry(&self, st: &mut State, key: KvKey, loc: KvLoc) -> Result<u32, String> {
        // Saturating and checked: `loc` comes from the disk (validation).
        if loc.block.saturating_add(loc.nblocks as u64) > st.blocks.total
            || loc.len > loc.nblocks.saturating_mul(self.block_size)
        {
            return Err(format!(
                "key {key:?} at block {} ({} blocks, {} bytes) is outside the namespace",
                loc.block, loc.nblocks, loc.len
            ));
        }
        if (loc.block..loc.block + loc.nblocks as u64).any(|b| st.blocks.is_used(b)) {
            return Err(format!(
                "key {key:?} at block {} overlaps another key's value",
                loc.block
            ));
        }
        let slot = st.entries.len() as u32;
        // Recovery does not know the Stores' order: the restore order stands in.
        let pos = st.stored_blocks + loc.nblocks as u64;
        st.entries.push(Some(Entry::new(key, loc, 0, pos)));
        // One hash of the key, not a lookup and then an insert: hashing was
        // a quarter of a recovery of 10^6 keys.
        let entries = &st.entries;
        if st
            .map
            .insert_new(&key, slot, |s| key_at(entries, s))
            .is_err()
        {
            st.entries.pop();
            return Err(format!("key {key:?} is recorded twice"));
        }
        st.stored_blocks = pos;
        st.blocks.set(loc.block, loc.nblocks, true);
        st.age_push(slot);
        st.value_bytes += loc.len as u64;
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::super::order::order;
    use super::super::testing::*;
    use super::super::*;
    use proptest::prelude::*;
    use std::time::Instant;

    #[test]
    fn restore_refuses_damaged_locations_without_overflow() {
        let ix = KvIndex::new(1 << 20, 4096);
        let k = key(1);
        let far = KvLoc {
            block: u64::MAX - 1,
            nblocks: 4,
            len: 1,
        };
        assert!(ix.restore(k, far).is_err());
        let long = KvLoc {
            block: 0,
            nblocks: 1,
            len: 8192,
        };
        assert!(ix.restore(k, long).is_err());
        assert!(ix.verify().is_empty());
    }

    proptest! {
        /// Recovery's bulk restore builds the same key order from keys in
        /// ascending order (appended along the right spine), in any order,
        /// or ascending after a first key restored alone: every key once,
        /// in order, heap intact; a key twice or on used blocks refused.
        #[test]
        fn restore_all_builds_the_key_order_from_any_order(
            mut keys in proptest::collection::btree_set(
                proptest::collection::vec(0u8..4, 1..=4), 1..300,
            ).prop_map(|s| s.into_iter().collect::<Vec<Vec<u8>>>()),
            shuffle in any::<u64>(),
            how in 0u8..3,
        ) {
            let now = Instant::now();
            let ix = KvIndex::new(512 << 20, 512);
            let loc_of = |i: usize| KvLoc { block: i as u64 * 2, nblocks: 2, len: 600 };
            let kv = |k: &[u8]| KvKey::new(k).unwrap_or_default();
            if how == 1 {
                let mut r = shuffle | 1;
                for i in (1..keys.len()).rev() {
                    r ^= r << 13; r ^= r >> 7; r ^= r << 17;
                    keys.swap(i, (r % (i as u64 + 1)) as usize);
                }
            }
            let list: Vec<(KvKey, KvLoc)> =
                keys.iter().enumerate().map(|(i, k)| (kv(k), loc_of(i))).collect();
            let mut rest = &list[..];
            if how == 2 {
                let (k, l) = list[list.len() - 1];
                prop_assert_eq!(ix.restore(k, l), Ok(()));
                rest = &list[..list.len() - 1];
            }
            prop_assert_eq!(ix.restore_all(rest.iter().map(|(k, l)| (k, l))), Ok(()));
            prop_assert!(ix.verify().is_empty(), "{:?}", ix.verify());
            let mut want: Vec<KvKey> = list.iter().map(|(k, _)| *k).collect();
            want.sort_by(order);
            prop_assert_eq!(ix.list(&KvKey::default(), usize::MAX, now), want);
            let (k, l) = list[0];
            let elsewhere = KvLoc { block: l.block + 10_000, ..l };
            let twice = ix.restore_all([(&k, &elsewhere)]);
            prop_assert!(twice.is_err());
            let other = KvKey::new(b"not restored").unwrap_or_default();
            prop_assert!(ix.restore_all([(&other, &l)]).is_err());
        }
    }
}
