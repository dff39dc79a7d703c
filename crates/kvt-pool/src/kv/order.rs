//! The live keys in byte order, for List: a treap threaded through the
//! entries (`Entry::left`, `right`, `prio`: a search tree by key, a heap by
//! random priority, so its depth stays logarithmic in expectation). Keeping
//! it allocates nothing, and List walks from its start key instead of
//! sorting a copy of every key.

use super::ttl::expired;
use super::{KvIndex, State, NIL};
use kvt_wire::nvme::KvKey;
use std::time::Instant;

impl State {
    /// Splits subtree `t` into the keys before `key` and the rest.
    fn order_split(&mut self, t: u32, key: &KvKey) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        let n = self.node(t);
        if order(&n.key, key) == std::cmp::Ordering::Less {
            let (l, r) = self.order_split(n.right, key);
            self.node_mut(t).right = l;
            (t, r)
        } else {
            let (l, r) = self.order_split(n.left, key);
            self.node_mut(t).left = r;
            (l, t)
        }
    }

    /// Joins subtrees `a` and `b`, every key of `a` before every key of `b`.
    fn order_merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.node(a).prio > self.node(b).prio {
            let r = self.order_merge(self.node(a).right, b);
            self.node_mut(a).right = r;
            a
        } else {
            let l = self.order_merge(a, self.node(b).left);
            self.node_mut(b).left = l;
            b
        }
    }

    fn next_prio(&mut self) -> u32 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 32) as u32
    }

    /// The slots from the root down its right children: where a key after
    /// every other joins (`order_append`).
    pub(super) fn right_spine(&self) -> Vec<u32> {
        let mut spine = Vec::new();
        let mut t = self.root;
        while t != NIL {
            spine.push(t);
            t = self.node(t).right;
        }
        spine
    }

    /// Adds `slot`'s key, which comes after every key in the order, given
    /// the order's right spine (kept up to date): the nodes of lower
    /// priority at the spine's end become its left subtree. Amortized
    /// constant time: each node leaves the spine once.
    pub(super) fn order_append(&mut self, slot: u32, spine: &mut Vec<u32>) {
        let prio = self.next_prio();
        let mut left = NIL;
        while let Some(&top) = spine.last() {
            if self.node(top).prio > prio {
                break;
            }
            left = top;
            spine.pop();
        }
        let n = self.node_mut(slot);
        (n.left, n.right, n.prio) = (left, NIL, prio);
        match spine.last() {
            Some(&top) => self.node_mut(top).right = slot,
            None => self.root = slot,
        }
        spine.push(slot);
    }

    /// Adds `slot`'s key (not in the order yet).
    pub(super) fn order_insert(&mut self, slot: u32) {
        let prio = self.next_prio();
        let n = self.node_mut(slot);
        (n.left, n.right, n.prio) = (NIL, NIL, prio);
        let key = n.key;
        let (l, r) = self.order_split(self.root, &key);
        let l = self.order_merge(l, slot);
        self.root = self.order_merge(l, r);
    }

    /// Whether the order holds exactly the map's keys, ascending.
    pub(super) fn order_check(&self) -> Option<String> {
        let (mut path, mut t) = (Vec::new(), self.root);
        let (mut count, mut last): (usize, Option<KvKey>) = (0, None);
        loop {
            while t != NIL && count <= self.map.len() {
                path.push(t);
                t = self.node(t).left;
            }
            let Some(x) = path.pop() else { break };
            let n = self.node(x);
            if last.is_some_and(|l| order(&l, &n.key) != std::cmp::Ordering::Less)
                || self.slot_of(&n.key) != Some(x)
            {
                return Some(format!("key order out of place at {:?}", n.key));
            }
            // The heap by priority keeps the depth logarithmic.
            let above = |c: u32| c != NIL && self.node(c).prio > n.prio;
            if above(n.left) || above(n.right) {
                return Some(format!("key order's heap broken below {:?}", n.key));
            }
            (count, last, t) = (count + 1, Some(n.key), n.right);
        }
        (count != self.map.len()).then(|| {
            format!(
                "the key order holds {count} keys, the map {}",
                self.map.len()
            )
        })
    }

    /// Subtree `t` without `key`'s slot.
    pub(super) fn order_remove(&mut self, t: u32, key: &KvKey) -> u32 {
        assert!(t != NIL, "key {key:?} is not in the key order");
        let n = self.node(t);
        let (left, right) = (n.left, n.right);
        match order(key, &n.key) {
            std::cmp::Ordering::Less => {
                let l = self.order_remove(left, key);
                self.node_mut(t).left = l;
                t
            }
            std::cmp::Ordering::Greater => {
                let r = self.order_remove(right, key);
                self.node_mut(t).right = r;
                t
            }
            std::cmp::Ordering::Equal => self.order_merge(left, right),
        }
    }
}

impl KvIndex {
    /// Keys from `start` on (an empty start: from the first), in byte order,
    /// at most `max`. Expired keys are left out.
    pub fn list(&self, start: &KvKey, max: usize, now: Instant) -> Vec<KvKey> {
        let start = *start;
        self.with_state(move |ix, st| ix.list_in(st, &start, max, now))
    }

    pub(super) fn list_in(
        &self,
        st: &State,
        start: &KvKey,
        max: usize,
        now: Instant,
    ) -> Vec<KvKey> {
        let ttl = self.settings().ttl;
        let now_ms = self.ms(now);
        let mut keys = Vec::with_capacity(max.min(st.map.len()));
        // In order from `start` (the empty key is before every other): the
        // path down to it, then each key's right subtree in turn.
        let mut path = Vec::with_capacity(64);
        let mut t = st.root;
        while t != NIL {
            let n = st.node(t);
            if order(&n.key, start) == std::cmp::Ordering::Less {
                t = n.right;
            } else {
                path.push(t);
                t = n.left;
            }
        }
        while keys.len() < max {
            let Some(t) = path.pop() else { break };
            let n = st.node(t);
            if !expired(n, now_ms, ttl) {
                keys.push(n.key);
            }
            let mut c = n.right;
            while c != NIL {
                path.push(c);
                c = st.node(c).left;
            }
        }
        keys
    }
}

/// Keys in byte order, a shorter key before its extensions.
pub(super) fn order(a: &KvKey, b: &KvKey) -> std::cmp::Ordering {
    a.cmp(b)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use std::time::Instant;

    #[test]
    fn list_in_key_order_from_start() {
        let now = Instant::now();
        let ix = KvIndex::new(1 << 20, 4096);
        for k in [b"b".as_slice(), b"a", b"ab", b"c"] {
            let k = KvKey::new(k).unwrap_or_default();
            assert!(store(&ix, &k, 1, now).is_ok());
        }
        let got: Vec<Vec<u8>> = ix
            .list(&KvKey::new(b"ab").unwrap_or_default(), 10, now)
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        assert_eq!(got, vec![b"ab".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(ix.list(&KvKey::default(), 2, now).len(), 2);
    }
}
