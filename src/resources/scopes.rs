//! Interned request scopes (LoRA id and name, cache salt) with plain reference
//! counts.
//!
//! Every advertised block must remember its scope to be advertised again after
//! its request is gone. Holding an `Arc` per block would cost an atomic
//! increment per committed block, which measured about 60 ns on the
//! development machine (locked instructions are slow under its hypervisor):
//! a third of a block's whole budget. A scope id with a plain counter costs a
//! slot lookup.
//!
//! [`ScopeId`] is defined with the other row ids (`crate::ids`) because
//! request rows and block contents, which are tables, name it. Only the
//! block cache holds the table mutably: a scope's count changes with a
//! request's admission and release and with a block's indexing and drop,
//! through the cache's verbs.

use ahash::AHashMap;
use slotmap::SlotMap;

use crate::ids::{BlockId, ScopeId};
use crate::tables::RequestScope;

#[derive(Debug)]
struct ScopeRow {
    scope: RequestScope,
    refs: u32,
    /// Head of the list of indexed first blocks of this scope's chains.
    root_children: Option<BlockId>,
}

/// The scope table.
#[derive(Debug, Default)]
pub struct Scopes {
    rows: SlotMap<ScopeId, ScopeRow>,
    by_value: AHashMap<RequestScope, ScopeId>,
}

impl Scopes {
    /// Takes a reference on `scope`, interning it if new.
    pub fn acquire(&mut self, scope: RequestScope) -> ScopeId {
        match self.by_value.get(&scope) {
            Some(&id) => {
                self.rows[id].refs += 1;
                id
            }
            None => {
                let id = self.rows.insert(ScopeRow { scope: scope.clone(), refs: 1, root_children: None });
                self.by_value.insert(scope, id);
                id
            }
        }
    }

    /// Takes `n` more references on a live scope (one per advertised block).
    pub fn retain(&mut self, id: ScopeId, n: u32) {
        self.rows[id].refs += n;
    }

    /// Drops a reference; the scope is forgotten when none remains.
    pub fn release(&mut self, id: ScopeId) {
        self.release_n(id, 1);
    }

    /// Drops `n` references at once (the scope holds at least `n`); the
    /// scope is forgotten when none remains.
    pub fn release_n(&mut self, id: ScopeId, n: u32) {
        let row = &mut self.rows[id];
        debug_assert!(row.refs >= n, "a scope gives back only references it holds");
        row.refs -= n;
        if row.refs == 0 {
            let row = self.rows.remove(id).expect("live scope");
            self.by_value.remove(&row.scope);
        }
    }

    /// The id of a scope, if it is alive.
    pub fn find(&self, scope: &RequestScope) -> Option<ScopeId> {
        self.by_value.get(scope).copied()
    }

    /// The head of a scope's list of indexed first blocks (read only).
    pub fn root_children(&self, id: ScopeId) -> &Option<BlockId> {
        &self.rows[id].root_children
    }

    /// The head of a scope's list of indexed first blocks.
    pub fn root_children_mut(&mut self, id: ScopeId) -> &mut Option<BlockId> {
        &mut self.rows[id].root_children
    }

    /// The scope behind an id.
    pub fn get(&self, id: ScopeId) -> &RequestScope {
        &self.rows[id].scope
    }

    /// Scopes alive.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Reference count of a scope (for invariant checks).
    pub fn refs(&self, id: ScopeId) -> u32 {
        self.rows.get(id).map_or(0, |r| r.refs)
    }

    /// All live ids.
    pub fn ids(&self) -> impl Iterator<Item = ScopeId> + '_ {
        self.rows.keys()
    }
}
