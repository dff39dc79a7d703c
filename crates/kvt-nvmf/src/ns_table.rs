//! The namespaces a queue sees, by NSID.

use super::Namespace;
use std::sync::Arc;

/// The namespaces a queue sees, indexed by NSID (no search per command),
/// refreshed when the subsystem's namespace generation moves.
#[derive(Default)]
pub struct NsTable {
    by_nsid: Vec<Option<Arc<Namespace>>>,
    all: Vec<Arc<Namespace>>,
    pub(crate) gen: u64,
}

impl NsTable {
    pub fn new(gen: u64, all: Vec<Arc<Namespace>>) -> NsTable {
        let mut t = NsTable::default();
        t.load(gen, all);
        t
    }
    pub fn load(&mut self, gen: u64, all: Vec<Arc<Namespace>>) {
        self.gen = gen;
        self.by_nsid.clear();
        let top = all.iter().map(|n| n.nsid as usize).max().unwrap_or(0);
        self.by_nsid.resize(top + 1, None);
        for n in &all {
            if let Some(e) = self.by_nsid.get_mut(n.nsid as usize) {
                *e = Some(n.clone());
            }
        }
        self.all = all;
    }
    pub fn get(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        self.by_nsid.get(nsid as usize).and_then(|n| n.as_ref())
    }
    pub fn all(&self) -> &[Arc<Namespace>] {
        &self.all
    }
}
