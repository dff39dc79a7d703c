//! The KV index's key table: each key to the slot of its entry. The table
//! holds only the 4-byte slot numbers; the keys live in the entries, which
//! the caller reads through `key_of`. A map of key to slot kept every key
//! twice: 24 bytes a bucket instead of 4, about 30 bytes of RAM per key at
//! 10^7 keys, and a recovery's random writes spread over six times the memory.
//!
//! Every slot in the table must name an entry holding that key while it is
//! there: lookups compare with it and growing the table hashes it again.

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use kvt_wire::nvme::KvKey;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

pub(super) struct KeySlots {
    table: HashTable<u32>,
    /// SipHash keyed per process: hosts choose the keys.
    hasher: RandomState,
}

impl KeySlots {
    pub(super) fn with_capacity(n: usize) -> KeySlots {
        KeySlots {
            table: HashTable::with_capacity(n),
            hasher: RandomState::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Every slot in the table, in no order.
    pub(super) fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.table.iter().copied()
    }

    /// The slot of `key`'s entry.
    pub(super) fn get(&self, key: &KvKey, key_of: impl Fn(u32) -> KvKey) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        self.table.find(hash, |&s| key_of(s) == *key).copied()
    }

    /// Points `key` at `slot` (whose entry holds `key`); the slot it named
    /// before, if any.
    pub(super) fn insert(
        &mut self,
        key: &KvKey,
        slot: u32,
        key_of: impl Fn(u32) -> KvKey,
    ) -> Option<u32> {
        let hasher = &self.hasher;
        let hash = hasher.hash_one(key);
        let found = self.table.entry(
            hash,
            |&s| key_of(s) == *key,
            |&s| hasher.hash_one(key_of(s)),
        );
        match found {
            Entry::Occupied(mut o) => Some(std::mem::replace(o.get_mut(), slot)),
            Entry::Vacant(v) => {
                v.insert(slot);
                None
            }
        }
    }

    /// Points `key`, not in the table, at `slot` (whose entry holds it); if
    /// `key` is there already, changes nothing and gives the slot it names.
    pub(super) fn insert_new(
        &mut self,
        key: &KvKey,
        slot: u32,
        key_of: impl Fn(u32) -> KvKey,
    ) -> Result<(), u32> {
        let hasher = &self.hasher;
        let hash = hasher.hash_one(key);
        let found = self.table.entry(
            hash,
            |&s| key_of(s) == *key,
            |&s| hasher.hash_one(key_of(s)),
        );
        match found {
            Entry::Occupied(o) => Err(*o.get()),
            Entry::Vacant(v) => {
                v.insert(slot);
                Ok(())
            }
        }
    }

    /// Takes `key` out; the slot it named.
    pub(super) fn remove(&mut self, key: &KvKey, key_of: impl Fn(u32) -> KvKey) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        match self.table.find_entry(hash, |&s| key_of(s) == *key) {
            Ok(o) => Some(o.remove().0),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn key(n: u32) -> KvKey {
        KvKey::new(&n.to_be_bytes()).unwrap()
    }

    proptest! {
        /// Inserts, replacements, inserts of new keys only, and removals
        /// answer as a map of key to slot does, through growth from a small
        /// table.
        #[test]
        fn key_slots_answer_as_a_map(ops in proptest::collection::vec((0u32..64, any::<bool>()), 1..400)) {
            let mut t = KeySlots::with_capacity(2);
            let mut model: HashMap<KvKey, u32> = HashMap::new();
            // The entries: slot -> key, a new slot for every insert.
            let mut entries: Vec<KvKey> = Vec::new();
            for (k, insert) in ops {
                let k = key(k);
                if insert {
                    entries.push(k);
                    let slot = (entries.len() - 1) as u32;
                    if slot % 3 == 0 {
                        let had = model.get(&k).copied();
                        prop_assert_eq!(t.insert_new(&k, slot, |s| entries[s as usize]), had.map_or(Ok(()), Err));
                        model.entry(k).or_insert(slot);
                    } else {
                        let before = t.insert(&k, slot, |s| entries[s as usize]);
                        prop_assert_eq!(before, model.insert(k, slot));
                    }
                } else {
                    prop_assert_eq!(t.remove(&k, |s| entries[s as usize]), model.remove(&k));
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert_eq!(t.get(&k, |s| entries[s as usize]), model.get(&k).copied());
            }
            for (k, &slot) in &model {
                prop_assert_eq!(t.get(k, |s| entries[s as usize]), Some(slot));
            }
        }
    }
}
