//! The key table: each live key to the slot of its entry (`KeySlots`, a
//! hash table of slot numbers), the entries, and the slots free for reuse.
//! A key leaves the table when it is given up (Delete, eviction, overwrite,
//! TTL); its entry stays while a Retrieve still reads its blocks.

use super::{Entry, KvIndex, State};
use kvt_meta::journal::KvLoc;
use kvt_wire::nvme::KvKey;

/// The key of the entry in `slot`, which the key table names.
pub(super) fn key_at(entries: &[Option<Entry>], slot: u32) -> KvKey {
    match entries.get(slot as usize).and_then(|e| e.as_ref()) {
        Some(e) => e.key,
        None => panic!("key table names empty slot {slot}"),
    }
}

impl State {
    /// The slot of live `key`'s entry.
    pub(super) fn slot_of(&self, key: &KvKey) -> Option<u32> {
        self.map.get(key, |s| key_at(&self.entries, s))
    }

    /// Indexes `key` at `slot`, whose entry holds it; the slot it had.
    pub(super) fn index_key(&mut self, key: &KvKey, slot: u32) -> Option<u32> {
        let entries = &self.entries;
        self.map.insert(key, slot, |s| key_at(entries, s))
    }

    /// Takes `key` out of the key table (before its entry goes).
    fn unindex_key(&mut self, key: &KvKey) -> Option<u32> {
        let entries = &self.entries;
        self.map.remove(key, |s| key_at(entries, s))
    }

    pub(super) fn node(&self, slot: u32) -> &Entry {
        match self.entries.get(slot as usize).and_then(|e| e.as_ref()) {
            Some(e) => e,
            None => panic!("key order names empty slot {slot}"),
        }
    }

    pub(super) fn node_mut(&mut self, slot: u32) -> &mut Entry {
        match self.entries.get_mut(slot as usize).and_then(|e| e.as_mut()) {
            Some(e) => e,
            None => panic!("key order names empty slot {slot}"),
        }
    }
}

impl KvIndex {
    /// Every key and its location, changing nothing.
    pub fn locations(&self) -> Vec<(KvKey, KvLoc)> {
        self.with_state(|_, st| Self::all_locations(st))
    }

    fn all_locations(st: &State) -> Vec<(KvKey, KvLoc)> {
        st.map
            .slots()
            .map(|s| {
                let e = st.node(s);
                (e.key, e.loc)
            })
            .collect()
    }

    /// `slot` stops being its key's value; its blocks wait for the next
    /// commit (or for its readers, then the commit).
    pub(super) fn give_up(&self, st: &mut State, slot: u32) {
        let Some(e) = st.entries.get_mut(slot as usize).and_then(|e| e.as_mut()) else {
            return;
        };
        e.live = false;
        let (key, loc, readers) = (e.key, e.loc, e.readers);
        st.unindex_key(&key);
        st.root = st.order_remove(st.root, &key);
        st.age_unlink(slot);
        // value_bytes sums the live keys' lengths, this one's included.
        assert!(
            st.value_bytes >= loc.len as u64,
            "value bytes below a live key's"
        );
        st.value_bytes -= loc.len as u64;
        st.dirty.insert(key);
        if readers == 0 {
            Self::pend(st, loc);
            st.entries[slot as usize] = None;
            st.free_slots.push(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use std::time::Instant;

    /// A key given up while a Retrieve reads it leaves the table at once (a
    /// miss for every other command) but keeps its entry, and so its blocks,
    /// until the read ends; then its slot goes to the next new key.
    #[test]
    fn a_given_up_key_keeps_its_entry_until_its_readers_end() {
        let now = Instant::now();
        let ix = KvIndex::new(64 * 4096, 4096);
        let (a, b) = (key(1), key(2));
        assert!(store(&ix, &a, 4096, now).is_ok());
        let (pin, loc) = ix.begin_read(&a, now).unwrap();
        assert_eq!(ix.delete(&a, now), Ok(()));
        assert_eq!(ix.begin_read(&a, now), Err(Status::KV_KEY_DOES_NOT_EXIST));
        assert!(ix.locations().is_empty());
        let held = move |ix: &KvIndex| {
            ix.with_state(move |_, st| {
                let e = st.entries.get(pin as usize).and_then(|e| e.as_ref());
                (e.map(|e| (e.live, e.loc)), st.free_slots.clone())
            })
        };
        assert_eq!(held(&ix), (Some((false, loc)), vec![]));
        ix.end_read(pin);
        assert_eq!(held(&ix), (None, vec![pin]));
        assert!(store(&ix, &b, 4096, now).is_ok());
        assert_eq!(ix.with_state(move |_, st| st.slot_of(&b)), Some(pin));
        assert!(ix.verify().is_empty());
    }
}
